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
    """Token ids to vectors of width d_model, multiplied by √d_model (Section
    3.4).

    The table starts with standard deviation d_model^-0.5, as in the reference
    code, so that the scaled embeddings have unit variance in every dimension.
    """

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        # Small entries suit the table's second use as the tied pre-softmax
        # weights (3.4); the √d_model factor in forward brings the embeddings
        # back to unit scale.
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, ids: Tensor) -> Tensor:
        """Look up each token's row and scale it by √d_model.

        Shapes:
            ids: (B, L) integer token ids
            returns (B, L, d_model)
        """
        return self.embedding(ids) * math.sqrt(self.d_model)


# %% [markdown]
# A repeated token gets the same vector wherever it stands: the problem the rest of the chapter
# solves.

# %%
from transformer.embedding import TokenEmbedding

embed = TokenEmbedding(vocab_size=100, d_model=16)
ids = torch.tensor([[5, 7, 5], [1, 2, 3]])  # (B, L) = (2, 3)
vectors = embed(ids)
assert vectors.shape == (2, 3, 16)
assert torch.equal(vectors[0, 0], vectors[0, 2])  # token 5 twice: one vector
vectors.shape

# %% [markdown]
# ## The sinusoidal table
#
# Section 3.5 gives position $pos$ a vector $PE_{pos} \in \mathbb{R}^{d_\text{model}}$ whose
# dimensions come in pairs, a sine and a cosine of the same frequency:
#
# $$
# PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right), \qquad
# PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right),
# \qquad i = 0, \dots, d_\text{model}/2 - 1.
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
    """The table of Section 3.5: PE(pos, 2i) = sin(pos·ω_i), PE(pos, 2i+1) =
    cos(pos·ω_i), with ω_i = 1/10000^(2i/d_model).

    Shapes:
        returns (max_len, d_model)
    """
    if d_model % 2 != 0:
        raise ValueError(
            f"d_model must be even (sine/cosine pairs), got d_model={d_model}"
        )
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(
        1
    )  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    frequency = torch.exp(-math.log(10000.0) * two_i / d_model)  # ω_i
    angle = position * frequency  # (max_len, d_model/2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.to(dtype)


# %% [markdown]
# The table agrees with the formula evaluated entry by entry with Python's `math` module:

# %%
from transformer.embedding import sinusoidal_encoding

pe_small = sinusoidal_encoding(50, 16)
by_hand = torch.tensor(
    [
        [
            (math.sin if j % 2 == 0 else math.cos)(
                pos / 10000 ** ((j - j % 2) / 16)
            )
            for j in range(16)
        ]
        for pos in range(50)
    ],
    dtype=torch.float64,
)
assert pe_small.shape == (50, 16) and pe_small.dtype == torch.float32
assert torch.allclose(pe_small.double(), by_hand, rtol=0, atol=1e-7)

# %% [markdown]
# The heatmap shows the table for $d_\text{model} = 64$ over 64 positions, red for $+1$ and blue
# for $-1$. The stripes widen from left to right: the first column, $\sin(pos)$, changes sign
# every three or four positions, while the last columns hardly change. No two rows are the same.

# %%
from transformer.plots import use_book_renderer

use_book_renderer()
d_show, positions_show = 64, 64
table = sinusoidal_encoding(positions_show, d_show)
# Column 0 is sin(pos): its sign changes every 3 or 4 positions (half of 2π ≈
# 6.28).
sign_changes = torch.nonzero(
    table[2:, 0].sign() != table[1:-1, 0].sign()
).flatten()
assert set(sign_changes.diff().tolist()) == {3, 4}
assert torch.pdist(table).min() > 0.1  # no two rows are the same
cells = pd.DataFrame(
    [
        {"position": pos, "dimension": j, "PE": round(float(table[pos, j]), 4)}
        for pos in range(positions_show)
        for j in range(d_show)
    ]
)
alt.Chart(
    cells, title="Sinusoidal positional encoding, d_model = 64"
).mark_rect().encode(
    x=alt.X("dimension:O", axis=alt.Axis(values=list(range(0, d_show, 8)))),
    y=alt.Y(
        "position:O", axis=alt.Axis(values=list(range(0, positions_show, 8)))
    ),
    color=alt.Color(
        "PE:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1], reverse=True)
    ),
    tooltip=["position", "dimension", alt.Tooltip("PE:Q", format=".3f")],
).properties(width=7 * d_show, height=5 * positions_show)

# %% [markdown]
# For the base model, $d_\text{model} = 512$, each wavelength is the previous one times
# $10000^{2/512}$, from $2\pi$ up to just short of $10000 \cdot 2\pi$:

