# Generated from chapters/10_data.ipynb: edit it, not this file.
"""Multi30k: the checked files of data/multi30k, the encoded cache, batches and
BPE-dropout."""

# %% auto #0
__all__ = [
    "DATA_DIR",
    "PAIRS",
    "SPLITS",
    "CACHE_DIR",
    "CACHE_FORMAT",
    "MAX_TOKENS",
    "DataError",
    "check_split",
    "parse_pair",
    "expected_checksums",
    "read_lines",
    "load_split",
    "load_pairs",
    "EncodedSplit",
    "cache_problems",
    "prepare",
    "load_encoded",
    "Batch",
    "collate",
    "token_batches",
    "iterate_batches",
    "BPEDropout",
]

# %% ../chapters/10_data.ipynb #6383e390

import gzip
import hashlib
import importlib.util
import string
import zlib
from pathlib import Path


def _repository_root() -> Path:
    # The package is <root>/transformer. In it this file has a __file__; in its
    # chapter (a notebook, which may run anywhere, e.g. Colab's /content) the
    # installed package says.
    here = (
        globals().get("__file__")
        or importlib.util.find_spec("transformer").origin
    )
    return Path(here).resolve().parent.parent


DATA_DIR = _repository_root() / "data" / "multi30k"
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
    if (
        Path(data_dir).absolute() == DATA_DIR
    ):  # the package's own, data/multi30k
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
    # "\n" only: str.splitlines would also cut at \r, \x0c, U+2028 and others
    # inside a line.
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


# %% ../chapters/10_data.ipynb #a49a6b1f
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata

import numpy as np
from safetensors.numpy import load as _load_safetensors
from safetensors.numpy import save as _save_safetensors

from transformer.files import atomic_write
from transformer.tokenizer import (
    VOCAB_SIZE,
    Tokenizer,
    TokenizerError,
    pretokenize,
    train_tokenizer,
)

CACHE_DIR = _repository_root() / "cache"
CACHE_FORMAT = "transformer-book encoded multi30k 2"
_ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
_STARTS = ("src_starts", "tgt_starts")


