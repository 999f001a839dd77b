# Generated from chapters/a05_run_setup.ipynb: edit it, not this file.
"""The configuration of a training run: `TrainConfig`, whose fields carry their
own help, check and resume rule, and the named recipes."""

# %% auto #0
__all__ = [
    "MODEL_PRESETS",
    "BPE_DROPOUT_SIDES",
    "PEAK_BF16_FLOPS",
    "RENAMED_FIELDS",
    "BF16_FLAGS",
    "Check",
    "POSITIVE",
    "SOME_POSITIVE",
    "NATURAL",
    "MINUTES",
    "DEVICE",
    "RATE",
    "NON_NEGATIVE",
    "FOLDER",
    "BOOLEAN",
    "SHARE",
    "RESUME_FIXED",
    "RECIPES",
    "option",
    "flag_of",
    "value_type",
    "field_default",
    "fixed_on_resume",
    "default_folders",
    "with_current_names",
    "preset_model",
    "TrainConfig",
    "quick_config",
    "multi30k_recipe",
]

# %% ../chapters/a05_run_setup.ipynb #38815d93

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from transformer.config import TransformerConfig
from transformer.config_checks import check_config
from transformer.multi30k import PAIRS
from transformer.paths import CACHE_DIR, DATA_DIR
from transformer.precision import PRECISIONS
from transformer.tokenizer import VOCAB_SIZE

from . import layout

MODEL_PRESETS = ("small", "base", "big")
BPE_DROPOUT_SIDES = {"both": ("src", "tgt"), "source": ("src",)}
# measured bf16 matrix-multiply rate of an H100 or H200
PEAK_BF16_FLOPS = 790e12
_VOCAB_FIELDS = ("src_vocab_size", "tgt_vocab_size")
# Earlier names of fields, as stored runs and checkpoints may hold them.
RENAMED_FIELDS = {"model": "preset", "bf16": "precision"}
# An earlier bf16 flag as the precision it named (None: the device's choice).
BF16_FLAGS = {True: "bf16", False: "fp32", None: None}
# A check: a test of the value, and what a value that fails it is told.
Check = tuple[Callable[[Any], bool], str]


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: object) -> bool:
    return _integer(value) and value > 0


def _number(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and -math.inf < value < math.inf
    )


def _rate(value: object) -> bool:
    return _number(value) and value > 0


def _share(value: object) -> bool:
    return isinstance(value, int | float) and 0 <= value < 1


def _device(value: object) -> bool:
    import torch  # here, so that `train --help` loads no torch

    if value is None:
        return True
    try:
        torch.device(value)
    except (RuntimeError, TypeError):
        return False
    return True


POSITIVE: Check = (_positive, "must be a positive integer")
SOME_POSITIVE: Check = (
    lambda v: v is None or _positive(v),
    "must be a positive integer or None",
)
NATURAL: Check = (
    lambda v: _integer(v) and v >= 0,
    "must be a non-negative integer",
)
MINUTES: Check = (
    lambda v: v is None or _rate(v),
    "must be finite positive minutes or None",
)
DEVICE: Check = (_device, "must be a torch device such as cpu, cuda or cuda:1")
RATE: Check = (_rate, "must be a finite positive number")
NON_NEGATIVE: Check = (
    lambda v: _number(v) and v >= 0,
    "must be a finite number, 0 or more",
)
FOLDER: Check = (
    lambda v: v is None or isinstance(v, str | Path),
    "must be a folder's path or None",
)
BOOLEAN: Check = (lambda v: isinstance(v, bool), "must be True or False")
SHARE: Check = (
    lambda v: _share(v) and not isinstance(v, bool),
    "must be in [0, 1)",
)


def option(
    default: Any = dataclasses.MISSING,
    *,
    on_resume: Literal["fixed", "free"],
    help: str | None = None,
    check: Check | None = None,
    choices: tuple[str, ...] | None = None,
    flag: str | None = "",
    **field_args: Any,
) -> Any:
    """A TrainConfig field and everything about it: its command-line `help`,
    whether a resumed run must keep it ("fixed": it decides the updates) or
    may change it ("free"), its `check`, or the `choices` it is one of, and
    its option's `flag` ("": --field-name; None: no option)."""
    if choices is not None and check is None:
        check = (
            lambda v: v in choices,
            f"must be one of {', '.join(choices)}",
        )
    metadata = dict(
        help=help, on_resume=on_resume, check=check, choices=choices, flag=flag
    )
    return dataclasses.field(default=default, metadata=metadata, **field_args)


def flag_of(field: dataclasses.Field) -> str | None:
    """The command-line option that sets a TrainConfig field, if any."""
    flag = field.metadata.get("flag", None)
    return "--" + field.name.replace("_", "-") if flag == "" else flag


def value_type(field: dataclasses.Field) -> type:
    """The type of a field's values, None aside: `int | None` gives int."""
    kinds = [t for t in typing.get_args(field.type) if t is not type(None)]
    return kinds[0] if kinds else field.type


