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
# The previous chapters built every part of the paper's training recipe on its own: the model,
# the token-bucketed Multi30k batches, the label-smoothed loss and Adam with its learning-rate
# schedule. This chapter puts them together in one loop, `transformer.train`, and gives it what a
# real run needs: validation metrics, checkpoints that survive an interruption and resume
# exactly, the average of the last checkpoints, several GPUs, a file format for the trained
# models that the book ships, and a command line,
#
# ```
# python -m transformer train --pair de-en --config multi30k --out runs/de-en
# ```
#
# Before any of that, one update step is tried on the smallest task that can show the model
# works: copying a sequence of symbols.

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
#| default_exp train

# %%
import json
import math
import tempfile
from pathlib import Path

import altair as alt
import pandas as pd
import torch

torch.manual_seed(0)
torch.set_printoptions(precision=4)

# %% [markdown]
# ## The paper's recipe
#
# Section 5 of the paper {cite:p}`vaswani2017attention` describes the training of its models on
# WMT 2014 English–German (4.5 million sentence pairs) and English–French (36 million):
#
# - **Batches** (5.1): "Sentence pairs were batched together by approximate sequence length. Each
#   training batch contained a set of sentence pairs containing approximately 25000 source tokens
#   and 25000 target tokens." The data chapter builds such batches, with a smaller budget.
# - **Hardware and schedule** (5.2): one machine with 8 NVIDIA P100 GPUs; the base model took
#   about 0.4 seconds per step and was trained for 100,000 steps (12 hours), the big model for
#   300,000 steps (3.5 days).
# - **Optimiser** (5.3): Adam with $\beta_1 = 0.9$, $\beta_2 = 0.98$, $\epsilon = 10^{-9}$ and
#   the learning rate of equation (3) with $warmup\_steps = 4000$ (the schedule chapter).
# - **Regularisation** (5.4): dropout $P_{drop} = 0.1$ on the output of each sublayer and on the
#   sums of embeddings and positional encodings (0.3 for the big English–German model), and label
#   smoothing $\epsilon_{ls} = 0.1$ (the label-smoothing chapter).
# - **Checkpoint averaging** (6.1): "For the base models, we used a single model obtained by
#   averaging the last 5 checkpoints, which were written at 10-minute intervals. For the big
#   models, we averaged the last 20 checkpoints."
#
# With 8 GPUs and 25,000 target tokens per batch, each of the paper's updates averages the
# gradient over all the tokens of all 8 GPUs. The loop below makes the same kind of update with
# one GPU or several, and with gradient accumulation (several batches, one update) when one GPU
# must stand in for more.
#
# Multi30k's 29,000 training pairs are less than 1% of WMT English–German's 4.5 million, so the
# recipe needs adapting: a smaller model, more regularisation, a shorter warm-up, and epochs
# counted in tens rather than steps in hundreds of thousands. The section "Training on Multi30k"
# states each change, and the section "The book's models" shows the curves of the two models the
# book ships; on a CPU the chapter itself trains only a tiny model, clearly marked as such.
#
# ## One update
#
# An update takes a few batches ("micro-batches", one or more per process), runs the model on
# each, and adds up the label-smoothed loss of every real target token. Dividing by the number of
# tokens $N$ gives the mean loss per token, and its gradient is what Adam receives:
#
# $$
# g = \nabla_\theta \, \frac{1}{N} \sum_{\text{micro-batches } b} \;
# \sum_{\text{tokens } i \in b} \ell_i(\theta).
# $$
#
# The division is by the token count of the *whole* update, not of each batch: a batch of short
# sentences holds fewer tokens than one of long sentences, and averaging per batch would give the
# tokens of small batches more weight. Because each micro-batch's loss is scaled by $1/N$ before
# its backward pass, the accumulated gradient is exactly $g$, whatever the number of
# micro-batches. Across several processes the same holds once the gradients are summed; the
# section on several GPUs comes back to this.
#
# `train_step` makes one such update. The loss function is `LabelSmoothingLoss` with
# `reduction="sum"`; on a GPU the forward pass runs under bfloat16 autocast (matrix products in
# bfloat16, the log-softmax and the loss in float32), and the step returns the summed loss, left
# on the device, so that the loop reads it only now and then (reading a GPU value waits for the
# GPU).

# %%
#| export
"""The training loop of Vaswani et al. (2017), section 5: updates over token-bucketed batches,
validation metrics, checkpoints that resume exactly, checkpoint averaging, several GPUs, the
shipped-model format, and `python -m transformer train`.

Imports neither Altair, pandas nor spaCy: a GPU machine trains from the encoded cache.
"""

import contextlib
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from transformer.data import Batch
from transformer.loss import LabelSmoothingLoss
from transformer.masking import padding_mask, target_mask


def batch_log_probs(model: nn.Module, batch: Batch, *, pad_id: int) -> Tensor:
    """The model's log-probabilities of each next target token of a batch.

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


def _ddp(model: nn.Module) -> DistributedDataParallel | None:
    """The DistributedDataParallel wrapper of a model, seen through torch.compile's."""
    inner = getattr(model, "_orig_mod", model)
    return inner if isinstance(inner, DistributedDataParallel) else None


def train_step(
    model: nn.Module,
    batches: Sequence[Batch],
    *,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None,
    tokens: int,
    bf16: bool = False,
) -> Tensor:
    """One update with the gradient of (summed loss) / `tokens`.

    `batches` are this process's micro-batches; `tokens` counts the real target tokens of the
    whole update, every micro-batch of every process. Returns this process's summed loss,
    detached and on the model's device.
    """
    if criterion.reduction != "sum":
        raise ValueError(
            f"criterion must sum the loss, got reduction={criterion.reduction!r}"
        )
    if not batches or tokens <= 0:
        raise ValueError(
            f"an update needs batches and tokens, got {len(batches)}, {tokens}"
        )
    ddp = _ddp(model)
    # DistributedDataParallel averages the gradients of the processes; we want their sum.
    scale = (dist.get_world_size() if ddp is not None else 1) / tokens
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for k, batch in enumerate(batches):
        batch = batch.to(device, non_blocking=True)
        # Processes exchange gradients once, in the backward pass of the last micro-batch.
        last = k == len(batches) - 1
        with contextlib.nullcontext() if ddp is None or last else ddp.no_sync():
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                log_probs = batch_log_probs(model, batch, pad_id=criterion.pad_id)
            loss = criterion(log_probs, batch.tgt_out)
            (loss * scale).backward()
        total += loss.detach()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return total


# %% [markdown]
# Accumulation changes nothing about the update: on a small model, one step over a batch of
# eight sentence pairs and one step over the same pairs cut into three micro-batches compute the
# same gradient, up to the rounding of a different order of additions. (We compare gradients,
# not the weights after the step: Adam's first step moves every weight by about
# $lr \cdot \operatorname{sign}(g)$, so a gradient that is exactly zero in theory but not in
# floating point, such as that of the key projection's bias, which the softmax ignores, moves
# its weight by $\pm lr$ at random.)

# %%
from transformer.config import TransformerConfig
from transformer.data import collate
from transformer.loss import LabelSmoothingLoss
from transformer.model import Transformer
from transformer.schedule import make_optimizer
from transformer.train import batch_log_probs, train_step

# The copy task's vocabulary: three special tokens, then ten symbols.
PAD, BOS, EOS = 0, 1, 2
SYMBOLS = range(3, 13)
V_COPY = len(SYMBOLS) + 3
tiny = TransformerConfig(
    src_vocab_size=V_COPY, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0
)
generator = torch.Generator().manual_seed(0)
pairs = []
for _ in range(8):
    n = int(torch.randint(2, 9, (1,), generator=generator))
    seq = torch.randint(SYMBOLS.start, SYMBOLS.stop, (n,), generator=generator)
    pairs.append((seq.tolist(), seq.tolist()))
full = collate(pairs, pad_id=PAD, bos_id=BOS, eos_id=EOS)
parts = [
    collate(pairs[a:b], pad_id=PAD, bos_id=BOS, eos_id=EOS)
    for a, b in [(0, 3), (3, 5), (5, 8)]
]
assert sum(p.n_tgt_tokens for p in parts) == full.n_tgt_tokens

gradients = {}
for name, batches in [("one batch", [full]), ("three micro-batches", parts)]:
    torch.manual_seed(0)
    model = Transformer(tiny)
    optimizer, scheduler = make_optimizer(model, d_model=32, warmup=10)
    criterion = LabelSmoothingLoss(pad_id=PAD, smoothing=0.1, reduction="sum")
    loss = train_step(
        model,
        batches,
        criterion=criterion,
        optimizer=optimizer,
        scheduler=scheduler,
        tokens=full.n_tgt_tokens,
    )
    gradients[name] = torch.cat([p.grad.flatten() for p in model.parameters()])
one, three = gradients["one batch"], gradients["three micro-batches"]
assert torch.allclose(one, three, rtol=1e-4, atol=1e-7)
# The size of the rounding differences depends on the CPU's kernels: bounded, not printed.
assert (one - three).abs().max() < 1e-6
print(
    f"{full.n_tgt_tokens} target tokens; gradient entries up to {one.abs().max():.2f}, "
    "the largest difference below 1e-6"
)

# %% [markdown]
# ## A first sanity check: copying
#
# Before spending GPU hours on translation, check that the model, the loss and the optimiser
# can learn *something* quickly. The classic test, used by the Annotated Transformer, is to copy:
# the source is a random sequence of symbols and the target is the same sequence. A Transformer
# can solve it exactly, with each decoder position attending to the source position it must
# copy, and it learns to in a few hundred updates on a CPU. If it does not, something is broken:
# a mask that lets the decoder see the answer would make the training loss fall to zero while
# decoding fails, and so would a missing shift (`tgt_out` equal to `tgt_in`, which lets each
# position copy its own input): that is why the real test is to generate, not to watch the loss.
#
# Each batch holds 64 fresh sequences of 2 to 10 symbols from a vocabulary of ten, so that
# padding and masks take part. The model is small (two layers of width 64), without dropout
# (every batch is fresh: short sequences repeat, but there are far too many long ones to
# memorise), and the schedule is equation (3) with a warm-up of 100 steps and `factor` 0.3; in
# our trials, with `factor` 1 the loss jumped back up now and then and a few copies of sequences
# with repeated symbols went wrong (post-norm layers dislike large learning rates, as the
# schedule chapter explained). 500 updates take well under a minute.

# %%
copy_config = TransformerConfig(
    src_vocab_size=V_COPY, d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.0
)


def copy_batch(size: int, generator: torch.Generator) -> list[tuple[list, list]]:
    """Random symbol sequences of 2 to 10 symbols, each paired with itself."""
    lengths = torch.randint(2, 11, (size,), generator=generator)
    low, high = SYMBOLS.start, SYMBOLS.stop
    seqs = [
        torch.randint(low, high, (int(n),), generator=generator).tolist()
        for n in lengths
    ]
    return [(s, s) for s in seqs]


torch.manual_seed(0)
copy_model = Transformer(copy_config)
optimizer, scheduler = make_optimizer(copy_model, d_model=64, warmup=100, factor=0.3)
criterion = LabelSmoothingLoss(pad_id=PAD, smoothing=0.1, reduction="sum")
generator = torch.Generator().manual_seed(1)
seen, copy_losses = set(), []
for _ in range(500):
    pairs = copy_batch(64, generator)
    seen.update(tuple(s) for s, _ in pairs)
    batch = collate(pairs, pad_id=PAD, bos_id=BOS, eos_id=EOS)
    loss = train_step(
        copy_model,
        [batch],
        criterion=criterion,
        optimizer=optimizer,
        scheduler=scheduler,
        tokens=batch.n_tgt_tokens,
    )
    copy_losses.append(loss.item() / batch.n_tgt_tokens)

# %% [markdown]
# The loss (label-smoothed, per target token) starts above that of a uniform guess over the 13
# tokens, $\ln V - H(q)$ for the KL divergence of the label-smoothing chapter, and falls to
# nearly zero within a few hundred updates: the KL divergence is zero when the model predicts
# the smoothed distribution itself.

# %% tags=["nbval-ignore-output"]
from transformer.plots import use_book_renderer

use_book_renderer()
alt.Chart(
    pd.DataFrame(
        {
            "update": range(1, len(copy_losses) + 1),
            "loss": [round(v, 4) for v in copy_losses],
        }
    )
).mark_line().encode(
    x="update:Q", y=alt.Y("loss:Q", title="label-smoothed loss per token (nats)")
).properties(title="The copy task: training loss", width=420, height=200)

# %% tags=["nbval-ignore-output"]
from transformer.loss import smoothed_target_entropy

uniform_guess = math.log(V_COPY) - smoothed_target_entropy(0.1, V_COPY)
assert copy_losses[0] > uniform_guess and sum(copy_losses[-20:]) / 20 < 0.1
print(f"uniform guess {uniform_guess:.2f}")
print(f"first update {copy_losses[0]:.2f}, last update {copy_losses[-1]:.4f}")

# %% [markdown]
# A low loss with the reference prefix fed in is not yet a copy. The real test is to *generate*:
# feed the decoder only `<bos>`, take the most probable next symbol, append it, and go on until
# `<eos>`. The decoding chapter builds this properly (with a cache of the decoder's keys and
# values, beam search and batches that finish at different times); here a few lines of greedy
# decoding, recomputing the whole prefix at each step, are enough. The test sequences are fresh
# ones that the model never saw in training.

# %% tags=["nbval-ignore-output"]
from transformer.masking import padding_mask, target_mask


