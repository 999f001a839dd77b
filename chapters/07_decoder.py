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
# # The decoder
#
# The decoder writes the translation. At each target position it reads the target tokens so far
# and the encoder's memory of the source, and produces a vector from which the output layer
# predicts the next token: the right half of the paper's Figure 1 {cite:p}`vaswani2017attention`.
# It is the encoder's stack with one more sublayer, *encoder–decoder attention*, and a mask that
# keeps each position from seeing the later ones. This chapter builds it, checks that it is
# causal, and draws both kinds of attention.

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
#| default_exp decoder

# %%
import torch

# %% [markdown]
# ## One decoder layer
#
# > In addition to the two sub-layers in each encoder layer, the decoder inserts a third
# > sub-layer, which performs multi-head attention over the output of the encoder stack. [...] We
# > also modify the self-attention sub-layer in the decoder stack to prevent positions from
# > attending to subsequent positions. (Section 3.1)
#
# For the decoder's input $x$, $(B, T, d_\text{model})$, and the encoder's memory $m$,
# $(B, S, d_\text{model})$, one post-norm layer computes
#
# $$
# \begin{aligned}
# a &= \mathrm{LayerNorm}\big(x + \mathrm{Dropout}(\mathrm{MultiHead}(x, x, x;\ \text{causal}))\big)
# \\
# c &= \mathrm{LayerNorm}\big(a + \mathrm{Dropout}(\mathrm{MultiHead}(a, m, m;\ \text{source
# padding}))\big) \\
# y &= \mathrm{LayerNorm}\big(c + \mathrm{Dropout}(\mathrm{FFN}(c))\big)
# \end{aligned}
# $$
#
# 1. **Masked self-attention** over the target, with `tgt_mask` $(B, 1, T, T)$: the causal
#    triangle and the target's padding (`target_mask`, the masking chapter).
# 2. **Encoder–decoder attention** (Section 3.2.3): queries from the decoder, keys and values from
#    the memory, so its weights are $T \times S$; `src_mask` $(B, 1, 1, S)$ hides source padding.
# 3. The **feed-forward network**, as in the encoder.
#
# The two masks are keyword-only: when $S = T$ a swapped pair would broadcast without complaint.

# %%
#| export
"""The decoder of Vaswani et al. (2017): Section 3.1, Figure 1 (right)."""

from torch import Tensor, nn

from transformer.layer_config import LayerConfig
from transformer.multihead import MultiHeadAttention
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection


# %%
#| export
class DecoderLayer(nn.Module):
    """Self-attention, encoder-decoder attention and a feed-forward network."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(config)
        self.cross_attn = MultiHeadAttention(config)
        self.feed_forward = PositionwiseFeedForward(config)
        self.sublayers = nn.ModuleList(
            SublayerConnection(config) for _ in range(3)
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """Shapes: x (B, T, d_model), and so the result; memory (B, S,
        d_model); src_mask (B, 1, 1, S); tgt_mask (B, 1, T, T); weights
        (B, H, T, T) and (B, H, T, S)."""
        self_w = cross_w = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal self_w
            out, self_w = self.self_attn(h, h, h, tgt_mask, need_weights)
            return out

        def cross_attention(h: Tensor) -> Tensor:
            nonlocal cross_w
            out, cross_w = self.cross_attn(
                h, memory, memory, src_mask, need_weights
            )
            return out

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, cross_attention)
        x = self.sublayers[2](x, self.feed_forward)
        return x, ((self_w, cross_w) if need_weights else None)


# %% [markdown]
# ## The stack
#
# Like the encoder, the decoder is `n_layers` layers built one by one, with a final LayerNorm only
# when pre-norm. Every layer attends to the *same* memory.


# %%
#| export
class Decoder(nn.Module):
    """N decoder layers, each attending to the same memory (Section 3.1)."""

    def __init__(self, config: LayerConfig, n_layers: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(config) for _ in range(n_layers)
        )
        self.final_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.norm_first
            else nn.Identity()
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]] | None]:
        """Shapes as DecoderLayer's; weights, if asked for, one (self, cross)
        pair per layer."""
        all_weights = []
        for layer in self.layers:
            x, weights = layer(
                x,
                memory,
                src_mask=src_mask,
                tgt_mask=tgt_mask,
                need_weights=need_weights,
            )
            all_weights.append(weights)
        return self.final_norm(x), (all_weights if need_weights else None)


# %% [markdown]
# We run it on a toy batch of German–English pairs in one shared toy vocabulary, as the paper
# shares one. The decoder's input is the target shifted right behind `<bos>` (the masking
# chapter), padded to $T$.

# %%
from transformer.decoder import Decoder
from transformer.embedding import PositionalEncoding, TokenEmbedding
from transformer.layer_config import LayerConfig
from transformer.masking import padding_mask, target_mask

pairs = [
    ("ein Hund läuft im Schnee", "a dog runs in the snow"),
    ("zwei Hunde spielen", "two dogs play"),
    ("eine Frau fährt Fahrrad", "a woman rides a bike"),
]
words = sorted({w for pair in pairs for text in pair for w in text.split()})
vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", *words])}
pad_id, bos_id, eos_id = vocab["<pad>"], vocab["<bos>"], vocab["<eos>"]


def pad(rows: list[list[int]]) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (longest - len(r)) for r in rows])


src = pad([[vocab[w] for w in s.split()] + [eos_id] for s, _ in pairs])
tgt = pad([[bos_id] + [vocab[w] for w in t.split()] for _, t in pairs])
src_mask, tgt_mask = padding_mask(src, pad_id), target_mask(tgt, pad_id)
B, T = tgt.shape

# %% [markdown]
# A random memory stands in for the encoder's output; the decoder has random weights
# ($d_\text{model} = 32$, $H = 4$, $d_{ff} = 64$, evaluation mode). The numbers say nothing about
# translation; the shapes and the masks are what matter. The masks show in the weights,
# $(B, H, T, T)$ and $(B, H, T, S)$: no query gives weight to a later target position or to
# source padding.

# %%
torch.manual_seed(0)
d_model = 32
config = LayerConfig(d_model=d_model, n_heads=4, d_ff=64, dropout=0.1)
embed = TokenEmbedding(len(vocab), d_model)
position = PositionalEncoding(d_model, max_len=64, dropout=0.1).eval()
decoder = Decoder(config, n_layers=3).eval()
memory = torch.randn(B, src.size(1), d_model)  # (B, S, d_model)


@torch.no_grad()
def run(tokens: torch.Tensor, mask: torch.Tensor, need_weights=False):
    """The decoder's output (B, T, d_model) for target ids, and its weights."""
    x = position(embed(tokens))  # (B, T, d_model), the decoder's input
    return decoder(
        x, memory, src_mask=src_mask, tgt_mask=mask, need_weights=need_weights
    )


