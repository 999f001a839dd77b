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
# # Feed-forward sublayers and residual connections
#
# Each layer of the Transformer {cite:p}`vaswani2017attention` is a short stack of *sublayers*,
# joined as Section 3.1 says: "We employ a residual
# connection {cite:p}`he2016deep` around each of the two sub-layers, followed by layer
# normalization {cite:p}`ba2016layer`. That is, the output of each sub-layer is
# $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$."
#
# This chapter writes `transformer.sublayers`: `PositionwiseFeedForward`, the network of
# Section 3.3, and `SublayerConnection`, which wraps every sublayer in that residual connection,
# dropout and layer normalisation; both read their sizes from `LayerConfig`, the multi-head
# chapter's `AttentionConfig` with the fields a whole layer needs.

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
#| default_exp sublayers

# %%
import altair as alt
import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)

# %% [markdown]
# ## The position-wise feed-forward network
#
# After attention has mixed information *between* positions, each position is transformed on its
# own by two linear maps with a ReLU between them (Section 3.3, equation 2):
#
# $$
# \mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2
# \qquad (2)
# $$
#
# with $W_1 \in \mathbb{R}^{d_\text{model} \times d_{ff}}$ and
# $W_2 \in \mathbb{R}^{d_{ff} \times d_\text{model}}$: "two convolutions with kernel size 1".
#
# **The layer's config.** `LayerConfig` extends `AttentionConfig` with what the rest of a layer
# needs: the inner width $d_{ff}$ and, for the residual connections below, the dropout rate
# $P_{drop}$ (Section 5.4), the order of the normalisation and LayerNorm's $\epsilon$. Its defaults
# are set from the paper's values, named once: the base model's $d_{ff}$ and $P_{drop}$ (Table 3)
# and, as the paper states no $\epsilon$, that of its reference code, tensor2tensor
# {cite:p}`vaswani2018tensor2tensor` (PyTorch's default is $10^{-5}$). The two options that the
# paper lacks are off: `ffn_dropout`, on the hidden units, and `norm_first`.

# %%
#| export layer_config
"""The sizes and options of one encoder or decoder layer (Sections 3.1, 3.3,
5.4): attention's, and those of its other sublayers."""

from dataclasses import dataclass

from transformer.attention_config import AttentionConfig

# The paper's base model (Table 3; Sections 3.3 and 5.4): d_ff = 2048, and
# P_drop = 0.1 on the output of each sublayer.
PAPER_D_FF = 2048
PAPER_DROPOUT = 0.1
# LayerNorm's ε, which the paper does not state: its reference code's.
TENSOR2TENSOR_LAYER_NORM_EPS = 1e-6


@dataclass(frozen=True, kw_only=True)
class LayerConfig(AttentionConfig):
    """An AttentionConfig, the feed-forward network's inner width, dropout on
    each sublayer's output, the normalisation's order and LayerNorm's ε."""

    d_ff: int = PAPER_D_FF
    dropout: float = PAPER_DROPOUT
    ffn_dropout: float = 0.0  # on the hidden units: not in the paper
    norm_first: bool = False  # pre-norm: not in the paper
    layer_norm_eps: float = TENSOR2TENSOR_LAYER_NORM_EPS


# %% [markdown]
# The network reads $d_\text{model}$, $d_{ff}$ and `ffn_dropout` from the config:

# %%
#| export
"""The position-wise feed-forward network (Section 3.3) and the residual
connection with layer normalisation around every sublayer (Sections 3.1, 5.4)
of Vaswani et al. (2017)."""

from collections.abc import Callable

import torch
from torch import Tensor, nn

