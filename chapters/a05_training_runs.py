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
# # Training runs
#
# The training chapter's loop makes updates in one process that runs until it is done. A run of
# 35 epochs on a GPU that may be taken away needs more: a configuration that says what is
# trained and refuses bad values, files that are never half written, checkpoints that resume
# exactly where the run stopped, a clock that stops the run in time to save it, several GPUs
# that make the update of one, and a small folder in which to ship the trained model. This
# appendix builds them on the chapter's code: its `Trainer` calls the chapter's `train_step`.
# It exports `transformer.train` (the `Trainer` and `train`), `transformer.train_config`,
# `transformer.training_data`, `transformer.validation`, `transformer.logs`,
# `transformer.distributed`, `transformer.checkpoint`, `transformer.run_checkpoints`,
# `transformer.rdrop` and `transformer.files`.

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
#| default_exp train

# %%
import json
import math
import tempfile
from pathlib import Path

import torch

torch.manual_seed(0)
torch.set_printoptions(precision=4)

# %% [markdown]
# ## The configuration
#
# A run is described by one frozen dataclass, `TrainConfig`. The model is a preset of
# `TransformerConfig` (`small`, `base` or `big`) with optional overrides of any of its fields
# except the vocabulary size, which comes from the tokenizer. The defaults follow the paper where
# it has a value (warm-up 4,000, label smoothing 0.1, the average of the last 5 checkpoints);
# `bpe_dropout` samples a new segmentation of the training words each epoch (the data chapter),
# and `r_drop` turns on R-Drop (below).
# Each field is defined once, by `option`: its default, its help on the command line, its check
# (a test and the message a failing value gets) and whether a resumed run may change it. The
# command line builds its options from the fields, and the config checks every field when it is
# made, so that a bad value is refused with its field's name before anything runs. The model's
# own configuration is built then too, once, and the run reads it from there. The run stores the
# config twice: as `train_config.json` in its output folder, which `--resume` reads back so that
# the same command can be repeated after a stop, and inside each checkpoint's `config.json`,
# with the model's `TransformerConfig` and the vocabulary's SHA-256.

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

import torch

from transformer.config import TransformerConfig
from transformer.data import CACHE_DIR, DATA_DIR, MAX_TOKENS, PAIRS
from transformer.tokenizer import VOCAB_SIZE

MODEL_PRESETS = ("small", "base", "big")
BPE_DROPOUT_SIDES = {"both": ("src", "tgt"), "source": ("src",)}
# measured bf16 matrix-multiply rate of an H100 or H200
PEAK_BF16_FLOPS = 790e12
_VOCAB_FIELDS = ("src_vocab_size", "tgt_vocab_size")
# Earlier names of fields, as stored runs and checkpoints may hold them.
RENAMED_FIELDS = {"model": "preset"}
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
TEXT: Check = (
    lambda v: v is None or isinstance(v, str),
    "must be a string or None",
)
FLAG: Check = (lambda v: isinstance(v, bool), "must be True or False")
SOME_FLAG: Check = (
    lambda v: v in (None, True, False),
    "must be True, False or None",
)
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


def fixed_on_resume(cls: type) -> tuple[str, ...]:
    """The fields of a TrainConfig class that a resumed run must keep."""
    fields = dataclasses.fields(cls)
    return tuple(f.name for f in fields if f.metadata["on_resume"] == "fixed")


