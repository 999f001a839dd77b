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
# Every layer of the Transformer {cite:p}`vaswani2017attention` is a short stack of *sublayers*:
# an encoder layer has two, self-attention and a feed-forward network, and a decoder layer three.
# Section 3.1 says how they are joined: "We employ a residual connection {cite:p}`he2016deep`
# around each of the two sub-layers, followed by layer normalization {cite:p}`ba2016layer`. That
# is, the output of each sub-layer is $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$."
#
# This chapter writes the two pieces that are not attention, as the module
# `transformer.sublayers`: `PositionwiseFeedForward`, the network of Section 3.3, and
# `SublayerConnection`, the residual connection with dropout and layer normalisation that wraps
# every sublayer. The order of those last three operations has a history: many implementations,
# including the best-known annotated one, put the normalisation *first*. We explain the two
# orders, measure how they differ on a deep stack (in the scale of the signal going forward and of
# the gradients coming back), and default to the paper's.

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
#| default_exp sublayers

# %%
import altair as alt
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
# own by the same small network, two linear maps with a ReLU between them (Section 3.3,
# equation 2):
#
# $$
# \mathrm{FFN}(x) = \max(0,\; x W_1 + b_1)\, W_2 + b_2
# \qquad (2)
# $$
#
# with $W_1 \in \mathbb{R}^{d_\text{model} \times d_{ff}}$ and
# $W_2 \in \mathbb{R}^{d_{ff} \times d_\text{model}}$. The base model widens each vector from
# $d_\text{model} = 512$ to $d_{ff} = 2048$ and back. "While the linear transformations are the
# same across different positions, they use different parameters from layer to layer. Another
# way of describing this is as two convolutions with kernel size 1."
#
# The paper applies dropout to sublayer outputs, not inside the network; later implementations
# (tensor2tensor's `relu_dropout`, the Annotated Transformer) also drop the hidden ReLU units.
# That is the optional `dropout` argument, off by default.

# %%
#| export
"""The position-wise feed-forward network (Section 3.3) and the residual connection with
layer normalisation around every sublayer (Sections 3.1, 5.4) of Vaswani et al. (2017)."""

from collections.abc import Callable

import torch
from torch import Tensor, nn


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two linear maps at every position (3.3)."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        # Dropout on the hidden units is not in the paper (0 = off).
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """Apply equation (2) to each position's vector.

        Shapes:
            x: (..., d_model), typically (B, L, d_model)
            returns (..., d_model); the hidden layer is (..., d_ff)
        """
        return self.w_2(self.dropout(torch.relu(self.w_1(x))))


# %% [markdown]
# "Position-wise" means what it says: the network sees one vector at a time. Applying it to a
# whole batch of sequences gives exactly what applying it to each position separately gives, and
# it equals the paper's other description, a convolution over the positions with kernel size 1
# that shares the same weights.

# %%
from transformer.sublayers import PositionwiseFeedForward

ffn = PositionwiseFeedForward(d_model=512, d_ff=2048).eval()
x = torch.randn(2, 10, 512)  # (B, L, d_model)
whole = ffn(x)
one_by_one = torch.stack([ffn(x[:, t]) for t in range(10)], dim=1)  # (B, L, d_model)
assert whole.shape == (2, 10, 512)
assert torch.allclose(whole, one_by_one, atol=1e-6)

# The same weights as two 1-wide convolutions over the L positions: (B, d_model, L).
hidden = F.relu(F.conv1d(x.transpose(1, 2), ffn.w_1.weight.unsqueeze(-1), ffn.w_1.bias))
conv = F.conv1d(hidden, ffn.w_2.weight.unsqueeze(-1), ffn.w_2.bias).transpose(1, 2)
assert torch.allclose(whole, conv, atol=1e-5)

# Changing one position changes that position's output only.
x_changed = x.clone()
x_changed[:, 4] = torch.randn(2, 512)
moved = (ffn(x_changed) - whole).abs().amax(dim=(0, 2))  # (L,)
assert moved[4] > 0 and (moved[torch.arange(10) != 4] == 0).all()

