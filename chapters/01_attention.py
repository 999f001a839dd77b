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
# Every layer of the Transformer is built around one operation, which the paper calls *scaled
# dot-product attention* {cite:p}`vaswani2017attention` (Section 3.2.1). A set of *queries* is
# compared with a set of *keys*; each comparison becomes a weight; and each query's answer is
# the weighted average of the *values* that belong to the keys:
#
# $$
# \mathrm{Attention}(Q, K, V) = \softmax\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V
# \qquad (1)
# $$
#
# with $Q \in \mathbb{R}^{T_q \times d_k}$, $K \in \mathbb{R}^{T_k \times d_k}$ and
# $V \in \mathbb{R}^{T_k \times d_v}$. Think of it as a soft dictionary look-up: a query does not
# fetch the one value whose key matches, it fetches a blend of all values, weighted by how well
# each key matches. Additive attention {cite:p}`bahdanau2015neural` computes the same kind of
# weights with a small feed-forward network; the dot product does it with one matrix product,
# which is what makes it fast on a GPU.
#
# This chapter builds equation (1) one step at a time on a six-word example, writes it as the
# function `transformer.attention.scaled_dot_product_attention`, measures why the $1/\sqrt{d_k}$
# factor is there, and checks the function against PyTorch's own fused implementation.

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
# Take the sentence *the cat sat on the mat* and give each distinct word a random vector of
# $d_k = 16$ numbers, so that the two occurrences of *the* share a vector. In a real layer the
# queries, keys and values are three different learned projections of such vectors (that is the
# next chapter but one); here we let all three be the word vectors themselves, $Q = K = V = X$.
# A word's score with its own key is then its squared length $\lVert x \rVert^2$. That is not
# always its largest score: a longer vector $y$ pointing roughly the same way gives
# $x \cdot y > \lVert x \rVert^2$. But random vectors of 16 dimensions are roughly orthogonal to
# one another, so here each word's query does match its own key best, as the softmax step below
# checks.

# %%
words = ["the", "cat", "sat", "on", "the", "mat"]
d_k = 16
vocabulary = sorted(set(words))
word_vectors = {w: torch.randn(d_k) for w in vocabulary}
X = torch.stack([word_vectors[w] for w in words])  # (T, d_k)
Q, K, V = X, X, X
X.shape

# %% [markdown]
# **Scores.** Row $i$ of $QK^\top$ holds the dot products of query $i$ with every key: a
# $T_q \times T_k$ matrix, here $6 \times 6$.

# %% tags=["nbval-ignore-output"]
scores = Q @ K.transpose(-2, -1)  # (T_q, T_k)
scores

# %% [markdown]
# **Scaling.** Dividing by $\sqrt{d_k} = 4$ keeps the scores' spread independent of the width of
# the vectors; the section [Why divide by √d_k](#why-divide-by-d-k) measures what goes wrong
# without it.

# %%
scaled = scores / math.sqrt(d_k)
scaled

# %% [markdown]
# **Softmax.** Each row is turned into a probability distribution over the keys, so that each
# query spends a total weight of one:
# $\softmax(s)_j = e^{s_j} / \sum_{j'} e^{s_{j'}}$.

# %%
weights = scaled.softmax(dim=-1)  # (T_q, T_k), rows sum to 1
assert torch.allclose(weights.sum(-1), torch.ones(len(words)))
# Each word's largest weight is on its own key (the two "the" rows tie with each other).
assert torch.allclose(weights.diagonal(), weights.max(dim=-1).values)
weights

# %% [markdown]
# **Weighted sum.** The output for query $i$ is $\sum_j w_{ij} v_j$: a new vector for every
# position, built from the values of the positions it attends to.

# %%
output = weights @ V  # (T_q, d_v)
output.shape

# %% [markdown]
# The heatmap below shows the weights: one row per query, one column per key; hover over a cell
# to read its value. Look at the diagonal and at the two *the* rows: every word attends mostly to
# itself, because its query is its own key and the random vectors are roughly orthogonal, and
# each *the* gives the same weight to both
# occurrences of *the*, because their keys are identical. Nothing in equation (1) knows where a
# word stands in the sentence; the two *the* are indistinguishable until the chapter on
# positional encoding adds that information.

# %%
from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
heatmap(
    weights, x_labels=words, y_labels=words, title="Attention weights, Q = K = V = X"
)