def with_current_names(fields: dict[str, Any]) -> dict[str, Any]:
    """Stored TrainConfig fields under today's names (RENAMED_FIELDS); a field
    stored under both names keeps its later value."""
    return {RENAMED_FIELDS.get(k, k): v for k, v in fields.items()}


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
        return getattr(TransformerConfig, preset)(vocab_size, **overrides)
    except (ValueError, TypeError) as err:
        raise ValueError(f"model_overrides: {err}") from err


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
        MAX_TOKENS,
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
        4000,
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
        0.1, on_resume="fixed", help="in [0, 1)", check=SHARE
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
    bf16: bool | None = option(
        None,
        on_resume="free",
        help="bfloat16 autocast (default: with CUDA)",
        check=SOME_FLAG,
    )
    compile: bool = option(
        False, on_resume="free", help="torch.compile the model", check=FLAG
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
    out_dir: str | None = option(
        None,
        on_resume="free",
        help="output folder (default: runs/<pair>)",
        check=TEXT,
        flag="--out",
    )
    cache_dir: str | None = option(
        None, on_resume="free", help="default: the data chapter's", check=TEXT
    )
    data_dir: str | None = option(
        None, on_resume="free", help="default: data/multi30k", check=TEXT
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
        help="updates per line of steps.jsonl",
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
# ## Presets and recipes
#
# A recipe is a function that returns a `TrainConfig`, and `--config NAME` on the command line
# selects one from `RECIPES`: `multi30k`, the recipe of the book's two models (the training
# chapter's table), and `quick`, a tiny model trained for a few dozen updates, which shows the
# whole machinery at work on a CPU.


# %%
#| export train_config
def quick_config(pair: str, **overrides: Any) -> TrainConfig:
    """A tiny model trained for a few dozen updates: about a minute on a 2-core
    CPU."""
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
    as a TrainConfig."""
    fields = dict(
        pair=pair,
        preset="small",
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
# ## Checkpoints
#
# A run writes a checkpoint at the end of every epoch, and one where it stops when it must stop
# inside an epoch (a time limit or a step limit). A checkpoint is a folder:
#
# | file | holds |
# | --- | --- |
# | `model.safetensors` | the weights, float32 |
# | `trainer.safetensors`, `trainer.json` | Adam's moments, step counts and settings; the scheduler's state |
# | `progress.json` | where the run stands: epochs done, batches of the current epoch used, updates made, the epoch's running sums |
# | `config.json` | the model's `TransformerConfig`, the run's `TrainConfig`, the vocabulary's size and SHA-256 |
# | `tokenizer.json` | the tokenizer the run was trained with |
#
# **No pickle.** `torch.save` writes Python pickles, and loading a pickle runs whatever code it
# names: a checkpoint downloaded from somewhere could do anything. Tensors go into
# [safetensors](https://huggingface.co/docs/safetensors) files, which hold only named arrays and
# a JSON header, and everything else into plain JSON. The optimiser's and scheduler's
# `state_dict()` are nested dictionaries and lists of tensors and numbers; `save_state` walks
# such a structure, puts each tensor into the safetensors file under its path in the structure,
# and writes the rest as JSON, marking tuples so that loading gives back exactly what was saved.
#
# **Tied weights, once.** The source embedding, the target embedding and the output layer share
# one matrix. `model.state_dict()` lists it three times, and safetensors refuses tensors that
# share memory. `model_tensors` keeps each tensor once, under its first name; loading copies the
# stored values into the parameters of a freshly built model, where the sharing is already in
# place.

# %%
#| export checkpoint
"""Checkpoints and shipped models: the formats, saving and loading without
pickle, a checkpoint's record and progress, export, and `load_model`."""

import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor, nn

from transformer.config import TransformerConfig
from transformer.distributed import unwrap
from transformer.files import atomic_folder
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer, TokenizerError

CHECKPOINT_FORMAT = "transformer-book checkpoint 1"
# and the form `export_model` writes (the section "Exporting and loading a
# model")
SHIPPED_FORMAT = "transformer-book model 1"


class CheckpointError(Exception):
    """A checkpoint or model folder is missing, incomplete, or does not match
    the run."""


def _encode(obj: object, tensors: dict[str, Tensor], path: str) -> dict:
    """JSON for a nested state, its tensors moved into `tensors` under their
    paths."""
    if isinstance(obj, Tensor):
        tensors[path] = obj.detach().to("cpu").contiguous()
        return {"tensor": path}
    if isinstance(obj, dict):
        return {
            "dict": [
                [k, _encode(v, tensors, f"{path}/{k}")] for k, v in obj.items()
            ]
        }
    if isinstance(obj, list | tuple):
        items = [_encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]
        return {"tuple" if isinstance(obj, tuple) else "list": items}
    if obj is None or isinstance(obj, bool | int | float | str):
        return {"value": obj}
    raise TypeError(
        f"cannot store a {type(obj).__name__} at {path} without pickle"
    )


def _decode(node: dict, tensors: dict[str, Tensor]) -> object:
    ((kind, value),) = node.items()
    if kind == "tensor":
        return tensors[value]
    if kind == "dict":
        return {k: _decode(v, tensors) for k, v in value}
    if kind in ("list", "tuple"):
        items = [_decode(v, tensors) for v in value]
        return tuple(items) if kind == "tuple" else items
    return value


def save_state(folder: Path, name: str, state: object) -> None:
    """Write a nested state as `name.safetensors` (its tensors) and `name.json`
    (the rest)."""
    tensors: dict[str, Tensor] = {}
    skeleton = _encode(state, tensors, name)
    safetensors.torch.save_file(tensors, Path(folder) / f"{name}.safetensors")
    (Path(folder) / f"{name}.json").write_text(json.dumps(skeleton) + "\n")


def load_state(folder: Path, name: str) -> object:
    """The state that `save_state` wrote, tensors on the CPU."""
    try:
        tensors = safetensors.torch.load_file(
            Path(folder) / f"{name}.safetensors"
        )
        skeleton = json.loads((Path(folder) / f"{name}.json").read_text())
        return _decode(skeleton, tensors)
    except (OSError, ValueError, KeyError, safetensors.SafetensorError) as err:
        raise CheckpointError(
            f"cannot read {name} state in {folder}: {err}"
        ) from err


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The weights and persistent buffers, each shared tensor once under its
    first name."""
    tensors, seen = {}, set()
    for name, tensor in unwrap(model).state_dict(keep_vars=True).items():
        # tied parameters are one object under several names
        if id(tensor) not in seen:
            seen.add(id(tensor))
            tensors[name] = tensor.detach()
    return tensors


def save_weights(
    model: nn.Module, path: Path, *, dtype: torch.dtype | None = None
) -> None:
    """Write the model's weights (tied ones once) as a safetensors file."""
    tensors = {
        name: t.to("cpu", dtype=dtype or t.dtype).contiguous()
        for name, t in model_tensors(model).items()
    }
    safetensors.torch.save_file(
        tensors, Path(path), metadata={"format": CHECKPOINT_FORMAT}
    )


def read_tensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file; a missing or damaged file is a
    CheckpointError naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file {path}")
    try:
        return safetensors.torch.load_file(path)
    except (OSError, safetensors.SafetensorError) as err:
        raise CheckpointError(f"cannot read weights {path}: {err}") from err


def load_tensors_into(
    model: nn.Module, tensors: dict[str, Tensor], source: object
) -> None:
    """Copy `tensors` into the model's weights (tied ones follow), after
    checking names and shapes; errors name `source`."""
    expected = model_tensors(model)
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: the weights do not fit the model: missing"
            f" {missing[:3] or 'none'}, unexpected {unexpected[:3] or 'none'}"
        )
    for name, target in expected.items():
        if tensors[name].shape != target.shape:
            raise CheckpointError(
                f"{source}: weight {name} has shape"
                f" {tuple(tensors[name].shape)}, the model expects"
                f" {tuple(target.shape)}"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(tensors[name])


def load_weights(model: nn.Module, path: Path) -> None:
    """Load a safetensors file written by `save_weights` into a model of the
    same config."""
    tensors = read_tensors(path)
    load_tensors_into(unwrap(model), tensors, path)


# %% [markdown]
# The shared matrix is stored once, and loading it into a freshly built model gives the same
# outputs, with the three uses of the matrix still one tensor:

# %%
import tempfile

from transformer.checkpoint import load_weights, model_tensors, save_weights
from transformer.config import TransformerConfig
from transformer.data import collate
from transformer.model import Transformer
from transformer.validation import batch_log_probs

tiny = TransformerConfig(
    src_vocab_size=13, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0
)
model = Transformer(tiny).eval()
scratch = Path(tempfile.mkdtemp())
save_weights(model, scratch / "model.safetensors")
names, all_names = list(model_tensors(model)), list(model.state_dict())
print(f"state_dict: {len(all_names)} entries; stored: {len(names)}")
print("not stored (aliases):", sorted(set(all_names) - set(names)))

restored = Transformer(tiny).eval()
load_weights(restored, scratch / "model.safetensors")
assert restored.generator.proj.weight is restored.src_embed.embedding.weight
# A toy vocabulary: <pad> 0, <bos> 1, <eos> 2, then ten symbols.
toy = collate(
    [([3, 4, 5], [6, 7]), ([8, 9], [10, 11, 12])], pad_id=0, bos_id=1, eos_id=2
)
with torch.no_grad():
    assert torch.equal(
        batch_log_probs(restored, toy, pad_id=0),
        batch_log_probs(model, toy, pad_id=0),
    )

# %% [markdown]
# The optimiser's state, with its integer keys and its `betas` tuple, comes back equal, tensor
# for tensor and number for number:

# %%
from transformer.checkpoint import load_state, save_state
from transformer.schedule import make_optimizer

optimizer, _ = make_optimizer(model, d_model=32, warmup=10)
batch_log_probs(model, toy, pad_id=0).sum().backward()
optimizer.step()
save_state(scratch, "trainer", {"optimizer": optimizer.state_dict()})
back = load_state(scratch, "trainer")["optimizer"]
original = optimizer.state_dict()
assert back["param_groups"] == original["param_groups"]
assert back["state"].keys() == original["state"].keys()
assert all(
    torch.equal(back["state"][i][k], v)
    for i, s in original["state"].items()
    for k, v in s.items()
)
print(json.dumps(back["param_groups"][0], default=str)[:150], "…")

# %% [markdown]
# ## Averaging
#
# The paper's models average the weights of the last checkpoints (Section 6.1): five for the
# base models, twenty for the big ones. Late in training, with a small learning rate, successive
# checkpoints sit around a minimum of the loss, each displaced from it by the noise of its last
# updates; their mean cancels much of that noise, as Polyak averaging does for stochastic
# gradient descent. The sums are taken in float64, so the order of the files does not matter.


# %%
#| export run_checkpoints
"""A training run's checkpoints: averaging them, writing and pruning them,
what they record of the run, and the checks and chores of resuming from one."""

import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler

from transformer.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    Progress,
    check_compatible,
    list_checkpoints,
    load_state,
    load_tensors_into,
    load_weights,
    read_record,
    read_tensors,
    save_state,
    save_weights,
    tokenizer_digest,
)
from transformer.config import TransformerConfig
from transformer.distributed import Distributed, barrier
from transformer.files import (
    append_jsonl,
    atomic_folder,
    atomic_write,
    remove_stale,
    truncate_jsonl,
)
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer
from transformer.train_config import (
    TrainConfig,
    fixed_on_resume,
    with_current_names,
)


def average_checkpoints(paths: Sequence[Path]) -> dict[str, Tensor]:
    """The element-wise mean of the weights of several checkpoints (folders or
    files).

    The paper's final models average the last 5 (base) or 20 (big) checkpoints
    (section 6.1).
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    total: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        file = (
            Path(path) / "model.safetensors"
            if Path(path).is_dir()
            else Path(path)
        )
        tensors = read_tensors(file)
        if not total:
            total = {k: v.double() for k, v in tensors.items()}
            dtypes = {k: v.dtype for k, v in tensors.items()}
            first = file
            continue
        if tensors.keys() != total.keys():
            raise CheckpointError(f"{file} holds other weights than {first}")
        for name, value in tensors.items():
            if value.shape != total[name].shape:
                raise CheckpointError(
                    f"{file}: weight {name} has shape {tuple(value.shape)}, "
                    f"{first} has {tuple(total[name].shape)}"
                )
            total[name] += (
                value.double()
            )  # float64 sums: the order of files does not matter
    return {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}


# %% [markdown]
# On three tiny "checkpoints" with known values:

# %%
from safetensors.torch import save_file

from transformer.run_checkpoints import average_checkpoints

for i, (w, b) in enumerate(
    [([1.0, 2.0], [0.0]), ([3.0, 4.0], [1.0]), ([5.0, 9.0], [2.0])]
):
    save_file(
        {"w": torch.tensor(w), "b": torch.tensor(b)},
        scratch / f"c{i}.safetensors",
    )
mean = average_checkpoints([scratch / f"c{i}.safetensors" for i in range(3)])
assert torch.equal(mean["w"], torch.tensor([3.0, 5.0]))
assert torch.equal(mean["b"], torch.tensor([1.0]))
mean

# %% [markdown]
# ## A run's checkpoints
#
# A run keeps its checkpoints in `checkpoints/` under its output folder, named `epoch-005` at the
# end of an epoch and `step-0001234` for a stop inside one. A folder counts as a checkpoint once
# it holds a readable `progress.json`, which `write_checkpoint` writes last; anything else (a
# temporary folder of a killed run, a damaged checkpoint) is never resumed from. `config.json`
# records the model, the run's configuration and the vocabulary's SHA-256, so that a checkpoint
# is never loaded into another model or read with another tokenizer: `check_compatible` names
# the field that differs. After each checkpoint, `prune_checkpoints` deletes what is no longer
# needed: the newest checkpoint stays whole, the weights of the last `average_last` epochs stay
# for averaging, and the rest goes.


# %%
#| export checkpoint
def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """The SHA-256 of a tokenizer's JSON: the vocabulary's fingerprint in
    config.json."""
    return hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()


def read_record(folder: Path) -> dict[str, Any]:
    """A checkpoint's or model folder's config.json."""
    path = Path(folder) / "config.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{folder} is not a checkpoint: no config.json"
        ) from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from err
    if not isinstance(record, dict) or not isinstance(
        record.get("model"), dict
    ):
        raise CheckpointError(f"{path} is not a transformer-book config")
    if not isinstance(record.get("vocab"), dict):
        raise CheckpointError(f"{path} is not a transformer-book config")
    known = (CHECKPOINT_FORMAT, SHIPPED_FORMAT)
    if record.get("format", CHECKPOINT_FORMAT) not in known:
        raise CheckpointError(
            f"{path} has format {record['format']!r}, which this version"
            f" cannot read ({CHECKPOINT_FORMAT!r} or {SHIPPED_FORMAT!r})"
        )
    return record


def check_compatible(
    folder: Path, *, model_config: TransformerConfig, tokenizer: Tokenizer
) -> None:
    """Raise CheckpointError, naming the folder and the field, unless the
    checkpoint in `folder` has this model config and this vocabulary."""
    record = read_record(folder)
    theirs, ours = record["model"], model_config.to_dict()
    for name in sorted(theirs.keys() | ours.keys()):
        if theirs.get(name) != ours.get(name):
            raise CheckpointError(
                f"{folder}: the checkpoint's model has"
                f" {name}={theirs.get(name)!r}, this run's has"
                f" {name}={ours.get(name)!r}"
            )
    vocab = record["vocab"]
    if vocab.get("size") != tokenizer.vocab_size:
        raise CheckpointError(
            f"{folder}: the checkpoint's vocabulary has {vocab.get('size')}"
            f" entries, this run's tokenizer {tokenizer.vocab_size} (field"
            " vocab_size)"
        )
    if vocab.get("sha256") != tokenizer_digest(tokenizer):
        raise CheckpointError(
            f"{folder}: the checkpoint was trained with another vocabulary of"
            " the same size (field tokenizer: its tokenizer.json differs from"
            " this run's)"
        )


@dataclass
class Progress:
    """Where a run stands; stored in each checkpoint as progress.json."""

    epoch: int = 0  # epochs completed
    batch: int = 0  # batches of the current epoch used
    step: int = 0  # updates made
    wall_time: float = 0.0  # seconds of earlier processes of the run
    # the current epoch's training loss, all processes, so far
    epoch_loss_sum: float = 0.0
    epoch_tokens: int = 0
    epoch_seconds: float = 0.0
    epoch_flops: float = 0.0
    processes: int = 1  # how many trained the run: a resume must run as many

    @classmethod
    def read(cls, folder: Path) -> "Progress":
        """The progress.json of a checkpoint folder."""
        path = Path(folder) / "progress.json"
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise CheckpointError(f"cannot read {path}: {err}") from err


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(update, folder) of each complete checkpoint of the run in `out`, oldest
    first."""
    found = []
    folder = Path(out) / "checkpoints"
    for path in folder.glob("[!.]*") if folder.is_dir() else []:
        try:
            step = Progress.read(path).step
        except CheckpointError:
            continue  # not a checkpoint (or a damaged one): never resumed from
        found.append((int(step), path))
    return sorted(found)


# %%
#| export run_checkpoints
def latest_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint folder of the run in `out`, or None."""
    found = list_checkpoints(out)
    return found[-1][1] if found else None


def write_checkpoint(
    folder: Path,
    model: nn.Module,
    *,
    record: dict[str, Any],
    tokenizer: Tokenizer,
    trainer_state: dict[str, Any] | None = None,
    progress: Progress | None = None,
) -> None:
    """Write a checkpoint folder atomically: the weights, config.json
    (`record`) and tokenizer.json, and when given the optimiser's state and
    progress.json. Without them the folder is a model (a run's average), not a
    checkpoint to resume from."""
    with atomic_folder(folder) as tmp:
        save_weights(model, tmp / "model.safetensors")
        if trainer_state is not None:
            save_state(tmp, "trainer", trainer_state)
        (tmp / "config.json").write_text(json.dumps(record, indent=2) + "\n")
        tokenizer.save(tmp / "tokenizer.json")
        if progress is not None:
            # Written last: a folder with progress.json is a complete
            # checkpoint.
            (tmp / "progress.json").write_text(
                json.dumps(asdict(progress), indent=2) + "\n"
            )


def prune_checkpoints(out: Path, average_last: int) -> None:
    """Keep the newest checkpoint whole, and the weights of the last
    `average_last` epochs."""
    found = list_checkpoints(out)
    newest = found[-1][1]
    epochs = [path for _, path in found if path.name.startswith("epoch-")]
    keep = set(epochs[-max(average_last, 1) :]) | {newest}
    for _, path in found:
        if path not in keep:
            shutil.rmtree(path)
        elif path != newest:
            for name in ("trainer.safetensors", "trainer.json"):
                (path / name).unlink(missing_ok=True)


# %% [markdown]
# ## Resuming a run
#
# Some fields of the configuration decide the updates themselves: the pair, the preset and its
# overrides, the vocabulary, the batch size, accumulation, warm-up, learning-rate factor, label
# smoothing, BPE-dropout and the seed. Each says so where it is defined (`on_resume="fixed"`),
# and `RESUME_FIXED` lists them. A resumed run must keep them, and
# `check_recipe` refuses one that does not, naming the field. The others may change on resume:
# more `epochs` continue a finished run, and a new `time_limit` or `max_steps` fits the next
# stretch of machine time. `resume_point` makes these checks, and those that need no data,
# before anything is loaded.


# %%
#| export run_checkpoints
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


def check_recipe(folder: Path, config: TrainConfig) -> None:
    """Raise CheckpointError, naming the folder and the field, if the
    checkpoint in `folder` was trained with another value of a field that
    decides the updates (one that is fixed on resume)."""
    stored = with_current_names(read_record(folder).get("train", {}))
    for name in fixed_on_resume(type(config)):
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


# %% [markdown]
# The trainer's chores around its checkpoints: continue from one, make and clean the run's
# folder, store its settings, average the last epochs, and, in `RunFolder`, write the records
# and checkpoints from the first process while the others wait.


# %%
#| export run_checkpoints
def resume_from(
    checkpoint: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
) -> Progress:
    """Continue from a checkpoint: load the weights, the optimiser and the
    schedule; return where the run stands."""
    load_weights(model, checkpoint / "model.safetensors")
    state = load_state(checkpoint, "trainer")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return Progress.read(checkpoint)


def prepare_folder(out: Path) -> None:
    """Make the run's folders; delete what a killed run left (see
    atomic_folder)."""
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    remove_stale(out / "checkpoints")


def store_settings(
    out: Path, config: TrainConfig, tokenizer: Tokenizer, step: int
) -> None:
    """Drop the records after update `step`, which a resumed run writes again,
    and store the settings (both atomically: --resume reads them back)."""
    for name in ("metrics.jsonl", "steps.jsonl"):
        truncate_jsonl(out / name, step)
    settings = json.dumps(config.to_dict(), indent=2) + "\n"
    atomic_write(out / "train_config.json", settings.encode())
    tokenizer.save(out / "tokenizer.json")


def last_epochs(out: Path, average_last: int) -> list[Path]:
    """The epoch checkpoints to average: the last `average_last`, from 2."""
    found = list_checkpoints(out)
    epochs = [path for _, path in found if path.name.startswith("epoch-")]
    return epochs[-average_last:] if average_last >= 2 else []


def averaged_model(
    chosen: list[Path], model_config: TransformerConfig, device: torch.device
) -> Transformer:
    """A model of the mean weights of the checkpoints `chosen`."""
    averaged = Transformer(model_config).to(device)
    load_tensors_into(
        averaged, average_checkpoints(chosen), "averaged checkpoints"
    )
    return averaged


class RunFolder:
    """A run's output folder as one process sees it: the first process writes
    the records and checkpoints, and every process waits until it has."""

    def __init__(
        self,
        config: TrainConfig,
        env: Distributed,
        record: dict[str, Any],
        tokenizer: Tokenizer,
    ) -> None:
        self.config, self.out, self.env = config, config.output_dir, env
        self.record, self.tokenizer = record, tokenizer  # of each checkpoint

    def open(
        self,
        checkpoint: Path | None,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        scheduler: LRScheduler,
    ) -> Progress:
        """Check that `checkpoint`, if any, fits the model and the tokenizer,
        make the folder, continue from the checkpoint, and store the settings;
        return where the run stands."""
        if checkpoint is not None:
            check_compatible(
                checkpoint, model_config=model.config, tokenizer=self.tokenizer
            )
        if self.env.is_main:
            prepare_folder(self.out)
        barrier()
        progress = Progress()
        if checkpoint is not None:
            progress = resume_from(checkpoint, model, optimizer, scheduler)
        if self.env.is_main:
            store_settings(
                self.out, self.config, self.tokenizer, progress.step
            )
        return progress

    def save(
        self,
        name: str,
        line: dict[str, Any],
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: LRScheduler,
        progress: Progress,
    ) -> None:
        """Append `line` to metrics.jsonl, write the checkpoint `name`, and
        prune the older ones."""
        if self.env.is_main:
            # The record first: a resumed run drops records newer than its
            # checkpoint.
            append_jsonl(self.out / "metrics.jsonl", line)
            folder = self.out / "checkpoints" / name
            state = {"optimizer": optimizer.state_dict()}
            state["scheduler"] = scheduler.state_dict()
            write_checkpoint(
                folder,
                model,
                record=self.record,
                tokenizer=self.tokenizer,
                trainer_state=state,
                progress=progress,
            )
            prune_checkpoints(self.out, self.config.average_last)
        barrier()

    def save_average(self, line: dict[str, Any], model: nn.Module) -> None:
        """Append `line` to metrics.jsonl and write the averaged `model` into
        out/average."""
        if self.env.is_main:
            append_jsonl(self.out / "metrics.jsonl", line)
            record = self.record | {"averaged": line["averaged"]}
            write_checkpoint(
                self.out / "average",
                model,
                record=record,
                tokenizer=self.tokenizer,
            )
        barrier()


# %% [markdown]
# ## Several processes
#
# With several GPUs, PyTorch's `DistributedDataParallel` (DDP) keeps one copy of the model per
# GPU, one process per GPU, as the paper trained on eight. Each process runs forward and
# backward on its own batches; during the backward pass DDP adds up the gradients of all
# processes (an *all-reduce*) and divides by their number, so that every copy takes the same
# optimiser step and the copies stay identical.
#
# The loop runs the same code with one process or several. Each process reads its rank $r$ and
# the number of processes $P$ from the environment that `torchrun` sets (`RANK`, `WORLD_SIZE`,
# `LOCAL_RANK`); without them, $P = 1$. All processes compute the same list of batches for an
# epoch, since it depends only on the seed and the epoch, and an update takes the next
# $P \times$ `accumulation` of them: process $r$ takes batches $r, r + P, r + 2P, \dots$ of that
# group. Since every process knows the whole list, each knows the token count $N$ of the whole
# update without communicating, and scales its loss by $P / N$: DDP's division by $P$ then
# leaves exactly the gradient of the summed loss over $N$, the update a single process would
# make on all the batches (without dropout: each process draws its own dropout masks). The few
# batches at the end of an epoch that do not fill a whole group are left out of that epoch; a
# run whose epoch cannot fill a single group is refused before it starts, and one that leaves
# out more than a tenth of each epoch says so in its log. Validation is split the same way, and
# the sums are added up before the means are taken.
#
# ```
# torchrun --nproc_per_node 8 -m transformer train --pair de-en \
#     --config base --out runs/base
# ```
#
# The training chapter's `train_step` does this with two helpers: `ddp_processes` gives it $P$
# when DDP wraps the model (1 otherwise), and `sync_gradients` wraps the backward pass of every
# micro-batch but the last in DDP's `no_sync`, so that the processes exchange their gradients
# once per update.

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
# The loop reads the tokenizer and the encoded splits from the data chapter's cache (the first
# process builds it if needed, the others wait), and an epoch's batches come from
# `token_batches` in an order drawn from (seed, epoch). Before the first update, the run checks
# what would otherwise fail hours later: every sentence, with its `<bos>` or `<eos>`, fits a
# batch and the model's table of positions, and an epoch holds at least one update.

# %%
#| export training_data
"""What a training run trains on, epoch by epoch: the splits from the encoded
cache, the checks that every sentence and every epoch fit the run's batches,
each epoch's batches and, under BPE-dropout, each epoch's spelling."""

import functools
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from transformer.data import (
    BPEDropout,
    DataError,
    EncodedSplit,
    load_encoded,
    prepare,
    token_batches,
)
from transformer.distributed import Distributed, barrier
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
            config.cache_path,
            vocab_size=config.vocab_size,
            data_dir=config.data_path,
        )
        splits = [
            load_encoded(
                config.pair,
                split,
                config.cache_path,
                data_dir=config.data_path,
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
    return token_batches(
        train.src_lengths + 1,  # + <eos>
        train.tgt_lengths + 1,  # + <bos> (input) or <eos> (output)
        max_tokens=config.max_tokens,
        seed=config.seed,
        epoch=epoch,
    )


# %%
#| export training_data
def check_lengths(
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
# Under BPE-dropout each epoch spells the training words anew, a function of (seed, epoch).
# `Spellings` hands the loop each epoch's spelling and, on a GPU, has a second process spell the
# next epoch while this one trains; a sentence counts in its longest possible spelling in the
# checks above.


# %%
#| export training_data
def prepare_epochs(
    config: TrainConfig,
    data: TrainingData,
    max_len: int,
    processes: int,
    epoch: int,
) -> tuple["Spellings", int]:
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
    check_lengths(config, data, max_len, bpe)
    # The batches of the epoch to come, in BPE's own spelling (BPE-dropout
    # changes their number only slightly): an epoch must give at least one
    # update.
    first = len(epoch_batches(data.train, epoch, config))
    updates_per_epoch(first, config.accumulation, processes)
    return Spellings(data.train, bpe, config), first


class Spellings:
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


# %% [markdown]
# ## Validation
#
# Validation measures what the training chapter lists: the label-smoothed loss, the NLL and the
# perplexities per token and per word, and the token accuracy. `token_stats` returns sums and
# counts, which add up across batches and, with several processes, across processes (each
# validates its share of the batches); the means are taken last. The perplexity is per subword
# token, `<eos>` included, as the paper's is "per wordpiece".

# %%
#| export validation
"""Teacher-forced validation of Vaswani et al. (2017)'s model: the
label-smoothed loss, the NLL and perplexities per token and per word, and the
token accuracy, as sums that add up across batches and processes."""

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.data import Batch, EncodedSplit
from transformer.distributed import world_size
from transformer.loop import batch_log_probs
from transformer.loss import LabelSmoothingLoss, check_log_probs
from transformer.tokenizer import Tokenizer


@dataclass(frozen=True)
class TokenStats:
    """Sums over real (non-padding) target tokens; add them up across batches,
    then read means."""

    nll_sum: float = 0.0
    correct: int = 0
    tokens: int = 0

    def __add__(self, other: "TokenStats") -> "TokenStats":
        return TokenStats(
            self.nll_sum + other.nll_sum,
            self.correct + other.correct,
            self.tokens + other.tokens,
        )

    def _count(self) -> int:
        if self.tokens == 0:
            raise ValueError(
                "no target tokens were counted: the means are undefined"
            )
        return self.tokens

    @property
    def nll(self) -> float:
        """Mean negative log-likelihood per token, in nats, unsmoothed."""
        return self.nll_sum / self._count()

    @property
    def perplexity(self) -> float:
        """e^nll: per subword token, <eos> included (the paper's per-wordpiece
        perplexity)."""
        return math.exp(self.nll)

    @property
    def accuracy(self) -> float:
        """Share of real target tokens whose most probable prediction is the
        right one."""
        return self.correct / self._count()


@torch.no_grad()
def token_stats(
    log_probs: Tensor, target: Tensor, *, pad_id: int
) -> TokenStats:
    """Unsmoothed NLL, correct predictions and token count of one batch,
    padding ignored.

    Shapes:
        log_probs: (B, T, V) or (N, V); target: (B, T) or (N,)
    """
    check_log_probs(log_probs, target)
    real = target != pad_id  # (B, T)
    index = target.masked_fill(~real, 0).unsqueeze(-1)  # (B, T, 1)
    nll = -log_probs.gather(-1, index).squeeze(-1).double()  # (B, T)
    correct = (log_probs.argmax(dim=-1) == target) & real
    return TokenStats(
        nll_sum=nll[real].sum().item(),
        correct=int(correct.sum()),
        tokens=int(real.sum()),
    )


# %% [markdown]
# Two parts of a batch add up to the whole, and on random logits the accuracy is about one in
# $V$ and the perplexity of the order of $V$: the numbers a model starts from.

# %%
from transformer.validation import token_stats

V = 8  # a toy vocabulary; id 0 is <pad>
g = torch.Generator().manual_seed(0)
log_probs = torch.randn(10_000, V, dtype=torch.float64, generator=g)
log_probs = log_probs.log_softmax(-1)
target = torch.randint(1, V, (10_000,), generator=g)
whole = token_stats(log_probs, target, pad_id=0)
halves = [slice(0, 3000), slice(3000, None)]
parts = [token_stats(log_probs[h], target[h], pad_id=0) for h in halves]
assert (parts[0] + parts[1]).correct == whole.correct
assert math.isclose((parts[0] + parts[1]).nll, whole.nll)
print(f"accuracy {whole.accuracy:.3f} (1/V = {1 / V:.3f})")
print(f"perplexity {whole.perplexity:.1f} (V = {V})")
assert abs(whole.accuracy - 1 / V) < 0.01 and V / 2 < whole.perplexity < 2 * V

# %% [markdown]
# The word count, and the sums of a whole validation set:


# %%
#| export validation
def count_words(tokenizer: Tokenizer, data: EncodedSplit) -> int:
    """Words of the references: whitespace-separated pieces of each decoded
    target sentence."""
    return sum(len(tokenizer.decode(tgt).split()) for _, tgt in data)


@dataclass(frozen=True)
class Validation:
    """Sums over a validation set: the label-smoothed loss, `TokenStats`, and
    the word count."""

    loss_sum: float
    stats: TokenStats
    words: int | None = None

    @property
    def loss(self) -> float:
        """Label-smoothed loss per target token."""
        return self.loss_sum / self.stats.tokens

    @property
    def word_perplexity(self) -> float | None:
        """exp(total NLL / reference words); None without a word count."""
        return (
            math.exp(self.stats.nll_sum / self.words) if self.words else None
        )

    def metrics(self) -> dict[str, float | None]:
        return {
            "val_loss": self.loss,
            "val_nll": self.stats.nll,
            "val_ppl_token": self.stats.perplexity,
            "val_ppl_word": self.word_perplexity,
            "val_accuracy": self.stats.accuracy,
        }


@torch.no_grad()
def validate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    pad_id: int,
    smoothing: float = 0.1,
    words: int | None = None,
    bf16: bool = False,
) -> Validation:
    """Teacher-forced validation metrics, in eval mode; summed over processes
    when distributed."""
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, stats = 0.0, TokenStats()
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            log_probs = batch_log_probs(model, batch, pad_id=pad_id)
        loss_sum += criterion(log_probs, batch.tgt_out).item()
        stats += token_stats(log_probs, batch.tgt_out, pad_id=pad_id)
    model.train(was_training)
    if world_size() > 1:
        sums = [loss_sum, stats.nll_sum, stats.correct, stats.tokens]
        total = torch.tensor(sums, dtype=torch.float64, device=device)
        dist.all_reduce(total)
        loss_sum, nll_sum, correct, tokens = total.tolist()
        stats = TokenStats(
            nll_sum=nll_sum, correct=int(correct), tokens=int(tokens)
        )
    return Validation(loss_sum=loss_sum, stats=stats, words=words)


# %% [markdown]
# ## R-Drop
#
# R-Drop {cite:p}`liang2021rdrop` passes each training sentence through the model twice, with
# independent dropout masks, and pulls the two predictions $P_1$ and $P_2$ together. `doubled`
# stacks a batch on itself, so one forward pass makes both, and `RDropLoss` returns
#
# $$
# \sum_t \Big(\tfrac12\big(L(P_1) + L(P_2)\big)
# + \tfrac{\alpha}{4}\big(\mathrm{KL}(P_1 \| P_2) + \mathrm{KL}(P_2 \| P_1)\big)\Big)
# $$
#
# over the real target tokens $t$, with $L$ the label-smoothed loss: R-Drop's loss halved, so
# that dividing by one copy's tokens keeps the book's scale. Not in the Transformer paper,
# `r_drop` ($\alpha$) is 0 by default; above 0, each sentence costs a second pass.

# %%
#| export rdrop
"""R-Drop (Liang et al. 2021): a symmetric KL term between two dropout passes
of each training sentence, added to the label-smoothed loss."""

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.loss import LabelSmoothingLoss, check_log_probs


def doubled(batch: Batch) -> Batch:
    """The batch followed by itself: one forward pass, two dropout masks."""
    tensors = ("src", "tgt_in", "tgt_out", "index")
    return dataclasses.replace(
        batch,
        **{n: torch.cat([getattr(batch, n)] * 2) for n in tensors},
        n_src_tokens=2 * batch.n_src_tokens,
        n_tgt_tokens=2 * batch.n_tgt_tokens,
    )


class RDropLoss(nn.Module):
    """½(L(P1) + L(P2)) + α/4 · Σ (KL(P1 ‖ P2) + KL(P2 ‖ P1)), summed over
    real target tokens: R-Drop's loss halved, so that `train_step`'s division
    by the tokens of one copy keeps the per-token scale of `base`.

    Shapes: log_probs (2B, T, V), the two copies of a `doubled` batch; target
    (2B, T); returns a scalar
    """

    def __init__(self, base: LabelSmoothingLoss, alpha: float) -> None:
        super().__init__()
        if base.reduction != "sum":
            raise ValueError(
                f"R-Drop needs a base loss with reduction='sum', got"
                f" {base.reduction!r}"
            )
        if isinstance(alpha, bool) or not (
            isinstance(alpha, int | float) and 0 <= alpha < math.inf
        ):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
        self.base, self.alpha = base, alpha
        self.pad_id, self.reduction = base.pad_id, "sum"  # as train_step asks

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"

    def forward(self, log_probs: Tensor, target: Tensor) -> Tensor:
        check_log_probs(log_probs, target)
        if target.dim() == 0 or target.size(0) % 2:
            raise ValueError(
                f"R-Drop needs a doubled batch (an even number of rows),"
                f" got target {tuple(target.shape)}"
            )
        p1, p2 = log_probs.float().chunk(2)  # (B, T, V) each
        # kl_div(a, b) is KL(b ‖ a) at each position and entry of V
        kl = F.kl_div(p1, p2, log_target=True, reduction="none").sum(-1)
        kl = kl + F.kl_div(p2, p1, log_target=True, reduction="none").sum(-1)
        real = target.chunk(2)[0] != self.pad_id  # (B, T)
        symmetric = kl.masked_fill(~real, 0.0).sum()
        return 0.5 * self.base(log_probs, target) + self.alpha / 4 * symmetric


# %% [markdown]
# Without dropout the copies agree: the KL term is 0 and the loss, $\tfrac12(L_1 + L_2)$, is one
# copy's. With dropout the KL term makes it larger:

# %%
from transformer.rdrop import RDropLoss, doubled

cfg = TransformerConfig.small(16, n_layers=1, d_model=32, n_heads=2, d_ff=64)
model = Transformer(cfg)
pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]
batch = doubled(collate(pairs, pad_id=0, bos_id=1, eos_id=2))
base = LabelSmoothingLoss(pad_id=0, reduction="sum")
for dropout in (False, True):
    model.train(dropout)
    with torch.no_grad():
        log_probs = batch_log_probs(model, batch, pad_id=0)
        mean = base(log_probs, batch.tgt_out).item() / 2
        r_drop = RDropLoss(base, alpha=1.0)(log_probs, batch.tgt_out).item()
    print(f"dropout {dropout}: ½(L1 + L2) {mean:.3f}, R-Drop {r_drop:.3f}")
    same = math.isclose(r_drop, mean, rel_tol=1e-5)
    assert same if not dropout else r_drop > mean


# %% [markdown]
# ## The Trainer
#
# `train(config)` does a whole run, and `Trainer` holds its state: the model, the optimiser,
# the batches and `Progress`, where the run stands. Its methods each do one job:
#
# - `__init__` checks the output folder (a folder holding another run is an error unless
#   resuming), loads the tokenizer and the encoded splits from the data chapter's cache, checks
#   that every sentence fits a batch and the model's positions, builds the model with the run's
#   seed, Adam and the schedule, and, when resuming, loads the latest checkpoint;
# - `run` trains epoch after epoch until the last, or until `max_steps` or the time limit, and
#   then averages the last `average_last` epoch checkpoints;
# - `_train_epoch` orders the training pairs into token-bucketed batches from `(seed, epoch)`
#   and makes one `_update` per group of batches, writing a line to `steps.jsonl` every
#   `log_every` updates; `_update` calls the training chapter's `train_step`;
# - `_end_period` validates, appends the epoch's line to `metrics.jsonl` and writes a
#   checkpoint;
# - `_average` validates the average of the last checkpoints and writes it to `average/`.
#
# Every line of `metrics.jsonl` holds `kind` (`epoch`, `partial` for a stop inside an epoch, or
# `average`), `epoch`, `step` (updates made), the validation metrics above (`val_loss`,
# `val_nll`, `val_ppl_token`, `val_ppl_word`, `val_accuracy`) and `wall_time`; an epoch line
# adds `train_loss`, `train_tokens`, `tokens_per_s` (real target tokens per second of training),
# `lr` and `mfu`, the share of the GPU's peak arithmetic rate that the model's FLOPs used (the
# appendix [Derivations and counts](a11_counts.ipynb) derives the count).
#
# The module's imports come first: it builds on every module above.

# %%
#| export
"""A training run of Vaswani et al. (2017)'s model: the `Trainer` makes the
training chapter's updates epoch after epoch, validates, checkpoints and
resumes exactly, in one process or several (torchrun).

Imports neither Altair, pandas nor spaCy: a GPU machine trains from the encoded
cache.
"""

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler

from transformer.checkpoint import Progress
from transformer.config import TransformerConfig
from transformer.counts import training_flops
from transformer.data import Batch, EncodedSplit, collate, iterate_batches
from transformer.distributed import (
    Distributed,
    all_sum,
    device_for,
    seed_update,
)
from transformer.files import read_jsonl
from transformer.logs import (
    Log,
    StepLog,
    average_record,
    epoch_line,
    epoch_record,
    metrics_text,
    progress_bar,
    show_step,
)
from transformer.loop import train_step
from transformer.loss import LabelSmoothingLoss
from transformer.model import Transformer
from transformer.rdrop import RDropLoss, doubled
from transformer.run_checkpoints import (
    RunFolder,
    averaged_model,
    last_epochs,
    resume_point,
    run_record,
)
from transformer.schedule import make_optimizer
from transformer.tokenizer import Tokenizer
from transformer.train_config import TrainConfig
from transformer.training_data import (
    TrainingData,
    dropped_warning,
    epoch_batches,
    load_training_data,
    prepare_epochs,
    updates_per_epoch,
)
from transformer.validation import Validation, count_words, validate


# %% [markdown]
# Then the helpers of the set-up: the model, its wrappers, the run's folder and each process's
# batches.


# %%
#| export
def _sync(device: torch.device) -> float:
    """The time, after the GPU has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _build(
    config: TrainConfig,
    model_config: TransformerConfig,
    device: torch.device,
    pad_id: int,
) -> tuple[
    Transformer,
    torch.optim.Optimizer,
    LRScheduler,
    LabelSmoothingLoss | RDropLoss,
]:
    """The model, initialised from the run's seed, Adam with the schedule, and
    the training loss (validation makes its own, without R-Drop)."""
    torch.manual_seed(config.seed)
    model = Transformer(model_config).to(device)
    optimizer, scheduler = make_optimizer(
        model,
        d_model=model_config.d_model,
        warmup=config.warmup,
        factor=config.lr_factor,
    )
    smoothing = config.label_smoothing
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
    if config.r_drop > 0:
        criterion = RDropLoss(criterion, config.r_drop)
    return model, optimizer, scheduler, criterion


def _wrap(
    model: nn.Module,
    config: TrainConfig,
    env: Distributed,
    device: torch.device,
) -> nn.Module:
    """The model that updates run: under DistributedDataParallel with several
    processes, compiled if asked."""
    if env.world_size > 1:
        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    return torch.compile(model) if config.compile else model


def _validator(
    data: TrainingData,
    config: TrainConfig,
    max_len: int,
    env: Distributed,
    bf16: bool,
) -> Callable[[nn.Module], Validation]:
    """Validation of a model on this process's share of the batches, the
    words of all the references counted."""
    val = iterate_batches(
        data.val,
        data.tokenizer,
        max_tokens=config.max_tokens,
        shuffle=False,
        max_len=max_len,
    )
    return functools.partial(
        validate,
        batches=list(val)[env.rank :: env.world_size],
        pad_id=data.tokenizer.pad_id,
        smoothing=config.label_smoothing,
        words=count_words(data.tokenizer, data.val),
        bf16=bf16,
    )


def _collate_share(
    train: EncodedSplit,
    update: list[np.ndarray],
    tokenizer: Tokenizer,
    max_len: int,
    env: Distributed,
) -> list[Batch]:
    """This process's batches of an update: every world_size-th, from its rank
    on."""
    return [
        collate(
            [train[i] for i in index],
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            index=index,
            max_len=max_len,
        )
        for index in update[env.rank :: env.world_size]
    ]


# %% [markdown]
# ### The time limit
#
# `time_limit` (minutes) stops a run early enough to validate and save a checkpoint, so that a
# long run on machines lent for a few minutes at a time can be a chain of resumed ones. The run
# asks the clock before each update whether to stop. It must stop early enough for what comes
# after the last update: validating and saving, whose time the clock measures at each epoch's
# end, and the stretch until the next check, whose longest length it keeps measuring. With
# several processes every one must stop at the same update, so the first process decides and
# broadcasts its answer; a broadcast waits for every process, so it is asked every 10 updates.


# %%
#| export
class _Clock:
    """The time limit: the run stops at a check early enough to validate and
    save."""

    def __init__(
        self, limit: float | None, env: Distributed, device: torch.device
    ):
        self.start, self.limit = time.perf_counter(), limit
        self.env, self.device = env, device
        self.reserve = (
            0.05 * 60 * limit if limit else 0.0
        )  # to validate and save
        # With several processes the time check is a collective: every 10
        # updates then.
        self.check_every = 1 if env.world_size == 1 else 10
        self.gap = 0.0  # the longest time measured between two time checks
        self.checked: float | None = None  # when the time was last checked

    def time_is_up(self) -> bool:
        """Measure the time since the last check; say whether to stop now."""
        now = time.perf_counter()
        if self.checked is not None:
            self.gap = max(self.gap, now - self.checked)
        self.checked = now
        if self.limit is None:
            return False
        # The run goes on until the next check before it validates and saves:
        # the longest time seen between two checks (one update, or ten with
        # several processes) is reserved besides the time of validating and
        # saving.
        reserve = self.reserve + self.gap
        late = time.perf_counter() - self.start > 60 * self.limit - reserve
        if self.env.world_size > 1:  # processes must stop at the same update
            flag = torch.tensor([float(late)], device=self.device)
            dist.broadcast(flag, src=0)
            late = bool(flag.item())
        return late


# %% [markdown]
# ### What a run writes
#
# The progress bar, `train.log`, and the lines of `steps.jsonl` and `metrics.jsonl`, in a module
# of their own:

# %%
#| export logs
"""What a training run writes as it goes: the progress bar, train.log, and
the lines of steps.jsonl and metrics.jsonl."""

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from transformer.checkpoint import Progress
from transformer.distributed import all_sum
from transformer.files import append_jsonl
from transformer.validation import Validation


def progress_bar(
    total: int, initial: int, epoch: int, epochs: int, main: bool
) -> tqdm:
    """The progress bar of an epoch's updates, shown by the first process in a
    terminal."""
    return tqdm(
        total=total,
        initial=initial,
        desc=f"epoch {epoch + 1}/{epochs}",
        unit="update",
        disable=None if main else True,  # None: off when not a terminal
        dynamic_ncols=True,
    )


def show_step(bar: tqdm, r: dict[str, Any]) -> None:
    """A steps.jsonl line beside the progress bar."""
    loss, tok_s = f"{r['train_loss']:.3f}", f"{r['tokens_per_s']:,.0f}"
    bar.set_postfix(loss=loss, tok_s=tok_s, lr=f"{r['lr']:.2e}")


class Log:
    """Lines to the run's train.log and, if `echo`, to the terminal (around the
    progress bar)."""

    def __init__(self, path: Path | None, echo: bool) -> None:
        self.file = open(path, "a") if path is not None else None
        self.echo = echo

    def __call__(self, message: str, *, echo: bool = True) -> None:
        if self.file is not None:
            self.file.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n"
            )
            self.file.flush()
        if self.echo and echo:
            tqdm.write(message, file=sys.stdout)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


