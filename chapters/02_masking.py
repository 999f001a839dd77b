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
# Scaled dot-product attention lets every query look at every key. Two kinds of key must be
# hidden. **Padding**: sentences are batched together, so the shorter ones are filled up with a
# `<pad>` token that is not part of the sentence. **The future**: the decoder is trained on whole
# target sentences at once, and a position must not read the words it is being trained to
# predict. The paper hides the future inside the attention function "by masking out (setting to
# $-\infty$) all values in the input of the softmax which correspond to illegal connections"
# {cite:p}`vaswani2017attention` (Section 3.2.3); padded keys are hidden the same way.
#
# This chapter writes the masks as small pure functions in `transformer.masking`, shows how their
# shapes broadcast, and checks that under the causal mask an output never depends on a later
# token.

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
#| default_exp masking

# %%
import pandas as pd
import torch

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## A padded target batch
#
# Two target sentences, *a dog runs* and *two dogs play in snow*, over a toy vocabulary whose
# first entries are the special tokens; in the model their ids come from the tokenizer. The
# decoder's input is the sentence shifted right behind `<bos>` and its labels are the sentence
# followed by `<eos>`, the paper's "output embeddings are offset by one position" (Section 3.1):
# position $t$ holds $y_t$ and is trained to predict $y_{t+1}$. Both are padded to $T$ tokens.

# %%
sentences = [["a", "dog", "runs"], ["two", "dogs", "play", "in", "snow"]]
words = sorted({w for s in sentences for w in s})
vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", *words])}
pad_id = vocab["<pad>"]
T = max(len(s) for s in sentences) + 1


def padded(tokens: list[str]) -> list[str]:
    return tokens + ["<pad>"] * (T - len(tokens))


decoder_input = [padded(["<bos>", *s]) for s in sentences]
labels = [padded([*s, "<eos>"]) for s in sentences]
ids = [[vocab[t] for t in row] for row in decoder_input]
tgt = torch.tensor(ids)  # (B, T)
pd.DataFrame(
    {"input 0": decoder_input[0], "label 0": labels[0]}
    | {"input 1": decoder_input[1], "label 1": labels[1]}
).rename_axis("position")

# %% [markdown]
# ## The three masks
#
# A mask is boolean, `True` meaning *may attend*, and broadcastable to $(B, H, T_q, T_k)$:
#
# - `padding_mask(ids, pad_id)`, $(B, 1, 1, S)$, is `True` at the real tokens. Padding hides
#   *keys*, so one row serves every head and every query.
# - `causal_mask(T)`, $(1, 1, T, T)$, is the lower triangle with the diagonal: query $t$ may
#   attend to keys $0, \dots, t$, in every sentence and head.
# - `target_mask(ids, pad_id)`, $(B, 1, T, T)$, is both at once, for the decoder's
#   self-attention.

# %%
#| export
"""Attention masks: boolean, True means "may attend", broadcastable to (B, H,
T_q, T_k)."""

import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """Keys that are real tokens: (B, S) token ids -> (B, 1, 1, S), False at
    padding."""
    if ids.dim() != 2:
        raise ValueError(
            f"ids must be (B, S) token ids, got shape {tuple(ids.shape)}"
        )
    # One row shared by every head and every query: padding hides keys, not
    # queries.
    return (ids != pad_id)[:, None, None, :]  # (B, 1, 1, S)


def causal_mask(size: int, device: torch.device | None = None) -> Tensor:
    """Position t may attend to positions <= t: (1, 1, T, T), lower triangle
    and diagonal."""
    ones = torch.ones(size, size, dtype=torch.bool, device=device)
    return ones.tril()[None, None]  # (1, 1, T, T)


def target_mask(ids: Tensor, pad_id: int) -> Tensor:
    """The decoder's self-attention mask: (B, T) ids -> (B, 1, T, T), causal
    and not padding."""
    return padding_mask(ids, pad_id) & causal_mask(
        ids.size(-1), device=ids.device
    )


# %%
from transformer.masking import causal_mask, padding_mask, target_mask

B = len(sentences)
pad = padding_mask(tgt, pad_id)
causal = causal_mask(T)
both = target_mask(tgt, pad_id)
assert pad.shape == (B, 1, 1, T) and causal.shape == (1, 1, T, T)
assert pad[0, 0, 0].tolist() == [True, True, True, True, False, False]
assert torch.equal(both, pad & causal)  # (B, 1, T, T)

# %% [markdown]
# The heatmaps show the masks of the first, padded, sentence, queries as rows and keys as
# columns; dark means *may attend*. The combination keeps a key only on or below the diagonal
# and left of the first `<pad>`. The two `<pad>` *rows* are not empty: padding hides keys, not
# queries.

# %% tags=["hide-input"]
import altair as alt

from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
tokens = decoder_input[0]
style = dict(x_labels=tokens, y_labels=tokens, value="may attend", cell=20)
alt.hconcat(
    heatmap(pad[0, 0].expand(T, T), title="padding", **style),  # every query
    heatmap(causal[0, 0], title="causal", **style),
    heatmap(both[0, 0], title="target = padding & causal", **style),
).resolve_scale(color="shared")

