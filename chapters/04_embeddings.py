# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Embeddings and positional encoding
#
# Attention has no idea of order: equation (1) is a weighted sum over a *set*, so shuffling the
# keys and values together changes no query's answer. Yet *dog bites man* is not *man bites dog*.
# The paper {cite:p}`vaswani2017attention` handles this before the first layer: each token
# becomes a learned vector of width $d_\text{model}$ (Section 3.4), and a fixed vector that
# depends only on the token's position is added to it (Section 3.5).
#
# This chapter writes both as `transformer.embedding` and checks the properties that motivate
# the paper's sinusoids.

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)

# %% tags=["remove-cell"]
#| default_exp embedding

# %%
import math

import altair as alt
import pandas as pd
import torch

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## Token embeddings
#
# A vocabulary of $V$ tokens is a table $E \in \mathbb{R}^{V \times d_\text{model}}$, and token
# $t$ becomes its row $E_t$. Section 3.4: "In the embedding layers, we multiply those weights by
# $\sqrt{d_\text{model}}$." The same table is also the weight of the final layer that scores the
# vocabulary (weight tying, {cite:p}`press2017using`), so its entries start small, drawn from
# $\mathcal{N}(0, d_\text{model}^{-1})$ as in the reference code.

# %%
#| export
"""Token embeddings and positional encodings, Sections 3.4 and 3.5 of Vaswani
et al. (2017)."""

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


# %% [markdown]
# A repeated token gets the same vector wherever it stands: the problem the rest of the chapter
# solves.

# %%
from transformer.embedding import TokenEmbedding

embed = TokenEmbedding(vocab_size=100, d_model=16)
vectors = embed(torch.tensor([[5, 7, 5]]))  # (B, L, d_model) = (1, 3, 16)
assert torch.equal(vectors[0, 0], vectors[0, 2])  # token 5 twice: one vector
vectors.shape

# %% [markdown]
# ## The sinusoidal table
#
# Section 3.5 gives position $pos$ a vector $PE_{pos} \in \mathbb{R}^{d_\text{model}}$ whose
# dimensions come in pairs, a sine and a cosine of the same frequency:
#
# $$
# \begin{aligned}
# PE_{(pos,\,2i)} &= \sin\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right), \\
# PE_{(pos,\,2i+1)} &= \cos\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right),
# \qquad i = 0, \dots, d_\text{model}/2 - 1.
# \end{aligned}
# $$
#
# Write $\omega_i = 10000^{-2i/d_\text{model}}$ for the frequency of pair $i$. The wavelengths
# $2\pi / \omega_i$ "form a geometric progression from $2\pi$ to $10000 \cdot 2\pi$": like the
# hands of a clock, fast pairs turn every few positions, slow ones barely move over hundreds.


# %%
#| export
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


# %% [markdown]
# The table agrees with the formula evaluated with Python's `math` module, here at position 7,
# pair 3:

# %%
from transformer.embedding import sinusoidal_encoding

pe_small = sinusoidal_encoding(50, 16)  # (max_len, d_model)
angle = 7 / 10000 ** (2 * 3 / 16)  # pos / 10000^(2i/d_model)
assert math.isclose(pe_small[7, 6].item(), math.sin(angle), abs_tol=1e-7)
assert math.isclose(pe_small[7, 7].item(), math.cos(angle), abs_tol=1e-7)

# %% [markdown]
# The heatmap shows the table for $d_\text{model} = 64$ over 64 positions, red for $+1$ and blue
# for $-1$. The stripes widen from left to right: the first column, $\sin(pos)$, changes sign
# every three or four positions, while the last columns hardly change. No two rows are the same.

# %% tags=["hide-input"]
from transformer.plots import use_book_renderer

use_book_renderer()
table = sinusoidal_encoding(64, 64)  # (positions, d_model)
cells = pd.DataFrame(table.numpy().round(4)).rename_axis("position")
cells = cells.melt(ignore_index=False, var_name="dimension", value_name="PE")
ticks = alt.Axis(values=list(range(0, 64, 8)))
red_blue = alt.Scale(scheme="redblue", domain=[-1, 1], reverse=True)
title = "Sinusoidal positional encoding, d_model = 64"
alt.Chart(cells.reset_index(), title=title).mark_rect(tooltip=True).encode(
    x=alt.X("dimension:O", axis=ticks),
    y=alt.Y("position:O", axis=ticks),
    color=alt.Color("PE:Q", scale=red_blue),
).properties(width=448, height=320)

