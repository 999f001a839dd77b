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
# # Multi-head attention
#
# One attention function gives each query one weighted average of the values, so it expresses
# one kind of relation at a time. The paper {cite:p}`vaswani2017attention` (Section 3.2.2) runs
# several attention functions side by side, each on its own learned projection of the queries,
# keys and values into a narrower space, and combines their results:
#
# $$
# \begin{aligned}
# \mathrm{MultiHead}(Q, K, V) &= \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O \\
# \text{where}\quad \mathrm{head}_i &= \mathrm{Attention}(Q W_i^Q, K W_i^K, V W_i^V)
# \end{aligned}
# $$
#
# with $W_i^Q, W_i^K \in \mathbb{R}^{d_\text{model} \times d_k}$,
# $W_i^V \in \mathbb{R}^{d_\text{model} \times d_v}$ and
# $W^O \in \mathbb{R}^{h d_v \times d_\text{model}}$. The paper uses $h = 8$ heads of
# $d_k = d_v = d_\text{model} / h = 64$ dimensions: "multi-head attention allows the model to
# jointly attend to information from different representation subspaces at different positions.
# With a single attention head, averaging inhibits this." In the code $h$ is `n_heads`, and a
# tensor's heads dimension is $H$.
#
# This chapter writes the layer as `transformer.multihead.MultiHeadAttention`, configured by
# `AttentionConfig`, checks it against the equation computed head by head, and draws what the
# heads of an untrained layer look at.

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
#| default_exp multihead

# %% [markdown]
# ## All heads in one matrix product
#
# The $H$ query projections $W_i^Q$, placed side by side, form one
# $d_\text{model} \times H d_k = d_\text{model} \times d_\text{model}$ matrix: one
# `nn.Linear(d_model, d_model)` computes them all, and head $i$'s queries are columns
# $i d_k, \dots, (i+1) d_k - 1$ of the result. `split_heads` reshapes the last dimension into
# $(H, d_k)$ and moves the heads in front of the positions, giving $(B, H, T, d_k)$, on which the
# attention function runs every head at once; `merge_heads`, the concatenation, is the same
# reshape backwards. This is also why $H$ heads cost about what one full-width head costs
# (Section 3.2.2; the appendix [Derivations and counts](a11_counts.ipynb) counts it).

# %%
#| export
"""Multi-head attention, Section 3.2.2 of Vaswani et al. (2017)."""

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.attention import scaled_dot_product_attention
from transformer.attention_config import AttentionConfig


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, L, d_model) -> (B, H, L, d_k): head i is columns i·d_k onwards."""
    return x.unflatten(-1, (n_heads, -1)).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, L, d_k) -> (B, L, H·d_k): Concat(head_1, ..., head_H)."""
    return x.transpose(1, 2).flatten(2)


# %% [markdown]
# The shapes, for $B$ = 2, $T$ = 6, $d_\text{model}$ = 16 and $H$ = 4:

# %%
torch.manual_seed(0)
B, T, d_model, H = 2, 6, 16, 4
d_k = d_model // H
x = torch.randn(B, T, d_model)
projected = nn.Linear(d_model, d_model)(x)  # all H heads' queries side by side
q = split_heads(projected, H)  # (B, H, T, d_k)
print(f"{tuple(x.shape)} -> {tuple(projected.shape)} -> {tuple(q.shape)}")
assert torch.equal(q[:, 2], projected[..., 2 * d_k : 3 * d_k])  # head 2
assert torch.equal(merge_heads(q), projected)  # concatenation undoes the split

# %% [markdown]
# ## The layer's sizes
#
# The layer reads its width $d_\text{model}$, its number of heads $H$ and a dropout rate on the
# attention weights, which the paper does not use, from one frozen dataclass, `AttentionConfig`.
# Its defaults are set from the paper's base model (Table 3), named once as `PAPER_D_MODEL` and
# `PAPER_N_HEADS`, and a width that the heads cannot split is refused when the config is made,
# with both numbers named. Later chapters extend the config with what their layers need; the
# model's `TransformerConfig` holds it all, and each layer reads its part.

# %%
#| export attention_config
"""The sizes of multi-head attention (Section 3.2.2), by default those of the
paper's base model."""

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


# %%
from transformer.attention_config import (
    PAPER_D_MODEL,
    PAPER_N_HEADS,
    AttentionConfig,
)

paper = AttentionConfig(d_model=PAPER_D_MODEL, n_heads=PAPER_N_HEADS)
print(f"the paper's base model: d_model {paper.d_model}, H {paper.n_heads}")
print(f"each head works in d_k = {paper.d_k} dimensions")
try:
    AttentionConfig(d_model=PAPER_D_MODEL, n_heads=7)
