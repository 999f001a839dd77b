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
# # The book's models
#
# The training chapter built the loop and chose a recipe for Multi30k, `multi30k_recipe`. This
# chapter is about the two models that the recipe trained on a GPU and that the book ships,
# German→English in `checkpoints/de-en` and French→English in `checkpoints/fr-en`: how their
# training went against the project's targets, which words their remaining loss comes from,
# whether two runs together or a temperature on their predictions do better, and how fast they
# trained. Its second half, "The comparison runs", is the evidence for the recipe's choices: the
# other recipes that were tried, on the GPU and on the CPU, set against the shipped runs.
#
# Nothing here trains. The figures come from the metrics files in `checkpoints/`, or from the
# shipped weights scored on the machine that runs the chapter; the chapters after this one
# translate with the same weights.

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
#| default_exp words

# %%
import json
from pathlib import Path

import altair as alt
import pandas as pd
import torch

from transformer.plots import use_book_renderer
from transformer.train import read_jsonl

torch.manual_seed(0)
torch.set_printoptions(precision=4)
use_book_renderer()

# %% [markdown]
# ## Two models and their targets
#
# Each shipped folder holds a model card (`README.md`) that gives the exact command that trained its
# model. Both were trained on one NVIDIA H100 80GB HBM3 (PyTorch 2.11, CUDA 13), each in about seven
# minutes while seven other runs of the same sweep shared the GPU, with
# `python tools/gpu_sweep.py long`. The targets that the project set for them, on the validation
# split and per word, are a perplexity of at most 6 with a token accuracy of at least 70% for
# German→English, and at most 4 with at least 78% for French→English (for comparison, the project's
# brief quotes a published notebook implementation of this task at 13.4 and 62.0%, and 7.0 and
# 74.3%).
#
# Their curves come from the `metrics.jsonl` that each shipped folder holds: one record per
# epoch, measured on the whole validation split without dropout, and one for the average of the
# last five epochs. (The runs were given a time limit; the `partial` record after epoch 35 is the
# part of a 36th epoch they trained before the limit, which the average leaves out.)

# %%
from transformer.decode import CHECKPOINTS_DIR  # the folder the translate command reads

TARGETS = {
    "de-en": (6.0, 0.70),
    "fr-en": (4.0, 0.78),
}  # (ppl/word at most, accuracy at least)
shipped_runs = pd.concat(
    [
        pd.DataFrame(read_jsonl(CHECKPOINTS_DIR / pair / "metrics.jsonl")).assign(
            pair=pair
        )
        for pair in TARGETS
    ],
    ignore_index=True,
)
epoch_rows = shipped_runs[shipped_runs["kind"] == "epoch"]
averages = shipped_runs[shipped_runs["kind"] == "average"].set_index("pair")
summary = pd.DataFrame(
    {
        "epochs": epoch_rows.groupby("pair")["epoch"].max().astype(int),
        "updates": epoch_rows.groupby("pair")["step"].max(),
        "minutes": (epoch_rows.groupby("pair")["wall_time"].max() / 60).round(1),
        "best epoch ppl/word": epoch_rows.groupby("pair")["val_ppl_word"]
        .min()
        .round(2),
        "average ppl/word": averages["val_ppl_word"].round(2),
        "average accuracy": averages["val_accuracy"].round(4),
        "target ppl/word": {k: v[0] for k, v in TARGETS.items()},
        "target accuracy": {k: v[1] for k, v in TARGETS.items()},
    }
)
summary["target met"] = (summary["average ppl/word"] <= summary["target ppl/word"]) & (
    summary["average accuracy"] >= summary["target accuracy"]
)
summary

# %% [markdown]
# The validation perplexity per word (left, on a logarithmic scale) and the token accuracy
# (right) after each epoch; the dashed lines are the targets, in the colour of their pair, and
# the diamonds at the end are the averaged models. Look at the shape: the perplexity falls fast
# for the first ten epochs, then more and more slowly, and is still falling at epoch 35; the
# average of the last five epochs is better than every single epoch, on both measures.

# %%
curves = shipped_runs[shipped_runs["kind"] != "partial"]
curves = curves.assign(
    what=curves["kind"].map({"epoch": "epoch", "average": "average of last 5"})
)[["pair", "epoch", "what", "val_ppl_word", "val_accuracy", "val_loss"]].round(4)
targets = pd.DataFrame(
    [
        {"pair": k, "val_ppl_word": v[0], "val_accuracy": v[1]}
        for k, v in TARGETS.items()
    ]
)
colour = alt.Color("pair:N", title="pair")


def _panel(field: str, title: str, log: bool) -> alt.LayerChart:
    scale = alt.Scale(type="log") if log else alt.Scale(zero=False)
    base = alt.Chart(curves).encode(
        x=alt.X("epoch:Q", title="epoch"),
        y=alt.Y(f"{field}:Q", title=title, scale=scale),
        color=colour,
        tooltip=["pair", "epoch", "what", field],
    )
    line = base.transform_filter(alt.datum.what == "epoch").mark_line(point=True)
    average = base.transform_filter(alt.datum.what != "epoch").mark_point(
        shape="diamond", size=120, filled=True
    )
    rule = (
        alt.Chart(targets)
        .mark_rule(strokeDash=[4, 4])
        .encode(y=f"{field}:Q", color=colour)
    )
    return (line + average + rule).properties(width=300, height=230)


# the average beats every single epoch, on both measures
by_pair = epoch_rows.groupby("pair")
assert (averages["val_ppl_word"] < by_pair["val_ppl_word"].min()).all()
assert (averages["val_accuracy"] > by_pair["val_accuracy"].max()).all()
alt.hconcat(
    _panel("val_ppl_word", "validation perplexity per word", log=True),
    _panel("val_accuracy", "validation token accuracy", log=False),
).properties(title="The book's models: validation after each epoch")

# %% [markdown]
# ## Which words
#
# A figure per word depends on what counts as a word, and so does an accuracy. The training loop
# divides the total NLL by the whitespace-separated words of the references and counts `<eos>` in
# the loss but not as a word (the training chapter's section "What validation measures"), and it
# counts its accuracy over its own BPE tokens. Word-level implementations, such as the published
# notebook above, predict spaCy's tokens, punctuation marks included, and then `<eos>`; they report
# the perplexity per predicted token (more units for the same sentences, so a lower figure for the
# same predictions) and the share of those tokens predicted right.
#
# `word_level_evaluation` scores a model in both units at once. Since the BPE vocabulary never
# merges across spaCy's tokens, every piece belongs to exactly one of them, and a word-level
# token counts as right when, fed the reference prefix, the model's most probable next piece is
# the reference's at each of its pieces: the greedy counterpart of a word-level model's most
# probable word. The perplexities are the same total NLL over $W$ whitespace words or over
# $W'$ word-level tokens, so they convert into each other:
# $\log \mathrm{ppl}_{W'} = \log \mathrm{ppl}_{W} \cdot W / W'$.

# %%
#| export
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from transformer.data import DATA_DIR, Tokenizer, collate, normalize, pretokenize
from transformer.train import batch_log_probs


@dataclass(frozen=True)
class UnitScore:
    """One word-level token of a reference under teacher forcing: its text (spaCy's token,
    `None` for `<eos>`) and, for each of its BPE pieces, the NLL and whether the model's most
    probable next piece was that piece."""

    text: str | None
    nll: tuple[float, ...]
    hits: tuple[bool, ...]

    @property
    def correct(self) -> bool:
        return all(self.hits)


@dataclass(frozen=True)
class WordLevel:
    """Teacher-forced scores of a split, counted in three units: the model's BPE tokens (as
    the training loop counts them), whitespace words W, and word-level tokens W' (spaCy's
    tokens and one `<eos>` per sentence, what word-level models predict)."""

    words: int  # W
    scores: tuple[UnitScore, ...]  # one per word-level token, in order: W' of them

    @property
    def units(self) -> int:
        """W'."""
        return len(self.scores)

    @property
    def nll_sum(self) -> float:
        """Over every BPE token and `<eos>`: the training loop's validation NLL."""
        return sum(self.piece_nll.values())

    @property
    def units_correct(self) -> int:
        return sum(u.correct for u in self.scores)

    def _by_kind(self) -> dict[str, list[tuple[float, bool]]]:
        kinds: dict[str, list[tuple[float, bool]]] = {
            "first piece": [],
            "later piece": [],
            "<eos>": [],
        }
        for u in self.scores:
            pieces = list(zip(u.nll, u.hits, strict=True))
            if u.text is None:
                kinds["<eos>"] += pieces
            else:
                kinds["first piece"].append(pieces[0])
                kinds["later piece"] += pieces[1:]
        return kinds

    @property
    def pieces(self) -> dict[str, tuple[int, int]]:
        """Kind of BPE piece -> (correct, count)."""
        kinds = self._by_kind().items()
        return {k: (sum(h for _, h in v), len(v)) for k, v in kinds}

    @property
    def piece_nll(self) -> dict[str, float]:
        """Kind of BPE piece -> the NLL summed over its positions."""
        kinds = self._by_kind().items()
        return {k: sum(n for n, _ in v) for k, v in kinds}

    @property
    def accuracy(self) -> float:
        """BPE token accuracy, the training loop's `val_accuracy`."""
        pieces = self.pieces.values()
        return sum(c for c, _ in pieces) / sum(n for _, n in pieces)

    @property
    def unit_accuracy(self) -> float:
        return self.units_correct / self.units

    @property
    def ppl_word(self) -> float:
        return math.exp(self.nll_sum / self.words)

    @property
    def ppl_unit(self) -> float:
        return math.exp(self.nll_sum / self.units)


@torch.no_grad()
def word_level_evaluation(
    model: nn.Module,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 64,
) -> WordLevel:
    """Score (source, English reference) texts with teacher forcing, word by word (needs spaCy).

    A word-level token counts as correct when, fed the reference prefix, the model's most
    probable next piece is the reference's at each of its BPE pieces: the greedy counterpart
    of a word-level model's most probable word. BPE never merges across spaCy's tokens, so
    every piece belongs to exactly one of them.
    """
    if not pairs:
        raise ValueError("word_level_evaluation needs at least one sentence pair")
    src_lang = tokenizer.languages[0]
    sources = tokenizer.encode_words(pretokenize([s for s, _ in pairs], src_lang))
    references = pretokenize([r for _, r in pairs], "en")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    scores: list[UnitScore] = []
    for start in range(0, len(pairs), batch_size):
        texts = references[start : start + batch_size]  # spaCy's tokens per sentence
        segments = [tokenizer.encode_words([(t,) for t in tokens]) for tokens in texts]
        examples = [
            (src, [i for word in words for i in word])
            for src, words in zip(
                sources[start : start + batch_size], segments, strict=True
            )
        ]
        batch = collate(
            examples,
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
        ).to(device)
        log_probs = batch_log_probs(model, batch, pad_id=tokenizer.pad_id).float()
        target = batch.tgt_out.unsqueeze(-1)
        nll = (-log_probs.gather(-1, target).squeeze(-1)).tolist()
        right = (log_probs.argmax(-1) == batch.tgt_out).tolist()
        for nll_row, hit_row, words, tokens in zip(
            nll, right, segments, texts, strict=True
        ):
            at = 0
            for word, token in zip(words, tokens, strict=True):
                end = at + len(word)
                scores.append(
                    UnitScore(token, tuple(nll_row[at:end]), tuple(hit_row[at:end]))
                )
                at = end
            scores.append(UnitScore(None, (nll_row[at],), (hit_row[at],)))
    model.train(was_training)
    return WordLevel(
        words=sum(len(normalize(r).split()) for _, r in pairs), scores=tuple(scores)
    )


# %% [markdown]
# The shipped models, scored on the validation split (their float16 weights, on this machine's
# CPU; the training loop's figures above, from the float32 average, agree to the second
# decimal):

# %%
from transformer.data import load_pairs
from transformer.train import load_model
from transformer.words import word_level_evaluation

word_level = {
    pair: word_level_evaluation(
        *load_model(CHECKPOINTS_DIR / pair), load_pairs("val", pair)
    )
    for pair in TARGETS
}
units = pd.DataFrame(
    {
        pair: {
            "ppl per word (W)": w.ppl_word,
            "ppl per word-level token (W')": w.ppl_unit,
            "BPE token accuracy": w.accuracy,
            "word-level token accuracy": w.unit_accuracy,
            "target ppl": TARGETS[pair][0],
            "target accuracy": TARGETS[pair][1],
        }
        for pair, w in word_level.items()
    }
).T
# perplexities to two decimals: the fourth moves with the CPU's floating-point kernels
ppl_columns = ["ppl per word (W)", "ppl per word-level token (W')"]
units = units.round(dict.fromkeys(ppl_columns, 2)).round(4)
units["targets met per word (W)"] = summary["target met"]
units["targets met per word-level token (W')"] = (
    units["ppl per word-level token (W')"] <= units["target ppl"]
) & (units["word-level token accuracy"] >= units["target accuracy"])
w = word_level["de-en"]
print(f"validation: W = {w.words:,} words, W' = {w.units:,} word-level tokens")
units

# %% [markdown]
# Why the two accuracies differ: the BPE accuracy by kind of piece. A word the vocabulary
# splits is a rare one, and the pieces after its first are the model's weakest predictions;
# the BPE accuracy counts each of them, the word-level accuracy counts the word once (right
# only if all its pieces are). `<eos>`, nearly always right, weighs a little more among the
# fewer word-level tokens.

# %%
pd.DataFrame(
    {
        (pair, column): {
            kind: value
            for kind, (correct, count) in w.pieces.items()
            for value in [correct / count if column == "accuracy" else count]
        }
        for pair, w in word_level.items()
        for column in ("accuracy", "positions")
    }
).round(4)

# %% [markdown]
# ## Where the loss goes
#
# The perplexity is an average of the NLL, and an average hides where the NLL comes from. Group the
# word-level tokens of the validation references by how often the same token occurs in the training
# split's English side: a word the model saw hundreds of times costs it little, a word it never saw
# must be spelled out piece by piece, each piece a guess. In the chart, compare the two bars of each
# group: the share of the word-level tokens that fall in it (left bar) against the share of the
# total NLL they carry (right bar).

# %%
#| export
from collections import Counter

from transformer.data import load_split

FREQUENCY_GROUPS = (
    (0, "never"),
    (1, "once"),
    (2, "2-4"),
    (5, "5-19"),
    (20, "20-99"),
    (100, "100+"),
)  # (least count, name)


def english_training_counts(data_dir: Path = DATA_DIR) -> Counter[str]:
    """How often each of spaCy's English tokens occurs in the training split, the target side
    of both pairs (needs spaCy)."""
    english = load_split("train", "en", data_dir)
    return Counter(token for tokens in pretokenize(english, "en") for token in tokens)


def frequency_group(unit: UnitScore, counts: Mapping[str, int]) -> str:
    """The group of a word-level token by how often `counts` has it; `<eos>` is its own."""
    if unit.text is None:
        return "<eos>"
    count = counts.get(unit.text, 0)
    return [name for least, name in FREQUENCY_GROUPS if count >= least][-1]


def by_frequency(
    w: WordLevel, counts: Mapping[str, int]
) -> dict[str, dict[str, float]]:
    """Group -> the number of its word-level tokens, their NLL and how many are right."""
    names = [name for _, name in FREQUENCY_GROUPS] + ["<eos>"]
    groups = {name: {"tokens": 0, "nll": 0.0, "correct": 0} for name in names}
    for unit in w.scores:
        group = groups[frequency_group(unit, counts)]
        group["tokens"] += 1
        group["nll"] += sum(unit.nll)
        group["correct"] += unit.correct
    return groups


# %%
train_counts = english_training_counts()
groups = [name for _, name in FREQUENCY_GROUPS] + ["<eos>"]
by_count = pd.DataFrame(
    [
        {"pair": pair, "seen in training": name, **group}
        for pair, w in word_level.items()
        for name, group in by_frequency(w, train_counts).items()
    ]
)
by_count["accuracy"] = by_count["correct"] / by_count["tokens"]
totals = by_count.groupby("pair")[["tokens", "nll"]].transform("sum")
by_count["share of word-level tokens"] = by_count["tokens"] / totals["tokens"]
by_count["share of the NLL"] = by_count["nll"] / totals["nll"]
by_count["NLL per token (nats)"] = by_count["nll"] / by_count["tokens"]
shares = by_count.melt(
    id_vars=["pair", "seen in training", "NLL per token (nats)", "accuracy"],
    value_vars=["share of word-level tokens", "share of the NLL"],
    var_name="measure",
    value_name="share",
).round(4)
alt.Chart(shares).mark_bar().encode(
    x=alt.X("seen in training:N", sort=groups, title="times seen in training"),
    xOffset=alt.XOffset("measure:N", sort=["share of word-level tokens"]),
    y=alt.Y("share:Q", axis=alt.Axis(format="%"), title="share"),
    color=alt.Color("measure:N", title=None, sort=["share of word-level tokens"]),
    tooltip=["pair", "seen in training", "measure", "share", "NLL per token (nats)"],
).properties(width=300, height=200).facet(column=alt.Column("pair:N", title=None))

