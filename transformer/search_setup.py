# Generated from chapters/a08_translating.ipynb: edit it, not this file.
"""What a search sets up before it starts: its arguments checked, each
sentence's output length limit (Section 6.1), and inference mode."""

# %% auto #0
__all__ = [
    "sentence_output_limits",
    "check_search",
    "check_prefix",
    "inference",
]

# %% ../chapters/a08_translating.ipynb #50c85587

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from transformer.decode import output_limit
from transformer.model import Transformer


def sentence_output_limits(
    model: Transformer, src: Tensor, *, pad_id: int, max_len: int | None = None
) -> Tensor:
    """The most tokens each sentence may output, EOS included: (B, S) -> (B,).

    Each source's length (its non-padding tokens) + 50, as in the paper, or
    max_len if given; never more than the positions of the model's positional
    encoding (config.max_len).
    """
    lengths = (src != pad_id).sum(dim=1).tolist()
    positions = model.config.max_len
    limits = [output_limit(n, positions, max_len) for n in lengths]
    return torch.tensor(limits, device=src.device)  # (B,)


def check_search(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    prefix: Tensor | None = None,
) -> None:
    """Raise ValueError, in one line, for token ids that greedy decoding or
    beam search cannot use (the options were checked when they were made)."""
    if pad_id in (bos_id, eos_id):
        raise ValueError(
            f"pad_id ({pad_id}) must differ from bos_id ({bos_id}) and eos_id"
            f" ({eos_id}): an ended sentence is recognised by its padding"
        )
    if src.dim() != 2 or src.dtype != torch.long:
        raise ValueError(
            "src must be a (B, S) tensor of token ids (torch.long), got shape "
            f"{tuple(src.shape)} and {src.dtype}"
        )
    if src.size(1) == 0:
        raise ValueError(
            "src has no positions: encode each source with its <eos>"
        )
    empty = (src == pad_id).all(dim=1)  # (B,)
    if empty.any():
        raise ValueError(
            f"src row {int(empty.nonzero()[0])} is all padding: encode each"
            " source with its <eos>"
        )
    if prefix is not None:
        check_prefix(prefix, src, bos_id=bos_id, eos_id=eos_id)


def check_prefix(prefix: Tensor, src: Tensor, *, bos_id, eos_id) -> None:
    """A forced prefix is a (B, P) tensor of token ids, one row per source,
    without BOS or EOS (padding marks a position the search chooses)."""
    if prefix.dim() != 2 or prefix.dtype != torch.long:
        raise ValueError(
            "prefix must be a (B, P) tensor of token ids (torch.long), got"
            f" shape {tuple(prefix.shape)} and {prefix.dtype}"
        )
    if prefix.size(0) != src.size(0):
        raise ValueError(
            f"prefix has {prefix.size(0)} rows for {src.size(0)} sources"
        )
    if ((prefix == bos_id) | (prefix == eos_id)).any():
        raise ValueError(
            "prefix must not hold <bos> or <eos>: the search adds them"
        )


@contextmanager
def inference(model: Transformer) -> Iterator[None]:
    """No gradients and no dropout; the model's training mode is restored
    afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)
