"""The Multi30k files ship with the repository and are checked before use."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest

from transformer.multi30k import (
    DATA_DIR,
    PAIRS,
    DataError,
    load_pairs,
    load_split,
    parse_pair,
)


@pytest.fixture
def data_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "multi30k"
    shutil.copytree(DATA_DIR, copy)
    return copy


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize(
    ("split", "size"), [("train", 29_000), ("val", 1_014), ("test_2016_flickr", 1_000)]
)
def test_every_split_loads_with_its_size(pair: str, split: str, size: int):
    pairs = load_pairs(split, pair)
    assert len(pairs) == size
    assert all(src and tgt for src, tgt in pairs)


def test_a_missing_file_is_named(data_copy: Path):
    (data_copy / "val.fr.gz").unlink()
    with pytest.raises(DataError, match=r"missing data file .*val\.fr\.gz"):
        load_pairs("val", "fr-en", data_dir=data_copy)


def test_a_truncated_file_is_named(data_copy: Path):
    path = data_copy / "test_2016_flickr.en.gz"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(
        DataError, match=r"corrupt or truncated data file .*test_2016_flickr\.en\.gz"
    ):
        load_split("test_2016_flickr", "en", data_dir=data_copy)


def test_a_corrupt_file_is_named(data_copy: Path):
    path = data_copy / "train.de.gz"
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    lines[123] = "Ein ganz anderer Satz."
    path.write_bytes(gzip.compress("\n".join(lines).encode()))
    with pytest.raises(
        DataError, match=r"corrupt or truncated data file .*train\.de\.gz"
    ):
        load_pairs("train", "de-en", data_dir=data_copy)


def test_a_missing_checksum_file_is_named(data_copy: Path):
    (data_copy / "SHA256SUMS").unlink()
    with pytest.raises(DataError, match="missing checksum file .*SHA256SUMS"):
        load_split("val", "de", data_dir=data_copy)


def test_a_malformed_checksum_line_is_named(data_copy: Path):
    sums = data_copy / "SHA256SUMS"
    sums.write_text(sums.read_text() + "not-a-digest val.de.gz\n")
    with pytest.raises(DataError, match=r"SHA256SUMS:\d+: malformed line"):
        load_split("val", "de", data_dir=data_copy)


def test_a_checksum_file_that_is_not_text_is_named(data_copy: Path):
    sums = data_copy / "SHA256SUMS"
    sums.write_bytes(b"\xff\xfe" + sums.read_bytes())
    with pytest.raises(
        DataError, match=r"corrupt checksum file .*SHA256SUMS: not UTF-8"
    ):
        load_split("val", "de", data_dir=data_copy)


def _replace(data_copy: Path, name: str, text: str) -> None:
    """Write a gzipped file and its checksum, in `sha256sum -b` style ("digest *name")."""
    path = data_copy / name
    path.write_bytes(gzip.compress(text.encode()))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sums = data_copy / "SHA256SUMS"
    sums.write_text(
        "\n".join(
            f"{digest} *{name}" if line.endswith(name) else line
            for line in sums.read_text().splitlines()
        )
    )


def test_lines_are_cut_at_newlines_only(data_copy: Path):
    # \r, \x0c and U+2028 inside a sentence must not cut it in two.
    _replace(data_copy, "val.de.gz", "ein\rzwei\n\x0cdrei\u2028vier\n")
    assert load_split("val", "de", data_dir=data_copy) == [
        "ein\rzwei",
        "\x0cdrei\u2028vier",
    ]


def test_misaligned_sides_are_reported(data_copy: Path):
    # Both files intact by their checksums, but the split's sides disagree in length.
    path = data_copy / "val.de.gz"
    path.write_bytes(gzip.compress(b"nur ein Satz\n"))
    sums = data_copy / "SHA256SUMS"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    sums.write_text(
        "\n".join(
            f"{digest}  val.de.gz" if line.endswith("val.de.gz") else line
            for line in sums.read_text().splitlines()
        )
    )
    with pytest.raises(
        DataError, match=r"val\.de\.gz has 1 lines but val\.en\.gz has 1014"
    ):
        load_pairs("val", "de-en", data_dir=data_copy)


def test_unknown_pair_and_split_are_clear():
    with pytest.raises(
        DataError, match="unknown language pair 'en-de': choose one of de-en, fr-en"
    ):
        parse_pair("en-de")
    with pytest.raises(DataError, match="unknown split 'test'"):
        load_split("test", "de")
