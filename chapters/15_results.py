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
# # Results: BLEU, chrF, and what the models learned
#
# The book ships two translation models, German→English and French→English, trained by Part II's
# recipe on Multi30k. This chapter measures how good their translations are, what beam search
# adds, where the models fail, and what their attention heads do.
#
# **BLEU** {cite:p}`papineni2002bleu` compares a system's output with a reference translation by
# counting shared word $n$-grams over the whole test set. With $p_n$ the *clipped* precision of
# $n$-grams ($n = 1, \dots, 4$), the share of the output's $n$-grams that also occur in the
# reference, each counted at most as often as the reference holds it (so that "the the the"
# does not match one "the" three times), $c$ the length of the output and $r$ that of the
# references, in words,
#
# $$
# \text{BLEU} = \text{BP} \cdot \exp\Big(\frac{1}{4} \sum_{n=1}^{4} \log p_n\Big), \qquad
# \text{BP} = \min\big(1, e^{\,1 - r/c}\big).
# $$
#
# Precision alone would reward outputs that say little, so the *brevity penalty* BP punishes
# outputs shorter than their references. The paper reports BLEU on WMT 2014 English→German
# (Table 2): 27.3 for its base model, whose defaults this book follows, and 28.4 for
# Transformer (big). Neither compares with ours: another test set, the other direction, and BLEU
# over tokenised text.
#
# BLEU depends on how the text is cut into words and whether case counts. **sacreBLEU**
# {cite:p}`post2018call` fixes those choices: it takes detokenised output, as a user reads it, and
# the raw references, applies its own tokenizer (`13a`) to both, and prints a *signature* that
# names every choice. We report sacreBLEU, cased, with its signature, and **chrF**
# {cite:p}`popovic2015chrf`, an F-score over character $n$-grams ($n \le 6$, recall weighted
# twice, $\beta = 2$), which gives partial credit for a word with the wrong ending. Published
# Multi30k results mostly score lowercased text cut into words by a tokenizer; to compare with
# them we also print that number, labelled as such everywhere.
#
# The chapter exports `transformer.evaluate`, the scores.

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
#| default_exp evaluate

# %%
import altair as alt
import pandas as pd
import torch

from transformer.plots import use_book_renderer

use_book_renderer()
pd.set_option("display.max_colwidth", None)

# %% [markdown]
# ## Scores
#
# `score` computes three numbers for a list of translations and their references (one reference
# per sentence, as Multi30k has): **sacreBLEU** with its defaults (cased, the `13a` tokenizer),
# **chrF** with its defaults, and the **lowercased spaCy-tokenised BLEU** of published results
# (`lc_tok_bleu`: words cut by spaCy's English rules, scored with `lowercase=True` and
# `tokenize="none"`, as torchtext's `bleu_score` scores them). `Scores` keeps them with their
# signatures, and BLEU's length ratio $c/r$ and brevity penalty, which tell whether a system's
# outputs are too short.

# %% tags=["hide-input"]
#| export
"""Scoring translations: sacreBLEU's BLEU and chrF with their signatures (Post,
2018), and the lowercased tokenised BLEU of published Multi30k results."""

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from transformer.paths import CHECKPOINTS_DIR
from transformer.tokenizer import MARK, pretokenize

# The name of the lowercased tokenised BLEU wherever it is printed: not
# comparable with sacreBLEU.
LC_TOK_BLEU = "BLEU lowercased, spaCy-tokenised"


def spacy_words(texts: Sequence[str], language: str = "en") -> list[str]:
    """Each text cut into words by spaCy's rules for `language`, the words
    joined by spaces."""
    return [
        " ".join(word.removeprefix(MARK) for word in words)
        for words in pretokenize(texts, language)
    ]


