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
# Figure 1 {cite:p}`vaswani2017attention`, described in Section 3.1.
#
# Every piece already exists: multi-head attention, the feed-forward network and the residual
# connection with layer normalisation (`SublayerConnection`) from the previous chapters. This
# chapter assembles them into one encoder layer and a stack of `n_layers` of them, checks that
# padding cannot leak into the result, and looks at what the layers of a random-weight encoder
# attend to.

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
#| default_exp encoder

# %%
import copy

import altair as alt
import pandas as pd
import torch
from torch import nn

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## One encoder layer
#
# Section 3.1 describes the encoder in four sentences:
#
# > The encoder is composed of a stack of $N = 6$ identical layers. Each layer has two
# > sub-layers. The first is a multi-head self-attention mechanism, and the second is a simple,
# > position-wise fully connected feed-forward network. We employ a residual connection around
# > each of the two sub-layers, followed by layer normalization.
#
# For an input $x$ of shape $(B, S, d_\text{model})$, one layer of the paper's (post-norm)
# encoder computes
#
# $$
# \begin{aligned}
# z &= \mathrm{LayerNorm}\big(x + \mathrm{Dropout}(\mathrm{MultiHead}(x, x, x))\big) \\
# y &= \mathrm{LayerNorm}\big(z + \mathrm{Dropout}(\mathrm{FFN}(z))\big)
# \end{aligned}
# $$
#
# *Self*-attention means that the queries, keys and values all come from the same sequence, the
# layer's input: every source position looks at every other source position. The one thing it
# must not look at is padding, so the layer takes the source's padding mask, of shape
# $(B, 1, 1, S)$: one row per sentence, shared by every head and every query. The feed-forward
# network then transforms each position on its own. Dropout (the paper's $P_{drop}$) sits on each
# sublayer's output, inside `SublayerConnection`; `norm_first=True` switches both sublayers to the
# pre-norm order, an option that the sublayers chapter explains.
#
# `SublayerConnection` takes the sublayer as a function of one argument. For the feed-forward
# network that is the module itself; for attention it is a small closure that feeds the same
# (possibly normalised) input as query, key and value, and keeps the attention weights when the
# caller asks for them. The weights are *returned*, never stored on the module: a forward pass
# has no side effects.

# %%
#| export
"""The encoder: a stack of identical layers, Section 3.1 and Figure 1 (left) of Vaswani et al.
(2017)."""

import torch
from torch import Tensor, nn

from transformer.multihead import MultiHeadAttention
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection


