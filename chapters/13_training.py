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
# schedule. This chapter puts them together in one loop, `transformer.train`: one update, what
# validation measures, the loop itself, the recipe that trained the book's two models, their
# training curves, and a small run that you can watch on a CPU. From a terminal, a whole run is
#
# ```
# python -m transformer train --pair de-en --config multi30k --out runs/de-en
# ```
#
# The code forms five small modules: `transformer.train` (the update and the loop),
# `transformer.validation`, `transformer.train_config` (the configuration and the recipe),
# `transformer.epochs` (what each epoch trains on) and `transformer.distributed` (several
# processes). How checkpoints are written and resumed, how several GPUs share a run, and how a
# trained model is exported are told in the appendix [Engineering the package](91_engineering.ipynb).

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
# ## One update
#
# Training uses *teacher forcing*. The decoder is given the reference translation shifted right
# by one position, `tgt_in` = `<bos>` $y_1 \dots y_{T-1}$, and at every position it predicts the
# next reference token, `tgt_out` = $y_1 \dots y_{T-1}$ `<eos>`. The causal mask keeps each
# position from seeing the token it must predict, so all $T$ predictions of a sentence come from
# one forward pass, instead of $T$ passes of generating one token at a time.
#
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
# tokens of small batches more weight. Because each micro-batch's loss is scaled by $1/N$ before
# its backward pass, the accumulated gradient is exactly $g$, whatever the number of
# micro-batches; this is how one GPU stands in for the paper's batches of 25,000 tokens. Then
# Adam takes its step and the schedule sets the next learning rate.
#
# `train_step` makes one such update. On a GPU the forward pass can run under bfloat16 autocast
# (matrix products in bfloat16, the loss in float32). The step returns the summed loss, left on
# the device, so that the loop reads it only now and then: reading a GPU value waits for the GPU.

# %%
#| export validation
"""Teacher-forced validation of Vaswani et al. (2017)'s model: the
label-smoothed loss, the NLL and perplexities per token and per word, and the
token accuracy."""

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.data import Batch, EncodedSplit
from transformer.distributed import world_size
from transformer.loss import LabelSmoothingLoss, TokenStats, token_stats
from transformer.masking import padding_mask, target_mask
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


# %%
#| export
"""The training loop of Vaswani et al. (2017), section 5: one update over
token-bucketed batches, and the trainer that runs the epochs, validates,
checkpoints and resumes exactly, in one process or several (torchrun).

Imports neither Altair, pandas nor spaCy: a GPU machine trains from the encoded
cache.
"""

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from transformer.data import Batch
from transformer.loss import LabelSmoothingLoss
from transformer.validation import batch_log_probs