def lc_tok_bleu(
    hypotheses: Sequence[str], references: Sequence[str], language: str = "en"
) -> tuple[float, str]:
    """BLEU of lowercased text cut into words by spaCy (tok:none after that),
    and its signature: comparable with published Multi30k results that use
    spaCy's words (torchtext's `bleu_score`), only roughly with
    Moses-tokenised ones, and not with sacreBLEU's BLEU."""
    # The text is cut into words already: no second tokenizer, and no warning
    # about it.
    bleu = BLEU(lowercase=True, tokenize="none", force=True)
    found = bleu.corpus_score(
        spacy_words(hypotheses, language), [spacy_words(references, language)]
    )
    return found.score, str(bleu.get_signature())


@dataclass(frozen=True)
class Scores:
    """Corpus scores in percent, with their signatures: sacreBLEU's BLEU, its
    length ratio and brevity penalty, chrF, and the published results' BLEU."""

    sentences: int
    bleu: float
    chrf: float
    length_ratio: float
    brevity_penalty: float
    bleu_lc_tok: float
    bleu_signature: str
    chrf_signature: str
    bleu_lc_tok_signature: str

    def report(self) -> str:
        """The scores with their signatures, one per line."""
        lc_tok = (
            f"{LC_TOK_BLEU}, only to compare with published Multi30k results"
        )
        return (
            f"sacreBLEU {self.bleu:6.2f}  {self.bleu_signature}\n"
            f"          (output/reference length {self.length_ratio:.3f},"
            f" brevity penalty {self.brevity_penalty:.3f})\n"
            f"chrF      {self.chrf:6.2f}  {self.chrf_signature}\n"
            f"{lc_tok}: {self.bleu_lc_tok:.2f}  {self.bleu_lc_tok_signature}"
        )


# %%
#| export
def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    language: str = "en",
) -> Scores:
    """sacreBLEU's BLEU and chrF of detokenised translations against the raw
    references (one per sentence), and the lowercased spaCy-tokenised BLEU;
    `language`: the references'."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("score takes sequences of sentences, not one string")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} translations but {len(references)} references"
        )
    if not references:
        raise ValueError("no sentences to score")
    hypotheses, references = list(hypotheses), list(references)
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    lc_tok, lc_tok_signature = lc_tok_bleu(hypotheses, references, language)
    return Scores(
        sentences=len(references),
        bleu=bleu_score.score,
        chrf=chrf_score.score,
        length_ratio=bleu_score.ratio,
        brevity_penalty=bleu_score.bp,
        bleu_lc_tok=lc_tok,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_lc_tok_signature=lc_tok_signature,
    )


# %% [markdown]
# `python -m transformer evaluate --json FILE` keeps its scores as data: the pair, the split,
# the decoding options, the SHA-256 of the model's files and the scores with their signatures.
# The shipped models' records are in `checkpoints/scores/`, which every page and model card that
# states a score reads, with the search that made it.

# %% tags=["hide-input"]
#| export
# The shipped models' evaluations, as `evaluate --json` wrote them: <pair>.json
# with evaluate's defaults, <pair>.greedy.json with --beam 1, <pair>.last.json
# of the last epoch's weights (--checkpoint checkpoints/<pair>/last).
STORED_SCORES = CHECKPOINTS_DIR / "scores"


def search_label(beam_size: int, alpha: float, **_) -> str:
    """The search that made a score, as every score's label says it."""
    return "greedy" if beam_size == 1 else f"beam {beam_size}, α {alpha:g}"


def scores_record(
    scores: Scores, *, pair: str, split: str, options: dict, model: str
) -> dict:
    """A scored run as data: what was translated, by which options and model
    (`model`: the SHA-256 of its files), and the scores."""
    return {
        "pair": pair,
        "split": split,
        "options": options,
        "model_sha256": model,
        "scores": dataclasses.asdict(scores),
    }


def stored_scores(name: str) -> tuple[Scores, dict]:
    """The Scores of the stored record `name` ("de-en", "de-en.greedy"), and
    the record."""
    path = STORED_SCORES / f"{name}.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    return Scores(**record["scores"]), record


