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
# # The Trainer
#
# [Setting up a run](a05_run_setup.ipynb) describes a run and reads its data;
# [Checkpoints](a06_checkpoints.ipynb) saves it. This appendix trains it: the training chapter's
# update on several processes and in 16-bit arithmetic, the optimiser, validation, R-Drop, an
# update's FLOPs, and the `Trainer`, which trains epoch after epoch within a time limit, logs,
# checkpoints and resumes exactly; last, the recipe's cost on common GPUs, and Colab.

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
#| default_exp trainer

# %%
import math
import tempfile
from pathlib import Path

import torch

from transformer.batches import collate
from transformer.config import TransformerConfig
from transformer.loss import LabelSmoothingLoss
from transformer.model import Transformer
from transformer.training_loop import batch_log_probs

torch.manual_seed(0)
torch.set_printoptions(precision=4)
scratch = Path(tempfile.mkdtemp())  # the runs of this appendix

# %% [markdown]
# ## The update
#
# The training chapter's `train_step` makes an update in one process, in float32. A run's update
# computes the same, with three additions:
#
# - **Several processes.** Under DDP ([Setting up a run](a05_run_setup.ipynb)) each process scales
#   its loss by $P / N$ instead of $1 / N$, since DDP divides the summed gradients by $P$, and
#   exchanges gradients only after the last micro-batch (`sync_gradients`).
# - **16-bit arithmetic.** On a GPU the forward pass can run under autocast, in bfloat16 or float16
#   (the run's `precision`), float16 with a `GradScaler`; the schedule counts only the updates
#   taken.
# - **Copies that overlap.** Batches go to the device with `non_blocking=True`, and the summed loss
#   stays there: reading a GPU value waits for the GPU.
#
# `trainer_step` also refuses a loss that is not summed and an update without tokens.

# %%
#| export trainer_step
"""The update of a training run: the training chapter's `train_step` on
several processes (DistributedDataParallel) and under 16-bit autocast, with a
float16 run's loss scaling."""

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.distributed import ddp_processes, sync_gradients
from transformer.loss import LabelSmoothingLoss
from transformer.training_loop import batch_log_probs


def trainer_step(
    model: nn.Module,
    batches: Sequence[Batch],
    *,
    criterion: LabelSmoothingLoss,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    tokens: int,
    autocast: torch.dtype | None = None,
    scaler: torch.amp.GradScaler | None = None,
) -> Tensor:
    """One update with the gradient of (summed loss) / `tokens`, as
    `train_step`'s; `tokens` counts the real target tokens of the whole update,
    of every process. `autocast`: the type of the forward pass's matrix
    products; `scaler` scales a float16 run's loss. Returns the summed loss,
    detached, on the model's device."""
    if criterion.reduction != "sum":  # the division by `tokens` comes below
        raise ValueError(f"need reduction='sum', got {criterion.reduction!r}")
    if not batches or tokens <= 0:
        raise ValueError(f"no batches or no tokens: {len(batches)}, {tokens}")
    scale = ddp_processes(model) / tokens  # 1 / N in one process
    device = next(model.parameters()).device
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), device=device)
    for k, batch in enumerate(batches):
        batch = batch.to(device, non_blocking=True)
        with sync_gradients(model, k == len(batches) - 1):
            on = autocast is not None
            with torch.autocast(device.type, dtype=autocast, enabled=on):
                log_probs = batch_log_probs(
                    model, batch, pad_id=criterion.pad_id
                )
            loss = criterion(log_probs, batch.tgt_out)  # summed over tokens
            scaled = loss * scale
            if scaler is not None:  # float16: lifts small gradients off 0
                scaled = scaler.scale(scaled)
            scaled.backward()  # adds to the gradients
        total += loss.detach()
    if scaler is None:
        optimizer.step()
        scheduler.step()
    else:  # unscales the gradients; skips the step if one overflowed
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        if scaler.get_scale() >= scale:  # taken: the schedule counts it
            scheduler.step()
    return total


# %% [markdown]
# In one process and in float32, `trainer_step` makes the chapter's update exactly: three updates
# of a tiny model over two micro-batches each end with the same weights, bit for bit.

# %%
from transformer.schedule import make_optimizer
from transformer.trainer_step import trainer_step
from transformer.training_loop import train_step

tiny = TransformerConfig(
    src_vocab_size=13, d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0
)
g = torch.Generator().manual_seed(0)
pairs = [(s, s) for s in torch.randint(3, 13, (8, 6), generator=g).tolist()]
ids = dict(pad_id=0, bos_id=1, eos_id=2)  # then ten symbols, 3 to 12
parts = [collate(pairs[:3], **ids), collate(pairs[3:], **ids)]
tokens = sum(batch.n_tgt_tokens for batch in parts)
weights, losses = [], []
for step in (train_step, trainer_step):
    torch.manual_seed(0)
    model = Transformer(tiny)
    optimizer, scheduler = make_optimizer(model, d_model=32, warmup=10)
    criterion = LabelSmoothingLoss(pad_id=0, reduction="sum")
    for _ in range(3):
        loss = step(
            model,
            parts,
            criterion=criterion,
            optimizer=optimizer,
            scheduler=scheduler,
            tokens=tokens,
        )
    weights.append(model.state_dict())
    losses.append(float(loss))
assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
print(f"the last update's loss per token: {losses[0] / tokens:.4f}, both")
assert math.isclose(losses[0], losses[1], rel_tol=1e-6)  # summed in float32

# %% [markdown]
# In float16 a gradient past 65,504, float16's largest number, is infinite. The `GradScaler`
# multiplies the loss by a scale before the backward pass and divides the gradients by it before
# Adam's step; it skips an update whose gradients overflow, leaving the weights as they were, and
# halves its scale until the gradients fit; a run of updates without overflow doubles it. PyTorch
# runs float16 autocast on a CPU too, so here it runs, from a scale set too high:

