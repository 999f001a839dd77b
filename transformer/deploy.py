# Generated from chapters/95_ctranslate2.ipynb: edit it, not this file.
"""`python -m transformer export`, and `translate --engine ctranslate2`: the
command line's face of `transformer.export`."""

# %% auto #0
__all__ = ["export_command", "ctranslate2_translate"]

# %% ../chapters/95_ctranslate2.ipynb #334258dc

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from transformer.checkpoint import CheckpointError
from transformer.cli import PROG, Parser, UsageError, load_for_command
from transformer.data import PAIRS
from transformer.export import (
    QUANTIZATIONS,
    CTranslate2Model,
    export_ctranslate2,
)
from transformer.tokenizer import TokenizerError


def export_command(argv: Sequence[str]) -> None:
    """`python -m transformer export --format ctranslate2 --pair P OUT`."""
    p = Parser(
        prog=f"{PROG} export",
        description=(
            "Write a trained model as a CTranslate2 model folder, the"
            " package's tokenizer beside it, for `translate --engine"
            " ctranslate2 --model OUT`."
        ),
    )
    p.add_argument("out", type=Path, metavar="OUT", help="the folder to write")
    p.add_argument("--format", choices=["ctranslate2"], required=True)
    p.add_argument("--pair", required=True, help=" or ".join(PAIRS))
    p.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help=(
            "a shipped model or a checkpoint folder (default:"
            " checkpoints/<pair>)"
        ),
    )
    p.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        default="float32",
        help="the weights' type in the engine (default: float32, as trained)",
    )
    args = p.parse_args(argv)
    if args.pair not in PAIRS:
        raise UsageError(
            f"unknown language pair {args.pair!r}: choose one of"
            f" {', '.join(PAIRS)}"
        )
    model, tokenizer = load_for_command(
        args.pair, args.checkpoint, "cpu", alpha=0.0
    )
    try:
        export_ctranslate2(
            model, tokenizer, args.out, quantization=args.quantize
        )
    except ValueError as err:  # a model the export does not convert
        raise UsageError(str(err)) from None
    print(
        f"{args.pair} model written to {args.out} for CTranslate2"
        f" ({args.quantize})"
    )


def ctranslate2_translate(
    args: argparse.Namespace, threads: int
) -> Callable[..., list[str]]:
    """`translate --engine ctranslate2`: the exported folder args.model,
    loaded, as a function of the sentences and translate's keyword arguments.
    """
    if args.model is None:
        raise UsageError(
            "--engine ctranslate2 needs --model DIR, a folder written by "
            f"`{PROG} export --format ctranslate2`"
        )
    try:
        engine = CTranslate2Model(args.model, threads=threads)
    except (CheckpointError, TokenizerError, OSError, RuntimeError) as err:
        raise UsageError(f"cannot load {args.model}: {err}") from err
    if engine.tokenizer.pair != args.pair:
        raise UsageError(
            f"{args.model} holds a {engine.tokenizer.pair} model, not a"
            f" {args.pair} one"
        )
    return engine.translate
