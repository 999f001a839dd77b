# Generated from chapters/11_label_smoothing.ipynb: edit it, not this file.
"""Label smoothing (Vaswani et al. 2017, section 5.4): the KL divergence from
the smoothed target to the model's distribution, padding ignored."""

# %% auto #0
__all__ = [
    "REDUCTIONS",
    "PAPER_LABEL_SMOOTHING",
    "LABEL_SMOOTHING",
    "smoothed_target_entropy",
    "check_log_probs",
    "LabelSmoothingLoss",
]

# %% ../chapters/11_label_smoothing.ipynb #4604f32c

import math

import torch
from torch import Tensor, nn

REDUCTIONS = ("mean", "sum", "none")
# The paper's: "label smoothing of value ε_ls = 0.1" (Section 5.4).
PAPER_LABEL_SMOOTHING = 0.1
LABEL_SMOOTHING = PAPER_LABEL_SMOOTHING  # the package's default


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


def check_log_probs(log_probs: Tensor, target: Tensor) -> None:
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


# %% ../chapters/11_label_smoothing.ipynb #12d77037
class LabelSmoothingLoss(nn.Module):
    """KL(q ‖ p): `F.cross_entropy(label_smoothing=ε)` minus the constant H(q),
    padding ignored; with smoothing 0, the NLL.

    Shapes: log_probs (B, T, V) or (N, V), the model's log_softmax; target
    (B, T) or (N,); returns a scalar, or (B, T) / (N,) for "none"
    """

    def __init__(
        self,
        *,
        pad_id: int,
        smoothing: float = LABEL_SMOOTHING,
        reduction: str = "mean",
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
        check_log_probs(log_probs, target)
        eps, vocab_size = self.smoothing, log_probs.size(-1)
        real = target != self.pad_id  # (B, T)
        # Any id will do at padded positions, even a pad_id beyond V.
        index = target.masked_fill(~real, 0).unsqueeze(-1)  # (B, T, 1)
        # Accumulate in at least float32, also when the model runs in bfloat16.
        dtype = torch.promote_types(log_probs.dtype, torch.float32)
        nll = -log_probs.gather(-1, index).squeeze(-1).to(dtype)  # (B, T)
        loss = (1.0 - eps) * nll
        if eps > 0:
            uniform = -log_probs.sum(dim=-1, dtype=dtype) / vocab_size
            loss = (
                loss + eps * uniform - smoothed_target_entropy(eps, vocab_size)
            )
        loss = loss.masked_fill(~real, 0.0)
        if self.reduction == "none":
            return loss
        if self.reduction == "sum":
            return loss.sum()
        # An all-padding batch gives 0 / 1 = 0, with no host-device sync.
        return loss.sum() / real.sum().clamp(min=1)
