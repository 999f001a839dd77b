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
# # Batches and the encoded cache
#
# On the data chapter's batches this appendix builds what training reads: checks that turn
# arguments unable to make a batch into one clear error, splits held as token ids and cached on
# disk (so that training needs neither the text nor spaCy), BPE-dropout, and an epoch's
# batches.

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
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)


# %% tags=["remove-cell"]
#| default_exp checked_batches

# %% [markdown]
# ## The checks of a batch
#
# The chapter's `collate` and `token_batches` trust their arguments. Where batches enter the
# package's pipeline, three checks come first, each raising one clear `ValueError`: an empty batch
# or an `index` without one line per pair; a pair longer than the model's positions (nothing is
# ever truncated); and lengths that do not pair up, a budget that is not positive or a pair that no
# batch can hold.

# %%
#| export checked_batches
"""The chapter's collate and token_batches with their arguments checked first:
one clear ValueError for a batch that cannot be made."""

from collections.abc import Sequence

import numpy as np


def check_index(index: Sequence[int] | None, n: int) -> np.ndarray:
    """The line of each of n pairs in its split: `index`, or 0 … n-1."""
    if n == 0:
        raise ValueError("cannot collate an empty batch")
    index = np.arange(n) if index is None else np.asarray(index)
    if index.shape != (n,):
        raise ValueError(
            f"index has shape {index.shape}, not one entry for each of the "
            f"{n} pairs"
        )
    return index


def check_fit(
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    index: np.ndarray,
    max_len: int | None,
) -> None:
    """Refuse a pair whose source with <eos>, or target with <bos>, is longer
    than max_len: nothing is truncated."""
    if max_len is None:
        return
    over = np.flatnonzero((src_len > max_len) | (tgt_len > max_len))
    if over.size:
        k = over[0]
        raise ValueError(
            f"pair {int(index[k])} has {src_len[k]} source and"
            f" {tgt_len[k]} target tokens, more than max_len={max_len};"
            " nothing is truncated: drop or split it"
        )


