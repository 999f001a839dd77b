"""Label smoothing: against PyTorch's cross-entropy, padding, edge cases, validation metrics."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from transformer.loss import LabelSmoothingLoss, smoothed_target_entropy
from transformer.validation import TokenStats, token_stats

PAD = 0
B, T, V = 4, 9, 13


def padded_batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 logits (B, T, V) and targets (B, T) with sentences of different lengths."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, V, generator=g, dtype=torch.float64) * 3
    target = torch.randint(1, V, (B, T), generator=g)
    for b, length in enumerate((9, 6, 3, 1)):
        target[b, length:] = PAD
    return logits, target


@pytest.mark.parametrize("smoothing", [0.1, 0.0, 0.3])
def test_equals_cross_entropy_minus_target_entropy(smoothing: float):
    logits, target = padded_batch()
    ours = LabelSmoothingLoss(pad_id=PAD, smoothing=smoothing)(
        logits.log_softmax(-1), target
    )
    theirs = F.cross_entropy(
        logits.view(-1, V),
        target.view(-1),
        label_smoothing=smoothing,
        ignore_index=PAD,
    )
    expected = theirs - smoothed_target_entropy(smoothing, V)
    assert ours.dtype == torch.float64
    assert abs(ours.item() - expected.item()) < 1e-6
    # The flattened (N, V) form gives the same value.
    flat = LabelSmoothingLoss(pad_id=PAD, smoothing=smoothing)(
        logits.log_softmax(-1).view(-1, V), target.view(-1)
    )
    assert abs(flat.item() - ours.item()) < 1e-12


def test_target_entropy_matches_its_definition():
    for smoothing, size in [(0.1, 13), (0.1, 37_000), (0.5, 2), (0.0, 100)]:
        q = torch.full((size,), smoothing / size, dtype=torch.float64)
        q[3 % size] += 1 - smoothing
        entropy = -(q * q.clamp_min(1e-300).log()).sum().item()
        assert math.isclose(
            smoothed_target_entropy(smoothing, size), entropy, abs_tol=1e-12
        )


def test_kl_is_zero_with_zero_gradient_at_the_smoothed_target():
    target = torch.tensor([3, 1, 7])
    q = torch.full((3, V), 0.1 / V, dtype=torch.float64)
    q[torch.arange(3), target] += 0.9
    logits = q.log().requires_grad_(True)
    loss = LabelSmoothingLoss(pad_id=PAD)(logits.log_softmax(-1), target)
    (grad,) = torch.autograd.grad(loss, logits)
    assert abs(loss.item()) < 1e-12
    assert grad.abs().max().item() < 1e-12


def test_minimum_over_confidence_is_at_the_smoothed_share():
    p = torch.linspace(0.5, 0.9999, 20_000, dtype=torch.float64)
    log_probs = ((1 - p) / (V - 1)).log().unsqueeze(-1).repeat(1, V)
    log_probs[:, 5] = p.log()
    loss = LabelSmoothingLoss(pad_id=PAD, smoothing=0.1, reduction="none")(
        log_probs, torch.full((len(p),), 5)
    )
    assert abs(p[loss.argmin()].item() - (0.9 + 0.1 / V)) < 1e-4


def test_padding_positions_change_nothing():
    logits, target = padded_batch()
    pad = target == PAD
    assert pad.any() and (~pad).any()
    criterion = LabelSmoothingLoss(pad_id=PAD)

    a = logits.clone().requires_grad_(True)
    loss_a = criterion(a.log_softmax(-1), target)
    (grad_a,) = torch.autograd.grad(loss_a, a)

    changed = logits.clone()
    changed[pad] = 100 * torch.randn_like(changed[pad])
    b = changed.requires_grad_(True)
    loss_b = criterion(b.log_softmax(-1), target)
    (grad_b,) = torch.autograd.grad(loss_b, b)

    assert loss_a.item() == pytest.approx(loss_b.item(), abs=1e-12)
    assert torch.allclose(grad_a[~pad], grad_b[~pad], atol=1e-12)
    assert torch.count_nonzero(grad_a[pad]) == 0
    assert torch.count_nonzero(grad_b[pad]) == 0


def test_padding_is_not_counted_in_the_mean():
    logits, target = padded_batch()
    log_probs = logits.log_softmax(-1)
    n = int((target != PAD).sum())
    mean = LabelSmoothingLoss(pad_id=PAD, reduction="mean")(log_probs, target)
    total = LabelSmoothingLoss(pad_id=PAD, reduction="sum")(log_probs, target)
    per_token = LabelSmoothingLoss(pad_id=PAD, reduction="none")(log_probs, target)
    assert per_token.shape == target.shape
    assert torch.count_nonzero(per_token[target == PAD]) == 0
    assert total.item() == pytest.approx(per_token.sum().item(), abs=1e-12)
    assert mean.item() == pytest.approx(total.item() / n, abs=1e-12)


def test_zero_smoothing_is_the_negative_log_likelihood():
    logits, target = padded_batch()
    log_probs = logits.log_softmax(-1)
    ours = LabelSmoothingLoss(pad_id=PAD, smoothing=0.0)(log_probs, target)
    nll = F.nll_loss(log_probs.view(-1, V), target.view(-1), ignore_index=PAD)
    assert ours.item() == pytest.approx(nll.item(), abs=1e-12)


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, 1.5, float("nan")])
def test_invalid_smoothing_raises(smoothing: float):
    with pytest.raises(ValueError, match="smoothing"):
        LabelSmoothingLoss(pad_id=PAD, smoothing=smoothing)
    with pytest.raises(ValueError, match="smoothing"):
        smoothed_target_entropy(smoothing, 8)


def test_target_entropy_needs_a_vocabulary():
    with pytest.raises(ValueError, match="vocab_size"):
        smoothed_target_entropy(0.1, 0)


def test_invalid_reduction_raises():
    with pytest.raises(ValueError, match="reduction"):
        LabelSmoothingLoss(pad_id=PAD, reduction="batchmean")


def test_mismatched_shapes_raise():
    criterion = LabelSmoothingLoss(pad_id=PAD)
    with pytest.raises(ValueError, match="does not match"):
        criterion(
            torch.randn(2, 5, V).log_softmax(-1), torch.ones(2, 4, dtype=torch.long)
        )


def test_a_scalar_log_probs_is_refused():
    with pytest.raises(ValueError, match="does not match"):
        LabelSmoothingLoss(pad_id=PAD)(torch.tensor(-1.0), torch.tensor(2))


def test_wrong_dtypes_raise():
    logits, target = padded_batch()
    log_probs = logits.log_softmax(-1)
    criterion = LabelSmoothingLoss(pad_id=PAD)
    # Unchecked, integer "log-probabilities" give a (negative) loss without complaint.
    for bad in (log_probs.long(), log_probs > -2):
        with pytest.raises(ValueError, match="log_probs must be floating-point"):
            criterion(bad, target)
        with pytest.raises(ValueError, match="log_probs must be floating-point"):
            token_stats(bad, target, pad_id=PAD)
    # Float, boolean or int32 targets: F.cross_entropy refuses all three as well.
    for bad in (target.double(), target > 3, target.int()):
        with pytest.raises(
            ValueError, match=r"target must hold token ids \(torch.long\)"
        ):
            criterion(log_probs, bad)
        with pytest.raises(
            ValueError, match=r"target must hold token ids \(torch.long\)"
        ):
            token_stats(log_probs, bad, pad_id=PAD)


def test_all_padding_batch_gives_zero_and_no_gradient():
    logits = torch.randn(B, T, V, dtype=torch.float64, requires_grad=True)
    target = torch.full((B, T), PAD)
    for reduction in ("mean", "sum"):
        loss = LabelSmoothingLoss(pad_id=PAD, reduction=reduction)(
            logits.log_softmax(-1), target
        )
        (grad,) = torch.autograd.grad(loss, logits)
        assert not loss.isnan() and loss.item() == 0.0
        assert torch.count_nonzero(grad) == 0


def test_pad_id_outside_the_vocabulary():
    logits, target = padded_batch()
    log_probs = logits.log_softmax(-1)
    reference = LabelSmoothingLoss(pad_id=PAD)(log_probs, target)
    moved = target.masked_fill(target == PAD, -100)
    assert LabelSmoothingLoss(pad_id=-100)(log_probs, moved).item() == pytest.approx(
        reference.item(), abs=1e-12
    )


def test_bfloat16_log_probs_are_accumulated_in_float32():
    logits, target = padded_batch()
    log_probs = logits.log_softmax(-1)
    exact = LabelSmoothingLoss(pad_id=PAD)(log_probs, target)
    rounded = log_probs.to(torch.bfloat16)
    low = LabelSmoothingLoss(pad_id=PAD)(rounded, target)
    assert low.dtype == torch.float32
    assert low.item() == pytest.approx(exact.item(), rel=2e-2)
    # Only the inputs' rounding shows, not sums in bfloat16 (an error near 5e-4 here).
    wide = LabelSmoothingLoss(pad_id=PAD)(rounded.double(), target)
    assert low.item() == pytest.approx(wide.item(), rel=1e-6)


def test_token_stats_by_hand():
    # Two sentences, V = 3; the second has one padded position.
    probs = torch.tensor(
        [
            [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]],
            [[0.2, 0.5, 0.3], [0.4, 0.4, 0.2]],
        ],
        dtype=torch.float64,
    )
    target = torch.tensor([[1, 2], [1, PAD]])
    stats = token_stats(probs.log(), target, pad_id=PAD)
    assert stats.tokens == 3
    assert stats.correct == 2  # argmax 0 vs 1 (wrong), 2 vs 2, 1 vs 1
    expected = -(math.log(0.2) + math.log(0.6) + math.log(0.5)) / 3
    assert stats.nll == pytest.approx(expected, abs=1e-12)
    assert stats.perplexity == pytest.approx(math.exp(expected), abs=1e-12)
    assert stats.accuracy == pytest.approx(2 / 3)


def test_token_stats_add_up_across_batches():
    logits, target = padded_batch()
    log_probs = logits.log_softmax(-1)
    whole = token_stats(log_probs, target, pad_id=PAD)
    parts = sum(
        (
            token_stats(log_probs[b : b + 1], target[b : b + 1], pad_id=PAD)
            for b in range(B)
        ),
        TokenStats(),
    )
    assert parts.tokens == whole.tokens == int((target != PAD).sum())
    assert parts.correct == whole.correct
    assert parts.nll == pytest.approx(whole.nll, abs=1e-12)
    unsmoothed = LabelSmoothingLoss(pad_id=PAD, smoothing=0.0)(log_probs, target)
    assert whole.nll == pytest.approx(unsmoothed.item(), abs=1e-12)


def test_empty_token_stats_raise():
    with pytest.raises(ValueError, match="no target tokens"):
        TokenStats().accuracy  # noqa: B018
