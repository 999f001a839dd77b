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
# One attention function gives each query one weighted average of the values, so it can express
# one kind of relation at a time: a query that should look both at its verb and at its article
# has to average the two. The paper's remedy {cite:p}`vaswani2017attention` (Section 3.2.2) is to
# run several attention functions side by side, each on its own learned projection of the
# queries, keys and values into a narrower space, and to combine their results:
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
# $d_k = d_v = d_\text{model} / h = 64$ dimensions. In the paper's words, "multi-head attention
# allows the model to jointly attend to information from different representation subspaces at
# different positions. With a single attention head, averaging inhibits this." In the code, $h$ is
# `n_heads` and the prose writes $H$ for the heads dimension of a tensor.
#
# This chapter writes the layer as `transformer.multihead.MultiHeadAttention`, shows how the $H$
# projections become one matrix product and a reshape, checks it against the equation computed
# head by head, counts its cost against one full-width head, and draws what the heads of an
# untrained layer look at.

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
#| default_exp multihead

# %%
import pandas as pd
import torch
from torch import nn

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## All heads in one matrix product
#
# The $H$ query projections $W_1^Q, \dots, W_H^Q$ are $d_\text{model} \times d_k$ matrices applied
# to the same input. Placed side by side they form one $d_\text{model} \times H d_k =
# d_\text{model} \times d_\text{model}$ matrix, so one `nn.Linear(d_model, d_model)` computes all
# $H$ projections in a single matrix product, and head $i$'s queries are columns
# $i d_k, \dots, (i+1) d_k - 1$ of the result. Reshaping the last dimension into $(H, d_k)$ and
# moving the heads in front of the positions gives a tensor $(B, H, T, d_k)$, on which chapter 1's
# attention runs every head of every sentence at once, because it broadcasts over the leading
# dimensions. Concatenating the heads is the same reshape backwards. The shapes, for a batch of
# $B$ = 2 sentences of $T$ = 6 tokens, $d_\text{model}$ = 16 and $H$ = 4 heads:

# %%
B, T, d_model, H = 2, 6, 16, 4
d_k = d_model // H
x = torch.randn(B, T, d_model)
w_q = nn.Linear(d_model, d_model)
steps = {"x": x}
steps["w_q(x)"] = w_q(x)  # (B, T, d_model): all H heads' queries side by side
steps[".view(B, T, H, d_k)"] = steps["w_q(x)"].view(B, T, H, d_k)  # (B, T, H, d_k)
steps[".transpose(1, 2)"] = steps[".view(B, T, H, d_k)"].transpose(
    1, 2
)  # (B, H, T, d_k)
q = steps[".transpose(1, 2)"]
for name, t in steps.items():
    print(f"{name:20} {tuple(t.shape)}")

# Head i's queries are columns i*d_k ... (i+1)*d_k - 1 of the one big projection.
i = 2
assert torch.equal(q[:, i], steps["w_q(x)"][..., i * d_k : (i + 1) * d_k])
# Concatenation undoes the split exactly.
assert torch.equal(q.transpose(1, 2).reshape(B, T, d_model), steps["w_q(x)"])

