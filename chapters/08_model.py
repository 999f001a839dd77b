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
import dataclasses
import json
import math

import altair as alt
import pandas as pd
import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## The configuration
#
# `TransformerConfig` is a frozen dataclass whose defaults are the paper's base model (Table 3):
#
# | field | default | meaning |
# | --- | --- | --- |
# | `src_vocab_size` | required | source vocabulary size $V$ |
# | `tgt_vocab_size` | `None` | target vocabulary size; `None` means one shared vocabulary |
# | `d_model` | 512 | width of the embeddings and of every sublayer's output |
# | `n_heads` | 8 | heads $h$, each of width $d_k = d_\text{model}/h$ |
# | `n_layers` | 6 | layers $N$ in the encoder, and as many in the decoder |
# | `d_ff` | 2048 | inner width of the feed-forward network |
# | `dropout` | 0.1 | $P_{drop}$, on sublayer outputs and embedding sums (Section 5.4) |
# | `attention_dropout` | 0.0 | on the attention weights (option) |
# | `ffn_dropout` | 0.0 | after the feed-forward ReLU (option) |
# | `max_len` | 512 | longest sequence the positional encoding covers |
# | `norm_first` | `False` | pre-norm sublayers instead of post-norm (option) |
# | `positional` | `"sinusoidal"` | or `"learned"`, Table 3 row E (option) |
# | `share_embeddings` | `True` | one embedding table for both languages (Section 3.4) |
# | `tie_output` | `True` | the output layer reuses the target embedding (Section 3.4) |
#
# The options are off by default; the appendix [Deviations from the paper](90_deviations.ipynb) lists them. The config
# is **frozen**: nobody changes `d_model` of a model that exists. It is **validated** in
# `__post_init__`: a width the heads cannot split fails when the config is made, with a
# `ValueError` that starts with the field's name, not ten modules later with a shape error. The
# presets `base`, `big` and `small` take the vocabulary size and any field to override.

# %%
#| export config
"""The model's hyperparameters: a frozen, validated dataclass (Table 3)."""

import dataclasses
from dataclasses import dataclass
from typing import Any