class StepLog:
    """The lines of steps.jsonl: the training loss and throughput since the
    last line."""

    def __init__(self, path: Path | None, device: torch.device) -> None:
        self.path, self.device = path, device

    def restart(self, now: float) -> None:
        self.start, self.tokens = now, 0
        self.loss = torch.zeros((), device=self.device, dtype=torch.float64)

    def add(self, loss: Tensor, tokens: int) -> None:
        self.loss += loss
        self.tokens += tokens

    def write(
        self, p: Progress, batches: int, lr: float, start: float
    ) -> dict:
        """The line at update `p.step` of an epoch of `batches` batches;
        `start` is when this process of the run began."""
        now = time.perf_counter()
        mean = all_sum([self.loss.item()], self.device)[0] / self.tokens
        record = {
            "step": p.step,
            "epoch": round(p.epoch + p.batch / batches, 4),
            "train_loss": mean,
            "lr": lr,
            "tokens_per_s": self.tokens / (now - self.start),
            "wall_time": p.wall_time + now - start,
        }
        if self.path is not None:
            append_jsonl(self.path, record)
        self.restart(now)
        return record


def epoch_record(
    kind: str,
    epoch: float,
    p: Progress,
    validation: Validation,
    lr: float,
    wall_time: float,
    peak: float | None,
) -> dict[str, Any]:
    """The line of metrics.jsonl for an epoch, or the part of one before a
    stop; `peak` is the processes' peak FLOP rate (None on a CPU: no MFU)."""
    seconds = max(p.epoch_seconds, 1e-9)
    return {
        "kind": kind,
        "epoch": epoch,
        "step": p.step,
        "train_loss": p.epoch_loss_sum / max(p.epoch_tokens, 1),
        **validation.metrics(),
        "train_tokens": p.epoch_tokens,
        "tokens_per_s": p.epoch_tokens / seconds,
        "lr": lr,
        "wall_time": wall_time,
        "mfu": p.epoch_flops / seconds / peak if peak is not None else None,
    }


