# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""`python -m transformer ctranslate2`, and `translate --engine ctranslate2`:
the command line's face of `transformer.ctranslate2`."""

# %% auto #0
__all__ = [
    "ERRORS",
    "QUANTIZATIONS",
    "ctranslate2_command",
    "load_ctranslate2",
]

# %% ../../chapters/a10_cli.ipynb #fdc6283d

import argparse
from collections.abc import Sequence
from pathlib import Path

from transformer.cli.base import (
    PROG,
    Parser,
    UsageError,
    language_pair,
    load_for_command,
)
from transformer.multi30k import PAIRS

ERRORS = (ImportError, OSError)  # reported in one line
# The weights' types that export_ctranslate2 takes, its QUANTIZATIONS (a test
# holds the two equal), named here: that module loads torch, `--help` does not.
QUANTIZATIONS = ("float32", "int8")


def ctranslate2_command(argv: Sequence[str]) -> None:
    """`python -m transformer ctranslate2 --pair P OUT`."""
    p = Parser(
        prog=f"{PROG} ctranslate2",
        description=(
            "Write a trained model as a CTranslate2 model folder, the"
            " package's tokenizer beside it, for `translate --engine"
            " ctranslate2 --model OUT`."
        ),
    )
    p.add_argument("out", type=Path, metavar="OUT", help="the folder to write")
    # `export --format ctranslate2`, the command's old name, still works
    p.add_argument("--format", choices=["ctranslate2"], help=argparse.SUPPRESS)
    p.add_argument(
        "--pair", required=True, type=language_pair, choices=list(PAIRS)
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="a shipped model or a checkpoint folder (default:"
        " checkpoints/<pair>, see TRANSFORMER_HOME)",
    )
    p.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        default="float32",
        help="the weights' type in the engine (default: float32, as trained)",
    )
    args = p.parse_args(argv)
    from transformer.ctranslate2 import export_ctranslate2

    model, tokenizer = load_for_command(args.pair, args.checkpoint, "cpu")
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


# %% ../../chapters/a10_cli.ipynb #a4b0b775
def load_ctranslate2(args: argparse.Namespace, threads: int):
    """`translate --engine ctranslate2`: the exported folder args.model,
    loaded (a `CTranslate2Model`), or a one-line UsageError."""
    from transformer.checkpoint import CheckpointError
    from transformer.ctranslate2 import CTranslate2Model
    from transformer.tokenizer import TokenizerError

    if args.model is None:
        raise UsageError(
            "--engine ctranslate2 needs --model DIR, a folder written by "
            f"`{PROG} ctranslate2`"
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
    return engine
