# Generated from chapters/06_encoder.ipynb: edit it, not this file.
"""The encoder of Vaswani et al. (2017): Section 3.1, Figure 1 (left)."""

# %% auto #0
__all__ = ["EncoderLayer", "Encoder"]

# %% ../chapters/06_encoder.ipynb #9940d5ad

from torch import Tensor, nn

from transformer.multihead import MultiHeadAttention
from transformer.sublayers import (
    LAYER_NORM_EPS,
    PositionwiseFeedForward,
    SublayerConnection,
)


class EncoderLayer(nn.Module):
    """Self-attention and a feed-forward network in sublayer connections."""

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=attention_dropout
        )
        self.feed_forward = PositionwiseFeedForward(
            d_model, d_ff, dropout=ffn_dropout
        )
        self.sublayers = nn.ModuleList(
            SublayerConnection(d_model, dropout=dropout, norm_first=norm_first)
            for _ in range(2)
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

    def __init__(
        self,
        *,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        layer = dict(
            d_model=d_model, n_heads=n_heads, d_ff=d_ff, dropout=dropout
        )
        layer |= dict(
            attention_dropout=attention_dropout, ffn_dropout=ffn_dropout
        )
        layer |= dict(norm_first=norm_first)
        self.layers = nn.ModuleList(
            EncoderLayer(**layer) for _ in range(n_layers)
        )
        # Post-norm layers end normalised; a pre-norm stream needs a LayerNorm.
        self.final_norm = (
            nn.LayerNorm(d_model, eps=LAYER_NORM_EPS)
            if norm_first
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
