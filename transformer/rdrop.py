# Generated from chapters/a07_trainer.ipynb: edit it, not this file.
"""R-Drop (Liang et al. 2021): a symmetric KL term between two dropout passes
of each training sentence, added to the label-smoothed loss."""

# %% auto #0
__all__ = ["doubled", "RDropLoss"]

# %% ../chapters/a07_trainer.ipynb #e65c1b65

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.loss import LabelSmoothingLoss, check_log_probs


def doubled(batch: Batch) -> Batch:
    """The batch followed by itself: one forward pass, two dropout masks."""
    tensors = ("src", "tgt_in", "tgt_out", "index")
    return dataclasses.replace(
        batch,
        **{n: torch.cat([getattr(batch, n)] * 2) for n in tensors},
        n_src_tokens=2 * batch.n_src_tokens,
        n_tgt_tokens=2 * batch.n_tgt_tokens,
    )


class RDropLoss(nn.Module):
    """½(L(P1) + L(P2)) + α/4 · Σ (KL(P1 ‖ P2) + KL(P2 ‖ P1)), summed over
    real target tokens: R-Drop's loss halved, so that `train_step`'s division
    by the tokens of one copy keeps the per-token scale of `base`.

    Shapes: log_probs (2B, T, V), the two copies of a `doubled` batch; target
    (2B, T); returns a scalar
    """

    def __init__(self, base: LabelSmoothingLoss, alpha: float) -> None:
        super().__init__()
        if base.reduction != "sum":
            raise ValueError(
                f"R-Drop needs a base loss with reduction='sum', got"
                f" {base.reduction!r}"
            )
        if isinstance(alpha, bool) or not (
            isinstance(alpha, int | float) and 0 <= alpha < math.inf
        ):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
        self.base, self.alpha = base, alpha
        self.pad_id, self.reduction = base.pad_id, "sum"  # as train_step asks

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"

    def forward(self, log_probs: Tensor, target: Tensor) -> Tensor:
        check_log_probs(log_probs, target)
        if target.dim() == 0 or target.size(0) % 2:
            raise ValueError(
                f"R-Drop needs a doubled batch (an even number of rows),"
                f" got target {tuple(target.shape)}"
            )
        p1, p2 = log_probs.float().chunk(2)  # (B, T, V) each
        # kl_div(a, b) is KL(b ‖ a) at each position and entry of V
        kl = F.kl_div(p1, p2, log_target=True, reduction="none").sum(-1)
        kl = kl + F.kl_div(p2, p1, log_target=True, reduction="none").sum(-1)
        real = target.chunk(2)[0] != self.pad_id  # (B, T)
        symmetric = kl.masked_fill(~real, 0.0).sum()
        return 0.5 * self.base(log_probs, target) + self.alpha / 4 * symmetric
