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
# # Setting up a run
#
# The training chapter's loop runs in one process until it is done. A run of hours on a GPU that
# may be taken away needs more. This appendix sets a run up: the configuration, which refuses bad values; its arithmetic; the processes that share the
# work on several GPUs; and each epoch's data, checked before the first update.
# [Checkpoints](a06_checkpoints.ipynb) saves a run and ships its model; [The
# Trainer](a07_trainer.ipynb) makes the updates.

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
#| default_exp train_config

# %%
import json

import torch

torch.manual_seed(0)
torch.set_printoptions(precision=4)

# %% [markdown]
# ## The configuration
#
# A run is one frozen dataclass, `TrainConfig`. Its model is a `TransformerConfig` preset (`small`,
# `base` or `big`) with overrides of any field but the vocabulary size, which the tokenizer gives.
# The defaults follow the paper where it has a value. `option` defines each field once: its
# default, its command-line help, its check, and whether a resumed run may change it. The command
# line builds its options from the fields, and the config checks every field when it is made, so a
# bad value is refused, naming its field, before anything runs. The run stores the config as
# `train_config.json`, which `--resume` reads back so that the same command can be repeated after a
# stop, and in each checkpoint's `config.json`. Folders (`out_dir`, `cache_dir`, `data_dir`) left
# at `None` are stored as `None`, so that a run resumed on another machine finds that machine's
# defaults.

# %%
#| export train_config
"""The configuration of a training run: `TrainConfig`, whose fields carry their
own help, check and resume rule, and the named recipes."""

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from transformer import layout
from transformer.config import TransformerConfig
from transformer.config_checks import check_config
from transformer.multi30k import PAIRS
from transformer.paths import CACHE_DIR, DATA_DIR
from transformer.precision import PRECISIONS
from transformer.tokenizer import VOCAB_SIZE

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


# %% [markdown]
# ### Arithmetic
#
# A GPU multiplies matrices fastest in 16 bits, in the formats of its generation, NVIDIA's *compute
# capability*. From 8.0 (A100, L4, H100) it has bfloat16 hardware; bfloat16 keeps float32's range,
# so autocast to it needs nothing more. At 7.0 and 7.5 (V100, T4) it has float16 tensor cores only:
# PyTorch emulates bfloat16 there, slowly, though `torch.cuda.is_bf16_supported()` says yes unless
# asked with `including_emulation=False`. float16's smaller range would round small gradients to
# zero, so a float16 run scales its loss ([The Trainer](a07_trainer.ipynb) shows how). A run's
# `precision` (`bf16`, `fp16` or `fp32`), left unset, is the fastest the device has in hardware; a
# resumed run keeps its own.

# %%
#| export precision
"""The arithmetic of a training run: bfloat16 or float16 autocast, or float32;
by default the fastest that the device has in hardware."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is loaded by a run, not by `train --help`
    import torch

PRECISIONS = ("bf16", "fp16", "fp32")


def autocast_type(precision: str) -> "torch.dtype | None":
    """autocast's type for `precision` (fp32 runs without autocast)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[
        precision
    ]


def precision_for(capability: tuple[int, int] | None) -> str:
    """The precision of a GPU of compute capability `capability` (None: a
    CPU): bf16 from 8.0, fp16 with its float16 tensor cores on 7.x, fp32
    otherwise."""
    if capability is None or capability < (7, 0):
        return "fp32"
    return "bf16" if capability >= (8, 0) else "fp16"


def default_precision(device: "torch.device") -> str:
    """The precision a run on `device` gets unless it asks for one."""
    import torch

    if device.type != "cuda":
        return precision_for(None)
    precision = precision_for(torch.cuda.get_device_capability(device))
    with torch.cuda.device(device):  # it asks about the current device
        # without the argument it also answers yes where bf16 is emulated
        hardware = torch.cuda.is_bf16_supported(including_emulation=False)
    return "fp16" if precision == "bf16" and not hardware else precision


def stored_precision(precision: str | None, device_type: str) -> str:
    """The precision of a stored run: `precision`, or for a run stored
    without one, what it trained in: bf16 with CUDA, fp32 on a CPU."""
    if precision is not None:
        return precision
    return "bf16" if device_type == "cuda" else "fp32"


# %% [markdown]
# The common GPUs, by their capabilities:

# %%
from transformer.precision import default_precision, precision_for

gpus = {"V100": (7, 0), "T4": (7, 5), "A100": (8, 0), "L4": (8, 9)}
for name, capability in (gpus | {"H100": (9, 0)}).items():
    print(
        f"{name}, compute capability {capability}: {precision_for(capability)}"
    )
print(f"a CPU: {default_precision(torch.device('cpu'))}")