except ValueError as err:
    print(f"ValueError: {err}")

# %% [markdown]
# ## The module
#
# `MultiHeadAttention` holds the four $d_\text{model} \times d_\text{model}$ projections `w_q`,
# `w_k`, `w_v` (each the $H$ per-head matrices side by side) and `w_o` ($W^O$). They carry biases
# by default, as PyTorch's `nn.MultiheadAttention` does; `bias=False` gives the paper's bias-free
# layer (see the appendix [Deviations from the paper](a01_deviations.ipynb)).
#
# Attention itself has two paths:
#
# - **Fast** (the default): PyTorch's `torch.nn.functional.scaled_dot_product_attention`, whose
#   fused GPU kernels never store the $(B, H, T_q, T_k)$ weights and so cannot return them.
# - **Explicit** (`need_weights=True`): the attention chapter's function, which returns the
#   weights, for figures.
#
# On the fast path a query whose keys are all masked is shown every key and its output then
# zeroed, so both paths give it zero, whatever a kernel makes of a row of $-\infty$, and no NaN
# reaches the gradients.

# %%
#| export
def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    dropout: nn.Dropout,
    need_weights: bool,
) -> tuple[Tensor, Tensor | None]:
    """Every head at once, (B, H, T_q, d_k) -> (B, H, T_q, d_k), and the
    weights (B, H, T_q, T_k) if need_weights."""
    if mask is not None and mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be boolean (True = may attend), got {mask.dtype}"
        )
    if need_weights:
        return scaled_dot_product_attention(q, k, v, mask, dropout)
    p = dropout.p if dropout.training else 0.0
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p), None
    # Some kernels make a row of -inf scores NaN, and one NaN reaches every
    # parameter in the backward pass: such a row sees every key, then zeros.
    blind = ~mask.any(dim=-1, keepdim=True)  # (B, 1 or H, T_q, 1)
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask | blind, dropout_p=p
    )
    return out.masked_fill(blind, 0.0), None


# %% [markdown]
# `forward` follows the equation: it projects the queries, keys and values, each through its
# own matrix, splits each into heads, attends with every head at once, and concatenates the
# heads through $W^O$. It takes the three separately, since the model uses it three ways:
# encoder self-attention ($Q$, $K$ and $V$ all the encoder's $x$), decoder self-attention under
# the target mask, and decoder cross-attention (queries from the decoder, keys and values from
# the encoder's output). Masks are those of the masking chapter.

# %%
#| export
class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O (Section 3.2.2)."""

    def __init__(self, config: AttentionConfig, bias: bool = True) -> None:
        super().__init__()
        d_model = config.d_model
        self.d_model, self.n_heads, self.d_k = (
            d_model,
            config.n_heads,
            config.d_k,
        )
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        # on the weights
        self.attn_dropout = nn.Dropout(config.attention_dropout)

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of the queries over the keys and values, all heads.

        Shapes:
            query: (B, T_q, d_model); key, value: (B, T_k, d_model)
            mask: boolean (True: may attend), broadcastable to (B, H, T_q, T_k)
            returns (B, T_q, d_model) and the weights (B, H, T_q, T_k) or None
        """
        q = split_heads(self.w_q(query), self.n_heads)  # (B, H, T_q, d_k)
        k = split_heads(self.w_k(key), self.n_heads)  # (B, H, T_k, d_k)
        v = split_heads(self.w_v(value), self.n_heads)  # (B, H, T_k, d_k)
        out, weights = attend(q, k, v, mask, self.attn_dropout, need_weights)
        return self.w_o(merge_heads(out)), weights  # (B, T_q, d_model)


# %% [markdown]
# Decoding, in Part III, runs the layer's parts one new position at a time, from the layer's own
# weights; `project` gives it the heads of one input through several of the projections.

# %%
#| export
def project(x: Tensor, n_heads: int, *layers: nn.Linear) -> list[Tensor]:
    """x (B, L, d_model) through each layer, in heads (B, H, L, d_k)."""
    return [split_heads(layer(x), n_heads) for layer in layers]


# %% [markdown]
# ## Checking it against the equation
#
# The function below follows the equation literally: for each head it takes that head's $d_k$
# rows of each projection, runs the attention function, concatenates the $H$ results and applies
# $W^O$. Both paths of the module agree with it on the decoder's two kinds of attention:
# self-attention under the target mask, and cross-attention over a padded source of $S$ = 5
# tokens whose second sentence is all padding, so that its queries see no key.