def _ddp(model: nn.Module) -> DistributedDataParallel | None:
    """The DistributedDataParallel wrapper of a model, seen through
    torch.compile's."""
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

    `batches` are this process's micro-batches; `tokens` counts the real target
    tokens of the whole update, every micro-batch of every process. Returns
    this process's summed loss, detached and on the model's device.
    """
    if criterion.reduction != "sum":
        raise ValueError(
            "criterion must sum the loss, got"
            f" reduction={criterion.reduction!r}"
        )
    if not batches or tokens <= 0:
        raise ValueError(
            f"an update needs batches and tokens, got {len(batches)}, {tokens}"
        )
    ddp = _ddp(model)
    # DistributedDataParallel averages the gradients of the processes; we want
    # their sum.
    scale = (dist.get_world_size() if ddp is not None else 1) / tokens
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for k, batch in enumerate(batches):
        batch = batch.to(device, non_blocking=True)
        # Processes exchange gradients once, in the backward pass of the last
        # micro-batch.
        last = k == len(batches) - 1
        with (
            contextlib.nullcontext() if ddp is None or last else ddp.no_sync()
        ):
            with torch.autocast(
                device.type, dtype=torch.bfloat16, enabled=bf16
            ):
                log_probs = batch_log_probs(
                    model, batch, pad_id=criterion.pad_id
                )
            loss = criterion(log_probs, batch.tgt_out)
            (loss * scale).backward()
        total += loss.detach()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    return total


# %% [markdown]
# Accumulation changes nothing about the update. On a tiny model and eight sentence pairs (here
# sequences of symbols), one step over the whole batch and one step over the same pairs cut into
# three micro-batches compute the same gradient, up to the rounding of a different order of
# additions:

# %%
from transformer.config import TransformerConfig
from transformer.data import collate
from transformer.loss import LabelSmoothingLoss
from transformer.model import Transformer
from transformer.schedule import make_optimizer
from transformer.train import train_step

PAD, BOS, EOS = 0, 1, 2  # three special tokens, then ten symbols
tiny = TransformerConfig(
    src_vocab_size=13, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0
)
generator = torch.Generator().manual_seed(0)
pairs = []
for _ in range(8):
    n = int(torch.randint(2, 9, (1,), generator=generator))
    seq = torch.randint(3, 13, (n,), generator=generator)
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
# The size of the rounding differences depends on the CPU's kernels: bounded,
# not printed.
assert (one - three).abs().max() < 1e-6
print(
    f"{full.n_tgt_tokens} target tokens; gradient entries up to"
    f" {one.abs().max():.2f}, the largest difference below 1e-6"
)

# %% [markdown]
# ## What validation measures
#
# Each epoch ends with a pass over the validation split, without dropout and without updates,
# with teacher forcing as in training. It reports:
#
# - the **label-smoothed loss**, the quantity training minimises (the training loss is the same
#   quantity, measured with dropout and averaged over an epoch of a changing model);
# - the **negative log-likelihood** per token without smoothing, $\overline{\mathrm{NLL}} =
#   \frac{1}{N} \sum_i -\log p(y_i \mid y_{<i}, x)$, and the **perplexity per token**
#   $\exp(\overline{\mathrm{NLL}})$: the effective number of subword tokens the model hesitates
#   between at each position;
# - the **perplexity per word**, the same total NLL divided by the number $W$ of words of the
#   references (the whitespace-separated pieces of each decoded reference) instead of the number
#   of tokens: subword perplexities depend on the vocabulary, a per-word one much less;
# - the **token accuracy**, the share of target positions whose most probable token is the
#   reference token (the `TokenStats` of the label-smoothing chapter).
#
# None of these is the translation quality itself, which needs the model to generate without
# the reference prefix; the decoding and results chapters measure that with BLEU. With several
# processes each one validates its share of the batches and the sums are added up before the
# means are taken.


# %%
#| export validation
def count_words(tokenizer: Tokenizer, data: EncodedSplit) -> int:
    """Words of the references: whitespace-separated pieces of each decoded
    target sentence."""
    return sum(len(tokenizer.decode(tgt).split()) for _, tgt in data)


@dataclass(frozen=True)
class Validation:
    """Sums over a validation set: the label-smoothed loss, `TokenStats`, and
    the word count."""

    loss_sum: float
    stats: TokenStats
    words: int | None = None

    @property
    def loss(self) -> float:
        """Label-smoothed loss per target token."""
        return self.loss_sum / self.stats.tokens

    @property
    def word_perplexity(self) -> float | None:
        """exp(total NLL / reference words); None without a word count."""
        return (
            math.exp(self.stats.nll_sum / self.words) if self.words else None
        )

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
    """Teacher-forced validation metrics, in eval mode; summed over processes
    when distributed."""
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
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
    if world_size() > 1:
        sums = [loss_sum, stats.nll_sum, stats.correct, stats.tokens]
        total = torch.tensor(sums, dtype=torch.float64, device=device)
        dist.all_reduce(total)
        loss_sum, nll_sum, correct, tokens = total.tolist()
        stats = TokenStats(
            nll_sum=nll_sum, correct=int(correct), tokens=int(tokens)
        )
    return Validation(loss_sum=loss_sum, stats=stats, words=words)


# %% [markdown]
# ## The configuration
#
# A run is described by one frozen dataclass, `TrainConfig`, stored as JSON with the run and in
# every checkpoint. The model is a preset of `TransformerConfig` (`small`, `base` or `big`) with
# optional overrides of any of its fields except the vocabulary size, which comes from the
# tokenizer. The defaults follow the paper where it has a value (warm-up 4,000, label smoothing
# 0.1, the average of the last 5 checkpoints). `time_limit` (minutes) stops a run early enough to
# validate and save a checkpoint, so that a long run can be a chain of resumed ones;
# `bpe_dropout` samples a new segmentation of the training words each epoch (the data chapter).
# Each field's check is one row of a table, and a bad value is refused with its field's name.

# %%
#| export train_config
"""The configuration of a training run: `TrainConfig`, each field checked by a
table, the named recipes, and what a checkpoint records of the run."""

import dataclasses
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from transformer.checkpoint import (
    CHECKPOINT_FORMAT,
    CheckpointError,
    Progress,
    latest_checkpoint,
    read_record,
    tokenizer_digest,
)
from transformer.config import TransformerConfig
from transformer.data import CACHE_DIR, DATA_DIR, MAX_TOKENS, PAIRS
from transformer.distributed import Distributed, barrier
from transformer.tokenizer import VOCAB_SIZE, Tokenizer

MODEL_PRESETS = ("small", "base", "big")
BPE_DROPOUT_SIDES = {"both": ("src", "tgt"), "source": ("src",)}
PEAK_BF16_FLOPS = (
    790e12  # measured bf16 matrix-multiply rate of an H100 or H200
)
_VOCAB_FIELDS = ("src_vocab_size", "tgt_vocab_size")


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _positive(value: object) -> bool:
    return _integer(value) and value > 0


def _rate(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and 0 < value < math.inf
    )


def _share(value: object) -> bool:
    return isinstance(value, int | float) and 0 <= value < 1


_POSITIVE = (_positive, "must be a positive integer")
_RATE = (_rate, "must be a finite positive number")
_TEXT = (lambda v: v is None or isinstance(v, str), "must be a string or None")
# Each field's check, in the order they are made; a value that fails is refused
# as "<field> <message>, got <value>".
_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "vocab_size": _POSITIVE,
    "epochs": _POSITIVE,
    "max_tokens": _POSITIVE,
    "accumulation": _POSITIVE,
    "warmup": _POSITIVE,
    "max_steps": (
        lambda v: v is None or _positive(v),
        "must be a positive integer or None",
    ),
    "log_every": _POSITIVE,
    "seed": (
        lambda v: _integer(v) and v >= 0,
        "must be a non-negative integer",
    ),
    "average_last": (
        lambda v: isinstance(v, int) and v >= 0,
        "must be an integer >= 0",
    ),
    "lr_factor": _RATE,
    "peak_flops": _RATE,
    "label_smoothing": (_share, "must be in [0, 1)"),
    "bpe_dropout": (
        lambda v: _share(v) and not isinstance(v, bool),
        "must be in [0, 1)",
    ),
    "bpe_dropout_sides": (
        lambda v: isinstance(v, str) and v in BPE_DROPOUT_SIDES,
        f"must be one of {', '.join(BPE_DROPOUT_SIDES)}",
    ),
    "time_limit": (
        lambda v: v is None or _rate(v),
        "must be finite positive minutes or None",
    ),
    "bf16": (
        lambda v: v in (None, True, False),
        "must be True, False or None",
    ),
    "compile": (lambda v: isinstance(v, bool), "must be True or False"),
    "out_dir": _TEXT,
    "cache_dir": _TEXT,
    "data_dir": _TEXT,
    "device": _TEXT,
}


@dataclass(frozen=True)
class TrainConfig:
    """Everything that defines a training run; the defaults follow the paper
    where it says."""

    pair: str
    model: str = "small"  # a TransformerConfig preset
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    vocab_size: int = VOCAB_SIZE  # of the joint BPE vocabulary (data chapter)
    epochs: int = 10
    max_steps: int | None = None
    max_tokens: int = (
        MAX_TOKENS  # padded tokens per batch and side, per process
    )
    accumulation: int = 1  # batches per process and update
    warmup: int = 4000
    lr_factor: float = 1.0
    label_smoothing: float = 0.1
    bpe_dropout: float = (
        0.0  # on the training words (data chapter); 0: off (the paper)
    )
    bpe_dropout_sides: str = (
        "both"  # or "source": targets keep BPE's own spelling
    )
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
                f"pair: unknown language pair {self.pair!r}, choose one of"
                f" {', '.join(PAIRS)}"
            )
        if self.model not in MODEL_PRESETS:
            raise ValueError(
                f"model: unknown preset {self.model!r}, choose one of"
                f" {', '.join(MODEL_PRESETS)}"
            )
        if not isinstance(self.model_overrides, dict):
            raise ValueError(
                f"model_overrides must be a dict, got {self.model_overrides!r}"
            )
        object.__setattr__(self, "model_overrides", dict(self.model_overrides))
        fields = {f.name for f in dataclasses.fields(TransformerConfig)}
        known = fields - set(_VOCAB_FIELDS)
        bad = sorted(set(self.model_overrides) - known)
        if bad:
            raise ValueError(
                f"model_overrides: unknown or fixed field(s) {', '.join(bad)}"
                " (the vocabulary size comes from the tokenizer); known:"
                f" {', '.join(sorted(known))}"
            )
        for name, (valid, message) in _CHECKS.items():
            if not valid(value := getattr(self, name)):
                raise ValueError(f"{name} {message}, got {value!r}")
        if self.device is not None:
            try:
                torch.device(self.device)
            except RuntimeError:
                raise ValueError(
                    "device must be a torch device such as cpu, cuda or"
                    f" cuda:1, got {self.device!r}"
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
        """Whether to train and validate under bfloat16 autocast on a
        `device_type` device: `bf16` if set, otherwise on with CUDA only."""
        return self.bf16 if self.bf16 is not None else device_type == "cuda"

    @property
    def output_dir(self) -> Path:
        return Path(
            self.out_dir if self.out_dir is not None else f"runs/{self.pair}"
        )

    @property
    def cache_path(self) -> Path:
        return (
            Path(self.cache_dir) if self.cache_dir is not None else CACHE_DIR
        )

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir) if self.data_dir is not None else DATA_DIR

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """A config from `to_dict()`'s output; unknown keys are errors."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown TrainConfig field(s) {', '.join(unknown)}"
            )
        return cls(**d)