def _flatten(
    sequences: Sequence[Sequence[int]], dtype: type = np.int32
) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(
        map(len, sequences), dtype=np.int64, count=len(sequences)
    )
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = itertools.chain.from_iterable(sequences)
    return np.fromiter(flat, dtype=dtype, count=int(offsets[-1])), offsets


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
        return cls(*_flatten(src), *_flatten(tgt))

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
            arrays[f"{side}_ids"], arrays[f"{side}_offsets"] = _flatten(ids)
            arrays[f"{side}_starts"] = _flatten(starts, np.bool_)[0]
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
        names = _ARRAYS if self.src_starts is None else _ARRAYS + _STARTS
        return _save_safetensors({name: getattr(self, name) for name in names})

    @classmethod
    def from_bytes(cls, data: bytes) -> "EncodedSplit":
        arrays = _load_safetensors(data)
        names = [name for name in _ARRAYS + _STARTS if name in arrays]
        return cls(**{name: arrays[name] for name in names})


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
        files = {"tokenizer.json": manifest["tokenizer_sha256"]}
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
    tokenizer.save(folder / "tokenizer.json")
    tokenizer_json = (folder / "tokenizer.json").read_bytes()  # as written
    splits = {}
    for split, pairs in texts.items():
        data = EncodedSplit.from_words(
            tokenizer,
            pretokenize([s for s, _ in pairs], src_lang),
            pretokenize([t for _, t in pairs], tgt_lang),
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
        return Tokenizer.from_json(
            contents["tokenizer.json"].decode("utf-8"),
            source=folder / "tokenizer.json",
        )
    except TokenizerError as err:
        raise DataError(str(err)) from err


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


# %% ../chapters/10_data.ipynb #cc8d1ea8
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class Batch:
    """A padded batch of sentence pairs, ready for the model.

    Shapes:
        src: (B, S) x_1 … x_m <eos>, then pad_id: the encoder's input
        tgt_in: (B, T) <bos> y_1 … y_n, then pad_id: the decoder's input
        tgt_out: (B, T) y_1 … y_n <eos>, then pad_id: what the decoder must
            predict
        index: (B,) the line of each pair in its split
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    index: Tensor
    n_src_tokens: int  # non-pad tokens in src
    n_tgt_tokens: (
        int  # non-pad tokens in tgt_out: the predictions the loss averages
    )

    def to(
        self, device: torch.device | str, non_blocking: bool = False
    ) -> "Batch":
        """The same batch on another device."""
        move = dict(device=device, non_blocking=non_blocking)
        tensors = ("src", "tgt_in", "tgt_out", "index")
        return replace(
            self, **{n: getattr(self, n).to(**move) for n in tensors}
        )


def collate(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    index: Sequence[int] | None = None,
    max_len: int | None = None,
) -> Batch:
    """Pad (source ids, target ids) pairs, given without special tokens, into a
    Batch.

    `index` gives each pair's line in its split (default 0 … B-1). A pair whose
    source with <eos> or target with <bos> is longer than max_len raises
    ValueError: nothing is truncated.
    """
    if len(examples) == 0:
        raise ValueError("cannot collate an empty batch")
    index = np.arange(len(examples)) if index is None else np.asarray(index)
    if index.shape != (len(examples),):
        raise ValueError(
            f"index has shape {index.shape}, not one entry for each of the "
            f"{len(examples)} pairs"
        )
    src_len = np.array([len(x) + 1 for x, _ in examples])  # + <eos>
    tgt_len = np.array(
        [len(y) + 1 for _, y in examples]
    )  # + <bos> (in) or <eos> (out)
    if max_len is not None:
        over = np.flatnonzero((src_len > max_len) | (tgt_len > max_len))
        if over.size:
            k = over[0]
            raise ValueError(
                f"pair {int(index[k])} has {src_len[k]} source and"
                f" {tgt_len[k]} target tokens, more than max_len={max_len};"
                " nothing is truncated: drop or split it"
            )
    B, S, T = len(examples), int(src_len.max()), int(tgt_len.max())
    src = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in, tgt_out = np.full((2, B, T), pad_id, dtype=np.int64)
    for row, (x, y) in enumerate(examples):
        m, n = len(x), len(y)
        src[row, :m], src[row, m] = x, eos_id
        tgt_in[row, 0], tgt_in[row, 1 : n + 1] = bos_id, y
        tgt_out[row, :n], tgt_out[row, n] = y, eos_id
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        index=torch.as_tensor(index, dtype=torch.long),
        n_src_tokens=int(src_len.sum()),
        n_tgt_tokens=int(tgt_len.sum()),
    )


# %% ../chapters/10_data.ipynb #29cc4837
MAX_TOKENS = (
    8_000  # padded tokens per batch, on each side (the paper: about 25,000)
)


def token_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Group pairs into batches of similar length, each holding at most
    `max_tokens` padded tokens on each side; returns the pair indices of each
    batch.

    The lengths are those the model sees (with <eos>, or <bos>). Pairs are
    sorted by their longer side, then by their total length, with ties in a
    random order drawn from (seed, epoch); batches are cut greedily along that
    order and then, with shuffle, shuffled.
    """
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
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src)) if shuffle else np.arange(len(src))
    # lexsort is stable: pairs of equal lengths keep the random order drawn
    # above.
    order = order[np.lexsort((src[order] + tgt[order], longest[order]))]
    batches, start, width = [], 0, 0
    for k, length in enumerate(longest[order].tolist()):
        width = max(width, length)
        # B · max(S, T) would exceed the budget
        if (k - start + 1) * width > max_tokens:
            batches.append(order[start:k])
            start, width = k, length
    if len(order):
        batches.append(order[start:])
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


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
    """The batches of one epoch over an encoded split (see token_batches and
    collate)."""
    lengths = (
        data.src_lengths + 1,
        data.tgt_lengths + 1,
    )  # with <eos>; <bos> or <eos>
    groups = token_batches(
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
        yield collate(
            [data[i] for i in index], **ids, index=index, max_len=max_len
        )


# %% ../chapters/10_data.ipynb #9025b4aa
from random import Random


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
        arrays = {name: getattr(split, name) for name in _ARRAYS + _STARTS}
        for side in [side for side in ("src", "tgt") if side in sides]:
            ids, offsets = arrays[f"{side}_ids"], arrays[f"{side}_offsets"]
            first = np.flatnonzero(arrays[f"{side}_starts"])
            pieces = self.tokenizer.pieces(ids)
            bounds = zip(
                first.tolist(), [*first[1:].tolist(), len(ids)], strict=True
            )
            words = [
                self.segment("".join(pieces[a:b]), rng) for a, b in bounds
            ]
            new_ids, ends = _flatten(words)  # ends: where each word ends
            starts = np.zeros(len(new_ids), dtype=np.bool_)
            starts[ends[:-1]] = True
            arrays[f"{side}_ids"], arrays[f"{side}_starts"] = new_ids, starts
            arrays[f"{side}_offsets"] = ends[np.searchsorted(first, offsets)]
        return EncodedSplit(**arrays)