# %% [markdown]
# For the base model, $d_\text{model} = 512$, each wavelength is the previous one times
# $10000^{2/512}$, from $2\pi$ up to just short of $10000 \cdot 2\pi$:

# %%
d_model = 512
two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
wavelength = 2 * math.pi * 10000 ** (two_i / d_model)  # λ_i = 2π / ω_i
ratio = wavelength[1:] / wavelength[:-1]
assert torch.allclose(ratio, torch.full_like(ratio, 10000 ** (2 / d_model)))
assert wavelength[-1] < 10000 * 2 * math.pi  # one step short
print(
    f"wavelengths from {wavelength[0]:.2f} to {wavelength[-1]:,.0f}",
    f"positions, each {ratio[0]:.4f} times the one before",
)

# %% [markdown]
# ## A fixed offset is a fixed linear map
#
# The paper chose the sinusoids because "for any fixed offset $k$, $PE_{pos+k}$ can be
# represented as a linear function of $PE_{pos}$", which might let the model "easily learn to
# attend by relative positions". By the angle-addition formulas, for pair $i$,
#
# $$
# \begin{pmatrix} \sin(\omega_i (pos + k)) \\ \cos(\omega_i (pos + k)) \end{pmatrix}
# =
# \begin{pmatrix}
#   \cos(k\omega_i) & \sin(k\omega_i) \\
#   -\sin(k\omega_i) & \cos(k\omega_i)
# \end{pmatrix}
# \begin{pmatrix} \sin(\omega_i\, pos) \\ \cos(\omega_i\, pos) \end{pmatrix},
# $$
#
# a rotation by $k\omega_i$ that does not involve $pos$. Stacking the rotations on the diagonal
# gives one matrix $M_k$ with $PE_{pos+k} = M_k\, PE_{pos}$ for every position, checked below
# against the table (rows as vectors: `pe[k:] == pe[:-k] @ M_k.T`).


# %% tags=["nbval-ignore-output"]
def offset_map(k: int, d_model: int) -> torch.Tensor:
    """M_k: 2x2 rotations by k·ω_i on the (sin, cos) pairs (float64)."""
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    omega = 10000 ** (-two_i / d_model)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[0::2, 0::2], m[0::2, 1::2] = torch.diag(c), torch.diag(s)
    m[1::2, 0::2], m[1::2, 1::2] = torch.diag(-s), torch.diag(c)
    return m


pe64 = sinusoidal_encoding(512, d_model, dtype=torch.float64)
for k in [1, 5, 50, 200]:
    error = (pe64[:-k] @ offset_map(k, d_model).T - pe64[k:]).abs().max()
    assert error < 1e-5
    print(f"k = {k:3d}: largest |M_k PE(pos) - PE(pos + k)| = {error:.1e}")

# %% [markdown]
# ## Distance, not position
#
# Because of the rotations, the dot product of two encodings depends only on their distance.
# Summing $\sin a \sin b + \cos a \cos b = \cos(a - b)$ over the pairs,
#
# $$
# PE_{pos} \cdot PE_{pos+k} = \sum_{i=0}^{d_\text{model}/2 - 1} \cos(k\,\omega_i),
# $$
#
# with no $pos$ in it, and the same for $k$ and $-k$. The figure draws it against $k$ for three
# starting positions. The three curves lie on top of each other, the curve is symmetric about
# $k = 0$, and it peaks at $d_\text{model}/2 = 256$, then falls off with ripples, never to zero:
# the slow pairs still contribute nearly $\cos 0 = 1$ each.

# %% tags=["hide-input"]
starts, distances = [64, 128, 256], range(-64, 65)
dots = pd.DataFrame(
    [
        (p, k, round((pe64[p] @ pe64[p + k]).item(), 4))
        for p in starts
        for k in distances
    ],
    columns=["pos", "k", "PE(pos)·PE(pos+k)"],
)
title = "The dot product of two encodings depends on their distance only"
alt.Chart(dots, title=title).mark_line(opacity=0.7).encode(
    x=alt.X("k:Q", title="distance k"),
    y="PE(pos)·PE(pos+k):Q",
    color="pos:O",
    strokeDash="pos:O",
).properties(width=520, height=240)