# %% [markdown]
# The ReLU sets every negative pre-activation $x W_1 + b_1$ to zero, so for a given input only
# part of the $d_{ff}$ hidden units are active; at initialisation, on random inputs, about half:

# %%
with torch.no_grad():
    pre = ffn.w_1(x)  # (B, L, d_ff)
    post = torch.relu(pre)
assert torch.equal(post[pre < 0], torch.zeros(int((pre < 0).sum())))
active = (post > 0).float().mean().item()
assert abs(active - 0.5) < 0.02
print(f"hidden units active: {active:.3f}")

# %% [markdown]
# Small as it looks, the feed-forward network holds two thirds of an encoder layer's parameters.
# With the base sizes it has $2 \cdot d_\text{model} \cdot d_{ff} + d_{ff} + d_\text{model}$ of
# them, against $4(d_\text{model}^2 + d_\text{model})$ for the four projections of multi-head
# attention and their biases, and $2\, d_\text{model}$ for each of the layer's LayerNorms (a gain
# and a bias per feature, below). An encoder layer has one attention block and two LayerNorms; a
# decoder layer has two attention blocks and three LayerNorms, so there the feed-forward network
# holds just under half:

# %%
d_model, d_ff = 512, 2048
ffn_parameters = sum(p.numel() for p in ffn.parameters())
attention_parameters = 4 * (d_model * d_model + d_model)
norm_parameters = 2 * d_model  # one LayerNorm's gain γ and bias β
assert ffn_parameters == 2 * d_model * d_ff + d_ff + d_model
encoder_layer = attention_parameters + ffn_parameters + 2 * norm_parameters
decoder_layer = 2 * attention_parameters + ffn_parameters + 3 * norm_parameters
print(f"feed-forward: {ffn_parameters:,}   attention: {attention_parameters:,}")
print(f"feed-forward share of an encoder layer: {ffn_parameters / encoder_layer:.1%}")
print(f"feed-forward share of a decoder layer:  {ffn_parameters / decoder_layer:.1%}")
assert 0.66 < ffn_parameters / encoder_layer < 0.67
assert 0.49 < ffn_parameters / decoder_layer < 0.5

# %% [markdown]
# ## Residual connection, dropout and layer normalisation
#
# Three operations surround each sublayer.
#
# - **The residual connection** {cite:p}`he2016deep` adds the sublayer's input to its output,
#   $x + \mathrm{Sublayer}(x)$. The sublayer only has to learn a correction to $x$, and the
#   identity path gives the signal, and the gradient, a route around every sublayer. Whether that
#   route crosses a deep stack *unchanged* depends on where the normalisation sits, as we will see:
#   in the paper's order every LayerNorm lies on it. The residual connection is also why every
#   sublayer, and the embeddings, have the same width $d_\text{model}$.
# - **Dropout** (Section 5.4): "We apply dropout to the output of each sub-layer, before it is
#   added to the sub-layer input and normalized", with $P_\text{drop} = 0.1$ for the base model.
# - **Layer normalisation** {cite:p}`ba2016layer` rescales each position's vector to mean 0 and
#   variance 1 over its $d_\text{model}$ features, then applies a learned gain $\gamma$ and bias
#   $\beta$:
#   $\mathrm{LayerNorm}(v) = \gamma \odot (v - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$, with
#   $\mu$ and $\sigma^2$ the mean and variance of $v$'s entries. Unlike batch normalisation it
#   uses no statistics across the batch, so it behaves the same in training and at inference,
#   and for one sentence or many.
#
# The paper's order, *post-norm*, normalises after the addition:
#
# $$
# x \mapsto \mathrm{LayerNorm}\big(x + \mathrm{Dropout}(\mathrm{Sublayer}(x))\big)
# \qquad \text{(post-norm)}
# $$
#
# The alternative, *pre-norm*, normalises only the sublayer's input and leaves the residual
# stream itself un-normalised:
#
# $$
# x \mapsto x + \mathrm{Dropout}\big(\mathrm{Sublayer}(\mathrm{LayerNorm}(x))\big)
# \qquad \text{(pre-norm)}
# $$
#
# A pre-norm stack then needs one more layer normalisation after its last layer (the encoder and
# decoder chapters add it when `norm_first=True`); a post-norm stack already ends normalised.
# Only in pre-norm is the identity path untouched from the stack's input to that last
# LayerNorm: in post-norm the stream passes through one LayerNorm per sublayer, which rescales
# the signal on its way forward and the gradient on its way back.
#
# **Why two orders?** Pre-norm is what much code silently uses. The Annotated Transformer's text
# quotes the paper's $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$, while its code computes
# `x + self.dropout(sublayer(self.norm(x)))`, with only a docstring line, "for code simplicity the
# norm is first as opposed to last", to say so; readers who copy it get pre-norm without knowing.
# The authors' own tensor2tensor {cite:p}`vaswani2018tensor2tensor` switched its default
# `transformer_base` hyperparameters to pre-norm after the paper (`transformer_base_v2`). The reason
# is training stability. Xiong et al. {cite:p}`xiong2020layer` show that with post-norm the
# gradients of the parameters near the output are large at initialisation, so a large learning rate
# from the first step makes training diverge; the *warm-up* of the paper's learning-rate schedule
# (Section 5.3, the schedule chapter), which starts from a tiny learning rate, is what makes
# post-norm train. With pre-norm the gradients are well behaved, training works without warm-up, and
# deep stacks train more easily. This book follows the paper: `norm_first=False` is the default, and
# `norm_first=True` is the named option for the pre-norm order.