# %% [markdown]
# Two made-up translations of two references. The first is right but for one word; the second
# begins with a small letter, misses "the" and says "kids" for "children". sacreBLEU counts "two"
# and "Two" as different words, the lowercased BLEU does not:

# %%
from transformer.evaluate import score

toy_refs = [
    "A dog runs across a green meadow.",
    "Two children play in the snow.",
]
toy_hyps = ["A dog runs across a green field.", "two kids play in snow."]
toy = score(toy_hyps, toy_refs)
print(toy.report())
assert toy.bleu_lc_tok > toy.bleu
assert round(score(toy_refs, toy_refs).bleu, 6) == 100.0

# %% [markdown]
# ## sacreBLEU on the test set
#
# Beam search with the package's default options (the paper's are $K = 4$ and $\alpha = 0.6$),
# over the 1,000 sentences of `test_2016_flickr`, the Multi30k test set that published results
# use, for both shipped models. The package's command line does it: `python -m transformer evaluate`
# translates a split with the batched form of the decoding chapter's beam search (the appendix
# [Translating text](a08_translating.ipynb); a test holds its translations identical to the
# chapter's), prints the scores of `score` above, with `--output` writes the translations, which
# the rest of this chapter reads, and with `--json` the record of the run. Each score below is
# labelled with the options of that record, and the record must equal the stored one.

# %% tags=["nbval-ignore-output"]
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

from transformer.evaluate import Scores, search_label, stored_scores
from transformer.multi30k import load_pairs

NAMES = {"de-en": "German→English", "fr-en": "French→English"}
outputs = Path(tempfile.mkdtemp())


def evaluate(name: str, *options: str) -> SimpleNamespace:
    """The test split's sources and references, its translations by the
    command line with `options`, and the record of their scores, which must
    be the stored record `name`."""
    pair = name.split(".")[0]
    path, record = outputs / f"{name}.txt", outputs / f"{name}.json"
    command = ["evaluate", "--pair", pair, *options, "--json", record]
    run = [sys.executable, "-m", "transformer", *command, "--output", path]
    subprocess.run(run, capture_output=True, check=True)
    record = json.loads(record.read_text(encoding="utf-8"))
    assert record == stored_scores(name)[1], f"{name}: not the stored scores"
    test_pairs = load_pairs("test_2016_flickr", pair)
    return SimpleNamespace(
        sources=[source for source, _ in test_pairs],
        references=[reference for _, reference in test_pairs],
        hypotheses=path.read_text(encoding="utf-8").splitlines(),
        scores=Scores(**record["scores"]),
        search=search_label(**record["options"]),
    )


test = {pair: evaluate(pair) for pair in NAMES}  # evaluate's defaults
for pair, t in test.items():
    print(f"{NAMES[pair]}, {t.scores.sentences:,} sentences, {t.search}")
    print(t.scores.report(), end="\n\n")

# %% tags=["remove-cell"]
# What the text says of the two models: French→English scores higher, with a
# length ratio nearer 1.
de, fr = test["de-en"].scores, test["fr-en"].scores
assert fr.bleu > de.bleu and fr.chrf > de.chrf
assert abs(fr.length_ratio - 1) < abs(de.length_ratio - 1)

# %% [markdown]
# These scores, with their signatures, are stored as data in `checkpoints/scores/`, where the
# model cards, the introduction and the translator page read them. French→English is the
# easier direction here: the two languages are closer, it scores higher, and its length ratio
# is nearly 1. The page [Translate and look inside](16_translate.md) computes the same two scores
# in your browser, from its own translations of the test set.
#
# ## Greedy decoding against beam search
#
# The same test sentences decoded greedily (`--beam 1`), and the $p$-value of beam search's
# gain by sacreBLEU's paired bootstrap {cite:p}`koehn2004statistical`, which rescores both systems
# on 1,000 resampled test sets:

# %% tags=["nbval-ignore-output"]
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

