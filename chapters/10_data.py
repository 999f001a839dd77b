# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The data: Multi30k
#
# The paper trains on WMT 2014, 4.5 million English–German sentence pairs. This book trains on
# Multi30k {cite:p}`elliott2016multi30k`, image captions in English with German translations and,
# since the WMT 2017 shared task {cite:p}`elliott2017findings`, French ones: 29,000 training
# pairs, small enough to train a real model on one GPU in minutes and to understand every step.
#
# | split | sentences | used for |
# | --- | --- | --- |
# | `train` | 29,000 | learning the weights and the subword vocabulary |
# | `val` | 1,014 | choosing hyperparameters and checkpoints |
# | `test_2016_flickr` | 1,000 | the BLEU scores we report, touched once |
#
# Tutorials that download Multi30k at run time break when the download does (the URLs that
# torchtext used are dead). This book ships the raw text in the repository, in `data/multi30k/`,
# gzipped (about 2 MB), with a `SHA256SUMS` file. This chapter starts with the loader that reads
# a split and checks it.

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e", where]
    subprocess.run(pip, check=True)
    sys.path.insert(0, where)  # an editable install is seen only after a restart

# %% tags=["remove-cell"]
#| default_exp data

# %% [markdown]
# ## Reading a split, safely
#
# Every file is checked against `SHA256SUMS` before it is used, so that a truncated download, a
# file edited by accident or a wrong copy fails at once with the file's name, rather than
# training a model on the wrong data. The three languages of a split are line-aligned (line $n$ of
# `train.de.gz` translates line $n$ of `train.en.gz`), so the loader also checks that both sides
# have the same number of lines. A translation direction is named by a *pair*, `de-en` or `fr-en`:
# this book always translates into English.

# %%
#| export
"""Multi30k: reading and checking the raw text shipped in data/multi30k."""

import gzip
import hashlib
import zlib
from pathlib import Path


def _repository_root() -> Path:
    # In the package this file is transformer/data.py; in its chapter (no __file__) the working
    # directory is chapters/. Both sit one level below the repository root.
    here = globals().get("__file__")
    return (Path(here).parent if here else Path.cwd()).resolve().parent


DATA_DIR = _repository_root() / "data" / "multi30k"
PAIRS = {"de-en": ("de", "en"), "fr-en": ("fr", "en")}
SPLITS = ("train", "val", "test_2016_flickr")


class DataError(Exception):
    """A data file is missing, corrupt or inconsistent, or a split or pair is unknown."""


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), with a clear error for a pair the book does not have."""
    if pair not in PAIRS:
        raise DataError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    return PAIRS[pair]


def expected_checksums(data_dir: Path = DATA_DIR) -> dict[str, str]:
    """File name -> SHA-256 from data_dir/SHA256SUMS."""
    sums = Path(data_dir) / "SHA256SUMS"
    if not sums.is_file():
        raise DataError(f"missing checksum file {sums}")
    checksums = {}
    for line in sums.read_text().splitlines():
        if line.strip():
            digest, name = line.split()
            checksums[name] = digest
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
            f"corrupt or truncated data file {path}: SHA-256 {digest[:12]}…, "
            f"expected {sha256[:12]}… (restore it with `git checkout -- {path.name}`)"
        )
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise DataError(f"cannot read data file {path}: {err}") from err
    return text.splitlines()


def load_split(split: str, language: str, data_dir: Path = DATA_DIR) -> list[str]:
    """The sentences of one split in one language, one per line of the file."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
    name = f"{split}.{language}.gz"
    checksums = expected_checksums(data_dir)
    if name not in checksums:
        raise DataError(f"no checksum for {name} in {Path(data_dir) / 'SHA256SUMS'}")
    return read_lines(Path(data_dir) / name, checksums[name])


def load_pairs(
    split: str, pair: str, data_dir: Path = DATA_DIR
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a split, e.g. load_pairs("val", "de-en")."""
    src_lang, tgt_lang = parse_pair(pair)
    src = load_split(split, src_lang, data_dir)
    tgt = load_split(split, tgt_lang, data_dir)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}.{src_lang}.gz has {len(src)} lines but {split}.{tgt_lang}.gz has {len(tgt)}"
        )
    return list(zip(src, tgt, strict=True))


# %% [markdown]
# Every split of both pairs loads, with the sizes of the table above:

# %%
import pandas as pd

from transformer.data import PAIRS, SPLITS, load_pairs

sizes = pd.DataFrame(
    [
        {"pair": p, "split": s, "sentence pairs": len(load_pairs(s, p))}
        for p in PAIRS
        for s in SPLITS
    ]
).pivot(index="split", columns="pair", values="sentence pairs")
assert sizes.loc["train"].tolist() == [29_000, 29_000]
assert sizes.loc["val"].tolist() == [1_014, 1_014]
assert sizes.loc["test_2016_flickr"].tolist() == [1_000, 1_000]
sizes

# %% [markdown]
# The first three training pairs of each direction:

# %%
for pair in PAIRS:
    for source, target in load_pairs("train", pair)[:3]:
        print(f"{pair}  {source}\n       {target}")

# %% [markdown]
# A damaged file is named in the error. Here we copy the data to a scratch folder, cut one file
# short, and try to load it:

# %%
import shutil
import tempfile
from pathlib import Path

from transformer.data import DATA_DIR, DataError

with tempfile.TemporaryDirectory() as scratch:
    copy = Path(scratch) / "multi30k"
    shutil.copytree(DATA_DIR, copy)
    damaged = copy / "val.de.gz"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    try:
        load_pairs("val", "de-en", data_dir=copy)
    except DataError as err:
        message = str(err).replace(scratch, "<scratch>")
        print(message)
assert "val.de.gz" in message and "corrupt or truncated" in message
