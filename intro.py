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
# # Attention Is All You Need, annotated
#
# This book builds the Transformer of Vaswani et al. {cite:p}`vaswani2017attention`, from its
# first equation to a trained translation model, one component per chapter. Each chapter is a
# notebook that explains a piece of the paper, writes it as a module of a small Python package,
# `transformer`, and tests it in the cells beside the prose. The later chapters train
# German→English and French→English models on Multi30k {cite:p}`elliott2016multi30k`, translate
# with beam search, and score the translations with sacreBLEU {cite:p}`post2018call`. Every
# number in the text comes from the code beside it, and the test suite runs every chapter.

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

# %% [markdown]
# ## Where we are going
#
# The repository ships the book's two trained models, so the goal can come before the first
# equation. The cell below loads the German→English model from `checkpoints/de-en` and
# translates three captions of photographs, the kind of sentence it was trained on, with the
# package's default search, the paper's beam search; its last line gives the model's score on
# the test set with that search's beam size and length penalty. It runs in seconds on a CPU.

# %%
from transformer.evaluate import search_label, stored_scores
from transformer.multi30k import load_pairs
from transformer.translation import load_pair_model, translate

# The shipped model in checkpoints/de-en
model, tokenizer = load_pair_model("de-en")
german = [
    "Zwei Hunde spielen im Schnee.",
    "Zwei Kinder bauen am Strand eine Sandburg.",
    "Ein alter Mann sitzt mit seiner Zeitung auf einer Bank.",
]
english = translate(model, tokenizer, german)  # the default search
for source, target in zip(german, english, strict=True):
    print(f"{source}\n  → {target}")
n_params = sum(p.numel() for p in model.parameters())
n_train = len(load_pairs("train", "de-en"))
print(
    f"\n{n_params / 1e6:.1f}M parameters, {model.config.n_layers} layers "
    f"of width {model.config.d_model}, trained on {n_train:,} sentence pairs"
)
scores, run = stored_scores("de-en")  # the results chapter's evaluation
search = search_label(**run["options"])
print(f"{scores.bleu:.1f} sacreBLEU on {run['split']} ({search})")

# %% [markdown]
# It is small beside the paper's base model (65M parameters, six layers of width 512), because
# Multi30k is small: the pairs counted above, against the paper's 4.5 million. Its score, printed
# last, is the results chapter's, which also shows where it fails.
#
# ## Why the Transformer
#
# Before 2017 the best translation systems were recurrent networks with attention
# {cite:p}`bahdanau2015neural`. A recurrent layer reads a sentence one position at a time, so
# its steps cannot run in parallel, and a signal from the first word passes through every state
# in between to reach the last. The Transformer drops recurrence: in each layer every position
# looks at every other position directly, through *self-attention*, so a layer is a few large
# matrix products that a GPU runs at once. The paper's Table 1 compares layer types for a
# sequence of length $n$ and width $d$ ($k$ is a convolution's kernel width):
#
# | layer type | complexity per layer | sequential operations | maximum path length |
# | --- | --- | --- | --- |
# | self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
# | convolutional | $O(k \cdot n \cdot d^2)$ | $O(1)$ | $O(\log_k n)$ |
#
# Self-attention is also the cheapest of the three whenever a sentence is shorter than the
# representation is wide ($n < d$), as sentences are.
#
# ## The architecture
#
# The figure below is the paper's Figure 1, drawn again for this book.

# %% tags=["remove-input"]
# The figure is images/transformer.svg in the repository, shown inline so that its boxes link.
from pathlib import Path

from IPython.display import HTML

import transformer

HTML((Path(transformer.__file__).parents[1] / "images" / "transformer.svg").read_text())

# %% [markdown]
# Read it from the bottom. On the left, the encoder turns the source sentence into one vector
# per subword: an embedding plus a positional encoding, then $N$ identical layers of
# self-attention and a feed-forward network, each wrapped in a residual connection and layer
# normalisation (Add & Norm). On the right, the decoder reads the translation so far through
# *masked* self-attention, which hides the words not yet written, then attends to the encoder's
# output. A linear layer and a softmax turn its last states into probabilities for the next
# subword. Under each box, in italics, is the chapter that builds it: click the box to go there.
#
# ## Reading and running the book
#
# - **Here**: the website works offline, charts and math included.
# - **In Colab**: the rocket button at the top of each page opens its notebook in Colab. Its
#   first code cell, hidden on the website, clones the repository and installs the package;
#   then run the cells top to bottom.
# - **Locally**: in a clone of the repository, `make book` creates a virtual environment in
#   `.venv`, installs the package with everything the chapters need, and builds this book into
#   `_build/html`; `make test` runs the tests and executes every chapter. To work in the
#   notebooks, add JupyterLab (`.venv/bin/pip install -c constraints.txt jupyterlab`) and run
#   `.venv/bin/jupyter lab`.
#
# Every chapter runs on a CPU. The two shipped models were trained on a GPU; the training
# chapter reads their logs.
#
# ## A map of the book
#
# - **[How to read this book](chapters/00_conventions.ipynb)**: the shape letters, the mask
#   convention and the heatmaps that every chapter uses.
# - **Part I, the model**, builds the figure's boxes, from
#   [attention](chapters/01_attention.ipynb) up to the whole model, and trains it to copy
#   sequences: the first time you see it learn. Its last page shows
#   [the whole model](chapters/09_whole_model.md) at once.
# - **Part II, training**: the data, label smoothing, the learning-rate schedule, and the
#   training loop that produced the shipped models.
# - **Part III, translating**: greedy and beam search, then the results: scores, examples good
#   and bad, and what the attention heads look at. Its last page,
#   [Translate and look inside](chapters/16_translate.md), runs the shipped models in your
#   browser: type a sentence and watch the search and where the model looked.
# - **Appendices**: the deviations from the paper, engineering the package, the command line,
#   derivations and counts, and the experiments behind the recipe.
