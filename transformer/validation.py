# Generated from chapters/a07_trainer.ipynb: edit it, not this file.
"""Teacher-forced validation of Vaswani et al. (2017)'s model: the
label-smoothed loss, the NLL and perplexities per token and per word, and the
token accuracy, as sums that add up across batches and processes."""

# %% auto #0
__all__ = [
    "TokenStats",
    "token_stats",
    "count_words",
    "Validation",
    "validate",
]

# %% ../chapters/a07_trainer.ipynb #d4ededab

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.distributed import world_size
from transformer.encoded_split import EncodedSplit
from transformer.loss import LabelSmoothingLoss, check_log_probs
from transformer.tokenizer import Tokenizer
from transformer.training_loop import batch_log_probs


@dataclass(frozen=True)
class TokenStats:
    """Sums over real (non-padding) target tokens; add them up across batches,
    then read means."""

    nll_sum: float = 0.0
    correct: int = 0
    tokens: int = 0

    def __add__(self, other: "TokenStats") -> "TokenStats":
        return TokenStats(
            self.nll_sum + other.nll_sum,
            self.correct + other.correct,
            self.tokens + other.tokens,
        )

    def _count(self) -> int:
        if self.tokens == 0:
            raise ValueError(
                "no target tokens were counted: the means are undefined"
            )
        return self.tokens

    @property
    def nll(self) -> float:
        """Mean negative log-likelihood per token, in nats, unsmoothed."""
        return self.nll_sum / self._count()

    @property
    def perplexity(self) -> float:
        """e^nll: per subword token, <eos> included (the paper's per-wordpiece
        perplexity)."""
        return math.exp(self.nll)

    @property
    def accuracy(self) -> float:
        """Share of real target tokens whose most probable prediction is the
        right one."""
        return self.correct / self._count()


@torch.no_grad()
def token_stats(
    log_probs: Tensor, target: Tensor, *, pad_id: int
) -> TokenStats:
    """Unsmoothed NLL, correct predictions and token count of one batch,
    padding ignored.

    Shapes:
        log_probs: (B, T, V) or (N, V); target: (B, T) or (N,)
    """
    check_log_probs(log_probs, target)
    real = target != pad_id  # (B, T)
    index = target.masked_fill(~real, 0).unsqueeze(-1)  # (B, T, 1)
    nll = -log_probs.gather(-1, index).squeeze(-1).double()  # (B, T)
    correct = (log_probs.argmax(dim=-1) == target) & real
    return TokenStats(
        nll_sum=nll[real].sum().item(),
        correct=int(correct.sum()),
        tokens=int(real.sum()),
    )


# %% ../chapters/a07_trainer.ipynb #465564cf
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
def validate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    pad_id: int,
    smoothing: float,
    words: int | None = None,
    autocast: torch.dtype | None = None,
) -> Validation:
    """Teacher-forced validation metrics, in eval mode, under `autocast`'s type
    if given; summed over processes when distributed."""
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, stats = 0.0, TokenStats()
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        on = autocast is not None
        with torch.autocast(device.type, dtype=autocast, enabled=on):
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
