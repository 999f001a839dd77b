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
# # Engineering the model
#
# The chapters of Part I build the model from the paper. Three pieces around it serve the rest of
# the package rather than the idea: the checks that refuse a configuration which cannot build a
# model, and a saved one that would rebuild another; the cache that carries each decoder layer's
# keys and values from one decoding step to the next; and the method that collects every
# attention weight of a forward pass for the figures. This appendix exports them, as
# `transformer.config_checks`, `transformer.decoder_cache` and `transformer.attention_maps`;
# [Putting it together](08_model.ipynb) and [The decoder](07_decoder.ipynb) use them.

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
#| default_exp config_checks

# %%
import dataclasses
import json

import torch

# %% [markdown]
# ## The configuration's checks
#
# `TransformerConfig.__post_init__` calls `check_config`, so that a configuration which cannot
# build a model fails when it is made, with a `ValueError` whose message starts with the field's
# name: sizes are positive integers (a `bool` is not one, although Python counts it as an `int`),
# the heads split the width, dropout rates lie in $[0, 1)$, the switches are booleans, the
# positional encoding is one of the two kinds, the sinusoids get an even width, and shared
# embeddings get one vocabulary.

# %%
#| export
"""The checks of a TransformerConfig and of a saved one: each bad field is a
ValueError that names it."""

import dataclasses
from typing import Any

POSITIONAL_KINDS = ("sinusoidal", "learned")


def check_sizes(c: Any) -> None:
    """Sizes are positive integers, and the heads split the width."""
    sizes = ["src_vocab_size", "d_model", "n_heads", "n_layers", "d_ff"]
    sizes += (
        ["max_len"]
        if c.tgt_vocab_size is None
        else ["max_len", "tgt_vocab_size"]
    )
    for name in sizes:
        value = getattr(c, name)
        # bool is a subclass of int: True is not a size.
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(
                f"{name} must be a positive integer, got {value!r}"
            )
    if c.d_model % c.n_heads != 0:
        raise ValueError(
            f"d_model ({c.d_model}) must be divisible by n_heads"
            f" ({c.n_heads}): each head works in d_model / n_heads"
            " dimensions"
        )


# %% [markdown]
# `check_config` starts with the sizes, then checks the rates, the switches and the fields that
# must agree with each other:

# %%
#| export
def check_config(c: Any) -> None:
    """A ValueError, naming the field, if config c cannot build a model."""
    check_sizes(c)
    for name in ("dropout", "attention_dropout", "ffn_dropout"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f"{name} must be a number in [0, 1), got {value!r}"
            )
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    for name in ("norm_first", "share_embeddings", "tie_output"):
        if not isinstance(getattr(c, name), bool):
            raise ValueError(
                f"{name} must be True or False, got {getattr(c, name)!r}"
            )
    if c.positional not in POSITIONAL_KINDS:
        raise ValueError(
            "positional must be one of"
            f" {', '.join(map(repr, POSITIONAL_KINDS))}, got"
            f" {c.positional!r}"
        )
    if c.positional == "sinusoidal" and c.d_model % 2 != 0:
        # The sinusoids come in sine/cosine pairs, one pair per two
        # dimensions (3.5).
        raise ValueError(
            f"d_model ({c.d_model}) must be even with"
            " positional='sinusoidal': the encoding pairs a sine and a"
            " cosine per frequency; use an even width or"
            " positional='learned'"
        )
    if c.share_embeddings and c.tgt_vocab_size is not None:
        raise ValueError(
            "share_embeddings=True needs one vocabulary shared by source"
            " and target (tgt_vocab_size=None), got"
            f" tgt_vocab_size={c.tgt_vocab_size}: set"
            " share_embeddings=False for two vocabularies"
        )


# %% [markdown]
# Each mistake below is caught when the config is made, and the message names the field. A
# variant is a new config, `dataclasses.replace(base, norm_first=True)`, validated in turn; the
# frozen config refuses to change.

# %%
from transformer.config import TransformerConfig

base = TransformerConfig.base(8_000)
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
        dataclasses.replace(base, **overrides)
    except ValueError as err:
        print(f"{what}:\n    {err}")
    else:
        raise AssertionError(f"{what} was accepted")

# %% [markdown]
# ## A saved configuration
#
# A checkpoint stores the config as JSON beside the weights: `to_dict` writes every field and
# `from_dict` rebuilds and validates the config, after `check_record` has compared the record's
# keys with the fields. An unknown key is an error, and so is a missing one, even with a default:
# a record without `norm_first` would otherwise come back post-norm, whatever model wrote it.