# %%
torch.manual_seed(0)
model = Transformer(tiny)
optimizer, scheduler = make_optimizer(model, d_model=32, warmup=10)
step = dict(criterion=criterion, optimizer=optimizer, scheduler=scheduler)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**24)
fp16 = dict(autocast=torch.float16, scaler=scaler)
taken = []  # whether each update changed the weights
while not any(taken) and len(taken) < 24:
    before = [p.detach().clone() for p in model.parameters()]
    trainer_step(model, parts, tokens=tokens, **fp16, **step)
    after = model.parameters()
    changed = (
        not torch.equal(a, b) for a, b in zip(before, after, strict=True)
    )
    taken.append(any(changed))
skipped = taken.index(True)
print(f"{skipped} updates skipped, one taken at scale {scaler.get_scale():g}")
assert skipped > 0 and scaler.get_scale() == 2.0**24 / 2**skipped

# %% [markdown]
# ## The optimiser
#
# The schedule chapter's `make_optimizer` takes a model. A run's optimiser, the same Adam on the
# same `noam_schedule`, takes what `torch.optim` takes: a model, its parameters, or parameter
# groups. It refuses what would go wrong silently: no parameters, an empty group, or a group with
# its own `"lr"`, which `LambdaLR` would multiply by the schedule. On a GPU it runs PyTorch's fused
# Adam, one kernel per update.

# %%
#| export trainer_optimizer
"""The optimiser of a training run: the schedule chapter's Adam and learning
rate over a model, its parameters or parameter groups, checked, and fused on a
GPU."""

from collections.abc import Iterable

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from transformer.schedule import (
    ADAM_BETAS,
    ADAM_EPS,
    WARMUP_STEPS,
    noam_schedule,
)


def _param_groups(params: nn.Module | Iterable) -> list:
    """The parameters as torch.optim takes them: a model's as a list, and each
    group's "params" as a list (a generator would be used up by the checks, and
    one tensor is one parameter, not its rows)."""
    if isinstance(params, nn.Module):
        return list(params.parameters())

    def listed(p: torch.Tensor | Iterable) -> list:
        return [p] if isinstance(p, torch.Tensor) else list(p)

    return [
        p | {"params": listed(p["params"])} if isinstance(p, dict) else p
        for p in params
    ]


def trainer_optimizer(
    model_or_params: nn.Module | Iterable[torch.Tensor] | Iterable[dict],
    *,
    d_model: int,
    warmup: int = WARMUP_STEPS,
    factor: float = 1.0,
    fused: bool | None = None,
) -> tuple[torch.optim.Adam, LambdaLR]:
    """`make_optimizer`'s Adam and schedule over a model, parameters or
    parameter groups. `fused=None`: fused when every parameter is on CUDA."""
    params = _param_groups(model_or_params)
    groups = [p["params"] if isinstance(p, dict) else [p] for p in params]
    if not groups or not all(groups):
        raise ValueError(
            "trainer_optimizer got no parameters (or an empty group)"
        )
    if any(isinstance(p, dict) and "lr" in p for p in params):
        # LambdaLR would multiply a group's own lr by the schedule.
        raise ValueError(
            "a parameter group sets its own lr: the schedule sets every"
            " group's learning rate (use factor= to scale it)"
        )
    if fused is None:
        fused = all(
            t.is_cuda and t.is_floating_point() for g in groups for t in g
        )
    optimizer = torch.optim.Adam(
        params, lr=1.0, betas=ADAM_BETAS, eps=ADAM_EPS, fused=fused
    )
    schedule = dict(d_model=d_model, warmup=warmup, factor=factor)
    return optimizer, noam_schedule(optimizer, **schedule)


# %% [markdown]
# Two parameter groups on the schedule's rate, and the silent mistake, named:

# %%
from torch import nn

from transformer.trainer_optimizer import trainer_optimizer

layers = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
groups = [{"params": layer.parameters()} for layer in layers]
optimizer, scheduler = trainer_optimizer(groups, d_model=64, warmup=10)
for group in optimizer.param_groups:
    print(f"{len(group['params'])} tensors, lr {group['lr']:.2e}")
try:
    trainer_optimizer(
        [{"params": layers.parameters(), "lr": 1e-3}], d_model=64
    )
except ValueError as err:
    print("ValueError:", err)

# %% [markdown]
# ## Validation
#
# Validation measures the label-smoothed loss, the NLL, the perplexities per token and per word,
# and the token accuracy (the training chapter defines them). `token_stats` returns sums and
# counts, which add up across batches and processes; the means come last. The perplexity is per
# subword token, `<eos>` included, as the paper's is "per wordpiece".

# %%
#| export validation
"""Teacher-forced validation of Vaswani et al. (2017)'s model: the
label-smoothed loss, the NLL and perplexities per token and per word, and the
token accuracy, as sums that add up across batches and processes."""

import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.distributed import world_size
from transformer.encoded_split import EncodedSplit
from transformer.loss import LabelSmoothingLoss, check_log_probs
from transformer.tokenizer import Tokenizer
from transformer.training_loop import batch_log_probs


@dataclass(frozen=True)
class TokenStats:
    """Sums over real (non-padding) target tokens; add them up across batches,
    then read means."""

    nll_sum: float = 0.0
    correct: int = 0
    tokens: int = 0

    def __add__(self, other: "TokenStats") -> "TokenStats":
        return TokenStats(
            self.nll_sum + other.nll_sum,
            self.correct + other.correct,
            self.tokens + other.tokens,
        )

    def _count(self) -> int:
        if self.tokens == 0:
            raise ValueError(
                "no target tokens were counted: the means are undefined"
            )
        return self.tokens

    @property
    def nll(self) -> float:
        """Mean negative log-likelihood per token, in nats, unsmoothed."""
        return self.nll_sum / self._count()

    @property
    def perplexity(self) -> float:
        """e^nll: per subword token, <eos> included (the paper's per-wordpiece
        perplexity)."""
        return math.exp(self.nll)

    @property
    def accuracy(self) -> float:
        """Share of real target tokens whose most probable prediction is the
        right one."""
        return self.correct / self._count()