# %%
d_model = 512
pe = sinusoidal_encoding(512, d_model)
two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
wavelength = 2 * math.pi * 10000 ** (two_i / d_model)  # λ_i = 2π / ω_i
ratios = wavelength[1:] / wavelength[:-1]
assert torch.allclose(ratios, torch.full_like(ratios, 10000 ** (2 / d_model)))
assert math.isclose(wavelength[0].item(), 2 * math.pi)
assert (
    wavelength[-1] < 10000 * 2 * math.pi
)  # the progression stops one step short
print(
    f"wavelengths from {wavelength[0]:.2f} to {wavelength[-1]:,.0f} positions,"
    f" each {ratios[0]:.4f} times the one before"
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
    """M_k: block-diagonal 2x2 rotations by k·ω_i, acting on (sin, cos) pairs
    (float64)."""
    omega = 10000 ** (
        -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model
    )
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[0::2, 0::2], m[0::2, 1::2] = torch.diag(c), torch.diag(s)
    m[1::2, 0::2], m[1::2, 1::2] = torch.diag(-s), torch.diag(c)
    return m


pe64 = sinusoidal_encoding(512, d_model, dtype=torch.float64)
for k in [1, 5, 50, 200]:
    m_k = offset_map(k, d_model)
    error = (pe64[:-k] @ m_k.T - pe64[k:]).abs().max().item()
    assert error < 1e-5
    # A rotation: orthogonal, so it preserves the norm of every encoding.
    assert torch.allclose(m_k @ m_k.T, torch.eye(d_model, dtype=torch.float64))
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

# %%
starts = [64, 128, 256]
distances = range(-64, 65)
dots = pd.DataFrame(
    [
        {
            "start": p,
            "k": k,
            "PE(pos)·PE(pos+k)": round(float(pe64[p] @ pe64[p + k]), 4),
        }
        for p in starts
        for k in distances
    ]
)
alt.Chart(
    dots,
    title="The dot product of two encodings depends on their distance only",
).mark_line(strokeWidth=2, opacity=0.7).encode(
    x=alt.X("k:Q", title="distance k"),
    y="PE(pos)·PE(pos+k):Q",
    color=alt.Color("start:O", title="pos"),
    strokeDash=alt.StrokeDash("start:O", title="pos"),
    tooltip=["start", "k", "PE(pos)·PE(pos+k)"],
).properties(width=520, height=240)

# %%
omega = 10000 ** (-two_i / d_model)
formula = torch.stack([torch.cos(k * omega).sum() for k in distances])
for p in starts:
    measured = torch.stack([pe64[p] @ pe64[p + k] for k in distances])
    assert torch.allclose(measured, formula, atol=1e-9)
assert torch.allclose(formula, formula.flip(0))  # symmetric in k
assert formula[64] == formula.max() and math.isclose(
    formula[64].item(), d_model / 2
)

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
    """Adds the sinusoidal table to the embeddings and applies dropout to the
    sum (3.5, 5.4)."""

    def __init__(
        self, d_model: int, max_len: int = 512, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # Not persistent: the table is a fixed function of (max_len, d_model),
        # not a weight.
        self.register_buffer(
            "pe", sinusoidal_encoding(max_len, d_model), persistent=False
        )

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x + PE[start : start + L], then dropout; start > 0 serves
        incremental decoding.

        Shapes:
            x: (B, L, d_model)
            returns (B, L, d_model)
        """
        length = x.size(1)
        _check_positions(start, length, self.max_len)
        return self.dropout(
            x + self.pe[start : start + length]
        )  # (L, d_model) broadcasts


# %% [markdown]
# In evaluation mode the layer adds exactly the table's rows, and encoding a sentence one position
# at a time gives what encoding it whole gives. In training mode dropout zeroes a tenth of the
# sum's entries and scales the rest by $1/0.9$.

# %%
from transformer.embedding import PositionalEncoding

positional = PositionalEncoding(d_model=16, max_len=50).eval()
x = torch.randn(2, 7, 16)  # (B, L, d_model)
assert torch.equal(positional(x), x + pe_small[:7])
one_at_a_time = torch.cat(
    [positional(x[:, t : t + 1], start=t) for t in range(7)], dim=1
)
assert torch.equal(one_at_a_time, positional(x))
assert "pe" not in positional.state_dict()
try:
    positional(torch.zeros(1, 8, 16), start=45)
except ValueError as error:
    print(error)
    assert "max_len=50" in str(error)
else:
    raise AssertionError("expected a ValueError")

train_positional = PositionalEncoding(
    d_model=512, max_len=512, dropout=0.1
).train()
x = torch.randn(8, 64, 512)
dropped = train_positional(x)
kept = dropped != 0
assert abs((1 - kept.float().mean()).item() - 0.1) < 0.01
assert torch.allclose(dropped[kept], ((x + pe[:64]) / 0.9)[kept])

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
    scaled = token_embed(torch.arange(10_000).unsqueeze(0))[0]  # (V, d_model)
unscaled = scaled / math.sqrt(d_model)
scale = pd.DataFrame(
    {
        "RMS per dimension": [
            t.pow(2).mean().sqrt().item() for t in (unscaled, scaled, pe)
        ],
        "mean vector length": [
            t.norm(dim=-1).mean().item() for t in (unscaled, scaled, pe)
        ],
    },
    index=[
        "embedding, unscaled",
        "embedding × √d_model",
        "positional encoding",
    ],
).round(4)
assert abs(scaled.std().item() - 1) < 0.01
assert (
    abs(scale.loc["positional encoding", "RMS per dimension"] - math.sqrt(0.5))
    < 0.01
)
assert abs(scale.loc["positional encoding", "mean vector length"] - 16) < 1e-3
scale

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

    def __init__(
        self, d_model: int, max_len: int = 512, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # nn.Embedding's N(0, 1) start: the same scale as the scaled token
        # embeddings.
        self.embedding = nn.Embedding(max_len, d_model)

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x + E[start : start + L], then dropout.

        Shapes:
            x: (B, L, d_model)
            returns (B, L, d_model)
        """
        length = x.size(1)
        _check_positions(start, length, self.max_len)
        return self.dropout(x + self.embedding.weight[start : start + length])


# %%
from transformer.embedding import LearnedPositionalEncoding

learned = LearnedPositionalEncoding(d_model=16, max_len=50).eval()
x = torch.randn(2, 7, 16)
assert torch.equal(learned(x), x + learned.embedding.weight[:7])
assert torch.equal(learned(x[:, 3:5], start=3), learned(x)[:, 3:5])
try:
    learned(torch.zeros(1, 51, 16))
except ValueError as error:
    assert "max_len=50" in str(error)
else:
    raise AssertionError("expected a ValueError")

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
