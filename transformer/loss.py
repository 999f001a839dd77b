# Generated from chapters/11_label_smoothing.ipynb: edit it, not this file.
"""Label smoothing (Vaswani et al. 2017, section 5.4) and the metrics a
validation loop reports."""

# %% auto #0
__all__ = [
    "REDUCTIONS",
    "smoothed_target_entropy",
    "LabelSmoothingLoss",
    "TokenStats",
    "token_stats",
]

# %% ../chapters/11_label_smoothing.ipynb #20c54d3a

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

REDUCTIONS = ("mean", "sum", "none")


def smoothed_target_entropy(smoothing: float, vocab_size: int) -> float:
    """H(q) in nats for q = (1 − ε)·onehot(y) + ε/V: the KL loss is the
    cross-entropy minus this."""
    if not 0.0 <= smoothing < 1.0:  # also rejects NaN
        raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
    if vocab_size < 1:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if smoothing == 0.0:
        return 0.0
    right = 1.0 - smoothing + smoothing / vocab_size
    other = smoothing / vocab_size
    return -(
        right * math.log(right) + (vocab_size - 1) * other * math.log(other)
    )


def _check_inputs(log_probs: Tensor, target: Tensor) -> None:
    """Float log-probabilities (..., V) and token ids (...) of torch.long, or a
    ValueError."""
    if log_probs.dim() == 0 or log_probs.shape[:-1] != target.shape:
        raise ValueError(
            f"log_probs {tuple(log_probs.shape)} does not match target"
            f" {tuple(target.shape)}: expected (..., V) and (...)"
        )
    if not log_probs.is_floating_point():
        raise ValueError(
            f"log_probs must be floating-point, got {log_probs.dtype}"
        )
    if target.dtype != torch.long:
        raise ValueError(
            f"target must hold token ids (torch.long), got {target.dtype}"
        )


class LabelSmoothingLoss(nn.Module):
    """KL(q ‖ p) from the smoothed target q to the model's distribution p,
    ignoring padding.

    q gives 1 − ε + ε/V to the target token and ε/V to every other token, as
    `F.cross_entropy(label_smoothing=ε)` does, and the loss is that
    cross-entropy minus the constant H(q): zero when p = q. With smoothing 0 it
    is the negative log-likelihood.
    """

    def __init__(
        self, *, pad_id: int, smoothing: float = 0.1, reduction: str = "mean"
    ) -> None:
        super().__init__()
        if not 0.0 <= smoothing < 1.0:  # also rejects NaN
            raise ValueError(f"smoothing must be in [0, 1), got {smoothing}")
        if reduction not in REDUCTIONS:
            raise ValueError(
                f"reduction must be one of {REDUCTIONS}, got {reduction!r}"
            )
        self.pad_id = pad_id
        self.smoothing = smoothing
        self.reduction = reduction

    def extra_repr(self) -> str:
        return (
            f"pad_id={self.pad_id}, smoothing={self.smoothing},"
            f" reduction={self.reduction!r}"
        )

    def forward(self, log_probs: Tensor, target: Tensor) -> Tensor:
        """The loss averaged over real target tokens ("mean"), summed ("sum")
        or per position.

        Shapes:
            log_probs: (B, T, V) or (N, V), log-probabilities (the model's
                log_softmax)
            target: (B, T) or (N,), token ids (torch.long); positions equal to
                pad_id are ignored
            returns a scalar, or (B, T) / (N,) with zeros at padding for
                reduction="none"

        A batch with no real token gives 0 with "mean" (and a zero gradient),
        not NaN.
        """
        _check_inputs(log_probs, target)
        eps, vocab_size = self.smoothing, log_probs.size(-1)
        real = target != self.pad_id  # (B, T)
        # Any id at padded positions will do for the gather, even a pad_id
        # outside the vocabulary.
        index = target.masked_fill(~real, 0).unsqueeze(-1)  # (B, T, 1)
        # Accumulate in at least float32, also when the model runs in bfloat16.
        dtype = torch.promote_types(log_probs.dtype, torch.float32)
        nll = -log_probs.gather(-1, index).squeeze(-1).to(dtype)  # (B, T)
        loss = (1.0 - eps) * nll
        if eps > 0:
            uniform = (
                -log_probs.sum(dim=-1, dtype=dtype) / vocab_size
            )  # (B, T)
            loss = (
                loss + eps * uniform - smoothed_target_entropy(eps, vocab_size)
            )
        loss = loss.masked_fill(~real, 0.0)
        if self.reduction == "none":
            return loss
        if self.reduction == "sum":
            return loss.sum()
        # clamp: an all-padding batch gives 0 / 1 = 0, with no host-device sync
        # to check for it
        return loss.sum() / real.sum().clamp(min=1)


# %% ../chapters/11_label_smoothing.ipynb #9b05e738
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
    _check_inputs(log_probs, target)
    real = target != pad_id  # (B, T)
    index = target.masked_fill(~real, 0).unsqueeze(-1)  # (B, T, 1)
    nll = -log_probs.gather(-1, index).squeeze(-1).double()  # (B, T)
    correct = (log_probs.argmax(dim=-1) == target) & real
    return TokenStats(
        nll_sum=nll[real].sum().item(),
        correct=int(correct.sum()),
        tokens=int(real.sum()),
    )
