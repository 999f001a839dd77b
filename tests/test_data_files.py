"""The Multi30k files ship with the repository and are checked before use: the
package reads them through transformer.checked_data, the chapter's loaders with
the checks of the appendix "Text and the tokenizer"."""

from __future__ import annotations

import ast
import gzip
import hashlib
import shutil
from pathlib import Path

import pytest

import transformer.multi30k as chapter
from transformer.checked_data import load_pairs, load_split
from transformer.multi30k import PAIRS, DataError, parse_pair
from transformer.paths import DATA_DIR

ROOT = Path(__file__).resolve().parent.parent


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


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_checked_loaders_read_what_the_chapters_read(pair: str):
    for split in ("val", "test_2016_flickr"):
        assert load_pairs(split, pair) == chapter.load_pairs(split, pair)
        for language in PAIRS[pair]:
            assert load_split(split, language) == chapter.load_split(split, language)


def test_the_chapters_loaders_read_without_checks_and_name_what_is_missing(
    data_copy: Path,
):
    """The reading line's loaders, which the chapters after the data chapter use,
    read a file that its checksum would refuse; a missing file is still named."""
    path = data_copy / "val.de.gz"
    lines = gzip.decompress(path.read_bytes()).decode().split("\n")
    path.write_bytes(gzip.compress("\n".join(["anders", *lines[1:]]).encode()))
    assert chapter.load_split("val", "de", data_copy)[0] == "anders"
    with pytest.raises(DataError, match="corrupt or truncated data file"):
        load_split("val", "de", data_copy)
    path.unlink()
    with pytest.raises(DataError, match=r"missing data file .*val\.de\.gz"):
        chapter.load_split("val", "de", data_copy)


def test_every_reader_of_the_package_goes_through_the_checks():
    """No module of the package, no experiment and no book extension reads Multi30k
    with the chapter's unchecked loaders: they import load_split and load_pairs from
    transformer.checked_data (which alone wraps the chapter's)."""
    readers = [
        *(ROOT / "transformer").rglob("*.py"),
        *(ROOT / "experiments").glob("*.py"),
        *(ROOT / "_ext").glob("*.py"),
    ]
    unchecked = []
    for path in readers:
        if path.name == "checked_data.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "transformer.multi30k"
            ):
                names = {a.name for a in node.names} & {"load_split", "load_pairs"}
                unchecked += [f"{path.relative_to(ROOT)}: {n}" for n in sorted(names)]
    assert unchecked == []
