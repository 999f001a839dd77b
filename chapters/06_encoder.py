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
# # The encoder
#
# The encoder reads the source sentence and turns each of its $S$ tokens into a vector of width
# $d_\text{model}$ that describes the token *in its context*: the left half of the paper's
# Figure 1 {cite:p}`vaswani2017attention`, Section 3.1. This chapter assembles earlier pieces into
# an encoder layer and a stack of `n_layers` of them, and checks that
# padding cannot leak into the result.

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
#| default_exp encoder

# %%
import torch
from torch import nn

# %% [markdown]
# ## One encoder layer
#
# > The encoder is composed of a stack of $N = 6$ identical layers. Each layer has two
# > sub-layers. The first is a multi-head self-attention mechanism, and the second is a simple,
# > position-wise fully connected feed-forward network. (Section 3.1)
#
# For an input $x$ of shape $(B, S, d_\text{model})$, one post-norm layer computes
#
# $$
# \begin{aligned}
# z &= \mathrm{LayerNorm}\big(x + \mathrm{Dropout}(\mathrm{MultiHead}(x, x, x))\big) \\
# y &= \mathrm{LayerNorm}\big(z + \mathrm{Dropout}(\mathrm{FFN}(z))\big)
# \end{aligned}
# $$
#
# *Self*-attention takes queries, keys and values from the same sequence, and the source's padding
# mask, $(B, 1, 1, S)$, hides the padding keys. The attention sublayer is a closure that feeds its
# input in three times and *returns* the weights when asked for: a forward pass stores nothing.
# The layer hands its one `LayerConfig` to each part, which reads the sizes it needs.

# %%
#| export
"""The encoder of Vaswani et al. (2017): Section 3.1, Figure 1 (left)."""

from torch import Tensor, nn

from transformer.layer_config import LayerConfig
from transformer.multihead import MultiHeadAttention
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection


class EncoderLayer(nn.Module):
    """Self-attention and a feed-forward network in sublayer connections."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.feed_forward = PositionwiseFeedForward(config)
        self.sublayers = nn.ModuleList(
            SublayerConnection(config) for _ in range(2)
        )

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Shapes: x (B, S, d_model), and so the result; src_mask boolean
        (B, 1, 1, S) (padding_mask); weights, if asked for, (B, H, S, S)."""
        weights = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(
                h, h, h, mask=src_mask, need_weights=need_weights
            )
            return out

        x = self.sublayers[0](x, self_attention)
        return self.sublayers[1](x, self.feed_forward), weights


# %% [markdown]
# A toy batch: three German sentences, each ending with `<eos>` and padded to $S = 9$, embedded
# with positional encodings (the embeddings chapter) at a small width, $d_\text{model} = 32$,
# $H = 4$, $d_{ff} = 64$, with random weights, in evaluation mode (no dropout). The id of `<pad>`
# is looked up, never written as a number. No query gives weight to a padding key, and each
# query's weights sum to one. Padding hides *keys*, not queries: the padding rows hold vectors
# that nothing downstream reads.

# %%
from transformer.embedding import PositionalEncoding, TokenEmbedding
from transformer.encoder import EncoderLayer
from transformer.layer_config import LayerConfig
from transformer.masking import padding_mask

sentences = [
    "ein Hund läuft durch den Schnee".split(),
    "zwei Hunde spielen".split(),
    "eine Frau fährt mit dem Fahrrad die Straße".split(),
]
words = sorted({w for s in sentences for w in s})
vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", *words])}
pad_id, eos_id = vocab["<pad>"], vocab["<eos>"]
S = max(len(s) for s in sentences) + 1
ids = [[vocab[w] for w in s] + [eos_id] for s in sentences]
src = torch.tensor([r + [pad_id] * (S - len(r)) for r in ids])  # (B, S)
src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)

torch.manual_seed(0)
d_model = 32
config = LayerConfig(d_model=d_model, n_heads=4, d_ff=64, dropout=0.1)
embed = TokenEmbedding(len(vocab), d_model)
position = PositionalEncoding(d_model, max_len=64, dropout=0.1).eval()
layer = EncoderLayer(config).eval()
with torch.no_grad():
    x = position(embed(src))  # (B, S, d_model)
    _, weights = layer(x, src_mask, need_weights=True)  # (B, H, S, S)
real = src_mask[:, 0, 0, :]  # (B, S)
assert (weights.masked_select(~real[:, None, None, :]) == 0).all()
assert torch.allclose(weights.sum(-1), torch.ones(3, config.n_heads, S))

