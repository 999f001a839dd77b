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
# # The training loop
#
# The previous chapters built the parts of the paper's training recipe: the model, the
# batches, the label-smoothed loss, and Adam with its schedule. This chapter puts them
# together: one update; a loop over epochs that validates, keeps the best weights and averages
# the last ones; and the recipe of the book's two models. From a terminal, a whole run is
#
# ```
# python -m transformer train --pair de-en --config multi30k --out runs/de-en
# ```
#
# It makes the same updates in a `Trainer` that also writes checkpoints, resumes after a stop
# and shares the work among GPUs: the appendix [The Trainer](a07_trainer.ipynb) builds it on
# this chapter's code.

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
#| default_exp training_loop

# %%
import json
import math

import altair as alt
import pandas as pd
import torch

torch.manual_seed(0)
torch.set_printoptions(precision=4)

# %% [markdown]
# ## One update
#
# Training uses *teacher forcing*. The decoder is given the reference translation shifted right
# by one position, `tgt_in` = `<bos>` $y_1 \dots y_{T-1}$, and at every position it predicts the
# next reference token, `tgt_out` = $y_1 \dots y_{T-1}$ `<eos>`. The causal mask keeps each
# position from seeing the token it must predict, so all $T$ predictions of a sentence come from
# one forward pass, instead of $T$ passes of generating one token at a time.

# %%
#| export
"""The training loop of Vaswani et al. (2017), section 5: teacher forcing, one
update over micro-batches, a loop over epochs that keeps the best checkpoint
and averages the last ones, and the loading of a trained model."""

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import safetensors.torch
import torch
from torch import Tensor, nn

from transformer import layout
from transformer.batches import Batch
from transformer.config import TransformerConfig
from transformer.loss import LabelSmoothingLoss
from transformer.masking import padding_mask, target_mask
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer


def batch_log_probs(model: nn.Module, batch: Batch, *, pad_id: int) -> Tensor:
    """The model's log-probabilities of each next target token of a batch, the
    decoder fed the reference prefix (teacher forcing).

    Shapes:
        batch.src: (B, S); batch.tgt_in: (B, T)
        returns (B, T, V)
    """
    return model(
        batch.src,
        batch.tgt_in,
        src_mask=padding_mask(batch.src, pad_id),
        tgt_mask=target_mask(batch.tgt_in, pad_id),
    )


# %% [markdown]
# An update takes a few batches ("micro-batches"), runs the model on each, and adds up the
# label-smoothed loss $\ell_i$ of every real target token $i$. Dividing by the number of tokens
# $N$ gives the mean loss per token, whose gradient Adam receives:
#
# $$
# g = \nabla_\theta \, \frac{1}{N} \sum_{\text{micro-batches } b} \;
# \sum_{\text{tokens } i \in b} \ell_i(\theta).
# $$
#
# The division is by the token count of the *whole* update, not of each batch: a batch of short
# sentences holds fewer tokens than one of long sentences, and averaging per batch would give the
# tokens of small batches more weight. Because each micro-batch's loss is divided by $N$ before
# its backward pass, the accumulated gradient is exactly $g$, whatever the number of
# micro-batches; this is how one GPU stands in for the paper's batches of 25,000 tokens. Then
# Adam takes its step and the schedule sets the next learning rate.
#
# `train_step` makes one such update, with a loss that sums over the tokens
# (`reduction="sum"`), and returns the summed loss.


# %%
#| export
def train_step(
    model: nn.Module,
    batches: Sequence[Batch],
    *,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    tokens: int,
) -> float:
    """One update with the gradient of (summed loss) / `tokens`, `tokens` being
    the real target tokens of all the batches; returns the summed loss."""
    optimizer.zero_grad()
    total = 0.0
    for batch in batches:
        log_probs = batch_log_probs(model, batch, pad_id=criterion.pad_id)
        loss = criterion(log_probs, batch.tgt_out)  # summed over tokens
        (loss / tokens).backward()  # adds to the gradients
        total += loss.item()
    optimizer.step()
    scheduler.step()
    return total


# %% [markdown]
# Accumulation changes nothing about the update. On a tiny model and eight sentence pairs (here
# sequences of symbols to copy), one step over the whole batch and one step over the same pairs
# cut into three micro-batches compute the same gradient, up to the rounding of adding in another
# order:

