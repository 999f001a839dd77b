# Generated from chapters/07_decoder.ipynb: edit it, not this file.
"""The decoder of Vaswani et al. (2017): Section 3.1, Figure 1 (right)."""

# %% auto #0
__all__ = ["DecoderLayer", "Decoder"]

# %% ../chapters/07_decoder.ipynb #84b15afc

from torch import Tensor, nn

from transformer.layer_config import LayerConfig
from transformer.multihead import MultiHeadAttention
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection


# %% ../chapters/07_decoder.ipynb #c20cf228
class DecoderLayer(nn.Module):
    """Self-attention, encoder-decoder attention and a feed-forward network."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.cross_attn = MultiHeadAttention(config)
        self.feed_forward = PositionwiseFeedForward(config)
        self.sublayers = nn.ModuleList(
            SublayerConnection(config) for _ in range(3)
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Shapes: x (B, T, d_model), and so the result; memory (B, S,
        d_model); src_mask (B, 1, 1, S); tgt_mask (B, 1, T, T); weights
        (B, H, T, T) and (B, H, T, S)."""
        self_w = cross_w = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal self_w
            out, self_w = self.self_attn(h, h, h, tgt_mask, need_weights)
            return out

        def cross_attention(h: Tensor) -> Tensor:
            nonlocal cross_w
            out, cross_w = self.cross_attn(
                h, memory, memory, src_mask, need_weights
            )
            return out

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, cross_attention)
        x = self.sublayers[2](x, self.feed_forward)
        return x, ((self_w, cross_w) if need_weights else None)


# %% ../chapters/07_decoder.ipynb #64004702
class Decoder(nn.Module):
    """N decoder layers, each attending to the same memory (Section 3.1)."""

    def __init__(self, config: LayerConfig, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(config) for _ in range(n_layers)
        )
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.norm_first
            else nn.Identity()
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]] | None]:
        """Shapes as DecoderLayer's; weights, if asked for, one (self, cross)
        pair per layer."""
        all_weights = []
        for layer in self.layers:
            x, weights = layer(
                x,
                memory,
                src_mask=src_mask,
                tgt_mask=tgt_mask,
                need_weights=need_weights,
            )
            all_weights.append(weights)
        return self.final_norm(x), (all_weights if need_weights else None)