def average_record(
    p: Progress, names: list[str], validation: Validation, wall_time: float
) -> dict[str, Any]:
    """The line of metrics.jsonl for the average of the checkpoints
    `names`."""
    return {
        "kind": "average",
        "epoch": float(p.epoch),
        "step": p.step,
        "averaged": names,
        **validation.metrics(),
        "wall_time": wall_time,
    }


def metrics_text(r: dict[str, Any]) -> str:
    return (
        f"val loss {r['val_loss']:.3f}, ppl/word {r['val_ppl_word']:.2f}, "
        f"ppl/token {r['val_ppl_token']:.2f}, accuracy {r['val_accuracy']:.1%}"
    )


def epoch_line(r: dict[str, Any], epochs: int) -> str:
    mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
    return (
        f"epoch {r['epoch']:g}/{epochs} step {r['step']:,}: train loss"
        f" {r['train_loss']:.3f}, "
        + metrics_text(r)
        + f", {r['tokens_per_s']:,.0f} tok/s{mfu}, lr {r['lr']:.2e}"
    )


# %% [markdown]
# The trainer's own helpers: where a run starts, and what it returns:


# %%
#| export
def _where(checkpoint: Path | None, resume: bool, out: Path) -> str:
    """Where a run starts: from a checkpoint, or from scratch."""
    if checkpoint is not None:
        return f"resuming from {checkpoint}"
    # The same command, repeated across stops, starts the run the first time.
    if resume:
        return f"nothing to resume in {out}: starting a new run"
    return "starting"