# %%
#| export
def check_record(record: dict[str, Any], cls: type) -> None:
    """A saved config lists every field of dataclass cls, and nothing else.

    Every field is required, those with a default too: to_dict writes them
    all, and a missing `norm_first` silently read as its default would rebuild
    another model.
    """
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(record) - known)
    if unknown:
        raise ValueError(
            f"unknown {cls.__name__} field(s) {', '.join(unknown)}; "
            f"known fields: {', '.join(sorted(known))}"
        )
    missing = sorted(known - set(record))
    if missing:
        raise ValueError(
            f"missing {cls.__name__} field(s) {', '.join(missing)}: "
            "a saved config lists every field"
        )


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
# ## The decoder's cache
#
# Translation runs the decoder once per output token. Without a cache each step would recompute
# the keys and values of every earlier position in every layer, and project the encoder's memory
# again. A `KVCache` ([Multi-head attention](03_multihead.ipynb)) keeps one attention block's keys and
# values; a `DecoderCache` keeps those of every layer: a growing one for each self-attention and
# a static one, projected from the memory at the first step, for each encoder–decoder attention.
# Beam search reorders the cached rows as it follows its beams ([Decoding](14_decoding.ipynb)).

# %%
#| export decoder_cache
"""The keys and values of every decoder layer, kept between decoding steps."""

from dataclasses import dataclass

from torch import Tensor

from transformer.multihead import KVCache


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


# %% [markdown]
# Decoding a tiny model's target one token at a time through the cache gives the outputs of one
# pass over the whole target, and the cache then holds every position:

# %%
from transformer.decoder_cache import DecoderCache
from transformer.masking import causal_mask
from transformer.model import Transformer

torch.manual_seed(0)
config = TransformerConfig(20, d_model=32, n_heads=4, n_layers=2, d_ff=64)
model = Transformer(config).eval()
src, tgt = torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5))
with torch.no_grad():
    memory = model.encode(src, None)
    whole = model.decode(tgt, memory, src_mask=None, tgt_mask=causal_mask(5))
    cache = DecoderCache.empty(config.n_layers)
    steps = [
        model.decode(
            tgt[:, t : t + 1],
            memory,
            src_mask=None,
            tgt_mask=None,
            cache=cache,
        )
        for t in range(5)
    ]
assert torch.allclose(torch.cat(steps, dim=1), whole, atol=1e-5)
print("positions cached:", cache.length)

# %% [markdown]
# ## Every attention weight
#
# The figures of [Results](15_results.ipynb) draw what a trained model attends to.
# `Transformer.attention_weights` runs one forward pass through both stacks, asking every layer
# for its weights, which a forward pass otherwise neither returns nor stores.

# %%
#| export attention_maps
"""Every attention weight of a Transformer's forward pass, for figures."""

from torch import Tensor, nn


def attention_weights(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    *,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
) -> dict[str, list[Tensor]]:
    """Every attention weight of one forward pass, one tensor per layer; the
    method Transformer.attention_weights.

    Shapes:
        "encoder": n_layers x (B, H, S, S); "decoder_self": n_layers x (B,
            H, T, T); "decoder_cross": n_layers x (B, H, T, S)
    """
    x = model.src_pos(model.src_embed(src))  # (B, S, d_model)
    memory, encoder_weights = model.encoder(x, src_mask, need_weights=True)
    y = model.tgt_pos(model.tgt_embed(tgt))  # (B, T, d_model)
    _, decoder_weights = model.decoder(
        y, memory, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=True
    )
    return {
        "encoder": encoder_weights,
        "decoder_self": [w for w, _ in decoder_weights],
        "decoder_cross": [w for _, w in decoder_weights],
    }


# %%
with torch.no_grad():
    weights = model.attention_weights(
        src, tgt, src_mask=None, tgt_mask=causal_mask(5)
    )
{name: [tuple(w.shape) for w in ws] for name, ws in weights.items()}

# %% [markdown]
# ## Summary
#
# - `check_config` refuses, by name, a field that cannot build a model; `check_record` refuses a
#   saved configuration with a key too many or too few.
# - `DecoderCache` holds every decoder layer's keys and values between decoding steps.
# - `Transformer.attention_weights` returns the weights of every attention block of one forward
#   pass.
