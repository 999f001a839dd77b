# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""`python -m transformer train`: a TrainConfig from the options, trained."""

# %% auto #0
__all__ = [
    "ERRORS",
    "train_parser",
    "parse_value",
    "config_from_args",
    "summary_table",
    "train_command",
]

# %% ../../chapters/a10_cli.ipynb #db37fb5a

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer.checkpoint import CheckpointError
from transformer.cli.base import PROG, Parser, UsageError
from transformer.multi30k import DataError

ERRORS = (DataError, CheckpointError)  # reported in one line

# %% ../../chapters/a10_cli.ipynb #3e031bea
from transformer.checkpoint import check_export_destination, export_model
from transformer.distributed import Distributed
from transformer.train_config import (
    MODEL_PRESETS,
    RECIPES,
    TrainConfig,
    flag_of,
    quick_config,
    value_type,
)
from transformer.trainer import train


class _Renamed(argparse.Action):
    """An option's earlier name: it still works, with a one-line notice."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        new = "--" + self.dest.replace("_", "-")
        print(
            f"{parser.prog}: notice: {option_string} is now {new}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def train_parser(
    config: type[TrainConfig] = TrainConfig,
) -> argparse.ArgumentParser:
    """The options of `train`: one per field of `config` that has a flag, with
    the field's help, type and choices, then the command's own."""
    p = Parser(
        prog=f"{PROG} train",
        description="Train a translation model on Multi30k.",
    )
    for field in dataclasses.fields(config):
        if (flag := flag_of(field)) is None:
            continue
        if value_type(field) is bool:
            how = {"action": argparse.BooleanOptionalAction}
        else:
            how = {"type": value_type(field)}
            how["choices"] = field.metadata["choices"]
        required = (
            field.default is dataclasses.MISSING
            and field.default_factory is dataclasses.MISSING
        )
        p.add_argument(
            flag,
            dest=field.name,
            default=None,
            required=required,
            help=field.metadata["help"],
            **how,
        )
    p.add_argument(
        "--model", dest="preset", action=_Renamed, help=argparse.SUPPRESS
    )
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
        "--resume",
        action="store_true",
        help="continue the run in --out (where there is none yet, start it)",
    )
    p.add_argument("--dropout", type=float, help="the model's dropout")
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
        fields = _json_fields(stored, str(stored))
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
    return fields | {"preset": args.config}


def config_from_args(
    args: argparse.Namespace, config: type[TrainConfig] = TrainConfig
) -> TrainConfig:
    """The `config` that command-line arguments ask for (on resume, over the
    stored one)."""
    out = args.out_dir if args.out_dir is not None else f"runs/{args.pair}"
    fields = _starting_fields(args, out) | {"pair": args.pair, "out_dir": out}
    for field in dataclasses.fields(config):
        given = getattr(args, field.name, None)
        if flag_of(field) is not None and given is not None:
            fields[field.name] = given
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
    return config.from_dict(fields)


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
