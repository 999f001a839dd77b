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
# # Scaled dot-product attention
#
# Every layer of the Transformer is built around one operation, *scaled dot-product attention*
# {cite:p}`vaswani2017attention` (Section 3.2.1). Queries are compared with keys, each
# comparison becomes a weight, and each query's answer is the weighted average of the values
# that belong to the keys:
#
# $$
# \mathrm{Attention}(Q, K, V) = \softmax\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V
# \qquad (1)
# $$
#
# with $Q \in \mathbb{R}^{T_q \times d_k}$, $K \in \mathbb{R}^{T_k \times d_k}$ and
# $V \in \mathbb{R}^{T_k \times d_v}$. It is a soft dictionary look-up: a query fetches a blend
# of all values, weighted by how well each key matches. Additive attention
# {cite:p}`bahdanau2015neural` computes such weights with a small network; the dot product needs
# one matrix product.
#
# This chapter builds equation (1) step by step, writes it as
# `transformer.attention.scaled_dot_product_attention`, shows why the $1/\sqrt{d_k}$ factor is
# there, and checks the function against PyTorch's own.

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
#| default_exp attention

# %%
import math

import altair as alt
import pandas as pd
import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## Equation (1), one step at a time
#
# Give each distinct word of *the cat sat on the mat* a random vector of $d_k = 16$ numbers (the
# two *the* share one). In a real layer the queries, keys and values are three learned
# projections of such vectors (the multi-head attention chapter); here all three are the word
# vectors themselves, $Q = K = V = X$.

# %%
words = ["the", "cat", "sat", "on", "the", "mat"]
d_k = 16
word_vectors = {w: torch.randn(d_k) for w in sorted(set(words))}
X = torch.stack([word_vectors[w] for w in words])  # (T, d_k)
Q, K, V = X, X, X

# %% [markdown]
# **Scores.** Row $i$ of $QK^\top$ holds the dot products of query $i$ with every key, a
# $T_q \times T_k$ matrix. **Scaling** divides them by $\sqrt{d_k} = 4$ (the section
# [Why divide by √d_k](#why-divide-by-d-k) shows why).

# %%
scores = Q @ K.transpose(-2, -1)  # (T_q, T_k)
scaled = scores / math.sqrt(d_k)
scaled

# %% [markdown]
# **Softmax** turns each row into a distribution over the keys,
# $\softmax(s)_j = e^{s_j} / \sum_{j'} e^{s_{j'}}$, and the **weighted sum** gives query $i$ the
# output $\sum_j w_{ij} v_j$.

# %%
weights = scaled.softmax(dim=-1)  # (T_q, T_k), rows sum to 1
output = weights @ V  # (T_q, d_v)
assert torch.allclose(weights.sum(-1), torch.ones(len(words)))
assert torch.equal(weights.diagonal(), weights.max(-1).values)  # on itself
output.shape

# %% [markdown]
# The heatmap shows the weights (rows: queries; columns: keys). Look at the diagonal:
# random vectors of 16 dimensions are nearly orthogonal, so each word attends mostly to itself.
# Look at the two *the* rows: they are identical, because nothing in equation (1) knows where a
# word stands; the chapter on positional encoding adds that.

# %%
from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
heatmap(
    weights,
    x_labels=words,
    y_labels=words,
    title="Attention weights, Q = K = V = X",
)

# %% [markdown]
# ## The function
#
# The function broadcasts over any leading dimensions, typically $(B, H, T_q, d_k)$, and adds two
# things to equation (1):
#
# - **A mask**, boolean and broadcastable to $(B, H, T_q, T_k)$, `True` meaning *may attend*, the
#   convention of `torch.nn.functional.scaled_dot_product_attention`. Masked scores become
#   $-\infty$, so their weights are exactly zero. A query whose keys are *all* masked attends to
#   nothing: its weights and output are zero, not NaN.
# - **Dropout on the weights**, if the caller passes a dropout module. The paper drops no
#   attention weights, and the configuration's `attention_dropout` is 0 by default.

