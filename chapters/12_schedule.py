# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The optimiser and its learning-rate schedule
#
# The paper trains with Adam and a learning rate that changes at every step (Section 5.3)
# {cite:p}`vaswani2017attention`: "We used the Adam optimizer with $\beta_1 = 0.9$,
# $\beta_2 = 0.98$ and $\epsilon = 10^{-9}$. We varied the learning rate over the course of
# training, according to the formula:
#
# $$
# lrate = d_{\text{model}}^{-0.5} \cdot
# \min\left(step\_num^{-0.5},\; step\_num \cdot warmup\_steps^{-1.5}\right)
# \qquad (3)
# $$
#
# This corresponds to increasing the learning rate linearly for the first $warmup\_steps$
# training steps, and decreasing it thereafter proportionally to the inverse square root of the
# step number. We used $warmup\_steps = 4000$."
#
# The schedule is often called the *Noam* schedule, after Noam Shazeer, one of the paper's
# authors; tensor2tensor and the Annotated Transformer use that name. This chapter writes
# equation (3) as `transformer.schedule.noam_lr`, draws it for several model widths and warm-up
# lengths, explains why a Transformer needs the warm-up, and builds the optimiser and scheduler
# pair that the training loop uses, checking that PyTorch's scheduler produces exactly
# equation (3).

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    # [notebooks]: spaCy's tokenizers, Altair and pandas, at the versions the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e", where + "[notebooks]"]
    subprocess.run(pip, check=True)
    sys.path.insert(0, where)  # an editable install is seen only after a restart

# %% tags=["remove-cell"]
#| default_exp schedule

# %%
import math

import altair as alt
import pandas as pd
import torch
from torch import nn

torch.manual_seed(0)
torch.set_printoptions(precision=4)

# %% [markdown]
# ## Equation (3)
#
# The two arguments of the minimum are the two phases. For $step \le warmup$ the second one is
# smaller: the rate grows linearly, $step \cdot d_{\text{model}}^{-0.5} \cdot warmup^{-1.5}$.
# After that the first one is smaller: the rate decays as $step^{-0.5}$. The two meet at
# $step = warmup$, where the rate peaks at
#
# $$
# lrate_{\max} = d_{\text{model}}^{-0.5} \cdot warmup^{-0.5}.
# $$
#
# The factor $d_{\text{model}}^{-0.5}$ makes wider models train with smaller steps.
#
# **Counting steps.** $step\_num$ is the number of the update being made, counted from 1: the
# first update uses $lrate(1)$, the warm-up's smallest value. At $step\_num = 0$ the formula has
# $\min(\infty, 0)$; we define $lrate(0) = 0$, the limit of the linear ramp, so that the
# function is defined everywhere without a division by zero (nothing in training uses it).
#
# **A named deviation: `factor`.** The function multiplies equation (3) by `factor`, 1 in the
# paper. A small model trained on a small data set may want a higher peak, or a shorter warm-up,
# than the paper's; `factor` and `warmup` are the two knobs, and the training chapter chooses
# both for Multi30k and says why.

# %%
#| export
"""Adam and the learning-rate schedule of Vaswani et al. (2017), section 5.3, equation (3)."""

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-9


