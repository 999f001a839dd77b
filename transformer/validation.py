# Generated from chapters/13_training.ipynb: edit it, not this file.
"""Teacher-forced validation of Vaswani et al. (2017)'s model: the
label-smoothed loss, the NLL and perplexities per token and per word, and the
token accuracy."""

# %% auto #0
__all__ = ["batch_log_probs", "count_words", "Validation", "evaluate"]

# %% ../chapters/13_training.ipynb #cd77ca37

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.data import Batch, EncodedSplit
from transformer.distributed import world_size
from transformer.loss import LabelSmoothingLoss, TokenStats, token_stats
from transformer.masking import padding_mask, target_mask
from transformer.tokenizer import Tokenizer


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


# %% ../chapters/13_training.ipynb #e8d7fcf9
def count_words(tokenizer: Tokenizer, data: EncodedSplit) -> int:
    """Words of the references: whitespace-separated pieces of each decoded
    target sentence."""
    return sum(len(tokenizer.decode(tgt).split()) for _, tgt in data)


@dataclass(frozen=True)
class Validation:
    """Sums over a validation set: the label-smoothed loss, `TokenStats`, and
    the word count."""

    loss_sum: float
    stats: TokenStats
    words: int | None = None

    @property
    def loss(self) -> float:
        """Label-smoothed loss per target token."""
        return self.loss_sum / self.stats.tokens

    @property
    def word_perplexity(self) -> float | None:
        """exp(total NLL / reference words); None without a word count."""
        return (
            math.exp(self.stats.nll_sum / self.words) if self.words else None
        )

    def metrics(self) -> dict[str, float | None]:
        return {
            "val_loss": self.loss,
            "val_nll": self.stats.nll,
            "val_ppl_token": self.stats.perplexity,
            "val_ppl_word": self.word_perplexity,
            "val_accuracy": self.stats.accuracy,
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    pad_id: int,
    smoothing: float = 0.1,
    words: int | None = None,
    bf16: bool = False,
) -> Validation:
    """Teacher-forced validation metrics, in eval mode; summed over processes
    when distributed."""
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, stats = 0.0, TokenStats()
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            log_probs = batch_log_probs(model, batch, pad_id=pad_id)
        loss_sum += criterion(log_probs, batch.tgt_out).item()
        stats += token_stats(log_probs, batch.tgt_out, pad_id=pad_id)
    model.train(was_training)
    if world_size() > 1:
        sums = [loss_sum, stats.nll_sum, stats.correct, stats.tokens]
        total = torch.tensor(sums, dtype=torch.float64, device=device)
        dist.all_reduce(total)
        loss_sum, nll_sum, correct, tokens = total.tolist()
        stats = TokenStats(
            nll_sum=nll_sum, correct=int(correct), tokens=int(tokens)
        )
    return Validation(loss_sum=loss_sum, stats=stats, words=words)
