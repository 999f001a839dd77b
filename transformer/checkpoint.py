# Generated from chapters/a06_checkpoints.ipynb: edit it, not this file.
"""Checkpoints and shipped models: the formats, saving and loading without
pickle, a checkpoint's record and progress, export, and `load_model`."""

# %% auto #0
__all__ = [
    "CHECKPOINT_FORMAT",
    "SHIPPED_FORMAT",
    "MAX_FILE_BYTES",
    "SHARD",
    "SHARD_PATTERN",
    "CheckpointError",
    "save_state",
    "load_state",
    "model_tensors",
    "save_weights",
    "read_tensors",
    "load_tensors_into",
    "load_weights",
    "tokenizer_digest",
    "read_record",
    "check_compatible",
    "Progress",
    "list_checkpoints",
    "check_export_destination",
    "export_model",
    "load_model",
]

# %% ../chapters/a06_checkpoints.ipynb #be94a1c1

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
from transformer.config_checks import config_from_dict
from transformer.distributed import unwrap
from transformer.model import Transformer
from transformer.records import atomic_folder
from transformer.tokenizer import Tokenizer, TokenizerError
from transformer.words import load_tokenizer

from . import layout

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


# %% ../chapters/a06_checkpoints.ipynb #735e7168
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


# %% ../chapters/a06_checkpoints.ipynb #0ba5f1d8
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
