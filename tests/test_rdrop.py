"""R-Drop: the doubled batch, the loss and its scale, and the `r_drop` option of a run."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from test_train import (
    assert_same_update,
    copy_pairs,
    one_update,
    tiny_config,
    tiny_data,
    tiny_model,
    train_module,
)

from transformer.checked_batches import checked_collate
from transformer.checkpoint import CheckpointError, Progress, load_model
from transformer.cli.train import config_from_args, train_parser
from transformer.loss import LabelSmoothingLoss
from transformer.rdrop import RDropLoss, doubled
from transformer.train_config import TrainConfig
from transformer.trainer import train
from transformer.trainer_step import trainer_step
from transformer.training_loop import batch_log_probs
from transformer.validation import validate


def base_loss() -> LabelSmoothingLoss:
    return LabelSmoothingLoss(pad_id=0, smoothing=0.1, reduction="sum")


def test_doubled_stacks_every_tensor_and_doubles_every_count():
    batch = checked_collate(
        copy_pairs(3, seed=0), pad_id=0, bos_id=1, eos_id=2, index=[7, 8, 9]
    )
    twice = doubled(batch)
    for name in ("src", "tgt_in", "tgt_out", "index"):
        one, two = getattr(batch, name), getattr(twice, name)
        assert two.shape == (2 * one.shape[0], *one.shape[1:]), name
        assert torch.equal(two[:3], one) and torch.equal(two[3:], one), name
    assert twice.index.tolist() == [7, 8, 9, 7, 8, 9]
    assert twice.n_src_tokens == 2 * batch.n_src_tokens
    assert twice.n_tgt_tokens == 2 * batch.n_tgt_tokens


@pytest.mark.parametrize("alpha", [0.0, 1.0, 5.0])
def test_with_equal_halves_the_loss_is_one_copys_base_loss(alpha):
    model = tiny_model()
    model.train()  # dropout 0: the two passes agree
    batch = checked_collate(copy_pairs(4, seed=1), pad_id=0, bos_id=1, eos_id=2)
    with torch.no_grad():
        one = base_loss()(batch_log_probs(model, batch, pad_id=0), batch.tgt_out)
        twice = doubled(batch)
        log_probs = batch_log_probs(model, twice, pad_id=0)
        loss = RDropLoss(base_loss(), alpha)(log_probs, twice.tgt_out)
    assert torch.allclose(loss, one, rtol=1e-5)


def test_the_kl_term_is_the_symmetric_kl_summed_over_real_tokens():
    g = torch.Generator().manual_seed(0)
    B, T, V = 2, 3, 5
    log_probs = torch.randn(2 * B, T, V, generator=g).log_softmax(-1)
    target = torch.randint(1, V, (B, T), generator=g)
    target[1, 2] = 0  # padding: no KL there
    target = torch.cat([target, target])
    alpha = 0.7
    by_hand = 0.0
    p, q = log_probs[:B].exp(), log_probs[B:].exp()
    for b in range(B):
        for t in range(T):
            if target[b, t] != 0:
                kl_pq = (p[b, t] * (p[b, t] / q[b, t]).log()).sum()
                kl_qp = (q[b, t] * (q[b, t] / p[b, t]).log()).sum()
                by_hand += float(kl_pq + kl_qp)
    base = base_loss()(log_probs, target)
    loss = RDropLoss(base_loss(), alpha)(log_probs, target)
    assert math.isclose(float(loss - base / 2), alpha / 4 * by_hand, rel_tol=1e-5)
    # The padding position's KL, were it counted, would change the loss.
    target[1, 2] = target[B + 1, 2] = 1
    counted = RDropLoss(base_loss(), alpha)(log_probs, target)
    base = base_loss()(log_probs, target)
    assert float(counted - base / 2) > alpha / 4 * by_hand + 1e-3


def test_the_kl_of_bfloat16_log_probabilities_is_computed_in_float32():
    g = torch.Generator().manual_seed(0)
    log_probs = torch.randn(8, 6, 50, generator=g).log_softmax(-1).bfloat16()
    target = torch.randint(1, 50, (4, 6), generator=g).repeat(2, 1)
    criterion = RDropLoss(base_loss(), 1.0)
    loss = criterion(log_probs, target)
    assert loss.dtype == torch.float32
    assert torch.allclose(loss, criterion(log_probs.float(), target), rtol=1e-6)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="reduction='sum'"):
        RDropLoss(LabelSmoothingLoss(pad_id=0), 1.0)
    for alpha in (-1.0, math.nan, math.inf, True, "1"):
        with pytest.raises(ValueError, match="alpha"):
            RDropLoss(base_loss(), alpha)
    criterion = RDropLoss(base_loss(), 1.0)
    assert criterion.reduction == "sum" and criterion.pad_id == 0
    log_probs = torch.randn(3, 4, 6).log_softmax(-1)
    with pytest.raises(ValueError, match="doubled batch"):
        criterion(log_probs, torch.ones(3, 4, dtype=torch.long))


def test_without_dropout_an_r_drop_update_is_the_plain_update():
    """Same tokens, same gradient: the loss on the doubled batch keeps the scale of one copy."""
    batch = checked_collate(copy_pairs(6, seed=2), pad_id=0, bos_id=1, eos_id=2)

    tokens = batch.n_tgt_tokens
    plain = one_update([batch], tokens, base_loss())
    r_drop = one_update([doubled(batch)], tokens, RDropLoss(base_loss(), 1.0))
    assert_same_update(plain, r_drop)
    # Dividing by the tokens of both copies would halve the gradient.
    twice = [doubled(doubled(batch))]
    halved = one_update(twice, tokens, RDropLoss(base_loss(), 1.0))
    w = "encoder.layers.0.feed_forward.w_1.weight"
    assert not torch.allclose(
        plain.get_parameter(w).grad, halved.get_parameter(w).grad, atol=1e-4
    )


# -- the option of a run -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def data():
    return tiny_data()


def test_a_run_with_r_drop_trains_counts_two_passes_and_keeps_its_alpha(
    tmp_path: Path, data, monkeypatch
):
    seen = []  # what each update of the R-Drop run trains on

    def spy(model, batches, *, criterion, **kwargs):
        seen.append((criterion, batches))
        return trainer_step(model, batches, criterion=criterion, **kwargs)

    runs = {}
    for r_drop in (0.0, 1.0):
        monkeypatch.setattr(
            train_module, "trainer_step", spy if r_drop else trainer_step
        )
        out = tmp_path / f"r_drop-{r_drop}"
        config = tiny_config(out, epochs=2, max_steps=3, r_drop=r_drop)
        runs[r_drop] = out, train(config, data=data, echo=False)
    out, result = runs[1.0]
    assert len(seen) == 3
    for criterion, batches in seen:
        assert isinstance(criterion, RDropLoss) and criterion.alpha == 1.0
        for batch in batches:
            half = batch.src.shape[0] // 2
            assert torch.equal(batch.tgt_out[:half], batch.tgt_out[half:])
            assert torch.equal(batch.index[:half], batch.index[half:])
    assert result.stopped == "max_steps"
    for record in result.metrics:
        for key in ("train_loss", "val_loss", "val_nll"):
            if key in record:
                assert math.isfinite(record[key]), (key, record)
    # Stopped inside an epoch, the checkpoint keeps the epoch's FLOPs: two passes per pair.
    flops = {
        r: Progress.read(path / "checkpoints" / "step-0000003").epoch_flops
        for r, (path, _) in runs.items()
    }
    assert flops[1.0] == pytest.approx(2 * flops[0.0])
    # Validation is the plain label-smoothed loss of the checkpoint: no KL term enters it.
    model, tok = load_model(out / "checkpoints" / "step-0000003")
    ids = dict(pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    batches = [checked_collate([data.val[i]], **ids) for i in range(len(data.val))]
    plain = validate(model, batches, pad_id=tok.pad_id, smoothing=0.1)
    assert result.metrics[0]["kind"] == "partial"
    assert result.metrics[0]["val_loss"] == pytest.approx(plain.loss, rel=1e-5)
    with pytest.raises(
        CheckpointError, match="r_drop=1.0, this run asks for r_drop=0.0"
    ):
        train(
            tiny_config(out, epochs=2, r_drop=0.0), resume=True, data=data, echo=False
        )


def test_the_command_line_offers_r_drop():
    parser = train_parser()
    assert "--r-drop" in parser.format_help()
    args = parser.parse_args(["--pair", "de-en", "--r-drop", "0.5"])
    assert config_from_args(args).r_drop == 0.5
    assert TrainConfig(pair="de-en").r_drop == 0


@pytest.mark.parametrize("value", [-1, -0.5, math.nan, math.inf, True, "1"])
def test_bad_r_drop_values_are_refused_with_the_fields_name(value):
    with pytest.raises(ValueError, match="r_drop must be a finite number"):
        TrainConfig(pair="de-en", r_drop=value)