class EncoderLayer(nn.Module):
    """Self-attention and a feed-forward network, each in a residual connection with LayerNorm."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout=attention_dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout=ffn_dropout)
        self.sublayers = nn.ModuleList(
            SublayerConnection(d_model, dropout=dropout, norm_first=norm_first)
            for _ in range(2)
        )

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """One encoder layer; the attention weights only when asked for.

        Shapes:
            x: (B, S, d_model)
            src_mask: boolean (B, 1, 1, S), True at real tokens (padding_mask)
            returns (B, S, d_model) and, if need_weights, weights (B, H, S, S), else None
        """
        weights = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal weights
            out, weights = self.self_attn(
                h, h, h, mask=src_mask, need_weights=need_weights
            )
            return out

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, self.feed_forward)
        return x, weights


# %% [markdown]
# A toy batch: three German sentences of different lengths, in a toy vocabulary whose first
# entries are the special tokens. As everywhere in this book, the id of `<pad>` is looked up,
# not written as a number. Each sentence ends with `<eos>` and is padded to the longest one,
# $S = 9$.

# %%
from transformer.embedding import PositionalEncoding, TokenEmbedding
from transformer.masking import padding_mask

specials = ["<pad>", "<bos>", "<eos>"]
sentences = [
    "ein Hund läuft durch den Schnee".split(),
    "zwei Hunde spielen".split(),
    "eine Frau fährt mit dem Fahrrad die Straße".split(),
]
vocab = {
    t: i for i, t in enumerate(specials + sorted({w for s in sentences for w in s}))
}
pad_id, eos_id = vocab["<pad>"], vocab["<eos>"]
S = max(len(s) for s in sentences) + 1
src = torch.tensor(
    [[vocab[w] for w in s] + [eos_id] + [pad_id] * (S - len(s) - 1) for s in sentences]
)
src_mask = padding_mask(src, pad_id)
src, src_mask.shape

# %% [markdown]
# The layer's input is what the paper feeds the encoder: token embeddings, scaled by
# $\sqrt{d_\text{model}}$, plus positional encodings (the embeddings chapter). A small width keeps
# everything readable: $d_\text{model} = 32$, $H = 4$ heads, $d_{ff} = 64$. The weights are random
# (PyTorch's default initialisation; the full model's chapter chooses its own), and the modules
# are put in evaluation mode, which switches dropout off, so that the outputs below are
# deterministic.

# %%
from transformer.encoder import EncoderLayer

d_model, n_heads, d_ff = 32, 4, 64
embed = TokenEmbedding(len(vocab), d_model)
position = PositionalEncoding(d_model, max_len=64, dropout=0.1)
layer = EncoderLayer(d_model, n_heads, d_ff).eval()
position.eval()

with torch.no_grad():
    x = position(embed(src))  # (B, S, d_model)
    y, weights = layer(x, src_mask, need_weights=True)
print("input   ", tuple(x.shape))
print("output  ", tuple(y.shape))
print("weights ", tuple(weights.shape), "(B, H, S, S)")
assert y.shape == x.shape and weights.shape == (len(sentences), n_heads, S, S)
assert layer(x, src_mask)[1] is None  # no weights unless asked for

# %% [markdown]
# The mask did its job: no query gives any weight to a padding key, and every query's weights
# over the real keys sum to one. Padding hides *keys*, not queries: the rows of the padding
# positions are computed like any other and hold vectors that nothing downstream will read.

# %%
real = src_mask[:, 0, 0, :]  # (B, S)
assert (weights.masked_select(~real[:, None, None, :]) == 0).all()
assert torch.allclose(weights.sum(-1), torch.ones(len(sentences), n_heads, S))
weights[1].mean(0)  # "zwei Hunde spielen <eos>", averaged over the heads

# %% [markdown]
# A layer's parameters are those of its two sublayers and its two layer normalisations:
# $4 d_\text{model}^2$ for the four projections $W^Q, W^K, W^V, W^O$ and $4 d_\text{model}$ for
# their biases, $2\, d_\text{model} d_{ff} + d_{ff} + d_\text{model}$ for the feed-forward
# network, and $2 \cdot 2\, d_\text{model}$ for the gains and biases of the two LayerNorms. The
# attention biases are this book's, not the paper's: Section 3.2.2 defines the projections as
# matrices only, and the reference code, tensor2tensor, has no biases there either, while our
# `MultiHeadAttention`, like PyTorch's `nn.MultiheadAttention` and the Annotated Transformer,
# has them (the multi-head attention chapter). The full model's chapter counts the whole model
# with these formulas and measures what the biases add.

# %%
# The attention biases, 4 d_model per block, are not in the paper (see above).
n_attention = 4 * d_model**2 + 4 * d_model
n_ffn = 2 * d_model * d_ff + d_ff + d_model
n_norms = 2 * 2 * d_model
assert sum(p.numel() for p in layer.parameters()) == n_attention + n_ffn + n_norms
n_attention + n_ffn + n_norms

# %% [markdown]
# ## The stack
#
# The encoder is `n_layers` such layers applied one after the other, each with its own weights;
# the output of the last one is the *memory* that the decoder attends to.
#
# The layers are built explicitly, `nn.ModuleList(EncoderLayer(...) for _ in range(n_layers))`.
# A popular alternative builds one prototype layer and deep-copies it $N$ times (the Annotated
# Transformer's `clones`). A deep copy copies the prototype's random initial *values*, so the $N$
# layers start identical until something re-draws their weights. Both full models do: the
# Annotated Transformer re-draws every weight matrix after building the model, and ours (the full
# model's chapter) re-draws every matrix and sets every bias to zero. In both, then, the weight
# matrices start different and the biases equal (copies of one random bias there, zeros here).
# The argument for the explicit loop is readability: `clones(layer, N)` does not say what a layer
# is made of, and its layers differ only because code elsewhere re-draws them, while the loop
# reads as the paper's sentence "a stack of $N$ identical layers", identical in shape, not in
# values.
#
# The **final normalisation** depends on where the LayerNorms sit. In the paper's post-norm
# layers every sublayer ends with a LayerNorm, so the stack's output is already normalised and
# `final_norm` is the identity. In a pre-norm stack each sublayer normalises its *input* and
# adds its output to an unnormalised residual stream, so the stack needs one more LayerNorm at
# the end {cite:p}`xiong2020layer`.


# %%
#| export
class Encoder(nn.Module):
    """N identical encoder layers, each with its own weights (Section 3.1)."""

    def __init__(
        self,
        n_layers: int,
        d_model: int,
        n_heads: int,
        d_ff: int,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        ffn_dropout: float = 0.0,
        norm_first: bool = False,
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(
                d_model,
                n_heads,
                d_ff,
                dropout=dropout,
                attention_dropout=attention_dropout,
                ffn_dropout=ffn_dropout,
                norm_first=norm_first,
            )
            for _ in range(n_layers)
        )
        # Post-norm layers end normalised; a pre-norm residual stream needs a last LayerNorm.
        # ε = 1e-6 as in the sublayers' LayerNorms.
        self.final_norm = (
            nn.LayerNorm(d_model, eps=1e-6) if norm_first else nn.Identity()
        )

    def forward(
        self, x: Tensor, src_mask: Tensor | None, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor] | None]:
        """Run the stack; with need_weights, also each layer's self-attention weights.

        Shapes:
            x: (B, S, d_model), the embedded source
            src_mask: boolean (B, 1, 1, S), True at real tokens (padding_mask)
            returns the memory (B, S, d_model) and, if need_weights, a list of
            n_layers weights (B, H, S, S), else None
        """
        all_weights = [] if need_weights else None
        for layer in self.layers:
            x, weights = layer(x, src_mask, need_weights=need_weights)
            if need_weights:
                all_weights.append(weights)
        return self.final_norm(x), all_weights


# %% [markdown]
# Before any re-initialisation, deep copies of a prototype hold equal weights; the explicit
# stack's layers do not:

# %%
from transformer.encoder import Encoder

prototype = EncoderLayer(d_model, n_heads, d_ff)
copies = nn.ModuleList(copy.deepcopy(prototype) for _ in range(3))
encoder = Encoder(3, d_model, n_heads, d_ff).eval()


def same_start(layers: nn.ModuleList) -> bool:
    first = layers[0].self_attn.w_q.weight
    return all(torch.equal(first, layer.self_attn.w_q.weight) for layer in layers)


assert same_start(copies) and not same_start(encoder.layers)
print("deep copies start equal:", same_start(copies))
print("explicit layers start equal:", same_start(encoder.layers))

# %% [markdown]
# The stack maps the embedded batch to a memory of the same shape and, on request, returns one
# weight tensor per layer. The post-norm stack has no final LayerNorm; the pre-norm one does.

# %%
with torch.no_grad():
    memory, all_weights = encoder(x, src_mask, need_weights=True)
print("memory ", tuple(memory.shape))
print("weights", [tuple(w.shape) for w in all_weights])
assert memory.shape == (len(sentences), S, d_model) and len(all_weights) == 3

prenorm = Encoder(3, d_model, n_heads, d_ff, norm_first=True)
assert isinstance(encoder.final_norm, nn.Identity)
assert isinstance(prenorm.final_norm, nn.LayerNorm)
encoder.final_norm, prenorm.final_norm

# %% [markdown]
# ## Padding changes nothing
#
# A sentence's encoding must not depend on how many padding tokens the batch appended to it: the
# same sentence, batched with a longer one, must come out the same. We append five more `<pad>`
# tokens to every sentence and compare the memory at the real positions. With the mask, the
# largest difference is floating-point noise (different sums are reduced in a different order);
# without it, the padding leaks into every real position through attention.

# %%
longer = torch.cat([src, torch.full((len(sentences), 5), pad_id)], dim=1)
with torch.no_grad():
    short_out, _ = encoder(position(embed(src)), padding_mask(src, pad_id))
    long_out, _ = encoder(position(embed(longer)), padding_mask(longer, pad_id))
    leaky_out, _ = encoder(position(embed(longer)), None)

at_real = real.unsqueeze(-1).expand_as(short_out)  # (B, S, d_model)
masked_gap = (long_out[:, :S] - short_out)[at_real].abs().max().item()
unmasked_gap = (leaky_out[:, :S] - short_out)[at_real].abs().max().item()
assert masked_gap < 1e-5 and unmasked_gap > 1e-2
# The masked gap is rounding noise whose digits vary between CPUs: print the bound it meets.
print("largest change at real positions, with the mask:    below 1e-5")
print(f"largest change at real positions, without the mask: {unmasked_gap:.2f}")

# %% [markdown]
# ## What the layers attend to
#
# The figure shows the self-attention weights of each of the three layers for the first
# sentence, *ein Hund läuft durch den Schnee*, averaged over the four heads. Look first at the
# last two columns: the padding keys get no weight in any layer, while the padding *rows* attend
# like any other query. Then compare the layers: with random weights nothing is learned, and the
# attention is spread thinly over the whole sentence, with no sharp pattern; whatever structure
# a trained model's attention shows is learned, not built in. The table after the figure
# measures how spread out each layer is.

# %%
from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
tokens = sentences[0] + ["<eos>"] + ["<pad>"] * (S - len(sentences[0]) - 1)
alt.hconcat(
    *[
        heatmap(w[0].mean(0), x_labels=tokens, y_labels=tokens, title=f"layer {i + 1}")
        for i, w in enumerate(all_weights)
    ]
).resolve_scale(color="shared").properties(
    title="Encoder self-attention of a random-weight encoder, mean of 4 heads"
)

# %% [markdown]
# For each layer: the largest weight of each real query, averaged over the queries and heads of
# this sentence, against the weight $1/7$ that uniform attention over its 7 real tokens would
# give. A head that picked out one key would score near 1.

# %%
n_real = int(real[0].sum())
spread = pd.DataFrame(
    [
        {
            "layer": i + 1,
            "mean largest weight": round(
                w[0, :, :n_real].max(-1).values.mean().item(), 4
            ),
            "uniform": round(1 / n_real, 4),
        }
        for i, w in enumerate(all_weights)
    ]
).set_index("layer")
assert (
    spread["mean largest weight"] < 2.5 / n_real
).all()  # thin: no query picks a key
spread

# %% [markdown]
# The decoder, next, is the same stack with one more sublayer: attention from the target
# positions to this memory.
