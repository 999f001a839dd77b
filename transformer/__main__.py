"""`python -m transformer COMMAND ...`: the command-line face of the package.

The commands, their options and their one error convention live in the package
`transformer.cli` (the appendix 'The command line'). It imports a command's
module only when that command runs, and torch only once the command's options
are known to be good: `--help` and a usage error answer at once.
"""

import sys

from transformer.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