greedy = {pair: evaluate(f"{pair}.greedy", "--beam", "1") for pair in NAMES}
rows = []
for pair, g in greedy.items():
    systems = [("greedy", g.hypotheses), ("beam", test[pair].hypotheses)]
    paired = PairedTest(
        systems, {"BLEU": BLEU()}, [g.references], test_type="bs"
    )
    p_value = paired()[1]["BLEU"][1].p_value
    for t in (g, test[pair]):
        s = t.scores
        rows.append({"model": NAMES[pair], "search": t.search,
                     "sacreBLEU": s.bleu, "chrF": s.chrf,
                     "length ratio": s.length_ratio,
                     "lc tok BLEU": s.bleu_lc_tok, "p": p_value})  # fmt: skip
searches = pd.DataFrame(rows).set_index(["model", "search"])
searches.round(
    {"sacreBLEU": 2, "chrF": 2, "length ratio": 3, "lc tok BLEU": 2, "p": 3}
)

# %% tags=["remove-cell"]
# What the text says: the test set's size, the bootstrap's draws, beam
# search's gains (the larger for German→English) and shorter outputs, which
# gain is beyond chance, greedy lc tok against the tutorial's 36.5.
assert {t.scores.sentences for t in (*test.values(), *greedy.values())} == {
    1000
}
assert paired.n_samples == 1000
by_search = searches.unstack("search")
bleu, ratio = by_search["sacreBLEU"], by_search["length ratio"]
beam = test["de-en"].search
gain = bleu[beam] - bleu["greedy"]
assert 0 < gain["French→English"] < gain["German→English"]
assert (ratio[beam] < ratio["greedy"]).all()
p = searches["p"].xs("greedy", level="search")
assert p["German→English"] < 0.05 < p["French→English"]
greedy_lc_tok = searches.loc[("German→English", "greedy"), "lc tok BLEU"]
assert greedy_lc_tok > 36.5

# %% [markdown]
# Beam search adds sacreBLEU for both models, more for German→English, with slightly shorter
# translations. The bootstrap puts the first gain beyond chance (the table's $p$ is under 0.05)
# but not the second: for French→English, the faster greedy decoding is nearly as good.
#
# Of published numbers, the tutorial Transformer of Ben Trevett's PyTorch seq2seq tutorials
# {cite:p}`trevett2019seq2seq` is the closest comparison: 36.5 for German→English on this test
# set, lowercased spaCy-tokenised BLEU of greedy decoding. Ours in the same units is the table's
# "lc tok BLEU" of greedy decoding, higher.
#
# ## Examples, good and bad
#
# Corpus scores hide what the errors look like. To choose examples without choosing them by hand,
# we score every test sentence on its own with chrF (sentence-level BLEU is too coarse for one
# short sentence), keep those whose source has 8 to 20 words, and show for each model the ones at
# the 10th, 50th and 90th percentile: a poor, a middling and a good translation.

# %% tags=["hide-input", "nbval-ignore-output"]
from sacrebleu.metrics import CHRF

example_rows = []
for pair, t in test.items():
    ranked = sorted(
        (CHRF().sentence_score(t.hypotheses[i], [t.references[i]]).score, i)
        for i, source in enumerate(t.sources)
        if 8 <= len(source.split()) <= 20
    )
    for percentile in (10, 50, 90):
        chrf, i = ranked[round(percentile / 100 * (len(ranked) - 1))]
        example_rows.append(
            {"model": NAMES[pair], "percentile": percentile,
             "chrF": round(chrf, 1), "source": t.sources[i],
             "reference": t.references[i], "translation": t.hypotheses[i]}
        )  # fmt: skip
pd.DataFrame(example_rows).set_index(["model", "percentile"])