# %% [markdown]
# ## The function
#
# The model needs equation (1) for whole batches and for several heads at once, so the function
# works on the last two dimensions and broadcasts over any leading ones, typically
# $(B, H, T_q, d_k)$. Two additions to the bare equation:
#
# - **A mask.** Some keys must be invisible to some queries: padding tokens, and in the decoder the
#   positions to the right of the query. A mask is a boolean tensor broadcastable to
#   $(B, H, T_q, T_k)$ in which `True` means *may attend*, the convention of
#   `torch.nn.functional.scaled_dot_product_attention`. Masked scores are set to $-\infty$ before
#   the softmax, so their weights are exactly zero. If *every* key of a query is masked, the softmax
#   would divide zero by zero; we define the answer instead: that query attends to nothing, its
#   weights and its output are zero, as PyTorch's own function also returns since version 2.5
#   (earlier versions gave NaN; the book requires PyTorch 2.5 or later).
# - **Dropout on the weights**, optional. The paper applies dropout to sublayer outputs and
#   embedding sums only; later implementations (tensor2tensor's second set of hyperparameters,
#   the Annotated Transformer) also drop attention weights during training. The caller passes a
#   dropout module, or nothing. The book's `MultiHeadAttention` owns an `nn.Dropout` (passed
#   here on its explicit path, and as `dropout_p` to PyTorch's fused function on its fast path)
#   whose probability, the config's `attention_dropout`, is 0 by default, so that by default no
#   weight is dropped, as in the paper.

# %%
#| export
"""Scaled dot-product attention, equation (1) of Vaswani et al. (2017)."""

import math
from collections.abc import Callable

