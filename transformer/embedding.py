# Generated from chapters/04_embeddings.ipynb: edit it, not this file.
"""Token embeddings and positional encodings, Sections 3.4 and 3.5 of Vaswani
et al. (2017)."""

# %% auto #0
__all__ = [
    "TokenEmbedding",
    "sinusoidal_encoding",
    "PositionalEncoding",
    "LearnedPositionalEncoding",
]

# %% ../chapters/04_embeddings.ipynb #b90d6e2a

import math

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    """Token ids to vectors of width d_model, multiplied by √d_model (3.4)."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        # Small entries suit the table's second use, as the tied output
        # weights; the √d_model factor brings the embeddings to unit scale.
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, ids: Tensor) -> Tensor:
        """Look up each token's row and scale it by √d_model.

        Shapes:
            ids: (B, L) integer token ids; returns (B, L, d_model)
        """
        return self.embedding(ids) * math.sqrt(self.d_model)


# %% ../chapters/04_embeddings.ipynb #b7ffe0b5
def sinusoidal_encoding(
    max_len: int, d_model: int, *, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The table of Section 3.5, (max_len, d_model): PE(pos, 2i) =
    sin(pos·ω_i), PE(pos, 2i+1) = cos(pos·ω_i), ω_i = 1/10000^(2i/d_model)."""
    if d_model % 2 != 0:
        raise ValueError(
            f"d_model must be even (sine/cosine pairs), got d_model={d_model}"
        )
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    frequency = torch.exp(-math.log(10000.0) * two_i / d_model)  # ω_i
    angle = pos * frequency  # (max_len, d_model/2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2], pe[:, 1::2] = torch.sin(angle), torch.cos(angle)
    return pe.to(dtype)


# %% ../chapters/04_embeddings.ipynb #7e332cd8
def _check_positions(start: int, length: int, max_len: int) -> None:
    if start < 0:
        raise ValueError(f"start must be >= 0, got start={start}")
    if start + length > max_len:
        raise ValueError(
            f"positions {start}..{start + length - 1} (start={start}, length"
            f" {length}) exceed max_len={max_len}; build the positional"
            " encoding with a larger max_len"
        )


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table to the embeddings, then dropout (3.5, 5.4)."""

    def __init__(self, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # Not persistent: a fixed function of (max_len, d_model), not a weight.
        pe = sinusoidal_encoding(max_len, d_model)
        self.register_buffer("pe", pe, persistent=False)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x + PE[start : start + L], then dropout; start > 0 serves
        incremental decoding.

        Shapes:
            x: (B, L, d_model); returns (B, L, d_model)
        """
        length = x.size(1)
        _check_positions(start, length, self.max_len)
        return self.dropout(x + self.pe[start : start + length])  # broadcasts


# %% ../chapters/04_embeddings.ipynb #a20b1298
class LearnedPositionalEncoding(nn.Module):
    """A learned vector per position, not the sinusoids (Table 3, row E)."""

    def __init__(self, d_model: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # nn.Embedding's N(0, 1) start: the scale of the scaled embeddings.
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x + E[start : start + L], then dropout.

        Shapes:
            x: (B, L, d_model); returns (B, L, d_model)
        """
        length = x.size(1)
        _check_positions(start, length, self.max_len)
        return self.dropout(x + self.embedding.weight[start : start + length])