# %% [markdown]
# ## How the shapes broadcast
#
# No mask is stored at the full size of the scores: each keeps a dimension of size 1 wherever its
# value does not depend on the index, and broadcasting repeats it. The table checks each use
# against the scores' shape for $H$ = 8 heads and a source of $S$ = 7 tokens. In cross-attention
# the source padding mask serves all $T$ target queries, with no causal part: the whole source is
# known before decoding starts.

# %%
H, S = 8, 7
src = torch.full((B, S), vocab["dog"])  # any source batch of S tokens
src_mask = padding_mask(src, pad_id)
uses = {  # attention: (mask, its call, T_q, T_k)
    "encoder self-attention": (src_mask, "padding_mask(src)", S, S),
    "decoder self-attention": (both, "target_mask(tgt)", T, T),
    "decoder cross-attention": (src_mask, "padding_mask(src)", T, S),
}
rows = []
for where, (m, call, T_q, T_k) in uses.items():
    scores = (B, H, T_q, T_k)
    assert torch.broadcast_shapes(m.shape, scores) == scores
    rows.append((where, call, tuple(m.shape), scores))
columns = ["attention", "mask", "stored shape", "scores (B, H, T_q, T_k)"]
pd.DataFrame(rows, columns=columns).set_index("attention")

# %% [markdown]
# ## Why the decoder must not see the future
#
# When translating, the decoder chooses $y_{t+1}$ from $\texttt{<bos>}\, y_1 \dots y_t$ alone.
# In training it reads the whole shifted target at once, and the inputs right of position $t$
# *are* its labels: without the mask it could copy them instead of predicting. The mask, with the
# offset, "ensures that the predictions for position $i$ can depend only on the known outputs at
# positions less than $i$" (Section 3.1). Below, we change the last word (*snow* becomes *dog*):
# under the causal mask no earlier output moves; without it every one does.

# %%
from transformer.attention import scaled_dot_product_attention

d_k = 8
embedding = torch.randn(len(vocab), d_k)
X = embedding[tgt[1]]  # <bos> two dogs play in snow: (T, d_k)
X_changed = X.clone()
X_changed[-1] = embedding[vocab["dog"]]  # ... in dog


def self_attention(x, mask):
    return scaled_dot_product_attention(x, x, x, mask=mask)


for name, mask in (("causal mask", causal[0, 0]), ("no mask", None)):
    out = self_attention(X, mask)[0]
    out_changed = self_attention(X_changed, mask)[0]
    same = (out[:-1] == out_changed[:-1]).all(dim=-1)
    print(f"{name:12}", same.tolist())
    # with the mask, earlier outputs are bit-for-bit the same; without, none
    assert same.all() if mask is not None else not same.any()

# %% [markdown]
# Equivalently, each position $t$ gets what attention over the prefix $0, \dots, t$ alone gives:
# training all positions in parallel computes what generating token by token computes.

# %%
out, _ = self_attention(X, causal[0, 0])
for t in range(T):
    step, _ = self_attention(X[: t + 1], None)  # the prefix 0..t alone
    assert torch.allclose(out[t], step[-1], atol=1e-6)

# %% [markdown]
# ## What padding changes, and what it does not
#
# Under the target mask, the real positions of the padded sentence get exactly the outputs they
# get unpadded, whatever the `<pad>` vectors hold.

# %%
n = len(sentences[0]) + 1  # <bos> a dog runs
out_alone, _ = self_attention(embedding[tgt[0, :n]], causal_mask(n)[0, 0])
x_batch = embedding[tgt]  # (B, T, d_k), <pad> positions hold the <pad> vector
out_batch, w_batch = self_attention(x_batch, both[:, 0])
assert torch.allclose(out_batch[0, :n], out_alone, atol=1e-6)
x_batch[0, n:] = 100 * torch.randn(T - n, d_k)  # whatever the padding holds
out_scrambled, _ = self_attention(x_batch, both[:, 0])
assert torch.allclose(out_scrambled[0, :n], out_alone, atol=1e-6)

# %% [markdown]
# The heatmap shows the weights of the first sentence. Real rows put no weight on `<pad>` keys.
# The `<pad>` rows still attend to the real tokens on their left (at least `<bos>`), so they are
# never fully masked and never NaN; their outputs reach no real position, and the loss skips
# positions whose label is `<pad>`.

# %%
assert not w_batch[0][:, ~pad[0, 0, 0]].any()  # no weight on a <pad> key
assert torch.allclose(w_batch[0, n:].sum(-1), torch.ones(T - n))  # <pad> rows
title = "Weights under the target mask: <pad> queries still attend"
heatmap(w_batch[0], x_labels=tokens, y_labels=tokens, title=title)

# %% [markdown]
# ## Summary
#
# - Masks are boolean, `True` meaning *may attend*, and keep size-1 dimensions that broadcast to
#   the scores $(B, H, T_q, T_k)$.
# - `padding_mask` hides padded keys, `causal_mask` hides the future, `target_mask` does both for
#   the decoder's self-attention.
# - Under the causal mask, training on whole sentences computes exactly what generating one token
#   at a time computes.
# - Padding changes nothing at the real positions.
#
# ## Exercises
#
# 1. In the chapter that puts the model together, train the copy task with
#    `tgt_mask=padding_mask(tgt_in, pad_id)` instead of `target_mask`. What happens to the training
#    loss, and to greedy decoding?
# 2. Call the model's `encode` on a padded batch with `src_mask=None`: how do the real
#    positions' outputs change as you add padding?
