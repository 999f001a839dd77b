# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""`python -m transformer COMMAND ...`: the command picked, and its module
imported only when it runs."""

# %% auto #0
__all__ = ["COMMANDS", "RENAMED", "main"]

# %% ../../chapters/a10_cli.ipynb #34181934

import importlib
import os
import sys
from collections.abc import Sequence

from transformer.cli.base import PROG, run

# Each command, and what it does; its module transformer.cli.<command> holds
# <command>_command(argv) and the ERRORS it reports in one line.
COMMANDS = {
    "prepare": "tokenise Multi30k and cache every split as token ids",
    "train": "train a translation model (Part II)",
    "translate": "translate sentences with a trained model (Part III)",
    "evaluate": "score a trained model with sacreBLEU and chrF (Part III)",
    "ctranslate2": "write a model for CTranslate2, the inference engine",
}
RENAMED = {"export": "ctranslate2"}  # an old name, and the command's today


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m transformer COMMAND ...`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        # Asked for, the help goes to standard output; without a command it is
        # an error, so the usage goes to standard error with status 2.
        out = sys.stdout if argv else sys.stderr
        print(f"usage: {PROG} COMMAND [options]\n\ncommands:", file=out)
        for name, summary in COMMANDS.items():
            print(f"  {name:<12} {summary}", file=out)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in RENAMED:
        print(
            f"{PROG}: note: `{command}` is now `{RENAMED[command]}`",
            file=sys.stderr,
        )
        command = RENAMED[command]
    if command not in COMMANDS:
        print(
            f"{PROG}: error: unknown command {command!r}: choose one of "
            f"{', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    try:
        module = importlib.import_module(f"transformer.cli.{command}")
        body = getattr(module, f"{command}_command")
        return run(command, lambda: body(rest), module.ERRORS)
    except KeyboardInterrupt:
        print(f"{PROG} {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Keep Python from failing again when it flushes standard output at
        # exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