# %%
from transformer.masking import padding_mask, target_mask
from transformer.multihead import MultiHeadAttention


def head_by_head(mha, query, key, value, mask):
    """Concat(head_1, ..., head_H) W^O, one head at a time."""
    heads = []
    for i in range(mha.n_heads):
        cols = slice(i * mha.d_k, (i + 1) * mha.d_k)  # head i's columns
        q_i = mha.w_q(query)[..., cols]  # Q W_i^Q: (B, T_q, d_k)
        k_i = mha.w_k(key)[..., cols]  # K W_i^K
        v_i = mha.w_v(value)[..., cols]  # V W_i^V
        # One head, so no heads dimension: the mask's (B, 1, ...) drops it.
        head, _ = scaled_dot_product_attention(q_i, k_i, v_i, mask[:, 0])
        heads.append(head)
    return mha.w_o(torch.cat(heads, dim=-1))  # (B, T_q, d_model)


pad_id = 0  # a toy vocabulary, as in the masking chapter; <bos> is 1
tgt_ids = torch.tensor([[1, 5, 6, 7, pad_id, pad_id], [1, 5, 6, 7, 8, 9]])
src_ids = torch.tensor([[5, 6, 7, pad_id, pad_id], [pad_id] * 5])
memory = torch.randn(B, 5, d_model)  # stands in for the encoder's output
self_attention = (x, x, x, target_mask(tgt_ids, pad_id))
cross_attention = (x, memory, memory, padding_mask(src_ids, pad_id))
mha = MultiHeadAttention(AttentionConfig(d_model=d_model, n_heads=H)).eval()
with torch.no_grad():
    for *args, mask in (self_attention, cross_attention):
        expected = head_by_head(mha, *args, mask)
        fast, _ = mha(*args, mask)
        explicit, _ = mha(*args, mask, need_weights=True)
        assert torch.allclose(fast, expected, atol=1e-6)
        assert torch.allclose(explicit, expected, atol=1e-6)

# %% [markdown]
# ## What the heads look at
#
# Even before training, the heads differ. Below, a layer of $H$ = 4 heads of $d_k$ = 8, freshly
# initialised, attends over the attention chapter's six words, with random word vectors. Compare
# a row across the four panels: a word puts its weight on different words in different heads, since
# each head measures similarity through its own $W_i^Q$ and $W_i^K$. The two *the* rows are
# still identical within each head: position is not yet known.

# %% tags=["hide-input"]
import altair as alt

from transformer.plots import heatmap, use_book_renderer

words = ["the", "cat", "sat", "on", "the", "mat"]
vectors = {w: torch.randn(32) for w in sorted(set(words))}
X = torch.stack([vectors[w] for w in words])[None]  # (1, T, d_model = 32)
layer = MultiHeadAttention(AttentionConfig(d_model=32, n_heads=4))
with torch.no_grad():
    _, weights = layer(X, X, X, need_weights=True)
favourite = weights[0].argmax(dim=-1)  # (H, T): each head's most-weighted key
assert (favourite != favourite[0]).any()  # the heads disagree somewhere
use_book_renderer()
labels = dict(x_labels=words, y_labels=words)
panels = [
    heatmap(weights[0, h], title=f"head {h + 1}", **labels) for h in range(4)
]
alt.vconcat(alt.hconcat(*panels[:2]), alt.hconcat(*panels[2:])).resolve_scale(
    color="shared"
).properties(title="Four heads of an untrained layer weight different words")

# %% [markdown]
# ## Summary
#
# - Multi-head attention runs $H$ attention functions on $d_\text{model}/H$-wide projections and
#   concatenates them through $W^O$.
# - The $H$ per-head projections are one $d_\text{model} \times d_\text{model}$ matrix; a reshape
#   to $(B, H, T, d_k)$ splits the heads.
# - The fast path uses PyTorch's fused kernel; `need_weights=True` takes the explicit path and
#   returns the weights; both agree with the equation head by head.
# - A query that may see no key gets a zero attention output on both paths.
#
# ## Exercises
#
# 1. Train the copy task of the chapter that puts the model together with `n_heads=1` and with
#    `n_heads=8` in its `TransformerConfig`, at the same `d_model`: which learns faster?
# 2. Build `MultiHeadAttention(AttentionConfig(d_model=64, n_heads=4))`, back-propagate a random loss, and look at
#    `w_k.bias.grad`. Why is it zero? (A constant added to every score of a row leaves the
#    softmax unchanged.) Then compare with `bias=False`, the paper's layer.
# 3. Time the fast path against `need_weights=True` on a batch of long sequences, on the CPU and,
#    if you have one, a GPU.