# %%
#| export
"""Scaled dot-product attention, equation (1) of Vaswani et al. (2017)."""

import math
from collections.abc import Callable

from torch import Tensor


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    dropout: Callable[[Tensor], Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """softmax(QKᵀ/√d_k)·V, returning the output and the attention weights.

    Shapes:
        query: (..., T_q, d_k); key: (..., T_k, d_k); value: (..., T_k, d_v)
        mask: boolean (True: may attend), broadcastable to (..., T_q, T_k)
        returns output (..., T_q, d_v) and weights (..., T_q, T_k)
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None:  # a row of -inf is 0/0 = NaN: such a query sees none
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # (..., T_q, d_v), (..., T_q, T_k)


# %% [markdown]
# The function reproduces the steps above exactly. A mask that hides *sat* and *mat* from the
# query *cat* sets their weights to zero, and the row still sums to one; a query that may see no
# key gets zeros.

# %%
from transformer.attention import scaled_dot_product_attention

out, w = scaled_dot_product_attention(Q, K, V)
assert torch.equal(w, weights) and torch.equal(out, output)

mask = torch.ones(len(words), len(words), dtype=torch.bool)
mask[1, 2] = mask[1, 5] = False  # "cat" may not see "sat" or "mat"
mask[3] = False  # "on" may see nothing
out_masked, w_masked = scaled_dot_product_attention(Q, K, V, mask=mask)
assert not w_masked[1, [2, 5]].any() and not w_masked[3].any()
assert torch.allclose(w_masked[1].sum(), torch.tensor(1.0))
assert not out_masked[3].any()  # "on": a zero output
w_masked[1], w_masked[3]

# %% [markdown]
# (why-divide-by-d-k)=
# ## Why divide by √d_k
#
# The paper's argument (Section 3.2.1, footnote 4): if the components of $q$ and $k$ are
# independent with mean 0 and variance 1, then $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ has mean 0
# and **variance $d_k$**. Large scores push the softmax to put nearly all the weight on one key,
# where its gradient is tiny. The table measures the variance over 10,000 random pairs per width:

# %%
widths = [4, 16, 64, 256, 1024]
variance = pd.DataFrame(index=pd.Index(widths, name="d_k"))
for width in widths:
    dots = (torch.randn(10_000, width) * torch.randn(10_000, width)).sum(-1)
    variance.loc[width, "var(q·k)"] = round(dots.var().item(), 1)
    scaled_var = (dots / math.sqrt(width)).var().item()
    variance.loc[width, "var(q·k / √d_k)"] = round(scaled_var, 3)
assert (variance["var(q·k)"] / variance.index).between(0.9, 1.1).all()
assert variance["var(q·k / √d_k)"].between(0.9, 1.1).all()
variance

# %% [markdown]
# Now the softmax. For one query against 10 random keys, averaged over 2,000 draws, we record the
# largest weight (1.0: all on one key; 0.1: spread evenly) and the norm of the softmax's Jacobian,
# $\lVert \partial\, \softmax(s) / \partial s \rVert_F$, the gradient that flows back through it.


# %%
def softmax_statistics(width: int, scale: bool, n_keys=10, draws=2_000):
    q, k = torch.randn(draws, 1, width), torch.randn(draws, n_keys, width)
    s = (q @ k.transpose(-2, -1)).squeeze(1)  # (draws, n_keys)
    p = (s / math.sqrt(width) if scale else s).softmax(-1)
    jac = torch.diag_embed(p) - p[:, :, None] * p[:, None, :]  # diag(p) - ppᵀ
    return {
        "d_k": width,
        "scores": "q·k / √d_k" if scale else "q·k",
        "largest weight": p.max(-1).values.mean().item(),
        "softmax gradient norm": jac.flatten(1).norm(dim=-1).mean().item(),
    }


saturation = pd.DataFrame(
    [softmax_statistics(w, scale) for w in widths for scale in (True, False)]
).round(4)

# %% [markdown]
# Left, the largest weight; right, the gradient norm; against $d_k$ on a log axis. Without
# the scale, the softmax saturates as $d_k$ grows: at $d_k = 1024$ nearly all the weight is on
# one key and the gradient is a small fraction of its scaled size. With the scale both lines stay
# flat.

# %% tags=["hide-input"]
base = alt.Chart(saturation, width=250, height=200).encode(
    x=alt.X("d_k:Q", scale=alt.Scale(type="log", base=2)),
    color="scores:N",
    tooltip=["d_k", "scores", "largest weight", "softmax gradient norm"],
)
(
    base.mark_line(point=True).encode(y="largest weight:Q")
    | base.mark_line(point=True).encode(y="softmax gradient norm:Q")
).properties(title="Without the 1/√d_k scale the softmax saturates")

# %% tags=["remove-input"]
at = saturation.set_index(["scores", "d_k"])
plain, scaled = at.loc["q·k", 1024], at.loc["q·k / √d_k", 1024]
assert plain["largest weight"] > 0.9 and scaled["largest weight"] < 0.6
assert plain["softmax gradient norm"] < 0.3 * scaled["softmax gradient norm"]
# with the scale, both stay within 15% of their values at d_k = 4
flat = at.loc["q·k / √d_k"]
assert ((flat / flat.loc[4] - 1).abs() < 0.15).all().all()

# %% [markdown]
# ## Checking against PyTorch
#
# PyTorch's `torch.nn.functional.scaled_dot_product_attention` computes the same thing with the
# same mask convention, in fused GPU kernels that never store the $T_q \times T_k$ weights. The
# two agree on random batched inputs, with and without a mask, including a query that sees no
# key.

# %%
B, H, T_q, T_k, d_v = 2, 3, 5, 7, 4
query, key = torch.randn(B, H, T_q, d_k), torch.randn(B, H, T_k, d_k)
value = torch.randn(B, H, T_k, d_v)
mask = torch.rand(B, 1, T_q, T_k) > 0.3  # broadcast over the heads
mask[0, 0, 2] = False  # one query of the first sentence sees nothing
for m in (None, mask):
    ours, _ = scaled_dot_product_attention(query, key, value, mask=m)
    theirs = F.scaled_dot_product_attention(query, key, value, attn_mask=m)
    assert (ours - theirs).abs().max() < 1e-6
assert torch.allclose(theirs[0, :, 2], torch.zeros(H, d_v))  # the blind query

# %% [markdown]
# ## What it costs
#
# For $T$ queries and keys of width $d$, equation (1) costs $O(T^2 d)$ operations, all in
# parallel, and any position reaches any other in one step. A recurrent layer costs $O(T d^2)$ in
# $T$ sequential steps (the paper's Table 1). Attention is the cheaper one when $T < d$, as in
# translation: sentences of a few dozen tokens against $d_\text{model} = 512$.
#
# ## Summary
#
# - Attention averages the values with weights from the softmax of the scaled query–key dot
#   products, equation (1).
# - Dividing by $\sqrt{d_k}$ keeps the scores at unit variance, so the softmax does not saturate
#   and starve its gradient.
# - Masks are boolean, `True` meaning *may attend*, broadcastable to $(B, H, T_q, T_k)$; a query
#   that may see nothing gets a zero output.
# - Our function returns the weights and agrees with PyTorch's fused one.
#
# ## Exercises
#
# 1. Pass `dropout=torch.nn.Dropout(0.1)` to `scaled_dot_product_attention`. In training mode,
#    do the weights of a row still sum to one? The model sets this probability with the
#    configuration's `attention_dropout`.
# 2. After the multi-head attention chapter, call a `MultiHeadAttention` layer with
#    `need_weights=True` (this chapter's function) and without (PyTorch's fused kernel) on a
#    sequence of 2,000 tokens: compare outputs, time and memory.
