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
# `transformer.loss.LabelSmoothingLoss` and the metrics a validation loop reports.

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
# Transformer also leaves out the padding token. The chart shows the three side by side; compare
# the bars over *Hund* and over `<pad>`, which only the Annotated Transformer's variant leaves
# empty.

# %%
variants = {
    "ε/V (this book, PyTorch, Szegedy et al.)": q,
    "ε/(V−1) (fairseq, tensor2tensor)": torch.full((V,), eps / (V - 1)),
    "ε/(V−2), no <pad> (Annotated Transformer)": torch.full(
        (V,), eps / (V - 2)
    ),
}
variants["ε/(V−1) (fairseq, tensor2tensor)"][y] = 1 - eps
variants["ε/(V−2), no <pad> (Annotated Transformer)"][y] = 1 - eps
variants["ε/(V−2), no <pad> (Annotated Transformer)"][pad_id] = 0.0
for name, dist in variants.items():
    assert math.isclose(dist.sum().item(), 1.0, rel_tol=1e-6), name

targets = pd.DataFrame(
    [
        {
            "token": token,
            "variant": name,
            "probability": round(dist[v].item(), 4),
        }
        for name, dist in variants.items()
        for v, token in enumerate(vocab)
    ]
)

# %%
from transformer.plots import use_book_renderer

use_book_renderer()
alt.Chart(
    targets, title="Smoothed targets for the token “Hund” (V = 8, ε = 0.1)"
).mark_bar().encode(
    x=alt.X("token:N", sort=vocab, axis=alt.Axis(labelAngle=0)),
    xOffset=alt.XOffset("variant:N", sort=list(variants)),
    y=alt.Y(
        "probability:Q",
        title="probability (log-like scale)",
        scale=alt.Scale(type="symlog", constant=0.01),
        axis=alt.Axis(values=[0, 0.01, 0.02, 0.05, 0.2, 0.5, 1], format="~g"),
    ),
    color=alt.Color(
        "variant:N",
        sort=list(variants),
        legend=alt.Legend(
            orient="bottom", direction="vertical", labelLimit=400
        ),
    ),
    tooltip=["token", "variant", alt.Tooltip("probability:Q", format=".4f")],
).properties(width=480, height=220)

# %% [markdown]
# (The vertical axis is linear near zero and logarithmic above 0.01.) The three differ by about
# $\epsilon / V$, a few millionths for the paper's vocabulary of 37,000 tokens. The book spreads
# $\epsilon$ over all $V$ tokens, as Szegedy et al. and `F.cross_entropy(label_smoothing=ε)` do,
# so the loss can be tested against an implementation that is not ours.
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
# \mathrm{CE}_q(p) = (1 - \epsilon)\,\underbrace{(-\log p_y)}_{\text{NLL}}
# \;+\; \epsilon\,\underbrace{\Big(-\frac{1}{V}\sum_v \log p_v\Big)}_{\text{CE against uniform}},
# \qquad
# H(q) = -q_y \log q_y - (V - 1)\,\frac{\epsilon}{V}\log\frac{\epsilon}{V}.
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
"""Label smoothing (Vaswani et al. 2017, section 5.4) and the metrics a
validation loop reports."""

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


# %% [markdown]
# The constant $H(q)$, for the toy vocabulary and for the paper's:

# %%
from transformer.loss import LabelSmoothingLoss, smoothed_target_entropy

V_wmt = 37_000  # the paper's shared English-German vocabulary
for size in (V, V_wmt):
    print(
        f"V = {size:>6,}: H(q) = {smoothed_target_entropy(eps, size):.4f} nats"
    )
assert math.isclose(
    smoothed_target_entropy(eps, V), -(q * q.log()).sum().item(), rel_tol=1e-12
)

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
target[0, 4:] = (
    pad_id  # the first sentence has 4 tokens, the second 5, the third 6
)
target[1, 5:] = pad_id
log_probs = logits.log_softmax(dim=-1)

criterion = LabelSmoothingLoss(pad_id=pad_id, smoothing=eps)
ours = criterion(log_probs, target)
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
# With $\epsilon = 0$ the loss is the plain negative log-likelihood; `reduction="sum"` gives the
# mean times the number of real tokens (15 here), and `reduction="none"` the loss at each
# position, zero at padding:

# %%
nll = LabelSmoothingLoss(pad_id=pad_id, smoothing=0.0)(log_probs, target)
assert torch.allclose(
    nll,
    F.nll_loss(log_probs.view(-1, V), target.view(-1), ignore_index=pad_id),
)

