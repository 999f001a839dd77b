# Generated from chapters/05_sublayers.ipynb: edit it, not this file.
"""The sizes and options of one encoder or decoder layer (Sections 3.1, 3.3,
5.4): attention's, and those of its other sublayers."""

# %% auto #0
__all__ = [
    "PAPER_D_FF",
    "PAPER_DROPOUT",
    "TENSOR2TENSOR_LAYER_NORM_EPS",
    "LayerConfig",
]

# %% ../chapters/05_sublayers.ipynb #0143ffef

from dataclasses import dataclass

from transformer.attention_config import AttentionConfig

# The paper's base model (Table 3; Sections 3.3 and 5.4): d_ff = 2048, and
# P_drop = 0.1 on the output of each sublayer.
PAPER_D_FF = 2048
PAPER_DROPOUT = 0.1
# LayerNorm's ε, which the paper does not state: its reference code's.
TENSOR2TENSOR_LAYER_NORM_EPS = 1e-6


@dataclass(frozen=True, kw_only=True)
class LayerConfig(AttentionConfig):
    """An AttentionConfig, the feed-forward network's inner width, dropout on
    each sublayer's output, the normalisation's order and LayerNorm's ε."""

    d_ff: int = PAPER_D_FF
    dropout: float = PAPER_DROPOUT
    ffn_dropout: float = 0.0  # on the hidden units: not in the paper
    norm_first: bool = False  # pre-norm: not in the paper
    layer_norm_eps: float = TENSOR2TENSOR_LAYER_NORM_EPS