def _start_line(
    where: str,
    config: TrainConfig,
    model: nn.Module,
    env: Distributed,
    device: torch.device,
    bf16: bool,
) -> str:
    """The log's first line: where the run starts, its model, processes and
    arithmetic."""
    n = sum(p.numel() for p in model.parameters())
    return (
        f"{where}: {config.pair}, model {config.preset}"
        f" {config.model_overrides or ''} ({n:,} parameters), {env.world_size}"
        f" process(es) on {device}, bf16 {bf16}, compile {config.compile}"
    )


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    stopped: str  # "completed", "max_steps" or "time_limit"
    step: int
    metrics: list[dict[str, Any]]


# %% [markdown]
# The trainer itself, its set-up first, then the epochs:


# %%
#| export
class Trainer:
    """One process's part of a training run; `train(config)` builds one and
    calls `run()`."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        resume: bool = False,
        data: TrainingData | None = None,
        echo: bool = True,
    ) -> None:
        self.config = c = config
        self.env = env = Distributed.from_environ()
        self.device = device_for(c.device, env)
        self.clock = _Clock(c.time_limit, env, self.device)
        self.out = c.output_dir
        checkpoint = resume_point(self.out, c, env, resume=resume)
        self.data = data if data is not None else load_training_data(c)
        tokenizer = self.data.tokenizer
        self.model_config = c.model_config(tokenizer.vocab_size)
        max_len = self.model_config.max_len
        epoch = Progress.read(checkpoint).epoch if checkpoint else 0
        self.spellings, first = prepare_epochs(
            c, self.data, max_len, env.world_size, epoch
        )
        # With a GPU a second process spells the next epoch while this one
        # trains; on a CPU the training itself keeps every core busy.
        self.spellings.prefetch = self.device.type == "cuda"
        self.model, self.optimizer, self.scheduler, self.criterion = _build(
            c, self.model_config, self.device, tokenizer.pad_id
        )
        record = run_record(c, self.model_config, tokenizer)
        self.folder = RunFolder(c, env, record, tokenizer)
        self.progress = self.folder.open(
            checkpoint, self.model, self.optimizer, self.scheduler
        )
        self.step_model = _wrap(self.model, c, env, self.device)
        self.bf16 = c.uses_bf16(self.device.type)
        self.validate = _validator(self.data, c, max_len, env, self.bf16)
        self.loss_acc = torch.zeros(
            (), device=self.device, dtype=torch.float64
        )
        self.lr = 0.0  # the learning rate of the last update
        steps = self.out / "steps.jsonl" if env.is_main else None
        self.steps = StepLog(steps, self.device)
        # Opened last, so that a set-up error leaves no file open.
        main = self.out / "train.log" if env.is_main else None
        self.log = Log(main, echo and env.is_main)
        where = _where(checkpoint, resume, self.out)
        line = _start_line(where, c, self.model, env, self.device, self.bf16)
        self.log(line)
        self.log(f"config: {json.dumps(c.to_dict())}", echo=False)
        if warning := dropped_warning(first, c.accumulation, env.world_size):
            self.log(warning)

    # -- the epochs

    def run(self) -> TrainResult:
        c, p = self.config, self.progress
        stopped, trained = "completed", False
        try:
            while p.epoch < c.epochs:
                if c.max_steps is not None and p.step >= c.max_steps:
                    stopped = "max_steps"
                    break
                reason, updates = self._train_epoch()
                trained = trained or updates > 0
                if reason is not None:
                    if updates > 0:
                        self._end_period(kind="partial")
                    stopped = reason
                    break
                self._end_period(kind="epoch")
            averaged = (self.out / "average").exists()
            if stopped != "time_limit" and (trained or not averaged):
                self._average()
        finally:
            self.log.close()
            self.spellings.close()
        metrics = read_jsonl(self.out / "metrics.jsonl")
        return TrainResult(self.out, stopped, p.step, metrics)

    def _train_epoch(self) -> tuple[str | None, int]:
        """Updates until the epoch ends (None) or the run must stop (the
        reason)."""
        c, p, env, clock = self.config, self.progress, self.env, self.clock
        self.train = self.spellings(p.epoch)
        self.tgt_lengths = self.train.tgt_lengths + 1
        self.pair_flops = training_flops(
            self.model,
            src_lengths=self.train.src_lengths + 1,
            tgt_lengths=self.tgt_lengths,
        ) * (2 if c.r_drop > 0 else 1)  # R-Drop: two passes of each pair
        batches = epoch_batches(self.train, p.epoch, c)
        group = c.accumulation * env.world_size
        total = updates_per_epoch(len(batches), c.accumulation, env.world_size)
        self.model.train()
        done = min(p.batch // group, total)
        bar = progress_bar(total, done, p.epoch, c.epochs, env.is_main)
        start, updates, reason = _sync(self.device), 0, None
        self.steps.restart(start)
        clock.checked = None
        while p.batch + group <= len(batches):
            if c.max_steps is not None and p.step >= c.max_steps:
                reason = "max_steps"
                break
            if updates % clock.check_every == 0 and clock.time_is_up():
                reason = "time_limit"
                break
            self._update(batches[p.batch : p.batch + group])
            updates += 1
            bar.update(1)
            if p.step % c.log_every == 0:
                r = self.steps.write(p, len(batches), self.lr, clock.start)
                show_step(bar, r)
        bar.close()
        p.epoch_seconds += _sync(self.device) - start
        self.fraction = p.batch / len(batches)
        return reason, updates

    def _update(self, update: list[np.ndarray]) -> None:
        """One update over a group of batches, of which this process collates
        its share."""
        c, p, env = self.config, self.progress, self.env
        tok, max_len = self.data.tokenizer, self.model_config.max_len
        mine = _collate_share(self.train, update, tok, max_len, env)
        if c.r_drop > 0:  # both dropout passes in one batch
            mine = [doubled(batch) for batch in mine]
        every = np.concatenate(update)
        tokens = int(self.tgt_lengths[every].sum())  # of one copy
        seed_update(c.seed, p.step, env.rank)
        self.lr = self.scheduler.get_last_lr()[0]  # this update's (equation 3)
        loss = train_step(
            self.step_model,
            mine,
            criterion=self.criterion,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            tokens=tokens,
            bf16=self.bf16,
        )
        p.step += 1
        p.batch += len(update)
        p.epoch_tokens += tokens
        p.epoch_flops += float(self.pair_flops[every].sum())
        self.loss_acc += loss
        self.steps.add(loss, tokens)

    # -- the end of an epoch, and of the run

    def _end_period(self, *, kind: str) -> None:
        """Validate, record the metrics, and write a checkpoint (the end of an
        epoch, or a stop)."""
        c, p = self.config, self.progress
        started = time.perf_counter()
        p.epoch_loss_sum += all_sum([self.loss_acc.item()], self.device)[0]
        self.loss_acc.zero_()
        validation = self.validate(self.model)
        if kind == "epoch":
            p.epoch += 1
            epoch, name = float(p.epoch), f"epoch-{p.epoch:03d}"
        else:
            epoch = round(p.epoch + self.fraction, 4)
            name = f"step-{p.step:07d}"
        wall = self._wall_time()
        peak = c.peak_flops * self.env.world_size
        peak = peak if self.device.type == "cuda" else None
        record = epoch_record(kind, epoch, p, validation, self.lr, wall, peak)
        self.log(epoch_line(record, c.epochs))
        if kind == "epoch":  # the next epoch starts from zero
            p.batch, p.epoch_loss_sum, p.epoch_tokens = 0, 0.0, 0
            p.epoch_seconds, p.epoch_flops = 0.0, 0.0
        saved = dataclasses.replace(
            p, wall_time=self._wall_time(), processes=self.env.world_size
        )
        self.folder.save(
            name, record, self.model, self.optimizer, self.scheduler, saved
        )
        self.clock.reserve = 1.5 * (time.perf_counter() - started)

    def _wall_time(self) -> float:
        """Seconds of the run so far, this process's and earlier ones'."""
        return self.progress.wall_time + time.perf_counter() - self.clock.start

    def _average(self) -> None:
        """Average the last `average_last` epoch checkpoints into out/average
        and validate it."""
        chosen = last_epochs(self.out, self.config.average_last)
        if len(chosen) < 2:
            return
        averaged = averaged_model(chosen, self.model_config, self.device)
        validation = self.validate(averaged)
        names = [path.name for path in chosen]
        record = average_record(
            self.progress, names, validation, self._wall_time()
        )
        self.log(f"average of {', '.join(names)}: " + metrics_text(record))
        self.folder.save_average(record, averaged)


# %% [markdown]
# `train` runs a `Trainer`, and when torchrun started the process, opens the process group
# around it:


# %%
#| export
def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    data: TrainingData | None = None,
    echo: bool = True,
) -> TrainResult:
    """Train as `config` says, in one process or, under torchrun, in several.

    With `resume`, continue the run in the output folder from its latest
    checkpoint. `data` replaces the Multi30k cache (tests); `echo=False` writes
    the log to train.log only.
    """
    env = Distributed.from_environ()
    owns_group = env.world_size > 1 and not dist.is_initialized()
    if owns_group:
        device = device_for(config.device, env)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return Trainer(config, resume=resume, data=data, echo=echo).run()
    finally:
        if owns_group:
            dist.destroy_process_group()


# %% [markdown]
# ## Exact resume
#
# A run stopped and resumed should end where an uninterrupted run ends, bit for bit, or a
# long run split into several jobs would be a different experiment from the same run made in
# one piece. Everything an update depends on is either stored in the checkpoint or a
# function of what is:
#
# | what an update depends on | where it comes from |
# | --- | --- |
# | the weights, Adam's moments and step counts | the checkpoint's safetensors files |
# | the learning rate | the scheduler's count of updates, in `trainer.json` |
# | the position in the epoch | `progress.json`: epochs done, batches of the epoch used |
# | the order of the epoch's batches, and their spelling under BPE-dropout | drawn from (seed, epoch) |
# | the dropout masks | drawn from (seed, update, process), seeded afresh before each update |
#
# No random generator's state needs storing. Records in `metrics.jsonl` and `steps.jsonl`
# written after the checkpoint a run resumes from are dropped, since the resumed run writes them
# again, and a resume must run as many processes as the run it continues (the number is kept in
# `progress.json`). On one machine, then, two epochs straight and one epoch stopped part way,
# resumed and continued give the same weights. A GPU promises less than a CPU: some kernels (a
# backward pass that adds with atomic operations, for one) may add in a varying order from run
# to run.
#
# The check, on a tiny model and a tiny synthetic data set, a few seconds on a CPU: one run of
# two epochs, and one stopped after two updates, then resumed.

# %%
import numpy as np

from transformer.checkpoint import read_tensors
from transformer.data import EncodedSplit
from transformer.tokenizer import MARK, train_bpe
from transformer.train import train
from transformer.train_config import TrainConfig
from transformer.training_data import TrainingData

rng = np.random.default_rng(0)
words = [
    [
        MARK + "".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 4)))
        for _ in range(5)
    ]
    for _ in range(30)
]
tokenizer = train_bpe(words, 40, languages=("de", "en"))


def random_split(n: int) -> EncodedSplit:
    """n pairs of random token sequences of 1 to 7 tokens."""
    sentences = [
        rng.integers(4, tokenizer.vocab_size, rng.integers(1, 8)).tolist()
        for _ in range(2 * n)
    ]
    return EncodedSplit.from_lists(sentences[:n], sentences[n:])


data = TrainingData(tokenizer, random_split(40), random_split(12))
tiny_run = dict(
    pair="de-en",
    model_overrides=dict(n_layers=1, d_model=16, n_heads=2, d_ff=32),
    epochs=2,
    max_tokens=48,
    warmup=5,
    average_last=2,
    device="cpu",
)
straight = train(
    TrainConfig(**tiny_run, out_dir=str(scratch / "straight")),
    data=data,
    echo=False,
)
stopped = TrainConfig(
    **tiny_run, max_steps=2, out_dir=str(scratch / "resumed")
)
first = train(stopped, data=data, echo=False)
second = train(
    TrainConfig(**tiny_run, out_dir=str(scratch / "resumed")),
    resume=True,
    data=data,
    echo=False,
)
print(
    f"stopped: {first.stopped} after {first.step} updates; resumed to"
    f" {second.step}"
)
for folder in ("checkpoints/epoch-002", "average"):
    a = read_tensors(scratch / "straight" / folder / "model.safetensors")
    b = read_tensors(scratch / "resumed" / folder / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
print("the same weights, bit for bit, after two epochs and in the average")

# %% [markdown]
# Resuming with another value of a field that decides the updates is refused:

# %%
from transformer.checkpoint import CheckpointError

try:
    changed = TrainConfig(**tiny_run, seed=1, out_dir=str(scratch / "resumed"))
    train(changed, resume=True, data=data, echo=False)
except CheckpointError as err:
    print("CheckpointError:", str(err).replace(str(scratch), "<tmp>"))
else:
    raise AssertionError("a changed seed was accepted")

# %% [markdown]
# ## Exporting and loading a model
#
# A trained run is exported into a small folder that the repository ships and that
# `load_model` reads:
#
# | file | holds |
# | --- | --- |
# | `model-00001.safetensors`, … | the weights in float16 (or bfloat16), at most 16 MB per file |
# | `config.json` | the model's config, the training config, the vocabulary's fingerprint, and which weight is in which file |
# | `tokenizer.json` | the tokenizer |
# | `metrics.jsonl` | the run's metrics |
#
# Half-precision weights halve the size; the model computes in float32 after loading, and the
# rounding of the weights to 11 significant bits (float16) changes its log-probabilities only
# slightly. Given a run's folder, the export takes the run's average when it is current (when it
# ends with the run's newest epoch checkpoint: a run continued after it averaged may have trained
# past its average), and its latest checkpoint otherwise. The export replaces its destination as
# a whole, so it refuses one that holds anything but the files of an earlier export, and one
# that is, or holds, the run it exports.

# %%
#| export checkpoint
MAX_FILE_BYTES = 16 * 2**20
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _model_source(source: Path) -> Path:
    """The folder of weights a run or checkpoint path stands for: the run's
    average when it is current, else its newest checkpoint."""
    if (source / "model.safetensors").is_file():
        return source
    found = [path for _, path in list_checkpoints(source)]
    average = source / "average"
    if (average / "model.safetensors").is_file():
        # A run continued after it averaged (killed, stopped by its time limit,
        # or with average_last below 2) has trained past its average: the
        # average is current only while it ends with the newest epoch
        # checkpoint. A `partial` checkpoint after that one is left out, as the
        # average of a run stopped by its time limit leaves it out.
        epochs = [
            path.name for path in found if path.name.startswith("epoch-")
        ]
        averaged = read_record(average).get("averaged") or [None]
        if not epochs or averaged[-1] == epochs[-1]:
            return average
    if not found:
        raise CheckpointError(
            f"{source} holds no trained model (no checkpoint, no average)"
        )
    return found[-1]


# What an export writes: a destination that holds anything else is not
# replaced.
_EXPORT_FILES = ("config.json", "tokenizer.json", "metrics.jsonl")


def check_export_destination(dest: Path, source: Path) -> None:
    """Refuse a destination that `export_model` would replace with loss: one
    that is, or holds, the source, or holds anything but an earlier export's
    files."""
    dest, source = Path(dest), Path(source)
    if dest.resolve() == source.resolve() or source.resolve().is_relative_to(
        dest.resolve()
    ):
        raise CheckpointError(
            f"cannot export into {dest}: it holds the source {source}, which"
            " the export would replace; choose a new or empty folder"
        )
    if not dest.exists():
        return
    if not dest.is_dir():
        raise CheckpointError(f"cannot export into {dest}: it is not a folder")
    others = sorted(
        p.name
        for p in dest.iterdir()
        if not (
            (
                p.name in _EXPORT_FILES
                or re.fullmatch(r"model-\d{5}\.safetensors", p.name)
            )
            and p.is_file()
        )
    )
    if not others and (dest / "config.json").is_file():
        try:
            shipped = json.loads((dest / "config.json").read_text()).get(
                "format"
            )
        except (OSError, ValueError, AttributeError):
            shipped = None
        if shipped != SHIPPED_FORMAT:
            others = ["a config.json that is not a shipped model's"]
    if others:
        raise CheckpointError(
            f"cannot export into {dest}: it holds {', '.join(others[:3])}"
            f"{' and more' if len(others) > 3 else ''},"
            " which an export does not write and would delete; choose a new"
            " or empty folder"
        )


def _shards(
    tensors: dict[str, Tensor], dtype: str, max_file_bytes: int
) -> list[dict[str, Tensor]]:
    """The weights in `dtype`, cut into files of at most `max_file_bytes`."""
    files: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        half = tensor.to(_DTYPES[dtype]).contiguous()
        if not torch.isfinite(half).all():
            raise ValueError(
                f"weight {name} does not fit in {dtype}: try bfloat16"
            )
        nbytes = half.numel() * half.element_size()
        # leave room for the file's JSON header
        if nbytes > max_file_bytes - 65_536:
            raise ValueError(
                f"weight {name} alone needs {nbytes:,} bytes, over the limit"
            )
        if size + nbytes > max_file_bytes - 65_536:
            files.append({})
            size = 0
        files[-1][name] = half
        size += nbytes
    return files


def export_model(
    source: str | Path,
    dest: str | Path,
    *,
    dtype: str = "float16",
    max_file_bytes: int = MAX_FILE_BYTES,
) -> Path:
    """Write the shipped form of a trained model: 16-bit safetensors files of
    at most `max_file_bytes`, config.json, tokenizer.json and the run's
    metrics.jsonl.

    `source` is a run folder (its average when current, else its latest
    checkpoint) or a checkpoint folder. `dest` must be new, empty or an earlier
    export (CheckpointError).
    """
    if dtype not in _DTYPES:
        raise ValueError(
            f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}"
        )
    check_export_destination(Path(dest), Path(source))
    folder = _model_source(Path(source))
    record = read_record(folder)
    files = _shards(
        read_tensors(folder / "model.safetensors"), dtype, max_file_bytes
    )
    weight_map = {}
    dest = Path(dest)
    candidates = (
        folder.parent / "metrics.jsonl",
        folder.parent.parent / "metrics.jsonl",
    )
    metrics = next((p for p in candidates if p.is_file()), None)
    with atomic_folder(dest) as tmp:
        for k, part in enumerate(files, start=1):
            file = f"model-{k:05d}.safetensors"
            safetensors.torch.save_file(
                part, tmp / file, metadata={"format": SHIPPED_FORMAT}
            )
            weight_map |= dict.fromkeys(part, file)
        shipped = record | {
            "format": SHIPPED_FORMAT,
            "dtype": dtype,
            "weight_map": weight_map,
            "source": folder.name,
        }
        (tmp / "config.json").write_text(json.dumps(shipped, indent=2) + "\n")
        shutil.copy(folder / "tokenizer.json", tmp / "tokenizer.json")
        if metrics is not None:
            shutil.copy(metrics, tmp / "metrics.jsonl")
    return dest


def load_model(
    folder: str | Path, *, device: str | torch.device = "cpu"
) -> tuple[Transformer, Tokenizer]:
    """The model (float32, eval mode) and tokenizer of a shipped folder or a
    checkpoint."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"no model folder {folder}")
    record = read_record(folder)
    try:
        model_config = TransformerConfig.from_dict(record["model"])
    except (ValueError, TypeError) as err:
        raise CheckpointError(
            f"{folder / 'config.json'}: bad model config: {err}"
        ) from err
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder}: no tokenizer.json")
    try:
        tokenizer = Tokenizer.load(folder / "tokenizer.json")
    except TokenizerError as err:
        raise CheckpointError(str(err)) from err
    if tokenizer.vocab_size != model_config.src_vocab_size:
        raise CheckpointError(
            f"{folder}: tokenizer.json has {tokenizer.vocab_size} entries, the"
            f" model's src_vocab_size is {model_config.src_vocab_size} (field"
            " vocab_size)"
        )
    if record["vocab"].get("sha256") != tokenizer_digest(tokenizer):
        raise CheckpointError(
            f"{folder}: tokenizer.json is not the vocabulary the model was"
            " trained with (field tokenizer)"
        )
    if record.get("format") == SHIPPED_FORMAT:
        files = sorted(set(record.get("weight_map", {}).values()))
    else:
        files = ["model.safetensors"]
    tensors: dict[str, Tensor] = {}
    for file in files:
        tensors |= read_tensors(folder / file)
    model = Transformer(model_config)
    load_tensors_into(model, tensors, folder)
    return model.to(device).eval(), tokenizer


