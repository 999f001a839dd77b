# Generated from chapters/03_multihead.ipynb: edit it, not this file.
"""Multi-head attention, Section 3.2.2 of Vaswani et al. (2017)."""

# %% auto #0
__all__ = [
    "split_heads",
    "merge_heads",
    "attend",
    "MultiHeadAttention",
    "project",
]

# %% ../chapters/03_multihead.ipynb #64dfa3a3

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.attention import scaled_dot_product_attention
from transformer.attention_config import AttentionConfig


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, L, d_model) -> (B, H, L, d_k): head i is columns i·d_k onwards."""
    return x.unflatten(-1, (n_heads, -1)).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, L, d_k) -> (B, L, H·d_k): Concat(head_1, ..., head_H)."""
    return x.transpose(1, 2).flatten(2)


# %% ../chapters/03_multihead.ipynb #35608c03
def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout: nn.Dropout,
    need_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """Every head at once, (B, H, T_q, d_k) -> (B, H, T_q, d_k), and the
    weights (B, H, T_q, T_k) if need_weights."""
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got {mask.dtype}"
        )
    if need_weights:
        return scaled_dot_product_attention(q, k, v, mask, dropout)
    p = dropout.p if dropout.training else 0.0
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p), None
    # Some kernels make a row of -inf scores NaN, and one NaN reaches every
    # parameter in the backward pass: such a row sees every key, then zeros.
    blind = ~mask.any(dim=-1, keepdim=True)  # (B, 1 or H, T_q, 1)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask | blind, dropout_p=p
    )
    return out.masked_fill(blind, 0.0), None


# %% ../chapters/03_multihead.ipynb #8bdc30c8
class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O (Section 3.2.2)."""

    def __init__(self, config: AttentionConfig, bias: bool = True) -> None:
        super().__init__()
        d_model = config.d_model
        self.d_model, self.n_heads, self.d_k = (
            d_model,
            config.n_heads,
            config.d_k,
        )
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        # on the weights
        self.attn_dropout = nn.Dropout(config.attention_dropout)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the queries over the keys and values, all heads.

        Shapes:
            query: (B, T_q, d_model); key, value: (B, T_k, d_model)
            mask: boolean (True: may attend), broadcastable to (B, H, T_q, T_k)
            returns (B, T_q, d_model) and the weights (B, H, T_q, T_k) or None
        """
        q = split_heads(self.w_q(query), self.n_heads)  # (B, H, T_q, d_k)
        k = split_heads(self.w_k(key), self.n_heads)  # (B, H, T_k, d_k)
        v = split_heads(self.w_v(value), self.n_heads)  # (B, H, T_k, d_k)
        out, weights = attend(q, k, v, mask, self.attn_dropout, need_weights)
        return self.w_o(merge_heads(out)), weights  # (B, T_q, d_model)


# %% ../chapters/03_multihead.ipynb #a3aaf329
def project(x: Tensor, n_heads: int, *layers: nn.Linear) -> list[Tensor]:
    """x (B, L, d_model) through each layer, in heads (B, H, L, d_k)."""
    return [split_heads(layer(x), n_heads) for layer in layers]