# %%
from transformer.batches import collate
from transformer.config import TransformerConfig
from transformer.loss import LabelSmoothingLoss
from transformer.model import Transformer
from transformer.schedule import make_optimizer
from transformer.training_loop import train_step

ids = dict(pad_id=0, bos_id=1, eos_id=2)  # then ten symbols, 3 to 12
tiny = TransformerConfig.small(13, d_model=32, d_ff=64, dropout=0.0)
g = torch.Generator().manual_seed(0)
pairs = [(s, s) for s in torch.randint(3, 13, (8, 6), generator=g).tolist()]
full = collate(pairs, **ids)
parts = [collate(pairs[a:b], **ids) for a, b in [(0, 3), (3, 5), (5, 8)]]
criterion = LabelSmoothingLoss(pad_id=0, reduction="sum")


def gradient(batches: list) -> torch.Tensor:
    """The gradient of one update, from the same initial weights."""
    torch.manual_seed(0)
    model = Transformer(tiny)
    optimizer, scheduler = make_optimizer(model, d_model=32, warmup=10)
    step = dict(optimizer=optimizer, scheduler=scheduler, criterion=criterion)
    train_step(model, batches, tokens=full.n_tgt_tokens, **step)  # all of them
    return torch.cat([p.grad.flatten() for p in model.parameters()])


one, three = gradient([full]), gradient(parts)
assert (one - three).abs().max() < 1e-6
print(f"{one.numel():,} gradient entries, the largest {one.abs().max():.2f}")

# %% [markdown]
# ## The loop
#
# Training repeats the update epoch after epoch. Each epoch, `token_batches` cuts the training
# pairs into batches anew, in an order drawn from the seed and the epoch, and the loop makes
# one update per batch. After each epoch it measures the label-smoothed loss on the validation
# batches, without dropout or gradients, and copies the weights: a *checkpoint*. It keeps the
# one that validated best, for when the validation loss turns up late in training, and
# averages the last few weight by weight, as the paper does: "a single model obtained by
# averaging the last 5 checkpoints" (Section 6.1). Late in training, successive checkpoints
# sit around a minimum of the loss, each displaced by the noise of its last updates, and their
# mean cancels much of that noise.

# %%
#| export
@torch.no_grad()
def validation_loss(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    criterion: LabelSmoothingLoss,
) -> float:
    """The label-smoothed loss per target token, without dropout."""
    model.eval()
    total, tokens = 0.0, 0
    for batch in batches:
        log_probs = batch_log_probs(model, batch, pad_id=criterion.pad_id)
        total += criterion(log_probs, batch.tgt_out).item()
        tokens += batch.n_tgt_tokens
    model.train()
    return total / tokens


def average_weights(checkpoints: Sequence[dict]) -> dict[str, Tensor]:
    """The element-wise mean of several checkpoints of one model."""
    names = checkpoints[0]
    return {n: torch.stack([c[n] for c in checkpoints]).mean(0) for n in names}


