# Generated from chapters/02_masking.ipynb: edit it, not this file.
"""Attention masks: boolean, True means "may attend", broadcastable to (B, H,
T_q, T_k)."""

# %% auto #0
__all__ = ["padding_mask", "causal_mask", "target_mask"]

# %% ../chapters/02_masking.ipynb #7362c756

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: (B, S) token ids -> (B, 1, 1, S), False at
    padding."""
    if ids.dim() != 2:
        raise ValueError(
            f"ids must be (B, S) token ids, got shape {tuple(ids.shape)}"
        )
    # One row shared by every head and every query: padding hides keys, not
    # queries.
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """Position t may attend to positions <= t: (1, 1, T, T), lower triangle
    and diagonal."""
    ones = torch.ones(size, size, dtype=torch.bool, device=device)
    return ones.tril()[None, None]  # (1, 1, T, T)


def target_mask(ids: Tensor, pad_id: int) -> Tensor:
    """The decoder's self-attention mask: (B, T) ids -> (B, 1, T, T), causal
    and not padding."""
    return padding_mask(ids, pad_id) & causal_mask(
        ids.size(-1), device=ids.device
    )
