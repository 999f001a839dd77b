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
# # Label smoothing
#
# The model ends in a softmax over the target vocabulary: at every target position it gives a
# probability $p_v$ to each of the $V$ tokens. The usual training loss asks it to put all of its
# probability on the right token $y$, the negative log-likelihood $-\log p_y$. The paper asks
# for a little less (Section 5.4) {cite:p}`vaswani2017attention`: "During training, we employed
# label smoothing of value $\epsilon_{ls} = 0.1$. This hurts perplexity, as the model learns to
# be more unsure, but improves accuracy and BLEU score."
#
# Label smoothing {cite:p}`szegedy2016rethinking` trains the model towards a target that keeps
# $1 - \epsilon$ on the right token and spreads $\epsilon$ over the whole vocabulary, so pushing
# $p_y$ all the way to one never pays. This chapter exports the loss as
# `transformer.loss.LabelSmoothingLoss`.

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
#| default_exp loss

# %%
import math

import altair as alt
import pandas as pd
import torch
import torch.nn.functional as F

torch.manual_seed(0)
torch.set_printoptions(precision=4, sci_mode=False)

# %% [markdown]
# ## The smoothed target
#
# For a target token $y$ in a vocabulary of $V$ tokens, the smoothed target distribution is
#
# $$
# q_v = (1 - \epsilon)\,\mathbb{1}[v = y] + \frac{\epsilon}{V},
# $$
#
# a mixture of the one-hot target (weight $1 - \epsilon$) and the uniform distribution (weight
# $\epsilon$), as Szegedy et al. define it: the right token keeps $q_y = 1 - \epsilon + \epsilon / V$
# and every other token gets $\epsilon / V$. Take a toy German vocabulary of $V = 8$ tokens, with
# the padding token first, and the target *Hund*:

# %%
vocab = ["<pad>", "<bos>", "<eos>", "ein", "Hund", "läuft", "im", "Park"]
pad_id, y = vocab.index("<pad>"), vocab.index("Hund")
V, eps = len(vocab), 0.1

q = torch.full((V,), eps / V, dtype=torch.float64)
q[y] += 1 - eps
assert math.isclose(q.sum().item(), 1.0)
print(f"q_y = {q[y].item():.4f}, every other token {q[0].item():.4f}")

# %% [markdown]
# Implementations differ in how they spread the $\epsilon$: fairseq and tensor2tensor keep exactly
# $1 - \epsilon$ on the right token and share $\epsilon$ among the $V - 1$ others; the Annotated
# Transformer also leaves out the padding token. The table shows the three side by side; compare
# the rows of *Hund* and of `<pad>`, which only the Annotated Transformer's variant leaves empty.

# %% tags=["hide-input"]
fairseq = torch.full((V,), eps / (V - 1))
fairseq[y] = 1 - eps
annotated = torch.full((V,), eps / (V - 2))
annotated[y], annotated[pad_id] = 1 - eps, 0.0
columns = ["ε/V (this book)", "ε/(V−1) (fairseq)", "ε/(V−2) (Annotated)"]
rows = torch.stack([q.float(), fairseq, annotated], dim=1).numpy()
pd.DataFrame(rows, index=vocab, columns=columns).round(4)

