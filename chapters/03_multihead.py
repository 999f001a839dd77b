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
# \mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\, W^O
# \quad\text{where}\quad
# \mathrm{head}_i = \mathrm{Attention}(Q W_i^Q, K W_i^K, V W_i^V)
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
# This chapter writes the layer as `transformer.multihead.MultiHeadAttention`, checks it against
# the equation computed head by head, and draws what the heads of an untrained layer look at.

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

# %%
import torch
from torch import nn

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## All heads in one matrix product
#
# The $H$ query projections $W_i^Q$, placed side by side, form one
# $d_\text{model} \times H d_k = d_\text{model} \times d_\text{model}$ matrix: one
# `nn.Linear(d_model, d_model)` computes them all, and head $i$'s queries are columns
# $i d_k, \dots, (i+1) d_k - 1$ of the result. Reshaping the last dimension into $(H, d_k)$ and
# moving the heads in front of the positions gives $(B, H, T, d_k)$, on which the attention
# function runs every head at once; concatenation is the same reshape backwards. This is also
# why $H$ heads cost about what one full-width head costs (Section 3.2.2; the appendix
# [Derivations and counts](93_counts.ipynb) counts it). The shapes, for $B$ = 2, $T$ = 6, $d_\text{model}$ = 16
# and $H$ = 4:

# %%
B, T, d_model, H = 2, 6, 16, 4
d_k = d_model // H
x = torch.randn(B, T, d_model)
w_q = nn.Linear(d_model, d_model)
projected = w_q(x)  # (B, T, d_model): all H heads' queries side by side
q = projected.view(B, T, H, d_k).transpose(1, 2)  # (B, H, T, d_k)
print(f"{tuple(x.shape)} -> {tuple(projected.shape)} -> {tuple(q.shape)}")

# Head i's queries are columns i*d_k ... (i+1)*d_k - 1 of the one big
# projection.
i = 2
assert torch.equal(q[:, i], projected[..., i * d_k : (i + 1) * d_k])
# Concatenation undoes the split exactly.
assert torch.equal(q.transpose(1, 2).reshape(B, T, d_model), projected)

# %% [markdown]
# ## The module
#
# `MultiHeadAttention` holds the four $d_\text{model} \times d_\text{model}$ projections `w_q`,
# `w_k`, `w_v` (each the $H$ per-head matrices side by side) and `w_o` ($W^O$). They carry biases
# by default, as PyTorch's `nn.MultiheadAttention` does; `bias=False` gives the paper's bias-free
# layer (see the appendix [Deviations from the paper](90_deviations.ipynb)).
#
# `forward` takes queries, keys and values separately, since the model uses it three ways:
# encoder self-attention, decoder self-attention under the target mask, and decoder
# cross-attention (queries from the decoder, keys and values from the encoder's output). Masks
# are those of the masking chapter. Attention itself has two paths:
#
# - **Fast** (the default): PyTorch's `torch.nn.functional.scaled_dot_product_attention`, whose
#   fused GPU kernels never store the $(B, H, T_q, T_k)$ weights and so cannot return them.
# - **Explicit** (`need_weights=True`): the attention chapter's function, which returns the
#   weights, for figures.
#
# On the fast path a query whose keys are all masked is shown every key and its output then
# zeroed, so both paths give it zero, whatever a kernel makes of a row of $-\infty$, and no NaN
# reaches the gradients. Dropout on the attention weights defaults to 0, as in the paper.
#
# In self-attention $Q$, $K$ and $V$ are projections of the same $x$, so `_project` computes
# them as one product by $[W^Q\, W^K\, W^V]$ stacked (and encoder-decoder attention its $K$
# and $V$ of the memory as one): the same arithmetic in one larger matrix product, which a
# computer runs faster than three small ones.

# %%
#| export
"""Multi-head attention, Section 3.2.2 of Vaswani et al. (2017)."""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.attention import scaled_dot_product_attention


