# Generated from chapters/10_data.ipynb: edit it, not this file.
"""The text of Multi30k in data/multi30k: a split of a language pair, as
sentence pairs."""

# %% auto #0
__all__ = [
    "PAIRS",
    "SPLITS",
    "DataError",
    "parse_pair",
    "check_split",
    "gzip_lines",
    "load_split",
    "load_pairs",
]

# %% ../chapters/10_data.ipynb #aa55879a

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path

from transformer.paths import DATA_DIR

PAIRS = {"de-en": ("de", "en"), "fr-en": ("fr", "en")}
SPLITS = ("train", "val", "test_2016_flickr")


class DataError(Exception):
    """A data file is missing, corrupt or inconsistent, or a split or pair is
    unknown."""


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), with a clear error for a pair the book does not
    have."""
    if pair not in PAIRS:
        raise DataError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    return PAIRS[pair]


def check_split(split: str, signature: str) -> None:
    """A clear error for a split the book does not have; `signature`, the
    caller's, is shown when `split` looks like a pair or a language."""
    if split not in SPLITS:
        swapped = split in PAIRS or any(split in ls for ls in PAIRS.values())
        hint = f" (the arguments are {signature}: swapped?)" if swapped else ""
        raise DataError(
            f"unknown split {split!r}: choose one of {', '.join(SPLITS)}{hint}"
        )


# %% ../chapters/10_data.ipynb #44cd5801
def gzip_lines(raw: bytes, path: Path) -> list[str]:
    """The lines of the bytes of a gzipped UTF-8 file, cut at "\\n" only:
    `str.splitlines` would also cut a caption at U+2028."""
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
    path = Path(data_dir) / f"{split}.{language}.gz"
    if not path.is_file():
        raise DataError(f"missing data file {path}")
    return gzip_lines(path.read_bytes(), path)


def load_pairs(
    split: str,
    pair: str,
    data_dir: Path = DATA_DIR,
    *,
    load: Callable[[str, str, Path], list[str]] = load_split,
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a split, e.g. load_pairs("val",
    "de-en"); `load` reads one side (default `load_split`)."""
    check_split(split, "load_pairs(split, pair)")
    src_lang, tgt_lang = parse_pair(pair)
    src = load(split, src_lang, data_dir)
    tgt = load(split, tgt_lang, data_dir)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}.{src_lang}.gz has {len(src)} lines but"
            f" {split}.{tgt_lang}.gz has {len(tgt)}"
        )
    return list(zip(src, tgt, strict=True))