# %% [markdown]
# The three differ by about $\epsilon / V$, a few millionths for the paper's vocabulary of 37,000
# tokens. The book spreads $\epsilon$ over all $V$ tokens, as Szegedy et al. and
# `F.cross_entropy(label_smoothing=ε)` do, so the loss can be tested against an implementation
# that is not ours.
#
# ## The loss: a KL divergence
#
# Training moves the model's distribution $p$ towards $q$. The natural distance is the
# Kullback–Leibler divergence, and it splits into two terms:
#
# $$
# \mathrm{KL}(q \,\Vert\, p) = \sum_v q_v \log \frac{q_v}{p_v}
# = \underbrace{\sum_v q_v \log q_v}_{-H(q)}
# \; \underbrace{- \sum_v q_v \log p_v}_{\mathrm{CE}_q(p)}
# = \mathrm{CE}_q(p) - H(q).
# $$
#
# The entropy $H(q)$ depends only on $\epsilon$ and $V$, so both give the same gradients. Writing
# $q$ out, the cross-entropy mixes two losses we know:
#
# $$
# \begin{aligned}
# \mathrm{CE}_q(p) &= (1 - \epsilon)\,\underbrace{(-\log p_y)}_{\text{NLL}}
# \;+\; \epsilon\,\underbrace{\Big(-\frac{1}{V}\sum_v \log p_v\Big)}_{\text{CE against uniform}},
# \\
# H(q) &= -q_y \log q_y - (V - 1)\,\frac{\epsilon}{V}\log\frac{\epsilon}{V}.
# \end{aligned}
# $$
#
# The first term pulls $p_y$ up; the second pulls every $p_v$ away from zero. The module computes
# it so, never building a $(B, T, V)$ tensor of targets, and reports the KL divergence, which is
# zero when the model matches the target.
#
# ## The module
#
# The input is the model's log-probabilities, $(B, T, V)$ or $(N, V)$. Padded positions give no
# loss and no gradient, and the mean is over real target tokens; an all-padding batch gives zero,
# where `F.cross_entropy` gives NaN. `reduction="sum"` serves a loop that accumulates gradients
# over several batches, `reduction="none"` gives the loss per position.

# %%
#| export
"""Label smoothing (Vaswani et al. 2017, section 5.4): the KL divergence from
the smoothed target to the model's distribution, padding ignored."""

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


# %%
#| export
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


# %% [markdown]
# The constant $H(q)$, for the toy vocabulary and for the paper's:

# %%
from transformer.loss import LabelSmoothingLoss, smoothed_target_entropy

V_wmt = 37_000  # the paper's shared English-German vocabulary
for size in (V, V_wmt):
    H = smoothed_target_entropy(eps, size)
    print(f"V = {size:>6,}: H(q) = {H:.4f} nats")
assert math.isclose(smoothed_target_entropy(eps, V), -(q * q.log()).sum())

# %% [markdown]
# ## Checking against PyTorch
#
# On a random batch of three sentences with padded ends, the loss must equal PyTorch's
# label-smoothed cross-entropy minus $H(q)$. PyTorch's function takes the logits, ours the
# log-probabilities.

# %%
B, T = 3, 6
logits = torch.randn(B, T, V, dtype=torch.float64)
target = torch.randint(1, V, (B, T))
target[0, 4:] = pad_id  # the sentences have 4, 5 and 6 tokens
target[1, 5:] = pad_id

criterion = LabelSmoothingLoss(pad_id=pad_id, smoothing=eps)
ours = criterion(logits.log_softmax(dim=-1), target)
theirs = F.cross_entropy(
    logits.view(-1, V),
    target.view(-1),
    label_smoothing=eps,
    ignore_index=pad_id,
)
reference = theirs - smoothed_target_entropy(eps, V)
print(criterion)
print(f"ours = {ours.item():.6f}, PyTorch − H(q) = {reference.item():.6f}")
assert torch.allclose(ours, reference, atol=1e-12)

# %% [markdown]
# At a real position the gradient with respect to the logits is $(p - q) / N$, for $N$ real
# tokens; at a padded position it is zero:

# %%
logits.requires_grad_(True)
(grad,) = torch.autograd.grad(
    criterion(logits.log_softmax(-1), target), logits
)
p_model = logits.detach().softmax(-1)  # (B, T, V)
q_batch = torch.full_like(p_model, eps / V).scatter(
    -1, target.unsqueeze(-1), 1 - eps + eps / V
)
real = target != pad_id
assert torch.allclose(grad[real], (p_model - q_batch)[real] / real.sum())
assert grad[~real].abs().max() == 0

