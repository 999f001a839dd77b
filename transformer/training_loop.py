# Generated from chapters/13_training.ipynb: edit it, not this file.
"""The training loop of Vaswani et al. (2017), section 5: teacher forcing, one
update over micro-batches, a plain loop that trains a model, and the loading of
a trained one."""

# %% auto #0
__all__ = [
    "batch_log_probs",
    "train_step",
    "validation_loss",
    "train_loop",
    "load_trained",
]

# %% ../chapters/13_training.ipynb #cd77ca37

import json
from collections.abc import Iterable, Sequence
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
    update = dict(
        criterion=criterion, optimizer=optimizer, scheduler=scheduler
    )
    for step, batch in enumerate(batches, start=1):
        tokens = batch.n_tgt_tokens
        loss = train_step(model, [batch], tokens=tokens, **update)
        record = {"step": step, "train_loss": loss / tokens}
        if step % validate_every == 0:
            record["val_loss"] = validation_loss(
                model, val_batches, criterion=criterion
            )
        history.append(record)
    return history


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
