# Generated from chapters/12_schedule.ipynb: edit it, not this file.
"""Adam and the learning-rate schedule of Vaswani et al. (2017), section 5.3,
equation (3)."""

# %% auto #0
__all__ = [
    "ADAM_BETAS",
    "ADAM_EPS",
    "PAPER_WARMUP_STEPS",
    "WARMUP_STEPS",
    "noam_lr",
    "noam_schedule",
    "make_optimizer",
]

# %% ../chapters/12_schedule.ipynb #6303f754

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

# The paper's (Section 5.3): "β1 = 0.9, β2 = 0.98 and ε = 10^-9",
# "warmup_steps = 4000".
ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-9
PAPER_WARMUP_STEPS = 4000
WARMUP_STEPS = PAPER_WARMUP_STEPS  # the package's default


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
def noam_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    d_model: int,
    warmup: int = WARMUP_STEPS,
    factor: float = 1.0,
) -> LambdaLR:
    """The scheduler that gives update n (from 1) the rate noam_lr(n), the
    optimiser's base rate being 1.0."""

    def lr_at(completed_updates: int) -> float:  # the rate of the next one
        step = completed_updates + 1
        return noam_lr(step, d_model=d_model, warmup=warmup, factor=factor)

    return LambdaLR(optimizer, lr_at)


def make_optimizer(
    model: nn.Module,
    *,
    d_model: int,
    warmup: int = WARMUP_STEPS,
    factor: float = 1.0,
) -> tuple[torch.optim.Adam, LambdaLR]:
    """Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) with the learning rate of equation
    (3). Call `optimizer.step()`, then `scheduler.step()`."""
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPS
    )
    schedule = dict(d_model=d_model, warmup=warmup, factor=factor)
    return optimizer, noam_schedule(optimizer, **schedule)
