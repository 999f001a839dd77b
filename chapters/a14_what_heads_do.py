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
# # What the heads do
#
# The paper's evidence for multi-head attention is an ablation: Table 3 trains models with other
# numbers of heads, and single-head attention is 0.9 BLEU worse (Section 6.2). A trained model
# can be asked directly: switch one head off, as `knocked_out` does (the appendix
# [Engineering the model](a02_model_engineering.ipynb)), and measure what is lost
# {cite:p}`michel2019sixteen,voita2019analyzing`. `python -m experiments.knockout_importance`
# translated part of the validation split greedily with each head of the shipped models off alone,
# then with more and more of them off, and stored the table that this page reads.

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
# experiments/ lies at the repository's root, beside chapters/ (Colab's set-up
# cell puts the clone's root on the path already).
import sys
from pathlib import Path

if (Path.cwd().parent / "experiments").is_dir():
    sys.path.insert(0, str(Path.cwd().parent))

# %%
import json

import altair as alt
import pandas as pd

from experiments.knockout_importance import RESULT
from transformer.knockout import KnockOut
from transformer.plots import use_book_renderer

use_book_renderer()
record = json.loads(RESULT.read_text())
print(
    f"validation BLEU on the first {record['sentences']} sentences,"
    f" {record['decoding']}; {record['machine']}, {record['threads']} threads"
)
KINDS = {
    "enc-self": "encoder self",
    "dec-self": "decoder self",
    "dec-cross": "encoder-decoder",
}
rows, points = [], []
for pair, found in record["pairs"].items():
    base = found["baseline_bleu"]
    print(f"{pair}: {base:.2f} with every head on")
    for entry in found["heads"]:
        [part] = KnockOut.parse(entry["part"]).parts
        change = round(entry["bleu"] - base, 2)
        rows.append(
            dict(pair=pair, part=entry["part"], attention=KINDS[part.kind],
                 layer=part.layer, head=part.head, change=change)
        )  # fmt: skip
    points += [dict(pair=pair, **point) for point in found["pruning"]]
heads, curve = pd.DataFrame(rows), pd.DataFrame(points)
print(
    f"{heads.layer.max()} layers of {heads['head'].max()} heads in each of"
    f" {len(KINDS)} kinds of attention"
)

# %% [markdown]
# ## Each head alone
#
# Each cell is one head: the change in BLEU when it alone is switched off, red for a loss.

# %%
most = heads.change.abs().max()  # a scale that is white at 0
alt.Chart(heads).mark_rect().encode(
    x=alt.X("head:O", axis=alt.Axis(labelAngle=0)),
    y=alt.Y("layer:O"),
    color=alt.Color(
        "change:Q",
        title="BLEU change, head off",
        scale=alt.Scale(scheme="redblue", domain=[-most, most]),
    ),
    tooltip=["pair", "part", alt.Tooltip("change:Q", format="+.2f")],
).properties(width=8 * 17, height=3 * 17).facet(
    row=alt.Row("attention:N", sort=list(KINDS.values()), title=None),
    column=alt.Column("pair:N", title=None),
)

# %%
for pair, group in heads.groupby("pair"):
    ranked = group.sort_values("change")
    most, least = ranked.iloc[0], ranked.iloc[-1]
    small = int((group.change.abs() < 0.5).sum())
    print(
        f"{pair}: most important {most.part} ({most.change:+.2f}), least"
        f" {least.part} ({least.change:+.2f}); {small} of {len(group)}"
        " heads change BLEU by less than 0.5 alone"
    )
    assert least.change > 0 and small > len(group) / 2
worst = heads.sort_values("change").iloc[0]
assert (worst.pair, worst.attention) == ("fr-en", "encoder-decoder")

# %% [markdown]
# Alone, few heads matter: most move BLEU by less than half a point, within what 300 sentences can
# tell apart, and some even raise it. The largest loss is one head of the French model's
# encoder-decoder attention.
#
# ## Switching heads off, least important first
#
# The heads are ranked by the BLEU left without each alone, and switched off cumulatively, as
# Michel et al. (2019, Figure 3) prune them.

# %%
alt.Chart(curve).mark_line(point=True).encode(
    x=alt.X("heads_left:Q", title="heads left", scale=alt.Scale(reverse=True)),
    y=alt.Y("bleu:Q", title="validation BLEU"),
    color=alt.Color("pair:N", title="pair"),
    tooltip=["pair", "heads_left", alt.Tooltip("bleu:Q", format=".2f")],
).properties(width=300, height=220)

# %%
for pair, found in record["pairs"].items():
    left = {p["heads_left"]: p["bleu"] for p in found["pruning"]}
    total = max(left)
    print(
        f"{pair}: {left[total]:.2f} with all {total} heads,"
        f" {left[total // 2]:.2f} with the least important half off,"
        f" {left[0]:.2f} with none"
    )
    kept = left[total // 2] / left[total]  # the share of BLEU left at half
    print(f"    {kept:.0%} of its BLEU with half of the heads")
    assert left[total - record["step"]] > left[total] - 0.5 and left[0] < 1
    assert kept < 0.5 if pair == "de-en" else 0.7 < kept < 0.9

# %% [markdown]
# Together the heads matter. The first few can go at no cost, and with none left BLEU is nearly 0;
# with the least important half off, the German model keeps less than half of its BLEU, the
# French one about four fifths.
#
# ## One head, live
#
# The French model's most important head switched off, on the first validation sentences whose
# greedy translation it changes:

# %%
from transformer.checked_data import load_pairs
from transformer.translation import load_pair_model, translate

model, tokenizer = load_pair_model("fr-en")
most = heads[heads.pair == "fr-en"].sort_values("change").iloc[0].part
sources = [source for source, _ in load_pairs("val", "fr-en")[:20]]
before = translate(model, tokenizer, sources, beam_size=1)
after = translate(model, tokenizer, sources, beam_size=1, knock_out=most)
changed = [i for i in range(len(sources)) if before[i] != after[i]]
print(f"{most} off changes {len(changed)} of {len(sources)} translations")
for i in changed[:2]:
    print(f"\n{sources[i]}\n  all on:  {before[i]}\n  off:     {after[i]}")
