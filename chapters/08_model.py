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
# # Putting it together
#
# The encoder and decoder are built; this chapter joins them into the model of the paper's
# Figure 1 {cite:p}`vaswani2017attention`: token embeddings and positional encodings on both
# sides, the two stacks, and an output layer that turns each decoder vector into a probability for
# every token of the vocabulary. One object, `TransformerConfig`, holds every hyperparameter, and
# `Transformer(config)` builds the model from it. The chapter ends with the first moment the model
# learns something: it is trained, in well under a minute on a CPU, to copy strings of letters.

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
#| default_exp model

# %%
import math

import pandas as pd
import torch
import torch.nn.functional as F

# %% [markdown]
# ## The configuration
#
# `TransformerConfig` is the sublayers chapter's `LayerConfig`, itself the multi-head chapter's
# `AttentionConfig` extended, with the fields of the whole model: the vocabulary sizes, the number
# of layers $N$ in each stack, the longest sequence that the positional encoding covers, the kind
# of positional encoding (Table 3, row E) and the two uses of the embedding table (below). One
# frozen object holds every hyperparameter, and the model hands it to each layer, which reads the
# fields it needs. The paper's $N$ is named once, like the base model's other sizes, and Table 3's
# base and big models are written from those names.
#
# The config is **frozen**: nobody changes `d_model` of a model that exists. A configuration that
# comes from a file or the command line is checked in full where it enters (the appendix
# [Engineering the model](a02_model_engineering.ipynb)). `to_dict` writes the fields for a
# checkpoint; the presets `base`, `big` and `small` take the vocabulary size and any field to
# override.

# %%
#| export config
"""The model's hyperparameters: a frozen, validated dataclass (Table 3)."""

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformer.attention_config import PAPER_D_MODEL, PAPER_N_HEADS
from transformer.layer_config import PAPER_D_FF, PAPER_DROPOUT, LayerConfig

# The paper's stacks: N = 6 identical layers each (Section 3.1, Table 3).
PAPER_N_LAYERS = 6
# Table 3's base and big models: N, d_model, h, d_ff and P_drop.
PAPER_BASE = dict(
    n_layers=PAPER_N_LAYERS,
    d_model=PAPER_D_MODEL,
    n_heads=PAPER_N_HEADS,
    d_ff=PAPER_D_FF,
    dropout=PAPER_DROPOUT,
)
PAPER_BIG = PAPER_BASE | dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)