# %% [markdown]
# The dataclass itself:


# %%
#| export train_config
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


# %% [markdown]
# Every field: the command-line option that sets it (the model's overrides are set with `--set
# FIELD=VALUE`), its default, and whether a resumed run must keep it (`fixed`) or may change it
# (`free`):

# %%
import dataclasses

import pandas as pd

from transformer.train_config import TrainConfig, field_default, flag_of


def default_of(field: dataclasses.Field) -> str:
    """A field's default as the table shows it; "required" for none."""
    value = field_default(field)
    if value is dataclasses.MISSING:
        return "required"
    return f"{value:g}" if isinstance(value, float) else str(value)


every = dataclasses.fields(TrainConfig)
pd.DataFrame(
    {
        "option": [flag_of(f) or "" for f in every],
        "default": [default_of(f) for f in every],
        "on resume": [f.metadata["on_resume"] for f in every],
    },
    index=[f.name for f in every],
)

# %% [markdown]
# ## Presets and recipes
#
# A recipe is a function that returns a `TrainConfig`; `--config NAME` picks one from `RECIPES`:
# `multi30k`, the recipe of the book's two models (the training chapter's table), and `quick`, a
# tiny model trained for a few dozen updates on a CPU. A recipe names its preset and states only
# what it changes, so it reads as its choices.

# %%
#| export train_config
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

# %% [markdown]
# A config survives the trip through JSON, a bad value is caught with its field's name, and the
# recipe's model has 6.0M parameters:

# %%
from transformer.model import Transformer
from transformer.train_config import TrainConfig, multi30k_recipe

config = TrainConfig(
    pair="de-en", preset="small", model_overrides={"dropout": 0.3}, warmup=2000
)
assert (
    TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
)
print(config.model_config(8000))
for bad in [
    dict(pair="en-de"),
    dict(pair="de-en", warmup=0),
    dict(pair="de-en", label_smoothing=1.0),
    dict(pair="de-en", model_overrides={"d_model": 100}),
]:
    try:
        TrainConfig(**bad)
    except ValueError as err:
        print("ValueError:", err)
    else:
        raise AssertionError(f"{bad} was accepted")
recipe = multi30k_recipe("de-en").model_config(8000)
n_params = sum(p.numel() for p in Transformer(recipe).parameters())
print(f"the recipe's model: {n_params:,} parameters")
assert n_params == 6_001_664

# %% [markdown]
# ## Several processes
#
# With several GPUs, PyTorch's `DistributedDataParallel` (DDP) keeps a copy of the model on each,
# one process per GPU, as the paper trained on eight. Each process runs its own batches; in the
# backward pass DDP sums the processes' gradients (an *all-reduce*) and divides by their number, so
# every copy takes the same step.
#
# Each process reads its rank $r$ and the number of processes $P$ from the environment `torchrun`
# sets; without it, $P = 1$. All processes compute the same list of an epoch's batches from (seed,
# epoch), and an update takes the next $P \times$ `accumulation` of them, process $r$ taking
# batches $r, r + P, \dots$ Each knows the whole update's token count $N$ without communicating and
# scales its loss by $P / N$: after DDP's division by $P$, the gradient is that of the summed loss
# over $N$, one process's update on all the batches (up to dropout: each process draws its own
# masks). Batches that do not fill a last group are left out of the epoch; a run that leaves out
# over a tenth says so in its log. Validation is split the same way, and the sums added up.
#
# ```
# torchrun --nproc_per_node 8 -m transformer train --pair de-en \
#     --preset base --out runs/base
# ```
#
# The Trainer's update uses two helpers: `ddp_processes` gives $P$ when DDP wraps the model, and
# `sync_gradients` exchanges the gradients only after an update's last micro-batch.

