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
# # Checkpoints
#
# A run that may stop at any moment must be saved so that it resumes exactly, and a finished run
# must leave a small folder that ships its model. On [Setting up a run](a05_run_setup.ipynb) this
# appendix builds a checkpoint's files, written without pickle; the average of the last
# checkpoints; a run's checkpoints and the checks of resuming; and the export of a trained model,
# which `load_model` reads back.

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
#| default_exp checkpoint

# %%
import json
import tempfile
from pathlib import Path

import torch

torch.manual_seed(0)
torch.set_printoptions(precision=4)

# %% [markdown]
# ## A checkpoint's files
#
# A run writes a checkpoint after every epoch, and where a time or step limit stops it inside one.
# A checkpoint is a folder:
#
# | file | holds |
# | --- | --- |
# | `model.safetensors` | the weights, float32 |
# | `trainer.safetensors`, `trainer.json` | Adam's moments, step counts and settings; the scheduler's state; a float16 run's loss scale |
# | `progress.json` | where the run stands: epochs done, batches of the current epoch used, updates made, the epoch's running sums |
# | `config.json` | the model's `TransformerConfig`, the run's `TrainConfig`, the vocabulary's size and SHA-256 |
# | `tokenizer.json` | the tokenizer the run was trained with |
#
# **No pickle.** Loading a pickle, which `torch.save` writes, runs whatever code it names. Tensors
# go into [safetensors](https://huggingface.co/docs/safetensors) files, which hold only named
# arrays and a JSON header, the rest into JSON: `save_state` walks the optimiser's and scheduler's
# nested `state_dict()`, stores each tensor under its path and marks tuples, so loading gives back
# exactly what was saved.
#
# **Tied weights, once.** The two embeddings and the output layer share one matrix, which
# `model.state_dict()` lists three times and safetensors refuses to store three times.
# `model_tensors` keeps it once, under its first name; loading copies it into a freshly built
# model, where the sharing is in place.

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

from transformer import layout
from transformer.config import TransformerConfig
from transformer.config_checks import config_from_dict
from transformer.distributed import unwrap
from transformer.model import Transformer
from transformer.records import atomic_folder
from transformer.tokenizer import Tokenizer, TokenizerError
from transformer.words import load_tokenizer

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
# Stored once and loaded into a fresh model, the shared matrix gives the same outputs, its three
# uses still one tensor:

# %%
from transformer.batches import collate
from transformer.checkpoint import load_weights, model_tensors, save_weights
from transformer.config import TransformerConfig
from transformer.model import Transformer
from transformer.training_loop import batch_log_probs

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
# The optimiser's state, integer keys and `betas` tuple included, comes back equal, tensor for
# tensor:

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
# The paper averages the weights of the last checkpoints (Section 6.1): five for the base models,
# twenty for the big ones; the training chapter says why it helps. `average_checkpoints` reads them
# from their files and sums in float64, so their order does not matter.

# %%
#| export training_checkpoints
"""A training run's checkpoints: averaging them, writing and pruning them,
what they record of the run, and the checks and chores of resuming from one."""

import dataclasses
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LRScheduler

