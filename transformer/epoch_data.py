# Generated from chapters/a05_run_setup.ipynb: edit it, not this file.
"""What a training run trains on, epoch by epoch: the splits from the encoded
cache, the checks that every sentence and every epoch fit the run's batches,
each epoch's batches and, under BPE-dropout, each epoch's spelling."""

# %% auto #0
__all__ = [
    "TrainingData",
    "load_training_data",
    "epoch_batches",
    "check_longest",
    "updates_per_epoch",
    "dropped_warning",
    "prepare_epochs",
    "EpochSplits",
]

# %% ../chapters/a05_run_setup.ipynb #57424a89

import functools
import multiprocessing
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np

from transformer.bpe_dropout import BPEDropout
from transformer.checked_batches import checked_token_batches
from transformer.distributed import Distributed, barrier
from transformer.encoded_cache import load_encoded, prepare
from transformer.encoded_split import EncodedSplit
from transformer.multi30k import DataError
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
            config.cache_dir,
            vocab_size=config.vocab_size,
            data_dir=config.data_dir,
        )
        splits = [
            load_encoded(
                config.pair,
                split,
                config.cache_dir,
                data_dir=config.data_dir,
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
    return checked_token_batches(
        train.src_lengths + 1,  # + <eos>
        train.tgt_lengths + 1,  # + <bos> (input) or <eos> (output)
        max_tokens=config.max_tokens,
        seed=config.seed,
        epoch=epoch,
    )


# %% ../chapters/a05_run_setup.ipynb #ac92befc
def check_longest(
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


# %% ../chapters/a05_run_setup.ipynb #815ee999
def prepare_epochs(
    config: TrainConfig,
    data: TrainingData,
    max_len: int,
    processes: int,
    epoch: int,
) -> tuple["EpochSplits", int]:
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
    check_longest(config, data, max_len, bpe)
    # The batches of the epoch to come, in BPE's own spelling (BPE-dropout
    # changes their number only slightly): an epoch must give at least one
    # update.
    first = len(epoch_batches(data.train, epoch, config))
    updates_per_epoch(first, config.accumulation, processes)
    return EpochSplits(data.train, bpe, config), first


class EpochSplits:
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
