"""`python -m transformer COMMAND ...`: the command line, a module per command.

`base` holds the parser, the one error convention and the options that several
commands share; `prepare`, `train`, `translate`, `evaluate` and `ctranslate2`
are the commands, each with its `<command>_command(argv)` and the `ERRORS` it
reports in one line; `main` picks the command and imports its module only when
it runs, so that `--help` answers without loading torch or spaCy. The modules
are exported from the appendices 'The command line' and 'Deploying with
CTranslate2'.
"""

from transformer.cli.main import main

__all__ = ["main"]