from transformer import layout
from transformer.atomic import atomic_write
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
from transformer.distributed import Distributed, barrier, device_for
from transformer.model import Transformer
from transformer.precision import default_precision, stored_precision
from transformer.records import (
    append_jsonl,
    atomic_folder,
    remove_stale,
    truncate_jsonl,
)
from transformer.tokenizer import Tokenizer
from transformer.train_config import (
    TrainConfig,
    field_default,
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
            Path(path) / layout.WEIGHTS if Path(path).is_dir() else Path(path)
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

from transformer.training_checkpoints import average_checkpoints

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
# A run keeps its checkpoints in `checkpoints/` under its output folder: `epoch-005` at an epoch's
# end, `step-0001234` for a stop inside one. A folder counts as a checkpoint once it holds a
# readable `progress.json`, which `write_checkpoint` writes last, so a killed run's temporary
# folder is never resumed from. `check_compatible` refuses a checkpoint of another model or
# vocabulary, naming the field. After each checkpoint, `prune_checkpoints` keeps the newest whole
# and the weights of the last `average_last` epochs, and deletes the rest.

# %%
#| export checkpoint
def tokenizer_digest(tokenizer: Tokenizer) -> str:
    """The SHA-256 of a tokenizer's JSON: the vocabulary's fingerprint in
    config.json."""
    return hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()


def read_record(folder: Path) -> dict[str, Any]:
    """A checkpoint's or model folder's config.json."""
    path = Path(folder) / layout.CONFIG
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{folder} is not a checkpoint: no {layout.CONFIG}"
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
            f" the same size (field tokenizer: its {layout.TOKENIZER} differs"
            " from this run's)"
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
        path = Path(folder) / layout.PROGRESS
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise CheckpointError(f"cannot read {path}: {err}") from err


def list_checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(update, folder) of each complete checkpoint of the run in `out`, oldest
    first."""
    found = []
    folder = Path(out) / layout.CHECKPOINTS
    for path in folder.glob("[!.]*") if folder.is_dir() else []:
        try:
            step = Progress.read(path).step
        except CheckpointError:
            continue  # not a checkpoint (or a damaged one): never resumed from
        found.append((int(step), path))
    return sorted(found)


# %%
#| export training_checkpoints
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
        save_weights(model, tmp / layout.WEIGHTS)
        if trainer_state is not None:
            save_state(tmp, "trainer", trainer_state)
        (tmp / layout.CONFIG).write_text(json.dumps(record, indent=2) + "\n")
        tokenizer.save(tmp / layout.TOKENIZER)
        if progress is not None:
            # Written last: a folder with progress.json is a complete
            # checkpoint.
            (tmp / layout.PROGRESS).write_text(
                json.dumps(asdict(progress), indent=2) + "\n"
            )


def prune_checkpoints(out: Path, average_last: int) -> None:
    """Keep the newest checkpoint whole, and the weights of the last
    `average_last` epochs."""
    found = list_checkpoints(out)
    newest = found[-1][1]
    epochs = [path for _, path in found if path.name.startswith(layout.EPOCH)]
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
# Some configuration fields decide the updates themselves. Each says so where it is defined
# (`on_resume="fixed"`), and `RESUME_FIXED` lists them:

# %%
import textwrap

from transformer.train_config import RESUME_FIXED

print(textwrap.fill(", ".join(RESUME_FIXED), 79))

# %% [markdown]
# A resumed run must keep them: `check_recipe` refuses one that does not, naming the field. A field
# that a checkpoint does not record (its run predates the field) was trained at its default; the
# model's overrides count as the model they make. An unset `precision` is the checkpoint's own; a
# checkpoint from before that field trained as its `bf16` flag said or, flag unset, in bfloat16
# with CUDA and float32 on a CPU. Other fields may change: more `epochs` continue a finished run,
# and a new `time_limit` fits the next stretch of machine time. `resume_point` checks all this
# before anything is loaded.

# %%
#| export training_checkpoints
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


def _preset_fields(preset: str, overrides: dict[str, Any]) -> dict[str, Any]:
    """The model fields that a preset with its overrides gives (the vocabulary
    size is no override: any will do)."""
    return getattr(TransformerConfig, preset)(1).to_dict() | (overrides or {})


def check_recipe(folder: Path, config: TrainConfig) -> None:
    """Raise CheckpointError, in one line naming the folder and the field, if
    the checkpoint in `folder` was trained with another value of a field that
    decides the updates (one fixed on resume). A field the checkpoint does not
    record had its default; the overrides compare as the model they make; a
    precision left unset is the checkpoint's own."""
    stored = with_current_names(read_record(folder).get("train", {}))
    fixed = fixed_on_resume(type(config))
    for field in (f for f in dataclasses.fields(config) if f.name in fixed):
        name, ours = field.name, getattr(config, field.name)
        theirs, note = stored.get(name), ""
        if name == "precision":  # unset: a resumed run keeps its own
            device = device_for(config.device, Distributed()).type
            if theirs is None:
                note = f" (not recorded: the default on {device} then)"
            theirs = stored_precision(theirs, device)
            ours = theirs if ours is None else ours
        elif name not in stored:  # its run began before the field existed
            theirs, note = field_default(field), " (its default: not recorded)"
            if theirs is dataclasses.MISSING:
                raise CheckpointError(
                    f"{folder}: the checkpoint has no {name}"
                )
        if name == "model_overrides":  # name the field of the model
            preset = stored.get("preset", config.preset)
            theirs = _preset_fields(preset, theirs)
            ours = _preset_fields(config.preset, ours)
            for key in sorted(theirs.keys() | ours.keys()):
                if theirs.get(key) != ours.get(key):
                    raise CheckpointError(
                        f"{folder}: the checkpoint was trained with"
                        f" {name}.{key}={theirs.get(key)!r}, this run asks for"
                        f" {name}.{key}={ours.get(key)!r}"
                    )
        elif theirs != ours:
            raise CheckpointError(
                f"{folder}: the checkpoint was trained with {name}={theirs!r}"
                f"{note}, this run asks for {name}={ours!r}"
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
#| export training_checkpoints
def resume_from(
    checkpoint: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    scaler: torch.amp.GradScaler,
) -> Progress:
    """Continue from a checkpoint: load the weights, the optimiser, the
    schedule and a float16 run's loss scale; return where the run stands."""
    load_weights(model, checkpoint / layout.WEIGHTS)
    state = load_state(checkpoint, "trainer")
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    if state.get("scaler"):  # empty or absent without float16
        scaler.load_state_dict(state["scaler"])
    return Progress.read(checkpoint)


def trainer_state(
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    scaler: torch.amp.GradScaler,
) -> dict[str, Any]:
    """What a checkpoint keeps of the trainer, for `resume_from`: the
    optimiser's, the schedule's and the loss scaler's states."""
    return {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),  # {} without float16
    }


def run_precision(
    config: TrainConfig, device: torch.device, checkpoint: Path | None
) -> tuple[str, str]:
    """The precision a run trains in, and why: the config's, a resumed run's
    own, or the device's default."""
    if config.precision is not None:
        return config.precision, "asked"
    if checkpoint is not None:
        stored = with_current_names(read_record(checkpoint).get("train", {}))
        own = stored_precision(stored.get("precision"), device.type)
        return own, "the run's own"
    if device.type != "cuda":
        return default_precision(device), "the default on a CPU"
    major, minor = torch.cuda.get_device_capability(device)
    why = f"the default of compute capability {major}.{minor}"
    return default_precision(device), why


def prepare_folder(out: Path) -> None:
    """Make the run's folders; delete what a killed run left (see
    atomic_folder)."""
    (out / layout.CHECKPOINTS).mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    remove_stale(out / layout.CHECKPOINTS)


def store_settings(
    out: Path, config: TrainConfig, tokenizer: Tokenizer, step: int
) -> None:
    """Drop the records after update `step`, which a resumed run writes again,
    and store the settings (both atomically: --resume reads them back)."""
    for name in (layout.METRICS, layout.STEPS):
        truncate_jsonl(out / name, step)
    settings = json.dumps(config.to_dict(), indent=2) + "\n"
    atomic_write(out / layout.RUN_CONFIG, settings.encode())
    tokenizer.save(out / layout.TOKENIZER)


def last_epochs(out: Path, average_last: int) -> list[Path]:
    """The epoch checkpoints to average: the last `average_last`, from 2."""
    found = list_checkpoints(out)
    epochs = [path for _, path in found if path.name.startswith(layout.EPOCH)]
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
        self.config, self.out, self.env = config, config.out_dir, env
        self.record, self.tokenizer = record, tokenizer  # of each checkpoint

    def open(
        self,
        checkpoint: Path | None,
        model: Transformer,
        optimizer: torch.optim.Optimizer,
        scheduler: LRScheduler,
        scaler: torch.amp.GradScaler,
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
            progress = resume_from(
                checkpoint, model, optimizer, scheduler, scaler
            )
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
        state: dict[str, Any],
        progress: Progress,
    ) -> None:
        """Append `line` to metrics.jsonl, write the checkpoint `name` with the
        trainer's `state`, and prune the older ones."""
        if self.env.is_main:
            # The record first: a resumed run drops records newer than its
            # checkpoint.
            append_jsonl(self.out / layout.METRICS, line)
            folder = self.out / layout.CHECKPOINTS / name
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
            append_jsonl(self.out / layout.METRICS, line)
            record = self.record | {"averaged": line["averaged"]}
            write_checkpoint(
                self.out / layout.AVERAGE,
                model,
                record=record,
                tokenizer=self.tokenizer,
            )
        barrier()


# %% [markdown]
# ## Exporting and loading a model
#
# A trained run is exported into a small folder that the repository ships and `load_model` reads:
#
# | file | holds |
# | --- | --- |
# | `model-00001.safetensors`, … (`SHARD`) | the weights in float16 (or bfloat16), at most `MAX_FILE_BYTES` per file |
# | `config.json` | the model's config, the training config, the vocabulary's fingerprint, and which weight is in which file |
# | `tokenizer.json` | the tokenizer |
# | `metrics.jsonl` | the run's metrics |
#
# Half-precision weights halve the size; the model computes in float32 after loading. Given a run's
# folder, the export takes the run's average if it ends with the newest epoch checkpoint (a run
# continued after averaging has trained past it), else the latest checkpoint. It replaces its
# destination whole, so it refuses one that holds anything but an earlier export's files, or the
# run itself.

# %%
#| export checkpoint
MAX_FILE_BYTES = 16 * 2**20
# A shipped model's weight files, numbered from 1; config.json's weight_map
# names the file of each weight.
SHARD = "model-{:05d}.safetensors"
SHARD_PATTERN = r"model-\d{5}\.safetensors"
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _model_source(source: Path) -> Path:
    """The folder of weights a run or checkpoint path stands for: the run's
    average when it is current, else its newest checkpoint."""
    if (source / layout.WEIGHTS).is_file():
        return source
    found = [path for _, path in list_checkpoints(source)]
    average = source / layout.AVERAGE
    if (average / layout.WEIGHTS).is_file():
        # A run continued after it averaged (killed, stopped by its time limit,
        # or with average_last below 2) has trained past its average: the
        # average is current only while it ends with the newest epoch
        # checkpoint. A `partial` checkpoint after that one is left out, as the
        # average of a run stopped by its time limit leaves it out.
        epochs = [
            path.name for path in found if path.name.startswith(layout.EPOCH)
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
_EXPORT_FILES = (layout.CONFIG, layout.TOKENIZER, layout.METRICS)


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
            (p.name in _EXPORT_FILES or re.fullmatch(SHARD_PATTERN, p.name))
            and p.is_file()
        )
    )
    if not others and (dest / layout.CONFIG).is_file():
        try:
            shipped = json.loads((dest / layout.CONFIG).read_text()).get(
                "format"
            )
        except (OSError, ValueError, AttributeError):
            shipped = None
        if shipped != SHIPPED_FORMAT:
            others = [f"a {layout.CONFIG} that is not a shipped model's"]
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
        read_tensors(folder / layout.WEIGHTS), dtype, max_file_bytes
    )
    weight_map = {}
    dest = Path(dest)
    candidates = (
        folder.parent / layout.METRICS,
        folder.parent.parent / layout.METRICS,
    )
    metrics = next((p for p in candidates if p.is_file()), None)
    with atomic_folder(dest) as tmp:
        for k, part in enumerate(files, start=1):
            file = SHARD.format(k)
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
        (tmp / layout.CONFIG).write_text(json.dumps(shipped, indent=2) + "\n")
        shutil.copy(folder / layout.TOKENIZER, tmp / layout.TOKENIZER)
        if metrics is not None:
            shutil.copy(metrics, tmp / layout.METRICS)
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
        model_config = config_from_dict(record["model"])
    except (ValueError, TypeError) as err:
        raise CheckpointError(
            f"{folder / layout.CONFIG}: bad model config: {err}"
        ) from err
    if not (folder / layout.TOKENIZER).is_file():
        raise CheckpointError(f"{folder}: no {layout.TOKENIZER}")
    try:
        tokenizer = load_tokenizer(folder / layout.TOKENIZER)
    except TokenizerError as err:
        raise CheckpointError(str(err)) from err
    if tokenizer.vocab_size != model_config.src_vocab_size:
        raise CheckpointError(
            f"{folder}: {layout.TOKENIZER} has {tokenizer.vocab_size}"
            " entries, the model's src_vocab_size is"
            f" {model_config.src_vocab_size} (field vocab_size)"
        )
    if record["vocab"].get("sha256") != tokenizer_digest(tokenizer):
        raise CheckpointError(
            f"{folder}: {layout.TOKENIZER} is not the vocabulary the model was"
            " trained with (field tokenizer)"
        )
    tensors: dict[str, Tensor] = {}
    for path in layout.weight_files(folder, record):
        tensors |= read_tensors(path)
    model = Transformer(model_config)
    load_tensors_into(model, tensors, folder)
    return model.to(device).eval(), tokenizer