@dataclass(frozen=True)
class TransformerConfig(LayerConfig):
    """Hyperparameters of the encoder-decoder Transformer: a LayerConfig, the
    vocabularies, N layers per stack, the positions and the shared weights;
    tgt_vocab_size=None: one vocabulary for both sides."""

    src_vocab_size: int
    tgt_vocab_size: int | None = None
    n_layers: int = PAPER_N_LAYERS
    max_len: int = 512
    positional: str = "sinusoidal"
    share_embeddings: bool = True
    tie_output: bool = True

    @property
    def target_vocab_size(self) -> int:
        """V of the output layer: the target vocabulary, or the shared one."""
        if self.tgt_vocab_size is None:
            return self.src_vocab_size
        return self.tgt_vocab_size

    @classmethod
    def base(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's base model (Table 3)."""
        return cls(src_vocab_size=vocab_size, **(PAPER_BASE | overrides))

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's big model (Table 3)."""
        return cls(src_vocab_size=vocab_size, **(PAPER_BIG | overrides))

    @classmethod
    def small(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """A starting point for Multi30k (the training chapter tunes it)."""
        fields = dict(n_layers=3, d_model=256, n_heads=8, d_ff=1024)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary (for checkpoints)."""
        return dataclasses.asdict(self)


# %% [markdown]
# Every field, with its default and the chapter's class that declares it. The options that the
# paper does not have are off by default; the appendix
# [Deviations from the paper](a01_deviations.ipynb) lists them.

# %%
import inspect
from dataclasses import MISSING, fields

from transformer.config import TransformerConfig


def declared_in(name: str) -> str:
    """The class of TransformerConfig's chain that declares field `name`."""
    chain = TransformerConfig.__mro__
    return next(
        k.__name__ for k in chain if name in inspect.get_annotations(k)
    )


pd.DataFrame(
    [
        {
            "field": f.name,
            "default": "required" if f.default is MISSING else f.default,
            "declared by": declared_in(f.name),
        }
        for f in fields(TransformerConfig)
    ]
).set_index("field")

# %% [markdown]
# The presets reproduce the rows of the paper's Table 3, typed in below from the paper, and a
# config that cannot work is refused at once:

# %%
VOCAB = 37_000  # the paper's shared English-German vocabulary, "about 37000"
presets = {"base": TransformerConfig.base(VOCAB)}
presets["big"] = TransformerConfig.big(VOCAB)
table3 = pd.DataFrame({name: c.to_dict() for name, c in presets.items()}).T
table3 = table3[["n_layers", "d_model", "d_ff", "n_heads", "dropout"]]
assert table3.loc["base"].tolist() == [6, 512, 2048, 8, 0.1]  # N, h, P_drop
assert table3.loc["big"].tolist() == [6, 1024, 4096, 16, 0.3]
try:
    TransformerConfig.base(VOCAB, n_heads=7)
except ValueError as err:
    print(f"ValueError: {err}")
table3

# %% [markdown]
# ## The model
#
# **The output layer.** The decoder leaves a vector of width $d_\text{model}$ at each target
# position; "the usual learned linear transformation and softmax function" (Section 3.4) turn it
# into next-token probabilities. Our `Generator` returns *log*-probabilities, which the loss needs,
# and has no bias, as in the reference code.
#
# **One matrix, three uses.** "We share the same weight matrix between the two embedding layers
# and the pre-softmax linear transformation" (Section 3.4). With one vocabulary for both languages
# the source and target embeddings are one table (`share_embeddings`), and the output layer's
# $V \times d_\text{model}$ matrix is that table too (`tie_output`): row $i$ both represents token
# $i$ at the input and scores it at the output {cite:p}`press2017using`. The modules hold the same
# `nn.Parameter`, so the optimiser sees one tensor whose gradient sums all three uses.
#
# **How the weights start.** The paper does not say; we follow the reference code, tensor2tensor.
# Every weight matrix of the two stacks is Glorot-uniform {cite:p}`glorot2010understanding`, every
# bias zero, so the attention biases, which the paper does not have, start inert. The embedding
# table is $\mathcal{N}(0, d_\text{model}^{-1})$ (the embeddings chapter), so the tied output
# layer's first logits have a spread near 1.

# %%
#| export
"""The Transformer of Vaswani et al. (2017): Figure 1, Sections 3.1-3.4."""

import torch
from torch import Tensor, nn

from transformer.config import TransformerConfig
from transformer.decoder import Decoder
from transformer.embedding import (
    LearnedPositionalEncoding,
    PositionalEncoding,
    TokenEmbedding,
)
from transformer.encoder import Encoder


class Generator(nn.Module):
    """The output layer: a linear map to the vocabulary, then log-softmax."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        # No bias, as in the reference code; the weight may be the embedding's.
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x (B, T, d_model) -> log-probabilities (B, T, V)."""
        return torch.log_softmax(self.proj(x), dim=-1)


def positional_encoding(c: TransformerConfig) -> nn.Module:
    """The sinusoids (3.5), or learned positions (Table 3, row E)."""
    if c.positional == "learned":
        return LearnedPositionalEncoding(c.d_model, c.max_len, c.dropout)
    return PositionalEncoding(c.d_model, c.max_len, c.dropout)


def init_weights(model: "Transformer") -> None:
    """Glorot-uniform matrices and zero biases in both stacks, as in the
    reference code; the embedding table keeps its N(0, 1/d_model)."""
    for stack in (model.encoder, model.decoder):
        for module in stack.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
    if not model.config.tie_output:
        nn.init.xavier_uniform_(model.generator.proj.weight)


# %% [markdown]
# `encode` and `decode` run the two halves on their own, as translation needs: it encodes a
# sentence once and decodes once per output token; `forward`, which training calls, runs both.


# %%
#| export
class Transformer(nn.Module):
    """The encoder-decoder Transformer, built from a TransformerConfig."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.src_embed = TokenEmbedding(c.src_vocab_size, c.d_model)
        # One table for both languages when they share a vocabulary (3.4).
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else TokenEmbedding(c.target_vocab_size, c.d_model)
        )
        self.src_pos = positional_encoding(c)
        self.tgt_pos = positional_encoding(c)
        # Each layer reads the sizes it needs from the config; N per stack.
        self.encoder = Encoder(c, c.n_layers)
        self.decoder = Decoder(c, c.n_layers)
        self.generator = Generator(c.d_model, c.target_vocab_size)
        init_weights(self)
        if c.tie_output:  # the same Parameter, not a copy (3.4)
            self.generator.proj.weight = self.tgt_embed.embedding.weight

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """Shapes: src (B, S) ids, src_mask (B, 1, 1, S) -> (B, S, d_model)."""
        x = self.src_pos(self.src_embed(src))  # (B, S, d_model)
        return self.encoder(x, src_mask)[0]

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        """Shapes: tgt (B, T) ids, memory (B, S, d_model), tgt_mask (B, 1, T,
        T) -> (B, T, d_model)."""
        x = self.tgt_pos(self.tgt_embed(tgt))  # (B, T, d_model)
        out, _ = self.decoder(x, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return out

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        """Shapes: src (B, S), tgt (B, T) -> log-probabilities (B, T, V)."""
        memory = self.encode(src, src_mask)
        out = self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return self.generator(out)


# %% [markdown]
# For the figures of the results chapter, the same pass again, asking every layer for its
# attention weights:


# %%
#| export
def attention_weights(
    model: Transformer,
    src: Tensor,
    tgt: Tensor,
    *,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
) -> dict[str, list[Tensor]]:
    """Every attention weight of one forward pass, one tensor per layer, for
    figures: "encoder" n_layers x (B, H, S, S), "decoder_self" (B, H, T, T),
    "decoder_cross" (B, H, T, S)."""
    x = model.src_pos(model.src_embed(src))  # (B, S, d_model)
    memory, encoder = model.encoder(x, src_mask, need_weights=True)
    y = model.tgt_pos(model.tgt_embed(tgt))  # (B, T, d_model)
    _, decoder = model.decoder(
        y, memory, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=True
    )
    return {
        "encoder": encoder,
        "decoder_self": [w for w, _ in decoder],
        "decoder_cross": [w for _, w in decoder],
    }


# %% [markdown]
# **Parameters.** Counted on PyTorch's `meta` device, which allocates nothing, the base and big
# presets with the paper's vocabulary of about 37,000 tokens have 63.1 and 214.2 million
# parameters against Table 3's 65 and 213 million. The base model's gap is in the embedding table:
# Table 3's rows fit our layers with a vocabulary of about 41,000 tokens rather than 37,000, as the
# appendix [Derivations and counts](a11_counts.ipynb) derives.

# %%
from transformer.model import Transformer

with torch.device("meta"):  # shapes only: nothing is allocated
    sizes = {
        name: sum(p.numel() for p in Transformer(config).parameters())
        for name, config in presets.items()
    }
pd.Series(sizes).map("{:,}".format).to_frame("parameters")

# %% [markdown]
# ## Learning to copy
#
# Nothing in the model knows the copy task: strings of 3 to 8 letters from an alphabet of ten,
# each ending with `<eos>`, padded; the target is the same string. The decoder reads it shifted
# right behind `<bos>`, and the labels are the source itself. The model must learn that the
# output at position $t$ is the source's letter at position $t$, which only the encoder–decoder
# attention can fetch.

# %%
from transformer.masking import causal_mask, padding_mask, target_mask

letters = "abcdefghij"
vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", *letters])}
pad_id, bos_id, eos_id = vocab["<pad>"], vocab["<bos>"], vocab["<eos>"]


def copy_batch(n: int, generator: torch.Generator, longest: int = 8):
    """n strings of 3 to `longest` letters: source, decoder input and labels,
    each (n, longest + 1); the labels are the source: copy it."""
    lengths = torch.randint(3, longest + 1, (n,), generator=generator)
    strings = torch.randint(
        vocab["a"], len(vocab), (n, longest), generator=generator
    )
    strings[torch.arange(longest) >= lengths[:, None]] = pad_id
    src = torch.cat([strings, torch.full((n, 1), pad_id)], dim=1)
    src[torch.arange(n), lengths] = eos_id  # the letters, <eos>, padding
    return src, torch.cat([torch.full((n, 1), bos_id), strings], dim=1), src


# %% [markdown]
# We build a tiny model for this 13-token vocabulary, two layers of width 64, whose three uses of
# the embedding table are one tensor, counted once by `model.parameters()`. We train it on 400
# fresh batches of 64 random strings with the paper's Adam settings (Section 5.3), minimising the
# negative log-likelihood of each next token, padding ignored. Two simplifications, which Part II
# replaces with the paper's choices: no dropout, since no batch is seen twice, and a learning
# rate that falls linearly from $10^{-3}$ to zero.

# %%
torch.manual_seed(0)
config = TransformerConfig(
    len(vocab), d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.0
)
model = Transformer(config)
table = model.src_embed.embedding.weight
assert model.tgt_embed.embedding.weight is model.generator.proj.weight is table
assert sum(p is table for p in model.parameters()) == 1

optimizer = torch.optim.Adam(
    model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9
)
steps, losses = 400, []
decay = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1 - s / steps)
batches = torch.Generator().manual_seed(1)
for _ in range(steps):
    src, tgt_in, labels = copy_batch(64, batches)
    src_mask, tgt_mask = padding_mask(src, pad_id), target_mask(tgt_in, pad_id)
    log_probs = model(src, tgt_in, src_mask=src_mask, tgt_mask=tgt_mask)
    loss = F.nll_loss(  # log_probs: (B, T, V)
        log_probs.flatten(0, 1), labels.flatten(), ignore_index=pad_id
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    decay.step()
    losses.append(loss.item())
assert losses[0] > math.log(len(vocab)) and sum(losses[-50:]) / 50 < 0.1

# %% [markdown]
# The chart shows the training loss at every step, against the dashed line of a uniform guess,
# $\ln 13 \approx 2.56$ nats. Read it from left to right: the loss starts above the line (random
# logits are worse than uniform ones), falls steeply within the first 200 steps, while the model
# learns to fetch each letter from the source, and ends near zero.

# %% tags=["nbval-ignore-output", "hide-input"]
import altair as alt

from transformer.plots import use_book_renderer

use_book_renderer()
curve = pd.DataFrame({"step": range(1, steps + 1), "loss": losses}).round(4)
line = alt.Chart(curve).mark_line().encode(x="step:Q", y="loss:Q")
uniform = pd.DataFrame({"loss": [round(math.log(len(vocab)), 4)]})  # ln V
guess = alt.Chart(uniform).mark_rule(strokeDash=[4, 4], color="gray")
(line + guess.encode(y="loss:Q")).properties(
    title="Learning to copy: training loss (nats per token)", width=420
)

# %% [markdown]
# To *use* the model we decode greedily: encode the source once, start the output with `<bos>`,
# and append the most probable next token, again and again, each time feeding the output so far
# back into the decoder. The decoding chapter does this properly, with a cache, beam search and a
# stopping rule; ten lines suffice here. On 100 new random strings:


# %% tags=["nbval-ignore-output"]
@torch.no_grad()
def greedy(model: Transformer, src: torch.Tensor, length: int) -> torch.Tensor:
    """The most probable token at each step: (B, S) ids -> (B, length)."""
    src_mask = padding_mask(src, pad_id)
    memory = model.encode(src, src_mask)  # once per sentence
    out = torch.full((src.size(0), 1), bos_id)  # (B, 1)
    for _ in range(length):
        mask = causal_mask(out.size(1))
        hidden = model.decode(out, memory, src_mask=src_mask, tgt_mask=mask)
        next_token = model.generator(hidden[:, -1]).argmax(-1)  # (B,)
        out = torch.cat([out, next_token[:, None]], dim=1)
    return out[:, 1:]  # without <bos>


def text(ids: list[int]) -> str:
    """The tokens up to the first <eos>, as a string."""
    token_of = {i: t for t, i in vocab.items()}
    return "".join(token_of[i] for i in ids).split("<eos>")[0]


src, _, _ = copy_batch(100, torch.Generator().manual_seed(2))
output = greedy(model.eval(), src, length=src.size(1))
pairs = [
    (text(s), text(o))
    for s, o in zip(src.tolist(), output.tolist(), strict=True)
]
copied = sum(s == o for s, o in pairs) / len(pairs)
assert copied >= 0.8
print(f"copied exactly: {copied:.0%} of {len(pairs)} strings")
pd.DataFrame(pairs[:6], columns=["source", "greedy output"])

# %% [markdown]
# The model is complete and it learns. Part II trains it on real sentence pairs.
#
# ## Summary
#
# - `TransformerConfig` holds every hyperparameter in a frozen, validated dataclass; its defaults
#   are the paper's base model, and `to_dict` stores it with a checkpoint.
# - `Transformer(config)` joins embeddings, positional encodings, encoder, decoder and the output
#   layer, with one embedding matrix shared three ways (Section 3.4) and tensor2tensor's
#   initialisation.
# - `encode` and `decode` run the two halves apart, as translation needs; a greedy loop over them
#   copies strings after a few hundred training steps.

# %% [markdown]
# ## Exercises
#
# 1. Train the copy task with `norm_first=True`, then with `dropout=0.1` (the paper's
#    $P_{drop}$): which curve falls fastest?
# 2. Decode strings of 12 letters, longer than any in training (`copy_batch(100, ..., longest=12)`,
#    with `length` to match). Where does copying break? Try again with `positional="learned"`.
# 3. Set `share_embeddings=False, tie_output=False` with `tgt_vocab_size=len(vocab)` and count the
#    parameters the sharing saved.