# %%
#| export distributed
"""One process among several: torchrun's environment, each process's device,
and the collectives that the processes of a run share (DistributedDataParallel
adds the gradients)."""

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class Distributed:
    """This process's place among the processes of a run (torchrun's
    environment)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None
    ) -> "Distributed":
        environ = os.environ if environ is None else environ
        try:
            world_size = int(environ.get("WORLD_SIZE", "1"))
            rank = int(environ.get("RANK", "0"))
            local_rank = int(environ.get("LOCAL_RANK", str(rank)))
        except ValueError as err:
            raise ValueError(
                f"bad RANK/WORLD_SIZE/LOCAL_RANK in the environment: {err}"
            ) from err
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"RANK={rank} and WORLD_SIZE={world_size} do not fit together"
            )
        return cls(rank=rank, world_size=world_size, local_rank=local_rank)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def world_size() -> int:
    """The number of processes of the process group; 1 without one."""
    return (
        dist.get_world_size()
        if dist.is_available() and dist.is_initialized()
        else 1
    )


def device_for(requested: str | None, env: Distributed) -> torch.device:
    """The device a process trains on: `requested`, else CUDA when there is a
    GPU; a CUDA device without an index is the process's own GPU (LOCAL_RANK).
    """
    if requested is not None:
        device = torch.device(requested)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", env.local_rank)
    return device


def barrier() -> None:
    """Wait for every process of the group (nothing to wait for alone)."""
    if world_size() > 1:
        dist.barrier()


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """The sums of `values` over the processes, in float64."""
    if world_size() == 1:
        return values
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


def seed_update(seed: int, step: int, rank: int) -> None:
    """Seed the randomness of an update (dropout) from (seed, update, process):
    a resumed run draws the same masks as an uninterrupted one without storing
    generator states."""
    torch.manual_seed(
        int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])
    )


def ddp_of(model: nn.Module) -> DistributedDataParallel | None:
    """The DistributedDataParallel wrapper of a model, seen through
    torch.compile's."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, DistributedDataParallel) else None


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DDP's wrappers."""
    ddp = ddp_of(model)
    return (
        ddp.module if ddp is not None else getattr(model, "_orig_mod", model)
    )


def ddp_processes(model: nn.Module) -> int:
    """How many processes' gradients DistributedDataParallel averages for
    `model`, 1 without it: a loss scaled by it turns their mean into a sum."""
    return dist.get_world_size() if ddp_of(model) is not None else 1


def sync_gradients(
    model: nn.Module, sync: bool
) -> contextlib.AbstractContextManager:
    """The context of a micro-batch's backward pass: under
    DistributedDataParallel the processes exchange gradients only if `sync`
    (the update's last micro-batch); otherwise they accumulate locally."""
    ddp = ddp_of(model)
    if ddp is None or sync:
        return contextlib.nullcontext()
    return ddp.no_sync()


# %% [markdown]
# ## What each epoch trains on
#
# A run reads the tokenizer and the encoded splits from the data pipeline's cache (the first
# process builds it if needed); an epoch's batches come from `token_batches` in an order drawn from
# (seed, epoch). Before the first update the run checks what would otherwise fail hours later:
# every sentence, with its `<bos>` or `<eos>`, fits a batch and the model's positions, and an epoch
# holds at least one update.

# %%
#| export epoch_data
"""What a training run trains on, epoch by epoch: the splits from the encoded
cache, the checks that every sentence and every epoch fit the run's batches,
each epoch's batches and, under BPE-dropout, each epoch's spelling."""

import functools
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from transformer.bpe_dropout import BPEDropout
from transformer.checked_batches import checked_token_batches
from transformer.distributed import Distributed, barrier
from transformer.encoded_cache import load_encoded, prepare
from transformer.encoded_split import EncodedSplit
from transformer.multi30k import DataError
from transformer.tokenizer import Tokenizer
from transformer.train_config import BPE_DROPOUT_SIDES, TrainConfig


@dataclass(frozen=True)
class TrainingData:
    """The tokenizer and the encoded splits a run trains and validates on."""

    tokenizer: Tokenizer
    train: EncodedSplit
    val: EncodedSplit


def load_training_data(config: TrainConfig) -> TrainingData:
    """The pair's tokenizer and splits from the encoded cache, built first if
    needed (spaCy)."""
    env = Distributed.from_environ()
    try:
        # The first process builds the cache; the others wait and load it.
        if not env.is_main:
            barrier()
        tokenizer = prepare(
            config.pair,
            config.cache_dir,
            vocab_size=config.vocab_size,
            data_dir=config.data_dir,
        )
        splits = [
            load_encoded(
                config.pair,
                split,
                config.cache_dir,
                data_dir=config.data_dir,
            )
            for split in ("train", "val")
        ]
    except ImportError as err:  # no spaCy to build a missing cache
        raise DataError(str(err)) from err
    finally:
        if env.is_main:
            barrier()
    return TrainingData(tokenizer, *splits)


def epoch_batches(
    train: EncodedSplit, epoch: int, config: TrainConfig
) -> list[np.ndarray]:
    """An epoch's batches of pair indices: token-bucketed, in an order drawn
    from (seed, epoch)."""
    return checked_token_batches(
        train.src_lengths + 1,  # + <eos>
        train.tgt_lengths + 1,  # + <bos> (input) or <eos> (output)
        max_tokens=config.max_tokens,
        seed=config.seed,
        epoch=epoch,
    )


