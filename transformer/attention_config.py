# Generated from chapters/03_multihead.ipynb: edit it, not this file.
"""The sizes of multi-head attention (Section 3.2.2), by default those of the
paper's base model."""

# %% auto #0
__all__ = ["PAPER_D_MODEL", "PAPER_N_HEADS", "AttentionConfig"]

# %% ../chapters/03_multihead.ipynb #c7b4657e

from dataclasses import dataclass

# The paper's base model (Table 3): d_model = 512, split into h = 8 heads.
PAPER_D_MODEL = 512
PAPER_N_HEADS = 8


@dataclass(frozen=True, kw_only=True)
class AttentionConfig:
    """The width, the heads, and dropout on the attention weights (not in the
    paper: 0, off)."""

    d_model: int = PAPER_D_MODEL
    n_heads: int = PAPER_N_HEADS
    attention_dropout: float = 0.0

    def __post_init__(self) -> None:
        # d_k = d_model / h (3.2.2): the heads split the width between them.
        for name in ("d_model", "n_heads"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:  # True is not a size
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}"
                )
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads"
                f" ({self.n_heads}): each head works in d_model / n_heads"
                " dimensions"
            )

    @property
    def d_k(self) -> int:
        """Width of one head's queries, keys and values."""
        return self.d_model // self.n_heads
