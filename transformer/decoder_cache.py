# Generated from chapters/a02_model_engineering.ipynb: edit it, not this file.
"""The keys and values of every decoder layer, kept between decoding steps."""

# %% auto #0
__all__ = ["DecoderCache"]

# %% ../chapters/a02_model_engineering.ipynb #60d3c1f7

from dataclasses import dataclass

from torch import Tensor

from transformer.multihead import KVCache


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
