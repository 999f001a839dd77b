# Generated from chapters/a04_batches_and_cache.ipynb: edit it, not this file.
"""One split of Multi30k as token ids in flat arrays (EncodedSplit), and the
batches of an epoch over it."""

# %% auto #0
__all__ = ["ARRAYS", "STARTS", "flatten", "EncodedSplit", "iterate_batches"]

# %% ../chapters/a04_batches_and_cache.ipynb #37180bfe

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


# %% ../chapters/a04_batches_and_cache.ipynb #b574b844
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


# %% ../chapters/a04_batches_and_cache.ipynb #bb493428
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
