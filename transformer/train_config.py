# Generated from chapters/91_engineering.ipynb: edit it, not this file.
"""The configuration of a training run: `TrainConfig`, each field checked by a
table, the named recipes, and what a checkpoint records of the run."""

# %% auto #0
__all__ = [
    "MODEL_PRESETS",
    "BPE_DROPOUT_SIDES",
    "PEAK_BF16_FLOPS",
    "RECIPES",
    "RESUME_FIXED",
    "TrainConfig",
    "quick_mode",
    "quick_config",
    "multi30k_recipe",
    "run_record",
    "check_recipe",
    "resume_point",
]

# %% ../chapters/91_engineering.ipynb #e3b07755

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    Progress,
    latest_checkpoint,
    read_record,
    tokenizer_digest,
)
from transformer.config import TransformerConfig
from transformer.data import CACHE_DIR, DATA_DIR, MAX_TOKENS, PAIRS
from transformer.distributed import Distributed, barrier
from transformer.tokenizer import VOCAB_SIZE, Tokenizer

MODEL_PRESETS = ("small", "base", "big")
BPE_DROPOUT_SIDES = {"both": ("src", "tgt"), "source": ("src",)}
# measured bf16 matrix-multiply rate of an H100 or H200
PEAK_BF16_FLOPS = 790e12
_VOCAB_FIELDS = ("src_vocab_size", "tgt_vocab_size")


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: object) -> bool:
    return _integer(value) and value > 0


def _rate(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value < math.inf
    )


def _share(value: object) -> bool:
    return isinstance(value, int | float) and 0 <= value < 1


_POSITIVE = (_positive, "must be a positive integer")
_RATE = (_rate, "must be a finite positive number")
_TEXT = (lambda v: v is None or isinstance(v, str), "must be a string or None")
# Each field's check, in the order they are made; a value that fails is refused
# as "<field> <message>, got <value>".
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "vocab_size": _POSITIVE,
    "epochs": _POSITIVE,
    "max_tokens": _POSITIVE,
    "accumulation": _POSITIVE,
    "warmup": _POSITIVE,
    "max_steps": (
        lambda v: v is None or _positive(v),
        "must be a positive integer or None",
    ),
    "log_every": _POSITIVE,
    "seed": (
        lambda v: _integer(v) and v >= 0,
        "must be a non-negative integer",
    ),
    "average_last": (
        lambda v: isinstance(v, int) and v >= 0,
        "must be an integer >= 0",
    ),
    "lr_factor": _RATE,
    "peak_flops": _RATE,
    "label_smoothing": (_share, "must be in [0, 1)"),
    "bpe_dropout": (
        lambda v: _share(v) and not isinstance(v, bool),
        "must be in [0, 1)",
    ),
    "bpe_dropout_sides": (
        lambda v: isinstance(v, str) and v in BPE_DROPOUT_SIDES,
        f"must be one of {', '.join(BPE_DROPOUT_SIDES)}",
    ),
    "time_limit": (
        lambda v: v is None or _rate(v),
        "must be finite positive minutes or None",
    ),
    "bf16": (
        lambda v: v in (None, True, False),
        "must be True, False or None",
    ),
    "compile": (lambda v: isinstance(v, bool), "must be True or False"),
    "out_dir": _TEXT,
    "cache_dir": _TEXT,
    "data_dir": _TEXT,
    "device": _TEXT,
}


