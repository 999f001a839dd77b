# Generated from chapters/01_attention.ipynb: edit it, not this file.
"""Scaled dot-product attention, equation (1) of Vaswani et al. (2017)."""

# %% auto #0
__all__ = ["scaled_dot_product_attention"]

# %% ../chapters/01_attention.ipynb #249241a4

import math
from collections.abc import Callable

from torch import Tensor


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(QKᵀ/√d_k)·V, returning the output and the attention weights.

    Shapes:
        query: (..., T_q, d_k); key: (..., T_k, d_k); value: (..., T_k, d_v)
        mask: boolean (True: may attend), broadcastable to (..., T_q, T_k)
        returns output (..., T_q, d_v) and weights (..., T_q, T_k)
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a row of -inf is 0/0 = NaN: such a query sees none
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # (..., T_q, d_v), (..., T_q, T_k)