from transformer.layer_config import LayerConfig


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two linear maps at every
    position (3.3)."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.w_1 = nn.Linear(config.d_model, config.d_ff)
        self.w_2 = nn.Linear(config.d_ff, config.d_model)
        # Dropout on the hidden units is not in the paper (0 = off).
        self.dropout = nn.Dropout(config.ffn_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x (..., d_model) -> (..., d_model), through (..., d_ff)."""
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))


# %% [markdown]
# Applied to a batch, the network gives what it gives position by position, and what the paper's
# 1-wide convolutions give:

# %%
from transformer.layer_config import (
    PAPER_D_FF,
    PAPER_DROPOUT,
    TENSOR2TENSOR_LAYER_NORM_EPS,
    LayerConfig,
)
from transformer.sublayers import PositionwiseFeedForward

print(f"the paper's d_ff {PAPER_D_FF} and P_drop {PAPER_DROPOUT}")
print(f"tensor2tensor's ε {TENSOR2TENSOR_LAYER_NORM_EPS}")
base = LayerConfig(d_model=512, d_ff=2048)  # 512 to 2048 and back
ffn = PositionwiseFeedForward(base).eval()
x = torch.randn(2, 10, 512)  # (B, L, d_model)
whole = ffn(x)
one_by_one = torch.stack([ffn(x[:, t]) for t in range(10)], dim=1)
assert torch.allclose(whole, one_by_one, atol=1e-6)

# The same weights as two convolutions of kernel size 1 over the positions.
w_1, w_2 = ffn.w_1.weight[..., None], ffn.w_2.weight[..., None]
hidden = F.relu(F.conv1d(x.transpose(1, 2), w_1, ffn.w_1.bias))
conv = F.conv1d(hidden, w_2, ffn.w_2.bias).transpose(1, 2)  # (B, L, d_model)
assert torch.allclose(whole, conv, atol=1e-5)

# %% [markdown]
# The network has $2 d_\text{model} d_{ff} + d_{ff} + d_\text{model}$ parameters, against
# $4(d_\text{model}^2 + d_\text{model})$ for attention and $2 d_\text{model}$ per LayerNorm: two
# thirds of an encoder layer, just under half of a decoder layer:

# %%
d_model, d_ff = base.d_model, base.d_ff
ffn_size = sum(p.numel() for p in ffn.parameters())
assert ffn_size == 2 * d_model * d_ff + d_ff + d_model
attention, norm = 4 * (d_model**2 + d_model), 2 * d_model
encoder_layer = attention + ffn_size + 2 * norm
decoder_layer = 2 * attention + ffn_size + 3 * norm
print(
    f"feed-forward share of an encoder layer: {ffn_size / encoder_layer:.1%}"
)
print(
    f"feed-forward share of a decoder layer:  {ffn_size / decoder_layer:.1%}"
)

# %% [markdown]
# ## Residual connection, dropout and layer normalisation
#
# Three operations surround each sublayer:
#
# - **The residual connection**, $x + \mathrm{Sublayer}(x)$: the sublayer learns a correction to
#   $x$, and signal and gradient have a route around it. Hence one width, $d_\text{model}$,
#   everywhere.
# - **Dropout** (Section 5.4), "to the output of each sub-layer, before it is added to the
#   sub-layer input and normalized", $P_{drop} = 0.1$.
# - **Layer normalisation** rescales each position's vector to mean 0 and variance 1 over its
#   features, then applies a learned gain $\gamma$ and bias $\beta$:
#   $\mathrm{LayerNorm}(v) = \gamma \odot (v - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$, with
#   no statistics across the batch.
#
# The paper's order, *post-norm*, normalises after the addition; *pre-norm* normalises only the
# sublayer's input and leaves the residual stream itself un-normalised:
#
# $$
# x \mapsto \mathrm{LayerNorm}\big(x + \mathrm{Dropout}(\mathrm{Sublayer}(x))\big)
# \qquad \text{(post-norm)}
# $$
#
# $$
# x \mapsto x + \mathrm{Dropout}\big(\mathrm{Sublayer}(\mathrm{LayerNorm}(x))\big)
# \qquad \text{(pre-norm)}
# $$
#
# A pre-norm stack therefore needs one more LayerNorm after its last layer; the encoder and the
# decoder add it when `norm_first=True`.
#
# Much later code is pre-norm (the Annotated Transformer, whose text quotes the paper's formula;
# tensor2tensor {cite:p}`vaswani2018tensor2tensor` after the paper), because it trains stably
# without a long warm-up {cite:p}`xiong2020layer`. The book follows the paper, `norm_first=False`
# (the appendix [Deviations from the paper](a01_deviations.ipynb) lists every option).


# %%
#| export
class SublayerConnection(nn.Module):
    """Residual connection, dropout and layer normalisation around one
    sublayer: LayerNorm(x + Dropout(Sublayer(x))), the paper's post-norm, or
    with norm_first, pre-norm x + Dropout(Sublayer(LayerNorm(x)))."""

    def __init__(self, config: LayerConfig) -> None:
        super().__init__()
        self.norm_first = config.norm_first
        self.norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, sublayer: Callable[[Tensor], Tensor]
    ) -> Tensor:
        """Shapes: x (B, L, d_model); sublayer and the result keep it."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


# %% [markdown]
# The sublayer is passed in as a function, so one class wraps attention (a closure that supplies
# the mask) and the feed-forward network alike. With dropout off, each order matches its formula
# computed by hand; a post-norm output is normalised at every position, a pre-norm output keeps
# $x$'s scale:

# %%
import dataclasses

from transformer.sublayers import SublayerConnection


def layer_norm(
    v: torch.Tensor, eps: float = base.layer_norm_eps
) -> torch.Tensor:
    """LayerNorm with γ = 1, β = 0 (their initial values), by hand."""
    mean = v.mean(-1, keepdim=True)
    var = v.var(-1, keepdim=True, unbiased=False)
    return (v - mean) / torch.sqrt(var + eps)


x = 3 + 2 * torch.randn(2, 10, 512)  # far from mean 0, variance 1
no_dropout = dataclasses.replace(base, dropout=0.0)
post_norm = SublayerConnection(no_dropout).eval()
pre_norm = SublayerConnection(
    dataclasses.replace(no_dropout, norm_first=True)
).eval()
with torch.no_grad():
    post_out, pre_out = post_norm(x, ffn), pre_norm(x, ffn)
    assert torch.allclose(post_out, layer_norm(x + ffn(x)), atol=1e-5)
    assert torch.allclose(pre_out, x + ffn(layer_norm(x)), atol=1e-5)
outputs = {"input x": x, "post-norm": post_out, "pre-norm": pre_out}
pd.DataFrame(
    {
        "mean over features": {k: v.mean().item() for k, v in outputs.items()},
        "std": {k: v.std(-1).mean().item() for k, v in outputs.items()},
    }
).round(3)

# %% [markdown]
# In training, dropout acts on the sublayer's output only, never on the residual path: a sublayer
# that returns zeros leaves $x$ unchanged (normalised, in post-norm).

# %%
training = SublayerConnection(
    dataclasses.replace(base, dropout=0.5, norm_first=True)
).train()
assert torch.equal(training(x, torch.zeros_like), x)
training.norm_first = False
assert torch.allclose(training(x, torch.zeros_like), layer_norm(x), atol=1e-5)

# %% [markdown]
# ## The two orders on a deep stack
#
# The orders differ in the scale of the *residual stream*, the $x$ passed from sublayer to
# sublayer. We stack 24 connections around random feed-forward networks (Xavier/Glorot weights
# {cite:p}`glorot2010understanding`, zero biases, as in our model), feed in unit-variance vectors,
# and record the root mean square (RMS) of $x$ after each connection. We also read the stack out
# through a fixed random linear map, backpropagate, and take the gradient norm of each network,
# relative to the first.

# %%
torch.manual_seed(0)
networks = [PositionwiseFeedForward(base) for _ in range(24)]
for network in networks:  # Glorot weights and zero biases, as in our model
    for linear in (network.w_1, network.w_2):
        nn.init.xavier_uniform_(linear.weight)
        nn.init.zeros_(linear.bias)
x0 = torch.randn(4, 32, d_model)  # (B, L, d_model), unit variance
readout = torch.randn(d_model)  # a fixed linear read-out of the stack


def run_stack(norm_first: bool) -> pd.DataFrame:
    """The stream's RMS after each connection; each network's gradient norm."""
    x, rms = x0, []
    for network in networks:
        network.zero_grad()
        order = dataclasses.replace(no_dropout, norm_first=norm_first)
        x = SublayerConnection(order).eval()(x, network)
        rms.append(x.pow(2).mean().sqrt().item())
    if norm_first:  # a pre-norm stack ends with one more LayerNorm
        x = nn.LayerNorm(d_model, eps=base.layer_norm_eps)(x)
    (x @ readout).mean().backward()
    grads = [
        torch.stack([p.grad.norm() for p in n.parameters()]).norm().item()
        for n in networks
    ]
    return pd.DataFrame({"RMS": rms, "gradient": np.array(grads) / grads[0]})


stacks = {"post-norm (paper)": run_stack(False), "pre-norm": run_stack(True)}
depth_scale = pd.concat(stacks, names=["order", "depth"]).reset_index()
depth_scale["depth"] += 1
table = depth_scale.pivot(index="depth", columns="order")
table.loc[[1, 6, 12, 18, 24]].round(2)

# %% [markdown]
# **The gradients**, relative to the first sublayer's: read each column downwards. In post-norm
# the gradient grows towards the output, to nearly five times its size at the bottom, since every
# LayerNorm on the way down shrinks it a little; in pre-norm it travels the untouched identity
# path and stays within 25%. Those large gradients near the output are why post-norm needs the
# warm-up.
#
# **The scale.** Each pre-norm sublayer adds an update of roughly constant size, uncorrelated with
# the stream, so the variances add up: $\mathrm{RMS}^2 \approx a + c \cdot \text{depth}$, with
# $a$ near 1. A least-squares line gives $a$ and $c$:

# %%
pre = depth_scale[depth_scale["order"] == "pre-norm"]
slope, intercept = np.polyfit(pre["depth"], pre["RMS"] ** 2, deg=1)
r_squared = np.corrcoef(pre["depth"], pre["RMS"] ** 2)[0, 1] ** 2
print(f"RMS² ≈ {intercept:.2f} + {slope:.3f} · depth   (R² = {r_squared:.4f})")

# %% [markdown]
# In the figure, post-norm holds the stream's RMS at 1, since every connection ends normalised;
# pre-norm lets it grow like $\sqrt{\text{depth}}$ (the dashed fit), so each further update is a
# smaller share of the stream and the final LayerNorm has real work to do.

# %% tags=["hide-input"]
from transformer.plots import use_book_renderer

use_book_renderer()
rms = depth_scale[["order", "depth", "RMS"]].round(3)
fit = rms[rms["order"] == "pre-norm"].assign(
    RMS=np.sqrt(intercept + slope * pre["depth"]).round(3)
)
x_axis = alt.X("depth:Q", title="sublayer connections applied")
lines = (
    alt.Chart(rms)
    .mark_line(point=True)
    .encode(x_axis, alt.Y("RMS:Q", title="RMS of the residual stream"))
    .encode(color="order:N")
)
dashed = alt.Chart(fit).mark_line(strokeDash=[4, 4], color="gray")
(lines + dashed.encode(x_axis, y="RMS:Q")).properties(
    width=520, height=260, title="The residual stream's scale with depth"
)

# %% [markdown]
# ## Summary
#
# - `PositionwiseFeedForward` is equation (2), position by position: most of a layer's
#   parameters.
# - `SublayerConnection` wraps any sublayer in a residual connection, dropout and LayerNorm:
#   post-norm as in the paper, or pre-norm with `norm_first=True`.
# - Post-norm keeps the stream at unit scale, but its gradients grow towards the output;
#   pre-norm keeps the gradients even and lets the stream grow.

# %% [markdown]
# ## Exercises
#
# 1. Stack 96 networks instead of 24. Does pre-norm's RMS still follow the fit, and how large
#    does post-norm's gradient ratio grow?
# 2. Switch on `PositionwiseFeedForward(LayerConfig(ffn_dropout=0.1))`: which
#    asserts of the position-wise cell still hold in training mode?
# 3. Train a pre-norm model: `norm_first=True` in the copy task of *Putting it together*, or
#    `python -m transformer train --pair de-en --config quick --set norm_first=true`.