@torch.no_grad()
def greedy_copy(model: Transformer, src: torch.Tensor, max_len: int) -> list[list[int]]:
    """Greedy decoding without a cache: the whole prefix is recomputed at every step."""
    model.eval()
    src_mask = padding_mask(src, PAD)
    memory = model.encode(src, src_mask)
    out = torch.full((src.size(0), 1), BOS)  # (B, 1)
    for _ in range(max_len):
        hidden = model.decode(
            out, memory, src_mask=src_mask, tgt_mask=target_mask(out, PAD)
        )
        next_token = model.generator(hidden[:, -1]).argmax(-1, keepdim=True)  # (B, 1)
        out = torch.cat([out, next_token], dim=1)
        if (out == EOS).any(dim=1).all():
            break
    outputs = []
    for row in out[:, 1:].tolist():  # drop <bos>; cut at the first <eos>
        outputs.append(row[: row.index(EOS)] if EOS in row else row)
    return outputs


test_pairs = copy_batch(200, torch.Generator().manual_seed(2))
test_pairs = [p for p in test_pairs if tuple(p[0]) not in seen]
test = collate(test_pairs, pad_id=PAD, bos_id=BOS, eos_id=EOS)
copies = greedy_copy(copy_model, test.src, max_len=12)
exact = sum(out == src for out, (src, _) in zip(copies, test_pairs, strict=True))
for (src, _), out in list(zip(test_pairs, copies, strict=True))[:3]:
    print("source", src, "\noutput", out)
print(f"exact copies: {exact} of {len(test_pairs)} unseen sequences")
assert exact >= 0.97 * len(test_pairs)

# %% [markdown]
# All unseen sequences, or all but one or two, are copied exactly: the masks, the shift of the
# targets, the loss and the optimiser work together (a mask that let the decoder see the answer
# would copy almost none). Which one or two fail, if any, depends on the machine: its
# floating-point arithmetic, and its number of threads, change the sums of the training steps in
# the last bits, and 500 updates of a post-norm model amplify that, so the tests check the
# share, not the count. Translation is harder, but the same step does it.
#
# ## What validation measures
#
# Each epoch ends with a pass over the validation split, without dropout and without updates,
# with the decoder fed the reference prefix (*teacher forcing*, as in training). It reports:
#
# - the **label-smoothed loss**, the quantity training minimises (the training loss is the same
#   quantity, but measured with dropout and averaged over an epoch of a changing model, so it
#   runs higher at first; later, once the model fits its training sentences better than unseen
#   ones, it runs lower);
# - the **negative log-likelihood** per token without smoothing, $\overline{\mathrm{NLL}} =
#   \frac{1}{N} \sum_i -\log p(y_i \mid y_{<i}, x)$, and its **perplexity per token**
#   $\exp(\overline{\mathrm{NLL}})$: the effective number of subword tokens the model hesitates
#   between at each position;
# - the **perplexity per word**, $\exp\left(\sum_i -\log p(y_i \mid \dots) / W\right)$, the same
#   total NLL divided by the number $W$ of *words* of the references instead of the number of
#   tokens. Subword perplexities depend on the vocabulary (a finer segmentation spreads the same
#   uncertainty over more tokens), so a per-word figure is what compares with models that use
#   other vocabularies, including word-level ones. We count as words the whitespace-separated
#   pieces of each detokenised reference (the text `Tokenizer.decode` gives back), so *"A man
#   sleeps."* is three words; the total NLL includes the predictions of `<eos>`, which adds one
#   token per sentence to the numerator and nothing to $W$. Models that count punctuation
#   marks and `<eos>` as words divide by more and report a lower perplexity for the same
#   predictions: our per-word figure is, if anything, the stricter one;
# - the **token accuracy**, the share of target positions whose most probable token is the
#   reference token, computed without smoothing (the `TokenStats` of the label-smoothing
#   chapter).
#
# With several processes each one validates its share of the batches and the sums are added up
# before the means are taken.

# %%
#| export
import math
from collections.abc import Iterable
from dataclasses import dataclass

from transformer.data import EncodedSplit, Tokenizer
from transformer.loss import TokenStats, token_stats


def _world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def count_words(tokenizer: Tokenizer, data: EncodedSplit) -> int:
    """Words of the references: whitespace-separated pieces of each decoded target sentence."""
    return sum(len(tokenizer.decode(tgt).split()) for _, tgt in data)


@dataclass(frozen=True)
class Validation:
    """Sums over a validation set: the label-smoothed loss, `TokenStats`, and the word count."""

    loss_sum: float
    stats: TokenStats
    words: int | None = None

    @property
    def loss(self) -> float:
        """Label-smoothed loss per target token."""
        return self.loss_sum / self.stats.tokens

    @property
    def word_perplexity(self) -> float | None:
        """exp(total NLL / words of the references); None without a word count."""
        return math.exp(self.stats.nll_sum / self.words) if self.words else None

    def metrics(self) -> dict[str, float | None]:
        return {
            "val_loss": self.loss,
            "val_nll": self.stats.nll,
            "val_ppl_token": self.stats.perplexity,
            "val_ppl_word": self.word_perplexity,
            "val_accuracy": self.stats.accuracy,
        }


@torch.no_grad()
def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    pad_id: int,
    smoothing: float = 0.1,
    words: int | None = None,
    bf16: bool = False,
) -> Validation:
    """Teacher-forced validation metrics, in eval mode; summed over processes when distributed."""
    criterion = LabelSmoothingLoss(pad_id=pad_id, smoothing=smoothing, reduction="sum")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, stats = 0.0, TokenStats()
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            log_probs = batch_log_probs(model, batch, pad_id=pad_id)
        loss_sum += criterion(log_probs, batch.tgt_out).item()
        stats += token_stats(log_probs, batch.tgt_out, pad_id=pad_id)
    model.train(was_training)
    if _world_size() > 1:
        sums = [loss_sum, stats.nll_sum, stats.correct, stats.tokens]
        total = torch.tensor(sums, dtype=torch.float64, device=device)
        dist.all_reduce(total)
        loss_sum, nll_sum, correct, tokens = total.tolist()
        stats = TokenStats(nll_sum=nll_sum, correct=int(correct), tokens=int(tokens))
    return Validation(loss_sum=loss_sum, stats=stats, words=words)


# %% [markdown]
# On the copy model and the unseen sequences: the accuracy is 1 (or a token or two short of it), and
# the perplexity per token is close to $1 / (1 - \epsilon + \epsilon / V)$, that of a model which
# predicts exactly the smoothed target distribution: label smoothing has taught it not to be more
# confident than that. Every symbol is a "word" here, so $W$ is the number of tokens less the
# `<eos>` of each sequence, and the per-word perplexity is higher: the same total NLL over fewer
# units.

# %% tags=["nbval-ignore-output"]
from transformer.train import evaluate

symbols = sum(len(src) for src, _ in test_pairs)
result = evaluate(copy_model, [test], pad_id=PAD, words=symbols)
assert result.stats.tokens == symbols + len(test_pairs)
smoothed_floor = 1 / (1 - 0.1 + 0.1 / V_COPY)
assert result.stats.accuracy > 0.99  # all but a token or two (see the copies above)
assert abs(result.stats.perplexity - smoothed_floor) < 0.1
assert result.word_perplexity > result.stats.perplexity
print(f"1 / (1 - ε + ε/V) = {smoothed_floor:.3f}")
{k: round(v, 3) for k, v in result.metrics().items()}

# %% [markdown]
# ## Counting the work: tokens per second and MFU
#
# Throughput is reported two ways. **Tokens per second** counts the real target tokens trained
# on (padding excluded). **Model FLOPs utilisation** (MFU) divides the arithmetic the model needs
# by the time it took and by the hardware's peak rate: the share of the GPU's matrix units that
# does useful work. A forward and backward pass costs about 6 floating-point operations per
# parameter and per token it is applied to (2 for the forward product, 4 for the two backward
# ones), plus the attention products, whose cost grows with the square of the lengths. For a
# pair with $S$ source and $T$ target tokens (without padding; $S$ counts the source's `<eos>`,
# $T$ the decoder's `<bos>`, one position per label):
#
# $$
# \mathrm{FLOPs} = 6\left((N_{enc} + N_{kv}) S + (N_{dec} - N_{kv} + d_{model} V) T\right)
# + 12\, d_{model} \left(L_e S^2 + L_d T^2 + L_d S T\right)
# $$
#
# where $N_{enc}$ and $N_{dec}$ are the parameters of the encoder and decoder stacks without the
# embeddings, $N_{kv}$ those of the decoder's cross-attention key and value projections (part of
# $N_{dec}$, but applied to the $S$ source positions of the encoder's output, not to the $T$ target
# positions; the project's GPU notes charge all of $N_{dec}$ to $T$, which miscounts those two
# projections, by under 1% here), $d_{model} V$ is the output layer (tied to the embedding table,
# but its matrix product is done on every target position all the same), and $L_e = L_d$ =
# `n_layers`. The three attention terms are encoder self-attention, decoder self-attention and
# cross-attention: $QK^\top$ and the product with $V$ take $2 \cdot 2 \cdot d_{model} S^2$
# operations forward in a layer, three times that forward and backward. The embedding look-ups and
# the positional encodings cost no multiplications, and the softmaxes, normalisations and masks are
# left out, as usual: MFU counts only the arithmetic the model cannot do without. The formula is
# summed over the pairs of a batch, so padding adds nothing to it, and MFU is that sum over the step
# time and the peak rate. For the bfloat16 matrix products of an H100 or H200 we use the rate
# measured on those cards, about $790 \times 10^{12}$ FLOP/s (the data sheet gives 989 for the H100
# SXM).

# %%
#| export
import numpy as np

PEAK_BF16_FLOPS = 790e12  # measured bf16 matrix-multiply rate of an H100 or H200


def _unwrap(model: nn.Module) -> nn.Module:
    """The model inside torch.compile's and DistributedDataParallel's wrappers."""
    model = getattr(model, "_orig_mod", model)
    return model.module if isinstance(model, DistributedDataParallel) else model


def non_embedding_parameters(model: nn.Module) -> tuple[int, int]:
    """N_enc and N_dec: the parameters of the encoder and decoder stacks."""
    model = _unwrap(model)
    return (
        sum(p.numel() for p in model.encoder.parameters()),
        sum(p.numel() for p in model.decoder.parameters()),
    )


def cross_attention_kv_parameters(model: nn.Module) -> int:
    """N_kv: the parameters of the decoder's cross-attention key and value projections,
    which are applied to the source positions."""
    return sum(
        p.numel()
        for layer in _unwrap(model).decoder.layers
        for projection in (layer.cross_attn.w_k, layer.cross_attn.w_v)
        for p in projection.parameters()
    )


