# Generated from chapters/08_model.ipynb: edit it, not this file.
"""The model's hyperparameters: a frozen, validated dataclass (Table 3)."""

# %% auto #0
__all__ = ["TransformerConfig"]

# %% ../chapters/08_model.ipynb #388ebca3

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer, by default the
    paper's base model; tgt_vocab_size=None: one vocabulary for both sides."""

    src_vocab_size: int
    tgt_vocab_size: int | None = None
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    ffn_dropout: float = 0.0
    max_len: int = 512
    norm_first: bool = False
    positional: str = "sinusoidal"
    share_embeddings: bool = True
    tie_output: bool = True

    def __post_init__(self) -> None:
        # d_k = d_model / h (3.2.2): the heads split the width between them.
        heads, width = self.n_heads, self.d_model
        sizes = all(type(n) is int and n > 0 for n in (heads, width))
        if sizes and width % heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads"
                f" ({self.n_heads}): each head works in d_model / n_heads"
                " dimensions"
            )

    @property
    def target_vocab_size(self) -> int:
        """V of the output layer: the target vocabulary, or the shared one."""
        if self.tgt_vocab_size is None:
            return self.src_vocab_size
        return self.tgt_vocab_size

    @property
    def d_k(self) -> int:
        """Width of one head's queries, keys and values."""
        return self.d_model // self.n_heads

    @classmethod
    def base(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's base model (Table 3)."""
        return cls(src_vocab_size=vocab_size, **overrides)

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's big model (Table 3)."""
        fields = dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    @classmethod
    def small(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """A starting point for Multi30k (the training chapter tunes it)."""
        fields = dict(n_layers=3, d_model=256, n_heads=8, d_ff=1024)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary (for checkpoints)."""
        return dataclasses.asdict(self)