n_tokens = (target != pad_id).sum()
summed = LabelSmoothingLoss(pad_id=pad_id, reduction="sum")(log_probs, target)
assert n_tokens == 15 and torch.allclose(summed, ours * n_tokens)
per_position = LabelSmoothingLoss(pad_id=pad_id, reduction="none")(
    log_probs, target
)
assert per_position.shape == (B, T) and torch.allclose(
    per_position.sum(), summed
)
assert per_position[target == pad_id].abs().max() == 0

# %% [markdown]
# Padded positions do not matter: scrambling the model's output there leaves the loss unchanged,
# and no gradient reaches them. An all-padding batch gives zero where PyTorch's loss gives NaN.

# %%
logits.requires_grad_(True)
loss = criterion(logits.log_softmax(-1), target)
(grad,) = torch.autograd.grad(loss, logits)
assert grad[target == pad_id].abs().max() == 0
# At a real position the gradient is (p − q) / (number of real tokens).
p_model = logits.detach().softmax(-1)
q_batch = torch.full_like(p_model, eps / V).scatter_add(
    -1,
    target.unsqueeze(-1),
    torch.full((B, T, 1), 1 - eps, dtype=torch.float64),
)
real = target != pad_id
assert torch.allclose(grad[real], (p_model - q_batch)[real] / real.sum())

scrambled = logits.detach().clone()
scrambled[target == pad_id] = 1e4 * torch.randn_like(
    scrambled[target == pad_id]
)
assert torch.allclose(criterion(scrambled.log_softmax(-1), target), loss)

all_pad = torch.full((B, T), pad_id)
theirs_all_pad = F.cross_entropy(
    logits.detach().view(-1, V), all_pad.view(-1), ignore_index=pad_id
)
print("ours:   ", criterion(log_probs, all_pad).item())
print("PyTorch:", theirs_all_pad.item())
assert criterion(log_probs, all_pad) == 0 and theirs_all_pad.isnan()

# %% [markdown]
# ## Where the loss is smallest
#
# The gradient with respect to the logits is $p - q$: it vanishes exactly when the model predicts
# $q$. Let the model give $p_y$ to the right token and spread $1 - p_y$ over the others. In the
# figure, follow the two curves to the right (the right panel zooms in): the unsmoothed loss keeps
# falling as the model grows more certain, rewarding ever larger logits; the smoothed loss turns
# back up, with its minimum, marked, at $p_y = q_y$.

# %%
p = torch.arange(0.01, 0.999 + 1e-9, 1e-4, dtype=torch.float64)  # (N,)
others = ((1 - p) / (V - 1)).unsqueeze(-1).expand(-1, V).clone()  # (N, V)
sweep_log_probs = others.scatter(
    1, torch.full((len(p), 1), y), p.unsqueeze(-1)
).log()
right = torch.full((len(p),), y)

curves = {
    "ε = 0.1 (KL to smoothed target)": LabelSmoothingLoss(
        pad_id=pad_id, smoothing=eps, reduction="none"
    )(sweep_log_probs, right),
    "ε = 0 (negative log-likelihood)": LabelSmoothingLoss(
        pad_id=pad_id, smoothing=0.0, reduction="none"
    )(sweep_log_probs, right),
}
smoothed = curves["ε = 0.1 (KL to smoothed target)"]
best = p[smoothed.argmin()].item()
print(f"minimum at p = {best:.4f}; 1 − ε + ε/V = {1 - eps + eps / V:.4f}")
assert abs(best - (1 - eps + eps / V)) < 1e-4
assert smoothed.min().abs() < 1e-6  # the KL divergence reaches zero there
assert curves["ε = 0 (negative log-likelihood)"].argmin() == len(p) - 1

# %%
# Every 50th point over the whole range, every 10th in the zoomed panel, and
# the last point.
coarse = sorted(set(range(0, len(p), 50)) | {len(p) - 1})
fine = [i for i in range(0, len(p), 10) if p[i] >= 0.8] + [len(p) - 1]
losses = pd.DataFrame(
    [
        {
            "p(right token)": round(p[i].item(), 4),
            "loss": round(c[i].item(), 4),
            "ε": name,
            "panel": panel,
        }
        for panel, rows in (("all", coarse), ("zoom", fine))
        for name, c in curves.items()
        for i in rows
    ]
)
minimum = pd.DataFrame(
    [
        {
            "p(right token)": round(best, 4),
            "loss": 0.0,
            "label": f"minimum, p = {best:.4f}",
        }
    ]
)