def training_flops(
    model: nn.Module, *, src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> np.ndarray:
    """FLOPs of a forward and backward pass over each (source, target) pair, by the formula
    6·((N_enc + N_kv)·S + (N_dec − N_kv + d_model·V)·T)
    + 12·d_model·(L_e·S² + L_d·T² + L_d·S·T).

    Lengths count real tokens (<eos> of the source, <bos> or <eos> of the target included).
    """
    n_enc, n_dec = non_embedding_parameters(model)
    n_kv = cross_attention_kv_parameters(model)
    config = _unwrap(model).config
    d, layers, vocab = config.d_model, config.n_layers, config.target_vocab_size
    s = np.asarray(src_lengths, dtype=np.float64)
    t = np.asarray(tgt_lengths, dtype=np.float64)
    linear = 6 * ((n_enc + n_kv) * s + (n_dec - n_kv + d * vocab) * t)
    attention = 12 * d * (layers * s**2 + layers * t**2 + layers * s * t)
    return linear + attention


# %% [markdown]
# For the paper's base model with a vocabulary of 37,000, a pair of 25 source and 27 target
# tokens costs about 10 GFLOPs, of which attention is under 1% and the output layer
# ($6 \cdot d_{model} V \cdot T$) almost a third: at the lengths of translation, the linear
# layers dominate.

# %%
from transformer.train import (
    cross_attention_kv_parameters,
    non_embedding_parameters,
    training_flops,
)

with torch.device("meta"):
    base = Transformer(TransformerConfig.base(37_000))
n_enc, n_dec = non_embedding_parameters(base)
flops = training_flops(base, src_lengths=[25], tgt_lengths=[27])[0]
attention = 12 * 512 * 6 * (25**2 + 27**2 + 25 * 27)
output_layer = 6 * 512 * 37_000 * 27
n_kv = cross_attention_kv_parameters(base)
assert n_kv == 6 * 2 * (512 * 512 + 512)  # six layers, W_K and W_V with their biases
linear = 6 * ((n_enc + n_kv) * 25 + (n_dec - n_kv + 512 * 37_000) * 27)
assert flops == linear + attention
print(f"N_enc {n_enc:,}, N_dec {n_dec:,}, of which N_kv {n_kv:,}")
print(
    f"FLOPs {flops / 1e9:.2f} G, of which attention {attention / flops:.1%} "
    f"and the output layer {output_layer / flops:.1%}"
)
# A batch is the sum of its pairs: padding costs nothing in the count.
two = training_flops(base, src_lengths=[25, 10], tgt_lengths=[27, 12])
assert two.sum() == flops + training_flops(base, src_lengths=[10], tgt_lengths=[12])[0]

# %% [markdown]
# ## Checkpoints
#
# A run writes a checkpoint at the end of every epoch, and when it must stop before the end (a
# time limit or a step limit), one where it stops. A checkpoint is a folder:
#
# | file | holds |
# | --- | --- |
# | `model.safetensors` | the weights, float32 |
# | `trainer.safetensors`, `trainer.json` | Adam's moments, step counts and settings; the scheduler's state |
# | `progress.json` | where the run stands: epochs done, batches of the current epoch used, updates made, and the epoch's running sums |
# | `config.json` | the model's `TransformerConfig`, the run's `TrainConfig`, the vocabulary's size and fingerprint |
# | `tokenizer.json` | the tokenizer the run was trained with |
#
# **No pickle.** `torch.save` writes Python pickles, and loading a pickle runs whatever code it
# names: a checkpoint downloaded from somewhere could do anything. Tensors go into
# [safetensors](https://huggingface.co/docs/safetensors) files, which hold only named arrays and
# a JSON header, and everything else into plain JSON. The optimiser's and scheduler's
# `state_dict()` are nested dictionaries and lists of tensors and numbers; `save_state` walks
# such a structure, puts each tensor into the safetensors file under its path in the structure,
# and writes the rest as JSON, marking tuples and integer dictionary keys so that loading gives
# back exactly what was saved.
#
# **Tied weights, once.** The source embedding, the target embedding and the output layer share
# one matrix. `model.state_dict()` lists it three times, and safetensors refuses to store
# tensors that share memory. `model_tensors` keeps each tensor once, under its first name; loading
# copies the stored values into the parameters of a freshly built model, where the sharing is
# already in place.
#
# **Atomic writes.** A checkpoint is written into a hidden temporary folder next to its final
# place and renamed when complete. A rename is atomic: a run killed while writing leaves at worst
# a temporary folder, which is ignored and cleaned up, never a checkpoint that is half written.
# Before the rename every file of the folder is flushed to the disk (`fsync`), and
# the rename itself after it, so that a power cut cannot leave a complete-looking
# folder of empty files.

# %%
#| export
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import safetensors.torch

CHECKPOINT_FORMAT = "transformer-book checkpoint 1"
# and the form `export_model` writes (the section "Exporting and loading a model")
SHIPPED_FORMAT = "transformer-book model 1"


class CheckpointError(Exception):
    """A checkpoint or model folder is missing, incomplete, or does not match the run."""


def _encode(obj: object, tensors: dict[str, Tensor], path: str) -> dict:
    """JSON for a nested state, its tensors moved into `tensors` under their paths."""
    if isinstance(obj, Tensor):
        tensors[path] = obj.detach().to("cpu").contiguous()
        return {"tensor": path}
    if isinstance(obj, dict):
        return {
            "dict": [[k, _encode(v, tensors, f"{path}/{k}")] for k, v in obj.items()]
        }
    if isinstance(obj, list | tuple):
        items = [_encode(v, tensors, f"{path}/{i}") for i, v in enumerate(obj)]
        return {"tuple" if isinstance(obj, tuple) else "list": items}
    if obj is None or isinstance(obj, bool | int | float | str):
        return {"value": obj}
    raise TypeError(f"cannot store a {type(obj).__name__} at {path} without pickle")


def _decode(node: dict, tensors: dict[str, Tensor]) -> object:
    ((kind, value),) = node.items()
    if kind == "tensor":
        return tensors[value]
    if kind == "dict":
        return {k: _decode(v, tensors) for k, v in value}
    if kind in ("list", "tuple"):
        items = [_decode(v, tensors) for v in value]
        return tuple(items) if kind == "tuple" else items
    return value


def save_state(folder: Path, name: str, state: object) -> None:
    """Write a nested state as `name.safetensors` (its tensors) and `name.json` (the rest)."""
    tensors: dict[str, Tensor] = {}
    skeleton = _encode(state, tensors, name)
    safetensors.torch.save_file(tensors, Path(folder) / f"{name}.safetensors")
    (Path(folder) / f"{name}.json").write_text(json.dumps(skeleton) + "\n")


def load_state(folder: Path, name: str) -> object:
    """The state that `save_state` wrote, tensors on the CPU."""
    try:
        tensors = safetensors.torch.load_file(Path(folder) / f"{name}.safetensors")
        skeleton = json.loads((Path(folder) / f"{name}.json").read_text())
        return _decode(skeleton, tensors)
    except (OSError, ValueError, KeyError, safetensors.SafetensorError) as err:
        raise CheckpointError(f"cannot read {name} state in {folder}: {err}") from err


def model_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The weights and persistent buffers, each shared tensor once under its first name."""
    tensors, seen = {}, set()
    for name, tensor in _unwrap(model).state_dict(keep_vars=True).items():
        if id(tensor) not in seen:  # tied parameters are one object under several names
            seen.add(id(tensor))
            tensors[name] = tensor.detach()
    return tensors


def save_weights(
    model: nn.Module, path: Path, *, dtype: torch.dtype | None = None
) -> None:
    """Write the model's weights (tied ones once) as a safetensors file."""
    tensors = {
        name: t.to("cpu", dtype=dtype or t.dtype).contiguous()
        for name, t in model_tensors(model).items()
    }
    safetensors.torch.save_file(
        tensors, Path(path), metadata={"format": CHECKPOINT_FORMAT}
    )


def read_tensors(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a safetensors file; a missing or damaged file is a CheckpointError
    naming it."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no weights file {path}")
    try:
        return safetensors.torch.load_file(path)
    except (OSError, safetensors.SafetensorError) as err:
        raise CheckpointError(f"cannot read weights {path}: {err}") from err


def load_tensors_into(
    model: nn.Module, tensors: dict[str, Tensor], source: object
) -> None:
    """Copy `tensors` into the model's weights (tied ones follow), after checking names and
    shapes; errors name `source`."""
    expected = model_tensors(model)
    missing = sorted(expected.keys() - tensors.keys())
    unexpected = sorted(tensors.keys() - expected.keys())
    if missing or unexpected:
        raise CheckpointError(
            f"{source}: the weights do not fit the model: "
            f"missing {missing[:3] or 'none'}, unexpected {unexpected[:3] or 'none'}"
        )
    for name, target in expected.items():
        if tensors[name].shape != target.shape:
            raise CheckpointError(
                f"{source}: weight {name} has shape {tuple(tensors[name].shape)}, "
                f"the model expects {tuple(target.shape)}"
            )
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(tensors[name])


def load_weights(model: nn.Module, path: Path) -> None:
    """Load a safetensors file written by `save_weights` into a model of the same config."""
    tensors = read_tensors(path)
    load_tensors_into(_unwrap(model), tensors, path)


def _fsync(path: Path) -> None:
    """Ask the disk to hold what `path` (a file or a folder) says before going on."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary folder that replaces `path` when the block ends without error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        # A rename can reach the disk before the data of the files renamed: after a
        # power cut the folder would be there with empty files. The data first, then
        # the names.
        for folder, _, files in os.walk(tmp):
            for name in files:
                _fsync(Path(folder) / name)
            _fsync(Path(folder))
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        if path.exists():  # a rename cannot replace a folder that has files in it
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(path.parent)  # the renames themselves
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def average_checkpoints(paths: Sequence[Path]) -> dict[str, Tensor]:
    """The element-wise mean of the weights of several checkpoints (folders or files).

    The paper's final models average the last 5 (base) or 20 (big) checkpoints (section 6.1).
    """
    if not paths:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    total: dict[str, Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for path in paths:
        file = Path(path) / "model.safetensors" if Path(path).is_dir() else Path(path)
        tensors = read_tensors(file)
        if not total:
            total = {k: v.double() for k, v in tensors.items()}
            dtypes = {k: v.dtype for k, v in tensors.items()}
            first = file
            continue
        if tensors.keys() != total.keys():
            raise CheckpointError(f"{file} holds other weights than {first}")
        for name, value in tensors.items():
            if value.shape != total[name].shape:
                raise CheckpointError(
                    f"{file}: weight {name} has shape {tuple(value.shape)}, "
                    f"{first} has {tuple(total[name].shape)}"
                )
            total[name] += (
                value.double()
            )  # float64 sums: the order of files does not matter
    return {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}


# %% [markdown]
# The copy model's shared matrix is stored once, and loading it into a freshly built model gives
# the same outputs, with the three uses of the matrix still one tensor:

# %%
from transformer.train import (
    average_checkpoints,
    load_state,
    load_weights,
    model_tensors,
    save_state,
    save_weights,
)

scratch = Path(tempfile.mkdtemp())
save_weights(copy_model, scratch / "model.safetensors")
names = list(model_tensors(copy_model))
all_names = list(copy_model.state_dict())
print(f"state_dict: {len(all_names)} entries; stored: {len(names)}")
print("not stored (aliases):", sorted(set(all_names) - set(names)))

restored = Transformer(copy_config)
load_weights(restored, scratch / "model.safetensors")
assert restored.generator.proj.weight is restored.src_embed.embedding.weight
restored.eval()
with torch.no_grad():
    args = dict(
        src_mask=padding_mask(test.src, PAD), tgt_mask=target_mask(test.tgt_in, PAD)
    )
    assert torch.equal(
        restored(test.src, test.tgt_in, **args),
        copy_model(test.src, test.tgt_in, **args),
    )

# %% [markdown]
# The optimiser's state, with its integer keys and its `betas` tuple, comes back equal, tensor
# for tensor and number for number:

# %%
save_state(scratch, "trainer", {"optimizer": optimizer.state_dict()})
back = load_state(scratch, "trainer")["optimizer"]
original = optimizer.state_dict()
assert back["param_groups"] == original["param_groups"]
assert back["state"].keys() == original["state"].keys()
assert all(
    torch.equal(back["state"][i][k], v)
    for i, s in original["state"].items()
    for k, v in s.items()
)
print(json.dumps(back["param_groups"][0], default=str)[:150], "…")

# %% [markdown]
# Averaging is a plain element-wise mean. On three tiny "checkpoints" with known values:

# %%
from safetensors.torch import save_file

for i, (w, b) in enumerate(
    [([1.0, 2.0], [0.0]), ([3.0, 4.0], [1.0]), ([5.0, 9.0], [2.0])]
):
    save_file(
        {"w": torch.tensor(w), "b": torch.tensor(b)}, scratch / f"c{i}.safetensors"
    )
mean = average_checkpoints([scratch / f"c{i}.safetensors" for i in range(3)])
assert torch.equal(mean["w"], torch.tensor([3.0, 5.0]))
assert torch.equal(mean["b"], torch.tensor([1.0]))
mean

# %% [markdown]
# Why averaging helps: late in training, with a small learning rate, successive checkpoints sit
# around a minimum of the loss, each displaced from it by the noise of its last updates. Their
# mean cancels much of that noise, much as Polyak averaging does for stochastic gradient descent,
# and the paper's best results are those of averaged models.
#
# ## The configuration
#
# A run is described by one frozen dataclass, `TrainConfig`, validated when it is made (each
# error names its field) and stored as JSON in every checkpoint. The model is a preset of
# `TransformerConfig` (`small`, `base` or `big`) with optional overrides of any of its fields
# except the vocabulary size, which comes from the tokenizer; dropout is one of these overrides.
# The defaults follow the paper where the paper has a value (warm-up 4,000, label smoothing 0.1,
# the average of the last 5 checkpoints), and the data chapter's batch budget of 8,000 tokens
# per side; the Multi30k runs override several of them.
#
# `bf16=None` means "bfloat16 autocast on a CUDA GPU, float32 elsewhere". `compile=True`
# compiles the model with `torch.compile`, which pays a compilation at the start (and one more
# when the batch shapes first change) for faster steps afterwards. `time_limit` (minutes) stops
# the run early enough to validate and write a checkpoint before the limit, so that it can be
# resumed: on a cluster or a service that limits each job's time, a long run becomes a chain of
# `--resume`s. `max_steps` stops after that many updates, for tests and quick runs.
# `bpe_dropout` (default 0, off, as in the paper) samples the segmentation of the training
# words afresh each epoch, as the data chapter's last section describes, on both sides or, with
# `bpe_dropout_sides="source"`, on the source side only. A sentence so spelled can grow up to
# one token per character (to 256 tokens in German→English's training pairs, the data
# chapter), so the trainer checks that `max_tokens` and `max_len` hold that spelling before
# the first update, not in whichever epoch first draws it.

# %%
#| export
import dataclasses
from typing import Any

from transformer.config import TransformerConfig
from transformer.data import CACHE_DIR, DATA_DIR, MAX_TOKENS, PAIRS, VOCAB_SIZE

MODEL_PRESETS = ("small", "base", "big")
BPE_DROPOUT_SIDES = {"both": ("src", "tgt"), "source": ("src",)}
_VOCAB_FIELDS = ("src_vocab_size", "tgt_vocab_size")


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run; the defaults follow the paper where it says."""

    pair: str
    model: str = "small"  # a TransformerConfig preset
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    vocab_size: int = VOCAB_SIZE  # of the joint BPE vocabulary (data chapter)
    epochs: int = 10
    max_steps: int | None = None
    max_tokens: int = MAX_TOKENS  # padded tokens per batch and side, per process
    accumulation: int = 1  # batches per process and update
    warmup: int = 4000
    lr_factor: float = 1.0
    label_smoothing: float = 0.1
    bpe_dropout: float = 0.0  # on the training words (data chapter); 0: off (the paper)
    bpe_dropout_sides: str = "both"  # or "source": targets keep BPE's own spelling
    seed: int = 0
    bf16: bool | None = None  # None: on with CUDA
    compile: bool = False
    average_last: int = 5  # checkpoints averaged at the end; 0 or 1: none
    time_limit: float | None = None  # minutes
    out_dir: str | None = None  # None: runs/<pair>
    cache_dir: str | None = None  # None: the data chapter's cache
    data_dir: str | None = None  # None: data/multi30k
    device: str | None = None  # None: cuda when available, else cpu
    log_every: int = 50  # updates between progress lines in steps.jsonl
    peak_flops: float = PEAK_BF16_FLOPS  # per device, for MFU

    def __post_init__(self) -> None:
        if self.pair not in PAIRS:
            raise ValueError(
                f"pair: unknown language pair {self.pair!r}, choose one of {', '.join(PAIRS)}"
            )
        if self.model not in MODEL_PRESETS:
            raise ValueError(
                f"model: unknown preset {self.model!r}, choose one of {', '.join(MODEL_PRESETS)}"
            )
        if not isinstance(self.model_overrides, dict):
            raise ValueError(
                f"model_overrides must be a dict, got {self.model_overrides!r}"
            )
        object.__setattr__(
            self, "model_overrides", dict(self.model_overrides)
        )  # a copy
        known = {f.name for f in dataclasses.fields(TransformerConfig)} - set(
            _VOCAB_FIELDS
        )
        bad = sorted(set(self.model_overrides) - known)
        if bad:
            raise ValueError(
                f"model_overrides: unknown or fixed field(s) {', '.join(bad)} (the vocabulary "
                f"size comes from the tokenizer); known: {', '.join(sorted(known))}"
            )
        for name in ("vocab_size", "epochs", "max_tokens", "accumulation", "warmup"):
            if not _positive_int(getattr(self, name)):
                raise ValueError(
                    f"{name} must be a positive integer, got {getattr(self, name)!r}"
                )
        if self.max_steps is not None and not _positive_int(self.max_steps):
            raise ValueError(
                f"max_steps must be a positive integer or None, got {self.max_steps!r}"
            )
        if not _positive_int(self.log_every):
            raise ValueError(
                f"log_every must be a positive integer, got {self.log_every!r}"
            )
        if (
            not isinstance(self.seed, int)
            or isinstance(self.seed, bool)
            or self.seed < 0
        ):
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
        if not isinstance(self.average_last, int) or self.average_last < 0:
            raise ValueError(
                f"average_last must be an integer >= 0, got {self.average_last!r}"
            )
        for name in ("lr_factor", "peak_flops"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not 0 < value < math.inf
            ):
                raise ValueError(
                    f"{name} must be a finite positive number, got {value!r}"
                )
        if not isinstance(self.label_smoothing, int | float) or not (
            0.0 <= self.label_smoothing < 1.0
        ):
            raise ValueError(
                f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}"
            )
        if (
            isinstance(self.bpe_dropout, bool)
            or not isinstance(self.bpe_dropout, int | float)
            or not 0.0 <= self.bpe_dropout < 1.0
        ):
            raise ValueError(f"bpe_dropout must be in [0, 1), got {self.bpe_dropout!r}")
        if (
            not isinstance(self.bpe_dropout_sides, str)
            or self.bpe_dropout_sides not in BPE_DROPOUT_SIDES
        ):
            raise ValueError(
                f"bpe_dropout_sides must be one of {', '.join(BPE_DROPOUT_SIDES)}, "
                f"got {self.bpe_dropout_sides!r}"
            )
        if self.time_limit is not None and not (
            isinstance(self.time_limit, int | float)
            and not isinstance(self.time_limit, bool)
            and 0 < self.time_limit < math.inf
        ):
            raise ValueError(
                "time_limit must be finite positive minutes or None, "
                f"got {self.time_limit!r}"
            )
        if self.bf16 not in (None, True, False):
            raise ValueError(f"bf16 must be True, False or None, got {self.bf16!r}")
        if not isinstance(self.compile, bool):
            raise ValueError(f"compile must be True or False, got {self.compile!r}")
        for name in ("out_dir", "cache_dir", "data_dir", "device"):
            if getattr(self, name) is not None and not isinstance(
                getattr(self, name), str
            ):
                raise ValueError(
                    f"{name} must be a string or None, got {getattr(self, name)!r}"
                )
        if self.device is not None:
            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(
                    "device must be a torch device such as cpu, cuda or cuda:1, "
                    f"got {self.device!r}"
                ) from None
        try:  # the overrides' values, e.g. d_model % n_heads
            self.model_config(self.vocab_size)
        except (ValueError, TypeError) as err:
            raise ValueError(f"model_overrides: {err}") from err

    def model_config(self, vocab_size: int) -> TransformerConfig:
        """The model's config for a tokenizer of `vocab_size` entries."""
        preset = getattr(TransformerConfig, self.model)
        return preset(vocab_size, **self.model_overrides)

    def uses_bf16(self, device_type: str) -> bool:
        """Whether to train and validate under bfloat16 autocast on a `device_type` device:
        `bf16` if set, otherwise on with CUDA only."""
        return self.bf16 if self.bf16 is not None else device_type == "cuda"

    @property
    def output_dir(self) -> Path:
        return Path(self.out_dir if self.out_dir is not None else f"runs/{self.pair}")

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir is not None else CACHE_DIR

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir is not None else DATA_DIR

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """Rebuild a config from `to_dict()`'s output; unknown keys are errors."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TrainConfig field(s) {', '.join(unknown)}")
        return cls(**d)


def quick_mode() -> bool:
    """Whether heavy cells run their small CPU version: without a CUDA GPU, or when the
    environment sets TRANSFORMER_QUICK=1 (TRANSFORMER_QUICK=0 asks for the full version)."""
    flag = os.environ.get("TRANSFORMER_QUICK", "")
    if flag not in ("", "0", "1"):
        raise ValueError(f"TRANSFORMER_QUICK must be 0 or 1, got {flag!r}")
    if flag:
        return flag == "1"
    return not torch.cuda.is_available()


def quick_config(pair: str, **overrides: Any) -> TrainConfig:
    """A tiny model trained for a few dozen updates: about a minute on a 2-core CPU."""
    fields = dict(
        pair=pair,
        model="small",
        model_overrides=dict(n_layers=2, d_model=64, n_heads=4, d_ff=256),
        epochs=1,
        max_steps=60,
        max_tokens=1500,
        warmup=40,
        average_last=0,
        log_every=5,
    )
    return TrainConfig(**(fields | overrides))


# %% [markdown]
# A config survives the trip through JSON, and a bad value is caught with its field's name:

# %%
from transformer.train import TrainConfig, quick_config

config = TrainConfig(
    pair="de-en",
    model="small",
    model_overrides={"dropout": 0.3},
    epochs=20,
    warmup=2000,
)
assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
print(config.model_config(8000))
for bad in [
    dict(pair="en-de"),
    dict(pair="de-en", warmup=0),
    dict(pair="de-en", model_overrides={"d_model": 100}),
]:
    try:
        TrainConfig(**bad)
    except ValueError as err:
        print("ValueError:", err)
    else:
        raise AssertionError(f"{bad} was accepted")

# %% [markdown]
# ## Several GPUs
#
# With several GPUs, PyTorch's `DistributedDataParallel` (DDP) keeps one copy of the model per
# GPU, one process per GPU. Each process runs forward and backward on its own batches; during
# the backward pass DDP adds up the gradients of all processes (an *all-reduce*) and divides by
# their number, so that every copy takes the same optimiser step and the copies stay identical.
# The paper trained this way on 8 GPUs.
#
# The loop runs the same code with one process or several. Each process reads its rank $r$ and
# the number of processes $P$ from the environment that `torchrun` sets (`RANK`, `WORLD_SIZE`,
# `LOCAL_RANK`); without them, $P = 1$. All processes compute the same list of batches for an
# epoch (it depends only on the seed and the epoch), and an update takes the next
# $P \times$ `accumulation` of them: process $r$ takes batches $r, r + P, r + 2P, \dots$ of that
# group. Since every process knows the whole list, each knows the token count $N$ of the whole
# update without communicating, and scales its loss by $P / N$: DDP's division by $P$ then
# leaves exactly the gradient of the summed loss over $N$, the update a single process would make
# on all the batches (without dropout: each process draws its own dropout masks). The
# few batches at the end of an epoch that do not fill a whole group are left out of that
# epoch (the next epoch's order is different). A run whose epoch cannot fill a single
# group is refused before it starts, and one that leaves out more than a tenth of each
# epoch this way says so in its log.
#
# ```
# torchrun --nproc_per_node 8 -m transformer train --pair de-en --config base --out runs/big-batch
# ```
#
# (The line shows the syntax. Multi30k is too small for eight GPUs: with the `base` preset's
# 8,000 tokens per process, an update would cover about 64,000 target tokens, seven updates an
# epoch, and 10 epochs would not leave the warm-up of 4,000 updates.)
#
# The tests check the equivalence on a CPU, with PyTorch's `gloo` backend and two processes: two
# processes on the two halves of a batch make the same update as one process on the whole batch,
# and a whole `train` run with two processes ends with the same weights, to $10^{-6}$, as one
# process accumulating two batches per update, both without dropout (`tests/test_train.py`,
# `test_two_processes_make_the_update_of_one`).

# %%
#| export
from collections.abc import Mapping


@dataclass(frozen=True)
class Distributed:
    """This process's place among the processes of a run (torchrun's environment)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "Distributed":
        environ = os.environ if environ is None else environ
        try:
            world_size = int(environ.get("WORLD_SIZE", "1"))
            rank = int(environ.get("RANK", "0"))
            local_rank = int(environ.get("LOCAL_RANK", str(rank)))
        except ValueError as err:
            raise ValueError(
                f"bad RANK/WORLD_SIZE/LOCAL_RANK in the environment: {err}"
            ) from err
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(
                f"RANK={rank} and WORLD_SIZE={world_size} do not fit together"
            )
        return cls(rank=rank, world_size=world_size, local_rank=local_rank)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def _device(config: TrainConfig, env: Distributed) -> torch.device:
    if config.device is not None:
        device = torch.device(config.device)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", env.local_rank)
    return device


