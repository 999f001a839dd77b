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
specials = ["<pad>", "<bos>", "<eos>"]
sentences = [["a", "dog", "runs"], ["two", "dogs", "play", "in", "snow"]]
vocab = {
    t: i
    for i, t in enumerate(specials + sorted({w for s in sentences for w in s}))
}
pad_id, bos_id, eos_id = vocab["<pad>"], vocab["<bos>"], vocab["<eos>"]
T = max(len(s) for s in sentences) + 1
decoder_input = [
    ["<bos>", *s] + ["<pad>"] * (T - 1 - len(s)) for s in sentences
]
labels = [[*s, "<eos>"] + ["<pad>"] * (T - 1 - len(s)) for s in sentences]
tgt = torch.tensor(
    [[vocab[t] for t in row] for row in decoder_input]
)  # (B, T)
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
assert both.shape == (B, 1, T, T)
assert pad.dtype == causal.dtype == both.dtype == torch.bool
assert pad[0, 0, 0].tolist() == [True, True, True, True, False, False]
assert pad[1].all()
assert torch.equal(both, pad & causal)

# %% [markdown]
# The heatmaps show the masks of the first, padded, sentence, queries as rows and keys as
# columns; dark means *may attend*. The combination keeps a key only on or below the diagonal
# and left of the first `<pad>`. The two `<pad>` *rows* are not empty: padding hides keys, not
# queries.

# %%
import altair as alt

from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
tokens = decoder_input[0]
panels = {
    "padding mask": (
        pad[0, 0].expand(T, T)
    ),  # the (1, T) row, seen by every query
    "causal mask": causal[0, 0],
    "target mask = padding & causal": both[0, 0],
}
alt.hconcat(
    *(
        heatmap(
            m, x_labels=tokens, y_labels=tokens, value="may attend", title=name
        )
        for name, m in panels.items()
    )
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
uses = [
    (
        "encoder self-attention",
        "padding_mask(src)",
        padding_mask(src, pad_id),
        S,
        S,
    ),
    ("decoder self-attention", "target_mask(tgt)", both, T, T),
    (
        "decoder cross-attention",
        "padding_mask(src)",
        padding_mask(src, pad_id),
        T,
        S,
    ),
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
    print(
        f"{'causal mask' if mask is not None else 'no mask':12}", same.tolist()
    )
    if mask is not None:
        assert same.all()  # earlier positions are bit-for-bit unchanged
    else:
        assert not same.any()  # every earlier position saw the change

# %% [markdown]
# Equivalently, each position $t$ gets what attention over the prefix $0, \dots, t$ alone gives:
# training all positions in parallel computes what generating token by token computes.

# %%
out, _ = scaled_dot_product_attention(X, X, X, mask=causal[0, 0])
for t in range(T):
    prefix = X[: t + 1]
    step, _ = scaled_dot_product_attention(prefix, prefix, prefix)
    assert torch.allclose(out[t], step[-1], atol=1e-6)

# %% [markdown]
# ## What padding changes, and what it does not
#
# Under the target mask, the real positions of the padded sentence get exactly the outputs they
# get unpadded, whatever the `<pad>` vectors hold.

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
x_scrambled[0, n:] = 100 * torch.randn(
    T - n, d_k
)  # whatever the padding holds
out_scrambled, _ = scaled_dot_product_attention(
    x_scrambled, x_scrambled, x_scrambled, mask=both[:, 0]
)
assert torch.allclose(out_scrambled[0, :n], out_alone, atol=1e-6)

# %% [markdown]
# The heatmap shows the weights of the first sentence. Real rows put no weight on `<pad>` keys.
# The `<pad>` rows still attend to the real tokens on their left (at least `<bos>`), so they are
# never fully masked and never NaN; their outputs reach no real position, and the loss skips
# positions whose label is `<pad>`.

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
assert torch.allclose(
    w_batch[0, n:].sum(-1), torch.ones(T - n)
)  # <pad> queries attend

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
