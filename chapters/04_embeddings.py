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
# Attention, as the first chapter built it, has no idea of order: shuffle the keys and values
# together and every query gets the same answer, because equation (1) is a weighted sum over a
# *set*. A translation model must know that *dog bites man* is not *man bites dog*. The paper
# {cite:p}`vaswani2017attention` handles this before the first layer: each token becomes a
# learned vector of width $d_\text{model}$ (Section 3.4), and a fixed vector that depends only on
# the token's position is added to it (Section 3.5).
#
# This chapter writes both as the module `transformer.embedding`: `TokenEmbedding`, the table of
# sines and cosines `sinusoidal_encoding`, the layer `PositionalEncoding` that adds it, and
# `LearnedPositionalEncoding`, the alternative the paper tried in Table 3. Along the way it checks
# the two properties that motivate the sinusoids: a fixed offset $k$ acts on the encoding as one
# linear map for every position, and the dot product of two encodings depends only on their
# distance. It ends by measuring why the embeddings are multiplied by $\sqrt{d_\text{model}}$.

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
    # [notebooks]: spaCy's tokenizers, Altair and pandas, at the versions the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e", where + "[notebooks]"]
    subprocess.run(pip, check=True)
    sys.path.insert(0, where)  # an editable install is seen only after a restart

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
# A vocabulary of $V$ subword tokens is a table $E \in \mathbb{R}^{V \times d_\text{model}}$, and
# token $t$ becomes its row $E_t$. Section 3.4 adds one detail: "In the embedding layers, we
# multiply those weights by $\sqrt{d_\text{model}}$." The same table also serves as the weight
# matrix of the final linear layer that turns decoder outputs into scores over the vocabulary
# (weight tying, {cite:p}`press2017using`), which is why its entries start small: the reference
# code draws them from a normal distribution $\mathcal{N}(0, d_\text{model}^{-1})$, a standard
# deviation of $d_\text{model}^{-1/2}$, and so does ours. The section
# [Why multiply by √d_model](#why-sqrt-d-model) below measures what the factor does to that
# starting point.

# %%
#| export
"""Token embeddings and positional encodings, Sections 3.4 and 3.5 of Vaswani et al. (2017)."""

import math

import torch
from torch import Tensor, nn


class TokenEmbedding(nn.Module):
    """Token ids to vectors of width d_model, multiplied by √d_model (Section 3.4).

    The table starts with standard deviation d_model^-0.5, as in the reference code, so that
    the scaled embeddings have unit variance in every dimension.
    """

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.d_model = d_model
        self.embedding = nn.Embedding(vocab_size, d_model)
        # Small entries suit the table's second use as the tied pre-softmax weights (3.4);
        # the √d_model factor in forward brings the embeddings back to unit scale.
        nn.init.normal_(self.embedding.weight, mean=0.0, std=d_model**-0.5)

    def forward(self, ids: Tensor) -> Tensor:
        """Look up each token's row and scale it by √d_model.

        Shapes:
            ids: (B, L) integer token ids
            returns (B, L, d_model)
        """
        return self.embedding(ids) * math.sqrt(self.d_model)


# %% [markdown]
# A batch of token ids of shape $(B, L)$ becomes a tensor $(B, L, d_\text{model})$; a repeated
# token gets the same vector wherever it stands, which is the problem the rest of the chapter
# solves.

# %%
from transformer.embedding import TokenEmbedding

embed = TokenEmbedding(vocab_size=100, d_model=16)
ids = torch.tensor([[5, 7, 5], [1, 2, 3]])  # (B, L) = (2, 3)
vectors = embed(ids)
assert vectors.shape == (2, 3, 16)
assert torch.equal(vectors, embed.embedding(ids) * math.sqrt(16))
assert torch.equal(vectors[0, 0], vectors[0, 2])  # token 5 twice: one vector
vectors.shape

# %% [markdown]
# ## The sinusoidal table
#
# Section 3.5 gives each position $pos$ a vector $PE_{pos} \in \mathbb{R}^{d_\text{model}}$ whose
# dimensions come in pairs, a sine and a cosine of the same frequency:
#
# $$
# PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right), \qquad
# PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right),
# \qquad i = 0, \dots, d_\text{model}/2 - 1.
# $$
#
# Write $\omega_i = 10000^{-2i/d_\text{model}}$ for the frequency of pair $i$. Its wavelength
# $\lambda_i = 2\pi / \omega_i$ grows by the same factor $10000^{2/d_\text{model}}$ from one pair
# to the next: the wavelengths "form a geometric progression from $2\pi$ to
# $10000 \cdot 2\pi$", in the paper's words. The first pair turns a full circle every $2\pi$
# positions; the last turns so slowly that over a few hundred positions it barely moves. Between
# them, every position gets a distinct pattern, like the hands of a clock with $d_\text{model}/2$
# hands.
#
# The function computes the angles in float64 and rounds once to the requested type, so that a
# float32 table holds the correctly rounded values of the formula.


