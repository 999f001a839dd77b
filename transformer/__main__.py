"""`python -m transformer COMMAND ...`: the command-line face of the package.

The commands, their options and their one error convention live in
`transformer.cli` (the appendix 'The command line'). None of the modules it
imports loads Altair or pandas, and spaCy is imported only when text is
tokenised, so `train` from an encoded cache runs on a GPU machine without the
book's plotting and tokenising dependencies.
"""

import sys

from transformer.cli import main

if __name__ == "__main__":
    sys.exit(main())