def noam_lr(step: int, *, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), equation (3).

    `step` is the number of the update, counted from 1; step 0 (before any update) gives 0,
    the limit of the linear warm-up.
    """
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    if d_model <= 0 or warmup <= 0:
        raise ValueError(
            f"d_model and warmup must be positive, got {d_model} and {warmup}"
        )
    if not factor > 0:  # also rejects NaN
        raise ValueError(f"factor must be positive, got {factor}")
    if step == 0:
        return 0.0
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


# %% [markdown]
# The paper's base model has $d_{\text{model}} = 512$ and its big model
# $d_{\text{model}} = 1024$, both with 4,000 warm-up steps; the base model trained for 100,000
# steps and the big one for 300,000. Their peak and final learning rates:

# %%
from transformer.schedule import noam_lr

rows = []
for name, d_model, steps in [("base", 512, 100_000), ("big", 1024, 300_000)]:
    peak = noam_lr(4000, d_model=d_model, warmup=4000)
    assert math.isclose(peak, d_model**-0.5 * 4000**-0.5, rel_tol=1e-12)
    rows.append(
        {
            "model": name,
            "d_model": d_model,
            "first update": f"{noam_lr(1, d_model=d_model, warmup=4000):.2e}",
            "peak (step 4,000)": f"{peak:.2e}",
            "last update": f"{noam_lr(steps, d_model=d_model, warmup=4000):.2e}",
        }
    )
assert math.isclose(noam_lr(4000, d_model=512, warmup=4000), 7.0e-4, rel_tol=0.01)
assert noam_lr(0, d_model=512, warmup=4000) == 0.0
assert noam_lr(9, d_model=512, warmup=4000, factor=2.0) == 2 * noam_lr(
    9, d_model=512, warmup=4000
)
pd.DataFrame(rows).set_index("model")

# %% [markdown]
# ## The shape of the schedule
#
# The figure draws equation (3) over the first 20,000 steps: on the left for three model widths
# with the paper's warm-up, on the right for three warm-up lengths at $d_{\text{model}} = 512$.
# Look at the peaks, marked with their values: each curve peaks exactly at its warm-up step, a
# longer warm-up gives a lower and later peak ($warmup^{-0.5}$), and a wider model a lower curve
# everywhere ($d_{\text{model}}^{-0.5}$). After the peaks, the curves with the same
# $d_{\text{model}}$ merge: the decay $d_{\text{model}}^{-0.5}\, step^{-0.5}$ does not depend on
# the warm-up.

# %%
STEPS = 20_000
configs = [(256, 4000), (512, 4000), (1024, 4000), (512, 2000), (512, 8000)]
curves = {
    (d_model, warmup): [
        noam_lr(s, d_model=d_model, warmup=warmup) for s in range(STEPS + 1)
    ]
    for d_model, warmup in configs
}

for (d_model, warmup), lr in curves.items():
    top = max(range(1, STEPS + 1), key=lambda s: lr[s])
    assert top == warmup
    assert math.isclose(lr[top], d_model**-0.5 * warmup**-0.5, rel_tol=1e-12)
    # Strictly up to the peak, strictly down after it.
    assert all(a < b for a, b in zip(lr[1:top], lr[2 : top + 1], strict=True))
    assert all(a > b for a, b in zip(lr[top:-1], lr[top + 1 :], strict=True))

# A wider model is lower at every step; after the longest warm-up, 8,000, the three warm-ups
# at d_model = 512 give the same rate.
assert all(
    a > b > c
    for a, b, c in zip(
        curves[256, 4000][1:],
        curves[512, 4000][1:],
        curves[1024, 4000][1:],
        strict=True,
    )
)
for step in range(8000, STEPS + 1):
    assert curves[512, 2000][step] == curves[512, 4000][step] == curves[512, 8000][step]

# %%
from transformer.plots import use_book_renderer

use_book_renderer()

# One point in 100 keeps the chart small; every warm-up is a multiple of 100, so the peaks
# are among the points and stay sharp.
shown = list(range(0, STEPS + 1, 100))
assert all(w in shown for _, w in configs)
panels = {  # the panel's title, and its curves with their legend labels
    "warmup = 4,000, three widths": {
        (256, 4000): "d_model = 256",
        (512, 4000): "d_model = 512",
        (1024, 4000): "d_model = 1024",
    },
    "d_model = 512, three warm-ups": {
        (512, 2000): "warmup = 2,000",
        (512, 4000): "warmup = 4,000",
        (512, 8000): "warmup = 8,000",
    },
}
schedule = pd.DataFrame(
    [
        {
            "panel": panel,
            "curve": label,
            "step": s,
            "learning rate": round(curves[c][s] * 1e4, 4),  # in units of 1e-4
        }
        for panel, labels in panels.items()
        for c, label in labels.items()
        for s in shown
    ]
)
peaks = pd.DataFrame(
    [
        {
            "panel": panel,
            "curve": label,
            "step": c[1],
            "learning rate": round(curves[c][c[1]] * 1e4, 4),
            "peak": f"{curves[c][c[1]] * 1e4:.1f}",  # in the axis's units
        }
        for panel, labels in panels.items()
        for c, label in labels.items()
    ]
)


def schedule_panel(panel: str) -> alt.LayerChart:
    x = alt.X(
        "step:Q", title="step", axis=alt.Axis(values=list(range(0, STEPS + 1, 4000)))
    )
    y = alt.Y("learning rate:Q", title="learning rate (× 1e-4)")
    color = alt.Color(
        "curve:N",
        title=None,
        sort=list(panels[panel].values()),
        legend=alt.Legend(orient="top-right"),
    )
    lines = (
        alt.Chart(schedule[schedule.panel == panel], title=panel)
        .mark_line()
        .encode(x=x, y=y, color=color, tooltip=["curve", "step", "learning rate"])
    )
    dots = (
        alt.Chart(peaks[peaks.panel == panel])
        .mark_point(filled=True, size=50)
        .encode(x=x, y=y, color=color, tooltip=["curve", "step", "peak"])
    )
    text = dots.mark_text(align="left", dx=6, dy=-8).encode(text="peak:N")
    return (lines + dots + text).properties(width=320, height=230)


alt.hconcat(*(schedule_panel(panel) for panel in panels)).resolve_scale(
    color="independent"
).properties(title="Equation (3) over the first 20,000 steps, peaks marked")


# %% [markdown]
# ## Why a warm-up
#
# Adam divides each coordinate's step by a running estimate of the gradient's magnitude. With
# $g_t$ the gradient at update $t$ and bias-corrected moving averages
# $\hat m_t \approx \mathbb{E}[g]$ and $\hat v_t \approx \mathbb{E}[g^2]$, each weight moves by
#
# $$
# \Delta\theta_t = -\,lrate \cdot \frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}.
# $$
#
# At the first update $\hat m_1 = g_1$ and $\hat v_1 = g_1^2$, so every weight moves by
# $lrate \cdot \operatorname{sign}(g_1)$, the full learning rate, whether its gradient is large
# or tiny, informative or noise. One Adam update on five weights whose gradients span six orders
# of magnitude shows it:

# %%
weights = nn.Parameter(torch.zeros(5))
weights.grad = torch.tensor([1e-4, -1e-2, 1.0, -10.0, 100.0])
adam = torch.optim.Adam([weights], lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
adam.step()
print("gradient:", " ".join(f"{g:+8.0e}" for g in weights.grad.tolist()))
print("change:  ", " ".join(f"{x:+8.0e}" for x in weights.detach().tolist()))
assert torch.allclose(weights.detach(), -1e-3 * weights.grad.sign(), rtol=1e-4)

# %% [markdown]
# The estimate $\hat v_t$ averages the squared gradients over roughly the last
# $1 / (1 - \beta_2)$ updates, and until that many updates have been seen it rests on a handful
# of noisy gradients. The adaptive step $1/\sqrt{\hat v_t}$ then has a large variance, which is
# the problem Liu et al. identify, and which a warm-up tames by keeping the learning rate small
# while the estimates settle {cite:p}`liu2020variance`. The paper's $\beta_2 = 0.98$, lower than
# Adam's default of 0.999, shortens that memory:

# %%
for beta_2 in (0.999, 0.98):
    print(f"β2 = {beta_2}: averages over about {1 / (1 - beta_2):,.0f} updates")

# %% [markdown]
# By this argument alone the warm-up could be short, of the order of $1 / (1 - \beta_2)$ updates,
# 50 here. The paper's 4,000 are eighty times that, and the architecture adds a second reason.
# In the paper's *post-norm* layers (the residual sum is normalised,
# $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$), Xiong et al. show that at initialisation the
# expected gradients of the parameters near the output are large, so that a large learning rate
# from the first step makes training unstable; the warm-up is what keeps post-norm Transformers
# trainable {cite:p}`xiong2020layer`. The *pre-norm* variant
# ($x + \mathrm{Sublayer}(\mathrm{LayerNorm}(x))$, the option `norm_first=True` of this book's
# layers) has well-behaved gradients at initialisation and tolerates a much shorter warm-up, or
# none.
#
# ## The optimiser and the scheduler
#
# `make_optimizer` builds the paper's Adam and a PyTorch `LambdaLR` scheduler. `LambdaLR` sets
# each learning rate to the optimiser's base rate times a function of the number of
# `scheduler.step()` calls made so far; with the base rate set to 1.0, that function *is* the
# learning rate. After $k$ calls, $k$ updates have been made and the next one is update
# $k + 1$, so the function is $k \mapsto lrate(k + 1)$. The training loop calls
# `optimizer.step()` then `scheduler.step()`, once per update (several batches make one update
# when gradients are accumulated, as the training chapter allows).
#
# Adam's `fused=True` implementation does the whole update of a group of tensors in one GPU kernel,
# where PyTorch's default (`foreach`) launches one kernel per elementwise operation over all the
# tensors, several per update; `make_optimizer` turns it on when every parameter is on a CUDA device
# and off otherwise (`fused=None`, the default), and `fused=` chooses. Weight decay is zero, as in
# the paper.


# %%
#| export
def _param_list(params: torch.Tensor | Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """A parameter group's tensors as a list: one tensor, or an iterable of them."""
    return [params] if isinstance(params, torch.Tensor) else list(params)


