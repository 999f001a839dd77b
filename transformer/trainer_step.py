# Generated from chapters/a07_trainer.ipynb: edit it, not this file.
"""The update of a training run: the training chapter's `train_step` on
several processes (DistributedDataParallel) and under 16-bit autocast, with a
float16 run's loss scaling."""

# %% auto #0
__all__ = ["trainer_step"]

# %% ../chapters/a07_trainer.ipynb #82a1202a

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.distributed import ddp_processes, sync_gradients
from transformer.loss import LabelSmoothingLoss
from transformer.training_loop import batch_log_probs


def trainer_step(
    model: nn.Module,
    batches: Sequence[Batch],
    *,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    tokens: int,
    autocast: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Tensor:
    """One update with the gradient of (summed loss) / `tokens`, as
    `train_step`'s; `tokens` counts the real target tokens of the whole update,
    of every process. `autocast`: the type of the forward pass's matrix
    products; `scaler` scales a float16 run's loss. Returns the summed loss,
    detached, on the model's device."""
    if criterion.reduction != "sum":  # the division by `tokens` comes below
        raise ValueError(f"need reduction='sum', got {criterion.reduction!r}")
    if not batches or tokens <= 0:
        raise ValueError(f"no batches or no tokens: {len(batches)}, {tokens}")
    scale = ddp_processes(model) / tokens  # 1 / N in one process
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for k, batch in enumerate(batches):
        batch = batch.to(device, non_blocking=True)
        with sync_gradients(model, k == len(batches) - 1):
            on = autocast is not None
            with torch.autocast(device.type, dtype=autocast, enabled=on):
                log_probs = batch_log_probs(
                    model, batch, pad_id=criterion.pad_id
                )
            loss = criterion(log_probs, batch.tgt_out)  # summed over tokens
            scaled = loss * scale
            if scaler is not None:  # float16: lifts small gradients off 0
                scaled = scaler.scale(scaled)
            scaled.backward()  # adds to the gradients
        total += loss.detach()
    if scaler is None:
        optimizer.step()
        scheduler.step()
    else:  # unscales the gradients; skips the step if one overflowed
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() >= scale:  # taken: the schedule counts it
            scheduler.step()
    return total