def field_default(field: dataclasses.Field) -> Any:
    """A field's default value (`dataclasses.MISSING` for a required one)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default


def fixed_on_resume(cls: type) -> tuple[str, ...]:
    """The fields of a TrainConfig class that a resumed run must keep."""
    fields = dataclasses.fields(cls)
    return tuple(f.name for f in fields if f.metadata["on_resume"] == "fixed")


def default_folders(pair: str) -> dict[str, Path]:
    """Where the folder fields of a run of `pair` point when left at None: the
    run's output, the encoded cache, the Multi30k files."""
    return {
        "out_dir": Path("runs") / pair,
        "cache_dir": CACHE_DIR,
        "data_dir": DATA_DIR,
    }


def with_current_names(fields: dict[str, Any]) -> dict[str, Any]:
    """Stored TrainConfig fields under today's names (RENAMED_FIELDS), a bf16
    flag as its precision; a field stored under both names keeps its later
    value."""
    current = {}
    for name, value in fields.items():
        if name == "bf16" and (value is None or isinstance(value, bool)):
            value = BF16_FLAGS[value]
        current[RENAMED_FIELDS.get(name, name)] = value
    return current


def preset_model(
    preset: str, vocab_size: int, overrides: dict[str, Any]
) -> TransformerConfig:
    """A preset's model config with `overrides` of any field but the
    vocabulary sizes; a bad override is a ValueError naming model_overrides."""
    fields = {f.name for f in dataclasses.fields(TransformerConfig)}
    known = fields - set(_VOCAB_FIELDS)
    bad = sorted(set(overrides) - known)
    if bad:
        raise ValueError(
            f"model_overrides: unknown or fixed field(s) {', '.join(bad)}"
            " (the vocabulary size comes from the tokenizer); known:"
            f" {', '.join(sorted(known))}"
        )
    try:  # the overrides' values, e.g. d_model % n_heads
        config = getattr(TransformerConfig, preset)(vocab_size, **overrides)
        check_config(config)  # where options from the command line enter
        return config
    except (ValueError, TypeError) as err:
        raise ValueError(f"model_overrides: {err}") from err


# Three defaults are held by modules of torch code (the batches, the schedule,
# the loss): a config reads them when it is made, so that the options, and
# `train --help`, load no torch.
def _max_tokens() -> int:
    from transformer.batches import MAX_TOKENS

    return MAX_TOKENS


def _warmup_steps() -> int:
    from transformer.schedule import WARMUP_STEPS

    return WARMUP_STEPS


def _label_smoothing() -> float:
    from transformer.loss import LABEL_SMOOTHING

    return LABEL_SMOOTHING


