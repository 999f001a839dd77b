# Generated from chapters/06_encoder.ipynb: edit it, not this file.
"""The encoder of Vaswani et al. (2017): Section 3.1, Figure 1 (left)."""

# %% auto #0
__all__ = ["EncoderLayer", "Encoder"]

# %% ../chapters/06_encoder.ipynb #9940d5ad

from torch import Tensor, nn

from transformer.layer_config import LayerConfig
from transformer.multihead import MultiHeadAttention
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection


class EncoderLayer(nn.Module):
    """Self-attention and a feed-forward network in sublayer connections."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.feed_forward = PositionwiseFeedForward(config)
        self.sublayers = nn.ModuleList(
            SublayerConnection(config) for _ in range(2)
        )

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Shapes: x (B, S, d_model), and so the result; src_mask boolean
        (B, 1, 1, S) (padding_mask); weights, if asked for, (B, H, S, S)."""
        weights = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(
                h, h, h, mask=src_mask, need_weights=need_weights
            )
            return out

        x = self.sublayers[0](x, self_attention)
        return self.sublayers[1](x, self.feed_forward), weights


# %% ../chapters/06_encoder.ipynb #0b364482
class Encoder(nn.Module):
    """N identical encoder layers, each with its own weights (Section 3.1)."""

    def __init__(self, config: LayerConfig, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(config) for _ in range(n_layers)
        )
        # Post-norm layers end normalised; a pre-norm stream needs a LayerNorm.
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.norm_first
            else nn.Identity()
        )

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Shapes: x (B, S, d_model), and so the memory; src_mask (B, 1, 1, S);
        weights, if asked for, n_layers x (B, H, S, S)."""
        all_weights = [] if need_weights else None
        for layer in self.layers:
            x, weights = layer(x, src_mask, need_weights=need_weights)
            if need_weights:
                all_weights.append(weights)
        return self.final_norm(x), all_weights