# %%
#| export
class SublayerConnection(nn.Module):
    """Residual connection, dropout and layer normalisation around one sublayer.

    Post-norm, the paper's order (norm_first=False): LayerNorm(x + Dropout(Sublayer(x))).
    Pre-norm (norm_first=True): x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(
        self, d_model: int, dropout: float = 0.1, norm_first: bool = False
    ) -> None:
        super().__init__()
        self.norm_first = norm_first
        # ε = 1e-6 as in the reference code (tensor2tensor); PyTorch's default is 1e-5.
        self.norm = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """Apply `sublayer` with its residual connection, in the order set by norm_first.

        Shapes:
            x: (B, L, d_model); sublayer maps (B, L, d_model) to (B, L, d_model)
            returns (B, L, d_model)
        """
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


# %% [markdown]
# The sublayer is passed in as a function, so that one class wraps attention (a closure that
# supplies the mask) and the feed-forward network alike. With dropout off, each order matches
# its formula computed by hand, with the layer normalisation written out:

# %%
from transformer.sublayers import SublayerConnection


def layer_norm(v: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """LayerNorm with γ = 1, β = 0 (their initial values), by hand."""
    mean = v.mean(-1, keepdim=True)
    var = v.var(-1, keepdim=True, unbiased=False)
    return (v - mean) / torch.sqrt(var + eps)


x = 3 + 2 * torch.randn(2, 10, 512)  # a residual stream far from mean 0, variance 1
post_norm = SublayerConnection(512, dropout=0.0).eval()
pre_norm = SublayerConnection(512, dropout=0.0, norm_first=True).eval()
with torch.no_grad():
    post_out, pre_out = post_norm(x, ffn), pre_norm(x, ffn)
    assert torch.allclose(post_out, layer_norm(x + ffn(x)), atol=1e-5)
    assert torch.allclose(pre_out, x + ffn(layer_norm(x)), atol=1e-5)

# A post-norm output is normalised at every position; a pre-norm output keeps x's scale.
statistics = pd.DataFrame(
    {
        "mean over features": [
            v.mean(-1).mean().item() for v in (x, post_out, pre_out)
        ],
        "std over features": [v.std(-1).mean().item() for v in (x, post_out, pre_out)],
    },
    index=["input x", "post-norm output", "pre-norm output"],
).round(3)
assert torch.allclose(post_out.mean(-1), torch.zeros(2, 10), atol=1e-5)
assert torch.allclose(post_out.std(-1, unbiased=False), torch.ones(2, 10), atol=1e-4)
statistics

# %% [markdown]
# In training mode, dropout acts on the sublayer's output only, never on the residual path:
# with a sublayer that returns zeros, dropout has nothing to drop and the connection passes
# $x$ through (normalised, in the paper's order) unchanged.

# %%
training = SublayerConnection(512, dropout=0.5, norm_first=True).train()
assert torch.equal(training(x, torch.zeros_like), x)
training.norm_first = False
assert torch.allclose(training(x, torch.zeros_like), layer_norm(x), atol=1e-5)

# %% [markdown]
# ## The two orders on a deep stack
#
# What changes in practice is the scale of the *residual stream*, the vector $x$ that flows from
# sublayer to sublayer. We stack 24 sublayer connections, each wrapping its own random
# feed-forward network ($d_\text{model} = 512$, $d_{ff} = 2048$, weight matrices initialised with
# Xavier/Glorot {cite:p}`glorot2010understanding` and biases at zero, as in our model), feed in a
# batch of random vectors with unit variance, and record the root mean square of $x$ after each
# connection, in evaluation mode, for both orders and the same networks.

# %%
n_connections = 24
networks = [PositionwiseFeedForward(d_model, d_ff) for _ in range(n_connections)]
for network in networks:
    for parameter in network.parameters():
        if parameter.dim() > 1:
            nn.init.xavier_uniform_(parameter)
        else:
            nn.init.zeros_(parameter)  # the biases
x0 = torch.randn(4, 32, d_model)  # (B, L, d_model), unit variance

rows = []
for order, norm_first in [("post-norm (paper)", False), ("pre-norm", True)]:
    connections = [
        SublayerConnection(d_model, norm_first=norm_first).eval() for _ in networks
    ]
    x = x0
    with torch.no_grad():
        for depth, (connection, network) in enumerate(
            zip(connections, networks, strict=True), start=1
        ):
            x = connection(x, network)
            rows.append(
                {"order": order, "depth": depth, "RMS": x.pow(2).mean().sqrt().item()}
            )
depth_scale = pd.DataFrame(rows).round(4)
rms = depth_scale.pivot(index="depth", columns="order", values="RMS")
rms.iloc[[0, 5, 11, 17, 23]]

# %% [markdown]
# Each pre-norm sublayer adds to the stream an update that is roughly uncorrelated with it and of
# roughly constant size, so the variances add up: the mean square grows linearly with depth,
# $\mathrm{RMS}^2 \approx a + c \cdot \text{depth}$, with $a$ near 1, the mean square of the
# input. A least-squares line through the measured mean squares gives $a$ and $c$, and the dashed
# curve $\sqrt{a + c \cdot \text{depth}}$ in the figure.

# %%
depths = torch.arange(1, n_connections + 1, dtype=torch.float64)
mean_square = torch.tensor(rms["pre-norm"].to_numpy(), dtype=torch.float64) ** 2
design = torch.stack([torch.ones_like(depths), depths], dim=1)
(intercept, slope) = torch.linalg.lstsq(
    design, mean_square.unsqueeze(1)
).solution.squeeze(1)
fitted = design @ torch.stack([intercept, slope])
r_squared = (
    1
    - ((mean_square - fitted) ** 2).sum()
    / ((mean_square - mean_square.mean()) ** 2).sum()
)
print(f"RMS² ≈ {intercept:.2f} + {slope:.3f} · depth   (R² = {r_squared:.4f})")
assert r_squared > 0.99 and abs(intercept - 1) < 0.1
assert (rms["post-norm (paper)"] - 1).abs().max() < 1e-3
assert rms["pre-norm"].iloc[-1] > 2 * rms["pre-norm"].iloc[0]

# %% [markdown]
# The figure shows the RMS of the residual stream after each sublayer connection. Look at the
# two solid lines: post-norm keeps the stream at RMS 1 after every layer, because each layer
# ends with a normalisation; pre-norm lets it grow, roughly like $\sqrt{\text{depth}}$ (the dashed
# curve), so that each further sublayer's update is a smaller and smaller share of the stream.
# That is the pre-norm trade-off in one picture: the identity path dominates, and the final layer
# normalisation of a pre-norm stack has real work to do. What it does to the gradients is
# measured after the figure.

# %%
from transformer.plots import use_book_renderer

use_book_renderer()
reference = pd.DataFrame(
    {
        "depth": depths.numpy(),
        "RMS": (intercept + slope * depths).sqrt().numpy(),
        "order": "√(a + c · depth), fitted",
    }
).round(4)
lines = (
    alt.Chart(depth_scale)
    .mark_line(point=True)
    .encode(
        x=alt.X("depth:Q", title="sublayer connections applied"),
        y=alt.Y(
            "RMS:Q", title="RMS of the residual stream", scale=alt.Scale(zero=True)
        ),
        color=alt.Color("order:N", title="order"),
        tooltip=["order", "depth", "RMS"],
    )
)
fit = (
    alt.Chart(reference)
    .mark_line(strokeDash=[4, 4], color="gray")
    .encode(x="depth:Q", y="RMS:Q", tooltip=["order", "depth", "RMS"])
)
(lines + fit).properties(
    width=520,
    height=260,
    title="Scale of the residual stream with depth, 24 random feed-forward sublayers",
)

# %% [markdown]
# **The gradients.** Xiong et al.'s reason to prefer pre-norm is the scale of the gradients, so we
# measure it on the same 24 networks: each stack (the pre-norm one with its final LayerNorm) is
# read out by a fixed random linear map, as an output layer would be, and we backpropagate that
# one number and take the norm of the gradient of each feed-forward network's parameters. The
# table gives it at five depths, divided by its value at the first sublayer. Read each column
# from top to bottom: in post-norm the gradient grows towards the output, to about four times its
# size at the bottom, because on its way down it passes through every LayerNorm and each one
# shrinks it a little; in pre-norm it travels down the untouched identity path and stays within
# 25% of its size at the bottom at every depth. In a post-norm stack the sublayers nearest the
# output get the largest gradients, which is Xiong et al.'s explanation of why a large learning
# rate at the first steps upsets post-norm training, and why it needs the warm-up.

# %%
readout = torch.randn(d_model)  # a fixed linear read-out of the stack's output
rows = []
for order, norm_first in [("post-norm (paper)", False), ("pre-norm", True)]:
    connections = [
        SublayerConnection(d_model, norm_first=norm_first).eval() for _ in networks
    ]
    final_norm = nn.LayerNorm(d_model, eps=1e-6) if norm_first else nn.Identity()
    for network in networks:
        network.zero_grad()
    x = x0
    for connection, network in zip(connections, networks, strict=True):
        x = connection(x, network)
    (final_norm(x) @ readout).mean().backward()
    for depth, network in enumerate(networks, start=1):
        gradient = torch.cat([p.grad.flatten() for p in network.parameters()])
        rows.append({"order": order, "depth": depth, "norm": gradient.norm().item()})
gradient_norm = pd.DataFrame(rows).pivot(index="depth", columns="order", values="norm")
relative = gradient_norm / gradient_norm.iloc[0]  # 1 at the first sublayer
shown = relative.iloc[[0, 5, 11, 17, 23]]
assert 3.5 < relative["post-norm (paper)"].iloc[-1] < 4.5
assert shown["post-norm (paper)"].is_monotonic_increasing
assert relative["pre-norm"].between(0.75, 1.25).all()
shown.round(2)

# %% [markdown]
# With `PositionwiseFeedForward` and `SublayerConnection` in hand, and multi-head attention from
# the chapter before last, the next chapter assembles them into an encoder layer:
# self-attention and a feed-forward network, each inside its own sublayer connection.