# %% [markdown]
# What to see: the good translations are near-copies of the reference, differing by a synonym
# at most; the poor ones keep the sentence's frame but lose what the model knows poorly, a
# *Sweater* and a *Knie*, or the verbs of *vise et tire* (aims and shoots), and fill the gap with
# words that fit the frame: errors easy to miss without the source.
#
# ## What the model learned: attention
#
# Every head of every layer computes its own attention weights, of three kinds: encoder
# self-attention, decoder self-attention and encoder–decoder attention;
# `attention_weights` ([Putting it together](08_model.ipynb)) returns them all for one
# forward pass. We take the German→English model and the first test sentence whose source has 8
# to 12 words, with the decoder reading the model's own beam-search translation:

# %% tags=["nbval-ignore-output"]
from transformer.masking import padding_mask, target_mask
from transformer.model import attention_weights
from transformer.paths import CHECKPOINTS_DIR
from transformer.training_loop import load_trained

de_model, de_tokenizer = load_trained(CHECKPOINTS_DIR / "de-en")
bos, eos = de_tokenizer.bos_id, de_tokenizer.eos_id
t = test["de-en"]
first = next(i for i, s in enumerate(t.sources) if 8 <= len(s.split()) <= 12)
src = torch.tensor([de_tokenizer.encode(t.sources[first]) + [eos]])  # (1, S)
out = de_tokenizer.encode(t.hypotheses[first], "en")
tgt_in = torch.tensor([[bos] + out])  # (1, T)
with torch.no_grad():
    weights = attention_weights(
        de_model.eval(),
        src,
        tgt_in,
        src_mask=padding_mask(src, de_tokenizer.pad_id),
        tgt_mask=target_mask(tgt_in, de_tokenizer.pad_id),
    )
print(f"source:      {t.sources[first]}\ntranslation: {t.hypotheses[first]}")

# %% [markdown]
# Each figure holds every layer and head of one kind: choose them with the selectors under it,
# and hover over a cell for its tokens and weight. A figure opens at its most focused head: in a
# self-attention, the one with the most weight on one diagonal; in the encoder–decoder attention,
# the one whose rows put the most weight on a single key. "▁" marks a BPE piece that begins a word; a
# decoder row is labelled with the token it *reads*, and the encoder–decoder rows also with the
# one it *predicts*.

# %% tags=["hide-input"]
import json


def explorer(maps, keys, queries, title):
    """Weights (1, H, T_q, T_k) per layer as a heatmap with a layer menu and a
    head slider, opening at the head most focused on a diagonal or a key."""

    def measure(w: torch.Tensor) -> float:
        if keys is queries:  # the token before, the token itself or the next
            return max(w.diagonal(d).mean().item() for d in (-1, 0, 1))
        return w.amax(dim=-1).mean().item()  # each row's favourite key

    _, layer, head = max(
        (measure(w[0, h]), i + 1, h + 1)
        for i, w in enumerate(maps) for h in range(w.size(1))
    )  # fmt: skip
    rows = [
        {"layer": i + 1, "head": h + 1, "q": q, "w": [round(x, 3) for x in r]}
        for i, w in enumerate(maps) for h in range(w.size(1))
        for q, r in enumerate(w[0, h].tolist())
    ]  # fmt: skip
    xs = [f"{j}:{p}" for j, p in enumerate(keys)]
    ys = [f"{i}:{p}" for i, p in enumerate(queries)]
    menu = alt.binding_select(
        options=list(range(1, len(maps) + 1)), name="layer "
    )
    slider = alt.binding_range(
        min=1, max=maps[0].size(1), step=1, name="head "
    )
    name = "".join(c if c.isalnum() else "_" for c in title)
    pick_layer = alt.param(value=layer, bind=menu, name=f"{name}_layer")
    pick_head = alt.param(value=head, bind=slider, name=f"{name}_head")
    tooltip = ["query:N", "key:N", alt.Tooltip("weight:Q", format=".3f")]
    return (
        alt.Chart(alt.Data(values=rows), title=title)
        .transform_filter(
            (alt.datum.layer == pick_layer) & (alt.datum.head == pick_head)
        )
        .transform_flatten(["w"], ["weight"])
        .transform_window(k="row_number()", groupby=["q"])
        .transform_calculate(
            query=f"{json.dumps(ys)}[datum.q]",
            key=f"{json.dumps(xs)}[datum.k - 1]",
        )
        .mark_rect()
        .encode(
            x=alt.X("key:N", sort=xs, axis=alt.Axis(labelAngle=-45)),
            y=alt.Y("query:N", sort=ys),
            color=alt.Color("weight:Q", scale=alt.Scale(domain=[0, 1])),
            tooltip=tooltip,
        )
        .add_params(pick_layer, pick_head)
        .properties(width=20 * len(keys), height=20 * len(queries))
    )


