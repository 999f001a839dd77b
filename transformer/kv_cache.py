# Generated from chapters/14_decoding.ipynb: edit it, not this file.
"""The key/value cache of incremental decoding: each decoder layer's keys and
values, kept between steps, so that a step runs on its newest token only."""

# %% auto #0
__all__ = ["KVCache", "DecoderCache", "cached_attention", "decode_step"]

# %% ../chapters/14_decoding.ipynb #4c82686c

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from transformer.model import Transformer
from transformer.multihead import (
    MultiHeadAttention,
    attend,
    merge_heads,
    project,
)


@dataclass
class KVCache:
    """One attention block's keys and values, (N, H, L, d_k) each."""

    key: Tensor | None = None
    value: Tensor | None = None


@dataclass
class DecoderCache:
    """Every decoder layer's caches: each self-attention's grows by one
    position per step; each encoder-decoder attention's holds the memory's."""

    self_attn: list[KVCache]
    cross_attn: list[KVCache]

    @classmethod
    def empty(cls, n_layers: int) -> "DecoderCache":
        """The cache of an n_layers decoder before the first step."""
        self_attn = [KVCache() for _ in range(n_layers)]
        return cls(self_attn, [KVCache() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """The number of target positions decoded so far."""
        key = self.self_attn[0].key
        return 0 if key is None else key.size(2)

    def reorder(self, rows: Tensor, *, memory: bool = True) -> None:
        """Keep rows `rows` (N',), in that order. memory=False leaves the
        encoder-decoder caches alone, when rows only move among the outputs of
        one sentence, whose memory is the same."""
        for kv in self.self_attn + (self.cross_attn if memory else []):
            if kv.key is not None:
                kv.key, kv.value = kv.key[rows], kv.value[rows]


# %% ../chapters/14_decoding.ipynb #33c1c23b
def cached_attention(
    attn: MultiHeadAttention,
    x: Tensor,
    *,
    cache: KVCache,
    memory: Tensor | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """MultiHead for the newest position x (N, 1, d_model): self-attention
    over the cached positions and x's own, or, given the memory (N, S,
    d_model), encoder-decoder attention over its keys and values."""
    n = attn.n_heads
    if memory is None:  # the new position's key and value join the cache
        q, k, v = project(x, n, attn.w_q, attn.w_k, attn.w_v)  # (N, H, 1, d_k)
        if cache.key is not None:
            k = torch.cat([cache.key, k], dim=2)  # (N, H, L + 1, d_k)
            v = torch.cat([cache.value, v], dim=2)
        cache.key, cache.value = k, v
    else:  # the memory's keys and values, projected at the first step
        (q,) = project(x, n, attn.w_q)
        if cache.key is None:
            cache.key, cache.value = project(memory, n, attn.w_k, attn.w_v)
    out, _ = attend(q, cache.key, cache.value, mask, attn.attn_dropout, False)
    return attn.w_o(merge_heads(out))  # (N, 1, d_model)


def decode_step(
    model: Transformer,
    token: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    cache: DecoderCache,
) -> Tensor:
    """log p(next token) for every row, given its newest token (N, 1), the
    earlier ones' keys and values in the cache: -> (N, V)."""
    x = model.tgt_embed(token)  # (N, 1, d_model), at position cache.length:
    x = model.tgt_pos(x, start=cache.length)
    caches = zip(cache.self_attn, cache.cross_attn, strict=True)
    for layer, (own, cross) in zip(model.decoder.layers, caches, strict=True):
        self_attention = partial(cached_attention, layer.self_attn, cache=own)
        cross_attention = partial(
            cached_attention, layer.cross_attn, cache=cross, memory=memory,
            mask=src_mask,
        )  # fmt: skip
        x = layer.sublayers[0](x, self_attention)
        x = layer.sublayers[1](x, cross_attention)
        x = layer.sublayers[2](x, layer.feed_forward)
    return model.generator(model.decoder.final_norm(x)[:, -1])  # (N, V)
