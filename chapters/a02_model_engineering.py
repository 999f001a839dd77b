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
# The chapters of Part I build the model from the paper. Around it, the package needs checks that
# serve the rest of the package rather than the idea: they refuse a configuration which cannot
# build a model, and a saved one that would rebuild another. This appendix exports them as
# `transformer.config_checks`.

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

# %% [markdown]
# ## The configuration's checks
#
# `TransformerConfig` checks the paper's one constraint when it is made, that the heads split the
# width. A configuration that comes from outside the code, a saved checkpoint's or a run's model
# options given on the command line, is checked in full where it enters, by `check_config`, so
# that one which cannot build a model fails at once, with a `ValueError` whose message starts
# with the field's name: sizes are positive integers (a `bool` is not one, although Python counts
# it as an `int`), the heads split the width, dropout rates lie in $[0, 1)$, LayerNorm's
# $\epsilon$ is positive, the switches are booleans, the positional encoding is one of the two
# kinds, the sinusoids get an even width, and shared embeddings get one vocabulary. The sizes and
# the switches are found by their type, so that a new integer or boolean field is checked without
# a line here.

# %%
#| export
"""The checks of a TransformerConfig that enters from a file or the command
line: each bad field is a ValueError that names it."""

import dataclasses
import math
import typing
from typing import Any

from transformer.config import TransformerConfig
from transformer.layer_config import TENSOR2TENSOR_LAYER_NORM_EPS

POSITIONAL_KINDS = ("sinusoidal", "learned")
RATES = ("dropout", "attention_dropout", "ffn_dropout")


def check_sizes(c: Any) -> None:
    """The integer fields are positive integers (one that may be None, when
    set), and the heads split the width."""
    for name, kind in typing.get_type_hints(type(c)).items():
        value = getattr(c, name)
        if kind not in (int, int | None) or value is None:
            continue
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
    for name in RATES:
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(
                f"{name} must be a number in [0, 1), got {value!r}"
            )
        if not 0.0 <= value < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {value!r}")
    eps = c.layer_norm_eps
    number = isinstance(eps, int | float) and not isinstance(eps, bool)
    if not (number and 0 < eps and math.isfinite(eps)):
        raise ValueError(
            f"layer_norm_eps must be a positive number, got {eps!r}"
        )
    for name, kind in typing.get_type_hints(type(c)).items():
        value = getattr(c, name)
        if kind is bool and not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
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
# Each mistake below is caught, and the message names the field; the heads that do not divide the
# width already when the config is made. A variant is a new config,
# `dataclasses.replace(base, norm_first=True)`; the frozen config refuses to change.

# %%
from transformer.config import TransformerConfig
from transformer.config_checks import check_config

base = TransformerConfig.base(8_000)
try:
    base.d_model = 256
except dataclasses.FrozenInstanceError as err:
    print(f"{type(err).__name__}: {err}")

bad_configs = {
    "heads do not divide the width": dict(d_model=512, n_heads=7),
    "a non-positive size": dict(n_layers=0),
    "a dropout rate of 1": dict(dropout=1.0),
    "LayerNorm's ε at 0": dict(layer_norm_eps=0.0),
    "an unknown positional encoding": dict(positional="rotary"),
    "an odd width for the sinusoids": dict(d_model=513, n_heads=9),
    "shared embeddings with two vocabularies": dict(tgt_vocab_size=9_000),
}
for what, overrides in bad_configs.items():
    try:
        check_config(dataclasses.replace(base, **overrides))
    except ValueError as err:
        print(f"{what}:\n    {err}")
    else:
        raise AssertionError(f"{what} was accepted")

# %% [markdown]
# ## A saved configuration
#
# A checkpoint stores the config as JSON beside the weights: `to_dict` writes every field and
# `config_from_dict` rebuilds and checks the config, after `check_record` has compared the
# record's keys with the fields. An unknown key is an error, and so is a missing one, even with a
# default: a record without `norm_first` would otherwise come back post-norm, whatever model
# wrote it. The exceptions are the fields that the config gained after models were saved
# without them, `ADDED_FIELDS`: such a record reads as the value its model was built with, which
# is not the field's default, since a default may change. LayerNorm's $\epsilon$ is one: every
# model saved before the config recorded it, the shipped ones too, was built with
# tensor2tensor's.


# %%
#| export
# Fields added to TransformerConfig after models were saved without them, and
# the value those models were built with (not the default, which may change).
ADDED_FIELDS = {"layer_norm_eps": TENSOR2TENSOR_LAYER_NORM_EPS}


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


def config_from_dict(record: dict[str, Any]) -> TransformerConfig:
    """A config saved by to_dict, rebuilt: every field required but those of
    ADDED_FIELDS, which read as the value of the models saved before them;
    every value checked."""
    record = ADDED_FIELDS | record
    check_record(record, TransformerConfig)
    config = TransformerConfig(**record)
    check_config(config)
    return config


# %%
from transformer import layout
from transformer.config_checks import config_from_dict
from transformer.paths import CHECKPOINTS_DIR

prenorm = dataclasses.replace(base, norm_first=True)
saved = json.dumps(prenorm.to_dict())
assert config_from_dict(json.loads(saved)) == prenorm

incomplete = prenorm.to_dict()
del incomplete["norm_first"]
for record in (prenorm.to_dict() | {"n_head": 8}, incomplete):
    try:
        config_from_dict(record)
    except ValueError as err:
        print(f"ValueError: {err}")
    else:
        raise AssertionError("a damaged record was accepted")

# The shipped models were saved before their config recorded ε.
folder = CHECKPOINTS_DIR / "de-en"
shipped = json.loads((folder / layout.CONFIG).read_text())["model"]
assert "layer_norm_eps" not in shipped
eps = config_from_dict(shipped).layer_norm_eps
print(f"the shipped de-en model, saved without its ε, reads as ε = {eps}")

# %% [markdown]
# ## Summary
#
# - `check_config` refuses, by name, a field that cannot build a model; `check_record` refuses a
#   saved configuration with a key too many or too few; `config_from_dict` does both for a saved
#   configuration, and reads a field that the config gained after a model was saved as the value
#   that model was built with.
