# Generated from chapters/00_conventions.ipynb: edit it, not this file.
"""Altair figures shared by the chapters (never imported by training or
translation)."""

# %% auto #0
__all__ = ["book_theme", "use_book_renderer", "heatmap"]

# %% ../chapters/00_conventions.ipynb #fe146cb2

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


# %% ../chapters/00_conventions.ipynb #efdce984
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