def quick_mode() -> bool:
    """Whether heavy cells run their small CPU version: without a CUDA GPU, or
    when the environment sets TRANSFORMER_QUICK=1 (TRANSFORMER_QUICK=0 asks for
    the full version)."""
    flag = os.environ.get("TRANSFORMER_QUICK", "")
    if flag not in ("", "0", "1"):
        raise ValueError(f"TRANSFORMER_QUICK must be 0 or 1, got {flag!r}")
    if flag:
        return flag == "1"
    return not torch.cuda.is_available()


def quick_config(pair: str, **overrides: Any) -> TrainConfig:
    """A tiny model trained for a few dozen updates: about a minute on a 2-core
    CPU."""
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


def run_record(
    config: TrainConfig, model_config: TransformerConfig, tokenizer: Tokenizer
) -> dict[str, Any]:
    """What config.json holds: the model, the run, and the vocabulary's
    fingerprint."""
    return {
        "format": CHECKPOINT_FORMAT,
        "model": model_config.to_dict(),
        "train": config.to_dict(),
        "vocab": {
            "size": tokenizer.vocab_size,
            "sha256": tokenizer_digest(tokenizer),
        },
    }


# The fields a resumed run must share with its checkpoint: they decide the
# updates themselves.
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


def check_recipe(folder: Path, config: TrainConfig) -> None:
    """Raise CheckpointError, naming the folder and the field, if the
    checkpoint in `folder` was trained with another value of a field that
    decides the updates (RESUME_FIXED)."""
    stored = read_record(folder).get("train", {})
    for name in RESUME_FIXED:
        theirs, ours = stored.get(name), getattr(config, name)
        if (
            name == "model_overrides"
        ):  # name the field of the model that differs
            theirs, ours = theirs or {}, ours or {}
            for key in sorted(theirs.keys() | ours.keys()):
                if theirs.get(key) != ours.get(key):
                    raise CheckpointError(
                        f"{folder}: the checkpoint was trained with"
                        f" {name}.{key}={theirs.get(key)!r}, this run asks for"
                        f" {name}.{key}={ours.get(key)!r}"
                    )
        elif name in stored and theirs != ours:
            raise CheckpointError(
                f"{folder}: the checkpoint was trained with {name}={theirs!r},"
                f" this run asks for {name}={ours!r}"
            )


def resume_point(
    out: Path, config: TrainConfig, env: Distributed, *, resume: bool
) -> Path | None:
    """The checkpoint a run in `out` resumes from, if any, after the checks
    that need no data: the folder holds no other run unless resuming, and the
    checkpoint was trained with this recipe by as many processes."""
    checkpoint = latest_checkpoint(out)
    occupied = out.is_dir() and any(out.iterdir())
    # Every process looks at the folder before the first one writes into it, so
    # that all of them see the same thing, and refuse (or go on) together.
    barrier()
    if occupied and not resume:
        raise CheckpointError(
            f"output folder {out} is not empty: pass --resume to continue the"
            " run in it, or choose another --out"
        )
    if checkpoint is not None:
        check_recipe(checkpoint, config)
        processes = Progress.read(checkpoint).processes
        if processes != env.world_size:
            raise CheckpointError(
                f"{checkpoint}: the run was trained by {processes}"
                f" process(es), this one has {env.world_size}: they decide the"
                f" updates, so resume with {processes}"
            )
    return checkpoint


# %% [markdown]
# A config survives the trip through JSON, and a bad value is caught with its field's name:

# %%
from transformer.train_config import TrainConfig

config = TrainConfig(
    pair="de-en", model="small", model_overrides={"dropout": 0.3}, warmup=2000
)
assert (
    TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
)
print(config.model_config(8000))
for bad in [
    dict(pair="en-de"),
    dict(pair="de-en", warmup=0),
    dict(pair="de-en", label_smoothing=1.0),
    dict(pair="de-en", model_overrides={"d_model": 100}),
]:
    try:
        TrainConfig(**bad)
    except ValueError as err:
        print("ValueError:", err)
    else:
        raise AssertionError(f"{bad} was accepted")

# %% [markdown]
# ## The loop
#
# `train(config)` does a whole run, and `Trainer` holds its state: the model, the optimiser,
# the batches and `Progress`, where the run stands. Its methods each do one job:
#
# - `__init__` checks the output folder (a folder holding another run is an error unless
#   resuming), loads the tokenizer and the encoded splits from the data chapter's cache, checks
#   that every sentence fits a batch and the model's positions, builds the model with the run's
#   seed, Adam and the schedule, and, when resuming, loads the latest checkpoint;
# - `run` trains epoch after epoch until the last, or until `max_steps` or the time limit, and
#   then averages the last `average_last` epoch checkpoints;
# - `_train_epoch` orders the training pairs into token-bucketed batches from `(seed, epoch)`
#   and makes one `_update` per group of batches, writing a line to `steps.jsonl` every
#   `log_every` updates;
# - `_end_period` validates, appends the epoch's line to `metrics.jsonl` and writes a checkpoint;
# - `_average` validates the average of the last checkpoints and writes it to `average/`.
#
# A checkpoint holds everything an update depends on, and the rest (the order of the batches,
# the dropout masks) is a function of the seed, the epoch and the update. So a run stopped
# after one epoch and resumed for a second ends with *bit-identical* weights to a run of two
# epochs straight, on the same machine. Under `torchrun` the same code runs in several
# processes, one per GPU, each taking its share of every update's batches. The appendix
# [Engineering the package](91_engineering.ipynb) tells how both work.
#
# Every line of `metrics.jsonl` holds `kind` (`epoch`, `partial` for a stop inside an epoch, or
# `average`), `epoch`, `step` (updates made), the validation metrics above (`val_loss`,
# `val_nll`, `val_ppl_token`, `val_ppl_word`, `val_accuracy`) and `wall_time`; an epoch line
# adds `train_loss`, `train_tokens`, `tokens_per_s` (real target tokens per second of training),
# `lr` and `mfu`, the share of the GPU's peak arithmetic rate that the model's FLOPs used (the
# appendix [Derivations and counts](93_counts.ipynb) derives the count).

