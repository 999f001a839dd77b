# Generated from chapters/a02_model_engineering.ipynb: edit it, not this file.
"""The checks of a TransformerConfig that enters from a file or the command
line: each bad field is a ValueError that names it."""

# %% auto #0
__all__ = [
    "POSITIONAL_KINDS",
    "RATES",
    "ADDED_FIELDS",
    "check_sizes",
    "check_config",
    "check_record",
    "config_from_dict",
]

# %% ../chapters/a02_model_engineering.ipynb #821aca7f

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


# %% ../chapters/a02_model_engineering.ipynb #d3e04b98
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


# %% ../chapters/a02_model_engineering.ipynb #dae4428f
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