# %%
#| export epoch_data
def check_longest(
    config: TrainConfig,
    data: TrainingData,
    max_len: int,
    bpe: BPEDropout | None,
) -> None:
    """Refuse, before any update, a split whose longest sentence (with its
    <bos> or <eos>) fits neither a batch nor the model's positional table. With
    BPE-dropout, a training sentence counts in its longest spelling too, which
    a later epoch may draw."""
    longest = {
        f"{name} sentence": int(
            max(split.src_lengths.max(), split.tgt_lengths.max())
        )
        for name, split in (("train", data.train), ("val", data.val))
    }
    if bpe is not None:
        sides = BPE_DROPOUT_SIDES[config.bpe_dropout_sides]
        what = (
            "train sentence as BPE-dropout may spell it, one token a character"
        )
        longest[what] = bpe.longest_spelling(data.train, sides)
    for what, tokens in longest.items():
        tokens += 1  # <bos> or <eos>
        if tokens > config.max_tokens:
            raise DataError(
                f"max_tokens={config.max_tokens} cannot hold the longest"
                f" {what} ({tokens} tokens): raise --max-tokens"
            )
        if tokens > max_len:
            raise DataError(
                f"the model's max_len={max_len} cannot place the "
                f"longest {what} ({tokens} tokens): raise --set max_len"
            )


def updates_per_epoch(batches: int, accumulation: int, processes: int) -> int:
    """The updates an epoch of `batches` batches gives; none is an error."""
    group = accumulation * processes
    if batches < group:
        raise DataError(
            f"an epoch has {batches} batches, too few for one update of "
            f"accumulation {accumulation} × {processes} process(es) "
            f"= {group} batches: lower --accumulation or --max-tokens"
        )
    return batches // group


def dropped_warning(
    batches: int, accumulation: int, processes: int
) -> str | None:
    """A warning when grouping batches into updates leaves out over 10% of
    them."""
    group = accumulation * processes
    dropped = batches % group
    if dropped <= 0.1 * batches:
        return None
    return (
        f"warning: an epoch leaves out {dropped} of its {batches} batches "
        f"({dropped / batches:.0%}): an update takes accumulation "
        f"{accumulation} × {processes} process(es) = {group} "
        "batches; lower --accumulation or --max-tokens"
    )


# %% [markdown]
# Under BPE-dropout each epoch spells the training words anew, from (seed, epoch). `EpochSplits`
# hands the loop each epoch's spelling and, on a GPU, has a second process spell the next epoch
# meanwhile; the checks above count a sentence in its longest possible spelling.


# %%
#| export epoch_data
def prepare_epochs(
    config: TrainConfig,
    data: TrainingData,
    max_len: int,
    processes: int,
    epoch: int,
) -> tuple["EpochSplits", int]:
    """The checks made before the first update (every sentence fits a batch and
    the model; epoch `epoch`, the one to come, gives an update), and the
    spellings of the epochs. Returns them and the number of batches of epoch
    `epoch`."""
    bpe = (
        BPEDropout(data.tokenizer, config.bpe_dropout)
        if config.bpe_dropout
        else None
    )
    if bpe is not None:
        bpe.check(data.train)
    check_longest(config, data, max_len, bpe)
    # The batches of the epoch to come, in BPE's own spelling (BPE-dropout
    # changes their number only slightly): an epoch must give at least one
    # update.
    first = len(epoch_batches(data.train, epoch, config))
    updates_per_epoch(first, config.accumulation, processes)
    return EpochSplits(data.train, bpe, config), first


class EpochSplits:
    """The training split as each epoch spells it: BPE's own spelling, or with
    BPE-dropout a new one each epoch, a function of (seed, epoch). With
    `prefetch` a second process spells the next epoch while this one trains."""

    def __init__(
        self, train: EncodedSplit, bpe: BPEDropout | None, config: TrainConfig
    ) -> None:
        self.train, self.epochs, self.prefetch = train, config.epochs, False
        self.resample = None
        if bpe is not None:
            sides = BPE_DROPOUT_SIDES[config.bpe_dropout_sides]
            self.resample = functools.partial(
                bpe.resample, seed=config.seed, sides=sides
            )
        self.pool: ProcessPoolExecutor | None = None
        self.ahead: dict[int, Future] = {}

    def __call__(self, epoch: int) -> EncodedSplit:
        if self.resample is None:
            return self.train
        ahead = self.ahead.pop(epoch, None)
        if ahead is not None:
            train = ahead.result()
        else:
            train = self.resample(self.train, epoch=epoch)
        if self.prefetch and epoch + 1 < self.epochs:
            if self.pool is None:
                spawn = multiprocessing.get_context("spawn")
                self.pool = ProcessPoolExecutor(1, mp_context=spawn)
            self.ahead[epoch + 1] = self.pool.submit(
                self.resample, self.train, epoch=epoch + 1
            )
        return train

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