# %%
#| export distributed
"""One process among several: torchrun's environment, each process's device,
and the collectives that the processes of a run share (DistributedDataParallel
adds the gradients)."""

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Distributed:
    """This process's place among the processes of a run (torchrun's
    environment)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str] | None = None
    ) -> "Distributed":
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


def world_size() -> int:
    """The number of processes of the process group; 1 without one."""
    return (
        dist.get_world_size()
        if dist.is_available() and dist.is_initialized()
        else 1
    )


def device_for(requested: str | None, env: Distributed) -> torch.device:
    """The device a process trains on: `requested`, else CUDA when there is a
    GPU; a CUDA device without an index is the process's own GPU (LOCAL_RANK).
    """
    if requested is not None:
        device = torch.device(requested)
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", env.local_rank)
    return device


def barrier() -> None:
    """Wait for every process of the group (nothing to wait for alone)."""
    if world_size() > 1:
        dist.barrier()


def all_sum(values: list[float], device: torch.device) -> list[float]:
    """The sums of `values` over the processes, in float64."""
    if world_size() == 1:
        return values
    total = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(total)
    return total.tolist()


def seed_update(seed: int, step: int, rank: int) -> None:
    """Seed the randomness of an update (dropout) from (seed, update, process):
    a resumed run draws the same masks as an uninterrupted one without storing
    generator states."""
    torch.manual_seed(
        int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])
    )


# %% [markdown]
# What each epoch trains on, and the checks made before the first update:

# %%
#| export epochs
"""What a training run trains on, epoch by epoch: the splits from the encoded
cache, the checks that every sentence and every epoch fit the run's batches,
each epoch's batches and, under BPE-dropout, each epoch's spelling."""

import functools
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from transformer.data import (
    BPEDropout,
    DataError,
    EncodedSplit,
    load_encoded,
    prepare,
    token_batches,
)
from transformer.distributed import Distributed, barrier
from transformer.tokenizer import Tokenizer
from transformer.train_config import BPE_DROPOUT_SIDES, TrainConfig


@dataclass(frozen=True)
class TrainingData:
    """The tokenizer and the encoded splits a run trains and validates on."""

    tokenizer: Tokenizer
    train: EncodedSplit
    val: EncodedSplit


def load_training_data(config: TrainConfig) -> TrainingData:
    """The pair's tokenizer and splits from the encoded cache, built first if
    needed (spaCy)."""
    env = Distributed.from_environ()
    try:
        # The first process builds the cache; the others wait and load it.
        if not env.is_main:
            barrier()
        tokenizer = prepare(
            config.pair,
            config.cache_path,
            vocab_size=config.vocab_size,
            data_dir=config.data_path,
        )
        splits = [
            load_encoded(
                config.pair,
                split,
                config.cache_path,
                data_dir=config.data_path,
            )
            for split in ("train", "val")
        ]
    except ImportError as err:  # no spaCy to build a missing cache
        raise DataError(str(err)) from err
    finally:
        if env.is_main:
            barrier()
    return TrainingData(tokenizer, *splits)


def epoch_batches(
    train: EncodedSplit, epoch: int, config: TrainConfig
) -> list[np.ndarray]:
    """An epoch's batches of pair indices: token-bucketed, in an order drawn
    from (seed, epoch)."""
    return token_batches(
        train.src_lengths + 1,  # + <eos>
        train.tgt_lengths + 1,  # + <bos> (input) or <eos> (output)
        max_tokens=config.max_tokens,
        seed=config.seed,
        epoch=epoch,
    )


def check_lengths(
    config: TrainConfig,
    data: TrainingData,
    max_len: int,
    bpe: BPEDropout | None,
) -> None:
    """Refuse, before any update, a split whose longest sentence (with its
    <bos> or <eos>) fits neither a batch nor the model's positional table. With
    BPE-dropout, a training sentence counts in its longest spelling too, which
    a later epoch may draw."""
    longest = {
        f"{name} sentence": int(
            max(split.src_lengths.max(), split.tgt_lengths.max())
        )
        for name, split in (("train", data.train), ("val", data.val))
    }
    if bpe is not None:
        sides = BPE_DROPOUT_SIDES[config.bpe_dropout_sides]
        what = (
            "train sentence as BPE-dropout may spell it, one token a character"
        )
        longest[what] = bpe.longest_spelling(data.train, sides)
    for what, tokens in longest.items():
        tokens += 1  # <bos> or <eos>
        if tokens > config.max_tokens:
            raise DataError(
                f"max_tokens={config.max_tokens} cannot hold the longest"
                f" {what} ({tokens} tokens): raise --max-tokens"
            )
        if tokens > max_len:
            raise DataError(
                f"the model's max_len={max_len} cannot place the "
                f"longest {what} ({tokens} tokens): raise --set max_len"
            )


def updates_per_epoch(batches: int, accumulation: int, processes: int) -> int:
    """The updates an epoch of `batches` batches gives; none is an error."""
    group = accumulation * processes
    if batches < group:
        raise DataError(
            f"an epoch has {batches} batches, too few for one update of "
            f"accumulation {accumulation} × {processes} process(es) "
            f"= {group} batches: lower --accumulation or --max-tokens"
        )
    return batches // group


def dropped_warning(
    batches: int, accumulation: int, processes: int
) -> str | None:
    """A warning when grouping batches into updates leaves out over 10% of
    them."""
    group = accumulation * processes
    dropped = batches % group
    if dropped <= 0.1 * batches:
        return None
    return (
        f"warning: an epoch leaves out {dropped} of its {batches} batches "
        f"({dropped / batches:.0%}): an update takes accumulation "
        f"{accumulation} × {processes} process(es) = {group} "
        "batches; lower --accumulation or --max-tokens"
    )


def prepare_epochs(
    config: TrainConfig,
    data: TrainingData,
    max_len: int,
    processes: int,
    epoch: int,
) -> tuple["Spellings", int]:
    """The checks made before the first update (every sentence fits a batch and
    the model; epoch `epoch`, the one to come, gives an update), and the
    spellings of the epochs. Returns them and the number of batches of epoch
    `epoch`."""
    bpe = (
        BPEDropout(data.tokenizer, config.bpe_dropout)
        if config.bpe_dropout
        else None
    )
    if bpe is not None:
        bpe.check(data.train)
    check_lengths(config, data, max_len, bpe)
    # The batches of the epoch to come, in BPE's own spelling (BPE-dropout
    # changes their number only slightly): an epoch must give at least one
    # update.
    first = len(epoch_batches(data.train, epoch, config))
    updates_per_epoch(first, config.accumulation, processes)
    return Spellings(data.train, bpe, config), first


class Spellings:
    """The training split as each epoch spells it: BPE's own spelling, or with
    BPE-dropout a new one each epoch, a function of (seed, epoch). With
    `prefetch` a second process spells the next epoch while this one trains."""

    def __init__(
        self, train: EncodedSplit, bpe: BPEDropout | None, config: TrainConfig
    ) -> None:
        self.train, self.epochs, self.prefetch = train, config.epochs, False
        self.resample = None
        if bpe is not None:
            sides = BPE_DROPOUT_SIDES[config.bpe_dropout_sides]
            self.resample = functools.partial(
                bpe.resample, seed=config.seed, sides=sides
            )
        self.pool: ProcessPoolExecutor | None = None
        self.ahead: dict[int, Future] = {}

    def __call__(self, epoch: int) -> EncodedSplit:
        if self.resample is None:
            return self.train
        ahead = self.ahead.pop(epoch, None)
        if ahead is not None:
            train = ahead.result()
        else:
            train = self.resample(self.train, epoch=epoch)
        if self.prefetch and epoch + 1 < self.epochs:
            if self.pool is None:
                spawn = multiprocessing.get_context("spawn")
                self.pool = ProcessPoolExecutor(1, mp_context=spawn)
            self.ahead[epoch + 1] = self.pool.submit(
                self.resample, self.train, epoch=epoch + 1
            )
        return train

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)


# %% [markdown]
# The loop's helpers: the checks of the output folder, the model's set-up, the clock of the
# time limit and the logs:

# %%
#| export
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from torch.optim.lr_scheduler import LRScheduler
from tqdm import tqdm

from transformer.checkpoint import (
    CheckpointError,
    Progress,
    average_checkpoints,
    check_compatible,
    latest_checkpoint,
    list_checkpoints,
    load_state,
    load_tensors_into,
    load_weights,
    prune_checkpoints,
    write_checkpoint,
)
from transformer.config import TransformerConfig
from transformer.counts import training_flops
from transformer.data import EncodedSplit, collate, iterate_batches
from transformer.distributed import (
    Distributed,
    all_sum,
    barrier,
    device_for,
    seed_update,
)
from transformer.epochs import (
    TrainingData,
    dropped_warning,
    epoch_batches,
    load_training_data,
    prepare_epochs,
    updates_per_epoch,
)
from transformer.files import (
    append_jsonl,
    atomic_write,
    read_jsonl,
    remove_stale,
    truncate_jsonl,
)
from transformer.model import Transformer
from transformer.schedule import make_optimizer, noam_lr
from transformer.tokenizer import Tokenizer
from transformer.train_config import TrainConfig, resume_point, run_record
from transformer.validation import Validation, count_words, evaluate


def _sync(device: torch.device) -> float:
    """The time, after the GPU has finished its queued work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def _build(
    config: TrainConfig,
    model_config: TransformerConfig,
    device: torch.device,
    pad_id: int,
) -> tuple[
    Transformer, torch.optim.Optimizer, LRScheduler, LabelSmoothingLoss
]:
    """The model, initialised from the run's seed, Adam with the schedule, and
    the loss."""
    torch.manual_seed(config.seed)
    model = Transformer(model_config).to(device)
    optimizer, scheduler = make_optimizer(
        model,
        d_model=model_config.d_model,
        warmup=config.warmup,
        factor=config.lr_factor,
    )
    smoothing = config.label_smoothing
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
    return model, optimizer, scheduler, criterion