# %% [markdown]
# Words seen fewer than twice in training are 2% of the word-level tokens and carry more than a
# fifth of the NLL, about 14 to 21 nats each, and the model almost never guesses them; words seen at
# least a hundred times are three quarters of the tokens and less than half of the NLL, under one
# nat each. (Tokens are counted as spaCy writes them, case kept.) The costliest words of the
# French→English model show what the rare ones are: mostly ordinary English words (some with odd
# casing or spelling in the references) that the 29,000 training captions lack, spelled out in three
# to six pieces at a cost of more than 35 nats each.

# %%
fr_costly = sorted(
    (u for u in word_level["fr-en"].scores if u.text is not None),
    key=lambda u: -sum(u.nll),
)[:8]
pd.DataFrame(
    {
        "word": [u.text.lstrip("▁") for u in fr_costly],
        "seen in training": [train_counts[u.text] for u in fr_costly],
        "BPE pieces": [len(u.nll) for u in fr_costly],
        "NLL (nats)": [round(sum(u.nll), 1) for u in fr_costly],
    }
)

# %% [markdown]
# This is where a subword model and a word-level one differ most. A word-level model keeps a
# vocabulary, typically the training tokens seen at least twice, and maps every other word to
# one `<unk>` token: at these positions it only has to predict that *some* rare word comes,
# one class that covers 2% of the tokens, and a perplexity computed on `<unk>`-mapped
# references never charges it for which word. Our model is charged for every piece of the
# word. The table measures the words such a vocabulary (built on the training split's
# English tokens) would lack, and our model's perplexity over the word-level tokens it would
# keep. That second figure is not a word-level perplexity (the dropped positions would cost a
# word-level model something), so it says where the distance to the targets lies, not that
# they are met: the targets stay judged as set, with every word spelled out.

# %%
rows = {}
for pair, w in word_level.items():
    kept = [u for u in w.scores if u.text is None or train_counts[u.text] >= 2]
    kept_nll = sum(sum(u.nll) for u in kept)
    lacked = w.units - len(kept)
    rows[pair] = {
        "word-level tokens it lacks": lacked / w.units,
        "their share of the NLL": 1 - kept_nll / w.nll_sum,
        "their NLL per token (nats)": (w.nll_sum - kept_nll) / lacked,
        "NLL per token of the others (nats)": kept_nll / len(kept),
        "ppl per word-level token, all": w.ppl_unit,
        "ppl per word-level token, the others": math.exp(kept_nll / len(kept)),
    }
oov = pd.DataFrame(rows).T.round(4)
oov

# %%
for pair in word_level:
    rare = by_count[
        (by_count["pair"] == pair)
        & by_count["seen in training"].isin(["never", "once"])
    ]
    common = by_count.set_index(["pair", "seen in training"]).loc[(pair, "100+")]
    # rare words: few tokens, a large share of the loss; common words the reverse
    assert rare["share of word-level tokens"].sum() < 0.025
    assert rare["share of the NLL"].sum() > 0.2
    assert common["share of word-level tokens"] > 0.7
    assert common["share of the NLL"] < 0.5 and common["NLL per token (nats)"] < 1
    assert (rare["NLL per token (nats)"] > 13).all() and (rare["accuracy"] < 0.05).all()
    assert oov.loc[pair, "their share of the NLL"] > 0.2
    assert oov.loc[pair, "word-level tokens it lacks"] < 0.025
assert all(35 < sum(u.nll) < 60 and 3 <= len(u.nll) <= 6 for u in fr_costly)

# %% [markdown]
# So neither model meets its targets as they were set: per whitespace word, the training loop's
# convention. Read in the unit of word-level implementations instead, the German→English model
# meets both and the French→English model neither: its perplexity is about 10% too high and its
# accuracy about one point short, and its perplexity over the word-level tokens that a
# min-count-2 vocabulary keeps is 3.14: the distance lies in the 2% of rare words. (We wrote
# this evaluation after the runs; it played no part in choosing the shipped ones, which were
# chosen by the training loop's perplexity.) BPE-dropout, a remedy aimed at the rare words, did
# worse than the CPU baseline it was tried against (German→English, dropout 0.2, 20 epochs), and
# the recipe in the pre-norm order ended within chance of the recipe for French→English, and
# for German→English 3.7% behind it with three layers and 1% behind with four, while the
# recipe itself with another seed ended 3.6% behind, and dropout 0.4 far behind (all in the
# comparison runs, below). Training that seed-1 run on to 60 epochs lowered its average by
# 2.8%, a seventh of the gap. The next runs that might close the gap, each with two seeds, are
# prepared as `python tools/gpu_sweep.py targets`, `targets-fr` and `targets-long` and not yet
# run: for French→English, four layers in the pre-norm order, another vocabulary size, and an
# average of ten epochs; for both pairs, 60 epochs with an average of ten.

# %%
for pair, w in word_level.items():
    # the training loop's figures, measured again from the shipped weights
    average = averages.loc[pair]
    assert abs(w.ppl_word - average["val_ppl_word"]) < 0.02
    assert abs(w.accuracy - average["val_accuracy"]) < 0.002
    # a later piece is the hardest prediction, <eos> the easiest
    acc = {kind: c / n for kind, (c, n) in w.pieces.items()}
    assert acc["later piece"] < acc["first piece"] < acc["<eos>"]
met = units["targets met per word-level token (W')"]
assert met["de-en"] and not met["fr-en"]
assert not units["targets met per word (W)"].any()
fr = word_level["fr-en"]
assert fr.ppl_unit > 4.0 and fr.unit_accuracy < 0.78
assert abs(oov.loc["fr-en", "ppl per word-level token, the others"] - 3.14) < 0.01

# %% [markdown]
# ## Two runs together
#
# How much of the French→English distance would a second run of the recipe close, if both were kept?
# An *ensemble* averages the probabilities of several models at each token. The shipped run and the
# recipe with seed 1 on the CPU (the section on the pre-norm order, below) were scored together that
# way, teacher-forced on the validation split as above, with `tools/ensemble_report.py`, which keeps
# the result beside the seed-1 run's metrics. An ensemble is not a model the book ships: translating
# with one runs both models at every step, and the targets are set for one model. It measures how
# far chance and a second run could go.

# %%
seed_1_folder = CHECKPOINTS_DIR / "fr-en" / "comparison" / "recipe-seed-1-cpu"
ensemble_report = json.loads((seed_1_folder / "ensemble.json").read_text())
together = pd.DataFrame(
    [
        {**scores, "model": label}
        for label, scores in zip(
            ["shipped (seed 0, GPU)", "recipe, seed 1 (CPU)", "the two as an ensemble"],
            [*ensemble_report["members"], ensemble_report["ensemble"]],
            strict=True,
        )
    ]
).set_index("model")[["ppl_word", "accuracy", "ppl_unit", "unit_accuracy"]]
together.columns = [
    "ppl/word",
    "token accuracy",
    "ppl per word-level token",
    "word-level token accuracy",
]
together.round(4)

# %% [markdown]
# Together the two runs reach 5.25 per word, 10.5% below the shipped model alone, and a token
# accuracy of 75.4% against 74.7%; per word-level token, 4.04 and 77.6%. That is far more than a
# second seed moved the recipe on its own (1.1%), and still a third above the target of 4 per
# word, and short of both targets even in the word-level unit. Whatever closes the distance has to
# make one model better than two of these together.

# %%
shipped_alone, second_seed, both_runs = together.to_numpy()
# the members are the runs as scored above: the shipped weights, and the seed-1 run's report
assert abs(shipped_alone[0] - averages.loc["fr-en", "val_ppl_word"]) < 0.02
assert abs(shipped_alone[2] - word_level["fr-en"].ppl_unit) < 1e-3  # the same weights
seed_1_report = json.loads((seed_1_folder / "word_level.json").read_text())
assert abs(second_seed[2] - seed_1_report["ppl_unit"]) < 1e-9
# what the seed moved alone, and the two together
assert round(second_seed[0] / shipped_alone[0] - 1, 3) == 0.011
assert (
    round(both_runs[0], 2) == 5.25
    and round(1 - both_runs[0] / shipped_alone[0], 3) == 0.105
)
assert round(both_runs[1], 3) == 0.754 and round(shipped_alone[1], 3) == 0.747
assert [round(both_runs[2], 2), round(both_runs[3], 3)] == [4.04, 0.776]
# short of both French→English targets, per word and per word-level token
assert both_runs[0] > 1.3 * TARGETS["fr-en"][0] and both_runs[1] < TARGETS["fr-en"][1]
assert both_runs[2] > TARGETS["fr-en"][0] and both_runs[3] < TARGETS["fr-en"][1]

# %% [markdown]
# ## Is it the label smoothing?
#
# The paper notes that label smoothing "hurts perplexity, as the model learns to be more unsure",
# and both models were trained with $\epsilon_{ls} = 0.1$. If their probabilities were merely too
# flat, sharpening them would lower the perplexity without changing a single prediction: divide the
# logits $z$ by a *temperature* $T$ before the softmax, $p_T = \mathrm{softmax}(z / T)$, with
# $T < 1$. The most probable token stays the same for every $T > 0$, so the accuracy cannot move;
# only the perplexity can. (The model returns log-probabilities $z - \log \sum e^{z}$, a constant
# shift of the logits per position, and the softmax ignores such shifts: dividing the
# log-probabilities by $T$ gives the same $p_T$.) Below, the perplexity per token of each shipped
# model against $T$, relative to $T = 1$, on the whole validation split and on 1,014 sentence pairs
# drawn at random from the training split (as many as the validation split has): solid lines for
# validation, dashed for the training sample. Look at where each curve has its lowest point.
# Choosing $T$ on the validation split itself, the split that is scored, is an oracle: its gain is
# the most that one temperature could give.

# %%
from collections.abc import Iterable, Sequence

import numpy as np
from torch import nn

from transformer.data import (
    Batch,
    EncodedSplit,
    Tokenizer,
    collate,
    iterate_batches,
    load_encoded,
)
from transformer.train import batch_log_probs, count_words

TEMPERATURES = [round(0.8 + 0.025 * k, 3) for k in range(19)]  # 0.8 to 1.25


@torch.no_grad()
def nll_by_temperature(
    model: nn.Module,
    batches: Iterable[Batch],
    temperatures: Sequence[float],
    *,
    pad_id: int,
) -> tuple[list[float], int]:
    """The total NLL of the reference tokens, the logits divided by each temperature,
    and the number of those tokens (teacher forcing, in eval mode)."""
    model.eval()
    totals, tokens = torch.zeros(len(temperatures), dtype=torch.float64), 0
    for batch in batches:
        log_probs = batch_log_probs(model, batch, pad_id=pad_id).float()
        keep = batch.tgt_out != pad_id
        log_probs = log_probs[keep]  # (N, V): the N positions that are not padding
        target = batch.tgt_out[keep].unsqueeze(-1)  # (N, 1)
        for k, t in enumerate(temperatures):
            tempered = torch.log_softmax(log_probs / t, dim=-1)
            totals[k] -= tempered.gather(-1, target).sum().double()
        tokens += int(keep.sum())
    return totals.tolist(), tokens