def check_lengths(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """The lengths of each pair's sides as int64 arrays, checked: one of each
    per pair, a positive budget, and no pair longer than it."""
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    if src.ndim != 1 or src.shape != tgt.shape:
        raise ValueError(
            f"one source and one target length per pair: {src.shape},"
            f" {tgt.shape}"
        )
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    longest = np.maximum(src, tgt)
    over = np.flatnonzero(longest > max_tokens)
    if over.size:
        raise ValueError(
            f"pair {over[0]} has {longest[over[0]]} tokens, more than "
            f"max_tokens={max_tokens}: no batch can hold it"
        )
    return src, tgt


# %% [markdown]
# `transformer.checked_batches` puts the checks in front of the chapter's two functions; its
# `checked_collate` also takes `max_len`, the model's positions.

# %%
#| export checked_batches
import transformer.batches as chapter
from transformer.batches import MAX_TOKENS, Batch


def checked_collate(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    index: Sequence[int] | None = None,
    max_len: int | None = None,
) -> Batch:
    """The chapter's `collate`, its arguments checked first; a pair whose
    source with <eos>, or target with <bos>, is longer than `max_len` is
    refused, never truncated."""
    index = check_index(index, len(examples))
    src_len = np.array([len(x) + 1 for x, _ in examples])  # + <eos>
    tgt_len = np.array([len(y) + 1 for _, y in examples])  # + <bos> or <eos>
    check_fit(src_len, tgt_len, index, max_len)
    ids = dict(pad_id=pad_id, bos_id=bos_id, eos_id=eos_id)
    return chapter.collate(examples, **ids, index=index)


def checked_token_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """The chapter's `token_batches`, its arguments checked first."""
    src, tgt = check_lengths(src_lengths, tgt_lengths, max_tokens)
    order = dict(seed=seed, epoch=epoch, shuffle=shuffle)
    return chapter.token_batches(src, tgt, max_tokens=max_tokens, **order)


# %% [markdown]
# Each check at work:

# %%
from transformer.checked_batches import checked_collate, checked_token_batches

ids = dict(pad_id=0, bos_id=2, eos_id=3)
for attempt in (
    lambda: checked_collate([], **ids),
    lambda: checked_collate([([5], [6]), ([7], [8])], **ids, index=[9]),
    lambda: checked_collate(
        [([5] * 600, [6])], **ids, index=[41], max_len=512
    ),
    lambda: checked_token_batches([3, 4], [3], max_tokens=100),
    lambda: checked_token_batches([3, 400], [3, 5], max_tokens=100),
):
    try:
        attempt()
    except ValueError as err:
        print(err)
    else:
        raise AssertionError("no error")

# %% [markdown]
# ## A split as token ids
#
# An `EncodedSplit` holds one split's token ids without special tokens, each side as a flat array
# of ids and an array of offsets: pair $i$ is `src_ids[src_offsets[i]:src_offsets[i + 1]]`, and the
# same for the target. Flat arrays load fast and take little memory. Optional arrays of word
# starts, one flag per id, mark the ids that begin a word of `pretokenize`: BPE-dropout needs them
# to find the words again. The constructor checks that the arrays fit together, so a damaged split
# is an error, not wrong batches.

# %%
#| export encoded_split
"""One split of Multi30k as token ids in flat arrays (EncodedSplit), and the
batches of an epoch over it."""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import load as _load_safetensors
from safetensors.numpy import save as _save_safetensors

from transformer.multi30k import DataError
from transformer.tokenizer import Tokenizer

ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
STARTS = ("src_starts", "tgt_starts")


def flatten(
    sequences: Sequence[Sequence[int]], dtype: type = np.int32
) -> tuple[np.ndarray, np.ndarray]:
    """(all the items in one array, the N + 1 offsets where each sequence
    starts and the last ends)."""
    lengths = np.fromiter(
        map(len, sequences), dtype=np.int64, count=len(sequences)
    )
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = itertools.chain.from_iterable(sequences)
    return np.fromiter(flat, dtype=dtype, count=int(offsets[-1])), offsets


# %%
#| export encoded_split
@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """The token ids of one split, without special tokens, as flat arrays.

    Pair i is (src_ids[src_offsets[i]:src_offsets[i + 1]],
    tgt_ids[tgt_offsets[i]:...]); ids are int32 and each offsets array holds N
    + 1 int64 entries, starting at 0. The optional `src_starts` and
    `tgt_starts` (bool, one per id) mark the ids that begin a word of
    `pretokenize`, which BPE-dropout needs to segment the words afresh.
    """

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    src_starts: np.ndarray | None = None
    tgt_starts: np.ndarray | None = None

    def __post_init__(self) -> None:
        for side in ("src", "tgt"):
            ids, offsets, starts = (
                getattr(self, f"{side}_{name}")
                for name in ("ids", "offsets", "starts")
            )
            if not (
                (ids.ndim, ids.dtype, offsets.ndim, offsets.dtype)
                == (1, np.int32, 1, np.int64)
                and len(offsets) > 0
                and offsets[0] == 0
                and offsets[-1] == len(ids)
                and (np.diff(offsets) >= 0).all()
            ):
                raise DataError(f"inconsistent {side} ids and offsets")
            if starts is not None:
                first = offsets[:-1][
                    np.diff(offsets) > 0
                ]  # of each non-empty sentence
                if not (
                    starts.dtype == np.bool_
                    and starts.shape == ids.shape
                    and bool(starts[first].all())
                ):
                    raise DataError(
                        f"inconsistent {side} word starts: one bool per id,"
                        " and every sentence begins a word"
                    )
        if len(self.src_offsets) != len(self.tgt_offsets):
            raise DataError(
                "source and target hold different numbers of sentences"
            )
        if (self.src_starts is None) != (self.tgt_starts is None):
            raise DataError("word starts are given for one side only")

    @classmethod
    def from_lists(
        cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]
    ) -> "EncodedSplit":
        """From the token ids of each source and each target sentence (no word
        starts, so BPE-dropout cannot resample it: see `from_words`)."""
        return cls(*flatten(src), *flatten(tgt))

    @classmethod
    def from_words(
        cls,
        tokenizer: Tokenizer,
        src: Sequence[Sequence[str]],
        tgt: Sequence[Sequence[str]],
    ) -> "EncodedSplit":
        """From sentences cut into marked words by `pretokenize`, keeping the
        word starts."""
        arrays = {}
        for side, sentences in (("src", src), ("tgt", tgt)):
            pieces = [
                [tokenizer.segment(w) for w in words] for words in sentences
            ]
            ids = [
                [i for word in sentence for i in word] for sentence in pieces
            ]
            starts = [
                [k == 0 for w in s for k in range(len(w))] for s in pieces
            ]
            arrays[f"{side}_ids"], arrays[f"{side}_offsets"] = flatten(ids)
            arrays[f"{side}_starts"] = flatten(starts, np.bool_)[0]
        return cls(**arrays)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The (source ids, target ids) of pair i."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} of a split of {len(self)}")
        i %= len(self)
        s, t = self.src_offsets, self.tgt_offsets
        return self.src_ids[s[i] : s[i + 1]], self.tgt_ids[t[i] : t[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def to_bytes(self) -> bytes:
        names = ARRAYS if self.src_starts is None else ARRAYS + STARTS
        return _save_safetensors({name: getattr(self, name) for name in names})

    @classmethod
    def from_bytes(cls, data: bytes) -> "EncodedSplit":
        arrays = _load_safetensors(data)
        names = [name for name in ARRAYS + STARTS if name in arrays]
        return cls(**{name: arrays[name] for name in names})


# %% [markdown]
# A German validation sentence as words, and as pieces in an `EncodedSplit` (`|` marks a word
# start): every word begins with a start flag, however many pieces it has.

# %%
import numpy as np

from transformer.encoded_split import EncodedSplit
from transformer.multi30k import DataError, load_split
from transformer.paths import CHECKPOINTS_DIR
from transformer.words import fast_pretokenize, load_tokenizer

# the shipped de-en model's tokenizer, learned as the cache below learns it
tokenizer = load_tokenizer(CHECKPOINTS_DIR / "de-en" / "tokenizer.json")

german, english = load_split("val", "de"), load_split("val", "en")
words = fast_pretokenize(german, "de")
split = EncodedSplit.from_words(
    tokenizer, words, fast_pretokenize(english, "en")
)
# the first sentence with a word of several pieces
i = next(i for i in range(len(split)) if len(split[i][0]) > len(words[i]))
starts = split.src_starts[split.src_offsets[i] : split.src_offsets[i + 1]]
pieces = tokenizer.pieces(split[i][0])
print(words[i])
print(
    " ".join(
        ("|" if s else "") + p for p, s in zip(pieces, starts, strict=True)
    )
)
assert starts.sum() == len(words[i])
again = EncodedSplit.from_bytes(split.to_bytes())
assert np.array_equal(again.src_starts, split.src_starts)
try:
    EncodedSplit(
        split.src_ids[:-1], split.src_offsets, split.tgt_ids, split.tgt_offsets
    )
except DataError as err:
    print(err)

# %% [markdown]
# ## Atomic files
#
# A process can be killed at any moment, and a file being rewritten must not be left half old,
# half new. `atomic_write` (built, hidden, in the data chapter) writes a temporary file beside the
# destination, flushes it (`fsync`) and renames it over the destination: a rename is atomic, so
# readers see the old file or the new one.
#
# `atomic_folder` does the same for a folder of files, such as a checkpoint: the block writes into
# a hidden temporary folder, which replaces the destination only when the block ends without error.
# Every writer of the package goes through these two.


# %%
#| export records
"""Atomic folders and the JSON Lines records of a run."""

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


# %% [markdown]
# A block that fails leaves the old folder as it was, and one that succeeds replaces it whole:

# %%
import tempfile
from pathlib import Path

from transformer.atomic import atomic_write
from transformer.records import atomic_folder

scratch = Path(tempfile.mkdtemp())
with atomic_folder(scratch / "run") as tmp:
    atomic_write(tmp / "a.txt", b"first")
try:
    with atomic_folder(scratch / "run") as tmp:
        (tmp / "a.txt").write_text("second, half writ")
        raise KeyboardInterrupt  # the process is stopped inside the block
except KeyboardInterrupt:
    pass
assert (scratch / "run" / "a.txt").read_text() == "first"
assert [p.name for p in scratch.iterdir()] == [
    "run"
]  # no temporary folder left
with atomic_folder(scratch / "run") as tmp:
    (tmp / "b.txt").write_text("second")
print(sorted(p.name for p in (scratch / "run").iterdir()))

# %% [markdown]
# ## The encoded cache
#
# Training reads the same pairs for dozens of epochs, and a training machine need not have spaCy at
# all. `prepare(pair)` encodes every split once into `cache/<pair>/`:
#
# | file | holds |
# | --- | --- |
# | `tokenizer.json` | the tokenizer learned from the training split |
# | `train.safetensors`, `val.safetensors`, `test_2016_flickr.safetensors` | each split as an `EncodedSplit`, with its word starts |
# | `manifest.json` | the cache format, the pair, the vocabulary size, the checksums of the data files it was built from, and the SHA-256 of each file above |
#
# `load_encoded(pair, split)` reads a split back without spaCy. A cache whose manifest does not
# match (other data, another vocabulary size, a damaged or missing file) is never used:
# `cache_problems` names what is wrong, `prepare` rebuilds it (which needs spaCy) and
# `load_encoded` refuses it with a `DataError` that says how to rebuild it. A build deletes the
# manifest first and writes it last, each file atomically, so an interrupted build leaves a
# recognisably unfinished cache. `python -m transformer prepare` builds both pairs' caches.

# %%
#| export encoded_cache
"""The encoded cache: every split of a pair as token ids on disk, written by
`prepare` and read by `load_encoded` without spaCy."""

import hashlib
import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from transformer import layout
from transformer.atomic import atomic_write
from transformer.checked_data import expected_checksums, load_pairs
from transformer.encoded_split import EncodedSplit
from transformer.multi30k import SPLITS, DataError, check_split, parse_pair
from transformer.paths import CACHE_DIR, DATA_DIR
from transformer.tokenizer import VOCAB_SIZE, Tokenizer, train_bpe
from transformer.vocabulary import TokenizerError
from transformer.words import fast_pretokenize, with_fast_words

CACHE_FORMAT = "transformer-book encoded multi30k 2"


def train_tokenizer(
    pairs: Sequence[tuple[str, str]],
    vocab_size: int = VOCAB_SIZE,
    *,
    languages: tuple[str, str],
) -> Tokenizer:
    """The joint BPE tokenizer of a language pair, learned from both sides of
    its (source, target) sentence pairs: give it the training split, and
    validation and test text never reach the vocabulary."""
    src_lang, tgt_lang = languages
    sentences = fast_pretokenize(
        [s for s, _ in pairs], src_lang
    ) + fast_pretokenize([t for _, t in pairs], tgt_lang)
    tokenizer = train_bpe(sentences, vocab_size, languages=languages)
    return with_fast_words(tokenizer)


def _data_files(pair: str) -> list[str]:
    return [
        f"{split}.{lang}.gz" for split in SPLITS for lang in parse_pair(pair)
    ]


def cache_problems(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int | None = None,
    data_dir: Path = DATA_DIR,
) -> list[str]:
    """What makes the cache of a pair unusable, [] if it is complete and
    current; with vocab_size, a cache built with another vocabulary size is
    stale too."""
    return _read_cache(
        pair, cache_dir, vocab_size=vocab_size, data_dir=data_dir
    )[0]


# %% [markdown]
# The manifest is checked first, then every file against its digest. Each file is read once, so the
# caller gets the bytes that were checked, even if a rebuild replaces the files meanwhile.


# %%
#| export encoded_cache
def _read_cache(
    pair: str,
    cache_dir: Path,
    *,
    data_dir: Path,
    vocab_size: int | None = None,
) -> tuple[list[str], dict[str, bytes]]:
    """(cache_problems, the content of each file whose checksum matched). The
    files are read once: what is checked is what the caller uses, even if a
    rebuild replaces them."""
    parse_pair(pair)
    folder = Path(cache_dir) / pair
    try:
        manifest = json.loads(
            (folder / "manifest.json").read_text(encoding="utf-8")
        )
    except FileNotFoundError:
        return [
            "no manifest.json: never built, or its build did not finish"
        ], {}
    except (OSError, ValueError) as err:
        return [f"manifest.json is unreadable: {err}"], {}
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != CACHE_FORMAT
    ):
        return [f"manifest.json is not a {CACHE_FORMAT!r} manifest"], {}
    problems, built_for, built_size = (
        [],
        manifest.get("pair"),
        manifest.get("vocab_size"),
    )
    if built_for != pair:
        problems.append(f"manifest.json describes {built_for!r}, not {pair!r}")
    if vocab_size is not None and built_size != vocab_size:
        problems.append(
            f"built with vocab_size={built_size}, asked for {vocab_size}"
        )
    try:
        checksums = expected_checksums(data_dir)
    except DataError as err:
        problems.append(str(err))
    else:
        recorded = manifest.get("data")
        if not isinstance(recorded, dict):
            problems.append(
                "manifest.json holds no table of data checksums (field data)"
            )
        else:
            for name in _data_files(pair):
                if recorded.get(name) != checksums.get(name):
                    problems.append(
                        f"{name} has changed since the cache was built"
                    )
    try:
        files = {layout.TOKENIZER: manifest["tokenizer_sha256"]}
        splits = manifest["splits"]
        if set(splits) != set(SPLITS):
            problems.append(f"manifest.json lists the splits {sorted(splits)}")
        files |= {entry["file"]: entry["sha256"] for entry in splits.values()}
    except (KeyError, TypeError, AttributeError) as err:
        return [*problems, f"manifest.json is malformed ({err!r})"], {}
    contents = {}
    for name, digest in files.items():
        try:
            blob = (folder / name).read_bytes()
        except FileNotFoundError:
            problems.append(f"{name} is missing")
            continue
        except OSError as err:
            problems.append(f"{name} is unreadable: {err}")
            continue
        if hashlib.sha256(blob).hexdigest() != digest:
            problems.append(
                f"{name} is corrupt: its SHA-256 differs from manifest.json"
            )
        else:
            contents[name] = blob
    return problems, contents


# %% [markdown]
# A build learns the tokenizer from both sides of the training split with `train_tokenizer` (the
# chapter's `train_bpe` over the package's words), then encodes every split. All that can fail for
# want of data or of spaCy fails before the old cache is touched.


# %%
#| export encoded_cache
def _build_cache(
    pair: str, folder: Path, *, vocab_size: int, data_dir: Path
) -> None:
    src_lang, tgt_lang = parse_pair(pair)
    # Everything that can fail for want of data or of spaCy (training the
    # tokenizer needs it) fails before the old cache is touched: a wrong
    # --data-dir must not cost a good cache.
    texts = {split: load_pairs(split, pair, data_dir) for split in SPLITS}
    checksums = expected_checksums(data_dir)
    tokenizer = train_tokenizer(
        texts["train"], vocab_size, languages=(src_lang, tgt_lang)
    )
    folder.mkdir(parents=True, exist_ok=True)
    # No valid cache until the build ends.
    (folder / "manifest.json").unlink(missing_ok=True)
    tokenizer.save(folder / layout.TOKENIZER)
    tokenizer_json = (folder / layout.TOKENIZER).read_bytes()  # as written
    splits = {}
    for split, pairs in texts.items():
        data = EncodedSplit.from_words(
            tokenizer,
            fast_pretokenize([s for s, _ in pairs], src_lang),
            fast_pretokenize([t for _, t in pairs], tgt_lang),
        )
        blob = data.to_bytes()
        atomic_write(folder / f"{split}.safetensors", blob)
        splits[split] = {
            "file": f"{split}.safetensors",
            "sha256": hashlib.sha256(blob).hexdigest(),
            "sentences": len(data),
            "src_tokens": len(data.src_ids),
            "tgt_tokens": len(data.tgt_ids),
        }
    manifest = {
        "format": CACHE_FORMAT,
        "pair": pair,
        "vocab_size": vocab_size,
        "data": {name: checksums[name] for name in _data_files(pair)},
        "tokenizer_sha256": hashlib.sha256(tokenizer_json).hexdigest(),
        "splits": splits,
        "built_with": {
            name: metadata.version(name) for name in ("spacy", "tokenizers")
        },
    }
    atomic_write(
        folder / "manifest.json",
        (json.dumps(manifest, indent=2) + "\n").encode(),
    )


# %%
#| export encoded_cache
def prepare(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int = VOCAB_SIZE,
    data_dir: Path = DATA_DIR,
    rebuild: bool = False,
) -> Tokenizer:
    """The tokenizer of a pair, with every split encoded in cache_dir/pair: a
    complete, current cache is loaded and needs no spaCy; a missing, stale or
    corrupt one (see cache_problems) is rebuilt from the text, as is any cache
    with rebuild=True."""
    folder = Path(cache_dir) / pair
    options = dict(vocab_size=vocab_size, data_dir=data_dir)
    problems, contents = [], {}
    if not rebuild:  # a rebuild need not read and hash the old files first
        problems, contents = _read_cache(pair, cache_dir, **options)
    if rebuild or problems:
        _build_cache(pair, folder, **options)
        problems, contents = _read_cache(pair, cache_dir, **options)
        if problems:  # only if something rewrote the files while we built them
            raise DataError(
                f"the cache just built in {folder} is unusable: {problems}"
            )
    # Its checksum matched, but it may be a tokenizer that this version cannot
    # read.
    try:
        tokenizer = Tokenizer.from_json(
            contents[layout.TOKENIZER].decode("utf-8"),
            source=folder / layout.TOKENIZER,
        )
    except TokenizerError as err:
        raise DataError(str(err)) from err
    return with_fast_words(tokenizer)


def load_encoded(
    pair: str,
    split: str,
    cache_dir: Path = CACHE_DIR,
    *,
    data_dir: Path = DATA_DIR,
) -> EncodedSplit:
    """One split of a pair as token ids, from the cache that `prepare` wrote;
    needs no spaCy. A missing, stale or corrupt cache raises DataError: it is
    never used."""
    check_split(split, "load_encoded(pair, split)")
    folder = Path(cache_dir) / pair
    problems, contents = _read_cache(pair, cache_dir, data_dir=data_dir)
    if problems:
        raise DataError(
            f"cannot use the encoded cache {folder}: {'; '.join(problems)}."
            " Rebuild it on a machine with spaCy: `python -m transformer"
            f" prepare --pair {pair}`"
        )
    return EncodedSplit.from_bytes(contents[f"{split}.safetensors"])


# %% [markdown]
# `prepare` builds each pair's cache the first time and loads it afterwards. It holds what the
# chapter computes: the same tokenizer, and the same ids as encoding each split afresh.

# %%
from transformer.checked_data import load_pairs
from transformer.encoded_cache import (
    cache_problems,
    load_encoded,
    prepare,
    train_tokenizer,
)
from transformer.multi30k import PAIRS, SPLITS
from transformer.tokenizer import VOCAB_SIZE

trained = {
    pair: train_tokenizer(load_pairs("train", pair), languages=languages)
    for pair, languages in PAIRS.items()
}
cached = {pair: prepare(pair) for pair in PAIRS}
for pair, tokenizer in cached.items():
    assert tokenizer.to_json() == trained[pair].to_json()
    assert cache_problems(pair, vocab_size=VOCAB_SIZE) == []
    src_lang, tgt_lang = PAIRS[pair]
    for split in SPLITS:
        data = load_encoded(pair, split)
        sources, targets = zip(*load_pairs(split, pair), strict=True)
        expected = EncodedSplit.from_lists(
            tokenizer.encode_batch(sources, src_lang),
            tokenizer.encode_batch(targets, tgt_lang),
        )
        assert all(
            np.array_equal(getattr(data, name), getattr(expected, name))
            for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
        )
        assert data.src_starts is not None and data.tgt_starts is not None
val = load_encoded("de-en", "val")
source, target = val[0]
print(len(val), "pairs;", source.dtype, source.tolist(), target.tolist())
print(cached["de-en"].decode(source), "->", cached["de-en"].decode(target))

# %% [markdown]
# A copy of the cache with one file damaged is refused by `load_encoded`, naming the rebuild
# command, and rebuilt by `prepare` byte for byte the same, since learning the tokenizer is
# deterministic.

# %%
import shutil

from transformer.encoded_cache import CACHE_DIR

copy = Path(tempfile.mkdtemp()) / "cache"
shutil.copytree(CACHE_DIR / "de-en", copy / "de-en")
before = {p.name: p.read_bytes() for p in (copy / "de-en").iterdir()}
damaged = copy / "de-en" / "val.safetensors"
damaged.write_bytes(damaged.read_bytes()[:-4])
print(cache_problems("de-en", copy))
try:
    load_encoded("de-en", "val", copy)
except DataError as err:
    print(str(err).replace(str(copy), "…"))
prepare("de-en", copy)
assert {p.name: p.read_bytes() for p in (copy / "de-en").iterdir()} == before

# %% [markdown]
# ## How large a vocabulary?
#
# With the chapter's 8,000 entries (`VOCAB_SIZE`) an average training word takes little more than
# one piece; the runs that compare vocabulary sizes are in [The experiments behind the
# recipe](a12_experiments.ipynb).

# %%
import pandas as pd

rows = []
for pair in cached:
    data = load_encoded(pair, "train")
    for lang, side in zip(PAIRS[pair], ("src", "tgt"), strict=True):
        n_words = int(getattr(data, f"{side}_starts").sum())
        n_tokens = len(getattr(data, f"{side}_ids"))
        rows.append(
            {
                "pair": pair,
                "language": lang,
                "words": n_words,
                "tokens": n_tokens,
                "tokens per word": round(n_tokens / n_words, 3),
            }
        )
per_word = pd.DataFrame(rows).set_index(["pair", "language"])
assert (per_word["tokens per word"] < 1.3).all()
per_word

# %% [markdown]
# ## BPE-dropout (an option, off by default)
#
# BPE gives every word one segmentation, so a rare word is always spelt from the same pieces, each
# seen in few contexts. BPE-dropout {cite:p}`provilkov2020bpe` segments each training word afresh
# each time it is used: at every merge step, each merge that could apply is dropped with
# probability $p$ and the best of the rest applies. $p = 0$ is BPE; as $p$ nears 1 it approaches
# characters. Validation and test keep the deterministic segmentation. Not in the paper, it is
# turned on with `--bpe-dropout p`. `BPEDropout` draws from a generator seeded by (seed, epoch), so
# that a resumed run makes the same updates, and finds the words by the cache's word starts.

# %%
#| export bpe_dropout
"""BPE-dropout (Provilkov et al., 2020): the training words spelt afresh each
epoch."""

import json
from collections.abc import Sequence
from dataclasses import replace
from random import Random

import numpy as np

from transformer.encoded_split import EncodedSplit, flatten
from transformer.multi30k import DataError
from transformer.tokenizer import Tokenizer


class BPEDropout:
    """BPE-dropout (Provilkov et al., 2020): segment words afresh, dropping
    each merge that could apply with probability p at every step; p = 0 is the
    tokenizer's own BPE."""

    def __init__(self, tokenizer: Tokenizer, p: float) -> None:
        if (
            isinstance(p, bool)
            or not isinstance(p, int | float)
            or not 0 <= p < 1
        ):
            raise ValueError(
                f"BPE-dropout probability must be in [0, 1), got {p!r}"
            )
        self.tokenizer, self.p = tokenizer, float(p)
        merges = json.loads(tokenizer.bpe.to_str())["model"]["merges"]
        pairs = (
            tuple(m.split(" ") if isinstance(m, str) else m) for m in merges
        )
        self._rank = {pair: rank for rank, pair in enumerate(pairs)}
        self._vocab = tokenizer.bpe.get_vocab()

    def segment(self, word: str, rng: Random) -> list[int]:
        """The ids of one marked word's pieces, drawn with `rng`."""
        symbols, rank, p, draw = list(word), self._rank, self.p, rng.random
        while len(symbols) > 1:
            # The best merge that survives: scanning the candidates, a merge is
            # only drawn when it would beat the best survivor so far; the
            # others cannot win anyway.
            best, at = None, -1
            for i in range(len(symbols) - 1):
                r = rank.get((symbols[i], symbols[i + 1]))
                if (
                    r is not None
                    and (best is None or r < best)
                    and draw() >= p
                ):
                    best, at = r, i
            if best is None:
                break
            symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
        unk = self.tokenizer.unk_id
        return [self._vocab.get(symbol, unk) for symbol in symbols]

    @staticmethod
    def check(split: EncodedSplit) -> None:
        """Raise DataError if the split does not say where its words start."""
        if split.src_starts is None or split.tgt_starts is None:
            raise DataError(
                "BPE-dropout needs the word starts of the training split:"
                " build it with `EncodedSplit.from_words` or load it with"
                " `load_encoded` (`from_lists` records no word starts)"
            )

    def longest_spelling(
        self, split: EncodedSplit, sides: Sequence[str] = ("src", "tgt")
    ) -> int:
        """The most tokens a sentence of `sides` can take when resampled, <bos>
        and <eos> aside: one per character of its words, the spelling in which
        every merge drops."""
        longest = 0
        for side in sides:
            ids, offsets = (
                getattr(split, f"{side}_ids"),
                getattr(split, f"{side}_offsets"),
            )
            lengths = [len(piece) for piece in self.tokenizer.pieces(ids)]
            chars = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
            longest = max(longest, int(np.diff(chars[offsets]).max(initial=0)))
        return longest

    def resample(
        self,
        split: EncodedSplit,
        *,
        seed: int,
        epoch: int,
        sides: Sequence[str] = ("src", "tgt"),
    ) -> EncodedSplit:
        """The split with every word of `sides` ("src", "tgt" or both)
        segmented afresh, as a function of (seed, epoch); the other side is
        kept as it is."""
        self.check(split)
        if not set(sides) <= {"src", "tgt"}:
            raise ValueError(
                f"sides must be 'src' and/or 'tgt', got {sides!r}"
            )
        rng = Random(f"bpe-dropout {seed} {epoch}")
        arrays = {}
        for side in [side for side in ("src", "tgt") if side in sides]:
            ids = getattr(split, f"{side}_ids")
            offsets = getattr(split, f"{side}_offsets")
            first = np.flatnonzero(getattr(split, f"{side}_starts"))
            pieces = self.tokenizer.pieces(ids)
            bounds = zip(
                first.tolist(), [*first[1:].tolist(), len(ids)], strict=True
            )
            words = [
                self.segment("".join(pieces[a:b]), rng) for a, b in bounds
            ]
            new_ids, ends = flatten(words)  # ends: where each word ends
            starts = np.zeros(len(new_ids), dtype=np.bool_)
            starts[ends[:-1]] = True
            arrays[f"{side}_ids"], arrays[f"{side}_starts"] = new_ids, starts
            arrays[f"{side}_offsets"] = ends[np.searchsorted(first, offsets)]
        return replace(split, **arrays)


# %% [markdown]
# With $p = 0$, `BPEDropout` is the tokenizer: it segments every distinct word of every split,
# in both pairs, exactly as Hugging Face's BPE does, rank order and ties included.

# %%
from random import Random

from transformer.bpe_dropout import BPEDropout

for pair, (src_lang, tgt_lang) in PAIRS.items():
    tokenizer, plain = cached[pair], BPEDropout(cached[pair], 0.0)
    distinct = {
        word
        for split in SPLITS
        for lang in (src_lang, tgt_lang)
        for words in fast_pretokenize(load_split(split, lang), lang)
        for word in words
    }
    assert all(
        plain.segment(w, Random(0)) == list(tokenizer.segment(w))
        for w in distinct
    )
    print(
        f"{pair}: {len(distinct):,} distinct words, each segmented as by BPE"
    )

# %% [markdown]
# With $p = 0.1$ a word comes out in several spellings: the six commonest of 1,000 draws, with
# their counts, for a frequent German word and for one seen once in training (first row: BPE's own
# spelling):

# %%
from collections import Counter

dropout = BPEDropout(cached["de-en"], 0.1)
train_words = Counter(
    w
    for words in fast_pretokenize(load_split("train", "de"), "de")
    for w in words
)
draws = Random(0)
spellings, left = [], {}  # left: the share of draws that leave BPE's spelling
for word in ("▁Mann", "▁Polizeihund"):
    seen = Counter(
        " ".join(cached["de-en"].pieces(dropout.segment(word, draws)))
        for _ in range(1_000)
    )
    plain_spelling = " ".join(
        cached["de-en"].pieces(cached["de-en"].segment(word))
    )
    assert seen.most_common(1)[0][0] == plain_spelling
    left[word] = 1 - seen[plain_spelling] / 1_000
    spellings += [
        {
            "word": word,
            "in training": train_words[word],
            "spelling": s,
            "of 1,000": n,
        }
        for s, n in seen.most_common(6)
    ]
assert (
    round(left["▁Mann"], 2) == 0.28 and round(left["▁Polizeihund"], 2) == 0.16
)
pd.DataFrame(spellings).set_index(["word", "in training"])

# %% [markdown]
# Resampling a split keeps every sentence's text, since a word's pieces always spell the word, and
# makes it longer; the same (seed, epoch) gives the same split:

# %%
train = load_encoded("de-en", "train")
epoch_0 = dropout.resample(train, seed=0, epoch=0)
decode = cached["de-en"].decode
assert all(
    decode(epoch_0[i][0]) == decode(train[i][0]) for i in range(len(train))
)
assert all(
    decode(epoch_0[i][1]) == decode(train[i][1]) for i in range(len(train))
)
again = dropout.resample(train, seed=0, epoch=0)
assert np.array_equal(again.tgt_ids, epoch_0.tgt_ids)
epoch_1 = dropout.resample(train, seed=0, epoch=1)
assert not np.array_equal(epoch_1.tgt_ids, epoch_0.tgt_ids)
growth = {
    side: (
        len(getattr(epoch_0, f"{side}_ids"))
        / len(getattr(train, f"{side}_ids"))
    )
    for side in ("src", "tgt")
}
assert round(growth["src"], 2) == 1.30 and round(growth["tgt"], 2) == 1.28
print(
    f"p = 0.1: {growth['src'] - 1:.0%} more German and {growth['tgt'] - 1:.0%}"
    " more English tokens"
)

# %% [markdown]
# A draw that drops every merge spells each word letter by letter, and none is longer, so
# `longest_spelling` bounds every epoch; training checks the model's positions against it before
# the first update ([The training loop](13_training.ipynb)):

# %%
longest_bpe = int(max(train.src_lengths.max(), train.tgt_lengths.max())) + 1
longest_drawn = (
    int(max(epoch_0.src_lengths.max(), epoch_0.tgt_lengths.max())) + 1
)
longest_spelled = dropout.longest_spelling(train) + 1
assert longest_bpe < longest_drawn <= longest_spelled == 256
print(
    f"BPE {longest_bpe} tokens, one draw at p = 0.1 {longest_drawn}, "
    f"at most {longest_spelled} (one a character)"
)


# %% [markdown]
# ## An epoch's batches
#
# Training reads an encoded split through `iterate_batches`, which serves an epoch's batches, cut
# by `token_batches` and padded by `collate`, both with their checks.

# %%
#| export encoded_split
from collections.abc import Iterator

from transformer.batches import MAX_TOKENS, Batch
from transformer.checked_batches import checked_collate, checked_token_batches
from transformer.tokenizer import Tokenizer


def iterate_batches(
    data: EncodedSplit,
    tokenizer: Tokenizer,
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    max_len: int | None = None,
) -> Iterator[Batch]:
    """The batches of one epoch over an encoded split (see
    checked_token_batches and checked_collate)."""
    lengths = (
        data.src_lengths + 1,
        data.tgt_lengths + 1,
    )  # with <eos>; <bos> or <eos>
    groups = checked_token_batches(
        *lengths,
        max_tokens=max_tokens,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
    )
    ids = {
        name: getattr(tokenizer, name)
        for name in ("pad_id", "bos_id", "eos_id")
    }
    for index in groups:
        yield checked_collate(
            [data[i] for i in index], **ids, index=index, max_len=max_len
        )


# %% [markdown]
# One epoch over the cached de-en training split: every pair comes once, in batches within the
# budget, the same batches as `token_batches` makes on the same lengths.

# %%
from transformer.encoded_split import iterate_batches

train = load_encoded("de-en", "train")
batches = list(iterate_batches(train, cached["de-en"], seed=0, epoch=3))
groups = checked_token_batches(
    train.src_lengths + 1, train.tgt_lengths + 1, seed=0, epoch=3
)
assert [b.index.tolist() for b in batches] == [g.tolist() for g in groups]
assert sorted(i for b in batches for i in b.index.tolist()) == list(
    range(len(train))
)
assert all(
    b.src.numel() <= 8_000 and b.tgt_in.numel() <= 8_000 for b in batches
)
print(f"{len(batches)} batches of {len(train):,} pairs")
