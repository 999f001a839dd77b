# Generated from chapters/10_data.ipynb: edit it, not this file.
"""Batches for the model: sentence pairs padded, with <bos> and <eos>, and
grouped by length."""

# %% auto #0
__all__ = ["MAX_TOKENS", "Batch", "collate", "token_batches"]

# %% ../chapters/10_data.ipynb #9df9febd

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class Batch:
    """A padded batch of sentence pairs, ready for the model.

    Shapes:
        src: (B, S) x_1 … x_m <eos>, then pad_id: the encoder's input
        tgt_in: (B, T) <bos> y_1 … y_n, then pad_id: the decoder's input
        tgt_out: (B, T) y_1 … y_n <eos>, then pad_id: the decoder's targets
        index: (B,) the line of each pair in its split
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    index: Tensor
    n_src_tokens: int  # non-pad tokens in src
    n_tgt_tokens: int  # non-pad tokens in tgt_out: what the loss averages

    def to(self, device: torch.device | str, non_blocking=False) -> "Batch":
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
) -> Batch:
    """Pad (source ids, target ids) pairs, given without special tokens, into a
    Batch; `index` gives each pair's line in its split (default 0 … B-1)."""
    index = range(len(examples)) if index is None else index
    src_len = np.array([len(x) + 1 for x, _ in examples])  # + <eos>
    tgt_len = np.array([len(y) + 1 for _, y in examples])  # + <bos> or <eos>
    B, S, T = len(examples), int(src_len.max()), int(tgt_len.max())
    src = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in, tgt_out = np.full((2, B, T), pad_id, dtype=np.int64)
    for row, (x, y) in enumerate(examples):
        m, n = len(x), len(y)
        src[row, :m], src[row, m] = x, eos_id
        tgt_in[row, 0], tgt_in[row, 1 : n + 1] = bos_id, y
        tgt_out[row, :n], tgt_out[row, n] = y, eos_id
    tensors = [torch.from_numpy(a) for a in (src, tgt_in, tgt_out)]
    index = torch.as_tensor(index, dtype=torch.long)
    return Batch(*tensors, index, int(src_len.sum()), int(tgt_len.sum()))


# %% ../chapters/10_data.ipynb #e547e987
MAX_TOKENS = 8_000  # padded tokens per batch, each side (the paper: ~25,000)


def token_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """The pair indices of each batch: pairs of similar length, at most
    `max_tokens` padded tokens a side (lengths with <eos>, or <bos>)."""
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    longest = np.maximum(src, tgt)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src)) if shuffle else np.arange(len(src))
    # by the longer side, then the total; lexsort is stable: ties stay random
    order = order[np.lexsort((src[order] + tgt[order], longest[order]))]
    batches, start, width = [], 0, 0
    for k, length in enumerate(longest[order].tolist()):
        width = max(width, length)
        if (k - start + 1) * width > max_tokens:  # B · max(S, T) too large
            batches.append(order[start:k])
            start, width = k, length
    if len(order):
        batches.append(order[start:])
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches
