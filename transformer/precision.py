# Generated from chapters/a05_run_setup.ipynb: edit it, not this file.
"""The arithmetic of a training run: bfloat16 or float16 autocast, or float32;
by default the fastest that the device has in hardware."""

# %% auto #0
__all__ = [
    "PRECISIONS",
    "autocast_type",
    "precision_for",
    "default_precision",
    "stored_precision",
]

# %% ../chapters/a05_run_setup.ipynb #6d944ab0

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
