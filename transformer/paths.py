# Generated from chapters/10_data.ipynb: edit it, not this file.
"""Where the book's data, encoded caches and models are: in the clone of its
repository that holds the package, or under $TRANSFORMER_HOME."""

# %% auto #0
__all__ = [
    "HOME_VARIABLE",
    "HOME",
    "DATA_DIR",
    "CACHE_DIR",
    "CHECKPOINTS_DIR",
    "home",
]

# %% ../chapters/10_data.ipynb #bfc03fd0

import importlib.util
import os
from pathlib import Path

HOME_VARIABLE = "TRANSFORMER_HOME"


def _repository_root() -> Path:
    # The package is <root>/transformer. In it this file has a __file__; in its
    # notebook (which may run anywhere, e.g. Colab's /content) the installed
    # package says.
    here = (
        globals().get("__file__")
        or importlib.util.find_spec("transformer").origin
    )
    return Path(here).resolve().parent.parent


def home() -> Path:
    """The folder that holds data/multi30k, cache and checkpoints:
    $TRANSFORMER_HOME if it is set, else the repository."""
    value = os.environ.get(HOME_VARIABLE)
    return Path(value).expanduser().absolute() if value else _repository_root()


HOME = home()
DATA_DIR = HOME / "data" / "multi30k"  # the Multi30k files and SHA256SUMS
CACHE_DIR = HOME / "cache"  # the encoded splits that `prepare` writes
CHECKPOINTS_DIR = HOME / "checkpoints"  # the shipped models, one per pair