def _wrap(
    model: nn.Module,
    config: TrainConfig,
    env: Distributed,
    device: torch.device,
) -> nn.Module:
    """The model that updates run: under DistributedDataParallel with several
    processes, compiled if asked."""
    if env.world_size > 1:
        ids = [device.index] if device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids)
    return torch.compile(model) if config.compile else model


def _bar(
    total: int, initial: int, epoch: int, epochs: int, main: bool
) -> tqdm:
    """The progress bar of an epoch's updates, shown by the first process in a
    terminal."""
    return tqdm(
        total=total,
        initial=initial,
        desc=f"epoch {epoch + 1}/{epochs}",
        unit="update",
        disable=None if main else True,  # None: off when not a terminal
        dynamic_ncols=True,
    )


def _last_epochs(out: Path, average_last: int) -> list[Path]:
    """The epoch checkpoints to average: the last `average_last`, from 2."""
    found = list_checkpoints(out)
    epochs = [path for _, path in found if path.name.startswith("epoch-")]
    return epochs[-average_last:] if average_last >= 2 else []


def _prepare_folder(out: Path) -> None:
    """Make the run's folders; delete what a killed run left (see
    atomic_folder)."""
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    remove_stale(out)
    remove_stale(out / "checkpoints")


def _store_settings(
    out: Path, config: TrainConfig, tokenizer: Tokenizer, step: int
) -> None:
    """Drop the records after update `step`, which a resumed run writes again,
    and store the settings (both atomically: --resume reads them back)."""
    for name in ("metrics.jsonl", "steps.jsonl"):
        truncate_jsonl(out / name, step)
    settings = json.dumps(config.to_dict(), indent=2) + "\n"
    atomic_write(out / "train_config.json", settings.encode())
    tokenizer.save(out / "tokenizer.json")


def _validation_set(
    data: TrainingData, config: TrainConfig, max_len: int, env: Distributed
) -> tuple[int, list[Batch]]:
    """The words of the validation references, and this process's share of the
    batches."""
    val = iterate_batches(
        data.val,
        data.tokenizer,
        max_tokens=config.max_tokens,
        shuffle=False,
        max_len=max_len,
    )
    return (
        count_words(data.tokenizer, data.val),
        list(val)[env.rank :: env.world_size],
    )


def _collate_share(
    train: EncodedSplit,
    update: list[np.ndarray],
    tokenizer: Tokenizer,
    max_len: int,
    env: Distributed,
) -> list[Batch]:
    """This process's batches of an update: every world_size-th, from its rank
    on."""
    return [
        collate(
            [train[i] for i in index],
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            index=index,
            max_len=max_len,
        )
        for index in update[env.rank :: env.world_size]
    ]


def _where(checkpoint: Path | None, resume: bool, out: Path) -> str:
    """Where a run starts: from a checkpoint, or from scratch."""
    if checkpoint is not None:
        return f"resuming from {checkpoint}"
    if (
        resume
    ):  # the same command repeated across stops starts the run the first time
        return f"nothing to resume in {out}: starting a new run"
    return "starting"


def _start_line(
    where: str,
    config: TrainConfig,
    n: int,
    env: Distributed,
    device,
    bf16: bool,
) -> str:
    """The log's first line: where the run starts, its model, processes and
    arithmetic."""
    return (
        f"{where}: {config.pair}, model {config.model}"
        f" {config.model_overrides or ''} ({n:,} parameters), {env.world_size}"
        f" process(es) on {device}, bf16 {bf16}, compile {config.compile}"
    )


class _Clock:
    """The time limit: the run stops at a check early enough to validate and
    save."""

    def __init__(
        self, limit: float | None, env: Distributed, device: torch.device
    ):
        self.start, self.limit = time.perf_counter(), limit
        self.env, self.device = env, device
        self.reserve = (
            0.05 * 60 * limit if limit else 0.0
        )  # to validate and save
        # With several processes the time check is a collective: every 10
        # updates then.
        self.check_every = 1 if env.world_size == 1 else 10
        self.gap = 0.0  # the longest time measured between two time checks
        self.checked: float | None = None  # when the time was last checked

    def time_is_up(self) -> bool:
        """Measure the time since the last check; say whether to stop now."""
        now = time.perf_counter()
        if self.checked is not None:
            self.gap = max(self.gap, now - self.checked)
        self.checked = now
        if self.limit is None:
            return False
        # The run goes on until the next check before it validates and saves:
        # the longest time seen between two checks (one update, or ten with
        # several processes) is reserved besides the time of validating and
        # saving.
        reserve = self.reserve + self.gap
        late = time.perf_counter() - self.start > 60 * self.limit - reserve
        if self.env.world_size > 1:  # processes must stop at the same update
            flag = torch.tensor([float(late)], device=self.device)
            dist.broadcast(flag, src=0)
            late = bool(flag.item())
        return late


