# Generated from chapters/13_training.ipynb: edit it, not this file.
"""The files of a model's folder (a shipped model, or a run's checkpoint), and
of a training run's folder."""

# %% auto #0
__all__ = [
    "CONFIG",
    "TOKENIZER",
    "METRICS",
    "WEIGHTS",
    "RUN_CONFIG",
    "STEPS",
    "LOG",
    "CHECKPOINTS",
    "EPOCH",
    "STEP",
    "AVERAGE",
    "PROGRESS",
    "epoch_folder",
    "step_folder",
    "weight_files",
]

# %% ../chapters/13_training.ipynb #8d24a1b5

from pathlib import Path
from typing import Any

CONFIG = "config.json"  # "model": the TransformerConfig's fields, and more
TOKENIZER = "tokenizer.json"
METRICS = "metrics.jsonl"  # a run's records, one JSON object a line
WEIGHTS = "model.safetensors"  # a checkpoint's weights, in float32
# A training run's folder: its settings, logs, checkpoints and average.
RUN_CONFIG = "train_config.json"  # the TrainConfig's fields
STEPS = "steps.jsonl"  # the loss and throughput, every few updates
LOG = "train.log"  # what the terminal showed
CHECKPOINTS = "checkpoints"  # a model folder per checkpoint
EPOCH, STEP = "epoch-", "step-"  # checkpoints at an epoch's end, at a stop
AVERAGE = "average"  # the model that the last checkpoints average to
PROGRESS = "progress.json"  # in a checkpoint: where the run stood


def epoch_folder(epoch: int) -> str:
    """The checkpoint at the end of epoch `epoch`: epoch-007."""
    return f"{EPOCH}{epoch:03d}"


def step_folder(step: int) -> str:
    """The checkpoint of a run stopped at update `step`: step-0001234."""
    return f"{STEP}{step:07d}"


def weight_files(folder: str | Path, config: dict[str, Any]) -> list[Path]:
    """The files of a folder's weights, as its config.json says: those its
    weight_map names (a shipped model), or WEIGHTS (a checkpoint)."""
    if "weight_map" in config:
        names = sorted(set(config["weight_map"].values()))
        return [Path(folder) / name for name in names]
    return [Path(folder) / WEIGHTS]
