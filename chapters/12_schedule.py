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
# This chapter writes equation (3), often called the *Noam* schedule after Noam Shazeer, one of
# the authors, as `transformer.schedule.noam_lr`, explains the warm-up, and builds the optimiser
# and scheduler pair that the training loop uses.

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
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)

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
# The two arguments of the minimum are the two phases. For $step \le warmup$ the second is
# smaller and the rate grows linearly; after it the first is smaller and the rate decays as
# $step^{-0.5}$. They meet at $step = warmup$, where the rate peaks at
#
# $$
# lrate_{\max} = d_{\text{model}}^{-0.5} \cdot warmup^{-0.5}.
# $$
#
# The factor $d_{\text{model}}^{-0.5}$ makes wider models train with smaller steps. $step\_num$
# counts updates from 1; we define $lrate(0) = 0$, the limit of the ramp. The function also takes
# a `factor`, 1 in the paper, that scales the whole curve: with `warmup`, it is the knob that the
# training chapter turns for Multi30k.

# %%
#| export
"""Adam and the learning-rate schedule of Vaswani et al. (2017), section 5.3,
equation (3)."""

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

# The paper's (Section 5.3): "β1 = 0.9, β2 = 0.98 and ε = 10^-9",
# "warmup_steps = 4000".
ADAM_BETAS = (0.9, 0.98)
ADAM_EPS = 1e-9
PAPER_WARMUP_STEPS = 4000
WARMUP_STEPS = PAPER_WARMUP_STEPS  # the package's default


def noam_lr(
    step: int, *, d_model: int, warmup: int, factor: float = 1.0
) -> float:
    """factor · d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), equation
    (3); `step` counts updates from 1, and step 0 gives 0."""
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
# The paper's base model ($d_{\text{model}} = 512$, 100,000 steps) and big model
# ($d_{\text{model}} = 1024$, 300,000 steps), both with 4,000 warm-up steps:

# %%
from transformer.schedule import PAPER_WARMUP_STEPS, noam_lr

warmup = PAPER_WARMUP_STEPS
for name, d_model, steps in [("base", 512, 100_000), ("big", 1024, 300_000)]:
    lr = [
        noam_lr(s, d_model=d_model, warmup=warmup) for s in (1, warmup, steps)
    ]
    print(
        f"{name}: updates 1, {warmup:,}, {steps:,}: "
        + ", ".join(f"{r:.2e}" for r in lr)
    )
    assert math.isclose(lr[1], d_model**-0.5 * warmup**-0.5, rel_tol=1e-12)

# %% [markdown]
# ## The shape of the schedule
#
# The figure draws equation (3) over the first 20,000 steps, on the left for three model widths,
# on the right for three warm-up lengths. Look at the peaks, marked with their values: each curve
# peaks at its warm-up step, a longer warm-up gives a lower and later peak, and a wider model a
# lower curve everywhere. After the peaks, the curves of one width merge: the decay does not
# depend on the warm-up.

# %% tags=["hide-input"]
from transformer.plots import use_book_renderer

use_book_renderer()
panels = {  # each panel's title, and its curves: (d_model, warmup)
    "warmup = 4,000, three widths": [(256, 4000), (512, 4000), (1024, 4000)],
    "d_model = 512, three warm-ups": [(512, 2000), (512, 4000), (512, 8000)],
}
rows = [
    {
        "panel": panel,
        "curve": f"d_model = {d}" if panel[0] == "w" else f"warmup = {w:,}",
        "step": s,
        "lr": round(noam_lr(s, d_model=d, warmup=w) * 1e4, 4),  # in 1e-4
        "peak": f"{noam_lr(w, d_model=d, warmup=w) * 1e4:.1f}"
        if s == w
        else None,
    }
    for panel, curves in panels.items()
    for d, w in curves
    for s in range(0, 20_001, 100)  # every warm-up is among the steps
]
schedule = pd.DataFrame(rows)


def schedule_panel(panel: str) -> alt.LayerChart:
    x = alt.X("step:Q", axis=alt.Axis(values=list(range(0, 20_001, 4000))))
    y = alt.Y("lr:Q", title="learning rate (× 1e-4)")
    legend = alt.Legend(orient="top-right")
    color = alt.Color("curve:N", title=None, sort=None, legend=legend)
    data = alt.Chart(schedule[schedule.panel == panel], title=panel)
    lines = data.mark_line().encode(x=x, y=y, color=color)
    peaks = data.transform_filter("datum.peak != null")
    dots = peaks.mark_point(filled=True, size=50).encode(x=x, y=y, color=color)
    text = peaks.mark_text(align="left", dx=6, dy=-8).encode(
        x=x, y=y, text="peak:N"
    )
    return (lines + dots + text).properties(width=270, height=230)


alt.hconcat(*(schedule_panel(panel) for panel in panels)).resolve_scale(
    color="independent"
).properties(title="Equation (3) over the first 20,000 steps, peaks marked")

