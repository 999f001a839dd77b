# Generated from chapters/03_multihead.ipynb: edit it, not this file.
"""Multi-head attention, Section 3.2.2 of Vaswani et al. (2017)."""

# %% auto #0
__all__ = ["KVCache", "MultiHeadAttention"]

# %% ../chapters/03_multihead.ipynb #13bfa596

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.attention import scaled_dot_product_attention


@dataclass
class KVCache:
    """One attention layer's keys and values, split into heads, kept between
    decoding steps.

    A self-attention cache (static=False) appends the new positions' keys and
    values at each call; a static one (encoder-decoder attention) projects the
    memory at its first call and reuses the result. MultiHeadAttention.forward
    updates it in place.

    Shapes:
        key, value: (B, H, L, d_k), None before the first call
    """

    key: Tensor | None = None
    value: Tensor | None = None
    static: bool = False

    @property
    def length(self) -> int:
        """L, the number of positions held."""
        return 0 if self.key is None else self.key.size(2)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), in that order: beam search following
        its beams."""
        if self.key is not None:
            self.key = self.key.index_select(0, index)  # (B', H, L, d_k)
            self.value = self.value.index_select(0, index)  # (B', H, L, d_k)


class MultiHeadAttention(nn.Module):
    """Concat(head_1, ..., head_H) W^O, with head_i = Attention(Q W_i^Q, K
    W_i^K, V W_i^V)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be a multiple of n_heads"
                f" ({n_heads})"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        # The H per-head projections W_i^Q (d_model x d_k) side by side: one
        # d_model x d_model.
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        # Dropout on the attention weights; 0 in the paper, which never drops
        # them.
        self.attn_dropout = nn.Dropout(dropout)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_k).transpose(
            1, 2
        )  # (B, H, L, d_k)

    def _merge_heads(self, x: Tensor) -> Tensor:
        B, _, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, self.d_model)  # (B, L, d_model)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of every head at once: (B, H, T_q, d_k) -> (B, H, T_q,
        d_k)."""
        if need_weights:
            return scaled_dot_product_attention(
                q, k, v, mask=mask, dropout=self.attn_dropout
            )
        if mask is None:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=self.attn_dropout.p if self.training else 0.0,
            )
            return out, None
        # A query that may see no key is a row of -inf scores: what a kernel
        # makes of it differs between kernels and versions (NaN in some), and a
        # NaN in one row reaches every parameter in the backward pass. Let such
        # rows see every key, then zero them.
        blind = ~mask.any(dim=-1, keepdim=True)  # (B, 1 or H, T_q, 1)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask | blind,
            dropout_p=self.attn_dropout.p if self.training else 0.0,
        )
        return out.masked_fill(blind, 0.0), None

    def _project(self, x: Tensor, *layers: nn.Linear) -> list[Tensor]:
        """x through one or more of the projections, each result split into
        heads.

        Projections of the same x are one matrix product by their weights
        stacked, as PyTorch's nn.MultiheadAttention computes them: the same
        products, fewer and larger.
        """
        if len(layers) == 1 or not all(
            isinstance(p.weight, Tensor) for p in layers
        ):
            # one layer, or layers whose weights are not tensors (quantised):
            # one by one
            return [self._split_heads(layer(x)) for layer in layers]
        weight = torch.cat(
            [layer.weight for layer in layers]
        )  # (n·d_model, d_model)
        biases = [layer.bias for layer in layers]
        bias = None if biases[0] is None else torch.cat(biases)  # (n·d_model,)
        out = F.linear(x, weight, bias)  # (B, L, n·d_model)
        return [
            self._split_heads(part) for part in out.chunk(len(layers), dim=-1)
        ]

    def _keys_values(
        self, key: Tensor, value: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """Project and split the keys and values, through the cache if there is
        one."""
        if cache is not None and cache.static and cache.key is not None:
            return (
                cache.key,
                cache.value,
            )  # the memory's, projected at the first step
        if key is value:  # the encoder's memory, in encoder-decoder attention
            k, v = self._project(
                key, self.w_k, self.w_v
            )  # (B, H, T_k, d_k) each
        else:
            (k,), (v,) = (
                self._project(key, self.w_k),
                self._project(value, self.w_v),
            )
        return self._cached(k, v, cache)

    @staticmethod
    def _cached(
        k: Tensor, v: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """The keys and values to attend over: with a self-attention cache, the
        new positions after the ones already decoded (dim 2: positions)."""
        if cache is not None:
            if not cache.static and cache.key is not None:
                k = torch.cat([cache.key, k], dim=2)  # (B, H, L + T_k, d_k)
                v = torch.cat([cache.value, v], dim=2)  # (B, H, L + T_k, d_k)
            cache.key, cache.value = k, v
        return k, v

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        *,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Multi-head attention of the queries over the keys and values.

        Shapes:
            query: (B, T_q, d_model); key, value: (B, T_k, d_model)
            mask: boolean, broadcastable to (B, H, T_q, T_k); True means "may
                attend"
            returns output (B, T_q, d_model) and, if need_weights, the weights
            (B, H, T_q, T_k), else None

        A query whose keys are all masked gets a zero attention output (before
        W^O). With a cache, key and value are the new positions only (or, for a
        static cache, the memory, read at the first call only); the keys are
        then all L positions cached, and the mask, if any, is broadcastable to
        (B, H, T_q, L).
        """
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(
                f"mask must be boolean (True = may attend), got {mask.dtype}"
            )
        if (
            query is key and key is value
        ):  # self-attention: Q, K and V in one product
            q, k, v = self._project(query, self.w_q, self.w_k, self.w_v)
            k, v = self._cached(k, v, cache)  # (B, H, T_k or L, d_k)
        else:
            (q,) = self._project(query, self.w_q)  # (B, H, T_q, d_k)
            k, v = self._keys_values(
                key, value, cache
            )  # (B, H, T_k or L, d_k)
        out, weights = self._attend(q, k, v, mask, need_weights)
        return self.w_o(self._merge_heads(out)), weights  # (B, T_q, d_model)
