# Generated from chapters/a04_batches_and_cache.ipynb: edit it, not this file.
"""The chapter's collate and token_batches with their arguments checked first:
one clear ValueError for a batch that cannot be made."""

# %% auto #0
__all__ = [
    "check_index",
    "check_fit",
    "check_lengths",
    "checked_collate",
    "checked_token_batches",
]

# %% ../chapters/a04_batches_and_cache.ipynb #1e03c580

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


# %% ../chapters/a04_batches_and_cache.ipynb #42765a60
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
