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
# states each change; the next chapter, "The book's models", shows the curves of the two models
# the book ships and the comparison runs behind each change. On a CPU this chapter itself trains
# only a tiny model, clearly marked as such.
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
# validation perplexity to the last stored digit (asserted with the comparison runs, in the next
# chapter). A resume must also run as many processes as the run it continues, since they decide the
# updates: the number is kept with the checkpoint and checked. Metrics lines written after the
# checkpoint a run resumes from are dropped, since the resumed run writes them again. The `average`
# line of a run that ended and is continued for more epochs was written at the step of its last
# checkpoint, so it is kept: the new end adds another, and the last one counts.
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
# | layers, $d_{model}$, $d_{ff}$, $h$ | 6 + 6, 512, 2048, 8 | 3 + 3, 256, 512, 8 | 6.0M parameters instead of 48M with our 8,000-entry vocabulary: small data favours small models; the paper's base model, trained on the same data and batches, learned far more slowly, and with dropout 0.3 it diverged; 4 + 4 layers and $d_{ff} = 1024$ did no better (the next chapter's comparison runs; in the pre-norm order, four layers learn as fast as three and end 1% above the shipped GPU run, 2.5% below the recipe with another seed on the CPU: within chance of both) |
# | dropout | 0.1 | 0.3 | with 0.1 the validation perplexity turns up after epoch 16 while the training loss keeps falling; 0.2 and 0.3 both end lower, within chance of each other (one seed each), and 0.4 far higher; 0.3 is also the paper's value for its big English–German model |
# | tokens per batch and side | about 25,000 | at most 3,000, padding included | one epoch is about 420,000 tokens per side: at the paper's size it would be about 20 updates (21 with padding, the next chapter's throughput table); at ours it is about 160. Half as many tokens, and twice the updates, learned faster at first and ended level with the shipped run, within chance; twice as many ended far higher after 35 epochs (the next chapter's section "How many tokens per batch") |
# | warm-up | 4,000 updates | 800 updates | 4,000 would warm up for 25 epochs; 800 is about five |
# | learning-rate factor | 1 | 0.7 | a peak of $0.7 \cdot 256^{-0.5} \cdot 800^{-0.5} = 1.5 \cdot 10^{-3}$, against the paper's $7 \cdot 10^{-4}$ for batches eight times larger |
# | length of training | 100,000 updates | 35 epochs, about 5,600 updates | the validation perplexity of dropout 0.3 is still falling at epoch 35; runs of 110 epochs show it turning up after epoch 42 (French→English) and 57 (German→English), in the next chapter; 35 epochs fit the time a comparison run had on the GPU. On the CPU, the recipe with seed 1 continued to 60 epochs averaged 2.8% lower than after 35, a little less than a second seed moved it (the next chapter's section "A longer run with its own average"); on the GPU that is untried |
# | checkpoint averaging | last 5, written 10 minutes apart | last 5 epochs | the same idea, counted in epochs |
# | arithmetic on a GPU | (not stated) | float32 | a model this small is limited by the launching of its many small kernels, not by arithmetic: on an H100 it trains faster in float32 than under bfloat16 autocast, which adds conversions (the next chapter's throughput table) |
#
# The evidence for these choices is a set of runs trained on one NVIDIA H100 with
# `tools/gpu_sweep.py` (several runs at a time, each in its own process), and 28 runs on the
# project's 2-core CPU; the next chapter's section "The comparison runs" compares them all with
# the recipe.
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
# The next chapter, "The book's models", follows the two models that this loop trained with
# `multi30k_recipe` on a GPU: their curves against the project's targets, where their remaining
# loss lies, and the comparison runs behind each choice of the recipe.

# %% tags=["remove-cell"]
# The temporary folders of this chapter's runs.
import shutil

for folder in (run, scratch, shipped.parent):
    shutil.rmtree(folder, ignore_errors=True)
