# Generated from chapters/a07_trainer.ipynb: edit it, not this file.
"""The optimiser of a training run: the schedule chapter's Adam and learning
rate over a model, its parameters or parameter groups, checked, and fused on a
GPU."""

# %% auto #0
__all__ = ["trainer_optimizer"]

# %% ../chapters/a07_trainer.ipynb #a6a37e29

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from transformer.schedule import (
    ADAM_BETAS,
    ADAM_EPS,
    WARMUP_STEPS,
    noam_schedule,
)


def _param_groups(params: nn.Module | Iterable) -> list:
    """The parameters as torch.optim takes them: a model's as a list, and each
    group's "params" as a list (a generator would be used up by the checks, and
    one tensor is one parameter, not its rows)."""
    if isinstance(params, nn.Module):
        return list(params.parameters())

    def listed(p: torch.Tensor | Iterable) -> list:
        return [p] if isinstance(p, torch.Tensor) else list(p)

    return [
        p | {"params": listed(p["params"])} if isinstance(p, dict) else p
        for p in params
    ]


def trainer_optimizer(
    model_or_params: nn.Module | Iterable[torch.Tensor] | Iterable[dict],
    *,
    d_model: int,
    warmup: int = WARMUP_STEPS,
    factor: float = 1.0,
    fused: bool | None = None,
) -> tuple[torch.optim.Adam, LambdaLR]:
    """`make_optimizer`'s Adam and schedule over a model, parameters or
    parameter groups. `fused=None`: fused when every parameter is on CUDA."""
    params = _param_groups(model_or_params)
    groups = [p["params"] if isinstance(p, dict) else [p] for p in params]
    if not groups or not all(groups):
        raise ValueError(
            "trainer_optimizer got no parameters (or an empty group)"
        )
    if any(isinstance(p, dict) and "lr" in p for p in params):
        # LambdaLR would multiply a group's own lr by the schedule.
        raise ValueError(
            "a parameter group sets its own lr: the schedule sets every"
            " group's learning rate (use factor= to scale it)"
        )
    if fused is None:
        fused = all(
            t.is_cuda and t.is_floating_point() for g in groups for t in g
        )
    optimizer = torch.optim.Adam(
        params, lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPS, fused=fused
    )
    schedule = dict(d_model=d_model, warmup=warmup, factor=factor)
    return optimizer, noam_schedule(optimizer, **schedule)
