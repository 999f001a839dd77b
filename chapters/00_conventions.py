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
# # How to read this book
#
# Each chapter builds one piece of the Transformer {cite:p}`vaswani2017attention` and exports it
# into the Python package `transformer`: the cells marked `#| export` *are* the package's source
# (`make export` writes them to `transformer/<module>.py`), and the cells under them show and
# test what they do. This page fixes the conventions that every later chapter uses, and builds the
# one helper they share: the heatmap that draws attention weights and masks.

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
#| default_exp plots

# %% [markdown]
# ## Names and shapes
#
# The prose and the code use the same letters, and every `forward` documents the shapes it takes
# and returns.
#
# | name | meaning |
# | --- | --- |
# | `B` | sentences in a batch (batch first, always) |
# | `S`, `T` | source and target length, in subword tokens |
# | `L` | length of a sequence that can be source or target; in a key/value cache, positions held |
# | `T_q`, `T_k` | number of queries and of keys in one attention |
# | `H` | attention heads (`n_heads`) |
# | `V` | vocabulary size |
# | `d_model` | width of the residual stream: 512 in the paper's base model |
# | `d_k`, `d_v` | width of one head's queries and keys, and values: `d_model / H` |
# | `d_ff` | inner width of the feed-forward sublayer: 2048 in the base model |
# | `n_layers` | identical layers in the encoder and in the decoder: 6 in the paper |
#
# Source tensors are `(B, S, d_model)` and target tensors `(B, T, d_model)`.
#
# **One mask convention.** A mask is a boolean tensor broadcastable to `(B, H, T_q, T_k)` in
# which `True` means *may attend*; it is the convention of PyTorch's
# `torch.nn.functional.scaled_dot_product_attention`. Masks are made by small functions of their
# own (`padding_mask`, `causal_mask`), never by hand inside a layer.
#
# **Following the paper.** Every default is the paper's; every deviation is a named option that
# the text explains.
#
# ## Figures
#
# The figures are interactive [Altair](https://altair-viz.github.io) charts: hover for values,
# and where a chart has selectors, use them. In the built book they draw without a network
# connection, because the book serves the Vega libraries itself. The chapters call
# `use_book_renderer()` once so that each chart is stored in the notebook as HTML, which both the
# book and Colab can show, in the book's theme (its code is in the hidden cell below). The masks
# and attention weights of Part I are drawn by one function, `heatmap`.

# %% tags=["hide-input"]
#| export
"""Altair figures shared by the chapters (never imported by training or
translation)."""

import altair as alt
import pandas as pd
import torch


# The book's column is about 700 px wide: a legend goes under its chart, so
# that the chart keeps the column's width.
@alt.theme.register("book", enable=False)
def book_theme() -> alt.theme.ThemeConfig:
    return alt.theme.ThemeConfig(
        config={
            "view": {"continuousWidth": 300, "continuousHeight": 300},
            "legend": {"orient": "bottom"},
        }
    )


def use_book_renderer() -> None:
    """Render charts as HTML in the book's theme; the built book serves Vega
    itself, so they draw offline."""
    alt.renderers.enable("html")
    alt.theme.enable("book")
    alt.data_transformers.disable_max_rows()


# %% [markdown]
# `heatmap` draws a matrix with its row and column tokens on the axes:

# %%
#| export
def heatmap(
    matrix: torch.Tensor,
    *,
    x_labels: list[str] | None = None,
    y_labels: list[str] | None = None,
    x_title: str = "key",
    y_title: str = "query",
    value: str = "weight",
    title: str = "",
    scheme: str = "blues",
    cell: int = 28,
) -> alt.Chart:
    """A matrix as an Altair heatmap with token labels and tooltips; rows are
    y, columns x."""
    m = matrix.detach().float().cpu()
    rows, cols = m.shape
    x_labels = x_labels or [str(j) for j in range(cols)]
    y_labels = y_labels or [str(i) for i in range(rows)]
    # Position-prefixed labels keep repeated tokens ("the" twice) apart on the
    # axes.
    xs = [f"{j}:{t}" for j, t in enumerate(x_labels)]
    ys = [f"{i}:{t}" for i, t in enumerate(y_labels)]
    frame = pd.DataFrame(
        [
            {x_title: xs[j], y_title: ys[i], value: round(float(m[i, j]), 4)}
            for i in range(rows)
            for j in range(cols)
        ]
    )
    return (
        alt.Chart(frame, title=title)
        .mark_rect()
        .encode(
            x=alt.X(f"{x_title}:N", sort=xs, axis=alt.Axis(labelAngle=-45)),
            y=alt.Y(f"{y_title}:N", sort=ys),
            color=alt.Color(f"{value}:Q", scale=alt.Scale(scheme=scheme)),
            tooltip=[
                y_title,
                x_title,
                alt.Tooltip(f"{value}:Q", format=".3f"),
            ],
        )
        .properties(width=cell * cols, height=cell * rows)
    )


# %% [markdown]
# Rows are queries and columns are keys, with each token prefixed by its position so that a
# repeated word keeps its own row. A small example: a 4×4 matrix whose weights decay away from
# the diagonal, with each row summing to one.

# %%
from transformer.plots import heatmap, use_book_renderer

use_book_renderer()
tokens = ["a", "small", "example", "."]
distance = torch.arange(4).unsqueeze(0) - torch.arange(4).unsqueeze(1)
example = (-distance.abs().float()).softmax(dim=-1)
assert torch.allclose(example.sum(-1), torch.ones(4))
heatmap(
    example,
    x_labels=tokens,
    y_labels=tokens,
    title="Weights decaying with distance",
)