# %% [markdown]
# ## The module
#
# `MultiHeadAttention` holds the four $d_\text{model} \times d_\text{model}$ projections `w_q`,
# `w_k`, `w_v` (each the $H$ per-head matrices side by side) and `w_o` ($W^O$).
#
# **A deviation: biases.** The paper's projections have none: $\mathrm{head}_i$ and
# $\mathrm{MultiHead}$ above are pure matrix products, and the reference code (tensor2tensor)
# builds them without biases. Ours add a bias vector to each of the four projections by default,
# as PyTorch's `nn.MultiheadAttention` and the Annotated Transformer (plain `nn.Linear` layers)
# do; `bias=False` gives the paper's layer. The cost is $4 d_\text{model}$ parameters per
# attention block, in all 18 blocks of the base model 36,864, 0.06% of it (counted below the
# module).
# The book's trained models were trained with the biases, so the default stays. One of the four
# does nothing at all: $W^K$'s bias $b_K$ adds $q \cdot b_K / \sqrt{d_k}$ to every score of the
# query $q$, the same amount for every key, and the softmax removes a constant added to a whole
# row. Its gradient is therefore zero, up to rounding (checked below the module).
#
# The module's `forward` takes queries, keys and values separately, because the model uses it
# three ways: encoder self-attention ($Q = K = V$ = the encoder's input), decoder self-attention
# (the same, under the target mask), and decoder cross-attention (queries from the decoder, keys
# and values from the encoder's output). Masks are those of chapter 2, broadcastable to
# $(B, H, T_q, T_k)$.
#
# Attention itself has two paths:
#
# - **Fast** (the default, `need_weights=False`): PyTorch's
#   `torch.nn.functional.scaled_dot_product_attention`. On a GPU it runs fused kernels that never
#   store the $(B, H, T_q, T_k)$ weight matrix, which is why it cannot return the weights.
# - **Explicit** (`need_weights=True`): chapter 1's `scaled_dot_product_attention`, which returns
#   the weights, for the figures of this book.
#
# Both give the same output. One case needs care: a query whose keys are *all* masked (an
# all-padding sentence, say) has a row of $-\infty$ scores. Chapter 1 defines its output as zero.
# PyTorch's function returns zeros there too since version 2.5, the oldest this project accepts,
# but it returned NaN before, its fused kernels have differed among themselves on this case, and
# one NaN row is enough to turn every gradient of the model into NaN in the backward pass. So the
# fast path does not rely on the kernel: it lets such a row see every key (a finite, meaningless
# result), then overwrites its output with zeros, which also gives that row a zero gradient.
#
# Dropout on the attention weights is an option that defaults to 0: the paper applies dropout to
# the output of each sublayer and to the embedding sums only (see
# [the sublayers chapter](05_sublayers.ipynb)).
#
# One keyword serves translation, which writes the output one token at a time: `cache`, a
# `KVCache` that keeps the layer's keys and values, already projected and split into heads,
# from one call to the next. A self-attention cache grows by the new position at each call; a
# cache marked `static` (for attention over the encoder's output, which does not change while a
# sentence is translated) projects its keys and values at the first call and reuses them. The
# section [Keys and values kept for decoding](#kv-cache) below checks it, and
# [the decoding chapter](15_decoding.ipynb) explains why it matters.

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
    """One attention layer's keys and values, split into heads, kept between decoding steps.

    A self-attention cache (static=False) appends the new positions' keys and values at each
    call; a static one (encoder-decoder attention) projects the memory at its first call and
    reuses the result. MultiHeadAttention.forward updates it in place.

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
        """Keep batch rows `index` (B',), in that order: beam search following its beams."""
        if self.key is not None:
            self.key = self.key.index_select(0, index)  # (B', H, L, d_k)
            self.value = self.value.index_select(0, index)  # (B', H, L, d_k)


class MultiHeadAttention(nn.Module):
    """Concat(head_1, ..., head_H) W^O, with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."""

    def __init__(
        self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True
    ) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads != 0:
            raise ValueError(
                f"d_model ({d_model}) must be a multiple of n_heads ({n_heads})"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        # The H per-head projections W_i^Q (d_model x d_k) side by side: one d_model x d_model.
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        # Dropout on the attention weights; 0 in the paper, which never drops them.
        self.attn_dropout = nn.Dropout(dropout)

    def _split_heads(self, x: Tensor) -> Tensor:
        B, L, _ = x.shape
        return x.view(B, L, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, L, d_k)

    def _merge_heads(self, x: Tensor) -> Tensor:
        B, _, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, self.d_model)  # (B, L, d_model)

    def _attend(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool
    ) -> tuple[Tensor, Tensor | None]:
        """Attention of every head at once: (B, H, T_q, d_k) -> (B, H, T_q, d_k)."""
        if need_weights:
            return scaled_dot_product_attention(
                q, k, v, mask=mask, dropout=self.attn_dropout
            )
        if mask is None:
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=self.attn_dropout.p if self.training else 0.0
            )
            return out, None
        # A query that may see no key is a row of -inf scores: what a kernel makes of it
        # differs between kernels and versions (NaN in some), and a NaN in one row reaches
        # every parameter in the backward pass. Let such rows see every key, then zero them.
        blind = ~mask.any(dim=-1, keepdim=True)  # (B, 1 or H, T_q, 1)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask | blind,
            dropout_p=self.attn_dropout.p if self.training else 0.0,
        )
        return out.masked_fill(blind, 0.0), None

    def _keys_values(
        self, key: Tensor, value: Tensor, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """Project and split the keys and values, through the cache if there is one."""
        if cache is not None and cache.static and cache.key is not None:
            return cache.key, cache.value  # the memory's, projected at the first step
        k = self._split_heads(self.w_k(key))  # (B, H, T_k, d_k)
        v = self._split_heads(self.w_v(value))  # (B, H, T_k, d_k)
        if cache is not None:
            if not cache.static and cache.key is not None:
                # The new positions follow the ones already decoded (dim 2: positions).
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
            mask: boolean, broadcastable to (B, H, T_q, T_k); True means "may attend"
            returns output (B, T_q, d_model) and, if need_weights, the weights
            (B, H, T_q, T_k), else None

        A query whose keys are all masked gets a zero attention output (before W^O).
        With a cache, key and value are the new positions only (or, for a static cache, the
        memory, read at the first call only); the keys are then all L positions cached, and
        the mask, if any, is broadcastable to (B, H, T_q, L).
        """
        if mask is not None and mask.dtype != torch.bool:
            raise TypeError(
                f"mask must be boolean (True = may attend), got {mask.dtype}"
            )
        q = self._split_heads(self.w_q(query))  # (B, H, T_q, d_k)
        k, v = self._keys_values(key, value, cache)  # (B, H, T_k or L, d_k)
        out, weights = self._attend(q, k, v, mask, need_weights)
        return self.w_o(self._merge_heads(out)), weights  # (B, T_q, d_model)


# %% [markdown]
# The biases, counted for the base model's layer ($d_\text{model}$ = 512, $H$ = 8) and for its
# 18 attention blocks: one self-attention in each of the 6 encoder layers, and a self-attention
# and a cross-attention in each of the 6 decoder layers. The base model's total,
# 63,082,496 parameters, is counted in [the model chapter](09_model.ipynb).

# %%
from transformer.multihead import MultiHeadAttention

# On the meta device the layers have shapes but no memory, and draw no random numbers.
with torch.device("meta"):
    with_bias, without_bias = (
        sum(p.numel() for p in MultiHeadAttention(512, 8, bias=b).parameters())
        for b in (True, False)
    )
per_block = with_bias - without_bias
assert per_block == 4 * 512  # one bias vector of d_model per projection
blocks = 6 * 1 + 6 * 2
base_model = 63_082_496  # the model chapter's count for the base model
share = blocks * per_block / base_model
print(
    f"{per_block:,} bias parameters per attention block, "
    f"{blocks} x {per_block:,} = {blocks * per_block:,} in the base model: {share:.2%}"
)
assert blocks * per_block == 36_864 and share < 0.001

# W^K's bias shifts each query's scores by a constant: no gradient reaches it. (Forking
# the generator leaves the random numbers of the later cells as they were.)
with torch.random.fork_rng():
    torch.manual_seed(0)
    probe = MultiHeadAttention(64, 4)
    tokens = torch.randn(2, 5, 64)
    (probe(tokens, tokens, tokens)[0] * torch.randn(2, 5, 64)).sum().backward()
assert probe.w_k.bias.grad.abs().max() < 1e-5 * probe.w_q.bias.grad.abs().max()

# %% [markdown]
# ## Checking it against the equation
#
# The class computes all heads at once; the equation computes them one at a time. The function
# below follows the equation literally: for each head it takes that head's $d_k$ rows of the
# projection weights ($W_i^Q$, $W_i^K$, $W_i^V$ and their biases), runs chapter 1's attention,
# concatenates the $H$ results and applies $W^O$. We compare it with the module on the decoder's
# two kinds of attention: self-attention under chapter 2's target mask, and cross-attention over
# a padded source of $S$ = 5 tokens under its padding mask.

# %% tags=["nbval-ignore-output"]
from transformer.attention import scaled_dot_product_attention
from transformer.masking import padding_mask, target_mask
from transformer.multihead import MultiHeadAttention


def head_by_head(mha, query, key, value, mask):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W^O, one head at a time."""
    heads = []
    for i in range(mha.n_heads):
        rows = slice(i * mha.d_k, (i + 1) * mha.d_k)  # head i's part of each projection
        q_i, k_i, v_i = [
            inputs @ linear.weight[rows].T + linear.bias[rows]  # (B, L, d_k)
            for linear, inputs in ((mha.w_q, query), (mha.w_k, key), (mha.w_v, value))
        ]
        # The mask has no heads dimension here: (B, 1, 1 or T_q, T_k) -> (B, 1 or T_q, T_k).
        head, _ = scaled_dot_product_attention(q_i, k_i, v_i, mask=mask[:, 0])
        heads.append(head)
    return mha.w_o(torch.cat(heads, dim=-1))  # (B, T_q, d_model)


specials = ["<pad>", "<bos>", "<eos>"]  # a toy vocabulary, as in the masking chapter
pad_id, bos_id = specials.index("<pad>"), specials.index("<bos>")
S = 5
# (B, T) targets and (B, S) sources: ids from 5 on stand for words, and only where the
# padding is matters to the masks.
tgt_ids = torch.tensor([[bos_id, 5, 6, 7, pad_id, pad_id], [bos_id, 5, 6, 7, 8, 9]])
src_ids = torch.tensor([[5, 6, 7, pad_id, pad_id], [5, 6, 7, 8, 9]])
memory = torch.randn(B, S, d_model)  # stands in for the encoder's output

mha = MultiHeadAttention(d_model, H).eval()
with torch.no_grad():
    for name, args, mask in [
        ("self-attention", (x, x, x), target_mask(tgt_ids, pad_id)),
        ("cross-attention", (x, memory, memory), padding_mask(src_ids, pad_id)),
    ]:
        expected = head_by_head(mha, *args, mask)
        fast, none = mha(*args, mask=mask)
        explicit, weights = mha(*args, mask=mask, need_weights=True)
        assert none is None and weights.shape == (B, H, T, args[1].size(1))
        assert torch.allclose(fast, expected, atol=1e-6)
        assert torch.allclose(explicit, expected, atol=1e-6)
        print(
            f"{name:16} largest difference: fast {(fast - expected).abs().max():.1e}, "
            f"explicit {(explicit - expected).abs().max():.1e}"
        )

# %% [markdown]
# (The tests in `tests/test_multihead.py` also compare the module with PyTorch's
# `torch.nn.MultiheadAttention` given the same weights. PyTorch's module uses the opposite
# boolean convention for its masks, `True` meaning *not allowed*, so the masks are inverted
# there.)
#
# Now the case that needs care: a query that may see no key. The second source sentence below is
# all padding, so every query of the second sentence is blind in cross-attention. Both paths give
# it a zero attention output, so the layer's output is just the bias of $W^O$, and the gradients
# of all parameters stay finite.

# %%
blind_src = torch.tensor([[1, 5, 6, pad_id, pad_id], [pad_id] * S])
blind_mask = padding_mask(blind_src, pad_id)  # (B, 1, 1, S), all False for sentence 1
for need_weights in (False, True):
    mha.zero_grad()
    out, _ = mha(x, memory, memory, mask=blind_mask, need_weights=need_weights)
    out.sum().backward()
    assert not out.isnan().any()
    assert torch.allclose(
        out[1], mha.w_o.bias.expand(T, d_model)
    )  # W^O applied to zeros
    assert all(p.grad.isfinite().all() for p in mha.parameters())
    print(f"need_weights={need_weights}: the blind sentence's output is W^O's bias")

# %% [markdown]
# A layer whose width does not split evenly into heads is refused when it is built, with both
# numbers in the message; so is a mask that is not boolean, since a float mask would be *added*
# to the scores by PyTorch's function but not by ours.

# %%
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
# (kv-cache)=
# ## Keys and values kept for decoding
#
# When the decoder translates, it produces one token per step, and at step $t$ its
# self-attention needs the keys and values of positions $0, \dots, t$. Those of positions
# $0, \dots, t-1$ were already computed at the earlier steps and, thanks to the causal mask,
# have not changed since. A `KVCache` keeps them: each call projects only the new position, appends
# its key and value, and lets the new query attend over all of them. The check below feeds the
# $T$ positions of `x` one at a time through a cache and compares the outputs with one call over
# the whole sequence under chapter 2's causal mask; a single query at the end of the sequence may
# see every cached key, so it needs no mask. A static cache, for encoder–decoder attention,
# projects the memory once: its keys at the last step are the very tensor of the first.

# %% tags=["nbval-ignore-output"]
from transformer.masking import causal_mask
from transformer.multihead import KVCache

with torch.no_grad():
    whole, _ = mha(x, x, x, mask=causal_mask(T))
    cache = KVCache()
    outputs = []
    for t in range(T):
        new = x[:, t : t + 1]  # (B, 1, d_model): the newest position only
        outputs.append(mha(new, new, new, cache=cache)[0])
    one_at_a_time = torch.cat(outputs, dim=1)  # (B, T, d_model)
    assert cache.key.shape == cache.value.shape == (B, H, T, d_k)
    difference = (one_at_a_time - whole).abs().max()
    assert difference < 1e-6
    print(
        f"one position at a time vs the whole sequence: largest difference {difference:.1e}"
    )

    cross = KVCache(static=True)
    for t in range(T):
        mha(x[:, t : t + 1], memory, memory, cache=cross)
        if t == 0:
            first_keys = cross.key
    assert cross.key is first_keys and cross.length == S

# %% [markdown]
# ## What it costs
#
# "Due to the reduced dimension of each head, the total computational cost is similar to that of
# single-head attention with full dimensionality" (Section 3.2.2). Count the floating-point
# operations (two per multiply-add) of a self-attention layer over $T$ positions:
#
# - the four projections $W^Q, W^K, W^V, W^O$: $4 \cdot 2 T d_\text{model}^2$, whatever $H$ is,
#   since together the $H$ heads' projections are one $d_\text{model} \times d_\text{model}$
#   matrix;
# - the scores $QK^\top$: $H$ heads of $T \times T$ dot products of width $d_k$, so
#   $2 H T^2 d_k = 2 T^2 d_\text{model}$, again independent of $H$; and the same for the weighted
#   sum of the values;
# - the softmax, one exponential per score: $H T^2$, the only term that grows with $H$.
#
# The table evaluates these formulas for the base model's $d_\text{model}$ = 512 and a sentence of
# $T$ = 32 tokens, in millions of operations, and in the last column lets PyTorch count the
# matrix products that the module actually runs (its `FlopCounterMode`, on the explicit path).

# %%
from torch.utils.flop_counter import FlopCounterMode


def attention_flops(T: int, d_model: int, n_heads: int) -> dict:
    d_k = d_model // n_heads
    return {
        "heads": n_heads,
        "d_k": d_k,
        "projections": 4 * 2 * T * d_model * d_model,
        "QKᵀ": n_heads * 2 * T * T * d_k,
        "weights·V": n_heads * 2 * T * T * d_k,
        "softmax": n_heads * T * T,
    }


T_cost, d_cost = 32, 512
rows = []
for n_heads in (1, 2, 4, 8, 16, 32):
    row = attention_flops(T_cost, d_cost, n_heads)
    layer = MultiHeadAttention(d_cost, n_heads)
    tokens = torch.randn(1, T_cost, d_cost)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(tokens, tokens, tokens, need_weights=True)
    row["matrix products, counted"] = counter.get_total_flops()
    rows.append(row)
flops = pd.DataFrame(rows).set_index("heads")
matmul = flops["projections"] + flops["QKᵀ"] + flops["weights·V"]
assert (flops["matrix products, counted"] == matmul).all()  # the formulas are right
assert (matmul == matmul.iloc[0]).all()  # the same for every number of heads
flops.insert(5, "total", matmul + flops["softmax"])
in_millions = (flops.drop(columns="d_k") / 1e6).round(3)
in_millions.insert(0, "d_k", flops["d_k"])
in_millions

# %%
softmax_share = (flops["softmax"] / flops["total"]).max()
print(f"the softmax is at most {softmax_share:.2%} of the total")
assert softmax_share < 0.01

# %% [markdown]
# Every matrix-product column is the same for 1 head of width 512 and for 32 heads of width 16, and
# the counter confirms the formulas; only the softmax, and with it the total, grows with $H$, by a
# hair. What grows in earnest with $H$ is memory: the explicit path stores $H$ weight matrices of
# $T \times T$, which the fused kernels of the fast path avoid. At this sentence length the
# projections dominate: the two $T^2$ terms, $4 T^2 d_\text{model}$ together, overtake the
# projections' $8 T d_\text{model}^2$ only beyond $T = 2 d_\text{model}$. The paper's Table 3 (rows
# A) varies $H$ at this constant cost: "while single-head attention is 0.9 BLEU worse than the best
# setting, quality also drops off with too many heads."

# %% [markdown]
# ## What the heads look at
#
# Even before training, the heads differ. Below is a layer of $H$ = 4 heads of $d_k$ = 8 on the
# six words of chapter 1's sentence, with random word vectors and projections initialised as the
# model's will be (Xavier uniform weights {cite:p}`glorot2010understanding`, zero biases). Each
# head has its own random $W_i^Q$ and $W_i^K$, so each measures similarity in its own way:
# compare a row across the four panels and you will see a word put its weight on different words
# in different heads. (The two *the* rows are identical within each head, as in chapter 1:
# nothing tells the layer where a word stands until the [positional encoding](04_embeddings.ipynb)
# is added.)

# %%
import altair as alt

from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
words = ["the", "cat", "sat", "on", "the", "mat"]
d_fig, H_fig = 32, 4
vectors = {w: torch.randn(d_fig) for w in sorted(set(words))}
X = torch.stack([vectors[w] for w in words]).unsqueeze(0)  # (1, T, d_model)
heads_layer = MultiHeadAttention(d_fig, H_fig)
for linear in (heads_layer.w_q, heads_layer.w_k, heads_layer.w_v, heads_layer.w_o):
    nn.init.xavier_uniform_(linear.weight)
    nn.init.zeros_(linear.bias)
with torch.no_grad():
    _, fig_weights = heads_layer(X, X, X, need_weights=True)  # (1, H, T, T)
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
# The same figure in words: the key that each head's query weights most.

# %%
favourite = fig_weights[0].argmax(dim=-1)  # (H, T)
table = pd.DataFrame(
    {f"head {h + 1}": [words[j] for j in favourite[h]] for h in range(H_fig)},
    index=pd.Index(words, name="query"),
)
disagree = (favourite != favourite[0]).any(dim=0).sum().item()
print(
    f"the heads disagree on the most-weighted key for {disagree} of {len(words)} queries"
)
assert disagree > 0
table

# %% [markdown]
# Training turns these random notions of similarity into learned ones; the results chapter draws
# the heads of the trained model. The next chapter adds what the heads here are missing: where
# each word stands in the sentence.