def make_optimizer(
    model_or_params: nn.Module | Iterable[torch.Tensor] | Iterable[dict],
    *,
    d_model: int,
    warmup: int = 4000,
    factor: float = 1.0,
    fused: bool | None = None,
) -> tuple[torch.optim.Adam, LambdaLR]:
    """Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) with the learning rate of equation (3).

    The optimizer's base lr is 1.0 and the scheduler's factor is noam_lr(k + 1) after k calls of
    `scheduler.step()`, so update n (from 1) uses noam_lr(n). Call `optimizer.step()`, then
    `scheduler.step()`. `fused=None` uses the fused Adam when every parameter is on CUDA.
    """
    if isinstance(model_or_params, nn.Module):
        params: list = list(model_or_params.parameters())
    else:
        # A group's "params" may be a generator (`model.encoder.parameters()`): make it a
        # list, or reading it here would leave Adam an empty group. It may also be one tensor,
        # as torch.optim allows, which list() would cut into its rows.
        params = [
            p | {"params": _param_list(p["params"])} if isinstance(p, dict) else p
            for p in model_or_params
        ]
    groups = [p["params"] if isinstance(p, dict) else [p] for p in params]
    if not groups or any(not group for group in groups):
        raise ValueError("make_optimizer got no parameters (or an empty group)")
    if any(isinstance(p, dict) and "lr" in p for p in params):
        # LambdaLR multiplies a group's own lr by the schedule: noam_lr(n) would be scaled.
        raise ValueError(
            "a parameter group sets its own lr: the schedule sets every group's learning "
            "rate (use factor= to scale it)"
        )
    if fused is None:
        fused = all(t.is_cuda and t.is_floating_point() for g in groups for t in g)
    # Check the schedule's arguments before building anything.
    noam_lr(1, d_model=d_model, warmup=warmup, factor=factor)

    def lr_at(completed_updates: int) -> float:
        return noam_lr(
            completed_updates + 1, d_model=d_model, warmup=warmup, factor=factor
        )

    optimizer = torch.optim.Adam(
        params, lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPS, fused=fused
    )
    return optimizer, LambdaLR(optimizer, lr_at)


