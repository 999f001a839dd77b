# Generated from chapters/a05_run_setup.ipynb: edit it, not this file.
"""One process among several: torchrun's environment, each process's device,
and the collectives that the processes of a run share (DistributedDataParallel
adds the gradients)."""

# %% auto #0
__all__ = [
    "Distributed",
    "world_size",
    "device_for",
    "barrier",
    "all_sum",
    "seed_update",
    "ddp_of",
    "unwrap",
    "ddp_processes",
    "sync_gradients",
]

# %% ../chapters/a05_run_setup.ipynb #1ffaa244

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