@torch.no_grad()
def token_stats(
    log_probs: Tensor, target: Tensor, *, pad_id: int
) -> TokenStats:
    """Unsmoothed NLL, correct predictions and token count of one batch,
    padding ignored.

    Shapes:
        log_probs: (B, T, V) or (N, V); target: (B, T) or (N,)
    """
    check_log_probs(log_probs, target)
    real = target != pad_id  # (B, T)
    index = target.masked_fill(~real, 0).unsqueeze(-1)  # (B, T, 1)
    nll = -log_probs.gather(-1, index).squeeze(-1).double()  # (B, T)
    correct = (log_probs.argmax(dim=-1) == target) & real
    return TokenStats(
        nll_sum=nll[real].sum().item(),
        correct=int(correct.sum()),
        tokens=int(real.sum()),
    )


# %% [markdown]
# Two parts of a batch add up to the whole, and on random logits the accuracy is about one in
# $V$ and the perplexity of the order of $V$: the numbers a model starts from.

# %%
from transformer.validation import token_stats

V = 8  # a toy vocabulary; id 0 is <pad>
g = torch.Generator().manual_seed(0)
log_probs = torch.randn(10_000, V, dtype=torch.float64, generator=g)
log_probs = log_probs.log_softmax(-1)
target = torch.randint(1, V, (10_000,), generator=g)
whole = token_stats(log_probs, target, pad_id=0)
halves = [slice(0, 3000), slice(3000, None)]
parts = [token_stats(log_probs[h], target[h], pad_id=0) for h in halves]
assert (parts[0] + parts[1]).correct == whole.correct
assert math.isclose((parts[0] + parts[1]).nll, whole.nll)
print(f"accuracy {whole.accuracy:.3f} (1/V = {1 / V:.3f})")
print(f"perplexity {whole.perplexity:.1f} (V = {V})")
assert abs(whole.accuracy - 1 / V) < 0.01 and V / 2 < whole.perplexity < 2 * V

# %% [markdown]
# The word count, and the sums of a whole validation set:


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
def validate(
    model: nn.Module,
    batches: Iterable[Batch],
    *,
    pad_id: int,
    smoothing: float,
    words: int | None = None,
    autocast: torch.dtype | None = None,
) -> Validation:
    """Teacher-forced validation metrics, in eval mode, under `autocast`'s type
    if given; summed over processes when distributed."""
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    loss_sum, stats = 0.0, TokenStats()
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        on = autocast is not None
        with torch.autocast(device.type, dtype=autocast, enabled=on):
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
# ## R-Drop
#
# R-Drop {cite:p}`liang2021rdrop` passes each training sentence through the model twice, with
# independent dropout masks, and pulls the two predictions $P_1$ and $P_2$ together. `doubled`
# stacks a batch on itself, so one forward pass makes both, and `RDropLoss` returns
#
# $$
# \sum_t \Big(\tfrac12\big(L(P_1) + L(P_2)\big)
# + \tfrac{\alpha}{4}\big(\mathrm{KL}(P_1 \| P_2) + \mathrm{KL}(P_2 \| P_1)\big)\Big)
# $$
#
# over the real target tokens $t$, with $L$ the label-smoothed loss: R-Drop's loss halved, so
# that dividing by one copy's tokens keeps the book's scale. Not in the Transformer paper,
# `r_drop` ($\alpha$) is off by default; on, each sentence costs a second pass.

# %%
#| export rdrop
"""R-Drop (Liang et al. 2021): a symmetric KL term between two dropout passes
of each training sentence, added to the label-smoothed loss."""

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.batches import Batch
from transformer.loss import LabelSmoothingLoss, check_log_probs


def doubled(batch: Batch) -> Batch:
    """The batch followed by itself: one forward pass, two dropout masks."""
    tensors = ("src", "tgt_in", "tgt_out", "index")
    return dataclasses.replace(
        batch,
        **{n: torch.cat([getattr(batch, n)] * 2) for n in tensors},
        n_src_tokens=2 * batch.n_src_tokens,
        n_tgt_tokens=2 * batch.n_tgt_tokens,
    )


class RDropLoss(nn.Module):
    """½(L(P1) + L(P2)) + α/4 · Σ (KL(P1 ‖ P2) + KL(P2 ‖ P1)), summed over
    real target tokens: R-Drop's loss halved, so that `train_step`'s division
    by the tokens of one copy keeps the per-token scale of `base`.

    Shapes: log_probs (2B, T, V), the two copies of a `doubled` batch; target
    (2B, T); returns a scalar
    """

    def __init__(self, base: LabelSmoothingLoss, alpha: float) -> None:
        super().__init__()
        if base.reduction != "sum":
            raise ValueError(
                f"R-Drop needs a base loss with reduction='sum', got"
                f" {base.reduction!r}"
            )
        if isinstance(alpha, bool) or not (
            isinstance(alpha, int | float) and 0 <= alpha < math.inf
        ):
            raise ValueError(f"alpha must be finite and >= 0, got {alpha!r}")
        self.base, self.alpha = base, alpha
        self.pad_id, self.reduction = base.pad_id, "sum"  # as train_step asks

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"

    def forward(self, log_probs: Tensor, target: Tensor) -> Tensor:
        check_log_probs(log_probs, target)
        if target.dim() == 0 or target.size(0) % 2:
            raise ValueError(
                f"R-Drop needs a doubled batch (an even number of rows),"
                f" got target {tuple(target.shape)}"
            )
        p1, p2 = log_probs.float().chunk(2)  # (B, T, V) each
        # kl_div(a, b) is KL(b ‖ a) at each position and entry of V
        kl = F.kl_div(p1, p2, log_target=True, reduction="none").sum(-1)
        kl = kl + F.kl_div(p2, p1, log_target=True, reduction="none").sum(-1)
        real = target.chunk(2)[0] != self.pad_id  # (B, T)
        symmetric = kl.masked_fill(~real, 0.0).sum()
        return 0.5 * self.base(log_probs, target) + self.alpha / 4 * symmetric


