# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""`python -m transformer train`: a TrainConfig from the options, trained."""

# %% auto #0
__all__ = [
    "ERRORS",
    "train_parser",
    "parse_value",
    "config_from_args",
    "train_command",
]

# %% ../../chapters/a10_cli.ipynb #db37fb5a

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from transformer.cli.base import PROG, Parser, UsageError
from transformer.multi30k import DataError

from .. import layout

ERRORS = (DataError,)  # one line each, as is a CheckpointError (below)

# %% ../../chapters/a10_cli.ipynb #3e031bea
from transformer.train_config import (
    MODEL_PRESETS,
    RECIPES,
    TrainConfig,
    default_folders,
    flag_of,
    value_type,
)


def _notice(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """The one line that an earlier spelling of an option gets."""
    print(f"{parser.prog}: notice: {old} is now {new}", file=sys.stderr)


class _Renamed(argparse.Action):
    """An option's earlier spelling: it still works, with a one-line notice.
    With a `const`, it stands for `--dest const`."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        new = "--" + self.dest.replace("_", "-")
        _notice(parser, option_string, f"{new} {self.const or ''}".rstrip())
        setattr(namespace, self.dest, self.const or values)


class _Config(argparse.Action):
    """`--config`: a recipe or a JSON file. A preset's name, its earlier use,
    still sets the preset (unless --preset does), with a notice."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values in MODEL_PRESETS:
            _notice(parser, f"{option_string} {values}", f"--preset {values}")
            namespace.preset = namespace.preset or values
        else:
            namespace.config = values


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
        # no default, nor a default's factory (which may load torch)
        required = field.default is field.default_factory is MISSING
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
        action=_Config,
        default=None,
        help=f"a recipe ({', '.join(RECIPES)}) or a JSON file of TrainConfig"
        " fields",
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
    quick = dict(dest="config", const="quick", nargs=0, help=argparse.SUPPRESS)
    p.add_argument("--quick", action=_Renamed, **quick)  # --config quick
    bf16 = dict(dest="precision", nargs=0, help=argparse.SUPPRESS)
    p.add_argument("--bf16", action=_Renamed, const="bf16", **bf16)
    p.add_argument("--no-bf16", action=_Renamed, const="fp32", **bf16)
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


def _starting_fields(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The fields a run starts from: the stored run's on resume, then the
    recipe or the JSON file that --config names."""
    stored = out / layout.RUN_CONFIG
    fields: dict[str, Any] = {}
    if args.resume and stored.is_file():
        fields = _json_fields(stored, str(stored))
    if args.config is None:
        return fields
    if args.config in RECIPES:  # on resume, the stored run must agree with it
        return fields | RECIPES[args.config](args.pair).to_dict()
    if args.config.endswith(".json"):
        return fields | _json_fields(
            Path(args.config), f"--config {args.config}"
        )
    raise ValueError(
        f"--config takes a recipe ({', '.join(RECIPES)}) or a .json file,"
        f" got {args.config!r}"
    )


def config_from_args(
    args: argparse.Namespace, config: type[TrainConfig] = TrainConfig
) -> TrainConfig:
    """The `config` that command-line arguments ask for (on resume, over the
    stored one)."""
    out = args.out_dir or default_folders(args.pair)["out_dir"]
    fields = _starting_fields(args, Path(out))
    fields |= {"pair": args.pair, "out_dir": out}
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


def train_command(argv: Sequence[str]) -> None:
    """`python -m transformer train ...`: train, then print the epochs."""
    args = train_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as err:  # a bad value for a TrainConfig field
        raise UsageError(str(err)) from err
    # imported once the options are good: the training's modules load torch
    from transformer import checkpoint
    from transformer.distributed import Distributed
    from transformer.logs import summary_table
    from transformer.trainer import train

    try:
        if args.export:  # before training, not after it
            checkpoint.check_export_destination(
                Path(args.export), config.out_dir
            )
        result = train(config, resume=args.resume)
    except checkpoint.CheckpointError as err:  # e.g. a stored run differs
        raise UsageError(str(err)) from err
    main_process = Distributed.from_environ().is_main
    if args.export and main_process:
        try:
            checkpoint.export_model(result.out_dir, args.export)
        except (ValueError, checkpoint.CheckpointError) as err:  # fp16's range
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
