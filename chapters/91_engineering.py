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
# # Engineering the package
#
# The training chapter's loop makes updates and measures them. A run that lasts hours on a
# machine that may be taken away needs more: files that are never half written, checkpoints
# that resume exactly where the run stopped, a configuration that says what was trained,
# several GPUs that make the update of one, and a small folder in which to ship the trained
# model. This appendix explains how the package does each of these, and exports two modules:
# `transformer.files` (atomic writes) and `transformer.checkpoint` (the checkpoint and model
# formats, averaging, export and `load_model`).

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
# ## Data integrity and the cache
#
# The Multi30k files in `data/multi30k` are checked against the SHA-256 sums of their
# `SHA256SUMS` file each time they are read: a file that was truncated or changed is an error
# that names it, never a silently different data set. `prepare` encodes every split once into
# `cache/<pair>/`, with a `manifest.json` that records the cache format, the pair, the
# vocabulary size, the checksums of the data files it was built from and the SHA-256 of each
# file it wrote. A cache whose manifest does not match (other data, another vocabulary size, a
# damaged file) is never used: `prepare` rebuilds it, which needs spaCy, and loading a current
# cache needs no spaCy at all, so a GPU machine trains from the cache alone. The data chapter
# builds all of this.
#
# ## Atomic writes
#
# A process can be killed at any moment: by a time limit, a full disk, a power cut. A file that
# is being rewritten when that happens must not be left half old and half new, or a resumed run
# would read garbage. `atomic_write` writes the new content into a temporary file next to the
# destination, flushes it to the disk (`fsync`), and renames it over the destination. A rename
# within a file system is atomic: readers see the old file or the new one, never a mixture.
#
# A checkpoint is a folder of several files, and `atomic_folder` does the same for a folder: the
# block writes into a hidden temporary folder, which replaces the destination only when the block
# ends without error. Every file is flushed before the rename, and the rename after it, so that a
# power cut cannot leave a complete-looking folder of empty files. Every writer of the package
# (the data cache, the tokenizer, checkpoints, exports, translations) goes through these two.

# %%
#| export files
"""Atomic writes of files and folders, and the JSON Lines records of a run."""

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never half
    of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        # mkstemp makes the file readable by its owner only; give it the mode
        # that open() would have, so that a cache or a checkpoint can be shared
        # like any other file.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync(path: Path) -> None:
    """Ask the disk to hold what `path` (a file or a folder) says before going
    on."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary folder that replaces `path` when the block ends
    without error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        # A rename can reach the disk before the data of the files renamed:
        # after a power cut the folder would be there with empty files. The
        # data first, then the names.
        for folder, _, files in os.walk(tmp):
            for name in files:
                _fsync(Path(folder) / name)
            _fsync(Path(folder))
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        if (
            path.exists()
        ):  # a rename cannot replace a folder that has files in it
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(path.parent)  # the renames themselves
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file; a last line cut short by a crash is
    skipped."""
    records = []
    if Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record to a JSON Lines file, on disk when this returns."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the records up to update `step` (a resumed run writes the later
    ones again)."""
    if Path(path).exists():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
        atomic_write(
            path, "".join(json.dumps(r) + "\n" for r in kept).encode()
        )


def remove_stale(folder: Path) -> None:
    """Delete the temporary files and folders that a writer killed in
    `atomic_write` or `atomic_folder` left in `folder`."""
    for stale in [
        *Path(folder).glob(".*.tmp*"),
        *Path(folder).glob(".*.old-*"),
    ]:
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


# %% [markdown]
# A block that fails leaves the old folder as it was, and one that succeeds replaces it whole:

# %%
from transformer.files import atomic_folder, atomic_write

scratch = Path(tempfile.mkdtemp())
with atomic_folder(scratch / "run") as tmp:
    atomic_write(tmp / "a.txt", b"first")
try:
    with atomic_folder(scratch / "run") as tmp:
        (tmp / "a.txt").write_text("second, half writ")
        raise KeyboardInterrupt  # the process is stopped inside the block
except KeyboardInterrupt:
    pass
assert (scratch / "run" / "a.txt").read_text() == "first"
assert [p.name for p in scratch.iterdir()] == [
    "run"
]  # no temporary folder left
with atomic_folder(scratch / "run") as tmp:
    (tmp / "b.txt").write_text("second")
print(sorted(p.name for p in (scratch / "run").iterdir()))

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
#| export
"""Checkpoints and shipped models: the formats, saving and loading without
pickle, averaging, the records of a run's checkpoints, export, and
`load_model`."""

import hashlib
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from transformer.config import TransformerConfig
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


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DDP's wrappers."""
    model = getattr(model, "_orig_mod", model)
    return (
        model.module if isinstance(model, DistributedDataParallel) else model
    )


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The weights and persistent buffers, each shared tensor once under its
    first name."""
    tensors, seen = {}, set()
    for name, tensor in _unwrap(model).state_dict(keep_vars=True).items():
        if (
            id(tensor) not in seen
        ):  # tied parameters are one object under several names
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
    load_tensors_into(_unwrap(model), tensors, path)


# %% [markdown]
# The shared matrix is stored once, and loading it into a freshly built model gives the same
# outputs, with the three uses of the matrix still one tensor:

# %%
from transformer.checkpoint import load_weights, model_tensors, save_weights
from transformer.config import TransformerConfig
from transformer.data import collate
from transformer.model import Transformer
from transformer.validation import batch_log_probs

tiny = TransformerConfig(
    src_vocab_size=13, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0
)
model = Transformer(tiny).eval()
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
#| export
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

from transformer.checkpoint import average_checkpoints

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
#| export
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
# ## Configurations
#
# A run is described by a frozen `TrainConfig` (the training chapter), which checks every field
# when it is made, from one table of (field, check, message), so that a bad value is refused
# with its field's name before anything runs. The run stores it twice: as `train_config.json`
# in its output folder, which `--resume` reads back so that the same command can be repeated
# after a stop, and inside each checkpoint's `config.json`, with the model's `TransformerConfig`
# and the vocabulary's SHA-256.
#
# Some fields decide the updates themselves: the pair, the model and its overrides, the
# vocabulary, the batch size, accumulation, warm-up, learning-rate factor, label smoothing,
# BPE-dropout and the seed (`RESUME_FIXED`). A resumed run must keep them, and `check_recipe`
# refuses one that does not, naming the field. The others may change on resume: more
# `epochs` continue a finished run, and a new `time_limit` or `max_steps` fits the next stretch
# of machine time.
#
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
# The check on a tiny model and a tiny synthetic data set, a few seconds on a CPU: one run of
# two epochs, and one stopped after two updates, then resumed.

# %%
import numpy as np

from transformer.checkpoint import read_tensors
from transformer.data import EncodedSplit
from transformer.epochs import TrainingData
from transformer.tokenizer import MARK, train_bpe
from transformer.train import train
from transformer.train_config import TrainConfig

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
# ## Several GPUs
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
# The tests check the equivalence on a CPU, with PyTorch's `gloo` backend and two processes:
# two processes on the two halves of a batch make the update of one process on the whole batch,
# and a whole run with two processes ends with the weights, to $10^{-6}$, of one process that
# accumulates two batches per update (`tests/test_train.py`,
# `test_two_processes_make_the_update_of_one`).
#
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
#| export
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
        if (
            nbytes > max_file_bytes - 65_536
        ):  # leave room for the file's JSON header
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