# %% [markdown]
# Without dropout the copies agree: the KL term is 0 and the loss, $\tfrac12(L_1 + L_2)$, is one
# copy's. With dropout the KL term makes it larger:

# %%
from transformer.rdrop import RDropLoss, doubled

cfg = TransformerConfig.small(16, n_layers=1, d_model=32, n_heads=2, d_ff=64)
model = Transformer(cfg)
pairs = [([5, 6, 7], [8, 9]), ([10, 11], [12, 13, 14])]
batch = doubled(collate(pairs, pad_id=0, bos_id=1, eos_id=2))
base = LabelSmoothingLoss(pad_id=0, reduction="sum")
for dropout in (False, True):
    model.train(dropout)
    with torch.no_grad():
        log_probs = batch_log_probs(model, batch, pad_id=0)
        mean = base(log_probs, batch.tgt_out).item() / 2
        r_drop = RDropLoss(base, alpha=1.0)(log_probs, batch.tgt_out).item()
    print(f"dropout {dropout}: ½(L1 + L2) {mean:.3f}, R-Drop {r_drop:.3f}")
    same = math.isclose(r_drop, mean, rel_tol=1e-5)
    assert same if not dropout else r_drop > mean


# %% [markdown]
# ## What an update costs
#
# A run reports its speed as the model FLOPs utilisation (MFU): the arithmetic the model needs,
# over the time taken and the GPU's peak rate. [Derivations and counts](a11_counts.ipynb) derives
# and checks the FLOPs of a training step for a pair of $S$ source and $T$ target tokens, which
# `training_flops` computes; the Trainer sums it over each update's pairs.

# %%
#| export flops
"""Parameter and FLOP counts of the Transformer: the cost of a training step,
for MFU."""

from collections.abc import Sequence

import numpy as np
from torch import nn

from transformer.distributed import unwrap


def non_embedding_parameters(model: nn.Module) -> tuple[int, int]:
    """N_enc and N_dec: the parameters of the encoder and decoder stacks."""
    model = unwrap(model)
    return (
        sum(p.numel() for p in model.encoder.parameters()),
        sum(p.numel() for p in model.decoder.parameters()),
    )


def cross_attention_kv_parameters(model: nn.Module) -> int:
    """N_kv: the parameters of the decoder's cross-attention key and value
    projections, which are applied to the source positions."""
    return sum(
        p.numel()
        for layer in unwrap(model).decoder.layers
        for projection in (layer.cross_attn.w_k, layer.cross_attn.w_v)
        for p in projection.parameters()
    )


def training_flops(
    model: nn.Module, *, src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> np.ndarray:
    """FLOPs of a forward and backward pass over each (source, target) pair, by
    the formula 6·((N_enc + N_kv)·S + (N_dec − N_kv + d_model·V)·T) +
    12·d_model·(L_e·S² + L_d·T² + L_d·S·T).

    Lengths count real tokens (<eos> of the source, <bos> or <eos> of the
    target included).
    """
    n_enc, n_dec = non_embedding_parameters(model)
    n_kv = cross_attention_kv_parameters(model)
    config = unwrap(model).config
    d, layers, vocab = (
        config.d_model,
        config.n_layers,
        config.target_vocab_size,
    )
    s = np.asarray(src_lengths, dtype=np.float64)
    t = np.asarray(tgt_lengths, dtype=np.float64)
    linear = 6 * ((n_enc + n_kv) * s + (n_dec - n_kv + d * vocab) * t)
    attention = 12 * d * (layers * s**2 + layers * t**2 + layers * s * t)
    return linear + attention


# %% [markdown]
# ## The Trainer
#
# `train(config)` does a whole run; `Trainer` holds its state: the model, the optimiser, the
# batches, and `Progress`, where the run stands. `__init__` checks the output folder, loads the
# data, checks that every sentence fits, builds the model from the run's seed and, resuming, loads
# the latest checkpoint; `run` trains epoch after epoch until the last, `max_steps` or the time
# limit, then averages the last `average_last` epoch checkpoints. Each line of `metrics.jsonl`
# names its `kind`: `epoch`, `partial` (a stop inside an epoch) or `average`; the run in "Exact
# resume" prints each kind's fields.

# %%
#| export
"""A training run of Vaswani et al. (2017)'s model: the `Trainer` makes the
training chapter's updates epoch after epoch, validates, checkpoints and
resumes exactly, in one process or several (torchrun).

Imports neither Altair, pandas nor spaCy: a GPU machine trains from the encoded
cache.
"""

import dataclasses
import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LRScheduler

from transformer import layout
from transformer.batches import Batch
from transformer.checked_batches import checked_collate
from transformer.checkpoint import Progress
from transformer.config import TransformerConfig
from transformer.distributed import (
    Distributed,
    all_sum,
    device_for,
    seed_update,
)
from transformer.encoded_split import EncodedSplit, iterate_batches
from transformer.epoch_data import (
    TrainingData,
    dropped_warning,
    epoch_batches,
    load_training_data,
    prepare_epochs,
    updates_per_epoch,
)
from transformer.flops import training_flops
from transformer.logs import (
    Log,
    StepLog,
    average_record,
    epoch_line,
    epoch_record,
    metrics_text,
    progress_bar,
    show_step,
    start_line,
    starting_from,
)
from transformer.loss import LabelSmoothingLoss
from transformer.model import Transformer
from transformer.precision import autocast_type
from transformer.rdrop import RDropLoss, doubled
from transformer.records import read_jsonl
from transformer.tokenizer import Tokenizer
from transformer.train_config import TrainConfig
from transformer.trainer_optimizer import trainer_optimizer
from transformer.trainer_step import trainer_step
from transformer.training_checkpoints import (
    RunFolder,
    averaged_model,
    last_epochs,
    resume_point,
    run_precision,
    run_record,
    trainer_state,
)
from transformer.validation import Validation, count_words, validate


# %% [markdown]
# Then the helpers of the set-up: the model, its wrappers, the run's folder and each process's
# batches.


# %%
#| export
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
    Transformer,
    torch.optim.Optimizer,
    LRScheduler,
    LabelSmoothingLoss | RDropLoss,
]:
    """The model, initialised from the run's seed, Adam with the schedule, and
    the training loss (validation makes its own, without R-Drop)."""
    torch.manual_seed(config.seed)
    model = Transformer(model_config).to(device)
    optimizer, scheduler = trainer_optimizer(
        model,
        d_model=model_config.d_model,
        warmup=config.warmup,
        factor=config.lr_factor,
    )
    smoothing = config.label_smoothing
    criterion = LabelSmoothingLoss(
        pad_id=pad_id, smoothing=smoothing, reduction="sum"
    )
    if config.r_drop > 0:
        criterion = RDropLoss(criterion, config.r_drop)
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