def _barrier() -> None:
    if _world_size() > 1:
        dist.barrier()


def _seed_update(seed: int, step: int, rank: int) -> None:
    # The randomness of an update (dropout) is a function of (seed, update, process): a resumed
    # run draws the same masks as an uninterrupted one without storing generator states.
    torch.manual_seed(
        int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])
    )


# %% [markdown]
# ## The loop
#
# `train(config)` does a whole run:
#
# 1. **Set-up.** Check the output folder (a folder holding another run is an error unless
#    resuming), load the tokenizer and the encoded splits from the data chapter's cache (which
#    needs no spaCy once built), build the model with the run's seed, Adam and the schedule,
#    and, when resuming, the weights, the optimiser, the scheduler and the position in the data
#    from the latest checkpoint, after checking that the checkpoint's model and vocabulary are
#    those of the run. Wrap the model in DDP with several processes, and compile it if asked.
# 2. **Epochs.** Each epoch orders the training pairs into token-bucketed batches from
#    `(seed, epoch)`, and makes one update per group of batches. With BPE-dropout, the epoch first
#    spells the training words afresh, also from `(seed, epoch)`; on a GPU a second process prepares
#    the next epoch's spelling while this one trains. A progress bar shows the loss, the tokens per
#    second and the learning rate (it is switched off when the output is not a terminal, so logs and
#    notebooks stay clean), and every `log_every` updates a line goes to `steps.jsonl`.
# 3. **Epoch end.** Validate; append the epoch's metrics to `metrics.jsonl`; write the
#    checkpoint; delete the checkpoints that are no longer needed (the last `average_last` are
#    kept for averaging, and the optimiser state only in the newest).
# 4. **The end.** Average the last `average_last` epoch checkpoints into `average/`, validate
#    the average, and record it in `metrics.jsonl` too. (The paper averaged checkpoints written
#    every 10 minutes; on Multi30k an epoch is the natural interval.)
#
# **Exact resume.** Everything an update depends on is either in the checkpoint or a function of it:
# the weights and Adam's moments (safetensors), the scheduler's step count and the position in the
# epoch's list of batches (JSON), the list itself and its segmentation under BPE-dropout (functions
# of the seed and the epoch), and the dropout masks (a function of the seed, the update and the
# process, drawn fresh at each update). So a run stopped after one epoch and resumed for a second
# ends with *bit-identical* weights to a run of two epochs straight, on the same CPU; the test
# `test_resume_is_exact` checks it. A GPU promises less: some kernels (backward passes that add with
# atomic operations, for one) may add in a varying order from run to run. This recipe's float32 runs
# on the H100 were repeatable all the same: the shipped runs and the first 35 epochs of the
# `110-epochs` runs, separate processes with the same seed, recorded the same training loss and
# validation perplexity to the last stored digit (asserted with the comparison runs below). A resume
# must also run as many processes as the run it continues, since they decide the updates: the number
# is kept with the checkpoint and checked. Metrics lines written after the checkpoint a run resumes
# from are dropped, since the resumed run writes them again. The `average` line of a run that ended
# and is continued for more epochs was written at the step of its last checkpoint, so it is kept:
# the new end adds another, and the last one counts.
#
# Every line of `metrics.jsonl` holds `kind` (`epoch`, `partial` for a stop within an epoch, or
# `average`), `epoch` (epochs completed, fractional for a partial one), `step` (updates made),
# the validation metrics above (`val_loss`, `val_nll`, `val_ppl_token`, `val_ppl_word`,
# `val_accuracy`) and `wall_time` (seconds since the run began, across resumes). An `epoch` or
# `partial` line adds `train_loss` (label-smoothed, per token, over the epoch), `train_tokens`,
# `tokens_per_s` (real target tokens per second of training, validation excluded), `lr` (the
# learning rate of the last update) and `mfu` (null on a CPU); an `average` line adds
# `averaged`, the checkpoints it averaged, and its `epoch` and `step` are where the run stood
# when it averaged them.

# %%
#| export
import functools
import multiprocessing
import sys
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict

from tqdm import tqdm

from transformer.data import (
    BPEDropout,
    DataError,
    _atomic_write,
    collate,
    iterate_batches,
    load_encoded,
    prepare,
    token_batches,
)
from transformer.model import Transformer
from transformer.schedule import make_optimizer, noam_lr


@dataclass(frozen=True)
class TrainingData:
    """The tokenizer and the encoded splits a run trains and validates on."""

    tokenizer: Tokenizer
    train: EncodedSplit
    val: EncodedSplit