class _StepLog:
    """The lines of steps.jsonl: the training loss and throughput since the
    last line."""

    def __init__(self, path: Path | None, device: torch.device) -> None:
        self.path, self.device = path, device

    def restart(self, now: float) -> None:
        self.start, self.tokens = now, 0
        self.loss = torch.zeros((), device=self.device, dtype=torch.float64)

    def add(self, loss: Tensor, tokens: int) -> None:
        self.loss += loss
        self.tokens += tokens

    def write(
        self, p: Progress, batches: int, lr: float, start: float
    ) -> dict:
        """The line at update `p.step` of an epoch of `batches` batches;
        `start` is when this process of the run began."""
        now = time.perf_counter()
        mean = all_sum([self.loss.item()], self.device)[0] / self.tokens
        record = {
            "step": p.step,
            "epoch": round(p.epoch + p.batch / batches, 4),
            "train_loss": mean,
            "lr": lr,
            "tokens_per_s": self.tokens / (now - self.start),
            "wall_time": p.wall_time + now - start,
        }
        if self.path is not None:
            append_jsonl(self.path, record)
        self.restart(now)
        return record


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    stopped: str  # "completed", "max_steps" or "time_limit"
    step: int
    metrics: list[dict[str, Any]]


class _Log:
    """Lines to the run's train.log and, if `echo`, to the terminal (around the
    progress bar)."""

    def __init__(self, path: Path | None, echo: bool) -> None:
        self.file = open(path, "a") if path is not None else None
        self.echo = echo

    def __call__(self, message: str, *, echo: bool = True) -> None:
        if self.file is not None:
            self.file.write(
                f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n"
            )
            self.file.flush()
        if self.echo and echo:
            tqdm.write(message, file=sys.stdout)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


def _epoch_record(
    kind: str,
    epoch: float,
    p: Progress,
    validation: Validation,
    lr: float,
    wall_time: float,
    peak: float | None,
) -> dict[str, Any]:
    """The line of metrics.jsonl for an epoch, or the part of one before a
    stop; `peak` is the processes' peak FLOP rate (None on a CPU: no MFU)."""
    seconds = max(p.epoch_seconds, 1e-9)
    return {
        "kind": kind,
        "epoch": epoch,
        "step": p.step,
        "train_loss": p.epoch_loss_sum / max(p.epoch_tokens, 1),
        **validation.metrics(),
        "train_tokens": p.epoch_tokens,
        "tokens_per_s": p.epoch_tokens / seconds,
        "lr": lr,
        "wall_time": wall_time,
        "mfu": p.epoch_flops / seconds / peak if peak is not None else None,
    }


def _metrics_text(r: dict[str, Any]) -> str:
    return (
        f"val loss {r['val_loss']:.3f}, ppl/word {r['val_ppl_word']:.2f}, "
        f"ppl/token {r['val_ppl_token']:.2f}, accuracy {r['val_accuracy']:.1%}"
    )


def _epoch_line(r: dict[str, Any], epochs: int) -> str:
    mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
    return (
        f"epoch {r['epoch']:g}/{epochs} step {r['step']:,}: train loss"
        f" {r['train_loss']:.3f}, "
        + _metrics_text(r)
        + f", {r['tokens_per_s']:,.0f} tok/s{mfu}, lr {r['lr']:.2e}"
    )


# %% [markdown]
# The trainer itself, its set-up first, then the epochs:


# %%
#| export
class Trainer:
    """One process's part of a training run; `train(config)` builds one and
    calls `run()`."""

    def __init__(
        self,
        config: TrainConfig,
        *,
        resume: bool = False,
        data: TrainingData | None = None,
        echo: bool = True,
    ) -> None:
        self.config = c = config
        self.env = env = Distributed.from_environ()
        self.device = device_for(c.device, env)
        self.clock = _Clock(c.time_limit, env, self.device)
        self.out = c.output_dir
        checkpoint = resume_point(self.out, c, env, resume=resume)
        self.data = data if data is not None else load_training_data(c)
        tokenizer = self.data.tokenizer
        self.model_config = c.model_config(tokenizer.vocab_size)
        if checkpoint is not None:
            check_compatible(
                checkpoint, model_config=self.model_config, tokenizer=tokenizer
            )
        max_len = self.model_config.max_len
        epoch = (
            Progress.read(checkpoint).epoch if checkpoint is not None else 0
        )
        self.spellings, first = prepare_epochs(
            c, self.data, max_len, env.world_size, epoch
        )
        # With a GPU, a second process spells the next epoch while this one
        # trains (the CPU is otherwise idle); on a CPU, the training itself
        # keeps every core busy.
        self.spellings.prefetch = self.device.type == "cuda"
        self.model, self.optimizer, self.scheduler, self.criterion = _build(
            c, self.model_config, self.device, tokenizer.pad_id
        )
        self.progress = Progress()
        if env.is_main:
            _prepare_folder(self.out)
        barrier()
        if checkpoint is not None:
            self._load(checkpoint)
        if env.is_main:
            _store_settings(self.out, c, tokenizer, self.progress.step)
        self.step_model = _wrap(self.model, c, env, self.device)
        self.bf16 = c.uses_bf16(self.device.type)
        self.words, self.val_batches = _validation_set(
            self.data, c, max_len, env
        )
        self.loss_acc = torch.zeros(
            (), device=self.device, dtype=torch.float64
        )
        steps = self.out / "steps.jsonl" if env.is_main else None
        self.steps = _StepLog(steps, self.device)
        # Opened last, so that a set-up error leaves no file open.
        main = self.out / "train.log" if env.is_main else None
        self.log = _Log(main, echo and env.is_main)
        self._describe(checkpoint, resume=resume)
        if warning := dropped_warning(first, c.accumulation, env.world_size):
            self.log(warning)

    # -- set-up

    def _load(self, checkpoint: Path) -> None:
        """Continue from a checkpoint: the weights, the optimiser, the
        schedule, progress."""
        load_weights(self.model, checkpoint / "model.safetensors")
        state = load_state(checkpoint, "trainer")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.progress = Progress.read(checkpoint)

    def _describe(self, checkpoint: Path | None, *, resume: bool) -> None:
        c, n = self.config, sum(p.numel() for p in self.model.parameters())
        where = _where(checkpoint, resume, self.out)
        self.log(_start_line(where, c, n, self.env, self.device, self.bf16))
        self.log(f"config: {json.dumps(c.to_dict())}", echo=False)

    # -- the epochs

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
            averaged = (self.out / "average").exists()
            if stopped != "time_limit" and (trained or not averaged):
                self._average()
        finally:
            self.log.close()
            self.spellings.close()
        metrics = read_jsonl(self.out / "metrics.jsonl")
        return TrainResult(self.out, stopped, p.step, metrics)

    def _train_epoch(self) -> tuple[str | None, int]:
        """Updates until the epoch ends (None) or the run must stop (the
        reason)."""
        c, p, env, clock = self.config, self.progress, self.env, self.clock
        self.train = self.spellings(p.epoch)
        self.tgt_lengths = self.train.tgt_lengths + 1
        self.pair_flops = training_flops(
            self.model,
            src_lengths=self.train.src_lengths + 1,
            tgt_lengths=self.tgt_lengths,
        )
        batches = epoch_batches(self.train, p.epoch, c)
        group = c.accumulation * env.world_size
        total = updates_per_epoch(len(batches), c.accumulation, env.world_size)
        self.model.train()
        bar = _bar(
            total, min(p.batch // group, total), p.epoch, c.epochs, env.is_main
        )
        start, updates, reason = _sync(self.device), 0, None
        self.steps.restart(start)
        clock.checked = None
        while p.batch + group <= len(batches):
            if c.max_steps is not None and p.step >= c.max_steps:
                reason = "max_steps"
                break
            if updates % clock.check_every == 0 and clock.time_is_up():
                reason = "time_limit"
                break
            self._update(batches[p.batch : p.batch + group])
            updates += 1
            bar.update(1)
            if p.step % c.log_every == 0:
                r = self.steps.write(p, len(batches), self._lr(), clock.start)
                loss, tok_s = (
                    f"{r['train_loss']:.3f}",
                    f"{r['tokens_per_s']:,.0f}",
                )
                bar.set_postfix(loss=loss, tok_s=tok_s, lr=f"{r['lr']:.2e}")
        bar.close()
        p.epoch_seconds += _sync(self.device) - start
        self.fraction = p.batch / len(batches)
        return reason, updates

    def _update(self, update: list[np.ndarray]) -> None:
        """One update over a group of batches, of which this process collates
        its share."""
        c, p, env, tok = (
            self.config,
            self.progress,
            self.env,
            self.data.tokenizer,
        )
        mine = _collate_share(
            self.train, update, tok, self.model_config.max_len, env
        )
        every = np.concatenate(update)
        tokens = int(self.tgt_lengths[every].sum())
        seed_update(c.seed, p.step, env.rank)
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
        p.batch += len(update)
        p.epoch_tokens += tokens
        p.epoch_flops += float(self.pair_flops[every].sum())
        self.loss_acc += loss
        self.steps.add(loss, tokens)

    def _lr(self) -> float:
        """The learning rate of the last update (equation 3)."""
        c, d_model = self.config, self.model_config.d_model
        return noam_lr(
            self.progress.step,
            d_model=d_model,
            warmup=c.warmup,
            factor=c.lr_factor,
        )

    # -- the end of an epoch, and of the run
    # --------------------------------------------------

    def _end_period(self, *, kind: str) -> None:
        """Validate, record the metrics, and write a checkpoint (the end of an
        epoch, or a stop)."""
        c, p = self.config, self.progress
        started = time.perf_counter()
        p.epoch_loss_sum += all_sum([self.loss_acc.item()], self.device)[0]
        self.loss_acc.zero_()
        validation = self._validate(self.model)
        if kind == "epoch":
            p.epoch += 1
        epoch = (
            float(p.epoch)
            if kind == "epoch"
            else round(p.epoch + self.fraction, 4)
        )
        wall = p.wall_time + time.perf_counter() - self.clock.start
        peak = (
            c.peak_flops * self.env.world_size
            if self.device.type == "cuda"
            else None
        )
        record = _epoch_record(
            kind, epoch, p, validation, self._lr(), wall, peak
        )
        self.log(_epoch_line(record, c.epochs))
        if kind == "epoch":  # the next epoch starts from zero
            p.batch, p.epoch_loss_sum, p.epoch_tokens = 0, 0.0, 0
            p.epoch_seconds, p.epoch_flops = 0.0, 0.0
        if self.env.is_main:
            # The record first: a resumed run drops records newer than its
            # checkpoint.
            append_jsonl(self.out / "metrics.jsonl", record)
            name = (
                f"epoch-{p.epoch:03d}"
                if kind == "epoch"
                else f"step-{p.step:07d}"
            )
            self._save(self.out / "checkpoints" / name)
        barrier()
        self.clock.reserve = 1.5 * (time.perf_counter() - started)

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
        p, env = self.progress, self.env
        wall_time = p.wall_time + time.perf_counter() - self.clock.start
        saved = dataclasses.replace(
            p, wall_time=wall_time, processes=env.world_size
        )
        state = {"optimizer": self.optimizer.state_dict()}
        state["scheduler"] = self.scheduler.state_dict()
        write_checkpoint(
            folder,
            self.model,
            record=run_record(
                self.config, self.model_config, self.data.tokenizer
            ),
            tokenizer=self.data.tokenizer,
            trainer_state=state,
            progress=saved,
        )
        prune_checkpoints(self.out, self.config.average_last)

    def _average(self) -> None:
        """Average the last `average_last` epoch checkpoints into out/average
        and validate it."""
        c, p, tokenizer = self.config, self.progress, self.data.tokenizer
        chosen = _last_epochs(self.out, c.average_last)
        if len(chosen) < 2:
            return
        averaged = Transformer(self.model_config).to(self.device)
        load_tensors_into(
            averaged, average_checkpoints(chosen), "averaged checkpoints"
        )
        validation = self._validate(averaged)
        names = [path.name for path in chosen]
        record = {
            "kind": "average",
            "epoch": float(p.epoch),
            "step": p.step,
            "averaged": names,
            **validation.metrics(),
            "wall_time": p.wall_time + time.perf_counter() - self.clock.start,
        }
        self.log(f"average of {', '.join(names)}: " + _metrics_text(record))
        if self.env.is_main:
            append_jsonl(self.out / "metrics.jsonl", record)
            run = run_record(c, self.model_config, tokenizer) | {
                "averaged": names
            }
            write_checkpoint(
                self.out / "average", averaged, record=run, tokenizer=tokenizer
            )
        barrier()


def train(
    config: TrainConfig,
    *,
    resume: bool = False,
    data: TrainingData | None = None,
    echo: bool = True,
) -> TrainResult:
    """Train as `config` says, in one process or, under torchrun, in several.

    With `resume`, continue the run in the output folder from its latest
    checkpoint. `data` replaces the Multi30k cache (tests); `echo=False` writes
    the log to train.log only.
    """
    env = Distributed.from_environ()
    owns_group = env.world_size > 1 and not dist.is_initialized()
    if owns_group:
        device = device_for(config.device, env)
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
# The paper's recipe was made for WMT's 4.5 million English–German sentence pairs and eight
# GPUs. Multi30k's 29,000 training pairs are less than 1% of that, so the book changes the
# following, and keeps everything else (post-norm layers, sinusoidal positions, one embedding
# table shared by source, target and output, label smoothing 0.1, Adam with $\beta_2 = 0.98$
# and the schedule of equation (3)):
#
# | | the paper (base) | the book's recipe | why |
# | --- | --- | --- | --- |
# | layers, $d_{model}$, $d_{ff}$, $h$ | 6 + 6, 512, 2048, 8 | 3 + 3, 256, 512, 8 | small data favours a small model: 6.0M parameters instead of 48M; the base model learned far more slowly on the same batches |
# | dropout $P_{drop}$ | 0.1 | 0.3 | with 0.1 the validation loss turns up after epoch 16 while the training loss keeps falling; 0.3 is also the paper's value for its big English–German model |
# | tokens per batch and side | about 25,000 | at most 3,000 | an epoch holds about 420,000 tokens per side: 160 updates an epoch instead of 20 |
# | warm-up | 4,000 updates | 800 updates | 4,000 would warm up for 25 epochs; 800 is five |
# | learning-rate factor | 1 | 0.7 | a peak of $1.5 \cdot 10^{-3}$, against the paper's $7 \cdot 10^{-4}$ for batches eight times larger |
# | length of training | 100,000 updates | 35 epochs, about 5,600 updates | the validation loss is still falling slowly at epoch 35 |
# | checkpoint averaging | last 5, 10 minutes apart | last 5 epochs | the same idea, counted in epochs |
# | arithmetic on a GPU | (not stated) | float32 | a model this small is limited by launching its many small kernels, not by arithmetic: bfloat16 is slower |
#
# The runs behind the measured rows are in the appendix
# [The experiments behind the recipe](94_experiments.ipynb).
# `multi30k_recipe` is the recipe as a `TrainConfig`, and `--config multi30k` on the command line
# selects it.


# %%
#| export train_config
def multi30k_recipe(pair: str, **overrides: Any) -> TrainConfig:
    """The recipe of the book's Multi30k models (the table above) as a
    TrainConfig."""
    fields = dict(
        pair=pair,
        model="small",
        model_overrides=dict(
            n_layers=3, d_model=256, n_heads=8, d_ff=512, dropout=0.3
        ),
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
from transformer.schedule import noam_lr
from transformer.train_config import multi30k_recipe

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
    f"{n_params:,} parameters, peak learning rate {peak_lr:.2e} at update"
    f" {recipe.warmup}"
)

# %% [markdown]
# ## The book's two runs
#
# The two models the book ships were trained with this recipe on one NVIDIA H100 GPU, in under
# eight minutes each. Their `metrics.jsonl` files are in `checkpoints/de-en` and
# `checkpoints/fr-en`:

# %% tags=["nbval-ignore-output"]
from transformer.data import DATA_DIR
from transformer.files import read_jsonl
from transformer.plots import use_book_renderer

use_book_renderer()
shipped = DATA_DIR.parents[1] / "checkpoints"
rows = []
for pair in ("de-en", "fr-en"):
    for r in read_jsonl(shipped / pair / "metrics.jsonl"):
        if r["kind"] == "epoch":
            rows.append(
                dict(
                    pair=pair,
                    epoch=r["epoch"],
                    split="training",
                    loss=r["train_loss"],
                )
            )
            rows.append(
                dict(
                    pair=pair,
                    epoch=r["epoch"],
                    split="validation",
                    loss=r["val_loss"],
                )
            )
curves = pd.DataFrame(rows).round(4)
alt.Chart(curves).mark_line().encode(
    x=alt.X("epoch:Q", title="epoch"),
    y=alt.Y("loss:Q", title="label-smoothed loss per token (nats)"),
    color=alt.Color("split:N", title=None),
    column=alt.Column("pair:N", title=None),
    tooltip=["pair", "split", "epoch", "loss"],
).properties(width=260, height=200)

# %% [markdown]
# Both validation losses fall fast for ten epochs and slowly after. The training loss, measured
# with dropout, starts higher and crosses below the validation loss after 10 to 12 epochs, from
# when the model fits its training sentences better than unseen ones; the gap widens, but the
# validation loss keeps falling, so dropout 0.3 keeps the model from overfitting within 35
# epochs. The average of the last five epochs validates a little lower than the last epoch:

# %%
for pair in ("de-en", "fr-en"):
    records = read_jsonl(shipped / pair / "metrics.jsonl")
    last = [r for r in records if r["kind"] == "epoch"][-1]
    average = [r for r in records if r["kind"] == "average"][-1]
    assert average["val_loss"] < last["val_loss"]
    print(
        f"{pair}: epoch {last['epoch']:g} validation loss"
        f" {last['val_loss']:.3f}, perplexity per token"
        f" {last['val_ppl_token']:.2f}; average {average['val_loss']:.3f},"
        f" {average['val_ppl_token']:.2f}"
    )

# %% [markdown]
# On the test set `test_2016_flickr`, translated with beam search, the averaged models score
# 41.6 (German→English) and 53.1 (French→English) sacreBLEU; the results chapter measures them.
#
# ## A quick run on the CPU
#
# On a machine without a GPU (or with `TRANSFORMER_QUICK=1` in the environment) the next cells
# run in **quick mode**: a tiny model, two layers of width 64, trained on German→English for 60
# updates of at most 1,500 tokens per side, about a fifth of one epoch. That is enough to see
# the loop at work, not to translate. On a GPU the same cell trains with the recipe. The run goes
# into a temporary folder.

# %%
from transformer.train import train
from transformer.train_config import quick_config, quick_mode

if quick_mode():
    print(
        "QUICK MODE (no GPU, or TRANSFORMER_QUICK=1): a tiny model trained for"
        " 60 updates,"
    )
    print("to show the loop at work; it is not the book's trained model")
    config = quick_config("de-en", out_dir=tempfile.mkdtemp(prefix="quick-"))
else:
    config = multi30k_recipe(
        "de-en", out_dir=tempfile.mkdtemp(prefix="de-en-")
    )
config

# %% tags=["nbval-ignore-output"]
result = train(config)
print(f"stopped: {result.stopped} after {result.step} updates")

# %% [markdown]
# The run's folder holds its settings, its log, its metrics and its checkpoint:

# %%
run = Path(config.out_dir)
assert result.step == 60 or not quick_mode()
for path in sorted(run.rglob("*")):
    if path.is_file():
        print(path.relative_to(run))

# %% [markdown]
# The training loss every `log_every` updates (from `steps.jsonl`) falls from about that of a
# uniform guess over the 8,000 tokens as the model learns the most frequent tokens first. The
# validation loss (from `metrics.jsonl`) is measured after each epoch, and where a run stops
# inside one, as the quick run does: its one point is at the end.

# %% tags=["nbval-ignore-output"]
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

# %% [markdown]
# The quick model's validation metrics are far from the shipped model's, as 60 updates should
# leave them, but well below a uniform guess:

# %% tags=["nbval-ignore-output"]
from transformer.loss import smoothed_target_entropy

last = metrics.iloc[-1]
assert steps["train_loss"].iloc[-1] < steps["train_loss"].iloc[0] - 2.0
uniform_guess = math.log(8000) - smoothed_target_entropy(0.1, 8000)
assert last["val_loss"] < uniform_guess - 2
print(f"uniform guess {uniform_guess:.2f}")
print(
    f"validation after {int(last['step'])} updates: "
    + ", ".join(
        f"{k} {last[k]:.3f}"
        for k in ("val_loss", "val_ppl_token", "val_ppl_word", "val_accuracy")
    )
)

# %% [markdown]
# ## Summary
#
# - An update feeds the decoder the reference shifted right (teacher forcing), sums the
#   label-smoothed loss of every target token of a few micro-batches, divides by their token
#   count, and takes one Adam step on the schedule of equation (3).
# - Validation measures the same loss without dropout, with the NLL, the perplexities per
#   token and per word, and the token accuracy; BLEU comes later, with decoding.
# - `train(config)` runs epochs of token-bucketed batches, validates, and writes a checkpoint
#   each epoch, then averages the last five; a stopped run resumes exactly.
# - On Multi30k the recipe is a smaller model, more dropout, smaller batches and a shorter
#   warm-up than the paper's; it trains in minutes on one GPU.
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

# %% tags=["remove-cell"]
# The temporary folders of this chapter's runs.
import shutil

shutil.rmtree(run, ignore_errors=True)