# %% ../chapters/91_engineering.ipynb #49a756bd
@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run; the defaults follow the paper
    where it says."""

    pair: str
    model: str = "small"  # a TransformerConfig preset
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    vocab_size: int = VOCAB_SIZE  # of the joint BPE vocabulary (data chapter)
    epochs: int = 10
    max_steps: int | None = None
    # padded tokens per batch and side, per process
    max_tokens: int = MAX_TOKENS
    accumulation: int = 1  # batches per process and update
    warmup: int = 4000
    lr_factor: float = 1.0
    label_smoothing: float = 0.1
    # on the training words (data chapter); 0: off (the paper)
    bpe_dropout: float = 0.0
    # or "source": targets keep BPE's own spelling
    bpe_dropout_sides: str = "both"
    seed: int = 0
    bf16: bool | None = None  # None: on with CUDA
    compile: bool = False
    average_last: int = 5  # checkpoints averaged at the end; 0 or 1: none
    time_limit: float | None = None  # minutes
    out_dir: str | None = None  # None: runs/<pair>
    cache_dir: str | None = None  # None: the data chapter's cache
    data_dir: str | None = None  # None: data/multi30k
    device: str | None = None  # None: cuda when available, else cpu
    log_every: int = 50  # updates between progress lines in steps.jsonl
    peak_flops: float = PEAK_BF16_FLOPS  # per device, for MFU

    def __post_init__(self) -> None:
        if self.pair not in PAIRS:
            raise ValueError(
                f"pair: unknown language pair {self.pair!r}, choose one of"
                f" {', '.join(PAIRS)}"
            )
        if self.model not in MODEL_PRESETS:
            raise ValueError(
                f"model: unknown preset {self.model!r}, choose one of"
                f" {', '.join(MODEL_PRESETS)}"
            )
        if not isinstance(self.model_overrides, dict):
            raise ValueError(
                f"model_overrides must be a dict, got {self.model_overrides!r}"
            )
        object.__setattr__(self, "model_overrides", dict(self.model_overrides))
        fields = {f.name for f in dataclasses.fields(TransformerConfig)}
        known = fields - set(_VOCAB_FIELDS)
        bad = sorted(set(self.model_overrides) - known)
        if bad:
            raise ValueError(
                f"model_overrides: unknown or fixed field(s) {', '.join(bad)}"
                " (the vocabulary size comes from the tokenizer); known:"
                f" {', '.join(sorted(known))}"
            )
        for name, (valid, message) in _CHECKS.items():
            if not valid(value := getattr(self, name)):
                raise ValueError(f"{name} {message}, got {value!r}")
        if self.device is not None:
            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(
                    "device must be a torch device such as cpu, cuda or"
                    f" cuda:1, got {self.device!r}"
                ) from None
        try:  # the overrides' values, e.g. d_model % n_heads
            self.model_config(self.vocab_size)
        except (ValueError, TypeError) as err:
            raise ValueError(f"model_overrides: {err}") from err

    def model_config(self, vocab_size: int) -> TransformerConfig:
        """The model's config for a tokenizer of `vocab_size` entries."""
        preset = getattr(TransformerConfig, self.model)
        return preset(vocab_size, **self.model_overrides)

    def uses_bf16(self, device_type: str) -> bool:
        """Whether to train and validate under bfloat16 autocast on a
        `device_type` device: `bf16` if set, otherwise on with CUDA only."""
        return self.bf16 if self.bf16 is not None else device_type == "cuda"

    @property
    def output_dir(self) -> Path:
        return Path(
            self.out_dir if self.out_dir is not None else f"runs/{self.pair}"
        )

    @property
    def cache_path(self) -> Path:
        return (
            Path(self.cache_dir) if self.cache_dir is not None else CACHE_DIR
        )

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir is not None else DATA_DIR

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """A config from `to_dict()`'s output; unknown keys are errors."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown TrainConfig field(s) {', '.join(unknown)}"
            )
        return cls(**d)


# %% ../chapters/91_engineering.ipynb #85a23221
def quick_mode() -> bool:
    """Whether heavy cells run their small CPU version: without a CUDA GPU, or
    when the environment sets TRANSFORMER_QUICK=1 (TRANSFORMER_QUICK=0 asks for
    the full version)."""
    flag = os.environ.get("TRANSFORMER_QUICK", "")
    if flag not in ("", "0", "1"):
        raise ValueError(f"TRANSFORMER_QUICK must be 0 or 1, got {flag!r}")
    if flag:
        return flag == "1"
    return not torch.cuda.is_available()


def quick_config(pair: str, **overrides: Any) -> TrainConfig:
    """A tiny model trained for a few dozen updates: about a minute on a 2-core
    CPU."""
    fields = dict(
        pair=pair,
        model="small",
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
    as a TrainConfig."""
    fields = dict(
        pair=pair,
        model="small",
        model_overrides=dict(
            n_layers=3, d_model=256, n_heads=8, d_ff=512, dropout=0.3
        ),
        epochs=35,
        max_tokens=3_000,
        warmup=800,
        lr_factor=0.7,
        average_last=5,
        bf16=False,
    )
    return TrainConfig(**(fields | overrides))


RECIPES = {"multi30k": multi30k_recipe, "quick": quick_config}


# %% ../chapters/91_engineering.ipynb #c9bd3cd4
def run_record(
    config: TrainConfig, model_config: TransformerConfig, tokenizer: Tokenizer
) -> dict[str, Any]:
    """What config.json holds: the model, the run, and the vocabulary's
    fingerprint."""
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model_config.to_dict(),
        "train": config.to_dict(),
        "vocab": {
            "size": tokenizer.vocab_size,
            "sha256": tokenizer_digest(tokenizer),
        },
    }


# The fields a resumed run must share with its checkpoint: they decide the
# updates themselves.
RESUME_FIXED = (
    "pair",
    "model",
    "model_overrides",
    "vocab_size",
    "max_tokens",
    "accumulation",
    "warmup",
    "lr_factor",
    "label_smoothing",
    "bpe_dropout",
    "bpe_dropout_sides",
    "seed",
)


def check_recipe(folder: Path, config: TrainConfig) -> None:
    """Raise CheckpointError, naming the folder and the field, if the
    checkpoint in `folder` was trained with another value of a field that
    decides the updates (RESUME_FIXED)."""
    stored = read_record(folder).get("train", {})
    for name in RESUME_FIXED:
        theirs, ours = stored.get(name), getattr(config, name)
        # name the field of the model that differs
        if name == "model_overrides":
            theirs, ours = theirs or {}, ours or {}
            for key in sorted(theirs.keys() | ours.keys()):
                if theirs.get(key) != ours.get(key):
                    raise CheckpointError(
                        f"{folder}: the checkpoint was trained with"
                        f" {name}.{key}={theirs.get(key)!r}, this run asks for"
                        f" {name}.{key}={ours.get(key)!r}"
                    )
        elif name in stored and theirs != ours:
            raise CheckpointError(
                f"{folder}: the checkpoint was trained with {name}={theirs!r},"
                f" this run asks for {name}={ours!r}"
            )


def resume_point(
    out: Path, config: TrainConfig, env: Distributed, *, resume: bool
) -> Path | None:
    """The checkpoint a run in `out` resumes from, if any, after the checks
    that need no data: the folder holds no other run unless resuming, and the
    checkpoint was trained with this recipe by as many processes."""
    checkpoint = latest_checkpoint(out)
    occupied = out.is_dir() and any(out.iterdir())
    # Every process looks at the folder before the first one writes into it, so
    # that all of them see the same thing, and refuse (or go on) together.
    barrier()
    if occupied and not resume:
        raise CheckpointError(
            f"output folder {out} is not empty: pass --resume to continue the"
            " run in it, or choose another --out"
        )
    if checkpoint is not None:
        check_recipe(checkpoint, config)
        processes = Progress.read(checkpoint).processes
        if processes != env.world_size:
            raise CheckpointError(
                f"{checkpoint}: the run was trained by {processes}"
                f" process(es), this one has {env.world_size}: they decide the"
                f" updates, so resume with {processes}"
            )
    return checkpoint