POSITIONAL_KINDS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer; the defaults are the
    paper's base model.

    `tgt_vocab_size=None` means one vocabulary shared by source and target.
    """

    src_vocab_size: int
    tgt_vocab_size: int | None = None
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    ffn_dropout: float = 0.0
    max_len: int = 512
    norm_first: bool = False
    positional: str = "sinusoidal"
    share_embeddings: bool = True
    tie_output: bool = True

    def __post_init__(self) -> None:
        sizes = [
            "src_vocab_size",
            "d_model",
            "n_heads",
            "n_layers",
            "d_ff",
            "max_len",
        ]
        if self.tgt_vocab_size is not None:
            sizes.append("tgt_vocab_size")
        for name in sizes:
            value = getattr(self, name)
            # bool is a subclass of int: True is not a size.
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value <= 0
            ):
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}"
                )
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads"
                f" ({self.n_heads}): each head works in d_model / n_heads"
                " dimensions"
            )
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(
                    f"{name} must be a number in [0, 1), got {value!r}"
                )
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("norm_first", "share_embeddings", "tie_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"{name} must be True or False, got"
                    f" {getattr(self, name)!r}"
                )
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(
                "positional must be one of"
                f" {', '.join(map(repr, POSITIONAL_KINDS))}, got"
                f" {self.positional!r}"
            )
        if self.positional == "sinusoidal" and self.d_model % 2 != 0:
            # The sinusoids come in sine/cosine pairs, one pair per two
            # dimensions (3.5).
            raise ValueError(
                f"d_model ({self.d_model}) must be even with"
                " positional='sinusoidal': the encoding pairs a sine and a"
                " cosine per frequency; use an even width or"
                " positional='learned'"
            )
        if self.share_embeddings and self.tgt_vocab_size is not None:
            raise ValueError(
                "share_embeddings=True needs one vocabulary shared by source"
                " and target (tgt_vocab_size=None), got"
                f" tgt_vocab_size={self.tgt_vocab_size}: set"
                " share_embeddings=False for two vocabularies"
            )

    @property
    def target_vocab_size(self) -> int:
        """V of the output layer: the target vocabulary, or the shared one."""
        if self.tgt_vocab_size is None:
            return self.src_vocab_size
        return self.tgt_vocab_size

    @property
    def d_k(self) -> int:
        """Width of one head's queries, keys and values."""
        return self.d_model // self.n_heads

    @classmethod
    def base(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's base model (Table 3): N=6, d_model=512, d_ff=2048, h=8,
        P_drop=0.1."""
        return cls(src_vocab_size=vocab_size, **overrides)

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's big model (Table 3): d_model=1024, d_ff=4096, h=16,
        P_drop=0.3."""
        fields = dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    @classmethod
    def small(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """A starting point for Multi30k: 3 layers of width 256 (the training
        part tunes it)."""
        fields = dict(
            n_layers=3, d_model=256, n_heads=8, d_ff=1024, dropout=0.1
        )
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary (for checkpoints)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TransformerConfig":
        """Rebuild a config from `to_dict()`'s output; unknown or missing keys
        are errors.

        Every field is required, those with a default too: to_dict writes them
        all, and a missing `norm_first` silently read as its default would
        rebuild another model.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown TransformerConfig field(s) {', '.join(unknown)}; "
                f"known fields: {', '.join(sorted(known))}"
            )
        missing = sorted(known - set(d))
        if missing:
            raise ValueError(
                f"missing TransformerConfig field(s) {', '.join(missing)}: "
                "a saved config lists every field"
            )
        return cls(**d)


# %% [markdown]
# The presets reproduce the rows of the paper's Table 3, typed in below from the paper; `small`
# is this book's starting point for Multi30k, about 155 times smaller than the paper's WMT data.

# %%
from transformer.config import TransformerConfig

# the paper's shared English-German byte-pair vocabulary, "about 37000"
VOCAB = 37_000
presets = {
    "base": TransformerConfig.base(VOCAB),
    "big": TransformerConfig.big(VOCAB),
    "small": TransformerConfig.small(8_000),
}
table3 = pd.DataFrame.from_dict(
    {
        name: {
            "N": c.n_layers,
            "d_model": c.d_model,
            "d_ff": c.d_ff,
            "h": c.n_heads,
            "d_k": c.d_k,
            "P_drop": c.dropout,
        }
        for name, c in presets.items()
    },
    orient="index",
)
paper_table3 = {
    "base": {
        "N": 6,
        "d_model": 512,
        "d_ff": 2048,
        "h": 8,
        "d_k": 64,
        "P_drop": 0.1,
    },
    "big": {
        "N": 6,
        "d_model": 1024,
        "d_ff": 4096,
        "h": 16,
        "d_k": 64,
        "P_drop": 0.3,
    },
}
for name, row in paper_table3.items():
    for column, value in row.items():
        assert table3.loc[name, column] == value, (name, column)
base = presets["base"]
assert base == TransformerConfig(src_vocab_size=VOCAB)
assert not base.norm_first and base.share_embeddings and base.tie_output
table3

# %% [markdown]
# Each mistake below is caught when the config is made, and the message names the field. A
# variant is a new config, `dataclasses.replace(base, norm_first=True)`, validated in turn.

# %%
try:
    base.d_model = 256
except dataclasses.FrozenInstanceError as err:
    print(f"{type(err).__name__}: {err}")

bad_configs = {
    "heads do not divide the width": dict(d_model=512, n_heads=7),
    "a non-positive size": dict(n_layers=0),
    "a dropout rate of 1": dict(dropout=1.0),
    "an unknown positional encoding": dict(positional="rotary"),
    "an odd width for the sinusoids": dict(d_model=513, n_heads=9),
    "shared embeddings with two vocabularies": dict(tgt_vocab_size=9_000),
}
for what, overrides in bad_configs.items():
    try:
        TransformerConfig.base(vocab_size=8_000, **overrides)
    except ValueError as err:
        print(f"{what}:\n    {err}")
    else:
        raise AssertionError(f"{what} was accepted")

# %% [markdown]
# A checkpoint stores the config as JSON beside the weights: `to_dict` writes every field and
# `from_dict` rebuilds and validates the config. An unknown key is an error, and so is a missing
# one, even with a default: a record without `norm_first` would otherwise come back post-norm,
# whatever model wrote it.

# %%
prenorm = dataclasses.replace(base, norm_first=True)
saved = json.dumps(prenorm.to_dict())
assert TransformerConfig.from_dict(json.loads(saved)) == prenorm

incomplete = prenorm.to_dict()
del incomplete["norm_first"]
for record in (prenorm.to_dict() | {"n_head": 8}, incomplete):
    try:
        TransformerConfig.from_dict(record)
    except ValueError as err:
        print(f"ValueError: {err}")
    else:
        raise AssertionError("a damaged record was accepted")

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
#
# Besides `forward`, which training calls, `encode` and `decode` run the two halves on their own:
# translation encodes a sentence once and decodes once per output token.

# %%
#| export
"""The Transformer: embeddings, encoder, decoder and output layer, Figure 1 and
Sections 3.1-3.4 of Vaswani et al. (2017)."""

import torch
from torch import Tensor, nn

from transformer.config import TransformerConfig
from transformer.decoder import Decoder, DecoderCache
from transformer.embedding import (
    LearnedPositionalEncoding,
    PositionalEncoding,
    TokenEmbedding,
)
from transformer.encoder import Encoder


class Generator(nn.Module):
    """The output layer: a linear map to the vocabulary and a log-softmax
    (Section 3.4)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        # No bias, as in the reference code; the weight may be the tied
        # embedding matrix.
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Log-probabilities of the next token.

        Shapes:
            x: (B, T, d_model)
            returns (B, T, V)
        """
        return torch.log_softmax(self.proj(x), dim=-1)


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
        positional = (
            PositionalEncoding
            if c.positional == "sinusoidal"
            else LearnedPositionalEncoding
        )
        self.src_pos = positional(
            c.d_model, max_len=c.max_len, dropout=c.dropout
        )
        self.tgt_pos = positional(
            c.d_model, max_len=c.max_len, dropout=c.dropout
        )
        stack = dict(
            n_layers=c.n_layers,
            d_model=c.d_model,
            n_heads=c.n_heads,
            d_ff=c.d_ff,
            dropout=c.dropout,
            attention_dropout=c.attention_dropout,
            ffn_dropout=c.ffn_dropout,
            norm_first=c.norm_first,
        )
        self.encoder = Encoder(**stack)
        self.decoder = Decoder(**stack)
        self.generator = Generator(c.d_model, c.target_vocab_size)
        self._init_weights()
        if c.tie_output:
            # The same Parameter object, not a copy: one tensor, one gradient
            # (3.4).
            self.generator.proj.weight = self.tgt_embed.embedding.weight

    def _init_weights(self) -> None:
        # Glorot-uniform matrices in both stacks, as the reference code, and
        # zero biases: the attention biases, which the reference code does not
        # have, start inert. The embedding tables keep TokenEmbedding's N(0,
        # 1/d_model).
        for stack in (self.encoder, self.decoder):
            for module in stack.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
        if not self.config.tie_output:
            nn.init.xavier_uniform_(self.generator.proj.weight)

    def _embed_source(self, src: Tensor) -> Tensor:
        return self.src_pos(self.src_embed(src))  # (B, S, d_model)

    def _embed_target(self, tgt: Tensor, start: int = 0) -> Tensor:
        return self.tgt_pos(
            self.tgt_embed(tgt), start=start
        )  # (B, T, d_model)

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """The encoder's memory of a batch of source sentences.

        Shapes:
            src: (B, S) token ids; src_mask: boolean (B, 1, 1, S)
                (padding_mask)
            returns (B, S, d_model)
        """
        memory, _ = self.encoder(self._embed_source(src), src_mask)
        return memory

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """The decoder's output vectors for a batch of (shifted) target
        sentences.

        Shapes:
            tgt: (B, T) token ids; memory: (B, S, d_model)
            src_mask: boolean (B, 1, 1, S); tgt_mask: boolean (B, 1, T, T)
                (target_mask)
            returns (B, T, d_model)

        With a cache (the decoding chapter), tgt holds only the new tokens,
        which take the positions after the cache.length ones already decoded,
        and tgt_mask, if any, covers all L cached positions, the new ones
        included: (B, 1, T, L).
        """
        start = cache.length if cache is not None else 0
        out, _ = self.decoder(
            self._embed_target(tgt, start=start),
            memory,
            src_mask=src_mask,
            tgt_mask=tgt_mask,
            cache=cache,
        )
        return out

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        """Log-probabilities of the next target token at every target position.

        Shapes:
            src: (B, S) and tgt: (B, T) token ids
            src_mask: boolean (B, 1, 1, S); tgt_mask: boolean (B, 1, T, T)
            returns (B, T, V)
        """
        memory = self.encode(src, src_mask)
        out = self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return self.generator(out)

    def attention_weights(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> dict[str, list[Tensor]]:
        """Every attention weight of one forward pass, one tensor per layer.

        Shapes:
            "encoder": n_layers x (B, H, S, S); "decoder_self": n_layers x (B,
                H, T, T);
            "decoder_cross": n_layers x (B, H, T, S)
        """
        memory, encoder_weights = self.encoder(
            self._embed_source(src), src_mask, need_weights=True
        )
        _, decoder_weights = self.decoder(
            self._embed_target(tgt),
            memory,
            src_mask=src_mask,
            tgt_mask=tgt_mask,
            need_weights=True,
        )
        return {
            "encoder": encoder_weights,
            "decoder_self": [w for w, _ in decoder_weights],
            "decoder_cross": [w for _, w in decoder_weights],
        }


# %% [markdown]
# ## A forward pass
#
# The task of this chapter's last section gives us a batch: strings of 3 to 8 letters from an
# alphabet of ten, each ending with `<eos>`, padded; the target is the same string. The decoder
# reads it shifted right behind `<bos>`, and the labels are the source itself. We build a tiny
# model for this 13-token vocabulary, two layers of width 64, without dropout.

# %%
from transformer.masking import causal_mask, padding_mask, target_mask
from transformer.model import Transformer

specials = ["<pad>", "<bos>", "<eos>"]
letters = list("abcdefghij")
vocab = {t: i for i, t in enumerate(specials + letters)}
pad_id, bos_id, eos_id = vocab["<pad>"], vocab["<bos>"], vocab["<eos>"]


def copy_batch(n: int, generator: torch.Generator, longest: int = 8):
    """n strings of 3 to `longest` letters: source, decoder input, labels, (n,
    longest + 1)."""
    lengths = torch.randint(3, longest + 1, (n,), generator=generator)
    strings = torch.randint(
        len(specials), len(vocab), (n, longest), generator=generator
    )
    strings[torch.arange(longest) >= lengths[:, None]] = pad_id
    src = torch.cat([strings, torch.full((n, 1), pad_id)], dim=1)
    src[torch.arange(n), lengths] = (
        eos_id  # (B, S): the letters, <eos>, padding
    )
    tgt_in = torch.cat(
        [torch.full((n, 1), bos_id), strings], dim=1
    )  # (B, T), T = S
    return src, tgt_in, src  # the labels are the source: copy it


src, tgt_in, labels = copy_batch(4, torch.Generator().manual_seed(0))
src_mask, tgt_mask = padding_mask(src, pad_id), target_mask(tgt_in, pad_id)
config = TransformerConfig(
    src_vocab_size=len(vocab),
    d_model=64,
    n_heads=4,
    n_layers=2,
    d_ff=128,
    dropout=0.0,
)
model = Transformer(config)
log_probs = model(src, tgt_in, src_mask=src_mask, tgt_mask=tgt_mask)
print("src      ", tuple(src.shape), "(B, S)")
print("tgt_in   ", tuple(tgt_in.shape), "(B, T)")
print("log-probs", tuple(log_probs.shape), "(B, T, V)")
assert log_probs.shape == (4, tgt_in.shape[1], len(vocab))
assert torch.allclose(log_probs.exp().sum(-1), torch.ones(log_probs.shape[:2]))
# attention_weights runs the same pass and returns every layer's weights, for
# later figures.
weights = model.attention_weights(
    src, tgt_in, src_mask=src_mask, tgt_mask=tgt_mask
)
assert [len(w) for w in weights.values()] == [config.n_layers] * 3

# %% [markdown]
# The three uses of the embedding table are one tensor, counted once by `model.parameters()`:

# %%
table = model.src_embed.embedding.weight
assert model.tgt_embed.embedding.weight is table
assert model.generator.proj.weight is table
assert sum(p is table for p in model.parameters()) == 1
print(
    "embedding table:", tuple(table.shape), "(V, d_model), shared three ways"
)

# %% [markdown]
# The initialisation does what the text promised: the matrices have the spread of Glorot's
# distribution, $\sqrt{2/(n_\text{in} + n_\text{out})}$, the embedding table $d_\text{model}^{-1/2}$,
# and the first logits a spread near 1, so the first predictions are spread over the vocabulary
# rather than confidently wrong.

# %%
d = config.d_model
w_q = model.encoder.layers[0].self_attn.w_q.weight
w_1 = model.decoder.layers[0].feed_forward.w_1.weight  # (d_ff, d_model)
model.eval()
with torch.no_grad():
    out = model.decode(
        tgt_in,
        model.encode(src, src_mask),
        src_mask=src_mask,
        tgt_mask=tgt_mask,
    )
    logits = model.generator.proj(out)[tgt_in != pad_id]
init = pd.DataFrame(
    {
        "measured std": [
            w_q.std().item(),
            w_1.std().item(),
            table.std().item(),
            logits.std().item(),
        ],
        "expected": [
            (2 / (d + d)) ** 0.5,
            (2 / (d + config.d_ff)) ** 0.5,
            d**-0.5,
            1.0,
        ],
    },
    index=[
        "W^Q, encoder layer 1",
        "W_1, decoder layer 1",
        "embedding table",
        "logits",
    ],
).round(4)
assert ((init["measured std"] / init["expected"]).between(0.75, 1.33)).all()
biases = [
    p for n, p in model.named_parameters() if "attn.w_" in n and "bias" in n
]
assert len(biases) == 3 * config.n_layers * 4 and all(
    (b == 0).all() for b in biases
)
init

# %% [markdown]
# **Parameters.** Counted on PyTorch's `meta` device, which allocates nothing, the base and big
# presets for $V = 37{,}000$ have 63.1 and 214.2 million parameters against Table 3's 65 and 213
# million; the appendix [Derivations and counts](93_counts.ipynb) derives both and locates the difference.

# %%
with torch.device("meta"):
    counts = {
        name: sum(p.numel() for p in Transformer(presets[name]).parameters())
        for name in ("base", "big")
    }
assert counts == {"base": 63_082_496, "big": 214_245_376}
{name: f"{n:,}" for name, n in counts.items()}

# %% [markdown]
# ## Learning to copy
#
# Nothing in the model knows the copy task: it must learn that the output at position $t$ is the
# source's letter at position $t$, which only the encoder–decoder attention can fetch. We train the
# tiny model on 400 fresh batches of 64 random strings with the paper's Adam settings
# (Section 5.3), minimising the negative log-likelihood of each next token, padding ignored. Two
# simplifications, which Part II replaces with the paper's choices: no dropout, since no batch is
# seen twice, and a learning rate that falls linearly from $10^{-3}$ to zero.

# %%
torch.manual_seed(0)
model = Transformer(config)
optimizer = torch.optim.Adam(
    model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9
)
steps, losses = 400, []
decay = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda step: 1 - step / steps
)
batches = torch.Generator().manual_seed(1)
for _ in range(steps):
    src, tgt_in, labels = copy_batch(64, batches)
    log_probs = model(
        src,
        tgt_in,
        src_mask=padding_mask(src, pad_id),
        tgt_mask=target_mask(tgt_in, pad_id),
    )  # (B, T, V)
    loss = F.nll_loss(
        log_probs.flatten(0, 1), labels.flatten(), ignore_index=pad_id
    )
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    decay.step()
    losses.append(loss.item())

uniform = math.log(len(vocab))  # ln V, the loss of a uniform guess
assert losses[0] > uniform and min(losses[:200]) < 0.5
assert sum(losses[-50:]) / 50 < 0.1

# %% [markdown]
# The chart shows the training loss at every step, against the dashed line of a uniform guess,
# $\ln 13 \approx 2.56$ nats. Read it from left to right: the loss starts above the line (random
# logits are worse than uniform ones), falls steeply within the first 200 steps, while the model
# learns to fetch each letter from the source, and ends near zero.

# %% tags=["nbval-ignore-output"]
from transformer.plots import use_book_renderer

use_book_renderer()
curve = pd.DataFrame({"step": range(1, steps + 1), "loss": losses}).round(4)
line = (
    alt.Chart(curve)
    .mark_line()
    .encode(
        x=alt.X("step:Q", title="training step"),
        y=alt.Y("loss:Q", title="NLL per token (nats)"),
    )
)
guess = (
    alt.Chart(pd.DataFrame({"loss": [round(uniform, 4)]}))
    .mark_rule(strokeDash=[4, 4], color="gray")
    .encode(y="loss:Q")
)
(line + guess).properties(
    title="Learning to copy: training loss", width=420, height=220
)


# %% [markdown]
# To *use* the model we decode greedily: encode the source once, start the output with `<bos>`,
# and append the most probable next token, again and again, each time feeding the output so far
# back into the decoder. The decoding chapter does this properly, with a cache, beam search and a
# stopping rule; ten lines suffice here. On 100 new random strings:

# %% tags=["nbval-ignore-output"]
@torch.no_grad()
def greedy(model: Transformer, src: torch.Tensor, length: int) -> torch.Tensor:
    """The most probable token at each step, `length` times: (B, S) ids -> (B,
    length)."""
    src_mask = padding_mask(src, pad_id)
    memory = model.encode(src, src_mask)  # once per sentence
    out = torch.full((src.size(0), 1), bos_id)  # (B, 1)
    for _ in range(length):
        tgt_mask = causal_mask(out.size(1))
        hidden = model.decode(
            out, memory, src_mask=src_mask, tgt_mask=tgt_mask
        )
        next_token = model.generator(hidden[:, -1]).argmax(-1)  # (B,)
        out = torch.cat([out, next_token[:, None]], dim=1)
    return out[:, 1:]  # without <bos>


def text(ids: list[int]) -> str:
    """The letters up to the first <eos>."""
    ids = ids[: ids.index(eos_id)] if eos_id in ids else ids
    return "".join(
        letters[i - len(specials)] if i >= len(specials) else "?" for i in ids
    )


model.eval()
src, _, _ = copy_batch(100, torch.Generator().manual_seed(2))
output = greedy(model, src, length=src.size(1))
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
#   are the paper's base model, and `to_dict`/`from_dict` store it with a checkpoint.
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