source_pieces = de_tokenizer.pieces(src[0].tolist())
reads = de_tokenizer.pieces(tgt_in[0].tolist())
predicts = de_tokenizer.pieces(out + [eos])

# %% [markdown]
# **Decoder self-attention.** What to see: the upper right triangle is empty (the causal mask),
# and the focused heads put their weight on one diagonal: the token itself or the one before.

# %% tags=["hide-input", "nbval-ignore-output"]
explorer(weights["decoder_self"], reads, reads, "Decoder self-attention")

# %% [markdown]
# **Encoder–decoder attention.** What to see: hover over the rows and compare the German piece a
# row looks at with the English one it predicts. Where a head looks at the German word that the
# next English word translates, it has learned an alignment from nothing but pairs of sentences;
# look for it in the other heads of the upper layers too. The page
# [Translate and look inside](16_translate.md) draws every head of a sentence you type.

# %% tags=["hide-input", "nbval-ignore-output"]
explorer(
    weights["decoder_cross"],
    source_pieces,
    [f"{r} → {p}" for r, p in zip(reads, predicts, strict=True)],
    "Encoder–decoder attention",
)

# %% [markdown]
# **Encoder self-attention.** Every position may look at the whole source. What to see: the
# focused head's diagonal, and the rows that leave it, where the head gathers a word's pieces or
# its neighbours.

# %% tags=["hide-input", "nbval-ignore-output"]
explorer(
    weights["encoder"], source_pieces, source_pieces, "Encoder self-attention"
)

# %% [markdown]
# ## Where the models fail: sentence length
#
# Long sentences are harder: more words to get right, and fewer long sentences to learn from.
# `bleu_by_length` groups the sentences by the length of their *source* in words (separated by
# spaces) and computes sacreBLEU for each group: 1–9, 10–14, 15–19, and 20 words or more.

# %% tags=["hide-input"]
#| export
# The first source length, in words, of each group
LENGTH_BOUNDS = (1, 10, 15, 20)


@dataclass(frozen=True)
class LengthGroup:
    """The sentences whose source has `words` words: how many, their sacreBLEU
    and BLEU's output/reference length ratio (both nan for an empty group)."""

    words: str
    sentences: int
    bleu: float
    length_ratio: float


def bleu_by_length(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    bounds: Sequence[int] = LENGTH_BOUNDS,
) -> list[LengthGroup]:
    """sacreBLEU of the sentences grouped by the length of their source in
    words (separated by spaces): group i holds bounds[i] to bounds[i+1] - 1
    words, the last bounds[-1] or more, and a source shorter than bounds[0]
    counts in the first."""
    if not len(sources) == len(hypotheses) == len(references):
        raise ValueError(
            f"{len(sources)} sources, {len(hypotheses)} translations and "
            f"{len(references)} references"
        )
    bounds = list(bounds)
    if not bounds or bounds != sorted(set(bounds)) or bounds[0] < 0:
        raise ValueError(f"bounds must increase from 0 or more, got {bounds}")
    groups: list[list[int]] = [[] for _ in bounds]
    for i, source in enumerate(sources):
        n = len(source.split())
        groups[
            max((k for k, b in enumerate(bounds) if n >= b), default=0)
        ].append(i)
    results = []
    for k, members in enumerate(groups):
        last = bounds[k + 1] - 1 if k + 1 < len(bounds) else None
        words = (
            f"{bounds[k]}+"
            if last is None
            else str(last)
            if last == bounds[k]
            else f"{bounds[k]}–{last}"
        )
        if not members:
            results.append(LengthGroup(words, 0, math.nan, math.nan))
            continue
        found = BLEU().corpus_score(
            [hypotheses[i] for i in members],
            [[references[i] for i in members]],
        )
        results.append(
            LengthGroup(words, len(members), found.score, found.ratio)
        )
    return results