# %% [markdown]
# A tiny model is enough to check the optimiser: its hyperparameters are the paper's, and over
# 500 real training updates, with a warm-up shortened to 200 steps so that the check crosses the
# peak in a second, the learning rate PyTorch's scheduler hands the optimiser is exactly
# equation (3) at every step.

# %%
from transformer.schedule import ADAM_BETAS, ADAM_EPS, make_optimizer

model = nn.Linear(8, 8)
WARMUP, UPDATES = 200, 500
optimizer, scheduler = make_optimizer(model, d_model=512, warmup=WARMUP)
group = optimizer.param_groups[0]
assert (
    group["betas"] == (0.9, 0.98)
    and group["eps"] == 1e-9
    and group["weight_decay"] == 0
)
assert not group["fused"]  # the parameters are on the CPU

x = torch.randn(16, 8)
seen = {}
for k in range(UPDATES):
    lr = optimizer.param_groups[0]["lr"]  # the rate of update k + 1
    assert lr == noam_lr(k + 1, d_model=512, warmup=WARMUP), k
    if k in (0, 1, 2, WARMUP - 2, WARMUP - 1, WARMUP, UPDATES - 1):
        seen[k] = lr
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()

pd.DataFrame(
    [
        {
            "scheduler.step() calls": k,
            "update": k + 1,
            "optimizer lr": f"{lr:.4e}",
            "noam_lr(update)": f"{noam_lr(k + 1, d_model=512, warmup=WARMUP):.4e}",
        }
        for k, lr in seen.items()
    ]
).set_index("scheduler.step() calls")

# %% [markdown]
# The table shows the first updates climbing from the smallest rate, the peak at update 200,
# the end of the warm-up, and the decay after it. A checkpoint that stores
# `optimizer.state_dict()` and `scheduler.state_dict()` resumes on the same curve, provided
# `make_optimizer` is called again with the same `d_model`, `warmup` and `factor` (the schedule
# itself, a function, is not in the state): the scheduler's state is the number of calls made,
# and the optimiser's holds the current rate and Adam's moving averages.
#
# With the loss of the previous chapter and this optimiser, every piece of the paper's training
# recipe is in place; the training chapter puts them together in one loop.
