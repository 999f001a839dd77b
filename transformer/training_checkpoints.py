# Generated from chapters/a06_checkpoints.ipynb: edit it, not this file.
"""A training run's checkpoints: averaging them, writing and pruning them,
what they record of the run, and the checks and chores of resuming from one."""

# %% auto #0
__all__ = [
    "average_checkpoints",
    "latest_checkpoint",
    "write_checkpoint",
    "prune_checkpoints",
    "run_record",
    "check_recipe",
    "resume_point",
    "resume_from",
    "trainer_state",
    "run_precision",
    "prepare_folder",
    "store_settings",
    "last_epochs",
    "averaged_model",
    "RunFolder",
]

# %% ../chapters/a06_checkpoints.ipynb #3d67e1d3

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

from . import layout


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


# %% ../chapters/a06_checkpoints.ipynb #c0292372
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


# %% ../chapters/a06_checkpoints.ipynb #238d00b4
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


# %% ../chapters/a06_checkpoints.ipynb #c297513c
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