# %%
#| export
def sinusoidal_encoding(
    max_len: int, d_model: int, *, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The table of Section 3.5: PE(pos, 2i) = sin(pos·ω_i), PE(pos, 2i+1) = cos(pos·ω_i),
    with ω_i = 1/10000^(2i/d_model).

    Shapes:
        returns (max_len, d_model)
    """
    if d_model % 2 != 0:
        raise ValueError(
            f"d_model must be even (sine/cosine pairs), got d_model={d_model}"
        )
    position = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    frequency = torch.exp(-math.log(10000.0) * two_i / d_model)  # ω_i
    angle = position * frequency  # (max_len, d_model/2)
    pe = torch.empty(max_len, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.to(dtype)


# %% [markdown]
# The table agrees with the formula evaluated one entry at a time with Python's `math` module,
# to within float32 rounding:

# %%
from transformer.embedding import sinusoidal_encoding

pe_small = sinusoidal_encoding(50, 16)
by_hand = torch.tensor(
    [
        [
            (math.sin if j % 2 == 0 else math.cos)(pos / 10000 ** ((j - j % 2) / 16))
            for j in range(16)
        ]
        for pos in range(50)
    ],
    dtype=torch.float64,
)
assert pe_small.shape == (50, 16) and pe_small.dtype == torch.float32
assert torch.allclose(pe_small.double(), by_hand, rtol=0, atol=1e-7)
print(f"largest difference: {(pe_small.double() - by_hand).abs().max().item():.1e}")

# %% [markdown]
# The heatmap shows the table for $d_\text{model} = 64$ and the first 64 positions: one row per
# position, one column per dimension, red for $+1$ and blue for $-1$. Look at how the stripes
# widen from left to right: the first column, $\sin(pos)$, changes sign every three or four
# positions (half its period of $2\pi$), while the last columns hardly change down the whole
# figure (the sine columns stay near 0 and the cosine columns near 1). Read along a row and you
# get that position's code; no two rows are the same.

# %%
from transformer.plots import use_book_renderer

use_book_renderer()
d_show, positions_show = 64, 64
table = sinusoidal_encoding(positions_show, d_show)
# Column 0 is sin(pos): its sign changes every 3 or 4 positions (half of 2π ≈ 6.28).
sign_changes = torch.nonzero(table[2:, 0].sign() != table[1:-1, 0].sign()).flatten()
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
    y=alt.Y("position:O", axis=alt.Axis(values=list(range(0, positions_show, 8)))),
    color=alt.Color(
        "PE:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1], reverse=True)
    ),
    tooltip=["position", "dimension", alt.Tooltip("PE:Q", format=".3f")],
).properties(width=7 * d_show, height=5 * positions_show)

# %% [markdown]
# Now the base model's width, $d_\text{model} = 512$. The curves below are four sine dimensions
# $2i$, 32 apart, plotted against the position: each is a sine wave, and each wavelength is the
# previous one times the same factor, $10000^{32/512} \approx 1.78$. Look at the crossings of zero:
# the dimension $2i = 0$ completes a period every $2\pi \approx 6.3$ positions, and each curve
# further down the legend takes longer.

# %%
d_model = 512
pe = sinusoidal_encoding(512, d_model)
shown = [0, 32, 64, 96]  # sine dimensions 2i
shown_wavelengths = torch.tensor([2 * math.pi * 10000 ** (j / d_model) for j in shown])
shown_ratios = shown_wavelengths[1:] / shown_wavelengths[:-1]
assert torch.allclose(shown_ratios, torch.tensor(10000 ** (32 / d_model)))
assert round(shown_ratios[0].item(), 2) == 1.78
curves = pd.DataFrame(
    [
        {"position": pos, "dimension": f"2i = {j}", "PE": round(float(pe[pos, j]), 4)}
        for j in shown
        for pos in range(101)
    ]
)
alt.Chart(
    curves, title="Four sine dimensions of the d_model = 512 table"
).mark_line().encode(
    x="position:Q",
    y=alt.Y("PE:Q", title="PE(pos, 2i)"),
    color=alt.Color("dimension:N", sort=[f"2i = {j}" for j in shown]),
    tooltip=["dimension", "position", "PE"],
).properties(width=520, height=220)

# %% [markdown]
# The wavelengths of all 256 pairs follow from the formula. On a logarithmic axis a geometric
# progression is a straight line, which is what the next figure shows; the table under it gives
# the two ends and the constant ratio between neighbours.

# %%
two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
wavelength = 2 * math.pi * 10000 ** (two_i / d_model)  # λ_i = 2π / ω_i
ratios = wavelength[1:] / wavelength[:-1]
assert torch.allclose(ratios, torch.full_like(ratios, 10000 ** (2 / d_model)))
assert math.isclose(wavelength[0].item(), 2 * math.pi)
assert wavelength[-1] < 10000 * 2 * math.pi  # the progression stops one step short
pd.DataFrame(
    {
        "shortest λ": [wavelength[0].item()],
        "longest λ": [wavelength[-1].item()],
        "10000·2π": [10000 * 2 * math.pi],
        "ratio λ_(i+1)/λ_i": [ratios[0].item()],
    }
).round(4)

# %%
alt.Chart(
    pd.DataFrame(
        {"pair i": range(d_model // 2), "wavelength": wavelength.numpy().round(4)}
    ),
    title="Wavelengths form a geometric progression from 2π to nearly 10000·2π",
).mark_line(point=alt.OverlayMarkDef(size=8)).encode(
    x="pair i:Q",
    y=alt.Y(
        "wavelength:Q", scale=alt.Scale(type="log"), title="wavelength (positions)"
    ),
    tooltip=["pair i", alt.Tooltip("wavelength:Q", format=".1f")],
).properties(width=520, height=200)

# %% [markdown]
# ## A fixed offset is a fixed linear map
#
# The paper's reason for this choice: "we hypothesized it would allow the model to easily learn
# to attend by relative positions, since for any fixed offset $k$, $PE_{pos+k}$ can be
# represented as a linear function of $PE_{pos}$." The angle-addition formulas make it precise.
# For pair $i$,
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
# a rotation by the angle $k\omega_i$ that does not involve $pos$. Stacking the $d_\text{model}/2$
# rotations on the diagonal gives one matrix $M_k$ with $PE_{pos+k} = M_k\, PE_{pos}$ for every
# position. We build $M_k$ from the frequencies alone and check it against the table, in float64
# so that the check measures the identity and not float32 rounding; with the rows of the table as
# the vectors, the identity reads `pe[k:] == pe[:-k] @ M_k.T`.


# %% tags=["nbval-ignore-output"]
def offset_map(k: int, d_model: int) -> torch.Tensor:
    """M_k: block-diagonal 2x2 rotations by k·ω_i, acting on (sin, cos) pairs (float64)."""
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    m[0::2, 0::2], m[0::2, 1::2] = torch.diag(c), torch.diag(s)
    m[1::2, 0::2], m[1::2, 1::2] = torch.diag(-s), torch.diag(c)
    return m


pe64 = sinusoidal_encoding(512, d_model, dtype=torch.float64)
offsets = [1, 5, 50, 200]
for k in offsets:
    m_k = offset_map(k, d_model)
    error = (pe64[:-k] @ m_k.T - pe64[k:]).abs().max().item()
    assert error < 1e-5
    # A rotation: orthogonal, so it preserves the norm of every encoding.
    assert torch.allclose(m_k @ m_k.T, torch.eye(d_model, dtype=torch.float64))
    print(
        f"k = {k:3d}: largest |M_k PE(pos) - PE(pos + k)| over {512 - k} positions = {error:.1e}"
    )

# %% [markdown]
# Could the model find such a map from the table alone? Least squares answers that directly:
# find the matrix $X$ that best maps the rows $PE_{pos}$ to the rows $PE_{pos+k}$ over all the
# positions of the table. It succeeds, in the sense the paper needs: the fitted map reproduces
# every $PE_{pos+k}$ as well as $M_k$ does.

# %% tags=["nbval-ignore-output"]
fits = []
for k in offsets:
    x_k = torch.linalg.lstsq(pe64[:-k], pe64[k:], driver="gelsd").solution.T
    error = (pe64[:-k] @ x_k.T - pe64[k:]).abs().max().item()
    assert error < 1e-5
    fits.append(
        {
            "k": k,
            "fit error": error,
            "largest |X - M_k|": (x_k - offset_map(k, d_model)).abs().max().item(),
        }
    )
fits = pd.DataFrame(fits).set_index("k")
# An exact fit, and yet some entry of X is off by nearly 1 for every offset.
assert (fits["largest |X - M_k|"] > 0.9).all()
fits

# %% [markdown]
# The fit error is as small as for $M_k$, yet the fitted matrix is not $M_k$: some entries differ
# by nearly 1. The map is not unique because the table, seen over 512 positions, has far fewer
# than 512 independent columns: the slowest pairs have barely left their starting values (the
# last columns of the heatmap), so they look almost alike, and least squares is free to mix them.
# The numerical rank of the table, printed below, counts the directions least squares can tell
# apart. A map that only fits the table's positions also need not hold beyond them, while $M_k$
# holds for every position; the second line evaluates both at positions 512 to 1023, which the
# fit never saw.

# %% tags=["nbval-ignore-output"]
k = 5
x_k = torch.linalg.lstsq(pe64[:-k], pe64[k:], driver="gelsd").solution.T
m_k = offset_map(k, d_model)
longer = sinusoidal_encoding(1024 + k, d_model, dtype=torch.float64)
unseen, shifted = longer[512:1024], longer[512 + k : 1024 + k]
rank = torch.linalg.matrix_rank(pe64).item()
print(f"numerical rank of the 512 x {d_model} table: {rank}")
print(
    f"positions 512-1023, k = {k}: error of M_k {(unseen @ m_k.T - shifted).abs().max():.1e}, "
    f"of the least-squares X {(unseen @ x_k.T - shifted).abs().max():.2f}"
)
assert rank < d_model // 2  # far fewer independent columns than 512
assert (unseen @ m_k.T - shifted).abs().max() < 1e-5
assert (unseen @ x_k.T - shifted).abs().max() > 0.1

# %% [markdown]
# Restrict the fit to the structure of the argument, one $2 \times 2$ block per frequency pair,
# and least squares recovers $M_k$ itself: each pair's sine and cosine columns are clearly
# independent, so each block is determined.

# %% tags=["nbval-ignore-output"]
pairs_now = (
    pe64[:-k].reshape(-1, d_model // 2, 2).transpose(0, 1)
)  # (d_model/2, L - k, 2)
pairs_next = (
    pe64[k:].reshape(-1, d_model // 2, 2).transpose(0, 1)
)  # (d_model/2, L - k, 2)
blocks = torch.linalg.lstsq(
    pairs_now, pairs_next, driver="gelsd"
).solution  # (d_model/2, 2, 2)
m_fit = torch.block_diag(*blocks.transpose(1, 2))
print(f"largest |M_k fitted block by block - M_k| = {(m_fit - m_k).abs().max():.1e}")
assert torch.allclose(m_fit, m_k, atol=1e-9)
assert (pe64[:-k] @ m_fit.T - pe64[k:]).abs().max() < 1e-5

# %% [markdown]
# ## Distance, not position
#
# A consequence of the rotations: the dot product of two encodings depends only on how far apart
# they are. Summing $\sin a \sin b + \cos a \cos b = \cos(a - b)$ over the pairs,
#
# $$
# PE_{pos} \cdot PE_{pos+k} = \sum_{i=0}^{d_\text{model}/2 - 1} \cos(k\,\omega_i),
# $$
#
# which has no $pos$ in it and, since the cosine is even, is the same for $k$ and $-k$. The figure
# draws $PE_{pos} \cdot PE_{pos+k}$ against $k$ for three starting positions. Look for three
# things: the three curves lie exactly on top of each other (position does not matter), the curve
# is symmetric about $k = 0$ (the dot product cannot tell before from after), and it peaks at
# $d_\text{model}/2 = 256$ for $k = 0$ and falls off, with ripples, as the distance grows. It
# does not fall to zero: the slow pairs, whose wavelengths are much longer than $k$, still
# contribute nearly $\cos 0 = 1$ each.

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
    dots, title="The dot product of two encodings depends on their distance only"
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
assert formula[64] == formula.max() and math.isclose(formula[64].item(), d_model / 2)
print(
    f"k = 0: {formula[64]:.1f}   k = ±1: {formula[65]:.1f}   k = ±64: {formula[-1]:.1f}"
)

# %% [markdown]
# The symmetry is a property of the raw encodings only. Inside attention, a query and a key are
# the encodings after two different learned projections, $W^Q$ and $W^K$, and a rotation composed
# with different projections does distinguish $k$ from $-k$; the fixed maps $M_k$ are what make
# such relative patterns easy to learn.
#
# ## The layer
#
# `PositionalEncoding` stores the table once, for positions up to `max_len`, and adds its first
# $L$ rows to a batch of embeddings $(B, L, d_\text{model})$. Section 5.4 then applies dropout to
# the sum: "we apply dropout to the sums of the embeddings and the positional encodings in both
# the encoder and decoder stacks", with $P_\text{drop} = 0.1$ for the base model. Two details:
#
# - The table is a *non-persistent buffer*: it moves with the model to the GPU, but is not saved
#   in checkpoints, since it is a fixed function of `max_len` and `d_model`.
# - `start` shifts the positions. When the decoder produces a translation one token at a time
#   (the decoding chapter), the token it embeds at step $t$ stands at position $t$, so it needs
#   row $t$ of the table, not row 0.
#
# A sequence longer than `max_len` is an error, reported with both numbers, rather than a shape
# mismatch deep inside the addition.


# %%
#| export
def _check_positions(start: int, length: int, max_len: int) -> None:
    if start < 0:
        raise ValueError(f"start must be >= 0, got start={start}")
    if start + length > max_len:
        raise ValueError(
            f"positions {start}..{start + length - 1} (start={start}, length {length}) "
            f"exceed max_len={max_len}; build the positional encoding with a larger max_len"
        )


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal table to the embeddings and applies dropout to the sum (3.5, 5.4)."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.1) -> None:
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # Not persistent: the table is a fixed function of (max_len, d_model), not a weight.
        self.register_buffer(
            "pe", sinusoidal_encoding(max_len, d_model), persistent=False
        )

    def forward(self, x: Tensor, start: int = 0) -> Tensor:
        """x + PE[start : start + L], then dropout; start > 0 serves incremental decoding.

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
# In evaluation mode the layer adds exactly the table's rows; a block of positions starting at
# `start` gets the rows from `start` on, so encoding a sentence one position at a time gives the
# same result as encoding it whole; and the table is not part of the state dict.

# %%
from transformer.embedding import PositionalEncoding

positional = PositionalEncoding(d_model=16, max_len=50).eval()
x = torch.randn(2, 7, 16)  # (B, L, d_model)
assert torch.equal(positional(x), x + pe_small[:7])
assert torch.equal(positional(x[:, 3:5], start=3), x[:, 3:5] + pe_small[3:5])
one_at_a_time = torch.cat(
    [positional(x[:, t : t + 1], start=t) for t in range(7)], dim=1
)
assert torch.equal(one_at_a_time, positional(x))
assert "pe" not in positional.state_dict()

# %% [markdown]
# Asking for positions past `max_len` names the limit:

# %%
try:
    positional(torch.zeros(1, 8, 16), start=45)
except ValueError as error:
    print(error)
    assert "max_len=50" in str(error)
else:
    raise AssertionError("expected a ValueError")

# %% [markdown]
# In training mode, dropout zeroes each entry of the sum with probability 0.1 and scales the
# survivors by $1/0.9$, so that the expected value is unchanged:

# %%
train_positional = PositionalEncoding(d_model=512, max_len=512, dropout=0.1).train()
x = torch.randn(8, 64, 512)
dropped = train_positional(x)
kept = dropped != 0
print(f"fraction dropped: {1 - kept.float().mean().item():.3f}")
assert abs((1 - kept.float().mean()).item() - 0.1) < 0.01
assert torch.allclose(dropped[kept], ((x + pe[:64]) / 0.9)[kept])

# %% [markdown]
# (why-sqrt-d-model)=
# ## Why multiply by √d_model
#
# The encoding's entries lie in $[-1, 1]$, and each vector has a mean square of exactly $1/2$ per
# dimension, since each pair contributes $\sin^2 + \cos^2 = 1$ to two dimensions. The embeddings
# it is added to start as $\mathcal{N}(0, d_\text{model}^{-1})$, with a root mean square
# $\sqrt{d_\text{model}/2}$ times smaller: for $d_\text{model} = 512$, sixteen times. Added as
# they are, the position would drown out the word at the start of training. Multiplying by
# $\sqrt{d_\text{model}}$ gives the embedding a standard deviation of
# $\sqrt{d_\text{model}} \cdot d_\text{model}^{-1/2} = 1$ per dimension, the same order as the
# encoding. We measure both, over a vocabulary of 10,000 tokens, per dimension and
# as the length of a whole vector (the encoding's vectors all have length
# $\sqrt{d_\text{model}/2}$).

# %%
token_embed = TokenEmbedding(vocab_size=10_000, d_model=d_model)
with torch.no_grad():
    scaled = token_embed(torch.arange(10_000).unsqueeze(0))[0]  # (V, d_model)
unscaled = scaled / math.sqrt(d_model)
scale = pd.DataFrame(
    {
        "std per dimension": [
            unscaled.std().item(),
            scaled.std().item(),
            pe.std().item(),
        ],
        "RMS per dimension": [
            unscaled.pow(2).mean().sqrt().item(),
            scaled.pow(2).mean().sqrt().item(),
            pe.pow(2).mean().sqrt().item(),
        ],
        "mean vector length": [
            unscaled.norm(dim=-1).mean().item(),
            scaled.norm(dim=-1).mean().item(),
            pe.norm(dim=-1).mean().item(),
        ],
    },
    index=["embedding, unscaled", "embedding × √d_model", "positional encoding"],
).round(4)
scale

# %%
assert abs(scale.loc["embedding × √d_model", "std per dimension"] - 1) < 0.01
assert (
    abs(scale.loc["positional encoding", "RMS per dimension"] - math.sqrt(0.5)) < 0.01
)
assert abs(scale.loc["positional encoding", "mean vector length"] - 16) < 1e-3
# Mean square = variance + mean²: the encoding's std is below its RMS because its mean is not 0.
encoding = scale.loc["positional encoding"]
assert encoding["std per dimension"] < encoding["RMS per dimension"] - 0.05
assert abs(pe.mean() - 0.27) < 0.005
assert pe[:, -1].min() > 0.99  # the slowest cosine column stays near 1

# %% [markdown]
# The encoding's standard deviation is lower than its RMS because its mean is not 0: the slow
# cosine columns sit near 1 (the last one stays above 0.99 over all 512 positions), which lifts
# the mean of the whole table to about 0.27, and the standard deviation measures the spread
# around that mean.
#
# After scaling, the word and its position enter the first layer with comparable weight: a
# vector of length about $\sqrt{d_\text{model}}$ from the embedding and one of length
# $\sqrt{d_\text{model}/2}$ from the encoding. Training is free to move the embeddings from
# there; the factor only fixes the starting balance, which the tied output layer would otherwise
# force to tip towards position.
#
# ## Learned positional embeddings
#
# The paper also tried learning one vector per position, as the convolutional sequence-to-sequence
# model does {cite:p}`gehring2017convolutional`, "and found that the two versions produced nearly
# identical results" (Table 3, row E: 25.7 BLEU on the development set against 25.8 for the
# sinusoids). It kept the sinusoids "because it may allow the model to extrapolate to sequence
# lengths longer than the ones encountered during training": a learned table has no row at all
# past `max_len`, and rows for positions never seen in training stay at their random start.
# `LearnedPositionalEncoding` has the same constructor and `forward` as `PositionalEncoding`, so
# the model can take either (`positional="learned"` in the configuration chapter).


# %%
#| export
class LearnedPositionalEncoding(nn.Module):
    """A learned vector per position instead of the sinusoids (Table 3, row E)."""

    def __init__(self, d_model: int, max_len: int = 512, dropout: float = 0.1) -> None:
        super().__init__()
        self.max_len = max_len
        self.dropout = nn.Dropout(dropout)
        # nn.Embedding's N(0, 1) start: the same scale as the scaled token embeddings.
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


# %% [markdown]
# The two layers are interchangeable; the learned one costs `max_len` × $d_\text{model}$
# parameters (for the base model with 512 positions, the number printed below) and, like the
# sinusoidal one, refuses positions past `max_len`.

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
base_learned = LearnedPositionalEncoding(d_model=512, max_len=512)
print(f"parameters: {sum(p.numel() for p in base_learned.parameters()):,}")

# %% [markdown]
# The input of the encoder and of the decoder is now
# `PositionalEncoding(TokenEmbedding(ids))`: a $(B, L, d_\text{model})$ tensor in which each
# vector carries both a word and its place. The next chapter builds the other two ingredients
# of every layer: the feed-forward network, and the residual connection with layer
# normalisation that wraps each sublayer.