def load_training_data(config: TrainConfig) -> TrainingData:
    """The pair's tokenizer and splits from the encoded cache, built first if needed (spaCy)."""
    env = Distributed.from_environ()
    try:
        # The first process builds the cache; the others wait and load it.
        if not env.is_main:
            _barrier()
        tokenizer = prepare(
            config.pair,
            config.cache_path,
            vocab_size=config.vocab_size,
            data_dir=config.data_path,
        )
        splits = [
            load_encoded(
                config.pair, split, config.cache_path, data_dir=config.data_path
            )
            for split in ("train", "val")
        ]
    except ImportError as err:  # no spaCy to build a missing cache
        raise DataError(str(err)) from err
    finally:
        if env.is_main:
            _barrier()
    return TrainingData(tokenizer, *splits)


def _tokenizer_digest(tokenizer: Tokenizer) -> str:
    import hashlib

    return hashlib.sha256(tokenizer.to_json().encode("utf-8")).hexdigest()


def run_record(
    config: TrainConfig, model_config: TransformerConfig, tokenizer: Tokenizer
) -> dict[str, Any]:
    """What config.json holds: the model, the run, and the vocabulary's fingerprint."""
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model_config.to_dict(),
        "train": config.to_dict(),
        "vocab": {"size": tokenizer.vocab_size, "sha256": _tokenizer_digest(tokenizer)},
    }


# The fields a resumed run must share with its checkpoint: they decide the updates themselves.
RESUME_FIXED = (
    "pair",
    "model",
    "model_overrides",
    "vocab_size",
    "max_tokens",
    "accumulation",
    "warmup",
    "lr_factor",
    "label_smoothing",
    "bpe_dropout",
    "bpe_dropout_sides",
    "seed",
)


def read_record(folder: Path) -> dict[str, Any]:
    """A checkpoint's or model folder's config.json."""
    path = Path(folder) / "config.json"
    try:
        record = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{folder} is not a checkpoint: no config.json") from None
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path}: {err}") from err
    if not isinstance(record, dict) or not isinstance(record.get("model"), dict):
        raise CheckpointError(f"{path} is not a transformer-book config")
    if not isinstance(record.get("vocab"), dict):
        raise CheckpointError(f"{path} is not a transformer-book config")
    known = (CHECKPOINT_FORMAT, SHIPPED_FORMAT)
    if record.get("format", CHECKPOINT_FORMAT) not in known:
        raise CheckpointError(
            f"{path} has format {record['format']!r}, which this version cannot read "
            f"({CHECKPOINT_FORMAT!r} or {SHIPPED_FORMAT!r})"
        )
    return record


def check_recipe(folder: Path, config: TrainConfig) -> None:
    """Raise CheckpointError, naming the folder and the field, if the checkpoint in `folder`
    was trained with another value of a field that decides the updates (RESUME_FIXED)."""
    stored = read_record(folder).get("train", {})
    for name in RESUME_FIXED:
        theirs, ours = stored.get(name), getattr(config, name)
        if name == "model_overrides":  # name the field of the model that differs
            theirs, ours = theirs or {}, ours or {}
            for key in sorted(theirs.keys() | ours.keys()):
                if theirs.get(key) != ours.get(key):
                    raise CheckpointError(
                        f"{folder}: the checkpoint was trained with {name}.{key}="
                        f"{theirs.get(key)!r}, this run asks for {name}.{key}={ours.get(key)!r}"
                    )
        elif name in stored and theirs != ours:
            raise CheckpointError(
                f"{folder}: the checkpoint was trained with {name}={theirs!r}, "
                f"this run asks for {name}={ours!r}"
            )


def check_compatible(
    folder: Path, *, model_config: TransformerConfig, tokenizer: Tokenizer
) -> None:
    """Raise CheckpointError, naming the folder and the field, unless the checkpoint in
    `folder` has this model config and this vocabulary."""
    record = read_record(folder)
    theirs, ours = record["model"], model_config.to_dict()
    for name in sorted(theirs.keys() | ours.keys()):
        if theirs.get(name) != ours.get(name):
            raise CheckpointError(
                f"{folder}: the checkpoint's model has {name}={theirs.get(name)!r}, "
                f"this run's has {name}={ours.get(name)!r}"
            )
    vocab = record["vocab"]
    if vocab.get("size") != tokenizer.vocab_size:
        raise CheckpointError(
            f"{folder}: the checkpoint's vocabulary has {vocab.get('size')} entries, "
            f"this run's tokenizer {tokenizer.vocab_size} (field vocab_size)"
        )
    if vocab.get("sha256") != _tokenizer_digest(tokenizer):
        raise CheckpointError(
            f"{folder}: the checkpoint was trained with another vocabulary of the same size "
            "(field tokenizer: its tokenizer.json differs from this run's)"
        )


def _checkpoints(out: Path) -> list[tuple[int, Path]]:
    """(update, folder) of each complete checkpoint of a run, oldest first."""
    found = []
    folder = Path(out) / "checkpoints"
    for path in folder.glob("[!.]*") if folder.is_dir() else []:
        try:
            step = Progress.read(path).step
        except CheckpointError:
            continue  # not a checkpoint (or a damaged one): never resumed from
        found.append((int(step), path))
    return sorted(found)


def latest_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint folder of the run in `out`, or None."""
    found = _checkpoints(out)
    return found[-1][1] if found else None


@dataclass
class Progress:
    """Where a run stands; stored in each checkpoint as progress.json."""

    epoch: int = 0  # epochs completed
    batch: int = 0  # batches of the current epoch used
    step: int = 0  # updates made
    wall_time: float = 0.0  # seconds of earlier processes of the run
    # the current epoch's training loss, all processes, so far
    epoch_loss_sum: float = 0.0
    epoch_tokens: int = 0
    epoch_seconds: float = 0.0
    epoch_flops: float = 0.0
    processes: int = 1  # how many trained the run: a resume must run as many

    @classmethod
    def read(cls, folder: Path) -> "Progress":
        """The progress.json of a checkpoint folder."""
        path = Path(folder) / "progress.json"
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as err:
            raise CheckpointError(f"cannot read {path}: {err}") from err


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    stopped: str  # "completed", "max_steps" or "time_limit"
    step: int
    metrics: list[dict[str, Any]]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file; a last line cut short by a crash is skipped."""
    records = []
    if Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def _append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _truncate_jsonl(path: Path, step: int) -> None:
    """Keep the records up to update `step` (a resumed run rewrites the later ones)."""
    if Path(path).exists():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
        _atomic_write(path, "".join(json.dumps(r) + "\n" for r in kept).encode())


