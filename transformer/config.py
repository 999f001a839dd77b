# Generated from chapters/08_model.ipynb: edit it, not this file.
"""The model's hyperparameters: a frozen, validated dataclass (Table 3)."""

# %% auto #0
__all__ = ["PAPER_N_LAYERS", "PAPER_BASE", "PAPER_BIG", "TransformerConfig"]

# %% ../chapters/08_model.ipynb #388ebca3

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformer.attention_config import PAPER_D_MODEL, PAPER_N_HEADS
from transformer.layer_config import PAPER_D_FF, PAPER_DROPOUT, LayerConfig

# The paper's stacks: N = 6 identical layers each (Section 3.1, Table 3).
PAPER_N_LAYERS = 6
# Table 3's base and big models: N, d_model, h, d_ff and P_drop.
PAPER_BASE = dict(
    n_layers=PAPER_N_LAYERS,
    d_model=PAPER_D_MODEL,
    n_heads=PAPER_N_HEADS,
    d_ff=PAPER_D_FF,
    dropout=PAPER_DROPOUT,
)
PAPER_BIG = PAPER_BASE | dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)


@dataclass(frozen=True)
class TransformerConfig(LayerConfig):
    """Hyperparameters of the encoder-decoder Transformer: a LayerConfig, the
    vocabularies, N layers per stack, the positions and the shared weights;
    tgt_vocab_size=None: one vocabulary for both sides."""

    src_vocab_size: int
    tgt_vocab_size: int | None = None
    n_layers: int = PAPER_N_LAYERS
    max_len: int = 512
    positional: str = "sinusoidal"
    share_embeddings: bool = True
    tie_output: bool = True

    @property
    def target_vocab_size(self) -> int:
        """V of the output layer: the target vocabulary, or the shared one."""
        if self.tgt_vocab_size is None:
            return self.src_vocab_size
        return self.tgt_vocab_size

    @classmethod
    def base(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's base model (Table 3)."""
        return cls(src_vocab_size=vocab_size, **(PAPER_BASE | overrides))

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's big model (Table 3)."""
        return cls(src_vocab_size=vocab_size, **(PAPER_BIG | overrides))

    @classmethod
    def small(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """A starting point for Multi30k (the training chapter tunes it)."""
        fields = dict(n_layers=3, d_model=256, n_heads=8, d_ff=1024)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary (for checkpoints)."""
        return dataclasses.asdict(self)