# %% [markdown]
# ## Why a warm-up
#
# Adam divides each coordinate's step by a running estimate of the gradient's magnitude: with
# bias-corrected moving averages $\hat m_t \approx \mathbb{E}[g]$ and
# $\hat v_t \approx \mathbb{E}[g^2]$, each weight moves by
#
# $$
# \Delta\theta_t = -\,lrate \cdot \frac{\hat m_t}{\sqrt{\hat v_t} + \epsilon}.
# $$
#
# At the first update $\hat m_1 = g_1$ and $\hat v_1 = g_1^2$, so every weight moves by the full
# learning rate, whether its gradient is large or tiny:

# %%
weights = nn.Parameter(torch.zeros(5))
weights.grad = torch.tensor([1e-4, -1e-2, 1.0, -10.0, 100.0])
adam = torch.optim.Adam([weights], lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
adam.step()
print("gradient:", " ".join(f"{g:+8.0e}" for g in weights.grad.tolist()))
print("change:  ", " ".join(f"{x:+8.0e}" for x in weights.detach().tolist()))
assert torch.allclose(weights.detach(), -1e-3 * weights.grad.sign(), rtol=1e-4)

# %% [markdown]
# Until $\hat v_t$ has averaged enough gradients, its estimate is noisy and so is every step; a
# warm-up keeps the rate small while it settles {cite:p}`liu2020variance`. In the paper's
# *post-norm* layers the gradients near the output are also large at initialisation, and the
# warm-up is what keeps training stable {cite:p}`xiong2020layer`; the *pre-norm* variant
# (`norm_first=True`) tolerates a much shorter one.
#
# ## The optimiser and the scheduler
#
# `make_optimizer` builds the paper's Adam and a PyTorch `LambdaLR` scheduler, which sets the
# learning rate to the optimiser's base rate, 1.0 here, times a function of the number of
# `scheduler.step()` calls so far. After $k$ calls, $k$ updates have been made and the next is
# update $k + 1$, so the function is $k \mapsto lrate(k + 1)$. The training loop calls
# `optimizer.step()`, then `scheduler.step()`, once per update. The appendix
# [The Trainer](a07_trainer.ipynb) builds a run's optimiser on `noam_schedule`, with PyTorch's
# fused Adam on a GPU.


# %%
#| export
def noam_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    d_model: int,
    warmup: int = WARMUP_STEPS,
    factor: float = 1.0,
) -> LambdaLR:
    """The scheduler that gives update n (from 1) the rate noam_lr(n), the
    optimiser's base rate being 1.0."""

    def lr_at(completed_updates: int) -> float:  # the rate of the next one
        step = completed_updates + 1
        return noam_lr(step, d_model=d_model, warmup=warmup, factor=factor)

    return LambdaLR(optimizer, lr_at)


def make_optimizer(
    model: nn.Module,
    *,
    d_model: int,
    warmup: int = WARMUP_STEPS,
    factor: float = 1.0,
) -> tuple[torch.optim.Adam, LambdaLR]:
    """Adam(β1 = 0.9, β2 = 0.98, ε = 1e-9) with the learning rate of equation
    (3). Call `optimizer.step()`, then `scheduler.step()`."""
    optimizer = torch.optim.Adam(
        model.parameters(), lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPS
    )
    schedule = dict(d_model=d_model, warmup=warmup, factor=factor)
    return optimizer, noam_schedule(optimizer, **schedule)


# %% [markdown]
# Over 500 real updates of a tiny model, with the warm-up shortened to 200 steps, the rate that
# PyTorch's scheduler hands the optimiser is exactly equation (3) at every step:

# %%
from transformer.schedule import make_optimizer

model = nn.Linear(8, 8)
optimizer, scheduler = make_optimizer(model, d_model=512, warmup=200)
x = torch.randn(16, 8)
for k in range(500):  # k scheduler.step() calls so far: update k + 1 comes
    lr = optimizer.param_groups[0]["lr"]
    assert lr == noam_lr(k + 1, d_model=512, warmup=200), k
    if k in (0, 1, 198, 199, 200, 499):
        print(f"update {k + 1:>3}: lr {lr:.4e}")
    optimizer.zero_grad()
    model(x).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()

# %% [markdown]
# The first updates climb from the smallest rate, the peak comes at update 200, and the decay
# follows. A checkpoint that stores both state dicts resumes on the same curve, given the same
# `d_model`, `warmup` and `factor`.
#
# ## Summary
#
# - Adam with $\beta_1 = 0.9$, $\beta_2 = 0.98$, $\epsilon = 10^{-9}$ (Section 5.3).
# - Equation (3): a linear warm-up to $d_{\text{model}}^{-0.5} \cdot warmup^{-0.5}$, then a decay
#   as $step^{-0.5}$.
# - The warm-up keeps the first steps small while Adam's estimates settle, which post-norm
#   layers need.
#
# ## Exercises
#
# 1. Train with a shorter warm-up, `python -m transformer train --pair de-en --warmup 1000`, and
#    compare the first epochs' validation loss with the paper's `--warmup 4000`.
# 2. Scale the whole curve with `--lr-factor 2` (`TrainConfig(lr_factor=2)`): does training
#    converge faster, or diverge?
# 3. Try the shorter warm-up on a pre-norm model, adding `--set norm_first=true`.