# %% ../chapters/a05_run_setup.ipynb #b8925a56
@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run; the defaults follow the paper
    where it says."""

    pair: str = option(
        on_resume="fixed", help="the language pair", choices=tuple(PAIRS)
    )
    preset: str = option(
        "small",
        on_resume="fixed",
        help="a TransformerConfig preset",
        choices=MODEL_PRESETS,
    )
    model_overrides: dict[str, Any] = option(  # --set FIELD=VALUE
        on_resume="fixed",
        help="fields of the model's config that differ from the preset",
        check=(lambda v: isinstance(v, dict), "must be a dict"),
        flag=None,
        default_factory=dict,
    )
    vocab_size: int = option(
        VOCAB_SIZE,
        on_resume="fixed",
        help="entries of the joint BPE",
        check=POSITIVE,
    )
    epochs: int = option(
        10, on_resume="free", help="epochs to train", check=POSITIVE
    )
    max_steps: int | None = option(
        None,
        on_resume="free",
        help="stop after this many updates",
        check=SOME_POSITIVE,
    )
    max_tokens: int = option(
        default_factory=_max_tokens,
        on_resume="fixed",
        help="padded tokens per batch and side",
        check=POSITIVE,
    )
    accumulation: int = option(
        1,
        on_resume="fixed",
        help="batches per process and update",
        check=POSITIVE,
    )
    warmup: int = option(
        default_factory=_warmup_steps,
        on_resume="fixed",
        help="updates of rising learning rate",
        check=POSITIVE,
    )
    lr_factor: float = option(
        1.0,
        on_resume="fixed",
        help="a factor on equation 3's rate",
        check=RATE,
    )
    label_smoothing: float = option(
        default_factory=_label_smoothing,
        on_resume="fixed",
        help="in [0, 1)",
        check=SHARE,
    )
    bpe_dropout: float = option(
        0.0, on_resume="fixed", help="in [0, 1); default 0: off", check=SHARE
    )
    bpe_dropout_sides: str = option(
        "both",
        on_resume="fixed",
        help="source: targets keep BPE's spelling",
        choices=tuple(BPE_DROPOUT_SIDES),
    )
    r_drop: float = option(
        0.0,
        on_resume="fixed",
        help="R-Drop's α, a KL term between two dropout passes"
        " (default 0: off)",
        check=NON_NEGATIVE,
    )
    seed: int = option(
        0,
        on_resume="fixed",
        help="of weights, order and dropout",
        check=NATURAL,
    )
    precision: str | None = option(
        None,
        on_resume="fixed",
        help="the arithmetic: bf16 or fp16 autocast, or fp32 (default: what"
        " the GPU has in hardware, bf16 from compute capability 8.0, fp16 with"
        " loss scaling on 7.x, fp32 on older GPUs and CPUs; a resumed run"
        " keeps its own)",
        check=(
            lambda v: v is None or v in PRECISIONS,
            f"must be one of {', '.join(PRECISIONS)} or None",
        ),
        choices=PRECISIONS,
    )
    compile: bool = option(
        False, on_resume="free", help="torch.compile the model", check=BOOLEAN
    )
    average_last: int = option(
        5,
        on_resume="free",
        help="checkpoints averaged at the end",
        check=NATURAL,
    )
    time_limit: float | None = option(
        None, on_resume="free", help="minutes", check=MINUTES
    )
    out_dir: Path | None = option(
        None,
        on_resume="free",
        help="output folder (default: runs/<pair>)",
        check=FOLDER,
        flag="--out",
    )
    cache_dir: Path | None = option(
        None,
        on_resume="free",
        help="default: the data chapter's",
        check=FOLDER,
    )
    data_dir: Path | None = option(
        None, on_resume="free", help="default: data/multi30k", check=FOLDER
    )
    device: str | None = option(
        None,
        on_resume="free",
        help="default: cuda if available, else cpu",
        check=DEVICE,
    )
    log_every: int = option(
        50,
        on_resume="free",
        help=f"updates per line of {layout.STEPS}",
        check=POSITIVE,
    )
    peak_flops: float = option(
        PEAK_BF16_FLOPS,
        on_resume="free",
        help="per device, for MFU",
        check=RATE,
    )

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            valid, message = field.metadata["check"] or (lambda v: True, "")
            if not valid(value := getattr(self, field.name)):
                raise ValueError(f"{field.name} {message}, got {value!r}")
        object.__setattr__(self, "model_overrides", dict(self.model_overrides))
        for name, default in default_folders(self.pair).items():
            folder = getattr(self, name)
            folder = default if folder is None else Path(folder)
            object.__setattr__(self, name, folder)
        overrides = self.model_overrides
        model = preset_model(self.preset, self.vocab_size, overrides)
        # Built once: the run's model, its optimiser and its schedule read it.
        object.__setattr__(self, "_model_config", model)

    def model_config(self, vocab_size: int | None = None) -> TransformerConfig:
        """The model's config, for a tokenizer of `vocab_size` entries
        (default: the config's own `vocab_size`)."""
        model = self._model_config
        if vocab_size is None or vocab_size == model.src_vocab_size:
            return model
        return dataclasses.replace(model, src_vocab_size=vocab_size)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary; a folder at its default is
        None, so that a stored run resumed elsewhere finds that machine's."""
        fields = dataclasses.asdict(self)
        for name, default in default_folders(self.pair).items():
            folder = fields[name]
            fields[name] = None if folder == default else str(folder)
        return fields

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """A config from `to_dict()`'s output, or a stored one of earlier
        names (RENAMED_FIELDS); unknown keys are errors."""
        d = with_current_names(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown TrainConfig field(s) {', '.join(unknown)}"
            )
        return cls(**d)


# The fields a resumed run must share with its checkpoint: they decide the
# updates themselves.
RESUME_FIXED = fixed_on_resume(TrainConfig)


# %% ../chapters/a05_run_setup.ipynb #e20acb14
def quick_config(pair: str, **overrides: Any) -> TrainConfig:
    """A tiny model trained for a few dozen updates: about a minute on a 2-core
    CPU. It states only what differs from the small preset and the defaults."""
    fields = dict(
        pair=pair,
        preset="small",
        model_overrides=dict(n_layers=2, d_model=64, n_heads=4, d_ff=256),
        epochs=1,
        max_steps=60,
        max_tokens=1500,
        warmup=40,
        average_last=0,
        log_every=5,
    )
    return TrainConfig(**(fields | overrides))


def multi30k_recipe(pair: str, **overrides: Any) -> TrainConfig:
    """The recipe of the book's Multi30k models (the training chapter's table)
    as a TrainConfig: what differs from the small preset and the defaults."""
    fields = dict(
        pair=pair,
        preset="small",
        model_overrides=dict(d_ff=512, dropout=0.3),
        epochs=35,
        max_tokens=3_000,
        warmup=800,
        lr_factor=0.7,
        precision="fp32",
    )
    return TrainConfig(**(fields | overrides))


RECIPES = {"multi30k": multi30k_recipe, "quick": quick_config}
