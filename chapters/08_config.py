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
# # The model's configuration
#
# The encoder and decoder of the last two chapters take half a dozen numbers each: the width
# `d_model`, the number of heads `n_heads`, the inner width `d_ff`, the number of layers
# `n_layers`, dropout rates and a few switches. A full model passes them down to many modules,
# and a checkpoint must store them to rebuild the model that wrote it. This chapter gathers them
# into one object, `TransformerConfig`: a frozen dataclass whose defaults are the paper's base
# model {cite:p}`vaswani2017attention`, which checks itself when it is made, and which turns into
# a plain dictionary and back.
#
# Three properties make it safe to pass around. It is **frozen**: nobody changes `d_model` of a
# model that already exists. It is **validated**: a width that the heads cannot split, or a
# dropout rate of 1.5, fails at once with the field's name, not ten modules later with a shape
# error. And it is **explicit**: every field is an argument with a type and a default, with no
# global settings and no `exec` of a settings file.

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
#| default_exp config

# %%
import json

import pandas as pd

# %% [markdown]
# ## The fields
#
# | field | paper | default | meaning |
# | --- | --- | --- | --- |
# | `src_vocab_size` | | (required) | number of source subword tokens, $V$ |
# | `tgt_vocab_size` | | `None` | number of target tokens; `None` means one vocabulary shared by both languages |
# | `d_model` | $d_\text{model}$ | 512 | width of the residual stream, of the embeddings and of every sublayer's output |
# | `n_heads` | $h$ | 8 | attention heads ($h$ in the paper, $H$ in our shapes); each works in $d_k = d_v = d_\text{model}/h$ dimensions |
# | `n_layers` | $N$ | 6 | identical layers in the encoder, and as many in the decoder |
# | `d_ff` | $d_{ff}$ | 2048 | inner width of the position-wise feed-forward sublayer |
# | `dropout` | $P_{drop}$ | 0.1 | dropout on each sublayer's output and on the embedding sums (Section 5.4) |
# | `attention_dropout` | | 0.0 | dropout on the attention weights (**option**) |
# | `ffn_dropout` | | 0.0 | dropout after the feed-forward ReLU (**option**) |
# | `max_len` | | 512 | longest sequence the positional encoding covers (an implementation limit) |
# | `norm_first` | | `False` | pre-norm sublayers instead of the paper's post-norm (**option**) |
# | `positional` | | `"sinusoidal"` | `"learned"` positional embeddings instead (**option**, Table 3 row E) |
# | `share_embeddings` | | `True` | one embedding matrix for source and target tokens (Section 3.4) |
# | `tie_output` | | `True` | the target embedding is also the pre-softmax weight matrix (Section 3.4) |
#
# With the defaults, a config *is* the paper's base model. The fields marked **option** are the
# deviations that the book makes available, each off by default:
#
# - `attention_dropout` and `ffn_dropout`: the paper applies dropout "to the output of each
#   sub-layer, before it is added to the sub-layer input and normalized" and to "the sums of the
#   embeddings and the positional encodings" (Section 5.4), nowhere else. The reference code,
#   tensor2tensor, later added dropout on the attention weights and after the ReLU; the two
#   fields make those available for small data sets, where more regularisation can help.
# - `norm_first`: the paper normalises *after* adding the residual (post-norm,
#   $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$). Normalising the sublayer's *input* instead
#   (pre-norm) trains more stably without a long warm-up {cite:p}`xiong2020layer`; the sublayers
#   chapter shows both.
# - `positional="learned"`: the paper's Table 3, row E, replaces the sinusoids with learned position
#   embeddings, which gave "nearly identical results" (Section 3.5); it kept the sinusoids because
#   they may extrapolate to longer sentences.
# - `tgt_vocab_size` with `share_embeddings=False`: two vocabularies, one per language, and two
#   embedding matrices. The paper uses one shared byte-pair vocabulary of about 37,000 tokens for
#   English–German {cite:p}`sennrich2016neural` and a word-piece vocabulary of 32,000 for
#   English–French {cite:p}`wu2016google`.
#
# `max_len` is not a hyperparameter of the paper at all: sinusoids exist at every position, but
# the implementation precomputes a table, and learned position embeddings need a fixed number of
# rows.

