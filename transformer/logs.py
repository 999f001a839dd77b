# Generated from chapters/a07_trainer.ipynb: edit it, not this file.
"""What a training run writes: its first line; as it goes, the progress bar,
train.log and the lines of steps.jsonl and metrics.jsonl; at its end, the table
of its epochs."""

# %% auto #0
__all__ = [
    "starting_from",
    "start_line",
    "progress_bar",
    "show_step",
    "Log",
    "StepLog",
    "epoch_record",
    "average_record",
    "metrics_text",
    "epoch_line",
    "summary_table",
]

# %% ../chapters/a07_trainer.ipynb #a8abe46a

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