# %% [markdown]
# ## Where the loss is smallest
#
# The gradient $p - q$ vanishes exactly when the model predicts $q$. Let the model give $p_y$ to
# the right token and spread $1 - p_y$ over the others. In the figure, follow the two curves to
# the right: the unsmoothed loss keeps falling as the model grows
# more certain, rewarding ever larger logits; the smoothed loss turns back up, with its minimum,
# marked, at $p_y = q_y$.

# %%
p = torch.arange(0.01, 0.999 + 1e-9, 1e-4, dtype=torch.float64)  # (N,)
others = ((1 - p) / (V - 1)).unsqueeze(-1).repeat(1, V)  # (N, V)
sweep = others.scatter(1, torch.full((len(p), 1), y), p.unsqueeze(-1)).log()
right = torch.full((len(p),), y)
smoothed = LabelSmoothingLoss(pad_id=pad_id, reduction="none")
nll = LabelSmoothingLoss(pad_id=pad_id, smoothing=0.0, reduction="none")
curves = {"ε = 0.1": smoothed(sweep, right), "ε = 0 (NLL)": nll(sweep, right)}
best = p[curves["ε = 0.1"].argmin()].item()
print(f"minimum at p = {best:.4f}; 1 − ε + ε/V = {1 - eps + eps / V:.4f}")
assert abs(best - (1 - eps + eps / V)) < 1e-4
assert curves["ε = 0.1"].min().abs() < 1e-6  # the KL divergence reaches 0
assert curves["ε = 0 (NLL)"].argmin() == len(p) - 1  # at certainty

# %% tags=["hide-input", "nbval-ignore-output"]
from transformer.plots import use_book_renderer

use_book_renderer()
keep = [i for i in [*range(0, len(p), 25), len(p) - 1] if p[i] >= 0.5]
rows = [(p[i].item(), c[i].item(), e) for e, c in curves.items() for i in keep]
losses = pd.DataFrame(rows, columns=["p", "loss", "ε"]).round(4)
title = f"Loss against the confidence in the right token (V = {V})"
x = alt.X("p:Q", title="p(right token)", scale=alt.Scale(domain=[0.5, 1]))
y_axis = alt.Y("loss:Q", title="loss (nats)")
lines = (
    alt.Chart(losses, title=title).mark_line().encode(x, y_axis, color="ε:N")
)
best_point = alt.Chart(pd.DataFrame({"p": [best], "loss": [0.0]}))
marker = best_point.mark_point(filled=True, size=60, color="black")
(lines + marker.encode(x=x, y="loss:Q")).properties(width=480, height=240)

# %% [markdown]
# Hence "this hurts perplexity": a model that has learnt $q$ and is always right still gives the
# right token only $q_y$, so its perplexity cannot go below $1 / q_y$. Accuracy and BLEU only need
# the right token to be the most probable, and a model kept from extreme logits is better
# calibrated {cite:p}`muller2019does`.

# %%
for size in (V, V_wmt):
    q_y = 1 - eps + eps / size
    print(
        f"V = {size:>6,}: q_y = {q_y:.4f}, best NLL = {-math.log(q_y):.4f}"
        f" nats, perplexity >= {1 / q_y:.4f}"
    )

# %% [markdown]
# ## Summary
#
# - Label smoothing trains towards $q = (1 - \epsilon)\,\text{one-hot}(y) + \epsilon / V$, with the
#   paper's $\epsilon_{ls} = 0.1$ (Section 5.4).
# - The loss is $\mathrm{KL}(q \Vert p)$: PyTorch's label-smoothed cross-entropy minus $H(q)$,
#   padding ignored.
# - Its minimum is at $p_y = q_y$, not at certainty, so the perplexity cannot fall below $1 / q_y$.
#
# ## Exercises
#
# 1. Train without label smoothing, `python -m transformer train --pair de-en
#    --label-smoothing 0` (`TrainConfig(label_smoothing=0)`), and compare its validation
#    perplexity and its BLEU with a run at the paper's `--label-smoothing 0.1`.
# 2. Build `LabelSmoothingLoss(pad_id=pad_id, smoothing=0.3)` and redraw the figure above: where
#    does the minimum move, and how far does the loss at $p_y = 0.99$ rise?
