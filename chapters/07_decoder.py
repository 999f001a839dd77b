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
import altair as alt
import torch
from torch import nn

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

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
# The caches `self_cache` and `cross_cache` serve translation, one token at a time
# ([the decoding chapter](15_decoding.ipynb)).

# %%
#| export
"""The decoder: a stack of identical layers with masked self-attention and
attention over the encoder's output, Section 3.1 and Figure 1 (right) of
Vaswani et al. (2017)."""

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer.multihead import KVCache, MultiHeadAttention
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection


class DecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention and a feed-forward
    network (3.1)."""

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
        self.self_attn = MultiHeadAttention(
            d_model, n_heads, dropout=attention_dropout
        )
        self.cross_attn = MultiHeadAttention(
            d_model, n_heads, dropout=attention_dropout
        )
        self.feed_forward = PositionwiseFeedForward(
            d_model, d_ff, dropout=ffn_dropout
        )
        self.sublayers = nn.ModuleList(
            SublayerConnection(d_model, dropout=dropout, norm_first=norm_first)
            for _ in range(3)
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
        self_cache: KVCache | None = None,
        cross_cache: KVCache | None = None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """One decoder layer; the self- and cross-attention weights only when
        asked for.

        Shapes:
            x: (B, T, d_model), the target so far; memory: (B, S, d_model), the
                encoder's output
            src_mask: boolean (B, 1, 1, S), True at real source tokens
                (padding_mask)
            tgt_mask: boolean (B, 1, T, T), causal and not padding
                (target_mask)
            returns (B, T, d_model) and, if need_weights, (self weights (B, H,
                T, T),
            cross weights (B, H, T, S)), else None

        With caches (the decoding chapter), x holds only the new positions, and
        tgt_mask, if any, covers all L cached positions: (B, 1, T, L).
        """
        self_weights = cross_weights = None

        def self_attention(h: Tensor) -> Tensor:
            nonlocal self_weights
            out, self_weights = self.self_attn(
                h,
                h,
                h,
                mask=tgt_mask,
                need_weights=need_weights,
                cache=self_cache,
            )
            return out

        def cross_attention(h: Tensor) -> Tensor:
            # Queries from the decoder, keys and values from the encoder's
            # memory (3.2.3).
            nonlocal cross_weights
            out, cross_weights = self.cross_attn(
                h,
                memory,
                memory,
                mask=src_mask,
                need_weights=need_weights,
                cache=cross_cache,
            )
            return out

        x = self.sublayers[0](x, self_attention)
        x = self.sublayers[1](x, cross_attention)
        x = self.sublayers[2](x, self.feed_forward)
        return x, ((self_weights, cross_weights) if need_weights else None)


# %% [markdown]
# A toy batch of German–English pairs in one shared toy vocabulary, as the paper shares one. The
# decoder's input is the target shifted right behind `<bos>` (the masking chapter), padded to $T$.

# %%
from transformer.embedding import PositionalEncoding, TokenEmbedding
from transformer.masking import padding_mask, target_mask

specials = ["<pad>", "<bos>", "<eos>"]
pairs = [
    ("ein Hund läuft durch den Schnee", "a dog runs through the snow"),
    ("zwei Hunde spielen", "two dogs play"),
    (
        "eine Frau fährt mit dem Fahrrad die Straße entlang",
        "a woman rides a bike down the street",
    ),
]
sources = [s.split() for s, _ in pairs]
targets = [t.split() for _, t in pairs]
words = sorted({w for s in sources + targets for w in s})
vocab = {t: i for i, t in enumerate(specials + words)}
pad_id, bos_id, eos_id = vocab["<pad>"], vocab["<bos>"], vocab["<eos>"]


def pad(rows: list[list[int]]) -> torch.Tensor:
    longest = max(len(r) for r in rows)
    return torch.tensor([r + [pad_id] * (longest - len(r)) for r in rows])


src = pad([[vocab[w] for w in s] + [eos_id] for s in sources])  # (B, S)
tgt = pad([[bos_id] + [vocab[w] for w in t] for t in targets])  # (B, T)
src_mask, tgt_mask = padding_mask(src, pad_id), target_mask(tgt, pad_id)
B, S = src.shape
T = tgt.shape[1]
print("src", tuple(src.shape), " src_mask", tuple(src_mask.shape))
print("tgt", tuple(tgt.shape), " tgt_mask", tuple(tgt_mask.shape))

# %% [markdown]
# The memory comes from a random-weight encoder ($d_\text{model} = 32$, $H = 4$, $d_{ff} = 64$,
# evaluation mode). With random weights the numbers say nothing about translation; the shapes and
# the masks are what matter.

# %%
from transformer.decoder import DecoderLayer
from transformer.encoder import Encoder

d_model, n_heads, d_ff, n_layers = 32, 4, 64, 3
embed = TokenEmbedding(len(vocab), d_model)
position = PositionalEncoding(d_model, max_len=64).eval()
encoder = Encoder(n_layers, d_model, n_heads, d_ff).eval()
layer = DecoderLayer(d_model, n_heads, d_ff).eval()

with torch.no_grad():
    memory, _ = encoder(position(embed(src)), src_mask)  # (B, S, d_model)
    x = position(embed(tgt))  # (B, T, d_model), the decoder's input
    out, (self_w, cross_w) = layer(
        x, memory, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=True
    )
print("memory       ", tuple(memory.shape))
print("output       ", tuple(out.shape))
print("self weights ", tuple(self_w.shape), "(B, H, T, T)")
print("cross weights", tuple(cross_w.shape), "(B, H, T, S)")
assert out.shape == (B, T, d_model)
assert self_w.shape == (B, n_heads, T, T) and cross_w.shape == (
    B,
    n_heads,
    T,
    S,
)

# %% [markdown]
# The masks show in the weights: no query gives weight to a later target position or to source
# padding, and `<bos>` attends only to itself.

# %%
later = ~torch.ones(
    T, T, dtype=torch.bool
).tril()  # (T, T), True above the diagonal
assert (self_w[..., later] == 0).all()
assert (cross_w.masked_select(~src_mask) == 0).all()
assert torch.allclose(self_w[:, :, 0, 0], torch.ones(B, n_heads))
self_w[0].mean(
    0
)  # "<bos> a dog runs through the snow", averaged over the heads

# %% [markdown]
# A decoder layer has one attention block and one LayerNorm more than an encoder layer:
# $2(4 d_\text{model}^2 + 4 d_\text{model}) + 2\, d_\text{model} d_{ff} + d_{ff} +
# d_\text{model} + 3 \cdot 2\, d_\text{model}$ parameters, the attention biases included.

# %%
n_attention = (
    4 * d_model**2 + 4 * d_model
)  # W^Q, W^K, W^V, W^O and their biases
n_decoder_layer = (
    2 * n_attention + 2 * d_model * d_ff + d_ff + d_model + 6 * d_model
)
assert sum(p.numel() for p in layer.parameters()) == n_decoder_layer
n_decoder_layer

# %% [markdown]
# ## The stack
#
# Like the encoder, the decoder is `n_layers` layers built one by one, with a final LayerNorm only
# when pre-norm. Every layer attends to the *same* memory. A `DecoderCache` holds the two caches
# of every layer for translation, where the stack runs once per output token.


# %%
#| export
@dataclass
class DecoderCache:
    """Each decoder layer's keys and values, kept between decoding steps.

    self_attn[i] grows by one position per step; cross_attn[i] is static: the
    memory's keys and values, projected at the first step.
    """

    self_attn: list[KVCache]
    cross_attn: list[KVCache]

    @classmethod
    def empty(cls, n_layers: int) -> "DecoderCache":
        """The cache of an n_layers stack before the first step."""
        return cls(
            self_attn=[KVCache() for _ in range(n_layers)],
            cross_attn=[KVCache(static=True) for _ in range(n_layers)],
        )

    @property
    def length(self) -> int:
        """The number of target positions decoded so far."""
        return self.self_attn[0].length

    def reorder(self, index: Tensor, *, static: bool = True) -> None:
        """Keep batch rows `index` (B',), in that order: beam search following
        its beams.

        static=False leaves the encoder-decoder caches alone: when `index` only
        moves rows among the beams of each sentence, whose memory is the same,
        they would not change.
        """
        for cache in self.self_attn + (self.cross_attn if static else []):
            cache.reorder(index)


class Decoder(nn.Module):
    """N identical decoder layers, each attending to the same encoder memory
    (Section 3.1)."""

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
            DecoderLayer(
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
        # Post-norm layers end normalised; a pre-norm residual stream needs a
        # last LayerNorm.
        self.final_norm = (
            nn.LayerNorm(d_model, eps=1e-6) if norm_first else nn.Identity()
        )

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        need_weights: bool = False,
        cache: DecoderCache | None = None,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]] | None]:
        """Run the stack; with need_weights, also each layer's (self, cross)
        weights.

        Shapes:
            x: (B, T, d_model), the embedded target; memory: (B, S, d_model)
            src_mask: boolean (B, 1, 1, S); tgt_mask: boolean (B, 1, T, T)
            returns (B, T, d_model) and, if need_weights, a list of n_layers
                pairs
            (self weights (B, H, T, T), cross weights (B, H, T, S)), else None

        With a cache (the decoding chapter), x holds only the new positions,
        and tgt_mask, if any, covers all L cached positions: (B, 1, T, L).
        """
        all_weights = [] if need_weights else None
        for i, layer in enumerate(self.layers):
            x, weights = layer(
                x,
                memory,
                src_mask=src_mask,
                tgt_mask=tgt_mask,
                need_weights=need_weights,
                self_cache=cache.self_attn[i] if cache is not None else None,
                cross_cache=cache.cross_attn[i] if cache is not None else None,
            )
            if need_weights:
                all_weights.append(weights)
        return self.final_norm(x), all_weights


# %%
from transformer.decoder import Decoder

decoder = Decoder(n_layers, d_model, n_heads, d_ff).eval()
with torch.no_grad():
    hidden, all_weights = decoder(
        x, memory, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=True
    )
print("output", tuple(hidden.shape))
print(
    "weights per layer",
    [(tuple(s.shape), tuple(c.shape)) for s, c in all_weights],
)
assert hidden.shape == (B, T, d_model) and len(all_weights) == n_layers
assert isinstance(decoder.final_norm, nn.Identity)
assert isinstance(
    Decoder(1, 8, 2, 16, norm_first=True).final_norm, nn.LayerNorm
)

# %% [markdown]
# ## The decoder is causal
#
# In training, the decoder reads the whole shifted target at once and predicts all $T$ next tokens
# in one pass. That is honest only if the output at position $t$ depends on the target tokens
# $0, \dots, t$ alone, as it will at translation time. We check it: for every $t$, replace the
# target tokens after $t$ by random ones and compare the outputs up to $t$.

# %%
generator = torch.Generator().manual_seed(1)
largest_change = 0.0
with torch.no_grad():
    for t in range(T - 1):
        changed = tgt.clone()
        changed[:, t + 1 :] = torch.randint(
            len(specials), len(vocab), (B, T - t - 1), generator=generator
        )
        out_changed, _ = decoder(
            position(embed(changed)),
            memory,
            src_mask=src_mask,
            tgt_mask=target_mask(changed, pad_id),
        )
        gap = (out_changed[:, : t + 1] - hidden[:, : t + 1]).abs().max().item()
        largest_change = max(largest_change, gap)
assert largest_change < 1e-5
print(
    f"checked t = 0 .. {T - 2}: no output at or before t moved by 1e-5 or more"
)

# %% [markdown]
# Without the causal triangle, keeping only the target's padding, the same experiment moves the
# earlier outputs at once:

# %%
with torch.no_grad():
    changed = tgt.clone()
    changed[:, 2:] = torch.randint(
        len(specials), len(vocab), (B, T - 2), generator=generator
    )
    no_future_mask = {
        "src_mask": src_mask,
        "tgt_mask": padding_mask(tgt, pad_id),
    }
    before, _ = decoder(position(embed(tgt)), memory, **no_future_mask)
    after, _ = decoder(position(embed(changed)), memory, **no_future_mask)
leak = (after[:, :2] - before[:, :2]).abs().max().item()
assert leak > 1e-2
print(
    f"largest change at positions 0 and 1 without the causal mask: {leak:.2f}"
)

# %% [markdown]
# ## Both kinds of attention
#
# The figure shows the first layer's weights for the first pair, averaged over the heads, with
# separate colour scales. Left, the masked self-attention: empty above the diagonal and in the two
# `<pad>` columns; the `<bos>` row puts all its weight on `<bos>`. Right, the encoder–decoder
# attention, $T \times S$: every target position may look at the whole source except its padding.
# With random weights the rows are diffuse; a trained model learns to concentrate them, for
# instance on the source word being translated.

# %%
from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
token_of = {i: t for t, i in vocab.items()}
src_tokens = [token_of[i] for i in src[0].tolist()]
tgt_tokens = [token_of[i] for i in tgt[0].tolist()]
first_self, first_cross = all_weights[0]
alt.hconcat(
    heatmap(
        first_self[0].mean(0),
        x_labels=tgt_tokens,
        y_labels=tgt_tokens,
        title="masked self-attention (T × T)",
    ),
    heatmap(
        first_cross[0].mean(0),
        x_labels=src_tokens,
        y_labels=tgt_tokens,
        x_title="source key",
        title="encoder–decoder attention (T × S)",
    ),
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
# 1. Repeat the causality check with `Decoder(n_layers, d_model, n_heads, d_ff, norm_first=True)`.
# 2. Pass `tgt_mask=causal_mask(T)` (from `transformer.masking`, without the padding) and compare
#    the outputs: which positions change, and does the loss, which ignores padding, see it?