# %% [markdown]
# BLEU of the beam-search test translations grouped so, with the number of sentences in each
# group (a group of a few dozen gives a noisy BLEU):

# %% tags=["nbval-ignore-output"]
from transformer.evaluate import bleu_by_length

by_length = pd.DataFrame(
    {
        "model": NAMES[pair],
        "source words": g.words,
        "sentences": g.sentences,
        "sacreBLEU": round(g.bleu, 1),
        "length ratio": round(g.length_ratio, 2),
    }
    for pair, t in test.items()
    for g in bleu_by_length(t.sources, t.hypotheses, t.references)
)
by_length.set_index(["model", "source words"])

# %% tags=["remove-cell"]
# What the text says: German→English level up to 19 words, then more than
# ten points lower on a few dozen sentences, shortened most; French→English
# lower with every longer group.
de = by_length[by_length.model == NAMES["de-en"]].set_index("source words")
level, longest = de.sacreBLEU.iloc[:3], de.loc["20+"]
assert level.max() - level.min() < 3 and longest.sacreBLEU < level.min() - 10
assert 24 <= longest.sentences < 50
assert de["length ratio"].idxmin() == "20+"
fr = by_length[by_length.model == NAMES["fr-en"]].sacreBLEU
assert fr.is_monotonic_decreasing

# %% [markdown]
# The same as bars (hover for the counts). What to see: both models lose on their longest sources,
# the rarest in training too, but differently. German→English holds level up to 19 source words
# and drops only on its few dozen longest sentences, by more than ten points, which it also
# shortens most: it leaves parts of long sentences untranslated. French→English loses a little
# with every longer group.

# %% tags=["hide-input", "nbval-ignore-output"]
alt.Chart(
    by_length, title=f"sacreBLEU by source length, {test['de-en'].search}"
).mark_bar().encode(
    x=alt.X("source words:N", sort=None, axis=alt.Axis(labelAngle=0)),
    xOffset="model:N",
    y="sacreBLEU:Q",
    color=alt.Color("model:N", title=None),
    tooltip=[
        "model",
        "source words",
        "sentences",
        "sacreBLEU",
        "length ratio",
    ],
).properties(width=360, height=220)

# %% [markdown]
# ## Summary
#
# - On `test_2016_flickr`, with the package's default search, the shipped models' sacreBLEU is
#   reported with its signature and the options that made it, and stored as data for every page
#   that cites it.
# - Beam search beats greedy decoding for both models, for German→English beyond chance.
# - The errors keep the sentence's frame and lose details; long sentences, rare in training,
#   score lowest, and German→English shortens them.
# - The attention heads are readable one sentence at a time: a causal diagonal in the decoder,
#   alignments between the languages in the encoder–decoder attention.

# %% [markdown]
# ## Exercises
#
# 1. Score other searches on the validation split, keeping the test set for the end:
#    `python -m transformer evaluate --pair de-en --split val --beam 8 --alpha 1.0`. Does a
#    setting beat the paper's $K = 4$, $\alpha = 0.6$, and by how much?
# 2. Score the last epoch alone, `--checkpoint checkpoints/de-en/last`, or a run of your own from
#    the training chapter, `--checkpoint runs/de-en/average`, against the shipped model.
# 3. Write the greedy and beam translations of the test set with `--output` and read the
#    sentences where they differ. Which would you prefer?