def train_loop(
    model: nn.Module,
    epoch_batches: Callable[[int], Iterable[Batch]],
    val_batches: Sequence[Batch],
    *,
    epochs: int,
    average_last: int,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> tuple[list[dict[str, float]], dict[str, Tensor], dict[str, Tensor]]:
    """Train `epochs` epochs, one update per batch of `epoch_batches(epoch)`,
    validating after each. Returns a record per update, the checkpoint that
    validated best, and the mean of the last `average_last` checkpoints."""
    step = dict(criterion=criterion, optimizer=optimizer, scheduler=scheduler)
    history, last, best, best_loss = [], [], {}, math.inf
    for epoch in range(epochs):
        for batch in epoch_batches(epoch):
            tokens = batch.n_tgt_tokens
            loss = train_step(model, [batch], tokens=tokens, **step)
            record = {"step": len(history) + 1, "epoch": epoch + 1}
            history.append(record | {"train_loss": loss / tokens})
        val_loss = validation_loss(model, val_batches, criterion=criterion)
        history[-1]["val_loss"] = val_loss
        checkpoint = {n: w.clone() for n, w in model.state_dict().items()}
        last = [*last, checkpoint][-average_last:]
        if val_loss < best_loss:
            best, best_loss = checkpoint, val_loss
    return history, best, average_weights(last)


# %% [markdown]
# The loop trains a tiny model (two layers of width 64) on German→English for three epochs over
# the first 1,700 training pairs, in batches of at most 1,500 tokens a side: enough to watch it
# learn, not to translate.

# %%
from transformer.batches import token_batches
from transformer.multi30k import load_pairs
from transformer.paths import CHECKPOINTS_DIR
from transformer.tokenizer import Tokenizer
from transformer.training_loop import train_loop

tokenizer = Tokenizer.load(CHECKPOINTS_DIR / "de-en" / "tokenizer.json")
special = {k: getattr(tokenizer, k) for k in ("pad_id", "bos_id", "eos_id")}


def encoded(split: str, n: int | None = None) -> list:
    """The first n de-en pairs of a split (default: all), as token ids."""
    de, en = zip(*load_pairs(split, "de-en")[:n], strict=True)
    src = tokenizer.encode_batch(de, "de")
    return list(zip(src, tokenizer.encode_batch(en, "en"), strict=True))


def batches_of(pairs: list, **options) -> list:
    """Token-bucketed batches of pairs; the order is drawn from the epoch."""
    src, tgt = zip(*pairs, strict=True)
    lengths = [len(ids) + 1 for ids in src], [len(ids) + 1 for ids in tgt]
    groups = token_batches(*lengths, **options)
    return [collate([pairs[i] for i in g], **special) for g in groups]


torch.manual_seed(0)
small = dict(n_layers=2, d_model=64, n_heads=4, d_ff=256)
model = Transformer(TransformerConfig.small(tokenizer.vocab_size, **small))
optimizer, scheduler = make_optimizer(model, d_model=64, warmup=40)
criterion = LabelSmoothingLoss(pad_id=tokenizer.pad_id, reduction="sum")
train_pairs = encoded("train", 1700)
val_batches = batches_of(encoded("val"), shuffle=False)


def epoch_batches(epoch: int) -> list:
    return batches_of(train_pairs, max_tokens=1500, epoch=epoch)


history, best, average = train_loop(
    model,
    epoch_batches,
    val_batches,
    epochs=3,
    average_last=2,
    criterion=criterion,
    optimizer=optimizer,
    scheduler=scheduler,
)

# %% [markdown]
# In the figure, the training loss starts a little above that of a uniform guess over the 8,000
# tokens and falls as the model learns the most frequent tokens first; the validation loss,
# measured without dropout at the end of each epoch, falls with it:

# %% tags=["hide-input", "nbval-ignore-output"]
from transformer.plots import use_book_renderer

use_book_renderer()
names = {"train_loss": "training", "val_loss": "validation"}
curve = pd.DataFrame(history).drop(columns="epoch").rename(columns=names)
curve = curve.melt("step", var_name="loss of", value_name="loss").dropna()
alt.Chart(curve.round(4)).mark_line(point=True).encode(
    x=alt.X("step:Q", title="update"),
    y=alt.Y("loss:Q", title="label-smoothed loss per token (nats)"),
    color=alt.Color("loss of:N", title=None),
).properties(width=420, height=220)

# %% [markdown]
# Loaded into the model, the best checkpoint validates at the loss recorded for its epoch, and
# the average of the last two is validated the same way. Averaging pays most late in a run,
# when successive checkpoints differ by the noise of their last updates rather than by
# learning (the section "The book's two runs" below):

# %% tags=["nbval-ignore-output"]
from transformer.loss import smoothed_target_entropy

V = tokenizer.vocab_size
uniform = math.log(V) - smoothed_target_entropy(0.1, V)
first = history[0]
epochs = [r for r in history if "val_loss" in r]
best_epoch = min(epochs, key=lambda r: r["val_loss"])
model.load_state_dict(best)
loaded = validation_loss(model, val_batches, criterion=criterion)
assert loaded == best_epoch["val_loss"]
model.load_state_dict(average)
averaged = validation_loss(model, val_batches, criterion=criterion)
assert epochs[-1]["train_loss"] < first["train_loss"] - 2
assert best_epoch["val_loss"] < uniform - 2
print(f"a uniform guess over {V:,} tokens: {uniform:.2f}")
print(f"{len(history)} updates; the first's loss {first['train_loss']:.2f}")
print("validation after epoch ", end="")
print(", ".join(f"{r['epoch']}: {r['val_loss']:.3f}" for r in epochs))
print(
    f"best: epoch {best_epoch['epoch']}; the average of the last two: ", end=""
)
print(f"{averaged:.3f}")

# %% [markdown]
# ## Training on Multi30k
#
# The paper's recipe was made for WMT's 4.5 million English–German sentence pairs and eight
# GPUs. Multi30k's 29,000 training pairs are less than 1% of that, so the book changes the
# following, and keeps everything else (post-norm layers, sinusoidal positions, one embedding
# table shared by source, target and output, label smoothing 0.1, Adam with $\beta_2 = 0.98$
# and the schedule of equation (3)):
#
# | | the paper (base) | the book's recipe |
# | --- | --- | --- |
# | layers, $d_{model}$, $d_{ff}$, $h$ | 6 + 6, 512, 2048, 8 | 3 + 3, 256, 512, 8 |
# | dropout $P_{drop}$ | 0.1 | 0.3 |
# | tokens per batch and side | about 25,000 | at most 3,000 |
# | warm-up | 4,000 updates | 800 updates |
# | learning-rate factor | 1 | 0.7 |
# | length of training | 100,000 updates | 35 epochs |
# | checkpoint averaging | last 5, 10 minutes apart | last 5 epochs |
# | arithmetic on a GPU | (not stated) | float32 |
#
# Why, row by row, with the numbers from the cell below:
#
# - Small data favours a small model: the recipe's has 6.0M parameters. The paper's base model
#   has 65M with its 37,000-token vocabulary (63.1M by this book's count); with the book's
#   8,000-token vocabulary it has 48.2M, and it learned far more slowly on the same batches.
# - With dropout 0.1 the validation loss turns up halfway through the run while the training loss
#   keeps falling; 0.3 is also the paper's value for its big English–German model.
# - An epoch holds 442,896 target tokens: batches of at most 3,000 give 161 updates an epoch.
# - A warm-up of 4,000 updates would last 25 epochs; 800 last 5.
# - The factor 0.7 gives a peak learning rate of $1.5 \cdot 10^{-3}$, against the paper's
#   $7.0 \cdot 10^{-4}$ for its larger batches.
# - At epoch 35 the validation loss is still falling slowly; averaging counts in epochs.
# - A model this small is limited by launching its many small kernels, not by arithmetic:
#   bfloat16 is slower on an H100. Which arithmetic a run gets on other GPUs, and how long the
#   recipe takes on them and in Colab, is in the appendix [The Trainer](a07_trainer.ipynb).
#
# The appendix [The experiments behind the recipe](a12_experiments.ipynb) holds the runs behind
# these choices, and `--config multi30k` selects the recipe (`multi30k_recipe`, the appendix
# [Setting up a run](a05_run_setup.ipynb)), which the shipped model's `config.json` holds too:

# %%
from transformer import layout
from transformer.schedule import WARMUP_STEPS, noam_lr


def read_metrics(pair: str) -> list[dict]:
    """A shipped run's metrics.jsonl: a line per epoch, then the average's."""
    lines = (CHECKPOINTS_DIR / pair / layout.METRICS).read_text().splitlines()
    return [json.loads(line) for line in lines]


shipped = json.loads((CHECKPOINTS_DIR / "de-en" / layout.CONFIG).read_text())
recipe = TransformerConfig.small(V, d_ff=512, dropout=0.3)  # small, but these
fields = (
    recipe.to_dict()
)  # the table's model, in every field it was saved with
assert {k: fields[k] for k in shipped["model"]} == shipped["model"]
for name, config in [
    ("the recipe's model", recipe),
    (f"base, V = {V:,}", TransformerConfig.base(V)),
    ("base, V = 37,000", TransformerConfig.base(37_000)),
]:
    n = sum(p.numel() for p in Transformer(config).parameters())
    print(f"{name}: {n / 1e6:.1f}M parameters")
epoch = read_metrics("de-en")[0]  # the first one
n = epoch["step"]
print(f"an epoch: {epoch['train_tokens']:,} target tokens, {n} updates")
warmup, factor = shipped["train"]["warmup"], shipped["train"]["lr_factor"]
print(
    f"{WARMUP_STEPS:,} and {warmup} updates: {WARMUP_STEPS / n:.0f} and"
    f" {warmup / n:.0f} epochs"
)
peak = noam_lr(warmup, d_model=recipe.d_model, warmup=warmup, factor=factor)
base = TransformerConfig.base(V)
paper = noam_lr(WARMUP_STEPS, d_model=base.d_model, warmup=WARMUP_STEPS)
print(f"peak learning rate {peak:.1e}, the paper's {paper:.1e}")

# %% [markdown]
# ## The book's two runs
#
# The two models the book ships were trained with this recipe on one GPU. Their
# `metrics.jsonl` files, in `checkpoints/de-en` and `checkpoints/fr-en`, hold one line per epoch:

# %% tags=["hide-input", "nbval-ignore-output"]
from transformer.multi30k import PAIRS

rows = [
    dict(pair=pair, epoch=r["epoch"], split=split, loss=r[key])
    for pair in PAIRS
    for r in read_metrics(pair)
    if r["kind"] == "epoch"
    for split, key in [("training", "train_loss"), ("validation", "val_loss")]
]
alt.Chart(pd.DataFrame(rows).round(4)).mark_line().encode(
    x=alt.X("epoch:Q", title="epoch"),
    y=alt.Y("loss:Q", title="label-smoothed loss per token (nats)"),
    color=alt.Color("split:N", title=None),
    column=alt.Column("pair:N", title=None),
).properties(width=250, height=200)

# %% [markdown]
# Both validation losses fall fast for ten epochs and slowly after. The training loss, measured
# with dropout, crosses below the validation loss after 10 to 12 epochs, when the model starts
# to fit its training sentences better than unseen ones; the gap widens, but the validation
# loss keeps falling: dropout 0.3 keeps the model from overfitting within 35 epochs. The
# average of the last five epochs validates a little lower than the last epoch.
#
# Besides the label-smoothed loss, the quantity training minimises, each line holds what
# validation measures with teacher forcing:
#
# - the **negative log-likelihood** per token without smoothing, $\overline{\mathrm{NLL}} =
#   \frac{1}{N} \sum_i -\log p(y_i \mid y_{<i}, x)$, and the **perplexity per token**
#   $\exp(\overline{\mathrm{NLL}})$: the effective number of subword tokens the model hesitates
#   between at each position;
# - the **perplexity per word**, the same total NLL divided by the number $W$ of words of the
#   references instead of the number of tokens: subword perplexities depend on the vocabulary,
#   a per-word one much less;
# - the **token accuracy**, the share of target positions whose most probable token is the
#   reference token.
#
# None of these is translation quality, which needs the model to generate on its own: the
# decoding and results chapters measure it with BLEU. The run's clock (`wall_time`) gives its
# length:

# %%
for pair in PAIRS:
    records = read_metrics(pair)
    last = [r for r in records if r["kind"] == "epoch"][-1]
    a = records[-1]  # the average of the last five epochs
    assert a["kind"] == "average" and a["val_loss"] < last["val_loss"]
    assert math.isclose(a["val_ppl_token"], math.exp(a["val_nll"]))
    print(
        f"{pair}: {last['epoch']:g} epochs, {a['wall_time'] / 60:.1f} min in"
        f" all; validation loss {last['val_loss']:.3f}, averaged"
        f" {a['val_loss']:.3f};\n  the average's NLL {a['val_nll']:.3f},"
        f" perplexity per token {a['val_ppl_token']:.2f} and per word"
        f" {a['val_ppl_word']:.2f}, token accuracy {a['val_accuracy']:.1%}"
    )

# %% [markdown]
# ## Loading a trained model
#
# A run writes its checkpoints to disk, and a finished run becomes a small folder that ships:
# the appendix [Checkpoints](a06_checkpoints.ipynb) builds both. A shipped model's folder, such
# as `checkpoints/de-en`, holds `config.json`, whose `"model"` entry is the model's
# `TransformerConfig`, the tokenizer's `tokenizer.json`, and the weights in float16, which
# halves their size, in the files that `config.json` names. The names of these files, and of
# a training run's folder, live in one module, `transformer.layout`, which every reader and
# writer of these folders uses:

# %%
#| export layout
"""The files of a model's folder (a shipped model, or a run's checkpoint), and
of a training run's folder."""

from pathlib import Path
from typing import Any

CONFIG = "config.json"  # "model": the TransformerConfig's fields, and more
TOKENIZER = "tokenizer.json"
METRICS = "metrics.jsonl"  # a run's records, one JSON object a line
WEIGHTS = "model.safetensors"  # a checkpoint's weights, in float32
# A training run's folder: its settings, logs, checkpoints and average.
RUN_CONFIG = "train_config.json"  # the TrainConfig's fields
STEPS = "steps.jsonl"  # the loss and throughput, every few updates
LOG = "train.log"  # what the terminal showed
CHECKPOINTS = "checkpoints"  # a model folder per checkpoint
EPOCH, STEP = "epoch-", "step-"  # checkpoints at an epoch's end, at a stop
AVERAGE = "average"  # the model that the last checkpoints average to
PROGRESS = "progress.json"  # in a checkpoint: where the run stood


def epoch_folder(epoch: int) -> str:
    """The checkpoint at the end of epoch `epoch`: epoch-007."""
    return f"{EPOCH}{epoch:03d}"


def step_folder(step: int) -> str:
    """The checkpoint of a run stopped at update `step`: step-0001234."""
    return f"{STEP}{step:07d}"


def weight_files(folder: str | Path, config: dict[str, Any]) -> list[Path]:
    """The files of a folder's weights, as its config.json says: those its
    weight_map names (a shipped model), or WEIGHTS (a checkpoint)."""
    if "weight_map" in config:
        names = sorted(set(config["weight_map"].values()))
        return [Path(folder) / name for name in names]
    return [Path(folder) / WEIGHTS]


# %% [markdown]
# `load_trained` reads a folder back into a model that computes in float32. The matrix that the
# two embeddings and the output layer share is stored once, under its first name:


# %%
#| export
def load_trained(folder: str | Path) -> tuple[Transformer, Tokenizer]:
    """The model (float32, eval mode) and tokenizer of a shipped model's
    folder, such as checkpoints/de-en."""
    folder = Path(folder)
    config = json.loads((folder / layout.CONFIG).read_text())
    model = Transformer(TransformerConfig(**config["model"]))
    weights = {}
    for path in layout.weight_files(folder, config):
        weights |= safetensors.torch.load_file(path)  # float16
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = model.src_embed.embedding.weight  # stored under this name only
    if unexpected or any(model.get_parameter(n) is not tied for n in missing):
        raise ValueError(f"{folder}: the weights do not fit the model")
    return model.eval(), Tokenizer.load(folder / layout.TOKENIZER)


# %% [markdown]
# The shipped German→English model, loaded, measures on the validation batches of the loop
# above the loss that its run recorded for it, up to the rounding of its weights to float16:

# %% tags=["nbval-ignore-output"]
from transformer.training_loop import load_trained, validation_loss

trained, _ = load_trained(CHECKPOINTS_DIR / "de-en")
loss = validation_loss(trained, val_batches, criterion=criterion)
recorded = read_metrics("de-en")[-1]["val_loss"]  # the average's
print(f"validation loss {loss:.4f}, recorded {recorded:.4f}")
assert abs(loss - recorded) < 1e-3

# %% [markdown]
# ## Summary
#
# - An update feeds the decoder the reference shifted right (teacher forcing), sums the
#   label-smoothed loss of every target token of a few micro-batches, divides by their token
#   count, and takes one Adam step on the schedule of equation (3).
# - The loop repeats it epoch after epoch and validates after each epoch: the same loss without
#   dropout. It keeps the checkpoint that validated best and averages the last ones. A run's
#   validation also measures the NLL, the perplexities per token and per word, and the token
#   accuracy; BLEU comes later, with decoding.
# - On Multi30k the recipe is a smaller model, more dropout, smaller batches and a shorter
#   warm-up than the paper's; it trains in minutes on one GPU.
# - A trained model ships as its config, its tokenizer and its weights in float16;
#   `load_trained` reads it back.
#
# ## Exercises
#
# 1. Train the recipe with the layer order changed: `--config multi30k --set norm_first=true`
#    puts the layer normalisation before each sublayer, the pre-norm order of the sublayers
#    chapter. Compare the first epochs' validation loss with the recipe's, and try a larger
#    `--lr-factor`, which pre-norm layers tolerate better.
# 2. Train without label smoothing (`--label-smoothing 0`). The validation loss is then the NLL
#    itself: does the perplexity per token end lower or higher than the recipe's? And the
#    BLEU score (the results chapter)?
# 3. Change the warm-up: `--warmup 200` and `--warmup 4000`. Plot the learning rate of each
#    (the schedule chapter) and the validation loss of the first ten epochs. Then try
#    `--bpe-dropout 0.1`, which spells the training words differently each epoch.
# 4. Change `train_loop` so that each update takes two batches (and their summed token count),
#    and compare its curve over the same three epochs with the one above. Then train ten epochs:
#    from when does the average of the last two checkpoints validate better than the last?