hidden, weights = run(tgt, tgt_mask, need_weights=True)
self_w, cross_w = weights[0]  # layer 1
print("weights: self", tuple(self_w.shape), "cross", tuple(cross_w.shape))
assert (self_w.triu(diagonal=1) == 0).all()  # nothing above the diagonal
assert (cross_w.masked_select(~src_mask) == 0).all()

# %% [markdown]
# ## The decoder is causal
#
# In training, the decoder reads the whole shifted target at once and predicts all $T$ next tokens
# in one pass. That is honest only if the output at position $t$ depends on the target tokens
# $0, \dots, t$ alone, as it will at translation time. We check it: for every $t$, replace the
# target tokens after $t$ by random ones and compare the outputs up to $t$.

# %%
for t in range(T - 1):  # replace the tokens after t by random ones
    changed = tgt.clone()
    changed[:, t + 1 :] = torch.randint(3, len(vocab), (B, T - t - 1))
    after, _ = run(changed, target_mask(changed, pad_id))
    assert torch.allclose(after[:, : t + 1], hidden[:, : t + 1], atol=1e-5)
print(f"for t = 0 .. {T - 2}, no output at or before t moved")

# %% [markdown]
# Without the causal triangle, keeping only the target's padding, changing the last target token
# alone moves the earlier outputs at once:

# %%
no_future = padding_mask(tgt, pad_id)  # (B, 1, 1, T): the padding only
moved = run(changed, no_future)[0] - run(tgt, no_future)[0]
print(f"earlier outputs moved by up to {moved[:, :-1].abs().max():.2f}")

# %% [markdown]
# ## Both kinds of attention
#
# The figure shows the first layer's weights for the second pair, averaged over the heads, with
# separate colour scales. Left, the masked self-attention: empty above the diagonal and in the
# `<pad>` columns; the `<bos>` row puts all its weight on `<bos>`. Right, the encoder–decoder
# attention, $T \times S$: every target position may look at the whole source except its padding.
# With random weights the rows are diffuse; a trained model learns to concentrate them, for
# instance on the source word being translated.

# %% tags=["hide-input"]
import altair as alt

from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
token_of = {i: t for t, i in vocab.items()}
src_tokens = [token_of[i] for i in src[1].tolist()]
tgt_tokens = [token_of[i] for i in tgt[1].tolist()]
first_self, first_cross = self_w[1].mean(0), cross_w[1].mean(0)
self_map = heatmap(first_self, x_labels=tgt_tokens, y_labels=tgt_tokens)
cross_map = heatmap(
    first_cross, x_labels=src_tokens, y_labels=tgt_tokens, x_title="source key"
)
alt.hconcat(
    self_map.properties(title="masked self-attention (T × T)"),
    cross_map.properties(title="encoder–decoder attention (T × S)"),
).resolve_scale(color="independent").properties(
    title="Decoder layer 1 of a random-weight model, mean of 4 heads"
)

# %% [markdown]
# ## Summary
#
# - `DecoderLayer` is masked self-attention, encoder–decoder attention over the memory and a
#   feed-forward network, each in a `SublayerConnection`.
# - Its masks are keyword-only: `tgt_mask` (causal, and target padding) and `src_mask` (source
#   padding).
# - The causal mask makes no output depend on a later target token, so training predicts all
#   positions in one pass.

# %% [markdown]
# ## Exercises
#
# 1. Repeat the causality check with a pre-norm decoder,
#    `Decoder(dataclasses.replace(config, norm_first=True), n_layers=3)`.
# 2. Pass `tgt_mask=causal_mask(T)` (from `transformer.masking`, without the padding) and compare
#    the outputs: which positions change, and does the loss, which ignores padding, see it?
