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
# # Masks: padding and the future
#
# Scaled dot-product attention lets every query look at every key. Two kinds of key must be hidden
# from view. **Padding**: sentences are batched together, so the shorter ones are filled up to the
# longest with a `<pad>` token that is not part of the sentence and must not change its meaning.
# **The future**: the decoder is trained on whole target sentences at once, and a position must not
# read the words it is being trained to predict. The paper describes the second, for the
# decoder's self-attention: it hides the future positions inside the attention function "by
# masking out (setting to $-\infty$) all values in the input of the softmax which correspond to
# illegal connections" {cite:p}`vaswani2017attention` (Section 3.2.3). It does not discuss
# padding, but implementations hide padded keys with the same $-\infty$ trick, and so does this
# book.
#
# This chapter writes the three masks the model needs as small pure functions in
# `transformer.masking`, draws them for a padded batch, explains how their shapes broadcast over
# heads and queries, and checks with chapter 1's attention that the causal mask does what the
# paper asks: an output never depends on a later token.

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
#| default_exp masking

# %%
import pandas as pd
import torch

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## A padded target batch
#
# Take two target sentences of different lengths, *a dog runs* and *two dogs play in snow*, and a
# toy vocabulary whose first entries are the special tokens. The ids of `<pad>`, `<bos>` and
# `<eos>` are looked up in the vocabulary, never written as numbers: in the real model they come
# from the tokenizer ([the data chapter](10_data.ipynb)).

# %%
specials = ["<pad>", "<bos>", "<eos>"]
sentences = [["a", "dog", "runs"], ["two", "dogs", "play", "in", "snow"]]
vocab = {
    t: i for i, t in enumerate(specials + sorted({w for s in sentences for w in s}))
}
pad_id, bos_id, eos_id = vocab["<pad>"], vocab["<bos>"], vocab["<eos>"]

# %% [markdown]
# During training the decoder reads the whole target sentence at once. Its input is the sentence
# shifted right by one position behind a `<bos>` token, and its labels are the sentence followed by
# `<eos>`: the paper's "output embeddings are offset by one position" (Section 3.1). For a target
# $y_1 \dots y_n$ the decoder input is $\texttt{<bos>}\, y_1 \dots y_n$ and the labels are
# $y_1 \dots y_n\, \texttt{<eos>}$, so that, writing $y_0 = \texttt{<bos>}$ and
# $y_{n+1} = \texttt{<eos>}$, position $t$ holds $y_t$ and is trained to predict $y_{t+1}$. Both
# are padded to the longest sentence of the batch, $T$ tokens:

# %%
T = max(len(s) for s in sentences) + 1
decoder_input = [["<bos>", *s] + ["<pad>"] * (T - 1 - len(s)) for s in sentences]
labels = [[*s, "<eos>"] + ["<pad>"] * (T - 1 - len(s)) for s in sentences]
tgt = torch.tensor([[vocab[t] for t in row] for row in decoder_input])  # (B, T)
pd.DataFrame(
    {
        f"sentence {b}, {kind}": rows[b]
        for b in range(len(sentences))
        for kind, rows in (("input", decoder_input), ("label", labels))
    }
).rename_axis("position")

# %% [markdown]
# ## The three masks
#
# A mask is a boolean tensor in which `True` means *may attend*, broadcastable to
# $(B, H, T_q, T_k)$: one entry for every sentence, head, query and key (the book's convention,
# shared with `torch.nn.functional.scaled_dot_product_attention`).
#
# - `padding_mask(ids, pad_id)` is `True` at the real tokens of a batch of ids $(B, S)$. Its shape
#   is $(B, 1, 1, S)$: padding hides *keys*, and the same row serves every head and every query.
# - `causal_mask(T)` is the lower triangle of a $T \times T$ matrix, diagonal included: query $t$
#   may attend to keys $0, \dots, t$. Its shape is $(1, 1, T, T)$, the same for every sentence and
#   head.
# - `target_mask(ids, pad_id)` is both at once for the decoder's self-attention, $(B, 1, T, T)$.

# %%
#| export
"""Attention masks: boolean, True means "may attend", broadcastable to (B, H, T_q, T_k)."""

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: (B, S) token ids -> (B, 1, 1, S), False at padding."""
    if ids.dim() != 2:
        raise ValueError(f"ids must be (B, S) token ids, got shape {tuple(ids.shape)}")
    # One row shared by every head and every query: padding hides keys, not queries.
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """Position t may attend to positions <= t: (1, 1, T, T), lower triangle and diagonal."""
    ones = torch.ones(size, size, dtype=torch.bool, device=device)
    return ones.tril()[None, None]  # (1, 1, T, T)


def target_mask(ids: Tensor, pad_id: int) -> Tensor:
    """The decoder's self-attention mask: (B, T) ids -> (B, 1, T, T), causal and not padding."""
    return padding_mask(ids, pad_id) & causal_mask(ids.size(-1), device=ids.device)


