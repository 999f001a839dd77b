# Generated from chapters/13_training.ipynb: edit it, not this file.
"""The training loop of Vaswani et al. (2017), section 5: teacher forcing, one
update over micro-batches, a loop over epochs that keeps the best checkpoint
and averages the last ones, and the loading of a trained model."""

# %% auto #0
__all__ = [
    "batch_log_probs",
    "train_step",
    "validation_loss",
    "average_weights",
    "train_loop",
    "load_trained",
]

# %% ../chapters/13_training.ipynb #cd77ca37

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.config import TransformerConfig
from transformer.loss import LabelSmoothingLoss
from transformer.masking import padding_mask, target_mask
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer

from . import layout


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
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    tokens: int,
) -> float:
    """One update with the gradient of (summed loss) / `tokens`, `tokens` being
    the real target tokens of all the batches; returns the summed loss."""
    optimizer.zero_grad()
    total = 0.0
    for batch in batches:
        log_probs = batch_log_probs(model, batch, pad_id=criterion.pad_id)
        loss = criterion(log_probs, batch.tgt_out)  # summed over tokens
        (loss / tokens).backward()  # adds to the gradients
        total += loss.item()
    optimizer.step()
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
    total, tokens = 0.0, 0
    for batch in batches:
        log_probs = batch_log_probs(model, batch, pad_id=criterion.pad_id)
        total += criterion(log_probs, batch.tgt_out).item()
        tokens += batch.n_tgt_tokens
    model.train()
    return total / tokens


def average_weights(checkpoints: Sequence[dict]) -> dict[str, Tensor]:
    """The element-wise mean of several checkpoints of one model."""
    names = checkpoints[0]
    return {n: torch.stack([c[n] for c in checkpoints]).mean(0) for n in names}


def train_loop(
    model: nn.Module,
    epoch_batches: Callable[[int], Iterable[Batch]],
    val_batches: Sequence[Batch],
    *,
    epochs: int,
    average_last: int,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[list[dict[str, float]], dict[str, Tensor], dict[str, Tensor]]:
    """Train `epochs` epochs, one update per batch of `epoch_batches(epoch)`,
    validating after each. Returns a record per update, the checkpoint that
    validated best, and the mean of the last `average_last` checkpoints."""
    step = dict(criterion=criterion, optimizer=optimizer, scheduler=scheduler)
    history, last, best, best_loss = [], [], {}, math.inf
    for epoch in range(epochs):
        for batch in epoch_batches(epoch):
            tokens = batch.n_tgt_tokens
            loss = train_step(model, [batch], tokens=tokens, **step)
            record = {"step": len(history) + 1, "epoch": epoch + 1}
            history.append(record | {"train_loss": loss / tokens})
        val_loss = validation_loss(model, val_batches, criterion=criterion)
        history[-1]["val_loss"] = val_loss
        checkpoint = {n: w.clone() for n, w in model.state_dict().items()}
        last = [*last, checkpoint][-average_last:]
        if val_loss < best_loss:
            best, best_loss = checkpoint, val_loss
    return history, best, average_weights(last)


# %% ../chapters/13_training.ipynb #6b3148cd
def load_trained(folder: str | Path) -> tuple[Transformer, Tokenizer]:
    """The model (float32, eval mode) and tokenizer of a shipped model's
    folder, such as checkpoints/de-en."""
    folder = Path(folder)
    config = json.loads((folder / layout.CONFIG).read_text())
    model = Transformer(TransformerConfig(**config["model"]))
    weights = {}
    for path in layout.weight_files(folder, config):
        weights |= safetensors.torch.load_file(path)  # float16
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = model.src_embed.embedding.weight  # stored under this name only
    if unexpected or any(model.get_parameter(n) is not tied for n in missing):
        raise ValueError(f"{folder}: the weights do not fit the model")
    return model.eval(), Tokenizer.load(folder / layout.TOKENIZER)
