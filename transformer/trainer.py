# Generated from chapters/a07_trainer.ipynb: edit it, not this file.
"""A training run of Vaswani et al. (2017)'s model: the `Trainer` makes the
training chapter's updates epoch after epoch, validates, checkpoints and
resumes exactly, in one process or several (torchrun).

Imports neither Altair, pandas nor spaCy: a GPU machine trains from the encoded
cache.
"""

# %% auto #0
__all__ = ["TrainResult", "Trainer", "train"]

# %% ../chapters/a07_trainer.ipynb #1c5330d5

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

from . import layout


# %% ../chapters/a07_trainer.ipynb #f7d9e74e
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


# %% ../chapters/a07_trainer.ipynb #7466c11d
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


# %% ../chapters/a07_trainer.ipynb #45b27491
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


# %% ../chapters/a07_trainer.ipynb #b763384a
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


# %% ../chapters/a07_trainer.ipynb #9c67d2df
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