# %% [markdown]
# For our batch of two sentences of at most six tokens:

# %%
from transformer.masking import causal_mask, padding_mask, target_mask

B = len(sentences)
pad = padding_mask(tgt, pad_id)
causal = causal_mask(T)
both = target_mask(tgt, pad_id)
assert pad.shape == (B, 1, 1, T) and causal.shape == (1, 1, T, T)
assert both.shape == (B, 1, T, T)
assert pad.dtype == causal.dtype == both.dtype == torch.bool
assert pad[0, 0, 0].tolist() == [True, True, True, True, False, False]
assert pad[1].all()
assert torch.equal(both, pad & causal)
pad.squeeze(1).squeeze(1), causal[0, 0]

# %% [markdown]
# The three heatmaps below are the masks of the first, padded, sentence, each as a $T \times T$
# grid of queries (rows) by keys (columns); dark means *may attend*. Look at how the combination
# keeps a key only where both masks keep it: on or below the diagonal and left of the first
# `<pad>`. Note also the two `<pad>` *rows* at the bottom of the right panel: they are not empty,
# because the padding mask hides padded keys, not padded queries (more on those rows below).

# %%
import altair as alt

from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
tokens = decoder_input[0]
panels = {
    "padding mask": pad[0, 0].expand(T, T),  # the (1, T) row, seen by every query
    "causal mask": causal[0, 0],
    "target mask = padding & causal": both[0, 0],
}
alt.hconcat(
    *(
        heatmap(m, x_labels=tokens, y_labels=tokens, value="may attend", title=name)
        for name, m in panels.items()
    )
).resolve_scale(color="shared")

# %% [markdown]
# ## How the shapes broadcast
#
# The attention scores of a multi-head layer are $(B, H, T_q, T_k)$. None of the masks is stored at
# that size: each keeps a dimension of size 1 wherever its value does not depend on the index,
# and PyTorch's broadcasting repeats it. A padding mask depends only on the sentence and the key;
# a causal mask only on the query and the key. The table lists where each mask is used and what
# it broadcasts to for $H$ = 8 heads, checked with `torch.broadcast_shapes`; the source here is a
# batch of $S$ = 7 tokens.

# %%
H, S = 8, 7
src = torch.full((B, S), vocab["dog"])  # any source batch of S tokens
uses = [
    ("encoder self-attention", "padding_mask(src)", padding_mask(src, pad_id), S, S),
    ("decoder self-attention", "target_mask(tgt)", both, T, T),
    ("decoder cross-attention", "padding_mask(src)", padding_mask(src, pad_id), T, S),
]
rows = []
for where, call, m, T_q, T_k in uses:
    scores = (B, H, T_q, T_k)
    assert torch.broadcast_shapes(m.shape, scores) == scores
    rows.append(
        {
            "attention": where,
            "mask": call,
            "stored shape": tuple(m.shape),
            "scores (B, H, T_q, T_k)": scores,
        }
    )
pd.DataFrame(rows).set_index("attention")

# %% [markdown]
# In cross-attention the queries are target positions and the keys are source positions, so the
# same source padding mask serves as a $(B, 1, 1, S)$ row for all $T$ target queries. There is no
# causal mask there: the whole source sentence is known before decoding starts.

# %% [markdown]
# ## Why the decoder must not see the future
#
# At translation time the decoder writes the target one token at a time: to choose $y_{t+1}$ it
# has only $\texttt{<bos>}\, y_1 \dots y_t$, because nothing to the right exists yet. During
# training it reads the whole shifted target at once, so that all $T$ positions are trained in
# parallel, and position $t$'s input row sits next to positions $t+1, t+2, \dots$ whose input
# tokens *are* the labels $y_{t+1}, y_{t+2}, \dots$ If position $t$ could attend to position
# $t+1$, it could copy the label instead of predicting it: the training loss would fall towards
# zero and the model would learn nothing it can use when the future is missing. The paper
# therefore masks every key to the right of the query, "to prevent leftward information flow in
# the decoder to preserve the auto-regressive property" (Section 3.2.3), and notes that the mask
# together with the offset "ensures that the predictions for position $i$ can depend only on the
# known outputs at positions less than $i$" (Section 3.1).
#
# A demonstration with chapter 1's `scaled_dot_product_attention`. Give every token a random
# vector, attend with $Q = K = V = X$ under the causal mask, then change the last word of the
# second sentence (*snow* becomes *dog*). The outputs of all earlier positions do not change at
# all; without the mask every one of them does.