import torch
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
        mask: boolean, broadcastable to (..., T_q, T_k); True means "may attend"
        returns output (..., T_q, d_v) and weights (..., T_q, T_k)

    A query whose keys are all masked gets zero weights and a zero output, not NaN.
    """
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    if mask is not None:
        # A row of -inf gives 0/0 = NaN in the softmax: such a query attends to nothing.
        weights = weights.masked_fill(~mask.any(dim=-1, keepdim=True), 0.0)
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # (..., T_q, d_v), (..., T_q, T_k)


# %% [markdown]
# The function reproduces the step-by-step computation above exactly:

# %%
from transformer.attention import scaled_dot_product_attention

out, w = scaled_dot_product_attention(Q, K, V)
assert torch.equal(w, weights) and torch.equal(out, output)

# %% [markdown]
# A mask removes keys from view. Here the query *cat* may not look at *sat* or *mat*: their
# weights become zero and the rest of the row is renormalised to sum to one.

# %%
mask = torch.ones(len(words), len(words), dtype=torch.bool)
mask[1, 2] = mask[1, 5] = False
_, w_masked = scaled_dot_product_attention(Q, K, V, mask=mask)
print("cat, unmasked:", w[1])
print("cat, masked:  ", w_masked[1])
assert w_masked[1, 2] == 0 and w_masked[1, 5] == 0
assert torch.allclose(w_masked[1].sum(), torch.tensor(1.0))

# %% [markdown]
# And a query that may see no key at all gets zeros, not NaN:

# %%
blind = torch.ones(len(words), len(words), dtype=torch.bool)
blind[3] = False  # "on" may attend to nothing
out_blind, w_blind = scaled_dot_product_attention(Q, K, V, mask=blind)
assert not out_blind.isnan().any()
assert torch.equal(w_blind[3], torch.zeros(len(words))) and torch.equal(
    out_blind[3], torch.zeros(d_k)
)
w_blind[3], out_blind[3, :4]

# %% [markdown]
# (why-divide-by-d-k)=
# ## Why divide by √d_k
#
# The paper's argument (Section 3.2.1, footnote 4): if the components of $q$ and $k$ are
# independent with mean 0 and variance 1, their dot product $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$
# is a sum of $d_k$ independent terms of variance 1, so it has mean 0 and **variance $d_k$**.
# The wider the vectors, the larger the scores, and the softmax of large scores puts nearly all the
# weight on the single largest one. Let us measure both halves of that claim. First the variance,
# over 10,000 random pairs for each width:

# %%
widths = [4, 16, 64, 256, 1024]
rows = []
for width in widths:
    q, k = torch.randn(10_000, width), torch.randn(10_000, width)
    dots = (q * k).sum(-1)
    rows.append(
        {
            "d_k": width,
            "var(q·k)": round(dots.var().item(), 1),
            "var(q·k / √d_k)": round((dots / math.sqrt(width)).var().item(), 3),
        }
    )
variance = pd.DataFrame(rows).set_index("d_k")
variance

# %%
# The measured variance grows like d_k; after scaling it stays near 1.
ratio = variance["var(q·k)"] / variance.index
assert ratio.between(0.9, 1.1).all()
assert variance["var(q·k / √d_k)"].between(0.9, 1.1).all()

# %% [markdown]
# Now the softmax. For one query against 10 random keys we record the largest attention weight
# (1.0 means all the attention on one key, 0.1 means spread evenly) and the size of the gradient
# that flows back through the softmax, $\lVert \partial\, \softmax(s) / \partial s \rVert_F$,
# averaged over 2,000 random draws, with and without the scale.


# %%
def softmax_statistics(
    width: int, scale: bool, n_keys: int = 10, draws: int = 2_000
) -> dict:
    q, k = torch.randn(draws, 1, width), torch.randn(draws, n_keys, width)
    s = (q @ k.transpose(-2, -1)).squeeze(1)  # (draws, n_keys)
    if scale:
        s = s / math.sqrt(width)
    p = s.softmax(-1)
    # Jacobian of the softmax: diag(p) - p pᵀ, one per draw.
    jac = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    return {
        "d_k": width,
        "scores": "q·k / √d_k" if scale else "q·k",
        "largest weight": p.max(-1).values.mean().item(),
        "softmax gradient norm": jac.flatten(1).norm(dim=-1).mean().item(),
    }


saturation = pd.DataFrame(
    [softmax_statistics(w, scale) for w in widths for scale in (True, False)]
).round(4)
saturation

# %% [markdown]
# Without the scale the softmax saturates as $d_k$ grows: at $d_k = 1024$ almost all the weight goes
# to one key, and the gradient through the softmax is a small fraction of its scaled size, so the
# layer learns slowly or not at all. With the scale both numbers stay where they were at
# $d_k = 4$. The left panel shows the largest weight, the right one the gradient norm, against
# $d_k$ on a log axis.

# %%
base = alt.Chart(saturation).encode(
    x=alt.X("d_k:Q", scale=alt.Scale(type="log", base=2), title="d_k"),
    color=alt.Color("scores:N", title="scores"),
    tooltip=["d_k", "scores", "largest weight", "softmax gradient norm"],
)
(
    base.mark_line(point=True).encode(
        y=alt.Y("largest weight:Q", scale=alt.Scale(domain=[0, 1]))
    )
    | base.mark_line(point=True).encode(y="softmax gradient norm:Q")
).properties(
    title="The softmax saturates without the 1/√d_k scale (10 keys, 2,000 draws)"
)

# %%
at = saturation.set_index(["d_k", "scores"])
assert at.loc[(1024, "q·k"), "largest weight"] > 0.9
assert at.loc[(1024, "q·k / √d_k"), "largest weight"] < 0.6
assert (
    at.loc[(1024, "q·k"), "softmax gradient norm"]
    < 0.3 * at.loc[(1024, "q·k / √d_k"), "softmax gradient norm"]
)
# with the scale, both stay within 15% of their values at d_k = 4
scaled = saturation[saturation["scores"] == "q·k / √d_k"].set_index("d_k")
for column in ("largest weight", "softmax gradient norm"):
    assert (scaled[column] / scaled.loc[4, column]).between(0.85, 1.15).all(), column

# %% [markdown]
# ## Checking against PyTorch
#
# PyTorch ships the same operation as `torch.nn.functional.scaled_dot_product_attention`, with
# fused kernels on the GPU that never store the $T_q \times T_k$ weight matrix. It uses the same
# mask convention, so our function must agree with it on random batched inputs, with and without a
# mask, including a query that sees no key. (The multi-head attention chapter calls PyTorch's
# function on its fast path and ours only when the weights are wanted.)

# %%
B, H, T_q, T_k, d_v = 2, 3, 5, 7, 4
query, key = torch.randn(B, H, T_q, d_k), torch.randn(B, H, T_k, d_k)
value = torch.randn(B, H, T_k, d_v)
mask = torch.rand(B, 1, T_q, T_k) > 0.3  # broadcast over the heads
mask[0, 0, 2] = False  # one query of the first sentence sees nothing

ours, _ = scaled_dot_product_attention(query, key, value)
theirs = F.scaled_dot_product_attention(query, key, value)
assert torch.allclose(ours, theirs, atol=1e-6)

ours, _ = scaled_dot_product_attention(query, key, value, mask=mask)
theirs = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
assert (ours - theirs).abs().max() < 1e-6
# The blind query gets zeros from PyTorch's function too.
assert torch.allclose(theirs[0, :, 2], torch.zeros(H, d_v))
print("with and without a mask, the two functions agree to within 1e-6")

# %% [markdown]
# ## What it costs
#
# For $T$ queries and $T$ keys of width $d$, equation (1) takes two matrix products of
# $T \times T \times d$ multiply-adds each: $O(T^2 d)$ work, but all of it in parallel, and every
# position reaches every other in one step. A recurrent layer needs $O(T d^2)$ work done in $T$
# sequential steps, and information from the first word needs $T$ steps to reach the last. The
# attention term is the smaller one whenever $T < d$, and in translation $T$ is far below
# $d$ = 512: the [data chapter](10_data.ipynb) counts 425,424 German subword tokens in the 29,000
# training sentences of this book's data, under 15 tokens per sentence. The
# [introduction](../intro.md) puts the paper's Table 1 comparison of layer types side by side.
#
# One attention function sees only one kind of similarity. The next chapters give the model
# masks to hide padding and the future, and then several attention functions, *heads*, working
# side by side on learned projections of the same input.
