# Generated from chapters/a03_text_and_tokenizer.ipynb: edit it, not this file.
"""The package's Multi30k loaders: the chapter's `load_split` and
`load_pairs`, each file checked first against its SHA-256 digest."""

# %% auto #0
__all__ = ["expected_checksums", "checked_bytes", "load_split", "load_pairs"]

# %% ../chapters/a03_text_and_tokenizer.ipynb #e7c2175d

import hashlib
import string
from pathlib import Path

from transformer.multi30k import DataError, check_split, gzip_lines
from transformer.paths import DATA_DIR

from . import multi30k

_MULTI30K = (
    "the repository's data/multi30k, which holds the data files and SHA256SUMS"
)


def _data_dir_advice(data_dir: Path) -> str:
    """What to do about a data folder without SHA256SUMS: it depends on whose
    it is."""
    # the package's own, data/multi30k
    if Path(data_dir).absolute() == DATA_DIR:
        return (
            "the package reads the data of the repository it was installed"
            " from: install it with `pip install -e .` in a clone"
        )
    # A folder the user named (--data-dir): reinstalling would not help.
    if Path(data_dir).is_dir():
        return f"{data_dir} is not a copy of {_MULTI30K}"
    return f"there is no folder {data_dir}: name a copy of {_MULTI30K}"


def expected_checksums(data_dir: Path = DATA_DIR) -> dict[str, str]:
    """File name -> SHA-256 from data_dir/SHA256SUMS."""
    sums = Path(data_dir) / "SHA256SUMS"
    if not sums.is_file():
        raise DataError(
            f"missing checksum file {sums} ({_data_dir_advice(data_dir)})"
        )
    try:
        text = sums.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"corrupt checksum file {sums}: not UTF-8 text ({err})"
        ) from err
    checksums = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        # `sha256sum` writes "digest  name", or "digest *name" in binary mode
        fields = line.split(maxsplit=1)
        digest = fields[0].lower()
        if (
            len(fields) != 2
            or len(digest) != 64
            or set(digest) - set(string.hexdigits)
        ):
            raise DataError(f"{sums}:{number}: malformed line {line!r}")
        checksums[fields[1].strip().removeprefix("*")] = digest
    return checksums


# %% ../chapters/a03_text_and_tokenizer.ipynb #9630fc3e
def checked_bytes(path: Path, sha256: str) -> bytes:
    """The bytes of a file, after checking their SHA-256."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing data file {path}")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise DataError(
            f"corrupt or truncated data file {path}: SHA-256 {digest[:12]}…,"
            f" expected {sha256[:12]}… (restore it with `git checkout --"
            f" {path}`)"
        )
    return raw


def load_split(
    split: str, language: str, data_dir: Path = DATA_DIR
) -> list[str]:
    """The chapter's `load_split`, the file checked first."""
    check_split(split, "load_split(split, language)")
    name = f"{split}.{language}.gz"
    checksums = expected_checksums(data_dir)
    if name not in checksums:
        raise DataError(
            f"no checksum for {name} in {Path(data_dir) / 'SHA256SUMS'}"
        )
    path = Path(data_dir) / name
    return gzip_lines(checked_bytes(path, checksums[name]), path)


def load_pairs(
    split: str, pair: str, data_dir: Path = DATA_DIR
) -> list[tuple[str, str]]:
    """The chapter's `load_pairs`, each file checked first."""
    return multi30k.load_pairs(split, pair, data_dir, load=load_split)
