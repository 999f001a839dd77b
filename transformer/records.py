# Generated from chapters/a04_batches_and_cache.ipynb: edit it, not this file.
"""Atomic folders and the JSON Lines records of a run."""

# %% auto #0
__all__ = [
    "atomic_folder",
    "read_jsonl",
    "append_jsonl",
    "truncate_jsonl",
    "remove_stale",
]

# %% ../chapters/a04_batches_and_cache.ipynb #f7f152ef

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformer.atomic import atomic_write


def _fsync(path: Path) -> None:
    """Ask the disk to hold what `path` (a file or a folder) says before going
    on."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary folder that replaces `path` when the block ends
    without error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        # A rename can reach the disk before the data of the files renamed:
        # after a power cut the folder would be there with empty files. The
        # data first, then the names.
        for folder, _, files in os.walk(tmp):
            for name in files:
                _fsync(Path(folder) / name)
            _fsync(Path(folder))
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        # a rename cannot replace a folder that has files in it
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(path.parent)  # the renames themselves
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file; a last line cut short by a crash is
    skipped."""
    records = []
    if Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record to a JSON Lines file, on disk when this returns."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the records up to update `step` (a resumed run writes the later
    ones again)."""
    if Path(path).exists():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
        atomic_write(
            path, "".join(json.dumps(r) + "\n" for r in kept).encode()
        )


def remove_stale(folder: Path) -> None:
    """Delete the temporary files and folders that a writer killed in
    `atomic_write` or `atomic_folder` left in `folder`."""
    for stale in [
        *Path(folder).glob(".*.tmp*"),
        *Path(folder).glob(".*.old-*"),
    ]:
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)