# %% [markdown]
# A tiny run's checkpoint (its tokenizer learned on a few words), exported to float16 and loaded
# back, gives the float32 checkpoint's log-probabilities to within its weights' rounding:

# %%
from transformer.checkpoint import Progress, export_model, load_model
from transformer.tokenizer import MARK, train_bpe
from transformer.train_config import TrainConfig
from transformer.training_checkpoints import run_record, write_checkpoint

words = [MARK + w for w in "zwei hunde spielen im schnee".split()]
tokenizer = train_bpe([words], 40, languages=("de", "en"))
run = TrainConfig(
    pair="de-en",
    model_overrides=dict(n_layers=1, d_model=16, n_heads=2, d_ff=32),
)
model_config = run.model_config(tokenizer.vocab_size)
folder = scratch / "run" / "checkpoints" / "epoch-001"
write_checkpoint(
    folder,
    Transformer(model_config),
    record=run_record(run, model_config, tokenizer),
    tokenizer=tokenizer,
    progress=Progress(epoch=1, step=1),
)
exported = export_model(scratch / "run", scratch / "exported")
print(sorted(p.name for p in exported.iterdir()))
half, _ = load_model(exported)
full, _ = load_model(folder)
batch = collate(
    [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])],
    pad_id=tokenizer.pad_id,
    bos_id=tokenizer.bos_id,
    eos_id=tokenizer.eos_id,
)
with torch.no_grad():
    pad = tokenizer.pad_id
    gap = batch_log_probs(half, batch, pad_id=pad) - batch_log_probs(
        full, batch, pad_id=pad
    )
assert 0 < gap.abs().max() < 1e-2

# %% [markdown]
# The shipped German→English model loads in a second:

# %%
from transformer.checkpoint import MAX_FILE_BYTES, read_record
from transformer.paths import CHECKPOINTS_DIR

shipped = CHECKPOINTS_DIR / "de-en"
de_en, de_en_tokenizer = load_model(shipped)
record = read_record(shipped)
files = sorted(set(record["weight_map"].values()))
n_params = sum(p.numel() for p in de_en.parameters())
print(f"{record['format']!r}: {record['dtype']} weights in {files},")
print(f"at most MAX_FILE_BYTES = {MAX_FILE_BYTES / 2**20:g} MiB each")
print(
    f"{n_params:,} parameters, a vocabulary of {de_en_tokenizer.vocab_size:,}"
)
assert n_params == 6_001_664

# %% tags=["remove-cell"]
# The temporary folders of this appendix.
import shutil

shutil.rmtree(scratch, ignore_errors=True)
