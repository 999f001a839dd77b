# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""The command line's common ground: its parser, its one error convention, and
the options that several commands share."""

# %% auto #0
__all__ = [
    "PROG",
    "OPTION_NAMES",
    "UsageError",
    "Parser",
    "first_line",
    "run",
    "warning",
    "language_pair",
    "option_error",
    "add_model_options",
    "check_model_options",
    "check_positions",
    "load_for_command",
]

# %% ../../chapters/a10_cli.ipynb #1ce4f902

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from transformer.decode_options import MAX_ALPHA, DecodeOptions, OptionError
from transformer.multi30k import PAIRS, DataError, parse_pair
from transformer.paper_search import PAPER_ALPHA, PAPER_BEAM_SIZE

PROG = "python -m transformer"


class UsageError(Exception):
    """A mistake on the command line: one line on standard error and exit
    status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`UsageError`), not a usage
    block."""

    def error(self, message: str) -> None:
        raise UsageError(message)


def first_line(err: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has
    none."""
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def run(
    command: str,
    body: Callable[[], None],
    errors: tuple[type[BaseException], ...] = (),
) -> int:
    """Run a command's body; return its exit status. `UsageError` and the
    `errors` the command declares print one line on standard error and return
    2; `--help` returns 0."""
    try:
        body()
    except SystemExit as stop:  # argparse's --help
        return int(stop.code or 0)
    except (UsageError, *errors) as err:
        print(f"{PROG} {command}: error: {first_line(err)}", file=sys.stderr)
        return 2
    return 0


def warning(command: str) -> Callable[[str], None]:
    """A function that prints a command's warnings, one line each, on standard
    error."""
    return lambda message: print(
        f"{PROG} {command}: warning: {message}", file=sys.stderr
    )


# %% ../../chapters/a10_cli.ipynb #7ea256f0
def language_pair(text: str) -> str:
    """The type of every --pair: a pair the book has, or parse_pair's error."""
    try:
        parse_pair(text)
    except DataError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


# Each decoding option's name on the command line.
OPTION_NAMES = {
    "beam_size": "--beam",
    "alpha": "--alpha",
    "batch_size": "--batch-size",
}


def option_error(err: OptionError) -> UsageError:
    """A DecodeOptions error, said with the command line's option name."""
    name = OPTION_NAMES.get(err.field, err.field)
    return UsageError(f"{name} {err.problem}")


# %% ../../chapters/a10_cli.ipynb #e7882012
def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that decodes with a trained model."""
    defaults = DecodeOptions()

    def whose(value, paper) -> str:  # a default says whether it is the paper's
        return ", the paper's" if value == paper else ""

    p.add_argument(
        "--pair", required=True, type=language_pair, choices=list(PAIRS)
    )
    p.add_argument(
        "--beam",
        type=int,
        default=defaults.beam_size,
        metavar="N",
        help=f"beam size; 1 is greedy decoding (default: {defaults.beam_size}"
        f"{whose(defaults.beam_size, PAPER_BEAM_SIZE)})",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=defaults.alpha,
        metavar="A",
        help=f"length penalty α of beam search, from 0 to {MAX_ALPHA:g}"
        f" (default: {defaults.alpha:g}{whose(defaults.alpha, PAPER_ALPHA)})",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="a shipped model or a checkpoint folder (default:"
        " checkpoints/<pair>, see TRANSFORMER_HOME)",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="default: cuda when available",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=defaults.batch_size,
        metavar="N",
        help=f"sentences decoded at once (default: {defaults.batch_size})",
    )


# %% ../../chapters/a10_cli.ipynb #efa12e1a
def check_model_options(
    args: argparse.Namespace,
) -> tuple[DecodeOptions, str]:
    """The decoding options and the device that `add_model_options`' options
    ask for, or a one-line UsageError."""
    try:
        options = DecodeOptions(
            beam_size=args.beam, alpha=args.alpha, batch_size=args.batch_size
        )
    except OptionError as err:
        raise option_error(err) from None
    import torch  # once the options are good: a usage error answers at once

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but no CUDA GPU is available")
    return options, device


def check_positions(options: DecodeOptions, positions: int) -> None:
    """A one-line UsageError if the length penalty would overflow within a
    model's positions."""
    try:
        options.check_alpha(positions)
    except OptionError as err:
        raise option_error(err) from None


def load_for_command(
    pair: str,
    checkpoint: Path | None,
    device: str,
    options: DecodeOptions | None = None,
):
    """The model and tokenizer to decode with (`load_pair_model`), or a
    one-line UsageError naming the folder; also one if `options`' length
    penalty would overflow within the model's positions."""
    from transformer.checkpoint import CheckpointError
    from transformer.translation import load_pair_model

    try:
        model, tokenizer = load_pair_model(pair, checkpoint, device=device)
    except CheckpointError as err:
        raise UsageError(str(err)) from err
    if options is not None:
        check_positions(options, model.config.max_len)
    return model, tokenizer
