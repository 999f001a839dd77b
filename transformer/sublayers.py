# Generated from chapters/05_sublayers.ipynb: edit it, not this file.
"""The position-wise feed-forward network (Section 3.3) and the residual
connection with layer normalisation around every sublayer (Sections 3.1, 5.4)
of Vaswani et al. (2017)."""

# %% auto #0
__all__ = ["PositionwiseFeedForward", "SublayerConnection"]

# %% ../chapters/05_sublayers.ipynb #653c7924

from collections.abc import Callable

import torch
from torch import Tensor, nn

from transformer.layer_config import LayerConfig


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two linear maps at every
    position (3.3)."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.w_1 = nn.Linear(config.d_model, config.d_ff)
        self.w_2 = nn.Linear(config.d_ff, config.d_model)
        # Dropout on the hidden units is not in the paper (0 = off).
        self.dropout = nn.Dropout(config.ffn_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x (..., d_model) -> (..., d_model), through (..., d_ff)."""
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))


# %% ../chapters/05_sublayers.ipynb #ec9fac66
class SublayerConnection(nn.Module):
    """Residual connection, dropout and layer normalisation around one
    sublayer: LayerNorm(x + Dropout(Sublayer(x))), the paper's post-norm, or
    with norm_first, pre-norm x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, sublayer: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """Shapes: x (B, L, d_model); sublayer and the result keep it."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))