class _Log:
    """Lines to the run's train.log and, if `echo`, to the terminal (around the progress bar)."""

    def __init__(self, path: Path | None, echo: bool) -> None:
        self.file = open(path, "a") if path is not None else None
        self.echo = echo

    def __call__(self, message: str, *, echo: bool = True) -> None:
        if self.file is not None:
            self.file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")
            self.file.flush()
        if self.echo and echo:
            tqdm.write(message, file=sys.stdout)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _sync(device: torch.device) -> float:
    """The time, after the GPU has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _all_sum(values: list[float], device: torch.device) -> list[float]:
    if _world_size() == 1:
        return values
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


class Trainer:
    """One process's part of a training run; `train(config)` builds one and calls `run()`."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        resume: bool = False,
        data: TrainingData | None = None,
        echo: bool = True,
    ) -> None:
        self.config = c = config
        self.env = Distributed.from_environ()
        self.device = _device(config, self.env)
        self.start = time.perf_counter()
        self.out = out = c.output_dir
        checkpoint = latest_checkpoint(out)
        occupied = out.is_dir() and any(out.iterdir())
        # Every process looks at the folder before the first one writes into it, so that all
        # of them see the same thing, and refuse (or go on) together.
        _barrier()
        if occupied and not resume:
            raise CheckpointError(
                f"output folder {out} is not empty: pass --resume to continue the run in it, "
                "or choose another --out"
            )
        if checkpoint is not None:  # before loading any data: the cheap checks first
            check_recipe(checkpoint, config)
            resumed_at = Progress.read(checkpoint)
            processes = resumed_at.processes
            if processes != self.env.world_size:
                raise CheckpointError(
                    f"{checkpoint}: the run was trained by {processes} process(es), this "
                    f"one has {self.env.world_size}: they decide the updates, so resume "
                    f"with {processes}"
                )
        self.data = data if data is not None else load_training_data(config)
        tokenizer = self.data.tokenizer
        self.model_config = config.model_config(tokenizer.vocab_size)
        if checkpoint is not None:
            check_compatible(
                checkpoint, model_config=self.model_config, tokenizer=tokenizer
            )
        dropout = c.bpe_dropout
        self.bpe_dropout = BPEDropout(tokenizer, dropout) if dropout else None
        if self.bpe_dropout is not None:
            self.bpe_dropout.check(self.data.train)
        self._check_lengths()
        # The batches of the epoch to come, in BPE's own spelling (BPE-dropout changes
        # their number only slightly): an epoch must give at least one update.
        epoch = resumed_at.epoch if checkpoint is not None else 0
        first = token_batches(
            self.data.train.src_lengths + 1,
            self.data.train.tgt_lengths + 1,
            max_tokens=c.max_tokens,
            seed=c.seed,
            epoch=epoch,
        )
        self._updates_per_epoch(len(first))
        # With a GPU, a second process spells the next epoch while this one trains (the CPU
        # is otherwise idle); on a CPU, the training itself keeps every core busy.
        self.prefetch = self.device.type == "cuda"
        self._pool: ProcessPoolExecutor | None = None
        self._ahead: dict[int, Future] = {}

        torch.manual_seed(c.seed)
        self.model = Transformer(self.model_config).to(self.device)
        self.optimizer, self.scheduler = make_optimizer(
            self.model,
            d_model=self.model_config.d_model,
            warmup=c.warmup,
            factor=c.lr_factor,
        )
        self.criterion = LabelSmoothingLoss(
            pad_id=tokenizer.pad_id, smoothing=c.label_smoothing, reduction="sum"
        )
        self.progress = Progress()
        if self.env.is_main:
            out.mkdir(parents=True, exist_ok=True)
            (out / "checkpoints").mkdir(exist_ok=True)
            # Temporary files and folders left by a killed run (see atomic_folder).
            for stale in (out / "checkpoints").glob(".*"):
                shutil.rmtree(stale, ignore_errors=True)
            for stale in [*out.glob(".*.tmp*"), *out.glob(".*.old-*")]:
                if stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
                else:
                    stale.unlink(missing_ok=True)
        _barrier()
        if checkpoint is not None:
            self._load(checkpoint)
        elif self.env.is_main:  # records of a run that never reached a checkpoint
            for name in ("metrics.jsonl", "steps.jsonl"):
                _truncate_jsonl(out / name, 0)
        self.step_model: nn.Module = self.model
        if self.env.world_size > 1:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.step_model = DistributedDataParallel(self.model, device_ids=ids)
        if c.compile:
            self.step_model = torch.compile(self.step_model)
        self.bf16 = c.uses_bf16(self.device.type)

        self.words = count_words(tokenizer, self.data.val)
        val = iterate_batches(
            self.data.val,
            tokenizer,
            max_tokens=c.max_tokens,
            shuffle=False,
            max_len=self.model_config.max_len,
        )
        self.val_batches = list(val)[self.env.rank :: self.env.world_size]
        self.loss_acc = torch.zeros((), device=self.device, dtype=torch.float64)
        self.reserve = 0.05 * 60 * c.time_limit if c.time_limit else 0.0
        # With several processes the time check is a collective: every 10 updates then.
        self.check_every = 1 if self.env.world_size == 1 else 10
        self.check_gap = 0.0  # the longest time measured between two time checks
        if self.env.is_main:  # both written atomically: --resume reads them back
            settings = json.dumps(c.to_dict(), indent=2) + "\n"
            _atomic_write(out / "train_config.json", settings.encode())
            tokenizer.save(out / "tokenizer.json")
        # Opened last, so that a set-up error leaves no file open.
        self.log = _Log(
            out / "train.log" if self.env.is_main else None, echo and self.env.is_main
        )
        self._describe(checkpoint, resume=resume)
        self._warn_dropped(len(first))

    def _updates_per_epoch(self, batches: int) -> int:
        """The updates an epoch of `batches` batches gives; none is an error."""
        c, group = self.config, self.config.accumulation * self.env.world_size
        if batches < group:
            raise DataError(
                f"an epoch has {batches} batches, too few for one update of "
                f"accumulation {c.accumulation} × {self.env.world_size} process(es) "
                f"= {group} batches: lower --accumulation or --max-tokens"
            )
        return batches // group

    def _warn_dropped(self, batches: int) -> None:
        """Log a warning when grouping batches into updates drops over 10% of them."""
        c, group = self.config, self.config.accumulation * self.env.world_size
        dropped = batches % group
        if dropped > 0.1 * batches:
            self.log(
                f"warning: an epoch leaves out {dropped} of its {batches} batches "
                f"({dropped / batches:.0%}): an update takes accumulation "
                f"{c.accumulation} × {self.env.world_size} process(es) = {group} "
                "batches; lower --accumulation or --max-tokens"
            )

    def _check_lengths(self) -> None:
        """Refuse, before any update, a split whose longest sentence (with its <bos> or
        <eos>) fits neither a batch nor the model's positional table. With BPE-dropout, a
        training sentence counts in its longest spelling too, which a later epoch may draw."""
        c, data = self.config, self.data
        longest = {
            f"{name} sentence": int(
                max(split.src_lengths.max(), split.tgt_lengths.max())
            )
            for name, split in (("train", data.train), ("val", data.val))
        }
        if self.bpe_dropout is not None:
            sides = BPE_DROPOUT_SIDES[c.bpe_dropout_sides]
            longest[
                "train sentence as BPE-dropout may spell it, one token a character"
            ] = self.bpe_dropout.longest_spelling(data.train, sides)
        for what, tokens in longest.items():
            tokens += 1  # <bos> or <eos>
            if tokens > c.max_tokens:
                raise DataError(
                    f"max_tokens={c.max_tokens} cannot hold the longest {what} "
                    f"({tokens} tokens): raise --max-tokens"
                )
            if tokens > self.model_config.max_len:
                raise DataError(
                    f"the model's max_len={self.model_config.max_len} cannot place the "
                    f"longest {what} ({tokens} tokens): raise --set max_len"
                )

    def _describe(self, checkpoint: Path | None, *, resume: bool) -> None:
        c, n = self.config, sum(p.numel() for p in self.model.parameters())
        if checkpoint is not None:
            where = f"resuming from {checkpoint}"
        elif (
            resume
        ):  # the same command repeated across stops starts the run the first time
            where = f"nothing to resume in {self.out}: starting a new run"
        else:
            where = "starting"
        self.log(
            f"{where}: {c.pair}, model {c.model} {c.model_overrides or ''} "
            f"({n:,} parameters), {self.env.world_size} process(es) on {self.device}, "
            f"bf16 {self.bf16}, compile {c.compile}"
        )
        self.log(f"config: {json.dumps(c.to_dict())}", echo=False)

    def _load(self, folder: Path) -> None:
        load_weights(self.model, folder / "model.safetensors")
        state = load_state(folder, "trainer")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.progress = Progress.read(folder)
        if self.env.is_main:
            for name in ("metrics.jsonl", "steps.jsonl"):
                _truncate_jsonl(self.out / name, self.progress.step)

    # -- the epochs ---------------------------------------------------------------------------

    def run(self) -> TrainResult:
        c, p = self.config, self.progress
        stopped, trained = "completed", False
        try:
            while p.epoch < c.epochs:
                if c.max_steps is not None and p.step >= c.max_steps:
                    stopped = "max_steps"
                    break
                reason, updates = self._train_epoch()
                trained = trained or updates > 0
                if reason is not None:
                    if updates > 0:
                        self._end_period(kind="partial")
                    stopped = reason
                    break
                self._end_period(kind="epoch")
            if stopped != "time_limit" and (
                trained or not (self.out / "average").exists()
            ):
                self._average()
        finally:
            self.log.close()
            if self._pool is not None:
                self._pool.shutdown(cancel_futures=True)
        metrics = read_jsonl(self.out / "metrics.jsonl")
        return TrainResult(self.out, stopped, p.step, metrics)

    def _epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The batches of an epoch, over the training split as that epoch spells it."""
        c, train = self.config, self.data.train
        if self.bpe_dropout is not None:  # a function of (seed, epoch), so resumable
            ahead = self._ahead.pop(epoch, None)
            resample = functools.partial(
                self.bpe_dropout.resample,
                seed=c.seed,
                sides=BPE_DROPOUT_SIDES[c.bpe_dropout_sides],
            )
            if ahead is not None:
                train = ahead.result()
            else:
                train = resample(self.data.train, epoch=epoch)
            if self.prefetch and epoch + 1 < c.epochs:
                if self._pool is None:
                    spawn = multiprocessing.get_context("spawn")
                    self._pool = ProcessPoolExecutor(1, mp_context=spawn)
                self._ahead[epoch + 1] = self._pool.submit(
                    resample, self.data.train, epoch=epoch + 1
                )
        self.train = train
        self.src_lengths = train.src_lengths + 1  # + <eos>
        self.tgt_lengths = train.tgt_lengths + 1  # + <bos> (input) or <eos> (output)
        self.pair_flops = training_flops(
            self.model, src_lengths=self.src_lengths, tgt_lengths=self.tgt_lengths
        )
        return token_batches(
            self.src_lengths,
            self.tgt_lengths,
            max_tokens=c.max_tokens,
            seed=c.seed,
            epoch=epoch,
        )

    def _time_is_up(self) -> bool:
        """Whether to stop now, to validate and save before the time limit."""
        limit = self.config.time_limit
        if limit is None:
            return False
        # The run goes on until the next check before it validates and saves: the
        # longest time seen between two checks (one update, or ten with several
        # processes) is reserved besides the time of validating and saving.
        reserve = self.reserve + self.check_gap
        late = time.perf_counter() - self.start > 60 * limit - reserve
        if (
            self.env.world_size > 1
        ):  # processes must stop at the same update: ask the first
            flag = torch.tensor([float(late)], device=self.device)
            dist.broadcast(flag, src=0)
            late = bool(flag.item())
        return late

    def _train_epoch(self) -> tuple[str | None, int]:
        """Updates until the epoch ends (None) or the run must stop (the reason)."""
        c, p, env, tok = self.config, self.progress, self.env, self.data.tokenizer
        batches = self._epoch_batches(p.epoch)
        group = c.accumulation * env.world_size
        total_updates = self._updates_per_epoch(len(batches))
        self.model.train()
        bar = tqdm(
            total=total_updates,
            initial=min(p.batch // group, total_updates),
            desc=f"epoch {p.epoch + 1}/{c.epochs}",
            unit="update",
            disable=None if env.is_main else True,  # None: off when not a terminal
            dynamic_ncols=True,
        )
        start, updates, reason = _sync(self.device), 0, None
        window_start, window_tokens = start, 0
        window_loss = torch.zeros((), device=self.device, dtype=torch.float64)
        checked = None  # when the time was last checked
        while p.batch + group <= len(batches):
            if c.max_steps is not None and p.step >= c.max_steps:
                reason = "max_steps"
                break
            if updates % self.check_every == 0:
                now = time.perf_counter()
                if checked is not None:
                    self.check_gap = max(self.check_gap, now - checked)
                checked = now
                if self._time_is_up():
                    reason = "time_limit"
                    break
            update = batches[p.batch : p.batch + group]
            mine = [
                collate(
                    [self.train[i] for i in index],
                    pad_id=tok.pad_id,
                    bos_id=tok.bos_id,
                    eos_id=tok.eos_id,
                    index=index,
                    max_len=self.model_config.max_len,
                )
                for index in update[env.rank :: env.world_size]
            ]
            every = np.concatenate(update)
            tokens = int(self.tgt_lengths[every].sum())
            _seed_update(c.seed, p.step, env.rank)
            loss = train_step(
                self.step_model,
                mine,
                criterion=self.criterion,
                optimizer=self.optimizer,
                scheduler=self.scheduler,
                tokens=tokens,
                bf16=self.bf16,
            )
            p.step += 1
            p.batch += group
            p.epoch_tokens += tokens
            p.epoch_flops += float(self.pair_flops[every].sum())
            self.loss_acc += loss
            window_loss += loss
            window_tokens += tokens
            updates += 1
            bar.update(1)
            if p.step % c.log_every == 0:
                now = time.perf_counter()
                mean = _all_sum([window_loss.item()], self.device)[0] / window_tokens
                record = {
                    "step": p.step,
                    "epoch": round(p.epoch + p.batch / len(batches), 4),
                    "train_loss": mean,
                    "lr": noam_lr(
                        p.step,
                        d_model=self.model_config.d_model,
                        warmup=c.warmup,
                        factor=c.lr_factor,
                    ),
                    "tokens_per_s": window_tokens / (now - window_start),
                    "wall_time": p.wall_time + now - self.start,
                }
                bar.set_postfix(
                    loss=f"{mean:.3f}",
                    tok_s=f"{record['tokens_per_s']:,.0f}",
                    lr=f"{record['lr']:.2e}",
                )
                if env.is_main:
                    _append_jsonl(self.out / "steps.jsonl", record)
                window_start, window_tokens = now, 0
                window_loss.zero_()
        bar.close()
        p.epoch_seconds += _sync(self.device) - start
        self.fraction = p.batch / len(batches)
        return reason, updates

    def _end_period(self, *, kind: str) -> None:
        """Validate, record the metrics, and write a checkpoint (the end of an epoch, or a stop)."""
        c, p, d = self.config, self.progress, self.model_config
        started = time.perf_counter()
        p.epoch_loss_sum += _all_sum([self.loss_acc.item()], self.device)[0]
        self.loss_acc.zero_()
        validation = self._validate(self.model)
        if kind == "epoch":
            p.epoch += 1
            epoch = float(p.epoch)
        else:
            epoch = round(p.epoch + self.fraction, 4)
        seconds = max(p.epoch_seconds, 1e-9)
        record = {
            "kind": kind,
            "epoch": epoch,
            "step": p.step,
            "train_loss": p.epoch_loss_sum / max(p.epoch_tokens, 1),
            **validation.metrics(),
            "train_tokens": p.epoch_tokens,
            "tokens_per_s": p.epoch_tokens / seconds,
            "lr": noam_lr(
                p.step, d_model=d.d_model, warmup=c.warmup, factor=c.lr_factor
            ),
            "wall_time": p.wall_time + time.perf_counter() - self.start,
            "mfu": (
                p.epoch_flops / seconds / (c.peak_flops * self.env.world_size)
                if self.device.type == "cuda"
                else None
            ),
        }
        self.log(_epoch_line(record, c.epochs))
        if kind == "epoch":  # the next epoch starts from zero
            p.batch, p.epoch_loss_sum, p.epoch_tokens = 0, 0.0, 0
            p.epoch_seconds, p.epoch_flops = 0.0, 0.0
        if self.env.is_main:
            # The record first: a resumed run drops records newer than its checkpoint.
            _append_jsonl(self.out / "metrics.jsonl", record)
            name = f"epoch-{p.epoch:03d}" if kind == "epoch" else f"step-{p.step:07d}"
            self._save(self.out / "checkpoints" / name)
        _barrier()
        self.reserve = 1.5 * (time.perf_counter() - started)

    def _validate(self, model: nn.Module) -> Validation:
        return evaluate(
            model,
            self.val_batches,
            pad_id=self.data.tokenizer.pad_id,
            smoothing=self.config.label_smoothing,
            words=self.words,
            bf16=self.bf16,
        )

    def _save(self, folder: Path) -> None:
        p = self.progress
        saved = dataclasses.replace(
            p,
            wall_time=p.wall_time + time.perf_counter() - self.start,
            processes=self.env.world_size,
        )
        record = run_record(self.config, self.model_config, self.data.tokenizer)
        with atomic_folder(folder) as tmp:
            save_weights(self.model, tmp / "model.safetensors")
            state = {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            }
            save_state(tmp, "trainer", state)
            (tmp / "config.json").write_text(json.dumps(record, indent=2) + "\n")
            self.data.tokenizer.save(tmp / "tokenizer.json")
            # Written last: a folder with progress.json is a complete checkpoint.
            (tmp / "progress.json").write_text(
                json.dumps(asdict(saved), indent=2) + "\n"
            )
        self._prune()

    def _prune(self) -> None:
        """Keep the newest checkpoint whole, and the weights of the last `average_last` epochs."""
        found = _checkpoints(self.out)
        newest = found[-1][1]
        epochs = [path for _, path in found if path.name.startswith("epoch-")]
        keep = set(epochs[-max(self.config.average_last, 1) :]) | {newest}
        for _, path in found:
            if path not in keep:
                shutil.rmtree(path)
            elif path != newest:
                for name in ("trainer.safetensors", "trainer.json"):
                    (path / name).unlink(missing_ok=True)

    def _average(self) -> None:
        """Average the last `average_last` epoch checkpoints into out/average and validate it."""
        c, p = self.config, self.progress
        epochs = [
            path for _, path in _checkpoints(self.out) if path.name.startswith("epoch-")
        ]
        chosen = epochs[-c.average_last :] if c.average_last >= 2 else []
        if len(chosen) < 2:
            return
        averaged = Transformer(self.model_config).to(self.device)
        load_tensors_into(averaged, average_checkpoints(chosen), "averaged checkpoints")
        validation = self._validate(averaged)
        names = [path.name for path in chosen]
        record = {
            "kind": "average",
            "epoch": float(p.epoch),
            "step": p.step,
            "averaged": names,
            **validation.metrics(),
            "wall_time": p.wall_time + time.perf_counter() - self.start,
        }
        self.log(f"average of {', '.join(names)}: " + _metrics_text(record))
        if self.env.is_main:
            _append_jsonl(self.out / "metrics.jsonl", record)
            run = run_record(c, self.model_config, self.data.tokenizer) | {
                "averaged": names
            }
            with atomic_folder(self.out / "average") as tmp:
                save_weights(averaged, tmp / "model.safetensors")
                (tmp / "config.json").write_text(json.dumps(run, indent=2) + "\n")
                self.data.tokenizer.save(tmp / "tokenizer.json")
        _barrier()


def _metrics_text(r: dict[str, Any]) -> str:
    return (
        f"val loss {r['val_loss']:.3f}, ppl/word {r['val_ppl_word']:.2f}, "
        f"ppl/token {r['val_ppl_token']:.2f}, accuracy {r['val_accuracy']:.1%}"
    )


def _epoch_line(r: dict[str, Any], epochs: int) -> str:
    mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
    return (
        f"epoch {r['epoch']:g}/{epochs} step {r['step']:,}: train loss {r['train_loss']:.3f}, "
        + _metrics_text(r)
        + f", {r['tokens_per_s']:,.0f} tok/s{mfu}, lr {r['lr']:.2e}"
    )


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    data: TrainingData | None = None,
    echo: bool = True,
) -> TrainResult:
    """Train as `config` says, in one process or, under torchrun, in several.

    With `resume`, continue the run in the output folder from its latest checkpoint. `data`
    replaces the Multi30k cache (tests); `echo=False` writes the log to train.log only.
    """
    env = Distributed.from_environ()
    owns_group = env.world_size > 1 and not dist.is_initialized()
    if owns_group:
        device = _device(config, env)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    try:
        return Trainer(config, resume=resume, data=data, echo=echo).run()
    finally:
        if owns_group:
            dist.destroy_process_group()


# %% [markdown]
# ## Training on Multi30k
#
# The paper's recipe was made for 4.5 million sentence pairs and eight GPUs. For Multi30k's
# 29,000 the book changes the following, and keeps everything else (post-norm layers,
# sinusoidal positions, one embedding table shared by source, target and the pre-softmax
# projection, label smoothing 0.1, Adam with $\beta_2 = 0.98$ and the
# warm-up/inverse-square-root schedule):
#
# | | the paper (base) | the book's Multi30k recipe | why |
# | --- | --- | --- | --- |
# | layers, $d_{model}$, $d_{ff}$, $h$ | 6 + 6, 512, 2048, 8 | 3 + 3, 256, 512, 8 | 6.0M parameters instead of 48M with our 8,000-entry vocabulary: small data favours small models; the paper's base model, trained on the same data and batches, learned far more slowly, and with dropout 0.3 it diverged; 4 + 4 layers and $d_{ff} = 1024$ did no better (the comparison runs below; in the pre-norm order, four layers learn as fast as three and end 1% above the shipped GPU run, 2.5% below the recipe with another seed on the CPU: within chance of both) |
# | dropout | 0.1 | 0.3 | with 0.1 the validation perplexity turns up after epoch 16 while the training loss keeps falling; 0.2 and 0.3 both end lower, within chance of each other (one seed each), and 0.4 far higher; 0.3 is also the paper's value for its big English–German model |
# | tokens per batch and side | about 25,000 | at most 3,000, padding included | one epoch is about 420,000 tokens per side: at the paper's size it would be about 20 updates (21 with padding, the throughput table); at ours it is about 160. Half as many tokens, and twice the updates, learned faster at first and ended level with the shipped run, within chance; twice as many ended far higher after 35 epochs (the section "How many tokens per batch") |
# | warm-up | 4,000 updates | 800 updates | 4,000 would warm up for 25 epochs; 800 is about five |
# | learning-rate factor | 1 | 0.7 | a peak of $0.7 \cdot 256^{-0.5} \cdot 800^{-0.5} = 1.5 \cdot 10^{-3}$, against the paper's $7 \cdot 10^{-4}$ for batches eight times larger |
# | length of training | 100,000 updates | 35 epochs, about 5,600 updates | the validation perplexity of dropout 0.3 is still falling at epoch 35; runs of 110 epochs show it turning up after epoch 42 (French→English) and 57 (German→English), below; 35 epochs fit the time a comparison run had on the GPU. On the CPU, the recipe with seed 1 continued to 60 epochs averaged 2.8% lower than after 35, a little less than a second seed moved it (the section "A longer run with its own average"); on the GPU that is untried |
# | checkpoint averaging | last 5, written 10 minutes apart | last 5 epochs | the same idea, counted in epochs |
# | arithmetic on a GPU | (not stated) | float32 | a model this small is limited by the launching of its many small kernels, not by arithmetic: on an H100 it trains faster in float32 than under bfloat16 autocast, which adds conversions (the throughput table below) |
#
# The evidence for these choices is a set of runs trained on one NVIDIA H100 with
# `tools/gpu_sweep.py` (several runs at a time, each in its own process), and 28 runs on the
# project's 2-core CPU; the section "The comparison runs" compares them all with the recipe.
# `multi30k_recipe` is the recipe as a `TrainConfig`, and
# `python -m transformer train --pair de-en --config multi30k` trains with it.


# %%
#| export
def multi30k_recipe(pair: str, **overrides: Any) -> TrainConfig:
    """The recipe of the book's Multi30k models (the table above) as a TrainConfig."""
    fields = dict(
        pair=pair,
        model="small",
        model_overrides=dict(n_layers=3, d_model=256, n_heads=8, d_ff=512, dropout=0.3),
        epochs=35,
        max_tokens=3_000,
        warmup=800,
        lr_factor=0.7,
        average_last=5,
        bf16=False,
    )
    return TrainConfig(**(fields | overrides))