@dataclass
class KVCache:
    """One attention layer's keys and values, split into heads, kept between
    decoding steps.

    A self-attention cache (static=False) appends the new positions' keys and
    values at each call; a static one (encoder-decoder attention) projects the
    memory at its first call and reuses the result. MultiHeadAttention.forward
    updates it in place.

    Shapes:
        key, value: (B, H, L, d_k), None before the first call
    """

    key: Tensor | None = None
    value: Tensor | None = None
    static: bool = False

    @property
    def length(self) -> int:
        """L, the number of positions held."""
        return 0 if self.key is None else self.key.size(2)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), in that order: beam search following
        its beams."""
        if self.key is not None:
            self.key = self.key.index_select(0, index)  # (B', H, L, d_k)
            self.value = self.value.index_select(0, index)  # (B', H, L, d_k)


class MultiHeadAttention(nn.Module):
    """Concat(head_1, ..., head_H) W^O, with head_i = Attention(Q W_i^Q, K
    W_i^K, V W_i^V)."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be a multiple of n_heads"
                f" ({n_heads})"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        # The H per-head projections W_i^Q (d_model x d_k) side by side: one
        # d_model x d_model.
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        # Dropout on the attention weights; 0 in the paper, which never drops
        # them.
        self.attn_dropout = nn.Dropout(dropout)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_k).transpose(
            1, 2
        )  # (B, H, L, d_k)

    def _merge_heads(self, x: Tensor) -> Tensor:
        B, _, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, self.d_model)  # (B, L, d_model)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        need_weights: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of every head at once: (B, H, T_q, d_k) -> (B, H, T_q,
        d_k)."""
        if need_weights:
            return scaled_dot_product_attention(
                q, k, v, mask=mask, dropout=self.attn_dropout
            )
        if mask is None:
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                dropout_p=self.attn_dropout.p if self.training else 0.0,
            )
            return out, None
        # A query that may see no key is a row of -inf scores: what a kernel
        # makes of it differs between kernels and versions (NaN in some), and a
        # NaN in one row reaches every parameter in the backward pass. Let such
        # rows see every key, then zero them.
        blind = ~mask.any(dim=-1, keepdim=True)  # (B, 1 or H, T_q, 1)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask | blind,
            dropout_p=self.attn_dropout.p if self.training else 0.0,
        )
        return out.masked_fill(blind, 0.0), None

    def _project(self, x: Tensor, *layers: nn.Linear) -> list[Tensor]:
        """x through one or more of the projections, each result split into
        heads.

        Projections of the same x are one matrix product by their weights
        stacked, as PyTorch's nn.MultiheadAttention computes them: the same
        products, fewer and larger.
        """
        if len(layers) == 1 or not all(
            isinstance(p.weight, Tensor) for p in layers
        ):
            # one layer, or layers whose weights are not tensors (quantised):
            # one by one
            return [self._split_heads(layer(x)) for layer in layers]
        weight = torch.cat(
            [layer.weight for layer in layers]
        )  # (n·d_model, d_model)
        biases = [layer.bias for layer in layers]
        bias = None if biases[0] is None else torch.cat(biases)  # (n·d_model,)
        out = F.linear(x, weight, bias)  # (B, L, n·d_model)
        return [
            self._split_heads(part) for part in out.chunk(len(layers), dim=-1)
        ]

    def _keys_values(
        self, key: Tensor, value: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """Project and split the keys and values, through the cache if there is
        one."""
        if cache is not None and cache.static and cache.key is not None:
            return (
                cache.key,
                cache.value,
            )  # the memory's, projected at the first step
        if key is value:  # the encoder's memory, in encoder-decoder attention
            k, v = self._project(
                key, self.w_k, self.w_v
            )  # (B, H, T_k, d_k) each
        else:
            (k,), (v,) = (
                self._project(key, self.w_k),
                self._project(value, self.w_v),
            )
        return self._cached(k, v, cache)

    @staticmethod
    def _cached(
        k: Tensor, v: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """The keys and values to attend over: with a self-attention cache, the
        new positions after the ones already decoded (dim 2: positions)."""
        if cache is not None:
            if not cache.static and cache.key is not None:
                k = torch.cat([cache.key, k], dim=2)  # (B, H, L + T_k, d_k)
                v = torch.cat([cache.value, v], dim=2)  # (B, H, L + T_k, d_k)
            cache.key, cache.value = k, v
        return k, v

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = False,
        *,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Multi-head attention of the queries over the keys and values.

        Shapes:
            query: (B, T_q, d_model); key, value: (B, T_k, d_model)
            mask: boolean, broadcastable to (B, H, T_q, T_k); True means "may
                attend"
            returns output (B, T_q, d_model) and, if need_weights, the weights
            (B, H, T_q, T_k), else None

        A query whose keys are all masked gets a zero attention output (before
        W^O). With a cache, key and value are the new positions only (or, for a
        static cache, the memory, read at the first call only); the keys are
        then all L positions cached, and the mask, if any, is broadcastable to
        (B, H, T_q, L).
        """
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(
                f"mask must be boolean (True = may attend), got {mask.dtype}"
            )
        if (
            query is key and key is value
        ):  # self-attention: Q, K and V in one product
            q, k, v = self._project(query, self.w_q, self.w_k, self.w_v)
            k, v = self._cached(k, v, cache)  # (B, H, T_k or L, d_k)
        else:
            (q,) = self._project(query, self.w_q)  # (B, H, T_q, d_k)
            k, v = self._keys_values(
                key, value, cache
            )  # (B, H, T_k or L, d_k)
        out, weights = self._attend(q, k, v, mask, need_weights)
        return self.w_o(self._merge_heads(out)), weights  # (B, T_q, d_model)


