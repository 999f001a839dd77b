"""The tiny models of the package's tests (tests/helpers.py) serve these tests too."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