# %% [markdown]
# ## The stack
#
# The encoder is `n_layers` such layers, each with its own weights; the last one's output is the
# *memory* that the decoder attends to. The layers are built explicitly,
# `nn.ModuleList(EncoderLayer(config) for _ in range(n_layers))`, which reads as the paper's "stack
# of $N$ identical layers": identical in shape, not in values, since each layer draws its own
# initial weights. (The Annotated Transformer deep-copies one prototype layer instead, and its
# `make_model` then draws every matrix again, so that its layers start apart too.)
#
# A post-norm stack ends normalised, so its `final_norm` is the identity; a pre-norm stack needs
# one more LayerNorm at the end {cite:p}`xiong2020layer`.


# %%
#| export
class Encoder(nn.Module):
    """N identical encoder layers, each with its own weights (Section 3.1)."""

    def __init__(self, config: LayerConfig, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(config) for _ in range(n_layers)
        )
        # Post-norm layers end normalised; a pre-norm stream needs a LayerNorm.
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.norm_first
            else nn.Identity()
        )

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Shapes: x (B, S, d_model), and so the memory; src_mask (B, 1, 1, S);
        weights, if asked for, n_layers x (B, H, S, S)."""
        all_weights = [] if need_weights else None
        for layer in self.layers:
            x, weights = layer(x, src_mask, need_weights=need_weights)
            if need_weights:
                all_weights.append(weights)
        return self.final_norm(x), all_weights


# %%
from transformer.encoder import Encoder

encoder = Encoder(config, n_layers=3).eval()
w_q = [layer.self_attn.w_q.weight for layer in encoder.layers]
assert not any(torch.equal(w_q[0], w) for w in w_q[1:])  # each its own start

# %% [markdown]
# ## Padding changes nothing
#
# A sentence's encoding must not depend on how much padding its batch adds. We append five more
# `<pad>` tokens to every sentence: with the mask, the memory at the real positions moves only by
# rounding noise; without it, the padding leaks in through attention.

# %%
longer = torch.cat([src, torch.full((3, 5), pad_id)], dim=1)  # (B, S + 5)
with torch.no_grad():
    memory, all_weights = encoder(x, src_mask, need_weights=True)
    long_out, _ = encoder(
        position(embed(longer)), padding_mask(longer, pad_id)
    )
    leaky_out, _ = encoder(position(embed(longer)), None)
at_real = real[..., None].expand_as(memory)  # (B, S, d_model)
masked_gap = (long_out[:, :S] - memory)[at_real].abs().max().item()
unmasked_gap = (leaky_out[:, :S] - memory)[at_real].abs().max().item()
assert masked_gap < 1e-5 and unmasked_gap > 1e-2
print(f"without the mask, real positions move by up to {unmasked_gap:.2f}")

# %% [markdown]
# ## What the layers attend to
#
# The figure shows each layer's self-attention for the first sentence, averaged over the four
# heads. Padding columns get no weight in any layer; padding rows attend like any other
# query. With random weights the attention is spread thinly, with no sharp pattern: whatever
# structure a trained model shows is learned, not built in.

# %% tags=["hide-input"]
import altair as alt

from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
tokens = [*sentences[0], "<eos>"] + ["<pad>"] * (S - len(sentences[0]) - 1)
alt.hconcat(
    *[
        heatmap(
            w[0].mean(0), x_labels=tokens, y_labels=tokens, cell=15
        ).properties(title=f"layer {i + 1}")
        for i, w in enumerate(all_weights)
    ]
).resolve_scale(color="shared").properties(
    title="Self-attention of a random-weight encoder, mean of 4 heads"
)

# %% [markdown]
# ## Summary
#
# - `EncoderLayer` is self-attention and a feed-forward network, each in a `SublayerConnection`;
#   the source's padding mask hides the padding keys.
# - `Encoder` stacks `n_layers` layers built one by one, with a final LayerNorm only when
#   pre-norm.
# - Padding does not move the memory at real positions, and the attention weights are returned,
#   never stored.

# %% [markdown]
# ## Exercises
#
# 1. Repeat the padding test with a pre-norm encoder,
#    `Encoder(dataclasses.replace(config, norm_first=True), n_layers=3)`. Does it still hold?
# 2. Build the layer with `attention_dropout=0.1` in its config and call it in training mode: do
#    each query's weights still sum to one, and why not?
# 3. Redraw the figure for `Encoder(config, n_layers=6)`: does depth alone sharpen a random
#    encoder's attention?
