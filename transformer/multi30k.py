# Generated from chapters/10_data.ipynb: edit it, not this file.
"""The text of Multi30k in data/multi30k: each file checked against its SHA-256
digest before it is read."""

# %% auto #0
__all__ = [
    "PAIRS",
    "SPLITS",
    "DataError",
    "check_split",
    "parse_pair",
    "expected_checksums",
    "read_lines",
    "load_split",
    "load_pairs",
]

# %% ../chapters/10_data.ipynb #aa55879a

import gzip
import hashlib
import string
import zlib
from pathlib import Path

from transformer.paths import DATA_DIR

PAIRS = {"de-en": ("de", "en"), "fr-en": ("fr", "en")}
SPLITS = ("train", "val", "test_2016_flickr")


class DataError(Exception):
    """A data file is missing, corrupt or inconsistent, or a split or pair is
    unknown."""


def check_split(split: str, signature: str) -> None:
    """A clear error for a split the book does not have; `signature`, the
    caller's, is shown when `split` looks like a pair or a language (raw text
    loaders take the split first, `load_encoded` the pair)."""
    if split not in SPLITS:
        swapped = split in PAIRS or any(
            split in langs for langs in PAIRS.values()
        )
        hint = f" (the arguments are {signature}: swapped?)" if swapped else ""
        raise DataError(
            f"unknown split {split!r}: choose one of {', '.join(SPLITS)}{hint}"
        )


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), with a clear error for a pair the book does not
    have."""
    if pair not in PAIRS:
        raise DataError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    return PAIRS[pair]


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


def read_lines(path: Path, sha256: str) -> list[str]:
    """The lines of a gzipped UTF-8 file, after checking its SHA-256."""
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
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise DataError(f"cannot read data file {path}: {err}") from err
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def load_split(
    split: str, language: str, data_dir: Path = DATA_DIR
) -> list[str]:
    """The sentences of one split in one language, one per line of the file."""
    check_split(split, "load_split(split, language)")
    name = f"{split}.{language}.gz"
    checksums = expected_checksums(data_dir)
    if name not in checksums:
        raise DataError(
            f"no checksum for {name} in {Path(data_dir) / 'SHA256SUMS'}"
        )
    return read_lines(Path(data_dir) / name, checksums[name])


def load_pairs(
    split: str, pair: str, data_dir: Path = DATA_DIR
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a split, e.g. load_pairs("val",
    "de-en")."""
    check_split(split, "load_pairs(split, pair)")
    src_lang, tgt_lang = parse_pair(pair)
    src = load_split(split, src_lang, data_dir)
    tgt = load_split(split, tgt_lang, data_dir)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}.{src_lang}.gz has {len(src)} lines but"
            f" {split}.{tgt_lang}.gz has {len(tgt)}"
        )
    return list(zip(src, tgt, strict=True))