# %% [markdown]
# ## The layer
#
# `PositionalEncoding` stores the table for positions up to `max_len` and adds its first $L$
# rows to a batch $(B, L, d_\text{model})$; then, Section 5.4, "we apply dropout to the sums of
# the embeddings and the positional encodings", $P_\text{drop} = 0.1$ in the base model. The
# table is a *non-persistent buffer*: it follows the model to the GPU but is not saved in
# checkpoints. `start` shifts the positions, for decoding one token at a time.


# %%
#| export
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


# %% [markdown]
# In evaluation mode the layer adds exactly the table's rows, and encoding a sentence one position
# at a time gives what encoding it whole gives.

# %%
from transformer.embedding import PositionalEncoding

positional = PositionalEncoding(d_model=16, max_len=50, dropout=0.1).eval()
x = torch.randn(2, 7, 16)  # (B, L, d_model)
assert torch.equal(positional(x), x + pe_small[:7])
steps = [positional(x[:, t : t + 1], start=t) for t in range(7)]
assert torch.equal(torch.cat(steps, dim=1), positional(x))

# %% [markdown]
# ## Why multiply by √d_model
#
# Each encoding vector has a mean square of $1/2$ per dimension ($\sin^2 + \cos^2 = 1$ per pair).
# The embeddings start as $\mathcal{N}(0, d_\text{model}^{-1})$, sixteen times smaller in root
# mean square for $d_\text{model} = 512$: added as they are, position would drown out the word.
# Multiplied by $\sqrt{d_\text{model}}$ they have unit standard deviation, the same order as the
# encoding, as the table measures over 10,000 tokens.

# %%
token_embed = TokenEmbedding(vocab_size=10_000, d_model=d_model)
with torch.no_grad():
    scaled = token_embed(torch.arange(10_000)[None])[0]  # (V, d_model)
assert abs(scaled.std().item() - 1) < 0.01
kinds = {
    "embedding, unscaled": scaled / math.sqrt(d_model),
    "embedding × √d_model": scaled,
    "positional encoding": sinusoidal_encoding(512, d_model),
}
rms = {n: t.pow(2).mean().sqrt().item() for n, t in kinds.items()}
length = {n: t.norm(dim=-1).mean().item() for n, t in kinds.items()}
pd.DataFrame({"RMS per dimension": rms, "mean vector length": length}).round(4)

# %% [markdown]
# ## Learned positional embeddings
#
# The paper also tried learning one vector per position {cite:p}`gehring2017convolutional` "and
# found that the two versions produced nearly identical results" (Table 3, row E). It kept the
# sinusoids "because it may allow the model to extrapolate to sequence lengths longer than the
# ones encountered during training": a learned table has no row past `max_len`.
# `LearnedPositionalEncoding` has the same constructor and `forward`, so the model takes either
# (`positional="learned"` in the configuration).


# %%
#| export
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


# %%
from transformer.embedding import LearnedPositionalEncoding

learned = LearnedPositionalEncoding(d_model=16, max_len=50, dropout=0.1)
learned.eval()
assert torch.equal(learned(x), x + learned.embedding.weight[:7])

# %% [markdown]
# ## Summary
#
# - Tokens become rows of a learned table, multiplied by $\sqrt{d_\text{model}}$ so that they
#   start at the scale of the positional encoding.
# - The sinusoidal encoding pairs a sine and a cosine per frequency, with wavelengths in a
#   geometric progression from $2\pi$ to nearly $10000 \cdot 2\pi$.
# - A fixed offset is a fixed rotation $M_k$, and the dot product of two encodings depends only
#   on their distance.
#
# ## Exercises
#
# 1. Train the copy task of the chapter that puts the model together with
#    `positional="learned"` in its `TransformerConfig`, then test on sequences longer than any
#    seen in training. Which encoding copes?
# 2. With `tie_output=False` the output layer gets its own weights: does the copy task still
#    learn as fast?
