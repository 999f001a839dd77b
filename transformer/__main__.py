"""`python -m transformer COMMAND ...`: the command-line face of the package.

Each command lives in the module its chapter exports. Python imports the package before this
module, and `transformer/__init__.py` imports every command's module with it; none of them
imports Altair or pandas (only `transformer.plots` does, which the package leaves out), and spaCy
is imported only when text is tokenised, so `train` from an encoded cache runs on a GPU machine
without the book's plotting and tokenising dependencies.
"""

from __future__ import annotations

import importlib
import os
import sys

PROG = "python -m transformer"
COMMANDS = {
    "prepare": ("transformer.data", "tokenise Multi30k and cache every split as token ids"),
    "train": ("transformer.train", "train a translation model (Part II)"),
    "translate": ("transformer.decode", "translate sentences with a trained model (Part III)"),
    "evaluate": ("transformer.evaluate", "score a trained model with sacreBLEU and chrF (Part III)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        # Asked for, the help goes to standard output; without a command it is an error,
        # so the usage goes to standard error with status 2.
        out = sys.stdout if argv else sys.stderr
        print(f"usage: {PROG} COMMAND [options]\n\ncommands:", file=out)
        for name, (_, summary) in COMMANDS.items():
            print(f"  {name:<10} {summary}", file=out)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        # One line, as each command writes its errors.
        print(
            f"{PROG}: error: unknown command {command!r}: choose one of "
            f"{', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    try:
        return module.main(rest)
    except KeyboardInterrupt:
        # Ctrl-C: one line, not a traceback. Every file is written atomically, so what was
        # written is whole (a run resumes from its last checkpoint with --resume).
        print(f"{PROG} {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader of the output went away (`... | head`): stop quietly, as other tools
        # do, and keep Python from failing again when it flushes standard output at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(main())