def loss_panel(panel: str, ticks: list[float], title: str) -> alt.LayerChart:
    lines = (
        alt.Chart(losses[losses.panel == panel], title=title)
        .mark_line()
        .encode(
            x=alt.X(
                "p(right token):Q",
                scale=alt.Scale(domain=[ticks[0], ticks[-1]]),
                axis=alt.Axis(values=ticks),
            ),
            y=alt.Y("loss:Q", title="loss (nats)"),
            color=alt.Color(
                "ε:N", title=None, legend=alt.Legend(orient="bottom")
            ),
            tooltip=["ε", "p(right token)", "loss"],
        )
    )
    marker = (
        alt.Chart(minimum)
        .mark_point(filled=True, size=60, color="black")
        .encode(x="p(right token):Q", y="loss:Q", tooltip=["label"])
    )
    if panel == "all":
        return (lines + marker).properties(width=300, height=240)
    label = marker.mark_text(align="right", dx=-8, dy=-10).encode(
        text="label:N"
    )
    return (lines + marker + label).properties(width=300, height=240)


(
    loss_panel("all", [0, 0.2, 0.4, 0.6, 0.8, 1], "p from 0.01 to 0.999")
    | loss_panel("zoom", [0.8, 0.85, 0.9, 0.95, 1], "zoomed: p from 0.8")
).properties(
    title=f"Loss against the model's confidence in the right token (V = {V})"
)


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
# ## Validation metrics
#
# Validation reports what does not depend on $\epsilon$: the unsmoothed negative log-likelihood
# per token, its perplexity (per subword token, `<eos>` included, as the paper's is "per
# wordpiece"), and the token accuracy, the share of real target positions whose most probable
# token is right. `token_stats` returns sums and counts, which add up across batches.

# %%
#| export
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


# %% [markdown]
# On the random batch above, two parts of the batch (the first sentence and the other two) add
# up to the whole, and the mean NLL is the loss with $\epsilon = 0$:

# %%
from transformer.loss import TokenStats, token_stats

stats = token_stats(log_probs, target, pad_id=pad_id)
halves = token_stats(log_probs[:1], target[:1], pad_id=pad_id) + token_stats(
    log_probs[1:], target[1:], pad_id=pad_id
)
assert halves.tokens == stats.tokens == 15 and halves.correct == stats.correct
assert math.isclose(halves.nll, stats.nll) and math.isclose(
    stats.nll, nll.item()
)
print(
    f"tokens {stats.tokens}, NLL {stats.nll:.4f}, perplexity"
    f" {stats.perplexity:.3f}, accuracy {stats.accuracy:.3f}"
)

# %% [markdown]
# On 10,000 positions with random logits, the accuracy is about one in $V$ and the perplexity of
# the order of $V$: the numbers a real model starts from.

# %%
g = torch.Generator().manual_seed(0)
random_logits = torch.randn(10_000, V, dtype=torch.float64, generator=g)
random_targets = torch.randint(1, V, (10_000,), generator=g)  # never <pad>
chance = token_stats(
    random_logits.log_softmax(-1), random_targets, pad_id=pad_id
)
print(f"accuracy {chance.accuracy:.3f} (1/V = {1 / V:.3f})")
print(f"perplexity {chance.perplexity:.1f}")
assert (
    abs(chance.accuracy - 1 / V) < 0.01 and V / 2 < chance.perplexity < 2 * V
)

# %% [markdown]
# ## Summary
#
# - Label smoothing trains towards $q = (1 - \epsilon)\,\text{one-hot}(y) + \epsilon / V$, with the
#   paper's $\epsilon_{ls} = 0.1$ (Section 5.4).
# - The loss is $\mathrm{KL}(q \Vert p)$: PyTorch's label-smoothed cross-entropy minus $H(q)$,
#   padding ignored.
# - Its minimum is at $p_y = q_y$, not at certainty, so the perplexity cannot fall below $1 / q_y$.
# - Validation reports the unsmoothed NLL, perplexity and accuracy per token.
#
# ## Exercises
#
# 1. Train without label smoothing, `python -m transformer train --pair de-en
#    --label-smoothing 0` (`TrainConfig(label_smoothing=0)`), and compare its validation
#    perplexity and its BLEU with a run at the default 0.1.
# 2. Build `LabelSmoothingLoss(pad_id=pad_id, smoothing=0.3)` and redraw the figure above: where
#    does the minimum move, and how far does the loss at $p_y = 0.99$ rise?
