# Generated from chapters/13_training.ipynb: edit it, not this file.
"""The files of a model's folder: a shipped model, or a run's checkpoint."""

# %% auto #0
__all__ = ["CONFIG", "TOKENIZER", "METRICS", "WEIGHTS", "weight_files"]

# %% ../chapters/13_training.ipynb #8d24a1b5

from pathlib import Path
from typing import Any

CONFIG = "config.json"  # "model": the TransformerConfig's fields, and more
TOKENIZER = "tokenizer.json"
METRICS = "metrics.jsonl"  # a run's records, one JSON object a line
WEIGHTS = "model.safetensors"  # a checkpoint's weights, in float32


def weight_files(folder: str | Path, config: dict[str, Any]) -> list[Path]:
    """The files of a folder's weights, as its config.json says: those its
    weight_map names (a shipped model), or WEIGHTS (a checkpoint)."""
    if "weight_map" in config:
        names = sorted(set(config["weight_map"].values()))
        return [Path(folder) / name for name in names]
    return [Path(folder) / WEIGHTS]