# %% [markdown]
# ## The class
#
# Validation lives in `__post_init__`, which a dataclass runs after filling in the fields. Each
# check raises a `ValueError` whose message starts with the field's name, so that a bad
# command-line flag or a damaged checkpoint is named in the first line of the traceback. The
# presets `base`, `big` and `small` are class methods that take the vocabulary size and any
# field to override: `TransformerConfig.base(vocab_size=37_000, norm_first=True)`.

# %%
#| export
"""The model's hyperparameters: a frozen, validated dataclass (paper, Table 3)."""

import dataclasses
from dataclasses import dataclass
from typing import Any

POSITIONAL_KINDS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer; the defaults are the paper's base model.

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
        sizes = ["src_vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len"]
        if self.tgt_vocab_size is not None:
            sizes.append("tgt_vocab_size")
        for name in sizes:
            value = getattr(self, name)
            # bool is a subclass of int: True is not a size.
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads "
                f"({self.n_heads}): each head works in d_model / n_heads dimensions"
            )
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"{name} must be a number in [0, 1), got {value!r}")
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("norm_first", "share_embeddings", "tie_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"{name} must be True or False, got {getattr(self, name)!r}"
                )
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(
                f"positional must be one of {', '.join(map(repr, POSITIONAL_KINDS))}, "
                f"got {self.positional!r}"
            )
        if self.positional == "sinusoidal" and self.d_model % 2 != 0:
            # The sinusoids come in sine/cosine pairs, one pair per two dimensions (3.5).
            raise ValueError(
                f"d_model ({self.d_model}) must be even with positional='sinusoidal': "
                "the encoding pairs a sine and a cosine per frequency; use an even width "
                "or positional='learned'"
            )
        if self.share_embeddings and self.tgt_vocab_size is not None:
            raise ValueError(
                "share_embeddings=True needs one vocabulary shared by source and target "
                f"(tgt_vocab_size=None), got tgt_vocab_size={self.tgt_vocab_size}: "
                "set share_embeddings=False for two vocabularies"
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
        """The paper's base model (Table 3): N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1."""
        return cls(src_vocab_size=vocab_size, **overrides)

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's big model (Table 3): d_model=1024, d_ff=4096, h=16, P_drop=0.3."""
        fields = dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    @classmethod
    def small(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """A starting point for Multi30k: 3 layers of width 256 (the training part tunes it)."""
        fields = dict(n_layers=3, d_model=256, n_heads=8, d_ff=1024, dropout=0.1)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary (for checkpoints)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TransformerConfig":
        """Rebuild a config from `to_dict()`'s output; unknown or missing keys are errors.

        Every field is required, those with a default too: to_dict writes them all, and a
        missing `norm_first` silently read as its default would rebuild another model.
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
# ## The paper's Table 3, from the presets
#
# The paper's Table 3 lists the hyperparameters of its two main models. Below, the same rows
# are built from the presets; the columns that are not fields of the model's configuration
# (label smoothing $\epsilon_{ls}$, training steps, and the parameter count) are the paper's
# values, quoted, and belong to the training chapters and to the next chapter, which counts our
# own parameters.

# %%
from transformer.config import TransformerConfig

VOCAB = 37_000  # the paper's shared English-German byte-pair vocabulary, "about 37000"
presets = {"base": TransformerConfig.base(VOCAB), "big": TransformerConfig.big(VOCAB)}
# Quoted from the paper, Table 3 (not fields of the model's configuration).
paper_only = {
    "base": {"ε_ls": 0.1, "train steps": "100K", "params (paper)": "65M"},
    "big": {"ε_ls": 0.1, "train steps": "300K", "params (paper)": "213M"},
}
table3 = pd.DataFrame(
    {
        name: {
            "N": c.n_layers,
            "d_model": c.d_model,
            "d_ff": c.d_ff,
            "h": c.n_heads,
            "d_k": c.d_k,
            "d_v": c.d_k,
            "P_drop": c.dropout,
        }
        | paper_only[name]
        for name, c in presets.items()
    }
).T
table3

# %% [markdown]
# The presets must reproduce the paper's rows exactly; these are the numbers of Table 3, typed
# in from the paper:

# %%
paper_table3 = {
    "base": {"N": 6, "d_model": 512, "d_ff": 2048, "h": 8, "d_k": 64, "P_drop": 0.1},
    "big": {"N": 6, "d_model": 1024, "d_ff": 4096, "h": 16, "d_k": 64, "P_drop": 0.3},
}
for name, row in paper_table3.items():
    for column, value in row.items():
        assert table3.loc[name, column] == value, (name, column)

# %% [markdown]
# The base preset is the class's defaults, and every field not in the table follows the paper:
# post-norm, sinusoidal positions, shared and tied embeddings, no extra dropout. (The big model
# for English–French used $P_{drop} = 0.1$ rather than 0.3, Section 6.1:
# `TransformerConfig.big(vocab_size, dropout=0.1)`.)

# %%
base = presets["base"]
assert base == TransformerConfig(src_vocab_size=VOCAB)
assert not base.norm_first and base.positional == "sinusoidal"
assert base.share_embeddings and base.tie_output
assert base.attention_dropout == base.ffn_dropout == 0.0
assert base.target_vocab_size == VOCAB
base

# %% [markdown]
# The `small` preset is this book's starting point for Multi30k, whose 29,000 training pairs are
# about 155 times fewer than the 4.5 million sentence pairs of WMT 2014 English–German
# (Section 5.1): half the width and half the depth of the base model. The training part tunes it.

# %%
# WMT 2014 English-German sentence pairs / Multi30k training pairs
assert round(4_500_000 / 29_000) == 155
small = TransformerConfig.small(vocab_size=8_000)
assert (small.n_layers, small.d_model, small.n_heads, small.d_ff) == (3, 256, 8, 1024)
small

# %% [markdown]
# A config is frozen: changing a field of an existing config is an error. To make a variant,
# pass overrides to a preset, or use `dataclasses.replace`, which builds (and validates) a new
# config.

# %%
import dataclasses

try:
    base.d_model = 256
except dataclasses.FrozenInstanceError as err:
    print(f"{type(err).__name__}: {err}")

prenorm = dataclasses.replace(base, norm_first=True)
assert prenorm.norm_first and not base.norm_first

# %% [markdown]
# ## Validation
#
# Each mistake below is caught when the config is made, and the message names the field. The
# most common one: a width that the heads cannot split evenly.

# %%
bad_configs = {
    "heads do not divide the width": dict(d_model=512, n_heads=7),
    "a non-positive size": dict(n_layers=0),
    "a dropout rate of 1": dict(dropout=1.0),
    "a negative dropout rate": dict(attention_dropout=-0.1),
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
# Two vocabularies need `share_embeddings=False`; the output layer can still be tied to the
# target embedding, and `target_vocab_size` is the size of the target vocabulary.

# %%
two = TransformerConfig.small(8_000, tgt_vocab_size=6_000, share_embeddings=False)
assert two.target_vocab_size == 6_000 and two.tie_output
two.src_vocab_size, two.target_vocab_size

# %% [markdown]
# ## Saving and loading
#
# A checkpoint stores the config next to the weights, as JSON. `to_dict` gives a plain dictionary
# of every field and `from_dict` rebuilds the config from it, running the same validation. A key
# that the class does not know (a typo, or a checkpoint from another version of the code) is an
# error rather than silently ignored, and so is a missing one, even for a field that has a
# default: a record without `norm_first` and `n_layers` would otherwise come back as a post-norm,
# six-layer model, whatever model wrote it.

# %%
saved = json.dumps(prenorm.to_dict())
restored = TransformerConfig.from_dict(json.loads(saved))
assert restored == prenorm
print(saved)

# %%
damaged = prenorm.to_dict() | {"n_head": 8}
incomplete = prenorm.to_dict()
del incomplete["norm_first"], incomplete["n_layers"]
for record in (damaged, incomplete):
    try:
        TransformerConfig.from_dict(record)
    except ValueError as err:
        print(f"ValueError: {err}")
    else:
        raise AssertionError("a damaged record was accepted")

# %% [markdown]
# The next chapter builds the whole model from one of these objects: `Transformer(config)`.