def _validator(
    data: TrainingData,
    config: TrainConfig,
    max_len: int,
    env: Distributed,
    autocast: torch.dtype | None,
) -> Callable[[nn.Module], Validation]:
    """Validation of a model on this process's share of the batches, the
    words of all the references counted."""
    val = iterate_batches(
        data.val,
        data.tokenizer,
        max_tokens=config.max_tokens,
        shuffle=False,
        max_len=max_len,
    )
    return functools.partial(
        validate,
        batches=list(val)[env.rank :: env.world_size],
        pad_id=data.tokenizer.pad_id,
        smoothing=config.label_smoothing,
        words=count_words(data.tokenizer, data.val),
        autocast=autocast,
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
        checked_collate(
            [train[i] for i in index],
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            index=index,
            max_len=max_len,
        )
        for index in update[env.rank :: env.world_size]
    ]


# %% [markdown]
# ### The time limit
#
# `time_limit` (minutes) stops a run early enough to validate and save, so that a long run on
# machines lent for minutes at a time is a chain of resumed ones. Before each update the run asks
# the clock, which reserves the time of validating and saving (measured at each epoch's end) and
# the longest stretch between two checks. With several processes the first decides and broadcasts
# its answer every 10 updates, since a broadcast waits for every process.

# %%
#| export
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


# %% [markdown]
# ### What a run writes
#
# In a module of their own: `train.log`'s first line (where the run starts, in which precision),
# the progress bar, the lines of `steps.jsonl` and `metrics.jsonl`, and the table of epochs that
# the command line prints at the end:

# %%
#| export logs
"""What a training run writes: its first line; as it goes, the progress bar,
train.log and the lines of steps.jsonl and metrics.jsonl; at its end, the table
of its epochs."""

import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm import tqdm

from transformer.checkpoint import Progress
from transformer.distributed import Distributed, all_sum
from transformer.records import append_jsonl
from transformer.train_config import TrainConfig
from transformer.validation import Validation


def starting_from(checkpoint: Path | None, resume: bool, out: Path) -> str:
    """Where a run starts: from a checkpoint, or from scratch."""
    if checkpoint is not None:
        return f"resuming from {checkpoint}"
    # The same command, repeated across stops, starts the run the first time.
    if resume:
        return f"nothing to resume in {out}: starting a new run"
    return "starting"


def start_line(
    where: str,
    config: TrainConfig,
    model: nn.Module,
    env: Distributed,
    device: torch.device,
    why: str,
) -> str:
    """The log's first line: where the run starts, its model, processes and
    arithmetic (`why`: how its precision was chosen)."""
    n = sum(p.numel() for p in model.parameters())
    return (
        f"{where}: {config.pair}, model {config.preset}"
        f" {config.model_overrides or ''} ({n:,} parameters), {env.world_size}"
        f" process(es) on {device}, precision {config.precision} ({why}),"
        f" compile {config.compile}"
    )