RECIPES = {"multi30k": multi30k_recipe, "quick": quick_config}

# %% [markdown]
# The recipe's model, and its peak learning rate, at the end of the warm-up:

# %%
from transformer.train import multi30k_recipe

recipe = multi30k_recipe("de-en")
recipe_model = Transformer(recipe.model_config(8000))
n_params = sum(p.numel() for p in recipe_model.parameters())
peak_lr = noam_lr(
    recipe.warmup,
    d_model=recipe_model.config.d_model,
    warmup=recipe.warmup,
    factor=recipe.lr_factor,
)
assert n_params == 6_001_664 and abs(peak_lr - 1.547e-3) < 1e-6
print(
    f"{n_params:,} parameters, peak learning rate {peak_lr:.2e} at update {recipe.warmup}"
)

# %% [markdown]
# On a machine without a GPU (or with `TRANSFORMER_QUICK=1` in the environment) the next cells
# run in **quick mode**: a tiny model, two layers of width 64, trained on German→English for 60
# updates of at most 1,500 tokens per side, about a fifth of one epoch. That is enough to see
# the loop working, not to translate: the model is a stand-in for the real one. On a GPU the same
# cell trains with the recipe above. The run goes into a temporary folder.

# %%
from transformer.train import quick_mode, train

if quick_mode():
    print(
        "QUICK MODE (no GPU, or TRANSFORMER_QUICK=1): a tiny model trained for 60 updates,"
    )
    print("to show the loop at work; it is not the book's trained model")
    config = quick_config("de-en", out_dir=tempfile.mkdtemp(prefix="quick-"))
else:
    config = multi30k_recipe("de-en", out_dir=tempfile.mkdtemp(prefix="de-en-"))
config

# %% tags=["nbval-ignore-output"]
result = train(config)
print(f"stopped: {result.stopped} after {result.step} updates")

# %% [markdown]
# The run's folder holds its log, its metrics and its checkpoint:

# %%
run = Path(config.out_dir)
assert result.step == 60 or not quick_mode()
for path in sorted(run.rglob("*")):
    if path.is_file():
        print(path.relative_to(run))

# %% [markdown]
# The training loss every `log_every` updates (from `steps.jsonl`; five in quick mode, 50 with the
# recipe) falls from about that of a uniform guess over the 8,000 tokens as the model learns the
# most frequent tokens first; the validation loss (from `metrics.jsonl`) is measured on the whole
# validation split without dropout after each epoch, and at the end of a run that stops inside one,
# as the quick run does: its one point is at the end.

# %% tags=["nbval-ignore-output"]
from transformer.train import read_jsonl

steps = pd.DataFrame(read_jsonl(run / "steps.jsonl"))
metrics = pd.DataFrame(read_jsonl(run / "metrics.jsonl"))
curve = pd.concat(
    [
        steps[["step", "train_loss"]]
        .rename(columns={"train_loss": "loss"})
        .assign(split="training (label-smoothed)"),
        metrics[["step", "val_loss"]]
        .rename(columns={"val_loss": "loss"})
        .assign(split="validation (label-smoothed)"),
    ]
).round(4)
alt.Chart(curve).mark_line(point=True).encode(
    x=alt.X("step:Q", title="update"),
    y=alt.Y("loss:Q", title="loss per token (nats)"),
    color=alt.Color("split:N", title=None),
    tooltip=["split", "step", "loss"],
).properties(
    title=(
        f"Quick mode: a tiny model, {result.step} updates on {config.pair}"
        if quick_mode()
        else f"{config.pair}: training and validation loss"
    ),
    width=420,
    height=220,
)

# %% tags=["nbval-ignore-output"]
last = metrics.iloc[-1]
assert steps["train_loss"].iloc[-1] < steps["train_loss"].iloc[0] - 2.0
uniform_guess = math.log(8000) - smoothed_target_entropy(0.1, 8000)
assert last["val_loss"] < uniform_guess - 2
print(f"uniform guess {uniform_guess:.2f}")
print(
    f"validation after {int(last['step'])} updates: "
    + ", ".join(
        f"{k} {last[k]:.3f}" for k in ("val_loss", "val_ppl_word", "val_accuracy")
    )
)

# %% [markdown]
# ## Exporting and loading a model
#
# A trained run is exported into a small folder that the repository ships and that
# `load_model` reads:
#
# | file | holds |
# | --- | --- |
# | `model-00001.safetensors`, … | the weights in float16 (or bfloat16), at most 16 MB per file |
# | `config.json` | the model's config, the training config, the vocabulary's fingerprint, and which weight is in which file |
# | `tokenizer.json` | the tokenizer |
# | `metrics.jsonl` | the run's metrics |
#
# Half-precision weights halve the size; the model computes in float32 after loading, and the
# rounding of the weights to 11 significant bits (float16) changes its log-probabilities only
# slightly, as the next cell measures. The export takes the run's average when it is
# current, that is when it ends with the run's newest epoch checkpoint (a run continued
# after it averaged may have trained past its average), and its latest checkpoint
# otherwise. The export replaces its destination as a whole, so it refuses one that
# holds anything but the files of an earlier export, and one that is, or holds, the
# run it exports.

# %%
#| export
import re

MAX_FILE_BYTES = 16 * 2**20
_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _model_source(source: Path) -> Path:
    """The folder of weights a run or checkpoint path stands for: the run's average when
    it is current, else its newest checkpoint."""
    if (source / "model.safetensors").is_file():
        return source
    found = [path for _, path in _checkpoints(source)]
    average = source / "average"
    if (average / "model.safetensors").is_file():
        # A run continued after it averaged (killed, stopped by its time limit, or
        # with average_last below 2) has trained past its average: the average is
        # current only while it ends with the newest epoch checkpoint. A `partial`
        # checkpoint after that one is left out, as the average of a run stopped by
        # its time limit leaves it out.
        epochs = [path.name for path in found if path.name.startswith("epoch-")]
        averaged = read_record(average).get("averaged") or [None]
        if not epochs or averaged[-1] == epochs[-1]:
            return average
    if not found:
        raise CheckpointError(
            f"{source} holds no trained model (no checkpoint, no average)"
        )
    return found[-1]


# What an export writes: a destination that holds anything else is not replaced.
_EXPORT_FILES = ("config.json", "tokenizer.json", "metrics.jsonl")


def _check_export_destination(dest: Path, source: Path) -> None:
    """Refuse a destination that `export_model` would replace with loss: one that is, or
    holds, the source, or holds anything but an earlier export's files."""
    dest, source = Path(dest), Path(source)
    if dest.resolve() == source.resolve() or source.resolve().is_relative_to(
        dest.resolve()
    ):
        raise CheckpointError(
            f"cannot export into {dest}: it holds the source {source}, which the "
            "export would replace; choose a new or empty folder"
        )
    if not dest.exists():
        return
    if not dest.is_dir():
        raise CheckpointError(f"cannot export into {dest}: it is not a folder")
    others = sorted(
        p.name
        for p in dest.iterdir()
        if not (
            (
                p.name in _EXPORT_FILES
                or re.fullmatch(r"model-\d{5}\.safetensors", p.name)
            )
            and p.is_file()
        )
    )
    if not others and (dest / "config.json").is_file():
        try:
            shipped = json.loads((dest / "config.json").read_text()).get("format")
        except (OSError, ValueError, AttributeError):
            shipped = None
        if shipped != SHIPPED_FORMAT:
            others = ["a config.json that is not a shipped model's"]
    if others:
        raise CheckpointError(
            f"cannot export into {dest}: it holds {', '.join(others[:3])}"
            f"{' and more' if len(others) > 3 else ''}, which an export does not "
            "write and would delete; choose a new or empty folder"
        )


def export_model(
    source: str | Path,
    dest: str | Path,
    *,
    dtype: str = "float16",
    max_file_bytes: int = MAX_FILE_BYTES,
) -> Path:
    """Write the shipped form of a trained model: 16-bit safetensors files of at most
    `max_file_bytes`, config.json, tokenizer.json and the run's metrics.jsonl.

    `source` is a run folder (its average when current, else its latest checkpoint) or a
    checkpoint folder. `dest` must be new, empty or an earlier export (CheckpointError).
    """
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    _check_export_destination(Path(dest), Path(source))
    folder = _model_source(Path(source))
    record = read_record(folder)
    tensors = read_tensors(folder / "model.safetensors")
    files: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        half = tensor.to(_DTYPES[dtype]).contiguous()
        if not torch.isfinite(half).all():
            raise ValueError(f"weight {name} does not fit in {dtype}: try bfloat16")
        nbytes = half.numel() * half.element_size()
        if nbytes > max_file_bytes - 65_536:  # leave room for the file's JSON header
            raise ValueError(
                f"weight {name} alone needs {nbytes:,} bytes, over the limit"
            )
        if size + nbytes > max_file_bytes - 65_536:
            files.append({})
            size = 0
        files[-1][name] = half
        size += nbytes
    weight_map = {}
    dest = Path(dest)
    metrics = next(
        (
            p
            for p in (
                folder.parent / "metrics.jsonl",
                folder.parent.parent / "metrics.jsonl",
            )
            if p.is_file()
        ),
        None,
    )
    with atomic_folder(dest) as tmp:
        for k, part in enumerate(files, start=1):
            file = f"model-{k:05d}.safetensors"
            safetensors.torch.save_file(
                part, tmp / file, metadata={"format": SHIPPED_FORMAT}
            )
            weight_map |= dict.fromkeys(part, file)
        shipped = record | {
            "format": SHIPPED_FORMAT,
            "dtype": dtype,
            "weight_map": weight_map,
            "source": folder.name,
        }
        (tmp / "config.json").write_text(json.dumps(shipped, indent=2) + "\n")
        shutil.copy(folder / "tokenizer.json", tmp / "tokenizer.json")
        if metrics is not None:
            shutil.copy(metrics, tmp / "metrics.jsonl")
    return dest


