# Generated from chapters/10_data.ipynb: edit it, not this file.
"""Atomic writes: readers of a file see its old content or its new, never
half of each."""

# %% auto #0
__all__ = ["atomic_write"]

# %% ../chapters/10_data.ipynb #f64511f0

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over
    `path`: readers see the old content or the new, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        # mkstemp lets its owner alone read the file: give it the mode that
        # open() would, so that a cache or a checkpoint can be shared.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
