"""The learning-rate schedule of equation (3) and the paper's Adam: the schedule chapter's
`make_optimizer`, and the run's `trainer_optimizer`, which the Trainer uses."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn

from transformer.schedule import ADAM_BETAS, ADAM_EPS, make_optimizer, noam_lr
from transformer.trainer_optimizer import trainer_optimizer


@pytest.mark.parametrize(
    ("step", "expected"),
    [
        (1, 512**-0.5 * 4000**-1.5),  # warm-up: step · warmup^-1.5
        (100, 512**-0.5 * 100 * 4000**-1.5),
        (4000, 512**-0.5 * 4000**-0.5),  # the two branches meet
        (10_000, 512**-0.5 * 10_000**-0.5),  # decay: step^-0.5
        (100_000, 512**-0.5 * 100_000**-0.5),
    ],
)
def test_formula_values(step: int, expected: float):
    assert math.isclose(
        noam_lr(step, d_model=512, warmup=4000), expected, rel_tol=1e-12
    )


def test_base_model_peak_is_seven_ten_thousandths():
    assert noam_lr(4000, d_model=512, warmup=4000) == pytest.approx(6.988e-4, rel=1e-3)


@pytest.mark.parametrize(("d_model", "warmup"), [(512, 4000), (256, 100), (1024, 37)])
def test_peak_at_warmup_and_monotone_on_both_sides(d_model: int, warmup: int):
    lr = [noam_lr(s, d_model=d_model, warmup=warmup) for s in range(1, 3 * warmup + 1)]
    top = max(range(len(lr)), key=lr.__getitem__) + 1  # steps count from 1
    assert top == warmup
    assert math.isclose(max(lr), d_model**-0.5 * warmup**-0.5, rel_tol=1e-12)
    rising, falling = lr[:warmup], lr[warmup - 1 :]
    assert all(a < b for a, b in zip(rising, rising[1:], strict=False))
    assert all(a > b for a, b in zip(falling, falling[1:], strict=False))


def test_wider_models_are_lower_and_the_decay_ignores_the_warmup():
    """The schedule chapter's figure: at every step a wider model's rate is lower, and after
    the longest warm-up the curves of one width are one."""
    steps = range(1, 20_001)
    for step in steps:
        rates = [noam_lr(step, d_model=d, warmup=4000) for d in (256, 512, 1024)]
        assert rates[0] > rates[1] > rates[2]
    for step in range(8000, 20_001):
        rates = {noam_lr(step, d_model=512, warmup=w) for w in (2000, 4000, 8000)}
        assert len(rates) == 1


def test_step_zero_is_zero_and_bad_arguments_raise():
    assert noam_lr(0, d_model=512, warmup=4000) == 0.0
    with pytest.raises(ValueError, match="step"):
        noam_lr(-1, d_model=512, warmup=4000)
    with pytest.raises(ValueError, match="warmup"):
        noam_lr(10, d_model=512, warmup=0)
    with pytest.raises(ValueError, match="d_model"):
        noam_lr(10, d_model=0, warmup=10)


def test_factor_scales_the_whole_curve():
    for step in (1, 50, 4000, 20_000):
        base = noam_lr(step, d_model=512, warmup=4000)
        assert noam_lr(step, d_model=512, warmup=4000, factor=2.5) == pytest.approx(
            2.5 * base, rel=1e-12
        )


def test_optimizer_has_the_papers_hyperparameters():
    optimizer, _ = make_optimizer(nn.Linear(3, 3), d_model=512)
    group = optimizer.param_groups[0]
    assert isinstance(optimizer, torch.optim.Adam)
    assert ADAM_BETAS == group["betas"] == (0.9, 0.98)
    assert ADAM_EPS == group["eps"] == 1e-9
    assert group["weight_decay"] == 0
    assert not group["amsgrad"]
    # Before any update the lr is that of update 1.
    assert group["lr"] == noam_lr(1, d_model=512, warmup=4000)


def train(model: nn.Module, optimizer, scheduler, updates: int, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(updates):
        x = torch.randn(5, 3, generator=g)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("factor", [1.0, 3.0])
def test_lr_after_k_scheduler_steps_is_the_formula(factor: float):
    model = nn.Linear(3, 3)
    optimizer, scheduler = make_optimizer(model, d_model=64, warmup=10, factor=factor)
    for k in range(40):
        expected = noam_lr(k + 1, d_model=64, warmup=10, factor=factor)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12)
        assert scheduler.get_last_lr()[0] == pytest.approx(expected, rel=1e-12)
        train(model, optimizer, scheduler, 1, seed=k)


def test_lr_drives_the_update_size_of_the_first_step():
    # Adam's first step moves each weight by lr · sign(gradient): the scheduler's lr is used.
    model = nn.Linear(3, 3, bias=False)
    before = model.weight.detach().clone()
    optimizer, scheduler = make_optimizer(model, d_model=64, warmup=10)
    train(model, optimizer, scheduler, 1)
    step = (model.weight.detach() - before).abs()
    assert torch.allclose(
        step, torch.full_like(step, noam_lr(1, d_model=64, warmup=10))
    )


def test_accepts_parameters_and_parameter_groups():
    model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
    optimizer, _ = trainer_optimizer(model.parameters(), d_model=64, warmup=10)
    assert len(optimizer.param_groups[0]["params"]) == 4
    groups = [{"params": model[0].parameters()}, {"params": model[1].parameters()}]
    optimizer, scheduler = trainer_optimizer(groups, d_model=64, warmup=10)
    # generators in the groups are read once, by Adam, not used up before
    assert [len(g["params"]) for g in optimizer.param_groups] == [2, 2]
    before = [p.detach().clone() for p in model.parameters()]
    train(model, optimizer, scheduler, 3)
    expected = noam_lr(4, d_model=64, warmup=10)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([expected] * 2)
    assert all(
        not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True)
    )
    # A group may hold one tensor, as torch.optim allows: not cut into its rows.
    weight = model[0].weight
    optimizer, _ = trainer_optimizer([{"params": weight}], d_model=64, warmup=10)
    (group,) = optimizer.param_groups
    assert len(group["params"]) == 1 and group["params"][0] is weight


def test_no_parameters_raise():
    with pytest.raises(ValueError, match="no parameters"):
        trainer_optimizer([], d_model=64)
    with pytest.raises(ValueError, match="empty group"):
        trainer_optimizer([{"params": []}], d_model=64)


def test_a_group_with_its_own_lr_is_refused():
    # LambdaLR would multiply the group's lr by the schedule: 1e-3 * noam_lr(n), silently
    model = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="sets its own lr"):
        trainer_optimizer([{"params": model.parameters(), "lr": 1e-3}], d_model=64)


@pytest.mark.parametrize("factor", [0.0, -1.0, float("nan")])
def test_bad_factor_raises(factor):
    with pytest.raises(ValueError, match="factor must be positive"):
        noam_lr(10, d_model=64, warmup=10, factor=factor)
    with pytest.raises(ValueError, match="factor must be positive"):
        make_optimizer(nn.Linear(2, 2), d_model=64, warmup=10, factor=factor)
    with pytest.raises(ValueError, match="factor must be positive"):
        trainer_optimizer(nn.Linear(2, 2), d_model=64, warmup=10, factor=factor)


def test_bad_schedule_arguments_raise_at_construction():
    with pytest.raises(ValueError, match="warmup"):
        make_optimizer(nn.Linear(3, 3), d_model=64, warmup=0)


def test_resuming_from_state_dicts_continues_the_curve():
    torch.manual_seed(0)
    model = nn.Linear(3, 3)
    optimizer, scheduler = make_optimizer(model, d_model=64, warmup=10)
    train(model, optimizer, scheduler, 7)
    # state_dict() returns live tensors: copy them, as torch.save would.
    saved = copy.deepcopy(
        (model.state_dict(), optimizer.state_dict(), scheduler.state_dict())
    )
    train(model, optimizer, scheduler, 5, seed=1)

    resumed = nn.Linear(3, 3)
    resumed.load_state_dict(saved[0])
    optimizer2, scheduler2 = make_optimizer(resumed, d_model=64, warmup=10)
    optimizer2.load_state_dict(saved[1])
    scheduler2.load_state_dict(saved[2])
    assert optimizer2.param_groups[0]["lr"] == noam_lr(8, d_model=64, warmup=10)
    train(resumed, optimizer2, scheduler2, 5, seed=1)
    assert optimizer2.param_groups[0]["lr"] == optimizer.param_groups[0]["lr"]
    assert torch.equal(resumed.weight, model.weight)


def test_fused_is_off_on_the_cpu():
    optimizer, _ = trainer_optimizer(nn.Linear(3, 3), d_model=64)
    assert not optimizer.param_groups[0]["fused"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_is_on_when_every_parameter_is_on_cuda():
    model = nn.Linear(3, 3).cuda()
    optimizer, scheduler = trainer_optimizer(model, d_model=64, warmup=10)
    assert optimizer.param_groups[0]["fused"]
    x = torch.randn(5, 3, device="cuda")
    for k in range(12):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(
            noam_lr(k + 1, d_model=64, warmup=10), rel=1e-12
        )
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
    # A model split across devices falls back to the unfused implementation.
    mixed = nn.Sequential(nn.Linear(3, 3).cuda(), nn.Linear(3, 3))
    optimizer, _ = trainer_optimizer(mixed, d_model=64)
    assert not optimizer.param_groups[0]["fused"]


@pytest.mark.parametrize("factor", [1.0, 2.5])
def test_the_runs_optimizer_is_the_chapters(factor: float):
    """On a model, trainer_optimizer's Adam and schedule are make_optimizer's: the same settings
    and, update after update, the same weights and rates."""
    torch.manual_seed(0)
    ours, theirs = nn.Linear(3, 3), nn.Linear(3, 3)
    theirs.load_state_dict(ours.state_dict())
    schedule = dict(d_model=64, warmup=10, factor=factor)
    chapter = make_optimizer(ours, **schedule)
    run = trainer_optimizer(theirs, **schedule)
    settings = ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")
    for a, b in zip(chapter[0].param_groups, run[0].param_groups, strict=True):
        assert {k: a[k] for k in settings} == {k: b[k] for k in settings}
    for k in range(12):
        train(ours, *chapter, 1, seed=k)
        train(theirs, *run, 1, seed=k)
        assert torch.equal(ours.weight, theirs.weight)
        assert torch.equal(ours.bias, theirs.bias)
        assert chapter[1].get_last_lr() == run[1].get_last_lr()
