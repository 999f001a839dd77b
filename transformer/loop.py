# Generated from chapters/13_training.ipynb: edit it, not this file.
"""The training loop of Vaswani et al. (2017), section 5: teacher forcing, one
update over micro-batches, and a plain loop that trains a model."""

# %% auto #0
__all__ = ["batch_log_probs", "train_step", "validation_loss", "train_loop"]

# %% ../chapters/13_training.ipynb #cd77ca37

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn

from transformer.data import Batch
from transformer.distributed import ddp_processes, sync_gradients
from transformer.loss import LabelSmoothingLoss
from transformer.masking import padding_mask, target_mask


def batch_log_probs(model: nn.Module, batch: Batch, *, pad_id: int) -> Tensor:
    """The model's log-probabilities of each next target token of a batch, the
    decoder fed the reference prefix (teacher forcing).

    Shapes:
        batch.src: (B, S); batch.tgt_in: (B, T)
        returns (B, T, V)
    """
    return model(
        batch.src,
        batch.tgt_in,
        src_mask=padding_mask(batch.src, pad_id),
        tgt_mask=target_mask(batch.tgt_in, pad_id),
    )


# %% ../chapters/13_training.ipynb #ae19efcf
def train_step(
    model: nn.Module,
    batches: Sequence[Batch],
    *,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    tokens: int,
    bf16: bool = False,
) -> Tensor:
    """One update with the gradient of (summed loss) / `tokens`.

    `tokens` counts the real target tokens of the whole update, of every
    process. Returns the summed loss, detached and on the model's device.
    """
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
            with torch.autocast(
                device.type, dtype=torch.bfloat16, enabled=bf16
            ):
                log_probs = batch_log_probs(
                    model, batch, pad_id=criterion.pad_id
                )
            loss = criterion(log_probs, batch.tgt_out)  # summed over tokens
            (loss * scale).backward()  # adds to the gradients
        total += loss.detach()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return total


# %% ../chapters/13_training.ipynb #e8d7fcf9
@torch.no_grad()
def validation_loss(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    criterion: LabelSmoothingLoss,
) -> float:
    """The label-smoothed loss per target token, without dropout."""
    model.eval()
    device = next(model.parameters()).device
    total, tokens = 0.0, 0
    for batch in batches:
        batch = batch.to(device)
        log_probs = batch_log_probs(model, batch, pad_id=criterion.pad_id)
        total += criterion(log_probs, batch.tgt_out).item()
        tokens += batch.n_tgt_tokens
    model.train()
    return total / tokens


def train_loop(
    model: nn.Module,
    batches: Iterable[Batch],
    val_batches: Sequence[Batch],
    *,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    validate_every: int,
) -> list[dict[str, float]]:
    """One update per batch; the training loss of each update, and the
    validation loss every `validate_every` updates."""
    history = []
    model.train()
    for step, batch in enumerate(batches, start=1):
        tokens = batch.n_tgt_tokens
        loss = train_step(
            model,
            [batch],
            criterion=criterion,
            optimizer=optimizer,
            scheduler=scheduler,
            tokens=tokens,
        )
        record = {"step": step, "train_loss": loss.item() / tokens}
        if step % validate_every == 0:
            record["val_loss"] = validation_loss(
                model, val_batches, criterion=criterion
            )
        history.append(record)
    return history
