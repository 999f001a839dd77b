# Generated from chapters/92_cli.ipynb: edit it, not this file.
"""`python -m transformer train`: a TrainConfig from the options, trained."""

# %% auto #0
__all__ = [
    "ERRORS",
    "FIELD_OPTIONS",
    "train_parser",
    "parse_value",
    "config_from_args",
    "summary_table",
    "train_command",
]

# %% ../../chapters/92_cli.ipynb #db37fb5a

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer.checkpoint import CheckpointError
from transformer.cli.base import PROG, Parser, UsageError
from transformer.multi30k import PAIRS, DataError

ERRORS = (DataError, CheckpointError)  # reported in one line

# %% ../../chapters/92_cli.ipynb #3e031bea
from transformer.checkpoint import (
    CheckpointError,
    check_export_destination,
    export_model,
)
from transformer.distributed import Distributed
from transformer.train import train
from transformer.train_config import (
    BPE_DROPOUT_SIDES,
    MODEL_PRESETS,
    RECIPES,
    TrainConfig,
    quick_config,
)


def train_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=f"{PROG} train",
        description="Train a translation model on Multi30k.",
    )
    p.add_argument("--pair", required=True, help="de-en or fr-en")
    p.add_argument(
        "--config",
        default=None,
        help=(
            f"a recipe ({', '.join(RECIPES)}), a model preset"
            f" ({', '.join(MODEL_PRESETS)}; default small) or a TrainConfig"
            " JSON"
        ),
    )
    p.add_argument(
        "--out", default=None, help="output folder (default runs/<pair>)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out (where there is none yet, start it)",
    )
    p.add_argument("--epochs", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument(
        "--max-tokens", type=int, help="padded tokens per batch and side"
    )
    p.add_argument(
        "--accumulation", type=int, help="batches per process and update"
    )
    p.add_argument("--warmup", type=int)
    p.add_argument("--lr-factor", type=float)
    p.add_argument("--dropout", type=float)
    p.add_argument("--label-smoothing", type=float)
    p.add_argument(
        "--bpe-dropout", type=float, help="in [0, 1); default 0: off"
    )
    p.add_argument("--bpe-dropout-sides", choices=list(BPE_DROPOUT_SIDES))
    p.add_argument("--seed", type=int)
    p.add_argument("--time-limit", type=float, help="minutes")
    p.add_argument("--average-last", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--cache-dir")
    p.add_argument("--data-dir")
    p.add_argument("--device")
    p.add_argument("--log-every", type=int)
    p.add_argument("--compile", action="store_true", default=None)
    p.add_argument(
        "--bf16", action=argparse.BooleanOptionalAction, default=None
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of the model config, e.g. --set d_model=128",
    )
    p.add_argument(
        "--quick", action="store_true", help="a tiny model for a few updates"
    )
    p.add_argument(
        "--export",
        default=None,
        metavar="DIR",
        help=(
            "write the shipped model folder when training ends (a new or empty"
            " folder, or an earlier export)"
        ),
    )
    return p


# Options that set the TrainConfig field of the same name.
FIELD_OPTIONS = (
    "epochs",
    "max_steps",
    "max_tokens",
    "accumulation",
    "warmup",
    "lr_factor",
    "label_smoothing",
    "bpe_dropout",
    "bpe_dropout_sides",
    "seed",
    "time_limit",
    "average_last",
    "vocab_size",
    "cache_dir",
    "data_dir",
    "device",
    "log_every",
    "compile",
    "bf16",
)


def parse_value(text: str) -> Any:
    """A --set value: a JSON number, string or boolean; True and False also as
    in Python."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_fields(path: Path, what: str) -> dict[str, Any]:
    """The JSON object of TrainConfig fields in `path`, or a ValueError naming
    it."""
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {what}: {err}") from err
    if not isinstance(fields, dict):
        raise ValueError(
            f"{what} must hold a JSON object of TrainConfig fields, not a "
            f"{type(fields).__name__}"
        )
    return fields


def _starting_fields(args: argparse.Namespace, out: str) -> dict[str, Any]:
    """The fields a run starts from: the stored run's on resume, a recipe, a
    preset, a JSON file, or the quick configuration."""
    stored = Path(out) / "train_config.json"
    fields: dict[str, Any] = {}
    if args.resume and stored.is_file():
        try:
            fields = json.loads(stored.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read {stored}: {err}") from err
        if not isinstance(fields, dict):
            raise ValueError(f"{stored} does not hold a JSON object")
    elif args.quick:
        fields = quick_config(args.pair).to_dict()
    if args.config is None:
        return fields
    if args.config.endswith(".json"):
        return fields | _json_fields(
            Path(args.config), f"--config {args.config}"
        )
    if args.config in RECIPES:  # on resume, the stored run must agree with it
        return fields | RECIPES[args.config](args.pair).to_dict()
    return fields | {"model": args.config}


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig that command-line arguments ask for (on resume, over the
    stored one)."""
    out = args.out if args.out is not None else f"runs/{args.pair}"
    fields = _starting_fields(args, out) | {"pair": args.pair, "out_dir": out}
    for name in FIELD_OPTIONS:
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    overrides = fields.get("model_overrides", {})
    if not isinstance(overrides, dict):
        raise ValueError(
            "model_overrides must be a JSON object of TransformerConfig"
            f" fields, got {overrides!r}"
        )
    overrides = dict(overrides)
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set takes FIELD=VALUE, got {item!r}")
        overrides[key.strip()] = parse_value(value)
    fields["model_overrides"] = overrides
    return TrainConfig.from_dict(fields)


def summary_table(records: list[dict[str, Any]]) -> str:
    """The epochs of a run (and its average) as a small text table."""
    head = (
        f"{'epoch':>7} {'step':>8} {'train loss':>10} {'val loss':>8}"
        f" {'ppl/word':>8} {'accuracy':>8} {'tok/s':>9} {'MFU':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        epoch = "average" if r["kind"] == "average" else f"{r['epoch']:g}"
        train_loss = f"{r['train_loss']:.3f}" if "train_loss" in r else ""
        tok_s = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else ""
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else ""
        lines.append(
            f"{epoch:>7} {r['step']:>8,} {train_loss:>10}"
            f" {r['val_loss']:>8.3f} {r['val_ppl_word']:>8.2f}"
            f" {r['val_accuracy']:>8.1%} {tok_s:>9} {mfu:>6}"
        )
    return "\n".join(lines)


def train_command(argv: Sequence[str]) -> None:
    """`python -m transformer train ...`: train, then print the epochs."""
    args = train_parser().parse_args(argv)
    if args.pair not in PAIRS:
        raise UsageError(
            f"unknown language pair {args.pair!r}: choose one of"
            f" {', '.join(PAIRS)}"
        )
    try:
        config = config_from_args(args)
    except ValueError as err:  # a bad value for a TrainConfig field
        raise UsageError(str(err)) from err
    if args.export:  # before training, not after it
        check_export_destination(Path(args.export), config.output_dir)
    result = train(config, resume=args.resume)
    main_process = Distributed.from_environ().is_main
    if args.export and main_process:
        try:
            export_model(result.out_dir, args.export)
        except ValueError as err:  # e.g. a weight too large for float16
            raise UsageError(
                f"the run in {result.out_dir} is saved, but --export failed:"
                f" {err}"
            ) from err
    if main_process:
        print(summary_table(result.metrics))
        print(
            f"stopped: {result.stopped} after {result.step:,} updates; run in"
            f" {result.out_dir}"
        )
        if args.export:
            print(f"model exported to {args.export}")
