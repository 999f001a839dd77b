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
# `transformer.config_checks`, and `transformer.knockout`, which switches parts of a model off.

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
# it as an `int`), dropout rates lie in $[0, 1)$, LayerNorm's
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
    set); a config checks that the heads split the width when it is made."""
    for name, kind in typing.get_type_hints(type(c)).items():
        value = getattr(c, name)
        if kind not in (int, int | None) or value is None:
            continue
        # bool is a subclass of int: True is not a size.
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(
                f"{name} must be a positive integer, got {value!r}"
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
# ## Switching parts off
#
# What is a part of a trained model for? Switch it off and measure what changes
# {cite:p}`michel2019sixteen,voita2019analyzing`. A head $h$ switched off contributes zeros to the
# concatenation before $W^O$; zeroing the $d_k$ rows $W^O_h$ that multiply its slice does the
# same, since $\mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_H)\,W^O = \sum_i
# \mathrm{head}_i W^O_i$ and $\mathrm{head}_h \cdot 0 = 0 \cdot W^O_h$ (in `w_o.weight`, stored
# transposed, they are columns; the bias stays). A sublayer is switched off by zeroing its last
# map, $W^O$ or $W_2$, bias included: its residual branch adds 0. The positional encoding is
# switched off by zeroing its table.
#
# So switching off is a change of weights, made in place by `knocked_out` and undone on leaving
# it: the forward pass and the searches see it, at no cost when nothing is off. A `KnockOut`
# names the parts, layers and heads counted from 1: `enc-self:L1h3` (a head), `dec-cross:L2` (a
# whole sublayer; also `dec-self`, `enc-ffn`, `dec-ffn`), `pe`, `enc-pe` or `dec-pe`.

# %%
#| export knockout
"""Parts of a trained model switched off (Michel et al., 2019): heads,
sublayers and the positional encodings, by zeroing the weights that carry
them, and restoring those weights afterwards."""

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.embedding import PositionalEncoding
from transformer.model import Transformer

# Each sublayer kind, in the model's order: its stack, its module in a layer,
# and that module's last linear map, whose output is the residual branch.
SUBLAYERS = {
    "enc-self": ("encoder", "self_attn", "w_o"),
    "enc-ffn": ("encoder", "feed_forward", "w_2"),
    "dec-self": ("decoder", "self_attn", "w_o"),
    "dec-cross": ("decoder", "cross_attn", "w_o"),
    "dec-ffn": ("decoder", "feed_forward", "w_2"),
}
ATTENTIONS = ("enc-self", "dec-self", "dec-cross")
POSITIONS = {"enc-pe": "src_pos", "dec-pe": "tgt_pos"}
KINDS = (*SUBLAYERS, *POSITIONS)
SPELLING = (
    "kind:L<layer>h<head> for a head (kinds enc-self, dec-self, dec-cross),"
    " kind:L<layer> for a whole sublayer (those and enc-ffn, dec-ffn), pe,"
    " enc-pe or dec-pe for the positional encodings; layers and heads count"
    " from 1, parts are separated by commas"
)
PART = re.compile(r"([a-z-]+):L([1-9][0-9]*)(?:h([1-9][0-9]*))?")


@dataclass(frozen=True)
class Part:
    """One part: a head (kind, layer, head), a whole sublayer (kind, layer) or
    a positional encoding (kind alone); layers and heads counted from 1."""

    kind: str
    layer: int | None = None
    head: int | None = None

    def __str__(self) -> str:
        if self.layer is None:
            return self.kind
        head = "" if self.head is None else f"h{self.head}"
        return f"{self.kind}:L{self.layer}{head}"

    def key(self) -> tuple[int, int, int]:
        """The order of printing: by kind, layer, then head."""
        return (KINDS.index(self.kind), self.layer or 0, self.head or 0)


def parse_part(item: str) -> list[Part]:
    """The parts that one comma-separated item names ("pe" names two)."""
    if item == "pe":
        return [Part(kind) for kind in POSITIONS]
    if item in POSITIONS:
        return [Part(item)]
    match = PART.fullmatch(item)
    if match is None or match[1] not in SUBLAYERS:
        raise ValueError(f"cannot read {item!r}: write {SPELLING}")
    kind, layer, head = match[1], int(match[2]), match[3]
    if head is not None and kind not in ATTENTIONS:
        raise ValueError(f"{item!r}: {kind} has no heads; write {kind}:L<n>")
    return [Part(kind, layer, None if head is None else int(head))]


@dataclass(frozen=True)
class KnockOut:
    """The parts of a model to switch off; `KnockOut.parse` reads the
    spelling that str() writes, "enc-self:L1h3,dec-cross:L2,pe"."""

    parts: frozenset[Part] = frozenset()

    @classmethod
    def parse(cls, text: str) -> "KnockOut":
        """The parts named in `text`; "" or spaces name none."""
        if not text.strip():
            return cls()
        items = [item.strip() for item in text.split(",")]
        return cls(frozenset(p for item in items for p in parse_part(item)))

    def __str__(self) -> str:
        parts = sorted(self.parts, key=Part.key)
        if {Part(kind) for kind in POSITIONS} <= self.parts:  # both: "pe"
            parts = [p for p in parts if p.kind not in POSITIONS] + ["pe"]
        return ",".join(map(str, parts))

    def __bool__(self) -> bool:
        return bool(self.parts)


# %% [markdown]
# `zeroed` finds the slices that carry a part; `knocked_out` zeroes them and writes the saved
# values back on exit, also when the body raises.


# %%
#| export knockout
def check_knockout(model: Transformer, spec: KnockOut) -> None:
    """A one-line ValueError for a part that `model` does not have."""
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    for part in sorted(spec.parts, key=Part.key):
        if part.layer is not None and part.layer > n_layers:
            raise ValueError(f"{part}: the model has {n_layers} layers")
        if part.head is not None and part.head > n_heads:
            raise ValueError(f"{part}: the model has {n_heads} heads")


def zeroed(model: Transformer, part: Part) -> list[tuple[Tensor, tuple]]:
    """The tensors, and the index in each, whose zeros switch `part` off."""
    everything = (...,)
    if part.kind in POSITIONS:
        encoding = getattr(model, POSITIONS[part.kind])
        if isinstance(encoding, PositionalEncoding):
            return [(encoding.pe, everything)]  # (max_len, d_model)
        return [(encoding.embedding.weight, everything)]  # learned
    stack, module, last = SUBLAYERS[part.kind]
    sublayer = getattr(getattr(model, stack).layers[part.layer - 1], module)
    linear = getattr(sublayer, last)
    if part.head is None:  # the whole branch: weight and bias
        return [
            (t, everything)
            for t in (linear.weight, linear.bias)
            if t is not None
        ]
    d_k, h = sublayer.d_k, part.head - 1
    # (d_model, H·d_k): head h's slice of the concatenation meets these columns
    return [(linear.weight, (slice(None), slice(h * d_k, (h + 1) * d_k)))]


@contextmanager
def knocked_out(
    model: Transformer, spec: KnockOut | str | None
) -> Iterator[Transformer]:
    """`model` with the parts of `spec` (a KnockOut or its spelling) switched
    off, in place; every weight is restored exactly on exit."""
    if isinstance(spec, str):
        spec = KnockOut.parse(spec)
    spec = spec or KnockOut()
    check_knockout(model, spec)
    with torch.no_grad():
        saved = [
            (tensor, index, tensor[index].clone())
            for part in spec.parts
            for tensor, index in zeroed(model, part)
        ]
    try:
        with torch.no_grad():
            for tensor, index, _ in saved:
                tensor[index] = 0.0
        yield model
    finally:
        with torch.no_grad():
            for tensor, index, value in saved:
                tensor[index] = value


# %% [markdown]
# On a small untrained model: a head off equals its slice zeroed as it enters $W^O$ (a pre-hook
# on `w_o`); a feed-forward sublayer off leaves $\mathrm{LayerNorm}(x + 0)$; every weight comes
# back bit for bit, also after an error.

# %%
import torch

from transformer.knockout import KnockOut, knocked_out
from transformer.masking import causal_mask, padding_mask
from transformer.model import Transformer

torch.manual_seed(0)
small = TransformerConfig(
    src_vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=64
)
model = Transformer(small).eval()
src, tgt = torch.randint(1, 50, (2, 7)), torch.randint(1, 50, (2, 5))
masks = dict(src_mask=padding_mask(src, 0), tgt_mask=causal_mask(5))
spec = KnockOut.parse("dec-cross:L2h3, enc-ffn:L1, pe")
print(spec)
assert KnockOut.parse(str(spec)) == spec

cross = model.decoder.layers[1].cross_attn
d_k = cross.d_k


def zero_head_3(module, inputs):  # head 3's slice of Concat(...)
    (x,) = inputs
    return x.index_fill(-1, torch.arange(2 * d_k, 3 * d_k), 0.0)


def every_tensor(model):  # the parameters, and the buffers: the sinusoids
    return dict([*model.named_parameters(), *model.named_buffers()])


before = {k: v.clone() for k, v in every_tensor(model).items()}
with torch.no_grad():
    with knocked_out(model, "dec-cross:L2h3"):
        off = model(src, tgt, **masks)
    hook = cross.w_o.register_forward_pre_hook(zero_head_3)
    by_hook = model(src, tgt, **masks)
    hook.remove()
    print(f"largest difference: {(off - by_hook).abs().max():.1e}")
    assert torch.allclose(off, by_hook, atol=1e-6)

    layer = model.encoder.layers[0]
    x = torch.randn(2, 7, 32)
    with knocked_out(model, "enc-ffn:L1"):
        assert torch.equal(
            layer.sublayers[1](x, layer.feed_forward),
            layer.sublayers[1].norm(x),
        )
try:
    with knocked_out(model, spec):
        raise RuntimeError("stopped inside")
except RuntimeError:
    pass
after = every_tensor(model)
assert all(torch.equal(before[k], after[k]) for k in before)
try:
    with knocked_out(model, "enc-self:L3h1"):
        pass
except ValueError as err:
    print(f"ValueError: {err}")

# %% [markdown]
# ## Summary
#
# - `check_config` refuses, by name, a field that cannot build a model; `check_record` refuses a
#   saved configuration with a key too many or too few; `config_from_dict` does both for a saved
#   configuration, and reads a field that the config gained after a model was saved as the value
#   that model was built with.
# - `knocked_out(model, spec)` switches heads, sublayers or positional encodings off by zeroing
#   their weights in place, and restores them on exit.
