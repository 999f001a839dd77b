# Generated from chapters/12_schedule.ipynb: edit it, not this file.
"""Adam and the learning-rate schedule of Vaswani et al. (2017), section 5.3,
equation (3)."""

# %% auto #0
__all__ = ["ADAM_BETAS", "ADAM_EPS", "noam_lr", "make_optimizer"]

# %% ../chapters/12_schedule.ipynb #6303f754

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-9


def noam_lr(
    step: int, *, d_model: int, warmup: int, factor: float = 1.0
) -> float:
    """factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), equation
    (3); `step` counts updates from 1, and step 0 gives 0."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if d_model <= 0 or warmup <= 0:
        raise ValueError(
            f"d_model and warmup must be positive, got {d_model} and {warmup}"
        )
    if not factor > 0:  # also rejects NaN
        raise ValueError(f"factor must be positive, got {factor}")
    if step == 0:
        return 0.0
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


# %% ../chapters/12_schedule.ipynb #bb785b9b
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


def make_optimizer(
    model_or_params: nn.Module | Iterable[torch.Tensor] | Iterable[dict],
    *,
    d_model: int,
    warmup: int = 4000,
    factor: float = 1.0,
    fused: bool | None = None,
) -> tuple[torch.optim.Adam, LambdaLR]:
    """Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) with the learning rate of equation
    (3): update n (from 1) uses noam_lr(n). Call `optimizer.step()`, then
    `scheduler.step()`. `fused=None`: fused when every parameter is on CUDA."""
    params = _param_groups(model_or_params)
    groups = [p["params"] if isinstance(p, dict) else [p] for p in params]
    if not groups or not all(groups):
        raise ValueError(
            "make_optimizer got no parameters (or an empty group)"
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
    noam_lr(1, d_model=d_model, warmup=warmup, factor=factor)  # check them

    def lr_at(completed_updates: int) -> float:  # the rate of the next one
        step = completed_updates + 1
        return noam_lr(step, d_model=d_model, warmup=warmup, factor=factor)

    optimizer = torch.optim.Adam(
        params, lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPS, fused=fused
    )
    return optimizer, LambdaLR(optimizer, lr_at)