def progress_bar(
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


def show_step(bar: tqdm, r: dict[str, Any]) -> None:
    """A steps.jsonl line beside the progress bar."""
    loss, tok_s = f"{r['train_loss']:.3f}", f"{r['tokens_per_s']:,.0f}"
    bar.set_postfix(loss=loss, tok_s=tok_s, lr=f"{r['lr']:.2e}")


class Log:
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


class StepLog:
    """The lines of steps.jsonl: the training loss and throughput since the
    last line."""

    def __init__(self, path: Path | None, device: torch.device) -> None:
        self.path, self.device = path, device
        self.start, self.tokens = time.perf_counter(), 0  # since the last line
        self.loss = torch.zeros((), device=device, dtype=torch.float64)

    def restart(self, now: float) -> None:
        """Count afresh from `now`."""
        self.start, self.tokens = now, 0
        self.loss.zero_()

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


def epoch_record(
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


def average_record(
    p: Progress, names: list[str], validation: Validation, wall_time: float
) -> dict[str, Any]:
    """The line of metrics.jsonl for the average of the checkpoints
    `names`."""
    return {
        "kind": "average",
        "epoch": float(p.epoch),
        "step": p.step,
        "averaged": names,
        **validation.metrics(),
        "wall_time": wall_time,
    }


def metrics_text(r: dict[str, Any]) -> str:
    return (
        f"val loss {r['val_loss']:.3f}, ppl/word {r['val_ppl_word']:.2f}, "
        f"ppl/token {r['val_ppl_token']:.2f}, accuracy {r['val_accuracy']:.1%}"
    )


def epoch_line(r: dict[str, Any], epochs: int) -> str:
    mfu = f", MFU {r['mfu']:.1%}" if r.get("mfu") is not None else ""
    return (
        f"epoch {r['epoch']:g}/{epochs} step {r['step']:,}: train loss"
        f" {r['train_loss']:.3f}, "
        + metrics_text(r)
        + f", {r['tokens_per_s']:,.0f} tok/s{mfu}, lr {r['lr']:.2e}"
    )


def summary_table(records: list[dict[str, Any]]) -> str:
    """The epochs of a run (and its average) as a small text table."""
    head = (
        f"{'epoch':>7} {'step':>8} {'train loss':>10} {'val loss':>8}"
        f" {'ppl/word':>8} {'accuracy':>8} {'tok/s':>9} {'MFU':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in records:
        epoch = "average" if r["kind"] == "average" else f"{r['epoch']:g}"
        train_loss = f"{r['train_loss']:.3f}" if "train_loss" in r else ""
        tok_s = f"{r['tokens_per_s']:,.0f}" if "tokens_per_s" in r else ""
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else ""
        lines.append(
            f"{epoch:>7} {r['step']:>8,} {train_loss:>10}"
            f" {r['val_loss']:>8.3f} {r['val_ppl_word']:>8.2f}"
            f" {r['val_accuracy']:>8.1%} {tok_s:>9} {mfu:>6}"
        )
    return "\n".join(lines)


# %% [markdown]
# The trainer's own helpers: an epoch's pairs, and what a run returns:


# %%
#| export
@dataclass(frozen=True)
class _EpochPairs:
    """An epoch's training pairs as it spells them, and what its updates count
    of each pair: the target tokens and the FLOPs of its passes."""

    train: EncodedSplit
    tgt_tokens: np.ndarray  # (pairs,)
    flops: np.ndarray  # (pairs,)

    @classmethod
    def from_split(
        cls, train: EncodedSplit, model: nn.Module, r_drop: float
    ) -> Self:
        """The pairs `train` that `model` trains on, R-Drop if `r_drop`."""
        # a source with its <eos>; a target with its <bos> (input) or <eos>
        src, tgt = train.src_lengths + 1, train.tgt_lengths + 1
        passes = 2 if r_drop > 0 else 1  # R-Drop: two passes of each pair
        flops = training_flops(model, src_lengths=src, tgt_lengths=tgt)
        return cls(train, tgt, passes * flops)


@dataclass(frozen=True)
class TrainResult:
    out_dir: Path
    stopped: str  # "completed", "max_steps" or "time_limit"
    step: int
    metrics: list[dict[str, Any]]


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
        self.env = env = Distributed.from_environ()
        self.device = device_for(config.device, env)
        self.clock = _Clock(config.time_limit, env, self.device)
        self.out = config.out_dir
        checkpoint = resume_point(self.out, config, env, resume=resume)
        precision, why = run_precision(config, self.device, checkpoint)
        # the run's config records the precision it trains in
        self.config = c = dataclasses.replace(config, precision=precision)
        self.data = data if data is not None else load_training_data(c)
        tokenizer = self.data.tokenizer
        self.model_config = c.model_config(tokenizer.vocab_size)
        max_len = self.model_config.max_len
        epoch = Progress.read(checkpoint).epoch if checkpoint else 0
        self.epoch_splits, first = prepare_epochs(
            c, self.data, max_len, env.world_size, epoch
        )
        # With a GPU a second process spells the next epoch while this one
        # trains; on a CPU the training itself keeps every core busy.
        self.epoch_splits.prefetch = self.device.type == "cuda"
        self.model, self.optimizer, self.scheduler, self.criterion = _build(
            c, self.model_config, self.device, tokenizer.pad_id
        )
        fp16 = precision == "fp16"  # its loss scaled
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=fp16)
        record = run_record(c, self.model_config, tokenizer)
        self.folder = RunFolder(c, env, record, tokenizer)
        self.progress = self.folder.open(
            checkpoint, self.model, self.optimizer, self.scheduler, self.scaler
        )
        self.step_model = _wrap(self.model, c, env, self.device)
        self.autocast = autocast_type(precision)
        self.validate = _validator(self.data, c, max_len, env, self.autocast)
        self.loss_acc = torch.zeros(
            (), device=self.device, dtype=torch.float64
        )
        self.lr = 0.0  # the learning rate of the last update
        steps = self.out / layout.STEPS if env.is_main else None
        self.steps = StepLog(steps, self.device)
        # Opened last, so that a set-up error leaves no file open.
        main = self.out / layout.LOG if env.is_main else None
        self.log = Log(main, echo and env.is_main)
        where = starting_from(checkpoint, resume, self.out)
        self.log(start_line(where, c, self.model, env, self.device, why))
        self.log(f"config: {json.dumps(c.to_dict())}", echo=False)
        if warning := dropped_warning(first, c.accumulation, env.world_size):
            self.log(warning)

    # -- the epochs

    def run(self) -> TrainResult:
        c, p = self.config, self.progress
        stopped, trained = "completed", False
        try:
            while p.epoch < c.epochs:
                if c.max_steps is not None and p.step >= c.max_steps:
                    stopped = "max_steps"
                    break
                reason, updates, fraction = self._train_epoch()
                trained = trained or updates > 0
                if reason is not None:
                    if updates > 0:
                        self._end_period(kind="partial", fraction=fraction)
                    stopped = reason
                    break
                self._end_period(kind="epoch")
            averaged = (self.out / layout.AVERAGE).exists()
            if stopped != "time_limit" and (trained or not averaged):
                self._average()
        finally:
            self.log.close()
            self.epoch_splits.close()
        metrics = read_jsonl(self.out / layout.METRICS)
        return TrainResult(self.out, stopped, p.step, metrics)

    def _train_epoch(self) -> tuple[str | None, int, float]:
        """Updates until the epoch ends (None) or the run must stop (the
        reason); returns it, the updates made and the share of the epoch's
        batches used."""
        c, p, env, clock = self.config, self.progress, self.env, self.clock
        pairs = _EpochPairs.from_split(
            self.epoch_splits(p.epoch), self.model, c.r_drop
        )
        batches = epoch_batches(pairs.train, p.epoch, c)
        group = c.accumulation * env.world_size
        total = updates_per_epoch(len(batches), c.accumulation, env.world_size)
        self.model.train()
        done = min(p.batch // group, total)
        bar = progress_bar(total, done, p.epoch, c.epochs, env.is_main)
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
            self._update(pairs, batches[p.batch : p.batch + group])
            updates += 1
            bar.update(1)
            if p.step % c.log_every == 0:
                r = self.steps.write(p, len(batches), self.lr, clock.start)
                show_step(bar, r)
        bar.close()
        p.epoch_seconds += _sync(self.device) - start
        return reason, updates, p.batch / len(batches)

    def _update(self, pairs: _EpochPairs, update: list[np.ndarray]) -> None:
        """One update over a group of batches of `pairs`, of which this process
        collates its share."""
        c, p, env = self.config, self.progress, self.env
        tok, max_len = self.data.tokenizer, self.model_config.max_len
        mine = _collate_share(pairs.train, update, tok, max_len, env)
        if c.r_drop > 0:  # both dropout passes in one batch
            mine = [doubled(batch) for batch in mine]
        every = np.concatenate(update)
        tokens = int(pairs.tgt_tokens[every].sum())  # of one copy
        seed_update(c.seed, p.step, env.rank)
        self.lr = self.scheduler.get_last_lr()[0]  # this update's (equation 3)
        loss = trainer_step(
            self.step_model,
            mine,
            criterion=self.criterion,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            tokens=tokens,
            autocast=self.autocast,
            scaler=self.scaler,
        )
        p.step += 1
        p.batch += len(update)
        p.epoch_tokens += tokens
        p.epoch_flops += float(pairs.flops[every].sum())
        self.loss_acc += loss
        self.steps.add(loss, tokens)

    # -- the end of an epoch, and of the run

    def _end_period(self, *, kind: str, fraction: float = 1.0) -> None:
        """Validate, record the metrics, and write a checkpoint: the end of an
        epoch, or a stop (`kind` "partial") after `fraction` of its batches."""
        c, p = self.config, self.progress
        started = time.perf_counter()
        p.epoch_loss_sum += all_sum([self.loss_acc.item()], self.device)[0]
        self.loss_acc.zero_()
        validation = self.validate(self.model)
        if kind == "epoch":
            p.epoch += 1
            epoch, name = float(p.epoch), layout.epoch_folder(p.epoch)
        else:
            epoch = round(p.epoch + fraction, 4)
            name = layout.step_folder(p.step)
        wall = self._wall_time()
        peak = c.peak_flops * self.env.world_size
        peak = peak if self.device.type == "cuda" else None
        record = epoch_record(kind, epoch, p, validation, self.lr, wall, peak)
        self.log(epoch_line(record, c.epochs))
        if kind == "epoch":  # the next epoch starts from zero
            p.batch, p.epoch_loss_sum, p.epoch_tokens = 0, 0.0, 0
            p.epoch_seconds, p.epoch_flops = 0.0, 0.0
        saved = dataclasses.replace(
            p, wall_time=self._wall_time(), processes=self.env.world_size
        )
        state = trainer_state(self.optimizer, self.scheduler, self.scaler)
        self.folder.save(name, record, self.model, state, saved)
        self.clock.reserve = 1.5 * (time.perf_counter() - started)

    def _wall_time(self) -> float:
        """Seconds of the run so far, this process's and earlier ones'."""
        return self.progress.wall_time + time.perf_counter() - self.clock.start

    def _average(self) -> None:
        """Average the last `average_last` epoch checkpoints into out/average
        and validate it."""
        chosen = last_epochs(self.out, self.config.average_last)
        if len(chosen) < 2:
            return
        averaged = averaged_model(chosen, self.model_config, self.device)
        validation = self.validate(averaged)
        names = [path.name for path in chosen]
        record = average_record(
            self.progress, names, validation, self._wall_time()
        )
        self.log(f"average of {', '.join(names)}: " + metrics_text(record))
        self.folder.save_average(record, averaged)


# %% [markdown]
# `train` runs a `Trainer`, inside a process group when torchrun started the process:


# %%
#| export
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
# ## Exact resume
#
# A run stopped and resumed should end where an uninterrupted one ends, bit for bit; otherwise a
# long run split into jobs would be another experiment. Everything an update depends on is stored
# in the checkpoint or drawn from what is:
#
# | what an update depends on | where it comes from |
# | --- | --- |
# | the weights, Adam's moments and step counts | the checkpoint's safetensors files |
# | the learning rate; a float16 run's loss scale | `trainer.json` |
# | the position in the epoch | `progress.json` |
# | the order of the epoch's batches, and their spelling under BPE-dropout | drawn from (seed, epoch) |
# | the dropout masks | drawn from (seed, update, process) before each update |
#
# No random generator's state is stored. Records written after the checkpoint resumed from are
# dropped, since the resumed run writes them again, and a resume must run as many processes as the
# run it continues. A GPU promises less than a CPU: some kernels add in a varying order from run to
# run. The check, on a tiny model and data set: a run of two epochs, and one stopped after two
# updates, then resumed.

# %%
import textwrap

import numpy as np

from transformer.checkpoint import read_tensors
from transformer.encoded_split import EncodedSplit
from transformer.epoch_data import TrainingData
from transformer.tokenizer import MARK, train_bpe
from transformer.train_config import TrainConfig
from transformer.trainer import train

rng = np.random.default_rng(0)
words = [
    [
        MARK + "".join(rng.choice(list("abcdefgh"), size=rng.integers(1, 4)))
        for _ in range(5)
    ]
    for _ in range(30)
]
tokenizer = train_bpe(words, 40, languages=("de", "en"))


def random_split(n: int) -> EncodedSplit:
    """n pairs of random token sequences of 1 to 7 tokens."""
    sentences = [
        rng.integers(4, tokenizer.vocab_size, rng.integers(1, 8)).tolist()
        for _ in range(2 * n)
    ]
    return EncodedSplit.from_lists(sentences[:n], sentences[n:])


data = TrainingData(tokenizer, random_split(40), random_split(12))
tiny_run = dict(
    pair="de-en",
    model_overrides=dict(n_layers=1, d_model=16, n_heads=2, d_ff=32),
    epochs=2,
    max_tokens=48,
    warmup=5,
    average_last=2,
    device="cpu",
)
straight = train(
    TrainConfig(**tiny_run, out_dir=str(scratch / "straight")),
    data=data,
    echo=False,
)
stopped = TrainConfig(
    **tiny_run, max_steps=2, out_dir=str(scratch / "resumed")
)
first = train(stopped, data=data, echo=False)
second = train(
    TrainConfig(**tiny_run, out_dir=str(scratch / "resumed")),
    resume=True,
    data=data,
    echo=False,
)
print(
    f"stopped: {first.stopped} after {first.step} updates; resumed to"
    f" {second.step}"
)
for folder in ("checkpoints/epoch-002", "average"):
    a = read_tensors(scratch / "straight" / folder / "model.safetensors")
    b = read_tensors(scratch / "resumed" / folder / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
print("the same weights, bit for bit, after two epochs and in the average")
for line in (straight.metrics[0], straight.metrics[-1]):
    fields = f"a line of kind {line['kind']}: " + ", ".join(line)
    print(textwrap.fill(fields, 79, subsequent_indent="  "))

# %% [markdown]
# Resuming with another value of a field that decides the updates is refused:

# %%
from transformer.checkpoint import CheckpointError

try:
    changed = TrainConfig(**tiny_run, seed=1, out_dir=str(scratch / "resumed"))
    train(changed, resume=True, data=data, echo=False)
except CheckpointError as err:
    print("CheckpointError:", str(err).replace(str(scratch), "<tmp>"))
else:
    raise AssertionError("a changed seed was accepted")

# %% [markdown]
# ## On a GPU, and in Colab
#
# A run's precision follows its GPU unless it asks for one ([Setting up a
# run](a05_run_setup.ipynb)); its log's first line names it. The table gives that precision for
# four common GPUs and the time the recipe's 35 epochs of training take in it, validation left out.
# The H100's time is measured (`checkpoints/throughput-h100.json`, [Derivations and
# counts](a11_counts.ipynb)); the others are estimated: training FLOPs per target token
# (`training_flops`, over the validation pairs) times the target tokens of 35 epochs, over the
# GPU's published dense 16-bit rate times the share of its peak that the recipe reaches on the
# H100. A model this small leaves a GPU's matrix units mostly idle, so the estimates only compare
# the cards at equal use of their peaks.

# %%
import json

import pandas as pd

from transformer.flops import training_flops
from transformer.multi30k import load_pairs
from transformer.paths import CHECKPOINTS_DIR
from transformer.precision import precision_for
from transformer.tokenizer import Tokenizer
from transformer.train_config import multi30k_recipe

# compute capability; dense float16 or bfloat16 FLOP/s, NVIDIA's data sheets
GPUS = {
    "T4": ((7, 5), 65e12),
    "L4": ((8, 9), 121e12),
    "A100": ((8, 0), 312e12),
    "H100": ((9, 0), 989e12),  # SXM, as measured
}
tokenizer = Tokenizer.load(CHECKPOINTS_DIR / "de-en" / "tokenizer.json")
recipe = multi30k_recipe("de-en")
with torch.device("meta"):  # shapes without memory
    recipe_model = Transformer(recipe.model_config(tokenizer.vocab_size))
de, en = zip(*load_pairs("val", "de-en"), strict=True)
src = [len(ids) + 1 for ids in tokenizer.encode_batch(de, "de")]  # <eos>
tgt = [len(ids) + 1 for ids in tokenizer.encode_batch(en, "en")]  # <bos>
flops = training_flops(recipe_model, src_lengths=src, tgt_lengths=tgt)
per_token = flops.sum() / sum(tgt)
metrics = (CHECKPOINTS_DIR / "de-en" / "metrics.jsonl").read_text()
tokens = recipe.epochs * json.loads(metrics.splitlines()[0])["train_tokens"]
bench = json.loads((CHECKPOINTS_DIR / "throughput-h100.json").read_text())
speed = {row["variant"]: row["tokens_per_s"] for row in bench}
used = per_token * speed["recipe bf16"] / GPUS["H100"][1]  # of the peak
rows = {}
for name, (capability, rate) in GPUS.items():
    rows[name] = {
        "compute capability": f"{capability[0]}.{capability[1]}",
        "precision": precision_for(capability),
        "recipe (minutes)": round(per_token * tokens / (rate * used) / 60, 1),
        "figure": "measured" if name == "H100" else "estimate from FLOPs",
    }
print(f"{per_token / 1e6:.1f} MFLOP per target token; {tokens:,} tokens")
print(f"the H100 uses {used:.2%} of its peak for the recipe in bfloat16")
assert speed["recipe fp32"] > speed["recipe bf16"]
minutes = tokens / speed["recipe fp32"] / 60
print(f"the recipe in float32 on the H100: {minutes:.1f} minutes (measured)")
pd.DataFrame(rows).T

# %% [markdown]
# The recipe itself asks for float32, as the book's models were trained, and the H100 runs that
# faster still (printed above; [Derivations and counts](a11_counts.ipynb) says why). A T4 has
# tensor cores for float16 only. In Colab, choose a GPU under *Runtime → Change runtime type*, open
# this page with the rocket button, run its first code cell (it clones the repository and installs
# the package), then the recipe in the table's precision for that GPU, here a T4's:
#
# ```
# !python -m transformer train --pair de-en --config multi30k --precision fp16
# ```
#
# The run goes into `runs/de-en`; stopped by Colab, it continues with the same command and
# `--resume`.