# %%
from transformer.attention import scaled_dot_product_attention

d_k = 8
embedding = torch.randn(len(vocab), d_k)
before = tgt[1].clone()  # <bos> two dogs play in snow
after = before.clone()
after[-1] = vocab["dog"]  # ... in dog
X, X_changed = embedding[before], embedding[after]  # (T, d_k)

for mask in (causal[0, 0], None):
    out, _ = scaled_dot_product_attention(X, X, X, mask=mask)
    out_changed, _ = scaled_dot_product_attention(
        X_changed, X_changed, X_changed, mask=mask
    )
    same = (out[:-1] == out_changed[:-1]).all(dim=-1)
    print(f"{'causal mask' if mask is not None else 'no mask':12}", same.tolist())
    if mask is not None:
        assert same.all()  # earlier positions are bit-for-bit unchanged
    else:
        assert not same.any()  # every earlier position saw the change

# %% [markdown]
# The same fact, stated the other way round: the masked computation over the whole sentence gives,
# at every position $t$, exactly what attention over the prefix $0, \dots, t$ alone gives, with no
# mask at all. Training all positions in parallel is therefore the same computation as generating
# one token at a time. (A whole decoder keeps this property: its other sublayers work on each
# position separately, so a stack of causally masked layers is causal too.)

# %%
out, _ = scaled_dot_product_attention(X, X, X, mask=causal[0, 0])
for t in range(T):
    prefix = X[: t + 1]
    step, _ = scaled_dot_product_attention(prefix, prefix, prefix)
    assert torch.allclose(out[t], step[-1], atol=1e-6)
print(f"all {T} positions match their prefix-only computation")

# %% [markdown]
# ## What padding changes, and what it does not
#
# Padding must not change a sentence's meaning: with the target mask, the real positions of the
# padded first sentence get exactly the outputs they get when the sentence is processed alone,
# unpadded, whatever vectors the `<pad>` tokens have.

# %%
alone = tgt[0, : len(sentences[0]) + 1]  # <bos> a dog runs
n = len(alone)
x_alone = embedding[alone]  # (n, d_k)
out_alone, _ = scaled_dot_product_attention(
    x_alone, x_alone, x_alone, mask=causal_mask(n)[0, 0]
)

x_batch = embedding[tgt]  # (B, T, d_k), <pad> positions hold the <pad> vector
out_batch, w_batch = scaled_dot_product_attention(
    x_batch, x_batch, x_batch, mask=both[:, 0]
)
assert torch.allclose(out_batch[0, :n], out_alone, atol=1e-6)

x_scrambled = x_batch.clone()
x_scrambled[0, n:] = 100 * torch.randn(T - n, d_k)  # whatever the padding holds
out_scrambled, _ = scaled_dot_product_attention(
    x_scrambled, x_scrambled, x_scrambled, mask=both[:, 0]
)
assert torch.allclose(out_scrambled[0, :n], out_alone, atol=1e-6)

# %% [markdown]
# And the padded *queries*? The heatmap shows the attention weights of the first sentence under the
# target mask. The rows of the real tokens put no weight on `<pad>` keys. The two `<pad>` rows at
# the bottom still attend, to the real tokens on their left: a `<pad>` query always has at least
# `<bos>` to look at, so its row is never fully masked and never NaN. Its output is meaningless but
# harmless. It never reaches a real position, since no real query attends to it, and the loss
# skips positions whose label is `<pad>` (see [label smoothing](11_label_smoothing.ipynb)).
# Masking those query rows as well would only replace finite garbage with zeros that the loss
# ignores just the same.

# %%
heatmap(
    w_batch[0],
    x_labels=tokens,
    y_labels=tokens,
    title="Weights under the target mask: <pad> queries still attend",
)

# %%
pad_keys = ~pad[0, 0, 0]
assert (w_batch[0][:, pad_keys] == 0).all()  # no query attends to a <pad> key
assert torch.allclose(w_batch[0, n:].sum(-1), torch.ones(T - n))  # <pad> queries attend

# %% [markdown]
# The masks are ready for the model: the next chapter splits attention into several heads, and
# the $H$ dimension of size 1 in every mask is what lets one mask serve all of them.