# %% [markdown]
# The tiny run's export holds its average in float16; loaded back, the model's
# log-probabilities stay within the rounding of its weights of the float32 average's:

# %%
from transformer.checkpoint import export_model, load_model, read_record
from transformer.data import collate
from transformer.validation import batch_log_probs

exported = export_model(scratch / "straight", scratch / "exported")
print(sorted(p.name for p in exported.iterdir()))
half, _ = load_model(exported)
full, _ = load_model(scratch / "straight" / "average")
ids = dict(
    pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id
)
batch = collate([data.val[i] for i in range(4)], **ids)
with torch.no_grad():
    gap = batch_log_probs(
        half, batch, pad_id=tokenizer.pad_id
    ) - batch_log_probs(full, batch, pad_id=tokenizer.pad_id)
assert 0 < gap.abs().max() < 1e-2

# %% [markdown]
# The shipped German→English model loads in a second:

# %%
from transformer.data import DATA_DIR

shipped = DATA_DIR.parents[1] / "checkpoints" / "de-en"
de_en, de_en_tokenizer = load_model(shipped)
record = read_record(shipped)
files = sorted(set(record["weight_map"].values()))
n_params = sum(p.numel() for p in de_en.parameters())
print(f"{record['format']!r}: {record['dtype']} weights in {files}")
print(
    f"{n_params:,} parameters, a vocabulary of {de_en_tokenizer.vocab_size:,}"
)
assert n_params == 6_001_664

# %% tags=["remove-cell"]
# The temporary folders of this appendix.
import shutil

shutil.rmtree(scratch, ignore_errors=True)