def load_model(
    folder: str | Path, *, device: str | torch.device = "cpu"
) -> tuple[Transformer, Tokenizer]:
    """The model (float32, eval mode) and tokenizer of a shipped folder or a checkpoint."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"no model folder {folder}")
    record = read_record(folder)
    try:
        model_config = TransformerConfig.from_dict(record["model"])
    except (ValueError, TypeError) as err:
        raise CheckpointError(
            f"{folder / 'config.json'}: bad model config: {err}"
        ) from err
    if not (folder / "tokenizer.json").is_file():
        raise CheckpointError(f"{folder}: no tokenizer.json")
    try:
        tokenizer = Tokenizer.load(folder / "tokenizer.json")
    except DataError as err:
        raise CheckpointError(str(err)) from err
    if tokenizer.vocab_size != model_config.src_vocab_size:
        raise CheckpointError(
            f"{folder}: tokenizer.json has {tokenizer.vocab_size} entries, the model's "
            f"src_vocab_size is {model_config.src_vocab_size} (field vocab_size)"
        )
    if record["vocab"].get("sha256") != _tokenizer_digest(tokenizer):
        raise CheckpointError(
            f"{folder}: tokenizer.json is not the vocabulary the model was trained with "
            "(field tokenizer)"
        )
    if record.get("format") == SHIPPED_FORMAT:
        files = sorted(set(record.get("weight_map", {}).values()))
    else:
        files = ["model.safetensors"]
    tensors: dict[str, Tensor] = {}
    for file in files:
        tensors |= read_tensors(folder / file)
    model = Transformer(model_config)
    load_tensors_into(model, tensors, folder)
    return model.to(device).eval(), tokenizer


# %% [markdown]
# Exporting the run's newest checkpoint and loading it back gives a model whose
# log-probabilities match the checkpoint's within the rounding of float16 weights. (Given the
# run's folder, `export_model` takes the average of its last epochs when the run made one, as the
# recipe does; the quick run stops before it has a single epoch to average.)

# %%
from transformer.train import export_model, latest_checkpoint, load_model

newest = latest_checkpoint(run)
shipped = export_model(newest, Path(tempfile.mkdtemp()) / "de-en")
print(sorted(p.name for p in shipped.iterdir()))
loaded, tokenizer = load_model(shipped)
trained, _ = load_model(newest)  # the float32 checkpoint
src = torch.tensor([tokenizer.encode("Ein Mann fährt Fahrrad .") + [tokenizer.eos_id]])
tgt = torch.tensor(
    [[tokenizer.bos_id] + tokenizer.encode("A man rides a bike .", "en")]
)
with torch.no_grad():
    masks = dict(
        src_mask=padding_mask(src, tokenizer.pad_id),
        tgt_mask=target_mask(tgt, tokenizer.pad_id),
    )
    gap = (loaded(src, tgt, **masks) - trained(src, tgt, **masks)).abs().max().item()
assert 0 < gap < 1e-2
print("float16 weights: log-probabilities within 1e-2 of the float32 model's")

# %% [markdown]
# ## The book's models
#
# The repository ships two models trained with `multi30k_recipe`, German→English in
# `checkpoints/de-en` and French→English in `checkpoints/fr-en`, each with a model card
# (`README.md`) that gives the exact command; the next chapters use them. They were trained on
# one NVIDIA H100 80GB HBM3 (PyTorch 2.11, CUDA 13), each in about seven minutes while seven
# other runs of the same sweep shared the GPU, with `python tools/gpu_sweep.py long`. The
# targets that the project set for them, on the validation split and per word, are a perplexity
# of at most 6 with a token accuracy of at least 70% for German→English, and at most 4 with at
# least 78% for French→English (for comparison, the project's brief quotes a published notebook
# implementation of this task at 13.4 and 62.0%, and 7.0 and 74.3%).
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
# ### Which words
#
# A figure per word depends on what counts as a word, and so does an accuracy. The training loop
# divides the total NLL by the whitespace-separated words of the references and counts `<eos>` in
# the loss but not as a word (the section "What validation measures"), and it counts its accuracy
# over its own BPE tokens. Word-level implementations, such as the published notebook above, predict
# spaCy's tokens, punctuation marks included, and then `<eos>`; they report the perplexity per
# predicted token (more units for the same sentences, so a lower figure for the same predictions)
# and the share of those tokens predicted right.
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
from transformer.data import normalize, pretokenize


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
from transformer.train import load_model, word_level_evaluation

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
# ### Where the loss goes
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
# ### Two runs together
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
# ### Is it the label smoothing?
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
# ### How fast
#
# The model is small for an H100: each update launches many small kernels, and the GPU probably
# waits for Python more than it computes (we did not profile it). `tools/gpu_bench.py` measured the
# training loop alone on the GPU, two epochs of German→English per variant, the second one timed
# (one timing each, not a median; the repeated row shows the noise), with the recipe's model at
# dropout 0.2, its dropout when this was measured: target tokens per second (padding excluded) and
# MFU, the formula of the section "Counting the work" over the epoch's time and the card's measured
# bf16 rate of 790 TFLOP/s. The paper's base model on the paper's batches of 25,000 tokens shows
# what the same loop does with enough work per kernel, and what bfloat16 autocast buys then. Every
# row's MFU is against the bf16 rate, the float32 rows included: it says how much of the card's best
# the run uses. (The shipped runs, sharing the GPU with seven others, record 0.2% MFU in their
# metrics. These MFUs were measured before the count charged the cross-attention's key and value
# projections to the source positions, as it now does; over Multi30k's training pairs that adds
# 0.17% to the count for German→English and 0.55% for French→English, less than the noise between
# two timings.)

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
# ## The command line
#
# `python -m transformer train` runs `train` from a terminal, or under `torchrun` on several GPUs.
# Its options set the fields of `TrainConfig`; `--config` takes a recipe (`multi30k`, the book's
# models; `quick`, the tiny stand-in), a model preset or a JSON file holding a `TrainConfig`, and
# `--set FIELD=VALUE` overrides a field of the model. With `--resume` the options not given are
# taken from the run being resumed; those that decide the updates themselves must not change (a
# clear error says which one did), while `--epochs`, `--time-limit` and `--max-steps` may, so that a
# finished run can be continued for more epochs. Where `--out` holds no run yet, `--resume` starts
# one, and its first log line says so: the same command can then be repeated across stops (a machine
# lent for a while, a time limit). `--export DIR` writes the shipped folder when training ends.
#
# Mistakes end with exit status 2 and one line on the standard error, without a traceback: an
# unknown pair, a missing data file (or a missing cache on a machine without spaCy), an output
# folder that holds another run, or a checkpoint whose model or vocabulary does not match. At the
# end the command prints a summary table of the epochs; the full log is in the output folder's
# `train.log`.

# %%
#| export
import argparse

# the command-line conventions shared by every command: one line, status 2
from transformer.data import _Parser, _UsageError

PROG = "python -m transformer train"


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Train a translation model on Multi30k.")
    p.add_argument("--pair", required=True, help="de-en or fr-en")
    p.add_argument(
        "--config",
        default=None,
        help=f"a recipe ({', '.join(RECIPES)}), a model preset ({', '.join(MODEL_PRESETS)}; "
        "default small) or a TrainConfig JSON",
    )
    p.add_argument("--out", default=None, help="output folder (default runs/<pair>)")
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out (where there is none yet, start it)",
    )
    p.add_argument("--epochs", type=int)
    p.add_argument("--max-steps", type=int)
    p.add_argument("--max-tokens", type=int, help="padded tokens per batch and side")
    p.add_argument("--accumulation", type=int, help="batches per process and update")
    p.add_argument("--warmup", type=int)
    p.add_argument("--lr-factor", type=float)
    p.add_argument("--dropout", type=float)
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--bpe-dropout", type=float, help="in [0, 1); default 0: off")
    p.add_argument("--bpe-dropout-sides", choices=list(BPE_DROPOUT_SIDES))
    p.add_argument("--seed", type=int)
    p.add_argument("--time-limit", type=float, help="minutes")
    p.add_argument("--average-last", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--cache-dir")
    p.add_argument("--data-dir")
    p.add_argument("--device")
    p.add_argument("--log-every", type=int)
    p.add_argument("--compile", action="store_true", default=None)
    p.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of the model config, e.g. --set d_model=128",
    )
    p.add_argument(
        "--quick", action="store_true", help="a tiny model for a few updates"
    )
    p.add_argument(
        "--export",
        default=None,
        metavar="DIR",
        help="write the shipped model folder when training ends (a new or empty "
        "folder, or an earlier export)",
    )
    return p


# Options that set the TrainConfig field of the same name.
_FIELD_OPTIONS = (
    "epochs",
    "max_steps",
    "max_tokens",
    "accumulation",
    "warmup",
    "lr_factor",
    "label_smoothing",
    "bpe_dropout",
    "bpe_dropout_sides",
    "seed",
    "time_limit",
    "average_last",
    "vocab_size",
    "cache_dir",
    "data_dir",
    "device",
    "log_every",
    "compile",
    "bf16",
)


def _parse_value(text: str) -> Any:
    """A --set value: a JSON number, string or boolean; True and False also as in Python."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except ValueError:
        return text


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    """The TrainConfig that command-line arguments ask for (on resume, over the stored one)."""
    out = args.out if args.out is not None else f"runs/{args.pair}"
    stored_path = Path(out) / "train_config.json"
    fields: dict[str, Any] = {}
    if args.resume and stored_path.is_file():
        try:
            fields = json.loads(stored_path.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"cannot read {stored_path}: {err}") from err
        if not isinstance(fields, dict):
            raise ValueError(f"{stored_path} does not hold a JSON object")
    elif args.quick:
        fields = quick_config(args.pair).to_dict()
    if args.config is not None:
        if args.config.endswith(".json"):
            try:
                given = json.loads(Path(args.config).read_text())
            except (OSError, ValueError) as err:
                raise ValueError(f"cannot read --config {args.config}: {err}") from err
            if not isinstance(given, dict):
                raise ValueError(
                    f"--config {args.config} must hold a JSON object of TrainConfig "
                    f"fields, not a {type(given).__name__}"
                )
            fields |= given
        elif args.config in RECIPES:  # on resume, the stored run must agree with it
            fields |= RECIPES[args.config](args.pair).to_dict()
        else:
            fields["model"] = args.config
    fields |= {"pair": args.pair, "out_dir": out}
    for name in _FIELD_OPTIONS:
        if getattr(args, name) is not None:
            fields[name] = getattr(args, name)
    overrides = fields.get("model_overrides", {})
    if not isinstance(overrides, dict):
        raise ValueError(
            "model_overrides must be a JSON object of TransformerConfig fields, "
            f"got {overrides!r}"
        )
    overrides = dict(overrides)
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set takes FIELD=VALUE, got {item!r}")
        overrides[key.strip()] = _parse_value(value)
    fields["model_overrides"] = overrides
    return TrainConfig.from_dict(fields)


def summary_table(records: list[dict[str, Any]]) -> str:
    """The epochs of a run (and its average) as a small text table."""
    head = (
        f"{'epoch':>7} {'step':>8} {'train loss':>10} {'val loss':>8} {'ppl/word':>8} "
        f"{'accuracy':>8} {'tok/s':>9} {'MFU':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        epoch = "average" if r["kind"] == "average" else f"{r['epoch']:g}"
        train_loss = f"{r['train_loss']:.3f}" if "train_loss" in r else ""
        tok_s = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else ""
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else ""
        lines.append(
            f"{epoch:>7} {r['step']:>8,} {train_loss:>10} {r['val_loss']:>8.3f} "
            f"{r['val_ppl_word']:>8.2f} {r['val_accuracy']:>8.1%} {tok_s:>9} {mfu:>6}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m transformer train ...`; returns the exit status."""
    try:
        args = _parser().parse_args(argv)
        if args.pair not in PAIRS:
            raise _UsageError(
                f"unknown language pair {args.pair!r}: choose one of {', '.join(PAIRS)}"
            )
        try:
            config = config_from_args(args)
        except ValueError as err:  # a bad value for a TrainConfig field
            raise _UsageError(str(err)) from err
        if args.export:  # before training, not after it
            _check_export_destination(Path(args.export), config.output_dir)
        result = train(config, resume=args.resume)
        if args.export and Distributed.from_environ().is_main:
            try:
                export_model(result.out_dir, args.export)
            except ValueError as err:  # e.g. a weight too large for float16
                raise _UsageError(
                    f"the run in {result.out_dir} is saved, but --export failed: {err}"
                ) from err
    except SystemExit as stop:  # --help
        return int(stop.code or 0)
    except (_UsageError, DataError, CheckpointError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    if Distributed.from_environ().is_main:
        print(summary_table(result.metrics))
        print(
            f"stopped: {result.stopped} after {result.step:,} updates; run in {result.out_dir}"
        )
        if args.export:
            print(f"model exported to {args.export}")
    return 0


# %% [markdown]
# An unknown pair and an output folder that already holds a run, through `main` itself:

# %%
import contextlib
import io

from transformer.train import main

for argv in (
    ["--pair", "en-de"],
    ["--pair", "de-en", "--out", str(run)],
    ["--pair", "de-en", "--out", str(run), "--resume", "--set", "d_model=128"],
):
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        status = main(argv)
    assert status == 2 and len(stderr.getvalue().splitlines()) == 1
    print(stderr.getvalue().strip().replace(str(run), "<run>"))

# %% [markdown]
# The next chapter turns a trained model into a translator: greedy decoding with a cache, and
# the paper's beam search.

# %% tags=["remove-cell"]
# The temporary folders of this chapter's runs.
import shutil

for folder in (run, scratch, shipped.parent):
    shutil.rmtree(folder, ignore_errors=True)