# %% [markdown]
# ## Checking it against the equation
#
# The function below follows the equation literally: for each head it takes that head's $d_k$
# rows of each projection, runs the attention function, concatenates the $H$ results and applies
# $W^O$. Both paths of the module agree with it on the decoder's two kinds of attention:
# self-attention under the target mask, and cross-attention over a padded source of $S$ = 5
# tokens.

# %% tags=["nbval-ignore-output"]
from transformer.attention import scaled_dot_product_attention
from transformer.masking import padding_mask, target_mask
from transformer.multihead import MultiHeadAttention


def head_by_head(mha, query, key, value, mask):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O, one head at a
    time."""
    heads = []
    for i in range(mha.n_heads):
        rows = slice(
            i * mha.d_k, (i + 1) * mha.d_k
        )  # head i's part of each projection
        q_i, k_i, v_i = [
            inputs @ linear.weight[rows].T + linear.bias[rows]  # (B, L, d_k)
            for linear, inputs in (
                (mha.w_q, query),
                (mha.w_k, key),
                (mha.w_v, value),
            )
        ]
        # The mask has no heads dimension here: (B, 1, 1 or T_q, T_k) -> (B, 1
        # or T_q, T_k).
        head, _ = scaled_dot_product_attention(q_i, k_i, v_i, mask=mask[:, 0])
        heads.append(head)
    return mha.w_o(torch.cat(heads, dim=-1))  # (B, T_q, d_model)


pad_id, bos_id = (
    0,
    1,
)  # a toy vocabulary, as in the masking chapter; words from 5 on
S = 5
tgt_ids = torch.tensor(
    [[bos_id, 5, 6, 7, pad_id, pad_id], [bos_id, 5, 6, 7, 8, 9]]
)
src_ids = torch.tensor([[5, 6, 7, pad_id, pad_id], [5, 6, 7, 8, 9]])
memory = torch.randn(B, S, d_model)  # stands in for the encoder's output

mha = MultiHeadAttention(d_model, H).eval()
with torch.no_grad():
    for name, args, mask in [
        ("self-attention", (x, x, x), target_mask(tgt_ids, pad_id)),
        (
            "cross-attention",
            (x, memory, memory),
            padding_mask(src_ids, pad_id),
        ),
    ]:
        expected = head_by_head(mha, *args, mask)
        fast, none = mha(*args, mask=mask)
        explicit, weights = mha(*args, mask=mask, need_weights=True)
        assert none is None and weights.shape == (B, H, T, args[1].size(1))
        assert torch.allclose(fast, expected, atol=1e-6)
        assert torch.allclose(explicit, expected, atol=1e-6)
        print(
            f"{name:16} largest difference: fast"
            f" {(fast - expected).abs().max():.1e}, explicit"
            f" {(explicit - expected).abs().max():.1e}"
        )

# %% [markdown]
# Below, the second source sentence is all padding, so its queries see no key in
# cross-attention. On both paths its output is just $W^O$'s bias, and every gradient stays
# finite. A width that does not split into heads, and a mask that is not boolean, are refused.

# %%
blind_src = torch.tensor([[1, 5, 6, pad_id, pad_id], [pad_id] * S])
blind_mask = padding_mask(
    blind_src, pad_id
)  # (B, 1, 1, S), all False for sentence 1
for need_weights in (False, True):
    mha.zero_grad()
    out, _ = mha(x, memory, memory, mask=blind_mask, need_weights=need_weights)
    out.sum().backward()
    assert not out.isnan().any()
    assert torch.allclose(
        out[1], mha.w_o.bias.expand(T, d_model)
    )  # W^O of zeros
    assert all(p.grad.isfinite().all() for p in mha.parameters())

try:
    MultiHeadAttention(d_model=512, n_heads=6)
except ValueError as error:
    print("ValueError:", error)
    assert "512" in str(error) and "6" in str(error)
else:
    raise AssertionError("expected a ValueError")
try:
    mha(x, x, x, mask=target_mask(tgt_ids, pad_id).float())
except TypeError as error:
    print("TypeError:", error)
    assert "boolean" in str(error) and "float32" in str(error)
else:
    raise AssertionError("expected a TypeError")

# %% [markdown]
# ## Keys and values kept for decoding
#
# The `cache` keyword takes a `KVCache`, which keeps a layer's projected keys and values between
# the steps of translation, so that each step projects only its new position. The decoding
# chapter explains it; the cell below checks that feeding the positions one at a time through a
# cache gives the causally masked result.

# %% tags=["nbval-ignore-output"]
from transformer.masking import causal_mask
from transformer.multihead import KVCache

with torch.no_grad():
    whole, _ = mha(x, x, x, mask=causal_mask(T))
    cache = KVCache()
    steps = [
        mha(x[:, t : t + 1], x[:, t : t + 1], x[:, t : t + 1], cache=cache)[0]
        for t in range(T)
    ]
    assert (torch.cat(steps, dim=1) - whole).abs().max() < 1e-6
    assert cache.key.shape == (B, H, T, d_k)

# %% [markdown]
# ## What the heads look at
#
# Even before training, the heads differ. Below, a layer of $H$ = 4 heads of $d_k$ = 8 attends
# over the attention chapter's six words, with random word vectors and projections initialised as
# in the model (Xavier uniform {cite:p}`glorot2010understanding`, zero biases). Compare a row
# across the four panels: a word puts its weight on different words in different heads, since
# each head measures similarity through its own $W_i^Q$ and $W_i^K$. The two *the* rows are
# still identical within each head: position is not yet known.

# %%
import altair as alt

from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
words = ["the", "cat", "sat", "on", "the", "mat"]
d_fig, H_fig = 32, 4
vectors = {w: torch.randn(d_fig) for w in sorted(set(words))}
X = torch.stack([vectors[w] for w in words]).unsqueeze(0)  # (1, T, d_model)
heads_layer = MultiHeadAttention(d_fig, H_fig)
for linear in (
    heads_layer.w_q,
    heads_layer.w_k,
    heads_layer.w_v,
    heads_layer.w_o,
):
    nn.init.xavier_uniform_(linear.weight)
    nn.init.zeros_(linear.bias)
with torch.no_grad():
    _, fig_weights = heads_layer(X, X, X, need_weights=True)  # (1, H, T, T)
favourite = fig_weights[0].argmax(
    dim=-1
)  # (H, T): each head's most-weighted key
assert (favourite != favourite[0]).any()  # the heads disagree somewhere
alt.hconcat(
    *(
        heatmap(
            fig_weights[0, h],
            x_labels=words,
            y_labels=words,
            title=f"head {h + 1}",
            cell=22,
        )
        for h in range(H_fig)
    )
).resolve_scale(color="shared").properties(
    title="Four heads of an untrained layer weight different words"
)

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
# 2. Build `MultiHeadAttention(64, 4, bias=True)`, back-propagate a random loss, and look at
#    `w_k.bias.grad`. Why is it zero? (A constant added to every score of a row leaves the
#    softmax unchanged.) Then compare with `bias=False`, the paper's layer.
# 3. Time the fast path against `need_weights=True` on a batch of long sequences, on the CPU and,
#    if you have one, a GPU.