def random_pairs(
    data: EncodedSplit,
    tokenizer: Tokenizer,
    count: int,
    *,
    seed: int = 0,
    batch_size: int = 64,
) -> list[Batch]:
    """`count` pairs of a split drawn at random without replacement, in batches."""
    picked = np.random.default_rng(seed).choice(len(data), size=count, replace=False)
    return [
        collate(
            [data[i] for i in chunk],
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            index=chunk,
        )
        for chunk in np.array_split(picked, -(-count // batch_size))
    ]


tempered_rows, val_words = [], {}
for pair in TARGETS:
    model, tokenizer = load_model(CHECKPOINTS_DIR / pair)
    val_split = load_encoded(pair, "val")
    val_words[pair] = count_words(tokenizer, val_split)
    splits = {
        "validation": iterate_batches(val_split, tokenizer, shuffle=False),
        "training sample": random_pairs(
            load_encoded(pair, "train"), tokenizer, len(val_split)
        ),
    }
    for name, batches in splits.items():
        totals, tokens = nll_by_temperature(
            model, batches, TEMPERATURES, pad_id=tokenizer.pad_id
        )
        at_one = totals[TEMPERATURES.index(1.0)]
        tempered_rows += [
            {
                "pair": pair,
                "split": name,
                "temperature": t,
                "ppl/token": math.exp(nll / tokens),
                "relative to T = 1": math.exp((nll - at_one) / tokens),
                "nll": nll,
            }
            for t, nll in zip(TEMPERATURES, totals, strict=True)
        ]
tempered = pd.DataFrame(tempered_rows)
# to 2 and 3 decimals: the next ones move with the CPU's floating-point kernels
plotted = tempered[["pair", "split", "temperature", "ppl/token", "relative to T = 1"]]
plotted = plotted.round({"ppl/token": 2, "relative to T = 1": 3})
at_t_1 = alt.Chart(pd.DataFrame({"temperature": [1.0]}))
rule = at_t_1.mark_rule(color="grey").encode(x="temperature:Q")
curves_t = (
    alt.Chart(plotted)
    .mark_line()
    .encode(
        x=alt.X("temperature:Q", title="temperature T", scale=alt.Scale(zero=False)),
        y=alt.Y(
            "relative to T = 1:Q",
            title="perplexity per token, relative to T = 1",
            scale=alt.Scale(zero=False),
        ),
        color=alt.Color("pair:N", title="pair"),
        strokeDash=alt.StrokeDash(
            "split:N",
            title=None,
            scale=alt.Scale(
                domain=["validation", "training sample"], range=[[1, 0], [5, 3]]
            ),
        ),
        tooltip=["pair", "split", "temperature", "ppl/token", "relative to T = 1"],
    )
)
(rule + curves_t).properties(
    width=420, height=260, title="Sharper (T < 1) or flatter (T > 1) probabilities"
)

# %% [markdown]
# On the sentences it was trained on, each model is too unsure, as label smoothing teaches it to be:
# its best temperature is 0.9, and sharpening lowers its perplexity there by about 2%. On the
# validation sentences the curves have their lowest point just above $T = 1$, at 1.025 for both
# pairs: held-out predictions are wrong often enough that the model's flatness is about right for
# them, even a little too sharp, and the best temperature lowers the perplexity per word by less
# than half a percent (7.49 against 7.51, 5.84 against 5.87). The temperature fitted on the training
# sample would raise it by 6% to 7%. So the smoothing's unsureness is not what keeps the perplexity
# above its targets, and no temperature closes any visible part of the gap: the runs that change
# $\epsilon_{ls}$ itself are compared below.

# %%
assert len(val_split) == 1_014  # and as many training pairs, drawn at random
best = tempered.loc[tempered.groupby(["pair", "split"])["nll"].idxmin()].set_index(
    ["pair", "split"]
)
for pair in TARGETS:
    val_rows = tempered[
        (tempered["pair"] == pair) & (tempered["split"] == "validation")
    ]
    val_rows = val_rows.set_index("temperature")
    ppl_word = np.exp(val_rows["nll"] / val_words[pair])
    # at T = 1, the training loop's figure for the shipped average
    assert abs(ppl_word[1.0] - averages.loc[pair, "val_ppl_word"]) < 0.02
    # too unsure on training pairs: the best T sharpens, and gains about 2%
    assert best.loc[(pair, "training sample"), "temperature"] == 0.9
    assert 0.975 < best.loc[(pair, "training sample"), "relative to T = 1"] < 0.985
    # on validation the best T is just above 1 and gains less than half a percent per word
    assert best.loc[(pair, "validation"), "temperature"] == 1.025
    assert 0.995 < ppl_word.min() / ppl_word[1.0] < 1
    assert [round(ppl_word.min(), 2), round(ppl_word[1.0], 2)] == {
        "de-en": [7.49, 7.51],
        "fr-en": [5.84, 5.87],
    }[pair]
    # the training sample's best temperature, used on validation: 6% to 7% worse per word
    assert 1.05 < ppl_word[0.9] / ppl_word[1.0] < 1.07

# %% [markdown]
# ## How fast
#
# The model is small for an H100: each update launches many small kernels, and the GPU probably
# waits for Python more than it computes (we did not profile it). `tools/gpu_bench.py` measured the
# training loop alone on the GPU, two epochs of German→English per variant, the second one timed
# (one timing each, not a median; the repeated row shows the noise), with the recipe's model at
# dropout 0.2, its dropout when this was measured: target tokens per second (padding excluded) and
# MFU, the formula of the training chapter's section "Counting the work" over the epoch's time and
# the card's measured bf16 rate of 790 TFLOP/s. The paper's base model on the paper's batches of
# 25,000 tokens shows what the same loop does with enough work per kernel, and what bfloat16
# autocast buys then. Every row's MFU is against the bf16 rate, the float32 rows included: it says
# how much of the card's best the run uses. (The shipped runs, sharing the GPU with seven others,
# record 0.2% MFU in their metrics. These MFUs were measured before the count charged the
# cross-attention's key and value projections to the source positions, as it now does; over
# Multi30k's training pairs that adds 0.17% to the count for German→English and 0.55% for
# French→English, less than the noise between two timings.)

# %%
bench = pd.DataFrame(json.loads((CHECKPOINTS_DIR / "throughput-h100.json").read_text()))
pd.DataFrame(
    {
        "device": bench["device"],
        "tokens/s": bench["tokens_per_s"].round(-2).astype(int),
        "MFU (%)": (100 * bench["mfu"]).round(2),
        "updates per epoch": bench["updates_per_epoch"],
    }
).set_axis(bench["variant"])

# %% [markdown]
# For the recipe's model, bfloat16 autocast is slower than float32 (it adds a conversion before most
# matrix products, and the products were not the bottleneck): the recipe trains in float32. For the
# base model on large batches, bfloat16 is more than twice as fast. Even then the MFU is about 10%:
# the rest of the time goes, presumably, to what is not a matrix product (softmax, layer norm,
# dropout, the optimizer; not profiled), which `torch.compile` could fuse; its measurement did not
# fit into the GPU time this book had. The repeated measurement of the same variant shows the noise:
# compare the rows as ratios, not to the last digit.

# %%
speed = bench.set_index("variant")["tokens_per_s"]
assert min(speed["recipe fp32"], speed["recipe fp32 (repeated)"]) > speed["recipe bf16"]
assert speed["base-25k bf16"] > 2 * speed["base-25k fp32"]
assert bench.set_index("variant").loc["base-25k bf16", "mfu"] < 0.2
# the shipped runs' own records, on the shared GPU: about 0.2%
assert (epoch_rows.groupby("pair")["mfu"].median().round(3) == 0.002).all()
# How much charging N_kv to the source positions moves the count over the training pairs.
from transformer.data import load_encoded
from transformer.model import Transformer
from transformer.train import (
    cross_attention_kv_parameters,
    multi30k_recipe,
    training_flops,
)

recipe_model = Transformer(multi30k_recipe("de-en").model_config(8000))
n_kv = cross_attention_kv_parameters(recipe_model)
for pair, expected in (("de-en", 0.0017), ("fr-en", 0.0055)):
    split = load_encoded(pair, "train")
    # with the source's <eos>, and the target's <bos> (input) or <eos> (output)
    src_len, tgt_len = split.src_lengths + 1, split.tgt_lengths + 1
    now = training_flops(recipe_model, src_lengths=src_len, tgt_lengths=tgt_len).sum()
    moved = 6 * n_kv * (src_len - tgt_len).sum()
    assert round(moved / (now - moved), 4) == expected, pair

# %% [markdown]
# ## The comparison runs
#
# Each shipped folder keeps the `metrics.jsonl` and `train_config.json` of the other recipes tried,
# in `comparison/<name>/`. Those whose names contain `cpu` were trained on the project's 2-core CPU;
# the others on the same H100 as the shipped runs, several at a time, and those that hit the time
# limit were closed at their last whole epoch, like the shipped ones. Not everything else is equal:
# eight GPU runs (`dropout-0.2` and `4-layers` for both pairs, German→English's `no-label-smoothing`
# and its three `base` runs) trained under bfloat16 autocast, the default when they ran, where the
# shipped, `d_ff-1024` and `110-epochs` runs trained in float32, and several stopped before 35
# epochs (the table's `epochs` and `trained on` columns). Next to the small gaps below, read those
# comparisons as indications. Three more runs of the sweep that trained the shipped ones,
# $d_{ff} = 1024$ with dropout 0.25 (one for each pair) and the base model with dropout 0.3 at the
# lower learning rate, are not among them: their records are not in the repository. The runs:
#
# - `dropout-0.1-cpu`: the recipe with the paper's dropout of 0.1, 20 epochs, trained on the
#   project's 2-core CPU (the book's first shipped model);
# - `dropout-0.2`: dropout 0.2, 32 epochs;
# - `110-epochs`: the recipe itself (dropout 0.3) trained for 110 epochs (French→English 111),
#   the two pairs' runs alone on the GPU; their first 35 epochs repeat the shipped runs' records
#   exactly (the same seed, float32), so they are those runs continued, not second samples;
# - `d_ff-1024`: the recipe with $d_{ff} = 1024$, the "small" preset's width (7.6M parameters);
# - `4-layers`: 4 + 4 layers (7.3M parameters);
# - `recipe-pre-norm-cpu` and `recipe-pre-norm-cpu-seed-1`: the recipe itself in the pre-norm
#   order for its 35 epochs, with seeds 0 and 1 (the section "Depth and where the norm goes");
#   for German→English also `recipe-4-layers-pre-norm-cpu` and
#   `recipe-4-layers-pre-norm-cpu-seed-1`, the same with 4 + 4 layers;
# - `recipe-seed-1-cpu`: the recipe itself with seed 1, in the paper's post-norm order for its
#   35 epochs, on the CPU (the section "The recipe's own seed, and more dropout");
# - German→English only, on the CPU, for the recipe's 35 epochs in the paper's post-norm order:
#   `dropout-0.4-cpu`, the recipe with dropout 0.4 (the same section); and
#   `label-smoothing-0.05-cpu` and `label-smoothing-0.2-cpu`, the recipe with
#   $\epsilon_{ls} = 0.05$ and $0.2$ (the section "How much label smoothing"); and
#   `tokens-1500-cpu` and `tokens-6000-cpu`, the recipe with batches of at most 1,500 and
#   6,000 tokens per side instead of 3,000 (the section "How many tokens per batch"); and
#   `recipe-seed-1-cpu-60-epochs`, the seed-1 run continued from its epoch 35 to 60 (the
#   section "A longer run with its own average");
# - German→English only, on the GPU: `no-label-smoothing`, dropout 0.2 and
#   $\epsilon_{ls} = 0$, the twin of `dropout-0.2`; and three runs of the paper's base model
#   (6 + 6 layers, $d_{model} = 512$, $d_{ff} = 2048$, 48M parameters) on our batches and
#   warm-up: `base` with the recipe's learning-rate factor and the paper's dropout of 0.1,
#   `base-lr-0.45` with a factor of 0.45 (the paper's peak learning rate of
#   $7 \cdot 10^{-4}$), and `base-dropout-0.3`.
#
# German→English only, on the project's 2-core CPU, eleven twins of one 20-epoch run, **the CPU
# baseline** `dropout-0.2-cpu` (the recipe's model with dropout 0.2, seed 0), each changing one
# thing, or two where the list names both (a vocabulary and a seed, depth and a learning rate, depth
# and the order):
#
# - chance: `dropout-0.2-cpu-seed-1`, the CPU baseline with seed 1 (other initial weights,
#   batches and dropout masks), which measures what chance alone does;
# - the vocabulary: `vocab-4000-cpu` (with seed 0 and, as `vocab-4000-cpu-seed-1`, seed 1) and
#   `vocab-12000-cpu`, a joint BPE vocabulary of 4,000 or 12,000 entries, not 8,000;
# - dropout inside the sublayers: `inner-dropout-cpu`, dropout 0.1 also on the attention
#   weights and after the feed-forward network's ReLU, as tensor2tensor
#   {cite:p}`vaswani2018tensor2tensor` and fairseq offer;
# - BPE-dropout at $p = 0.1$ (the data chapter's last section): `bpe-dropout-cpu` on both
#   sides, stopped after 10 of its 20 epochs, and `bpe-dropout-source-cpu` on the German side
#   only;
# - depth and the order of the sublayers (the section "Depth and where the norm goes"):
#   `4-layers-cpu`, `4-layers-lr-0.35-cpu`, `4-layers-pre-norm-cpu` and `pre-norm-cpu`.
#
# For each run: its number of epochs, its best epoch and that epoch's validation perplexity per
# word, the highest it had, its average of the last five epochs, the order of its sublayers and
# where it trained:

# %%
from transformer.config import TransformerConfig
from transformer.train import TrainConfig

recipe = multi30k_recipe("de-en")


def model_of(train_config: dict) -> TransformerConfig:
    """The model config of a run, from its training config."""
    config = TrainConfig.from_dict(train_config)
    return config.model_config(config.vocab_size)


def recipe_label(train_config: dict) -> str:
    """A run's recipe in a few words: its depth, width, dropout, smoothing and vocabulary,
    and what else differs from the recipe (learning rate, inner dropout, pre-norm)."""
    config = TrainConfig.from_dict(train_config)
    m = config.model_config(config.vocab_size)
    extras = [
        f"lr factor {config.lr_factor}" if config.lr_factor != recipe.lr_factor else "",
        f"attention/FFN dropout {m.attention_dropout}/{m.ffn_dropout}"
        if m.attention_dropout or m.ffn_dropout
        else "",
        "pre-norm" if m.norm_first else "",
    ]
    return ", ".join(
        [
            f"{m.n_layers}+{m.n_layers} layers, d_model {m.d_model}, d_ff {m.d_ff}",
            f"dropout {m.dropout}, ls {config.label_smoothing}",
            f"vocab {config.vocab_size:,}",
            *filter(None, extras),
        ]
    )


def trained_on(name: str, train_config: dict) -> str:
    """Where a run trained: the project's CPU (float32), or the H100, in float32 or under
    bfloat16 autocast (`bf16` unset was the default then: autocast on a GPU)."""
    if "cpu" in name.split("-"):
        return "CPU"
    return "GPU, float32" if train_config.get("bf16") is False else "GPU, bfloat16"


def runs_of(pair: str):
    """(name, train config, metrics) of the shipped run and of each comparison run."""
    folder = CHECKPOINTS_DIR / pair
    yield (
        "shipped",
        json.loads((folder / "config.json").read_text())["train"],
        read_jsonl(folder / "metrics.jsonl"),
    )
    for sub in sorted(p for p in (folder / "comparison").iterdir() if p.is_dir()):
        config = json.loads((sub / "train_config.json").read_text())
        yield sub.name, config, read_jsonl(sub / "metrics.jsonl")


all_runs = pd.concat(
    [
        pd.DataFrame(metrics).assign(
            pair=pair,
            run=name,
            recipe=f"{name} ({trained_on(name, config)}): {recipe_label(config)}",
            pre_norm=model_of(config).norm_first,
            trained_on=trained_on(name, config),
        )
        for pair in TARGETS
        for name, config, metrics in runs_of(pair)
    ],
    ignore_index=True,
)
run_epochs = all_runs[all_runs["kind"] == "epoch"]
# A run continued for more epochs after it ended has an average for each end: the last counts.
run_averages = (
    all_runs[all_runs["kind"] == "average"]
    .drop_duplicates(["pair", "run"], keep="last")
    .set_index(["pair", "run"])
)
grouped = run_epochs.groupby(["pair", "run"])
comparison = pd.DataFrame(
    {
        "epochs": grouped["epoch"].max().astype(int),
        "best epoch": run_epochs.loc[grouped["val_ppl_word"].idxmin()]
        .set_index(["pair", "run"])["epoch"]
        .astype(int),
        "best epoch ppl/word": grouped["val_ppl_word"].min().round(2),
        "highest ppl/word": grouped["val_ppl_word"].max().round(0),
        "average ppl/word": run_averages["val_ppl_word"].round(2),
        "average accuracy": run_averages["val_accuracy"].round(4),
        "order": grouped["pre_norm"]
        .first()
        .map({False: "post-norm", True: "pre-norm"}),
        "trained on": grouped["trained_on"].first(),
    }
)
machines = comparison["trained on"].value_counts()
assert machines["CPU"] == 28 and machines["GPU, bfloat16"] == 8
# The 110-epoch runs repeat the shipped runs' first 35 epochs to the last stored digit.
for pair in TARGETS:
    shipped_run, longer = (
        run_epochs[(run_epochs["pair"] == pair) & (run_epochs["run"] == name)]
        for name in ("shipped", "110-epochs")
    )
    for column in ("train_loss", "val_loss", "val_ppl_word", "val_accuracy"):
        assert list(longer[column][: len(shipped_run)]) == list(shipped_run[column])
comparison

# %% [markdown]
# The same runs as curves, all but the 110-epoch runs, which have a figure of their own below,
# and the CPU twins, which have theirs further down (`dropout-0.1-cpu`, the book's first
# model, is here; the legend names where each run trained).
# The axis stops at a perplexity of 200, so the first epochs, and the base model that diverged,
# leave the frame. What to look for: where each curve turns up or flattens, and which curve is
# lowest at the end.

# %%
CPU_TWINS = [
    "dropout-0.2-cpu",
    "vocab-4000-cpu",
    "vocab-4000-cpu-seed-1",
    "vocab-12000-cpu",
    "inner-dropout-cpu",
    "dropout-0.2-cpu-seed-1",
    "bpe-dropout-cpu",
    "bpe-dropout-source-cpu",
    "4-layers-cpu",
    "4-layers-lr-0.35-cpu",
    "pre-norm-cpu",
    "4-layers-pre-norm-cpu",
    "recipe-pre-norm-cpu",  # 35 epochs, both pairs
    "recipe-pre-norm-cpu-seed-1",
    "recipe-4-layers-pre-norm-cpu",  # 35 epochs, German→English
    "recipe-4-layers-pre-norm-cpu-seed-1",
    "recipe-seed-1-cpu",  # 35 epochs, both pairs, post-norm
    "dropout-0.4-cpu",
    "label-smoothing-0.05-cpu",
    "label-smoothing-0.2-cpu",
    "tokens-1500-cpu",  # 35 epochs, German→English, post-norm, batches of 1,500 tokens
    "tokens-6000-cpu",  # ... and of 6,000
    "recipe-seed-1-cpu-60-epochs",  # the recipe's seed-1 run continued to 60 epochs
]


def ppl_curves(frame: pd.DataFrame, domain: list[float]) -> alt.Chart:
    """Validation perplexity per word by epoch, a line per run, on a log scale."""
    return (
        alt.Chart(frame)
        .mark_line(point=alt.OverlayMarkDef(size=12), clip=True)
        .encode(
            x=alt.X("epoch:Q", title="epoch"),
            y=alt.Y(
                "val_ppl_word:Q",
                title="validation perplexity per word",
                scale=alt.Scale(type="log", domain=domain),
            ),
        )
    )


(
    ppl_curves(
        run_epochs.loc[
            ~run_epochs["run"].isin(["110-epochs", *CPU_TWINS]),
            ["pair", "recipe", "epoch", "val_ppl_word"],
        ],
        domain=[5, 200],
    )
    .encode(
        color=alt.Color(
            "recipe:N",
            title=None,
            legend=alt.Legend(orient="bottom", columns=1, labelLimit=500),
        ),
        column=alt.Column("pair:N", title=None),
        tooltip=["pair", "recipe", "epoch", "val_ppl_word"],
    )
    .properties(width=330, height=220)
)

# %% [markdown]
# The 110-epoch runs show what happens after the recipe's 35 epochs: perplexity (left) and
# accuracy (right) part ways. The perplexity reaches its lowest after about 40 to 60 epochs and
# then rises, while the accuracy does not fall: German→English's creeps up (70.2% at its best
# perplexity, 70.8% at the end), French→English's stays within a point (74.7% to 75.6% from its
# best perplexity on).
# The model gets as many tokens right or more, but, as the log-loss says, it assigns less
# probability to the right token where it errs, that is, it grows more confident in its
# mistakes. Which epoch is best depends on the measure; the book's targets ask for both.

# %%
long_runs = (
    run_epochs[run_epochs["run"] == "110-epochs"]
    .rename(
        columns={
            "val_ppl_word": "validation perplexity per word",
            "val_accuracy": "validation token accuracy",
        }
    )
    .melt(
        id_vars=["pair", "epoch"],
        value_vars=["validation perplexity per word", "validation token accuracy"],
        var_name="measure",
    )
)
(
    alt.Chart(long_runs)
    .mark_line()
    .encode(
        x=alt.X("epoch:Q", title="epoch"),
        y=alt.Y("value:Q", title=None, scale=alt.Scale(zero=False)),
        color=alt.Color("pair:N", title="pair"),
        tooltip=["pair", "epoch", "measure", "value"],
    )
    .transform_filter(alt.datum.epoch >= 10)
    .properties(width=300, height=200)
    .facet(column=alt.Column("measure:N", title=None))
    .resolve_scale(y="independent")
)

# %% [markdown]
# What the runs show. Regularisation is what this small corpus asks for: with the paper's dropout of
# 0.1 the validation perplexity turns up after about 16 epochs, while 0.2 and 0.3 both end lower,
# the curve of 0.3 still falling at epoch 35. More capacity does not help: $d_{ff} = 1024$ ends a
# little worse, and four layers, or the paper's six of width 512, learn far more slowly in the
# paper's post-norm order (for four layers, the section "Depth and where the norm goes" below finds
# that the order, not the learning rate, is why), and the base model with dropout 0.3 diverged. For
# French→English the gaps between dropout 0.2, 0.3 and $d_{ff} = 1024$ are 1% to 2.5%, about as far
# as the recipe itself moved with another seed on the CPU (1.1%, below, where $d_{ff} = 1024$ ends
# level with it) and less than two pre-norm seeds ended apart (4.1%): one seed each cannot rank
# them. Nor for German→English: dropout 0.2 (under bfloat16) and $d_{ff} = 1024$ end 3.9% and 3.3%
# above the shipped run, as far as the recipe itself with another seed (3.6%, below), and both
# stopped after 32 epochs, not 35. Without label smoothing the perplexity is *higher*, not lower as
# the paper reports for its large corpus: on 29,000 sentences the model without it overfits sooner
# (its best epoch comes earlier) and grows overconfident.
#
# The CPU twins need a yardstick, and the second seed gives it: the CPU baseline with another
# seed is up to 10% worse (or better) per word in the first ten epochs, and its average is 1.6%
# worse after 20. Measured against that, another vocabulary size does not help: with 4,000 BPE
# entries the perplexity per word, which does not depend on the segmentation, is higher than
# with 8,000 after every epoch, and its average is 3.5% higher, more than twice the seeds'
# difference; a second 4,000-entry run, with seed 1, is higher than both 8,000-entry runs
# after every one of its 20 epochs, and its average 4.4% higher than the CPU baseline's.
# With 12,000 entries it is lower for the first nine epochs, level for the next three and
# mostly higher after that; its average is 2.0% higher, about as far as the other seed. Dropout
# inside attention and the feed-forward network starts slower (7% higher perplexity after
# epoch 10, where the other seed is 6% higher), catches up by epoch 19, and averages 1.4%
# worse, less than the other seed. So neither 12,000 entries nor inner dropout differs from the
# CPU baseline by more than chance over 20 epochs; whether either pays off over the recipe's 35 is
# open. (Their token accuracies do not compare: a smaller vocabulary cuts the same words into
# more pieces.)
#
# The shipped run was chosen as the one with the lowest averaged validation perplexity among
# the runs in the paper's post-norm order, never on the test set; a departure from the paper
# had to beat that by more than chance, and the one that came close, the pre-norm order, did
# not (the section "Depth and where the norm goes"). This is evidence for this corpus and
# budget only. The cell below checks these
# claims against the metrics files:

# %%
shipped_average = comparison.xs("shipped", level="run")["average ppl/word"]
for pair in TARGETS:
    runs = comparison.loc[pair]
    others = runs.drop("shipped")
    # the shipped average is the lowest of all runs in the paper's order ...
    paper_order = others[others["order"] == "post-norm"]
    assert (paper_order["average ppl/word"] > shipped_average[pair]).all()
    # ... dropout 0.1 peaked before its last epoch, 0.3 still improves at its last
    assert (
        runs.loc["dropout-0.1-cpu", "best epoch"]
        < runs.loc["dropout-0.1-cpu", "epochs"]
    )
    assert runs.loc["shipped", "best epoch"] == runs.loc["shipped", "epochs"]
    order = ["dropout-0.1-cpu", "dropout-0.2", "shipped"]
    assert runs.loc[order, "average ppl/word"].is_monotonic_decreasing
    # ... more capacity does no better
    assert runs.loc["d_ff-1024", "average ppl/word"] > shipped_average[pair]
    assert runs.loc["4-layers", "average ppl/word"] > 2 * shipped_average[pair]
    # ... after 110 epochs: perplexity past its best, accuracy higher than at that epoch
    long = run_epochs[
        (run_epochs["pair"] == pair) & (run_epochs["run"] == "110-epochs")
    ]
    best = long.loc[long["val_ppl_word"].idxmin()]
    assert 35 < best["epoch"] < 70
    assert long["val_accuracy"].iloc[-1] > best["val_accuracy"]
    # ... for French→English within a point from there on
    after = long[long["epoch"] >= best["epoch"]]["val_accuracy"]
    assert pair == "de-en" or after.max() - after.min() < 0.01
    assert long["val_ppl_word"].iloc[-1] > best["val_ppl_word"]
de = comparison.loc["de-en"]
# French→English: dropout 0.2 and d_ff 1024 end 1% to 2.5% above, within one seed's reach
fr_gaps = comparison.loc["fr-en", "average ppl/word"] / shipped_average["fr-en"] - 1
assert fr_gaps[["dropout-0.2", "d_ff-1024"]].between(0.005, 0.03).all()
# ... about as far as the recipe itself with seed 1 on the CPU, where d_ff 1024 ends (unrounded)
fr_ends = run_averages.loc["fr-en", "val_ppl_word"]
assert round(fr_ends["recipe-seed-1-cpu"] / fr_ends["shipped"] - 1, 3) == 0.011
assert abs(fr_ends["d_ff-1024"] / fr_ends["recipe-seed-1-cpu"] - 1) < 0.001
# German→English: 3.9% and 3.3% above, about what another seed moved the recipe (3.6%)
de_gaps = comparison.loc["de-en", "average ppl/word"] / shipped_average["de-en"] - 1
assert de_gaps[["dropout-0.2", "d_ff-1024"]].round(3).tolist() == [0.039, 0.033]
assert (
    de.loc["no-label-smoothing", "average ppl/word"]
    > de.loc["dropout-0.2", "average ppl/word"]
)
assert de.loc["no-label-smoothing", "best epoch"] < de.loc["dropout-0.2", "best epoch"]
de_epochs = run_epochs[run_epochs["pair"] == "de-en"].set_index("epoch")
v4k, v8k = (
    de_epochs.loc[de_epochs["run"] == name, "val_ppl_word"]
    for name in ("vocab-4000-cpu", "dropout-0.2-cpu")
)
assert len(v4k) == len(v8k) == 20 and (v4k > v8k).all()
gap = v4k / v8k - 1  # about 10% after epoch 10, 2% after epoch 20
assert 0.08 < gap[10] < 0.12 and 0.01 < gap[20] < 0.03
assert (
    de.loc["vocab-4000-cpu", "average ppl/word"]
    > de.loc["dropout-0.2-cpu", "average ppl/word"]
)
v12k = de_epochs.loc[de_epochs["run"] == "vocab-12000-cpu", "val_ppl_word"]
gap = v12k / v8k - 1  # lower for nine epochs, level for three, then mostly higher
assert len(v12k) == 20 and (gap.loc[1:9] < 0).all()
assert (gap.loc[10:12].abs() < 0.01).all() and (gap.loc[13:] > 0).sum() >= 6
v12k_average = de.loc["vocab-12000-cpu", "average ppl/word"]
assert 0.01 < v12k_average / de.loc["dropout-0.2-cpu", "average ppl/word"] - 1 < 0.03
inner = de_epochs.loc[de_epochs["run"] == "inner-dropout-cpu", "val_ppl_word"]
assert 0.05 < inner[10] / v8k[10] - 1 < 0.09 and abs(inner[19] / v8k[19] - 1) < 0.005
twin_averages = de.loc[["inner-dropout-cpu", "dropout-0.2-cpu"], "average ppl/word"]
assert 0.01 < twin_averages.iloc[0] / twin_averages.iloc[1] - 1 < 0.02
# the yardstick: the same recipe with seed 1
seed_1 = de_epochs.loc[de_epochs["run"] == "dropout-0.2-cpu-seed-1", "val_ppl_word"]
seed_gap = seed_1 / v8k - 1
assert len(seed_1) == 20 and 0.09 < seed_gap.loc[1:10].max() < 0.11
assert 0.05 < seed_gap[10] < 0.07
average_gap = de["average ppl/word"] / de.loc["dropout-0.2-cpu", "average ppl/word"] - 1
chance = average_gap["dropout-0.2-cpu-seed-1"]
assert 0.015 < chance < 0.017
assert average_gap["vocab-4000-cpu"] > 2 * chance
assert 0.04 < average_gap["vocab-4000-cpu-seed-1"] < 0.05
v4k_1 = de_epochs.loc[de_epochs["run"] == "vocab-4000-cpu-seed-1", "val_ppl_word"]
assert len(v4k_1) == 20 and (v4k_1 > pd.concat([v8k, seed_1], axis=1).max(axis=1)).all()
assert abs(average_gap["vocab-12000-cpu"] - chance) < 0.01
assert average_gap["inner-dropout-cpu"] < chance
for base in ("base", "base-lr-0.45"):
    assert de.loc[base, "average ppl/word"] > 2 * shipped_average["de-en"]
# diverged: from its best epoch it climbs to more than 100 times as high
base_03 = de_epochs.loc[de_epochs["run"] == "base-dropout-0.3", "val_ppl_word"]
assert base_03.iloc[-1] > 100 * base_03.min() and base_03.idxmax() > base_03.idxmin()
print("checked: the shipped average is the lowest of all post-norm runs, on both pairs")


# %% [markdown]
# The vocabulary and inner-dropout twins as curves, from epoch 2 on, with the CPU baseline's two
# seeds (seed 1 dashed), the curves that the paragraph above describes. What to look for:
# whether each twin's curve leaves the band between the two seeds' curves, on which side, and
# for how many epochs.

# %%
chance_dashed = alt.condition(  # the baseline's other seed: what chance does
    alt.datum.run == "dropout-0.2-cpu-seed-1", alt.value([4, 3]), alt.value([1, 0])
)


def twin_curves(runs: list[str], domain: list[float]) -> alt.Chart:
    """The CPU twins' perplexity per word by epoch, the baseline's seed 1 dashed."""
    frame = de_epochs.reset_index()
    columns = ["run", "epoch", "step", "train_loss", "val_ppl_word"]
    return (
        ppl_curves(frame.loc[frame["run"].isin(runs), columns], domain=domain)
        .encode(
            color=alt.Color("run:N", title=None, sort=runs),
            strokeDash=chance_dashed,
            tooltip=columns,
        )
        .properties(width=420, height=240)
    )


twin_curves(
    [
        "dropout-0.2-cpu",
        "dropout-0.2-cpu-seed-1",
        "vocab-4000-cpu",
        "vocab-4000-cpu-seed-1",
        "vocab-12000-cpu",
        "inner-dropout-cpu",
    ],
    domain=[7, 300],
).transform_filter(alt.datum.epoch >= 2)


# %% [markdown]
# ### Where the twins differ
#
# The CPU twins' weights are not shipped, but their word-level scores are:
# `tools/word_level_report.py` scored each averaged model on the validation split (the section
# "Where the loss goes") and kept the result as `word_level.json` beside its metrics. The chart
# divides each twin's NLL per word-level token, group by group, by the baseline's
# (`dropout-0.2-cpu`): below the grey line at 1, the twin predicts that group of words better than
# the baseline does. The dashed line of `dropout-0.2-cpu-seed-1`, the baseline with another seed,
# shows how far chance alone moves each group. BPE-dropout on both sides is in the table only: up to
# two and a half times the baseline's NLL on a group, it is off the chart's scale (the next section
# is about it). So are the runs of the recipe itself and its variants (pre-norm, dropout 0.4, label
# smoothing, batch size, 60 epochs), which are no twins of the baseline (dropout 0.3, 35 epochs or
# more; their sections are further down).

# %%
from IPython.display import display

twin_folder = CHECKPOINTS_DIR / "de-en" / "comparison"
# Not on the chart: the baseline itself, BPE-dropout on both sides, which is off its scale (its
# own section follows), and the 35-epoch runs of the recipe, which are not twins of the
# baseline.
UNCHARTED = [
    "dropout-0.2-cpu",
    "bpe-dropout-cpu",
    "recipe-pre-norm-cpu",
    "recipe-pre-norm-cpu-seed-1",
    "recipe-4-layers-pre-norm-cpu",
    "recipe-4-layers-pre-norm-cpu-seed-1",
    "recipe-seed-1-cpu",
    "dropout-0.4-cpu",
    "label-smoothing-0.05-cpu",
    "label-smoothing-0.2-cpu",
    "tokens-1500-cpu",  # 35 epochs, German→English, post-norm, batches of 1,500 tokens
    "tokens-6000-cpu",  # ... and of 6,000
    "recipe-seed-1-cpu-60-epochs",  # the recipe's seed-1 run continued to 60 epochs
]
twin_scores = {
    sub.name: json.loads((sub / "word_level.json").read_text())
    for sub in sorted(twin_folder.iterdir())
    if (sub / "word_level.json").is_file()
}
twin_groups = pd.DataFrame(
    [
        {
            "run": name,
            "seen in training": group,
            "tokens": g["tokens"],
            "NLL per token (nats)": g["nll"] / g["tokens"],
        }
        for name, r in twin_scores.items()
        for group, g in r["groups"].items()
        if g["tokens"]
    ]
)
baseline = twin_groups[twin_groups["run"] == "dropout-0.2-cpu"].set_index(
    "seen in training"
)["NLL per token (nats)"]
twin_groups["relative to the baseline"] = twin_groups[
    "NLL per token (nats)"
] / twin_groups["seen in training"].map(baseline)
twin_table = pd.DataFrame(
    {
        name: {
            "ppl/word": r["ppl_word"],
            "ppl/word-level token": r["ppl_unit"],
            "word-level accuracy": r["unit_accuracy"],
        }
        | {
            f"NLL/token, {group}": g["nll"] / g["tokens"]
            for group, g in r["groups"].items()
        }
        for name, r in twin_scores.items()
    }
).T.round(3)
display(twin_table)
lines = (
    alt.Chart(twin_groups[~twin_groups["run"].isin(UNCHARTED)].round(4))
    .mark_line(point=True)
    .encode(
        x=alt.X("seen in training:N", sort=groups, title="times seen in training"),
        y=alt.Y(
            "relative to the baseline:Q",
            scale=alt.Scale(zero=False),
            title="NLL per token, relative to dropout-0.2-cpu",
        ),
        color=alt.Color("run:N", title=None),
        strokeDash=chance_dashed,
        tooltip=[
            "run",
            "seen in training",
            "tokens",
            "NLL per token (nats)",
            "relative to the baseline",
        ],
    )
)
level = alt.Chart(pd.DataFrame({"level": [1.0]})).mark_rule(color="gray")
(level.encode(y="level:Q") + lines).properties(width=420, height=220)

# %% [markdown]
# The vocabulary twins trade one group of words against another, and by far more than chance moves
# any group: the other seed's line stays within 1% of the baseline, except on the words seen 2 to 4
# times (5%) and 20 to 99 times (3%), and on `<eos>` (4%). Words never seen in training get cheaper
# as the vocabulary shrinks (19.9 nats each with 4,000 entries, 20.8 with 8,000, 22.0 with 12,000):
# a smaller vocabulary spells them with shorter, more frequent pieces, each less of a guess. Words
# seen 5 to 19 times go the other way (5.5, 4.8 and 4.4 nats): a larger vocabulary keeps more of
# them whole. The second 4,000-entry seed repeats both: never-seen words 5% cheaper than the
# baseline's, words seen 5 to 19 times 15% dearer. Those are three times as many as the never-seen
# words, and with 4,000 entries the words seen 20 to 99 times also cost 11% more (14% with seed 1).
# On the commonest words, three quarters of all tokens, the differences are small (4,000 entries:
# 2.3% less; 12,000: 1.6% more) but weigh much; 8,000 entries, in the middle, have the lowest total.
# Dropout inside attention and the feed-forward network follows the other seed's line, group by
# group: what it changes in 20 epochs cannot be told from chance.

# %%
nll = twin_groups.pivot(
    index="run", columns="seen in training", values="NLL per token (nats)"
)
sizes = ["vocab-4000-cpu", "dropout-0.2-cpu", "vocab-12000-cpu"]
assert nll.loc[sizes, "never"].is_monotonic_increasing
assert nll.loc[sizes, "5-19"].is_monotonic_decreasing
relative = nll / nll.loc["dropout-0.2-cpu"]
assert relative.loc["vocab-4000-cpu", "20-99"] > 1.08
assert 1.13 < relative.loc["vocab-4000-cpu-seed-1", "20-99"] < 1.15
seed_4k = relative.loc["vocab-4000-cpu-seed-1"]
assert 0.94 < seed_4k["never"] < 0.96 and 1.14 < seed_4k["5-19"] < 1.16
assert 0.97 < relative.loc["vocab-4000-cpu", "100+"] < 0.99
assert 1.01 < relative.loc["vocab-12000-cpu", "100+"] < 1.03
tokens = twin_groups.groupby("seen in training")["tokens"].first()
assert 2.5 < tokens["5-19"] / tokens["never"] < 4
best = twin_table.loc[sizes, "ppl/word-level token"].idxmin()
assert best == "dropout-0.2-cpu"
# chance: the other seed, group by group
seed = relative.loc["dropout-0.2-cpu-seed-1"] - 1
assert (seed[["never", "once", "5-19", "100+"]].abs() < 0.01).all()
assert 0.04 < seed["2-4"] < 0.07 and 0 < seed["20-99"] < 0.035
assert 0.03 < -seed["<eos>"] < 0.05
assert 2.4 < relative.loc["bpe-dropout-cpu"].max() < 2.6  # "two and a half times"
for size in ("vocab-4000-cpu", "vocab-4000-cpu-seed-1", "vocab-12000-cpu"):
    effect = relative.loc[size] - 1
    assert abs(effect["never"]) > 0.04 and abs(effect["5-19"]) > 0.08
    assert 0.01 < abs(effect["100+"]) < 0.03
inner = relative.loc["inner-dropout-cpu"] - 1
assert ((inner - seed).abs() < 0.03).all()
for name, r in twin_scores.items():  # the files belong to the runs' averaged models
    ppl = run_averages.loc[("de-en", name), "val_ppl_word"]
    assert abs(r["ppl_word"] - ppl) < 0.01, name


# %% [markdown]
# ### BPE-dropout
#
# It was the one idea aimed at the rare words of "Where the loss goes". Two twins of the baseline
# test it at $p = 0.1$: `bpe-dropout-cpu` on both sides, and `bpe-dropout-source-cpu` on the German
# side only, which leaves the English targets spelt as validation scores them. Resampled words come
# in more pieces (about 30% more, the data chapter measured), so with the same token budget per
# batch both runs make more updates per epoch (210 and 198, against the baseline's 161), and more
# computation. Their curves from epoch 2 on, on a log scale, with the baseline's two seeds (seed 1
# dashed); what to look for: how far above the baseline each BPE-dropout curve lies, and whether the
# gap closes.

# %%
bpe_runs = [
    "dropout-0.2-cpu",
    "dropout-0.2-cpu-seed-1",
    "bpe-dropout-cpu",
    "bpe-dropout-source-cpu",
]
twin_curves(bpe_runs, domain=[7, 300]).transform_filter(alt.datum.epoch >= 2)

# %% [markdown]
# Neither helps this model in 20 epochs. On both sides, the perplexity per word is 32% above
# the baseline's after one epoch, 2.4 times as high after five and 3.8 times after ten, and has
# stopped falling (43.7 after epoch 9, 44.1 after epoch 10): we stopped the run there and
# averaged its last five epochs (42.8). Part of that is built into the measure, which scores
# the one spelling BPE gives each English word, while a model trained on sampled spellings
# spreads a word's probability over several: in the data chapter the German `▁Mann` keeps
# BPE's spelling in 72% of the draws; an English word that did the same would cost
# $-\ln 0.72 \approx 0.33$ nats more. The rest is
# not: on the commonest words (seen 100 times or more in training) the NLL per token doubles,
# from 1.04 to 2.07 nats, and only the words never seen in training get cheaper (20.1 nats
# against 20.8). On noisy targets, the model learned less.
#
# On the source side only, the measure is unbiased, and the run does far better, but still not as
# well as the baseline: ahead for two epochs (it makes 23% more updates per epoch), then behind from
# epoch 3 on, by up to 33%, and by 7% to 12% in the last three epochs; its average after 20 epochs
# is 9.8% above the baseline's, six times the gap between the two seeds. The twins' table above
# shows where: every group of words costs more than with the baseline, the rare words it was meant
# to help included (never seen: 21.2 nats against 20.8; seen once: 15.3 against 14.7), words seen 2
# to 19 times 12% to 15% more, and all of them by more than the other seed moves them; only on the
# commonest words is the difference (0.4%) within chance. So BPE-dropout stays an option, off by
# default: on this corpus, with this model and budget, the evidence is against it. Its authors
# report gains for models trained to convergence {cite:p}`provilkov2020bpe`; whether it pays off
# over the recipe's 35 epochs, or with a larger model, is not measured here.

# %%
both = de_epochs.loc[de_epochs["run"] == "bpe-dropout-cpu", "val_ppl_word"]
source = de_epochs.loc[de_epochs["run"] == "bpe-dropout-source-cpu", "val_ppl_word"]
updates = de_epochs.loc[1].set_index("run")["step"]  # after the first epoch
assert updates[bpe_runs].tolist() == [161, 161, 210, 198]
ratio = both / v8k.loc[both.index]
assert len(both) == 10 and 1.3 < ratio[1] < 1.35 and 2.3 < ratio[5] < 2.5
assert 3.7 < ratio[10] < 3.9 and both[10] > both[9]
assert 42 < de.loc["bpe-dropout-cpu", "average ppl/word"] < 43.5
both_groups = relative.loc["bpe-dropout-cpu"]
assert 1.9 < both_groups["100+"] < 2.1 and both_groups["never"] < 1
assert (both_groups.drop(["never", "<eos>"]) > 1.1).all()
gap = source / v8k - 1
assert len(source) == 20 and (gap.loc[1:2] < -0.09).all()
assert (gap.loc[3:] > 0.05).all() and 0.32 < gap.max() < 0.34
assert (gap.loc[18:] < 0.12).all()
assert 0.09 < average_gap["bpe-dropout-source-cpu"] < 0.11
assert average_gap["bpe-dropout-source-cpu"] > 5 * chance
source_groups = relative.loc["bpe-dropout-source-cpu"]
assert (source_groups.drop("<eos>") > 1).all()  # every group of words costs more
assert 1.11 < source_groups["2-4"] < 1.13 and 1.13 < source_groups["5-19"] < 1.15
# ... by more than the other seed moves the same group, but for the commonest words
rarer = ["never", "once", "2-4", "5-19", "20-99"]
assert (source_groups[rarer] - 1 > seed[rarer].abs()).all()
assert abs(source_groups["100+"] - 1) < 0.01 and abs(seed["100+"]) < 0.01


# %% [markdown]
# ### Depth and where the norm goes
#
# On the GPU, 4 + 4 layers learned far more slowly than the recipe's 3 + 3: 33.7 per word after ten
# epochs against 15.0 (the runs above). Two explanations come to mind. Our peak learning rate is
# twice the paper's, and a deeper stack may need a smaller one. Or it is the paper's post-norm order
# itself (the sublayers chapter): a post-norm stack has large gradients near its output at
# initialisation {cite:p}`xiong2020layer`, and it leans so heavily on its residual branches that the
# effect of an update on the output grows with depth {cite:p}`liu2020understanding`. Four CPU twins
# of the baseline tell the two apart: `4-layers-cpu` (4 + 4 layers), `4-layers-lr-0.35-cpu` (the
# same at half the learning rate), `4-layers-pre-norm-cpu` (4 + 4 layers in the pre-norm order,
# `norm_first=True`, with its last LayerNorm on each stack), 10 epochs each, and `pre-norm-cpu` (3 +
# 3 layers, pre-norm), 20 epochs like the baseline. Their curves, with the baseline's two seeds
# (seed 1 dashed); what to look for: which curves run together, which lag, and where the pre-norm
# curve meets the baseline's.

# %%
depth_runs = [
    "dropout-0.2-cpu",
    "dropout-0.2-cpu-seed-1",
    "4-layers-cpu",
    "4-layers-lr-0.35-cpu",
    "pre-norm-cpu",
    "4-layers-pre-norm-cpu",
]
twin_curves(depth_runs, domain=[7, 1200])

# %% [markdown]
# It is the order, not the learning rate. At half the learning rate the four post-norm layers learn
# more slowly still, and after ten epochs both four-layer post-norm runs are more than twice as high
# as the baseline (26.8 and 28.5 against 11.5). Their training loss lags as far (2.20 and 2.34
# against 1.68): the optimisation is slow, not the generalisation. In the pre-norm order, four
# layers learn as fast as three (9.65 and 9.64 after ten epochs, within 0.3% of each other), and
# both learn faster than the post-norm baseline from the second epoch on: after five epochs 20.2 and
# 21.3 against 32.3, a third lower, and after ten 16% lower. The lead shrinks as the post-norm run
# catches up, but after every epoch it is more than chance, which moves the baseline by about 10% at
# most (its two seeds). So the recipe's three layers say less about what this corpus needs than
# about post-norm with our batches: in the pre-norm order a fourth layer costs nothing in speed of
# learning.
#
# What counts is where a run ends, though, and there the lead is gone. Continued to the
# baseline's 20 epochs, `pre-norm-cpu` is still more than 10% ahead after epoch 12, about level
# after epoch 16, and behind from epoch 18 on; its average of the last five epochs is 8.25,
# 2.4% above the baseline's and 0.8% above the other seed's: no better, and no worse than
# chance can say. Its training loss stays far lower (0.90 against 1.13 after epoch 20) while
# its validation perplexity stops falling: pre-norm fits the training sentences faster, and
# with dropout 0.2 that buys nothing on validation. Others found the same split: pre-norm ended
# better than post-norm on five small TED-talk corpora and worse on the large WMT'14
# English–German one {cite:p}`nguyen2019transformers`. Whether the recipe's stronger dropout
# of 0.3 and its 35 epochs change that is the question of the next runs.

# %%
depth = de_epochs[de_epochs["run"].isin(depth_runs)].pivot(
    columns="run", values=["val_ppl_word", "train_loss"]
)
ppl, train_loss = depth["val_ppl_word"].loc[1:10], depth["train_loss"].loc[1:10]
base = ppl["dropout-0.2-cpu"]
# four post-norm layers: more than twice the baseline after ten epochs, at either rate,
# and slower at half the rate after every epoch
for name in ("4-layers-cpu", "4-layers-lr-0.35-cpu"):
    assert ppl[name][10] > 2 * base[10]
    assert train_loss[name][10] > train_loss["dropout-0.2-cpu"][10] + 0.5
assert (ppl["4-layers-lr-0.35-cpu"] > ppl["4-layers-cpu"]).all()
assert abs(ppl["4-layers-cpu"][10] - 26.8) < 0.05
assert abs(ppl["4-layers-lr-0.35-cpu"][10] - 28.5) < 0.05
# pre-norm: four layers as fast as three, both ahead of the baseline from epoch 2 on
pre3, pre4 = ppl["pre-norm-cpu"], ppl["4-layers-pre-norm-cpu"]
assert abs(pre4[10] / pre3[10] - 1) < 0.003
for pre in (pre3, pre4):
    assert (pre.loc[2:] < base.loc[2:]).all()
    assert (pre.loc[2:] < ppl["dropout-0.2-cpu-seed-1"].loc[2:]).all()
    assert 0.15 < 1 - pre[10] / base[10] < 0.17 and 0.3 < 1 - pre[5] / base[5] < 0.4
# chance: the two seeds are about 10% apart at most; pre-norm's lead is more after every epoch
seeds = ppl["dropout-0.2-cpu-seed-1"] / base - 1
assert 0.1 < seeds.abs().max() < 0.11
for pre in (pre3, pre4):
    assert (1 - pre.loc[2:] / base.loc[2:] > seeds.abs().max()).all()
# after 20 epochs: level after epoch 16, behind from epoch 18, an average within chance
all_ppl = depth["val_ppl_word"]
long_gap = all_ppl["pre-norm-cpu"] / all_ppl["dropout-0.2-cpu"] - 1
assert len(long_gap) == 20 and (long_gap.loc[2:12] < -0.1).all()
assert abs(long_gap[16]) < 0.02 and (long_gap.loc[18:] > 0).all()
ends = de["average ppl/word"]
assert round(ends["pre-norm-cpu"], 2) == 8.25
assert 0.02 < ends["pre-norm-cpu"] / ends["dropout-0.2-cpu"] - 1 < 0.03
assert 0 < ends["pre-norm-cpu"] / ends["dropout-0.2-cpu-seed-1"] - 1 < 0.01
late = depth["train_loss"].loc[20]
assert late["pre-norm-cpu"] < late["dropout-0.2-cpu"] - 0.2
gpu = run_epochs[(run_epochs["pair"] == "de-en")].pivot(
    index="epoch", columns="run", values="val_ppl_word"
)
assert round(gpu["4-layers"][10], 1) == 33.7 and round(gpu["shipped"][10], 1) == 15.0


# %% [markdown]
# ### The recipe in the pre-norm order
#
# With the recipe's dropout of 0.3 and its 35 epochs, does the faster start turn into a lower end?
# Two runs of `multi30k_recipe` with `norm_first=True` for each pair, with seeds 0 and 1, trained
# two at a time on the project's CPU (float32, one thread each, 2.2 to 2.3 hours each), answer. In
# both pairs they learn far faster than the shipped post-norm run (on the GPU, also float32), and in
# both the lead shrinks.
#
# French→English: both seeds are ahead after each of the first 30 epochs, by 41% after two, 23% and
# 21% after ten (seed 0 first), and 11% and 9% after twenty. But the post-norm run improves to its
# last epoch, while the pre-norm runs flatten out (their best epochs are the 31st and the 29th), and
# seed 1 falls behind from epoch 31 on, while seed 0 is still 3% ahead after epoch 35. At the end
# the two seeds disagree: averages of 5.72 and 5.96 per word, against the shipped run's 5.87, that
# is 2.6% lower with seed 0 and 1.6% higher with seed 1, while the two seeds differ by 4.1%; per
# word-level token (the section "Which words") 4.34 and 4.50, against 4.44. The post-norm recipe
# itself with seed 1 on the same CPU (`recipe-seed-1-cpu`, trained later, alone, on two threads, 1.8
# hours) is the yardstick. It trails the shipped run after 14 of the first 19 epochs, by up to 20%,
# keeps within 2.2% of it either way from the 20th on, and averages 5.93 per word, 1.1% above the
# shipped run's 5.87; per word-level token 4.48, against 4.44; token accuracy 74.4%, against 74.7%.
# So the two post-norm seeds end 1.1% apart and the two pre-norm seeds 4.1%, and the mean of the
# pre-norm seeds is 1.0% below that of the post-norm ones. A gain smaller than what the seed alone
# moves is not one this book can claim, although seed 0's average is the lowest of all
# French→English runs.
#
# German→English: the same start, 34% and 37% ahead after two epochs, 31% and 29% after ten,
# 13% to 15% after twenty; then the lead shrinks by about a point per epoch, seed 0 falls
# behind from epoch 29 and seed 1 from epoch 31, and both have their best epoch at the 32nd.
# Here the two seeds agree: averages of 7.79 per word with both (0.07% apart), 3.7% *higher*
# than the shipped run's 7.51; per word-level token 5.64, against 5.47; token accuracy level
# (69.9% and 69.8%, against 69.8%). The two pre-norm seeds agree closely, and so does the
# post-norm recipe itself with seed 1 on the same CPU (the section "The recipe's own seed, and
# more dropout" below): 7.78 per word, 0.1% from the pre-norm runs. On the same machine, three
# pre-norm layers end level with the paper's order; the shipped run's 3.7% lead is what its
# seed and its machine can give it.
#
# Four layers, German→English: in the pre-norm order a fourth layer trained as fast as three (the
# CPU twins above), so two more runs, `recipe-4-layers-pre-norm-cpu` with seeds 0 and 1 (the same
# recipe in the pre-norm order with 4 + 4 layers, on the same CPU, two at a time, 3.5 hours each),
# ask whether the extra depth turns the faster start into a lower end. Not quite. The start is the
# same, 33% and 39% ahead after two epochs, 31% after ten, 14% and 16% after twenty, but the lead
# shrinks more slowly than with three layers: both seeds are ahead for 32 epochs and behind only in
# the last three. Their averages, 7.58 and 7.60 per word (the seeds 0.17% apart), are 1.0% and 1.1%
# higher than the shipped run's 7.51, and 2.6% lower than the three-layer pre-norm runs' 7.79: more
# than a second seed moved the 20-epoch CPU baseline (1.6%), though less than the 3.6% between the
# recipe's seed 0 on the GPU and seed 1 on the CPU (below) or the 4.1% between the two
# French→English pre-norm seeds. Token accuracy 70.4% and 69.8%, against 69.8%; per word-level token
# 5.51 and 5.52, against 5.47. These two and the recipe with batches of 1,500 tokens (7.58 as well,
# the section "How many tokens per batch") are the comparison runs of 35 epochs that come closest to
# the shipped run, and still behind it, far from the target of 6 per word; against the post-norm
# recipe with seed 1 on the same CPU (below), the two four-layer runs end 2.5% lower.
#
# So the paper's order stays the default and both shipped models stay post-norm. With this
# recipe, pre-norm buys a much faster start, which matters to a short budget (the CPU twins
# above), and ends no better after a full one than the shipped run: for German→English 3.7%
# higher with three layers and 1% with four. But the shipped run may itself be a lucky draw: the
# same recipe with seed 1 on the CPU ends 3.6% higher than it, level with three pre-norm
# layers and 2.5% above four (for French→English, 1.1% higher, the yardstick above). Four
# pre-norm layers may be a little better than the paper's order; one post-norm seed on the CPU
# cannot show more than that. (The machines differ too, CPU against GPU, which changes the
# rounding of the same float32 arithmetic.) Whether four pre-norm layers do better for
# French→English is what the GPU runs of `python tools/gpu_sweep.py targets` would answer. The
# curves from epoch 5 on, with the post-norm recipe's seed 1 on the CPU; what to look for: the
# wide early gap in both pairs, the point where each pre-norm curve crosses the post-norm ones,
# how far apart the two seeds end in each pair, against their distance from the two post-norm
# curves, and, for German→English, how much later the four-layer curves cross them than the
# three-layer ones.

# %%
pre_norm_runs = {
    "shipped": "post-norm (multi30k_recipe, shipped), GPU",
    "recipe-seed-1-cpu": "post-norm, seed 1, CPU",
    "recipe-pre-norm-cpu": "pre-norm, seed 0, CPU",
    "recipe-pre-norm-cpu-seed-1": "pre-norm, seed 1, CPU",
    "recipe-4-layers-pre-norm-cpu": "pre-norm, 4 + 4 layers, seed 0, CPU",
    "recipe-4-layers-pre-norm-cpu-seed-1": "pre-norm, 4 + 4 layers, seed 1, CPU",
}
recipe_epochs = run_epochs[run_epochs["run"].isin(pre_norm_runs)]
ppl_curves(
    recipe_epochs.assign(order=recipe_epochs["run"].map(pre_norm_runs))[
        ["pair", "order", "run", "epoch", "val_ppl_word"]
    ],
    domain=[5, 40],
).encode(
    color=alt.Color(
        "order:N",
        title=None,
        sort=list(pre_norm_runs.values()),
        legend=alt.Legend(orient="bottom"),
    ),
    column=alt.Column("pair:N", title=None),
    tooltip=["pair", "run", "epoch", "val_ppl_word"],
).transform_filter(alt.datum.epoch >= 5).properties(width=330, height=220)

# %%
pre_names = ["recipe-pre-norm-cpu", "recipe-pre-norm-cpu-seed-1"]
recipe_ppl = recipe_epochs.pivot(
    index="epoch", columns=["pair", "run"], values="val_ppl_word"
)
# how much lower than the shipped post-norm run each pre-norm seed is, epoch by epoch
lead = {
    pair: 1 - recipe_ppl[pair][pre_names].div(recipe_ppl[pair]["shipped"], axis=0)
    for pair in TARGETS
}
recipe_ends = run_averages["val_ppl_word"]  # unrounded
gain = {
    pair: 1 - recipe_ends[pair][pre_names] / recipe_ends[pair]["shipped"]
    for pair in TARGETS
}
seeds_apart = {
    pair: abs(recipe_ends[pair][pre_names[0]] / recipe_ends[pair][pre_names[1]] - 1)
    for pair in TARGETS
}
units = {
    (pair, name): json.loads(
        (CHECKPOINTS_DIR / pair / "comparison" / name / "word_level.json").read_text()
    )["ppl_unit"]
    for pair in TARGETS
    for name in [*pre_names, "recipe-seed-1-cpu"]
}
for pair in TARGETS:
    runs = comparison.loc[pair]
    assert (runs.loc[pre_names, "order"] == "pre-norm").all()
    assert runs.loc["shipped", "best epoch"] == 35
    assert (runs.loc[pre_names, "best epoch"] < 35).all()
    assert (lead[pair].loc[2] > 0.34).all()  # a far faster start ...

# French→English: both ahead for 30 epochs, then seed 1 behind
fr = lead["fr-en"]
assert (fr.loc[1:30] > 0).all().all()
assert (fr.loc[2] > 0.4).all() and fr.loc[10].between(0.2, 0.24).all()
assert fr.loc[20].between(0.09, 0.12).all()
assert (fr.loc[31:, "recipe-pre-norm-cpu-seed-1"] < 0).all()
assert 0.025 < fr.loc[35, "recipe-pre-norm-cpu"] < 0.035  # still 3% ahead
# at the end: seed 0 lower, seed 1 higher
assert 0.02 < gain["fr-en"].iloc[0] < 0.03 and -0.02 < gain["fr-en"].iloc[1] < -0.01
# no claim: the two seeds end further apart than either ends from post-norm
assert 0.035 < seeds_apart["fr-en"] < 0.045
assert seeds_apart["fr-en"] > gain["fr-en"].abs().max()
assert [round(units["fr-en", name], 2) for name in pre_names] == [4.34, 4.50]
assert round(word_level["fr-en"].ppl_unit, 2) == 4.44
# the yardstick: the post-norm recipe with seed 1 on the CPU
fr_seed1 = recipe_ppl["fr-en"]["recipe-seed-1-cpu"] / recipe_ppl["fr-en"]["shipped"] - 1
assert len(fr_seed1) == 35 and (fr_seed1.loc[1:19] > 0).sum() == 14
assert 0.19 < fr_seed1.loc[1:19].max() < 0.2 and (fr_seed1.loc[20:].abs() < 0.022).all()
fr_post = recipe_ends["fr-en"][["shipped", "recipe-seed-1-cpu"]]
assert [round(v, 2) for v in fr_post] == [5.87, 5.93]
assert round(fr_post.iloc[1] / fr_post.iloc[0] - 1, 3) == 0.011  # the post-norm seeds
assert round(recipe_ends["fr-en"][pre_names].mean() / fr_post.mean() - 1, 3) == -0.010
assert round(units["fr-en", "recipe-seed-1-cpu"], 2) == 4.48
fr_accuracy = run_averages.loc["fr-en", "val_accuracy"]
assert [round(fr_accuracy[n], 3) for n in ("recipe-seed-1-cpu", "shipped")] == [
    0.744,
    0.747,
]

# German→English: both ahead until epoch 28, behind from 29 and 31 on, best at the 32nd
de_lead = lead["de-en"]
assert (de_lead.loc[1:28] > 0).all().all()
assert (de_lead.loc[29:, "recipe-pre-norm-cpu"] < 0).all()
assert (de_lead.loc[29:30, "recipe-pre-norm-cpu-seed-1"] > 0).all()
assert (de_lead.loc[31:, "recipe-pre-norm-cpu-seed-1"] < 0).all()
assert (de_lead.loc[2] < 0.38).all() and de_lead.loc[10].between(0.29, 0.32).all()
assert de_lead.loc[20].between(0.13, 0.15).all()
assert (comparison.loc[("de-en", pre_names), "best epoch"] == 32).all()
# at the end: both 3.7% higher, the seeds 0.07% apart, accuracy level
assert gain["de-en"].between(-0.038, -0.036).all()
assert seeds_apart["de-en"] < 0.001
assert 10 * seeds_apart["de-en"] < gain["de-en"].abs().min()
assert [round(recipe_ends["de-en", name], 2) for name in pre_names] == [7.79, 7.79]
assert round(recipe_ends["de-en", "shipped"], 2) == 7.51
accuracy = comparison.loc["de-en", "average accuracy"]
assert (abs(accuracy[pre_names] - accuracy["shipped"]) < 0.001).all()
assert [round(units["de-en", name], 2) for name in pre_names] == [5.64, 5.64]
assert round(word_level["de-en"].ppl_unit, 2) == 5.47

# Four layers, German→English: ahead for 32 epochs, behind in the last three
four = ["recipe-4-layers-pre-norm-cpu", "recipe-4-layers-pre-norm-cpu-seed-1"]
lead4 = 1 - recipe_ppl["de-en"][four].div(recipe_ppl["de-en"]["shipped"], axis=0)
assert (lead4.loc[1:32] > 0).all().all() and (lead4.loc[33:] < 0).all().all()
assert lead4.loc[2].between(0.33, 0.39).all()
assert lead4.loc[10].between(0.30, 0.32).all()
assert lead4.loc[20].between(0.14, 0.17).all()
ends4 = recipe_ends["de-en"][four]
assert [round(v, 2) for v in ends4] == [7.58, 7.60]
assert abs(ends4.iloc[0] / ends4.iloc[1] - 1) < 0.002  # the seeds 0.17% apart
gain4 = 1 - ends4 / recipe_ends["de-en", "shipped"]
assert gain4.between(-0.012, -0.009).all()  # 1.0% and 1.1% higher than post-norm
# 2.6% below the three-layer pre-norm runs: more than the CPU baseline's seeds moved it (1.6%),
# less than the recipe's seeds (3.6%) or French→English's pre-norm seeds (4.1%)
assert round(ends4.mean() / recipe_ends["de-en"][pre_names].mean() - 1, 3) == -0.026
assert 0.035 < seeds_apart["fr-en"] < 0.045
four_accuracy = run_averages.loc["de-en", "val_accuracy"][four]
assert [round(a, 3) for a in four_accuracy] == [0.704, 0.698]
units4 = [
    json.loads((twin_folder / name / "word_level.json").read_text())["ppl_unit"]
    for name in four
]
assert [round(u, 2) for u in units4] == [5.51, 5.52]
# the 35-epoch comparison runs closest to the shipped one (with 1,500 tokens per batch), and
# behind it; the seed-1 run continued to 60 epochs comes later ("A longer run ...")
others = comparison.loc["de-en", "average ppl/word"].drop(
    ["shipped", "recipe-seed-1-cpu-60-epochs"]
)
assert set(others.nsmallest(3).index) == {*four, "tokens-1500-cpu"}
assert round(others["tokens-1500-cpu"], 2) == 7.58
assert (others > comparison.loc[("de-en", "shipped"), "average ppl/word"]).all()


# %% [markdown]
# ### The recipe's own seed, and more dropout
#
# Two more German→English runs of the recipe in the paper's post-norm order, for its 35 epochs,
# trained two at a time on the project's CPU (float32, one thread each, about 2.4 hours each):
# `recipe-seed-1-cpu`, the recipe itself with seed 1, and `dropout-0.4-cpu`, the recipe with dropout
# 0.4 instead of 0.3 (seed 0). The first is the yardstick the comparisons above lacked: how far the
# recipe's end moves when only chance changes (other initial weights, batches and dropout masks),
# and the machine, CPU instead of GPU. The second asks whether more dropout, which helped from 0.1
# to 0.2 to 0.3, helps once more.
#
# Chance and the machine first. The seed-1 run starts a little ahead (8% and 10% lower than the
# shipped run after one and two epochs), then trails it after every epoch from the third on but the
# 20th: by 7% after ten epochs, 0.2% *ahead* after twenty, 3.4% behind after the last, and like the
# shipped run it is still improving at its 35th epoch. Its average is 7.78 per word, 3.6% higher
# than the shipped run's 7.51; token accuracy 69.0%, against 69.8%; per word-level token 5.64,
# against 5.47. That is more than twice what a second seed moved the 20-epoch CPU baseline (1.6%),
# and three times what the same seed moved the French→English recipe (1.1%, the section on the
# pre-norm order above); it is the yardstick for the German→English runs of 32 to 35 epochs: the
# three-layer pre-norm runs (7.79) and $d_{ff} = 1024$ (7.76) end level with it, the four-layer
# pre-norm runs (7.58 and 7.60) 2.5% below it, and of the runs so far only the shipped run further
# below (two of later sections end a little lower than the four-layer runs: half the batch, 7.58,
# and the recipe continued to 60 epochs, 7.57). One more seed is one more sample, not a
# distribution; but a gap of a few percent between single runs of this recipe is not evidence of a
# better recipe.
#
# More dropout: 0.4 is far worse, from the first epoch to the last: 29% higher than the shipped
# run after one epoch, 2.4 times as high after ten, 2.5 times after twenty, and an average of
# 20.74 per word, 2.8 times the shipped run's; token accuracy 54.5%, against 69.8%; per
# word-level token 12.87, against 5.47. Its training loss ends far higher too (1.73 against
# 1.08, both measured with dropout on and label-smoothed), so the extra dropout keeps this
# model of width 256 from fitting even its training data as well in 35 epochs. With this model
# and corpus, 0.3 is where more dropout stops helping, and the GPU runs prepared in
# `python tools/gpu_sweep.py targets` no longer try 0.4.
#
# The curves from epoch 5 on, with the shipped run; what to look for: how far the seed-1 curve
# stays from the shipped one over the whole run, against the distance of the dropout-0.4 curve
# from both.

# %%
recipe_twins = {
    "shipped": "dropout 0.3, seed 0, GPU (shipped)",
    "recipe-seed-1-cpu": "dropout 0.3, seed 1, CPU",
    "dropout-0.4-cpu": "dropout 0.4, seed 0, CPU",
}


def recipe_curves(labels: dict[str, str]) -> alt.Chart:
    """The German→English curves of the runs named, from epoch 5, labelled as given."""
    runs = run_epochs[(run_epochs["pair"] == "de-en") & run_epochs["run"].isin(labels)]
    return (
        ppl_curves(
            runs.assign(recipe=runs["run"].map(labels))[
                ["recipe", "run", "epoch", "val_ppl_word"]
            ],
            domain=[6, 100],
        )
        .encode(
            color=alt.Color(
                "recipe:N",
                title=None,
                sort=list(labels.values()),
                legend=alt.Legend(orient="bottom", labelLimit=0),  # whole labels
            ),
            tooltip=["run", "epoch", "val_ppl_word"],
        )
        .transform_filter(alt.datum.epoch >= 5)
        .properties(width=420, height=240)
    )


recipe_curves(recipe_twins)

# %%
de_ppl = run_epochs[run_epochs["pair"] == "de-en"].pivot(
    index="epoch", columns="run", values="val_ppl_word"
)
behind = (
    de_ppl[["recipe-seed-1-cpu", "dropout-0.4-cpu"]].div(de_ppl["shipped"], axis=0) - 1
)
de_ends = run_averages.loc["de-en", "val_ppl_word"]  # unrounded
de_accuracy = run_averages.loc["de-en", "val_accuracy"]
de_units = {
    name: json.loads((twin_folder / name / "word_level.json").read_text())["ppl_unit"]
    for name in ("recipe-seed-1-cpu", "dropout-0.4-cpu")
}
chance_gap = de_ends["recipe-seed-1-cpu"] / de_ends["shipped"] - 1
assert behind.loc[1:2, "recipe-seed-1-cpu"].between(-0.10, -0.07).all()
# behind after every epoch from the third on but the 20th
late = behind.loc[3:35, "recipe-seed-1-cpu"]
assert (late.drop(20) > 0).all() and -0.005 < late[20] < 0
assert 0.06 < late[10] < 0.075 and 0.03 < late[35] < 0.04
assert comparison.loc[("de-en", "recipe-seed-1-cpu"), "best epoch"] == 35
assert round(de_ends["recipe-seed-1-cpu"], 2) == 7.78 and round(chance_gap, 3) == 0.036
assert [round(de_accuracy[n], 3) for n in ("recipe-seed-1-cpu", "shipped")] == [
    0.69,
    0.698,
]
assert round(de_units["recipe-seed-1-cpu"], 2) == 5.64
assert chance_gap > 2 * 0.016  # the 20-epoch CPU baseline's seeds: 1.6%
# level with the three-layer pre-norm runs and d_ff 1024, above the four-layer pre-norm runs
three = ["recipe-pre-norm-cpu", "recipe-pre-norm-cpu-seed-1", "d_ff-1024"]
assert (abs(de_ends[three] / de_ends["recipe-seed-1-cpu"] - 1) < 0.004).all()
assert (1 - de_ends[four] / de_ends["recipe-seed-1-cpu"]).round(3).tolist() == [
    0.026,
    0.024,
]
# (the label-smoothing and batch-size runs, which came later, have sections of their own)
smoothing = ["label-smoothing-0.05-cpu", "label-smoothing-0.2-cpu"]
batch = ["tokens-1500-cpu", "tokens-6000-cpu"]
longer = "recipe-seed-1-cpu-60-epochs"
below = de_ends.drop(["shipped", "recipe-seed-1-cpu", *smoothing, *batch, longer])
assert set(below[below < de_ends["recipe-seed-1-cpu"]].index) == set(four) | {
    "d_ff-1024"
}
lower_later = de_ends[[batch[0], longer]]  # half the batch, 60 epochs
assert lower_later.round(2).tolist() == [7.58, 7.57]
assert (
    lower_later.max() < de_ends[four].min() and lower_later.min() > de_ends["shipped"]
)
# dropout 0.4: far worse all the way, and it fits its training data less well
d4 = behind["dropout-0.4-cpu"]
assert 0.28 < d4[1] < 0.30 and 1.35 < d4[10] < 1.45 and 1.45 < d4[20] < 1.5
assert (d4.loc[1:35] > 0.25).all()
assert round(de_ends["dropout-0.4-cpu"], 2) == 20.74
assert round(de_ends["dropout-0.4-cpu"] / de_ends["shipped"], 1) == 2.8
assert round(de_accuracy["dropout-0.4-cpu"], 3) == 0.545
assert round(de_units["dropout-0.4-cpu"], 2) == 12.87
final_train_loss = (
    run_epochs[run_epochs["pair"] == "de-en"].groupby("run")["train_loss"].last()
)
assert [round(final_train_loss[n], 2) for n in ("dropout-0.4-cpu", "shipped")] == [
    1.73,
    1.08,
]


# %% [markdown]
# ### How much label smoothing
#
# The project's targets are perplexities, and label smoothing works against them by design. A model
# trained towards the smoothed target $q$ does best, on a token it is sure of, by giving that token
# $1 - \epsilon_{ls} + \epsilon_{ls}/V$ and no more, so the token still costs
# $-\ln(1 - \epsilon_{ls} + \epsilon_{ls}/V)$ nats of the validation NLL, where a model trained
# without smoothing could drive it towards zero. (On held-out sentences the shipped models are not
# too unsure overall: no temperature lowers their validation perplexity by even half a percent, "Is
# it the label smoothing?" above.) The paper accepted that cost: smoothing "hurts perplexity, as the
# model learns to be more unsure, but improves accuracy and BLEU score". On this corpus, though,
# turning it off made the perplexity higher (`no-label-smoothing`, above): without it the model
# overfits sooner. Between those ends, two German→English runs of the recipe on the project's CPU
# (post-norm, dropout 0.3, seed 0, 35 epochs, float32, one thread each, side by side, about 2.3
# hours each) try $\epsilon_{ls} = 0.05$ and $0.2$; the seed-1 run of the section above is the
# yardstick for chance. Besides perplexity and accuracy, the table gives each averaged model's
# validation sacreBLEU with the paper's search (beam 4, $\alpha = 0.6$; for the CPU runs kept by
# `tools/word_level_report.py --bleu`, for the shipped model translated here), for the paper's claim
# about BLEU, and the cost of a sure token for each $\epsilon_{ls}$:

# %%
from transformer.evaluate import score, translate_split

smoothing_runs = {  # run -> (label, ε)
    "label-smoothing-0.05-cpu": ("ε = 0.05, seed 0, CPU", 0.05),
    "shipped": ("ε = 0.1, seed 0, GPU (shipped)", 0.1),
    "recipe-seed-1-cpu": ("ε = 0.1, seed 1, CPU", 0.1),
    "label-smoothing-0.2-cpu": ("ε = 0.2, seed 0, CPU", 0.2),
}
shipped_val = translate_split(*load_model(CHECKPOINTS_DIR / "de-en"), "de-en", "val")
val_bleu = {"shipped": score(shipped_val.hypotheses, shipped_val.references).bleu}
ppl_unit = {"shipped": word_level["de-en"].ppl_unit}
for name in smoothing_runs.keys() - {"shipped"}:
    report = json.loads((twin_folder / name / "word_level.json").read_text())
    val_bleu[name] = report["val_bleu"]["sacrebleu"]
    ppl_unit[name] = report["ppl_unit"]
vocab = recipe.vocab_size  # 8,000


def averaged_runs(labels: dict[str, str], first=lambda name: {}) -> pd.DataFrame:
    """German→English runs' averaged models side by side, against the shipped one: what
    `first(name)` adds, then perplexity, accuracy, word-level perplexity and val BLEU."""
    return pd.DataFrame(
        [
            {
                "run": label,
                **first(name),
                "average ppl/word": round(de_ends[name], 2),
                "against shipped": f"{de_ends[name] / de_ends['shipped'] - 1:+.1%}",
                "token accuracy": round(de_accuracy[name], 3),
                "ppl per word-level token": round(ppl_unit[name], 2),
                "val sacreBLEU": round(val_bleu[name], 2),
            }
            for name, label in labels.items()
        ]
    ).set_index("run")


def sure_token_cost(name: str) -> dict[str, float]:
    eps = smoothing_runs[name][1]
    return {"sure token costs (nats)": round(-math.log(1 - eps + eps / vocab), 3)}


averaged_runs(
    {name: label for name, (label, _) in smoothing_runs.items()}, sure_token_cost
)

# %% [markdown]
# The curves from epoch 5 on; what to look for: whether the two new curves leave the band
# that the two runs with the paper's $\epsilon_{ls}$ span.

# %%
recipe_curves({name: label for name, (label, _) in smoothing_runs.items()})

# %% [markdown]
# What they show. Neither neighbour of the paper's $\epsilon_{ls}$ leaves what chance does to it.
# $\epsilon_{ls} = 0.05$ runs level with the shipped run for twenty epochs (within 2% after all but
# four of them), then falls behind and ends 4.7% above it (7.87 per word), 1.1% above the seed-1
# run; $\epsilon_{ls} = 0.2$ is 4.5% to 15.2% behind the shipped run after every epoch from the
# fourth and ends 5.5% above it (7.93), 1.8% above the seed-1 run. Both gaps to the seed-1 run are
# at most half the 3.6% between the two runs with $\epsilon_{ls} = 0.1$. The cost of a sure token
# explains little of it: it is 0.17 nats larger with $\epsilon_{ls} = 0.2$ than with 0.05, while the
# two runs' NLL per token differs by 0.006 nats (1.608 against 1.602), so few validation tokens are
# predicted that surely. In the direction the paper describes, the stronger smoothing has the better
# token accuracy (69.8% against 69.2%) and validation sacreBLEU (42.25 against 41.39) of the two CPU
# runs; but the two runs with the paper's value are 1.4 BLEU apart (42.81 and 41.38), so one seed
# each cannot establish that either. The paper's $\epsilon_{ls} = 0.1$ stays, and label smoothing,
# like dropout, depth and the vocabulary, is not where a 20% lower perplexity would come from.

# %%
ls_gap = {name: de_ends[name] / de_ends["shipped"] - 1 for name in smoothing}
ls_chance = {
    name: de_ends[name] / de_ends["recipe-seed-1-cpu"] - 1 for name in smoothing
}
ls_rel = de_ppl[smoothing].div(de_ppl["shipped"], axis=0) - 1
# ε = 0.05: within 2% for twenty epochs but four, then behind; ε = 0.2 behind from epoch 4
assert (ls_rel.loc[1:20, "label-smoothing-0.05-cpu"].abs() >= 0.02).sum() == 4
assert (ls_rel.loc[25:35, "label-smoothing-0.05-cpu"] > 0.01).all()
assert ls_rel.loc[4:35, "label-smoothing-0.2-cpu"].between(0.045, 0.153).all()
assert [round(ls_gap[n], 3) for n in smoothing] == [0.047, 0.055]
assert [round(ls_chance[n], 3) for n in smoothing] == [0.011, 0.018]
assert [round(de_ends[n], 2) for n in smoothing] == [7.87, 7.93]
# both within half of what the seed moved ε = 0.1
assert max(ls_chance.values()) < chance_gap / 2 + 0.001
sure = {eps: -math.log(1 - eps + eps / vocab) for eps in (0.05, 0.2)}
nll = run_averages.loc["de-en", "val_nll"]
assert round(sure[0.2] - sure[0.05], 2) == 0.17
assert [round(nll[n], 3) for n in smoothing] == [1.602, 1.608]
assert round(nll[smoothing[1]] - nll[smoothing[0]], 3) == 0.006
assert [round(de_accuracy[n], 3) for n in smoothing] == [0.692, 0.698]
assert [round(val_bleu[n], 2) for n in smoothing] == [41.39, 42.25]
assert [round(val_bleu[n], 2) for n in ("shipped", "recipe-seed-1-cpu")] == [
    42.81,
    41.38,
]

# %% [markdown]
# ### How many tokens per batch
#
# The recipe's batches of at most 3,000 padded tokens per side rest on arithmetic alone (the recipe
# table): about 160 updates per epoch. Two more German→English runs of the recipe on the project's
# CPU (post-norm, dropout 0.3, seed 0, 35 epochs, float32, one thread each, side by side) halve and
# double it: at most 1,500 tokens, about twice the updates, and 6,000, about half as many. Each
# keeps the warm-up at about five epochs (1,600 and 400 updates) and the factor 0.7, so the peak
# learning rate moves with the square root of the batch size (divided and multiplied by $\sqrt 2$),
# a common rule of thumb for Adam; the seed-1 run is again the yardstick for chance:

# %%
batch_runs = {  # run -> label
    "tokens-1500-cpu": "1,500 tokens, seed 0, CPU",
    "shipped": "3,000 tokens, seed 0, GPU (shipped)",
    "recipe-seed-1-cpu": "3,000 tokens, seed 1, CPU",
    "tokens-6000-cpu": "6,000 tokens, seed 0, CPU",
}
for name in batch_runs.keys() - {"shipped", "recipe-seed-1-cpu"}:
    report = json.loads((twin_folder / name / "word_level.json").read_text())
    val_bleu[name] = report["val_bleu"]["sacrebleu"]
    ppl_unit[name] = report["ppl_unit"]
# the updates of the 35 epochs each average is made of (a GPU run's partial 36th left out)
updates = run_epochs[run_epochs["pair"] == "de-en"].groupby("run")["step"].max()
averaged_runs(batch_runs, lambda name: {"updates": int(updates[name])})

# %% [markdown]
# The curves from epoch 5 on; what to look for: whether the two new curves leave the band
# that the two runs of the recipe span, and in which direction.

# %%
recipe_curves(batch_runs)

# %% [markdown]
# What they show. Halving the batch doubles the updates (11,235 against the shipped run's 5,635) and
# buys a faster start, not a lower end. With 1,500 tokens the run is below the shipped run after
# each of its first 25 epochs, by 26.5% after the first and 4.5% after the fifteenth, then level
# with it for the last ten (from 1.3% below to 2.1% above); it is below the seed-1 run after every
# epoch. Its average, 7.58 per word, is 0.9% above the shipped run's and 2.6% below the seed-1
# run's, inside the 3.6% that the seed alone moved the recipe; its token accuracy is the shipped
# run's (69.8%), its perplexity per word-level token 5.51 against 5.47, and its validation
# sacreBLEU, 41.98, lies between the two runs of the recipe. What 35 epochs give here follows the
# passes over the data more than the number of updates: after 5,778 updates, about as many as the
# shipped run made in its 35 epochs, it was at epoch 18 and 9.50 per word, 23% above the shipped
# run's last epoch (7.72).
#
# Doubling the batch halves the updates (2,835) and falls far behind: 28% above the shipped run
# after the first epoch, 61% to 146% above it after every epoch from the sixth, 12.38 per word on
# average (65% higher) and 31.80 validation sacreBLEU. Fewer updates are not the whole story: at
# about the same count, epochs 17 and 18 with 2,737 and 2,898 updates, the shipped run was at
# 10.07 and 9.97, and the last epoch of the larger batches (12.39) is 23% and 24% above those,
# although each of their updates had twice the tokens. The larger peak learning rate or the
# shorter warm-up that came with the larger batch may be what cost it; one run cannot say which.
# Its perplexity was still falling at the end, by 3.2% and 2.3% in its last two epochs, so more
# epochs would narrow the gap. The recipe's 3,000 tokens stay: half of it ends no lower at twice
# the updates, and double it ends far higher in the same 35 epochs.

# %%
batch_rel = de_ppl[batch].div(de_ppl["shipped"], axis=0) - 1
small, large = batch
assert [int(updates[n]) for n in (small, "shipped", large)] == [11_235, 5_635, 2_835]
# 1,500 tokens: ahead for 25 epochs (26.5% after one, 4.5% after 15), then level for ten
assert (batch_rel.loc[1:25, small] < 0).all()
assert [round(batch_rel.loc[e, small], 3) for e in (1, 15)] == [-0.265, -0.045]
assert round(batch_rel.loc[26:35, small].min(), 3) == -0.013
assert round(batch_rel.loc[26:35, small].max(), 3) == 0.021
assert (de_ppl.loc[1:35, small] < de_ppl.loc[1:35, "recipe-seed-1-cpu"]).all()
assert round(de_ends[small], 2) == 7.58
assert round(de_ends[small] / de_ends["shipped"] - 1, 3) == 0.009
assert round(de_ends[small] / de_ends["recipe-seed-1-cpu"] - 1, 3) == -0.026
assert (
    abs(de_ends[small] / de_ends["shipped"] - 1) < chance_gap
)  # inside the seed's 3.6%
assert round(de_accuracy[small], 3) == round(de_accuracy["shipped"], 3) == 0.698
assert round(ppl_unit[small], 2) == 5.51
assert round(val_bleu[small], 2) == 41.98
assert val_bleu["recipe-seed-1-cpu"] < val_bleu[small] < val_bleu["shipped"]
# ... at the shipped run's number of updates it was at epoch 18, 23% above that run's end
at_18 = run_epochs[(run_epochs["run"] == small) & (run_epochs["epoch"] == 18)].iloc[0]
assert int(at_18["step"]) == 5_778 and round(at_18["val_ppl_word"], 2) == 9.50
assert round(de_ppl.loc[35, "shipped"], 2) == 7.72
assert round(at_18["val_ppl_word"] / de_ppl.loc[35, "shipped"] - 1, 2) == 0.23
# 6,000 tokens: behind after every epoch, 61%-146% from the sixth; 65% higher on average
assert round(batch_rel.loc[1, large], 2) == 0.28
assert (batch_rel.loc[1:35, large] > 0).all()
assert round(batch_rel.loc[6:35, large].min(), 2) == 0.61
assert round(batch_rel.loc[6:35, large].max(), 2) == 1.46
assert round(de_ends[large], 2) == 12.38
assert round(de_ends[large] / de_ends["shipped"] - 1, 2) == 0.65
assert round(val_bleu[large], 2) == 31.80
# ... at about the same number of updates it is 23% and 24% above the shipped run
shipped_epochs = run_epochs[run_epochs["run"] == "shipped"].set_index("epoch")
shipped_epochs = shipped_epochs[shipped_epochs["pair"] == "de-en"]
assert [int(shipped_epochs.loc[e, "step"]) for e in (17, 18)] == [2_737, 2_898]
assert [round(shipped_epochs.loc[e, "val_ppl_word"], 2) for e in (17, 18)] == [
    10.07,
    9.97,
]
assert round(de_ppl.loc[35, large], 2) == 12.39
level = de_ppl.loc[35, large] / shipped_epochs.loc[17:18, "val_ppl_word"] - 1
assert [round(x, 2) for x in level] == [0.23, 0.24]
# ... and still falling in its last two epochs, by 3.2% and 2.3%
falls = 1 - de_ppl.loc[34:35, large].to_numpy() / de_ppl.loc[33:34, large].to_numpy()
assert [round(f, 3) for f in falls] == [0.032, 0.023]


# %% [markdown]
# ### A longer run with its own average
#
# The recipe stops after 35 epochs with its validation perplexity still falling, and the
# German→English 110-epoch run reaches its lowest only at epoch 57, but its average was taken at
# epoch 110, long past it. So the seed-1 run of the recipe, on the project's CPU, went on from its
# epoch-35 checkpoint to epoch 60 (`--resume --epochs 60` in a copy of its folder, which restores
# the run's state exactly, though on two threads where the first 35 epochs had one, so not to the
# last digit), and averaged its last five epochs again, 56 to 60. Its first 35 epochs are those of
# `recipe-seed-1-cpu`, so the two averages differ by the 25 epochs, not by the seed (where the five
# are taken still moves an average, below):

# %%
longer = "recipe-seed-1-cpu-60-epochs"
longer_report = json.loads((twin_folder / longer / "word_level.json").read_text())
val_bleu[longer] = longer_report["val_bleu"]["sacrebleu"]
ppl_unit[longer] = longer_report["ppl_unit"]
longer_runs = {  # run -> label
    "shipped": "seed 0, GPU, 35 epochs (shipped)",
    "recipe-seed-1-cpu": "seed 1, CPU, 35 epochs",
    longer: "seed 1, CPU, 60 epochs",
}


def last_five(name: str) -> dict[str, str]:
    last = int(comparison.loc[("de-en", name), "epochs"])
    return {"averaged epochs": f"{last - 4}-{last}"}


averaged_runs(longer_runs, last_five)

# %% [markdown]
# The single epochs from epoch 30 on, with the shipped run's 110-epoch continuation on the GPU
# for the shape of what comes later (on a linear scale: the curves of the other sections, on a
# logarithmic one from epoch 5, hide these last few percent); what to look for: how much the
# curves still fall after epoch 35, and where they flatten.

# %%
late_labels = {
    "110-epochs": "seed 0, GPU, 110 epochs (the shipped run continued)",
    longer: "seed 1, CPU, 60 epochs",
}
late_epochs = run_epochs[
    (run_epochs["pair"] == "de-en")
    & run_epochs["run"].isin(late_labels)
    & (run_epochs["epoch"] >= 30)
][["run", "epoch", "val_ppl_word"]]
(
    alt.Chart(late_epochs.assign(recipe=late_epochs["run"].map(late_labels)))
    .mark_line(point=alt.OverlayMarkDef(size=12))
    .encode(
        x=alt.X("epoch:Q", scale=alt.Scale(nice=False)),
        y=alt.Y(
            "val_ppl_word:Q",
            title="validation perplexity per word",
            scale=alt.Scale(zero=False),
        ),
        color=alt.Color(
            "recipe:N",
            title=None,
            sort=list(late_labels.values()),
            legend=alt.Legend(orient="bottom", labelLimit=0),
        ),
        tooltip=["run", "epoch", alt.Tooltip("val_ppl_word:Q", format=".3f")],
    )
    .properties(width=420, height=220)
)

# %% [markdown]
# What they show. The 25 more epochs lower the seed-1 run's average by 2.8%, from 7.78 to 7.57 per
# word: 0.7% above the shipped run, where it was 3.6% above. That is a little less than what the
# second seed moved the recipe, and a seventh of the 20% the German→English target lacks. The
# single epochs show why it is not more. The curve falls until about epoch 41, then it has no
# trend left: every epoch from 41 to 60 lies between 7.71 and 7.89. The GPU continuation flattens
# a little earlier and lower: every epoch from 38 to 60 lies between 7.49 and 7.68. The best
# single epoch of each run is about 3% below its epoch 35 (3.4% on the CPU, at epoch 58; 2.9% on
# the GPU, at epoch 57). The token accuracy keeps rising, from 69.0% to 70.3% for the averages,
# past the target's 70%, as the 110-epoch run's average did (71.0%, at 8.07 per word); the target
# asks for both, and the perplexity is the one far off. The validation sacreBLEU is 42.74, against
# 41.38 after 35 epochs and the shipped run's 42.81.
#
# ### Which epochs to average
#
# The trainer keeps the weights of the last five epochs only, to average them at the end. From epoch
# 47 on, this run's weights were copied aside as it trained; the weights of epochs 31 to 35 were
# still in the 35-epoch run's folder; those of epochs 36 to 46 were gone. `tools/average_windows.py`
# averaged every five consecutive kept epochs, the last ten and all fourteen from 47, and validated
# each average as the trainer does, into the comparison folder's `averages.json`. What to look for:
# whether the averages follow the single epochs' ups and downs, how far below them they lie, and
# where the longer averages (the bars) fall against the grey line, the shipped run's average.

# %%
windows = pd.DataFrame(
    json.loads((twin_folder / longer / "averages.json").read_text())["windows"]
)
windows["size"] = windows["last"] - windows["first"] + 1
fives = windows[windows["size"] == 5].set_index("last")["val_ppl_word"]
single = de_ppl.loc[31:60, longer]
spans = windows[windows["size"].isin([10, 14])]  # drawn across the epochs they average
window_points = pd.concat(
    [
        pd.DataFrame({"epoch": single.index, "ppl": single, "what": "single epoch"}),
        pd.DataFrame(
            {"epoch": fives.index, "ppl": fives, "what": "average of the 5 ending here"}
        ),
        pd.DataFrame(
            {
                "epoch": spans["first"],
                "to": spans["last"],
                "ppl": spans["val_ppl_word"],
                "what": "average of the 10 or 14 under the bar",
            }
        ),
    ]
)
what = [
    "single epoch",
    "average of the 5 ending here",
    "average of the 10 or 14 under the bar",
]
by_what = alt.Color(
    "what:N", title=None, sort=what, legend=alt.Legend(orient="bottom", labelLimit=0)
)
ppl_axis = alt.Y(
    "ppl:Q",
    title="validation perplexity per word",
    scale=alt.Scale(domain=[7.4, 8.2]),
)
tooltip = ["what", "epoch", alt.Tooltip("ppl:Q", format=".3f")]
(
    alt.Chart(window_points[window_points["what"] == what[0]])
    .mark_line()
    .encode(
        x=alt.X("epoch:Q", title="epoch", scale=alt.Scale(domain=[30, 61], nice=False)),
        y=ppl_axis,
        color=by_what,
        tooltip=tooltip,
    )
    + alt.Chart(window_points[window_points["what"] == what[1]])
    .mark_point(filled=True, size=40)
    .encode(x="epoch:Q", y=ppl_axis, color=by_what, tooltip=tooltip)
    + alt.Chart(window_points[window_points["what"] == what[2]])
    .mark_rule(strokeWidth=3)
    .encode(
        x=alt.X("epoch:Q", title="epoch"),
        x2=alt.X2("to:Q", title=None),
        y=ppl_axis,
        color=by_what,
        tooltip=[*tooltip, "to"],
    )
    + alt.Chart(pd.DataFrame({"ppl": [de_ends["shipped"]]}))
    .mark_rule(color="grey", strokeDash=[4, 4])
    .encode(y=ppl_axis)
).properties(width=420, height=240)

# %% [markdown]
# The windows that matter, against the shipped run's average and against the same run's
# average after 35 epochs:

# %%
windows["averaged epochs"] = (
    windows["first"].astype(str) + "-" + windows["last"].astype(str)
)


def signed_percent(x: float) -> str:
    return f"{round(x, 3) + 0.0:+.1%}"  # + 0.0: a rounded -0.0 shows as +0.0%


window_table = (
    windows.assign(
        **{
            "ppl/word": windows["val_ppl_word"].round(3),
            "against shipped": (windows["val_ppl_word"] / de_ends["shipped"] - 1).map(
                signed_percent
            ),
            "against epochs 31-35": (
                windows["val_ppl_word"] / de_ends["recipe-seed-1-cpu"] - 1
            ).map(signed_percent),
            "token accuracy": windows["val_accuracy"].round(3),
        }
    )
    .set_index("averaged epochs")
    .loc[["31-35", "47-51", "53-57", "56-60", "51-60", "47-60", "60-60"]][
        ["ppl/word", "against shipped", "against epochs 31-35", "token accuracy"]
    ]
    .rename(index={"60-60": "60 (the last epoch alone)"})
)
window_table

# %% [markdown]
# The averages do follow the single epochs, smoothed, and each lies 1.3% to 2.8% below the best
# single epoch it averages. Where, from epoch 47 on, the five are taken moves the average by 1.7%:
# the best five end at epoch 51 (7.51, level with the shipped run), the worst at 57 (7.63). The
# run's own, 56 to 60, is neither. Where matters as much as how many: the last ten, 51 to 60, give
# 7.54, higher than the five from 47 to 51, and all fourteen from 47 give 7.50, the lowest of all,
# 3.7% below the run's average after 35 epochs and 0.9% below its own after 60. Averaging costs no
# training, and a longer run with a longer average gains 3.1% (the last ten, as `targets-long`
# keeps them) to 3.7% (all fourteen from 47) on this seed. It does not change what the other
# sections found: the recipe's other settings are not where 20% would come from, and neither is
# its length. The book's shipped models keep their 35 epochs. `tools/gpu_sweep.py targets-long`
# trains both pairs for up to 60 epochs (as many as its 7 minutes allow) with ten-epoch averages,
# seeds 0 and 1, for a GPU session to say whether the gain holds for the shipped seed and for
# French→English.

# %%
# The 60-epoch run is the seed-1 run continued: its first 35 epochs are that run's records.
first35 = run_epochs[
    (run_epochs["pair"] == "de-en")
    & (run_epochs["run"] == longer)
    & (run_epochs["epoch"] <= 35)
]
seed1 = run_epochs[
    (run_epochs["pair"] == "de-en") & (run_epochs["run"] == "recipe-seed-1-cpu")
]
for column in ("train_loss", "val_loss", "val_ppl_word", "val_accuracy"):
    assert list(first35[column]) == list(seed1[column])
# averages.json validates as the trainer does: it gives back both of the run's own averages
window_ppl = windows.set_index("averaged epochs")["val_ppl_word"]
assert math.isclose(window_ppl["31-35"], de_ends["recipe-seed-1-cpu"], rel_tol=1e-5)
assert math.isclose(window_ppl["56-60"], de_ends[longer], rel_tol=1e-5)
assert math.isclose(window_ppl["60-60"], single[60], rel_tol=1e-5)
# 25 more epochs: 2.8% lower, from 7.78 to 7.57, 0.7% above the shipped run (3.6% at 35)
assert round(de_ends[longer] / de_ends["recipe-seed-1-cpu"] - 1, 3) == -0.028
assert [round(de_ends[n], 2) for n in ("recipe-seed-1-cpu", longer)] == [7.78, 7.57]
assert round(de_ends[longer] / de_ends["shipped"] - 1, 3) == 0.007
assert round(chance_gap, 3) == 0.036
# the curve falls until about epoch 41, then stays in a band, on both machines
gpu_long = de_ppl["110-epochs"]
assert single.loc[41:60].between(7.71, 7.89).all() and single.loc[35:40].min() > 7.86
assert gpu_long.loc[38:60].between(7.49, 7.68).all() and gpu_long[37] > 7.68
best_cpu, best_gpu = single.idxmin(), gpu_long.idxmin()
assert (best_cpu, best_gpu) == (58, 57)
assert round(1 - single[best_cpu] / single[35], 3) == 0.034
assert round(1 - gpu_long[best_gpu] / gpu_long[35], 3) == 0.029
# accuracy: 69.0% after 35, 70.3% after 60; BLEU 42.74 against 41.38 and the shipped 42.81
assert [round(de_accuracy[n], 3) for n in ("recipe-seed-1-cpu", longer)] == [
    0.69,
    0.703,
]
assert de_accuracy[longer] >= 0.70 > de_accuracy["recipe-seed-1-cpu"]
assert (
    round(de_accuracy["110-epochs"], 3) == 0.71
    and round(de_ends["110-epochs"], 2) == 8.07
)
assert [round(val_bleu[n], 2) for n in (longer, "recipe-seed-1-cpu", "shipped")] == [
    42.74,
    41.38,
    42.81,
]
# each average (of 5, 10 or 14) 1.3% to 2.8% below the best single epoch it averages
below_best = [
    w.val_ppl_word / single.loc[w.first : w.last].min() - 1
    for w in windows[windows["size"] > 1].itertuples()
]
assert [round(min(below_best), 3), round(max(below_best), 3)] == [-0.028, -0.013]
# where the five are taken: best ending at 51, worst at 57, 1.7% apart
late_fives = fives.loc[51:]  # the windows of epochs 47 to 60
assert (late_fives.idxmin(), late_fives.idxmax()) == (51, 57)
assert round(late_fives.max() / late_fives.min() - 1, 3) == 0.017
assert [round(fives[e], 2) for e in (51, 57)] == [7.51, 7.63]
assert abs(fives[51] / de_ends["shipped"] - 1) < 0.001
# all fourteen from 47: the lowest, 3.7% below epochs 31-35, 0.9% below 56-60
assert window_ppl.idxmin() == "47-60" and round(window_ppl["47-60"], 2) == 7.50
assert round(window_ppl["47-60"] / window_ppl["31-35"] - 1, 3) == -0.037
assert round(window_ppl["47-60"] / window_ppl["56-60"] - 1, 3) == -0.009
# the last ten: 7.54, above the five from 47 to 51, 3.1% below epochs 31-35
assert (
    round(window_ppl["51-60"], 2) == 7.54 and window_ppl["51-60"] > window_ppl["47-51"]
)
assert round(window_ppl["51-60"] / window_ppl["31-35"] - 1, 3) == -0.031

# %% [markdown]
# ## Where the gap stands
#
# The targets ask for a perplexity per word 20% below the shipped German→English model's and 32%
# below the French→English model's. In the quantity that training lowers, the NLL per word (the
# logarithm of the perplexity), that is 11% and 22% less. The table sets every way of lowering it
# that this chapter measured beside that distance, each as its change against the shipped model:
# the lowest average of all the comparison runs of the pair, the best temperature (chosen on the
# validation split itself, so an upper bound on what a temperature can do), and for
# French→English the two runs as an ensemble.

# %%
ENSEMBLE = "the shipped and seed-1 runs as an ensemble"
run_ends = run_averages["val_ppl_word"].drop(index="shipped", level="run")
# the (pair, run) of each pair's lowest comparison run
lowest_run = run_ends.groupby(level="pair").idxmin()
best_tempered_nll = (
    tempered[tempered["split"] == "validation"].groupby("pair")["nll"].min()
)
shipped_ppl = averages["val_ppl_word"]
distance_rows = []
for pair, (target_ppl, _) in TARGETS.items():
    measured = {
        "shipped model": shipped_ppl[pair],
        f"lowest comparison run ({lowest_run[pair][1]})": run_ends[lowest_run[pair]],
        "best temperature on validation": math.exp(
            best_tempered_nll[pair] / val_words[pair]
        ),
    }
    if pair == "fr-en":
        measured[ENSEMBLE] = together.loc["the two as an ensemble", "ppl/word"]
    measured["target"] = target_ppl
    distance_rows += [
        {
            "pair": pair,
            "what": what,
            "ppl/word": ppl,
            "against the shipped model": ppl / shipped_ppl[pair] - 1,
            "NLL per word against it": math.log(ppl) / math.log(shipped_ppl[pair]) - 1,
        }
        for what, ppl in measured.items()
    ]
distance = pd.DataFrame(distance_rows).set_index(["pair", "what"])
changes = ["against the shipped model", "NLL per word against it"]
distance.round({"ppl/word": 2}).assign(
    **{column: distance[column].map("{:+.1%}".format) for column in changes}
)

# %% [markdown]
# The same as a picture: each pair's validation perplexity per word on a logarithmic scale, its
# comparison runs in grey, the shipped model as a blue diamond, the ensemble as an orange square,
# and the target as a red tick (the nine runs that end above 13 per word are off the scale). What
# to look for: the shipped model sits at or near the left end of its pair's runs, and the target
# lies well to the left of every point, the ensemble's included.

# %%
X_MAX = 13.0
KINDS = {
    "comparison run": "#bbbbbb",
    "shipped model": "#1f77b4",
    "ensemble of two runs": "#ff7f0e",
}
dots = pd.DataFrame(
    [
        {"pair": p, "what": "comparison run", "run": r, "ppl/word": v}
        for (p, r), v in run_ends.items()
    ]
    + [
        {"pair": p, "what": "shipped model", "run": "shipped", "ppl/word": v}
        for p, v in shipped_ppl.items()
    ]
    + [
        {
            "pair": "fr-en",
            "what": "ensemble of two runs",
            "run": "shipped + recipe-seed-1-cpu",
            "ppl/word": distance.loc[("fr-en", ENSEMBLE), "ppl/word"],
        }
    ]
).round({"ppl/word": 2})
shown = dots[dots["ppl/word"] <= X_MAX]
ppl_axis = alt.X(
    "ppl/word:Q",
    title="validation perplexity per word",
    scale=alt.Scale(type="log", domain=[3.5, X_MAX], nice=False),
)
pair_axis = alt.Y("pair:N", title=None)
points = (
    alt.Chart(shown)
    .mark_point(filled=True, size=90, opacity=0.8)
    .encode(
        x=ppl_axis,
        y=pair_axis,
        color=alt.Color(
            "what:N",
            title=None,
            scale=alt.Scale(domain=list(KINDS), range=list(KINDS.values())),
        ),
        shape=alt.Shape(
            "what:N",
            title=None,
            scale=alt.Scale(domain=list(KINDS), range=["circle", "diamond", "square"]),
        ),
        tooltip=["pair", "run", "ppl/word"],
    )
)
target_ticks = (
    alt.Chart(targets)
    .mark_tick(color="#d62728", thickness=3, size=30)
    .encode(x="val_ppl_word:Q", y=pair_axis, tooltip=["pair", "val_ppl_word"])
)
(points + target_ticks).properties(
    width=520, height=120, title="Every run measured, and the targets (red)"
)

# %% [markdown]
# No single run comes within a fifth of the distance. Of the German→English comparison runs,
# none ends lower than the shipped run; of the French→English ones, the recipe in the pre-norm
# order with seed 0 ends 2.6% lower, and the same recipe with seed 1 4.3% above that. The
# ensemble, the largest step measured, goes about a third of the way, and the best temperature
# less than a fiftieth. What is left untried on this recipe is prepared for a GPU
# (`tools/gpu_sweep.py`, phases `targets`, `targets-fr` and `targets-long`, each with two seeds:
# four pre-norm layers and other vocabularies for French→English, 60 epochs with a ten-epoch
# average for both pairs); on the CPU, 60 epochs lowered the German→English seed-1 run's average
# by 2.8%. Whatever closes the gap is likely of another kind: more data, such as back-translated
# captions or one model trained on both pairs, or another model. In the unit of the word-level
# implementations that the brief quotes, the German→English model already meets both targets,
# and the French→English model lacks about a tenth of its perplexity and one point of accuracy
# (the section "Which words").
#
# The chapters that follow translate with these two models: greedy decoding with a key/value
# cache, the paper's beam search, and their scores on the test split.

# %%
steps = -distance["against the shipped model"]  # how much lower than the shipped model
needed = steps.xs("target", level="what")
assert [round(needed[p], 3) for p in TARGETS] == [0.201, 0.318]
nll_needed = -distance["NLL per word against it"].xs("target", level="what")
assert [round(nll_needed[p], 3) for p in TARGETS] == [0.111, 0.216]
# the comparison runs: none below the shipped de-en run, at most a fifth of the way
assert run_ends["de-en"].min() > shipped_ppl["de-en"]
assert (run_ends.groupby(level="pair").min() > (1 - needed / 5) * shipped_ppl).all()
assert lowest_run["fr-en"] == ("fr-en", "recipe-pre-norm-cpu")
fr_pre = run_ends["fr-en"][["recipe-pre-norm-cpu", "recipe-pre-norm-cpu-seed-1"]]
assert round(1 - fr_pre.iloc[0] / shipped_ppl["fr-en"], 3) == 0.026
assert round(fr_pre.iloc[1] / fr_pre.iloc[0] - 1, 3) == 0.043
# the ensemble about a third of the way; the best temperature under a fiftieth
assert 0.3 < steps[("fr-en", ENSEMBLE)] / needed["fr-en"] < 0.36
temperature_steps = steps.xs("best temperature on validation", level="what")
assert (temperature_steps / needed < 1 / 50).all()
assert (dots["ppl/word"] > X_MAX).sum() == 9
# every point of each pair lies above that pair's target
assert (
    shown.groupby("pair")["ppl/word"].min() > targets.set_index("pair")["val_ppl_word"]
).all()
# per word-level token, fr-en about 10% and one point short (de-en meets both: "Which words")
fr_unit = word_level["fr-en"]
assert 0.09 < 1 - TARGETS["fr-en"][0] / fr_unit.ppl_unit < 0.11
assert 0.005 < TARGETS["fr-en"][1] - fr_unit.unit_accuracy < 0.015
