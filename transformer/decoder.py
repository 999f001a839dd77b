# Generated from chapters/07_decoder.ipynb: edit it, not this file.
"""The decoder: a stack of identical layers with masked self-attention and
attention over the encoder's output, Section 3.1 and Figure 1 (right) of
Vaswani et al. (2017)."""

# %% auto #0
__all__ = ["DecoderLayer", "DecoderCache", "Decoder"]

# %% ../chapters/07_decoder.ipynb #84b15afc

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer.multihead import KVCache, MultiHeadAttention
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention and a feed-forward
    network (3.1)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=attention_dropout
        )
        self.cross_attn = MultiHeadAttention(
            d_model, n_heads, dropout=attention_dropout
        )
        self.feed_forward = PositionwiseFeedForward(
            d_model, d_ff, dropout=ffn_dropout
        )
        self.sublayers = nn.ModuleList(
            SublayerConnection(d_model, dropout=dropout, norm_first=norm_first)
            for _ in range(3)
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """One decoder layer; the self- and cross-attention weights only when
        asked for.

        Shapes:
            x: (B, T, d_model), the target so far; memory: (B, S, d_model), the
                encoder's output
            src_mask: boolean (B, 1, 1, S), True at real source tokens
                (padding_mask)
            tgt_mask: boolean (B, 1, T, T), causal and not padding
                (target_mask)
            returns (B, T, d_model) and, if need_weights, (self weights (B, H,
                T, T),
            cross weights (B, H, T, S)), else None

        With caches (the decoding chapter), x holds only the new positions, and
        tgt_mask, if any, covers all L cached positions: (B, 1, T, L).
        """
        self_weights = cross_weights = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal self_weights
            out, self_weights = self.self_attn(
                h,
                h,
                h,
                mask=tgt_mask,
                need_weights=need_weights,
                cache=self_cache,
            )
            return out

        def cross_attention(h: Tensor) -> Tensor:
            # Queries from the decoder, keys and values from the encoder's
            # memory (3.2.3).
            nonlocal cross_weights
            out, cross_weights = self.cross_attn(
                h,
                memory,
                memory,
                mask=src_mask,
                need_weights=need_weights,
                cache=cross_cache,
            )
            return out

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, cross_attention)
        x = self.sublayers[2](x, self.feed_forward)
        return x, ((self_weights, cross_weights) if need_weights else None)


# %% ../chapters/07_decoder.ipynb #9dbf8ebf
@dataclass
class DecoderCache:
    """Each decoder layer's keys and values, kept between decoding steps.

    self_attn[i] grows by one position per step; cross_attn[i] is static: the
    memory's keys and values, projected at the first step.
    """

    self_attn: list[KVCache]
    cross_attn: list[KVCache]

    @classmethod
    def empty(cls, n_layers: int) -> "DecoderCache":
        """The cache of an n_layers stack before the first step."""
        return cls(
            self_attn=[KVCache() for _ in range(n_layers)],
            cross_attn=[KVCache(static=True) for _ in range(n_layers)],
        )

    @property
    def length(self) -> int:
        """The number of target positions decoded so far."""
        return self.self_attn[0].length

    def reorder(self, index: Tensor, *, static: bool = True) -> None:
        """Keep batch rows `index` (B',), in that order: beam search following
        its beams.

        static=False leaves the encoder-decoder caches alone: when `index` only
        moves rows among the beams of each sentence, whose memory is the same,
        they would not change.
        """
        for cache in self.self_attn + (self.cross_attn if static else []):
            cache.reorder(index)


class Decoder(nn.Module):
    """N identical decoder layers, each attending to the same encoder memory
    (Section 3.1)."""

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(
                d_model,
                n_heads,
                d_ff,
                dropout=dropout,
                attention_dropout=attention_dropout,
                ffn_dropout=ffn_dropout,
                norm_first=norm_first,
            )
            for _ in range(n_layers)
        )
        # Post-norm layers end normalised; a pre-norm residual stream needs a
        # last LayerNorm.
        self.final_norm = (
            nn.LayerNorm(d_model, eps=1e-6) if norm_first else nn.Identity()
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]] | None]:
        """Run the stack; with need_weights, also each layer's (self, cross)
        weights.

        Shapes:
            x: (B, T, d_model), the embedded target; memory: (B, S, d_model)
            src_mask: boolean (B, 1, 1, S); tgt_mask: boolean (B, 1, T, T)
            returns (B, T, d_model) and, if need_weights, a list of n_layers
                pairs
            (self weights (B, H, T, T), cross weights (B, H, T, S)), else None

        With a cache (the decoding chapter), x holds only the new positions,
        and tgt_mask, if any, covers all L cached positions: (B, 1, T, L).
        """
        all_weights = [] if need_weights else None
        for i, layer in enumerate(self.layers):
            x, weights = layer(
                x,
                memory,
                src_mask=src_mask,
                tgt_mask=tgt_mask,
                need_weights=need_weights,
                self_cache=cache.self_attn[i] if cache is not None else None,
                cross_cache=cache.cross_attn[i] if cache is not None else None,
            )
            if need_weights:
                all_weights.append(weights)
        return self.final_norm(x), all_weights
