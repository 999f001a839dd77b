r"""Validate averages of consecutive epoch checkpoints of one run and write them beside a
comparison run's metrics, as averages.json (the experiments appendix reads it):

    python -m experiments.average_windows /root/keep/recipe-s1-60 \
        experiments/runs/de-en/recipe-seed-1-cpu-60-epochs

The first folder holds the run's epoch checkpoints, `epoch-NNN/` each with its
`model.safetensors` and `config.json`. The trainer keeps only the last `average_last` of them,
so a run whose other windows are wanted needs its epochs copied aside as it trains (or a large
`--average-last`); gaps are allowed. Every window of K consecutive kept epochs (`--k`, default
5) is averaged as the trainer averages (float64 sums) and validated as the trainer validates
after each epoch (teacher forcing, the run's label smoothing and batch size), so the numbers
compare with its `metrics.jsonl` (under the autocast the run had, if any); so are the
last epoch alone, the last 10 where they are all kept, and the last stretch of epochs without a
gap. Needs the pair's encoded cache, built with the run's vocabulary (checked), not spaCy.
A bad input is one line on standard error and exit status 2; a `--device` that this machine
does not have (cuda without a GPU) is refused before any checkpoint is read.
"""

import argparse
import json
from pathlib import Path
from typing import NoReturn

import torch

from transformer import layout
from transformer.checkpoint import (
    CheckpointError,
    check_compatible,
    load_model,
    load_tensors_into,
    read_record,
)
from transformer.encoded_cache import load_encoded
from transformer.encoded_split import EncodedSplit, iterate_batches
from transformer.multi30k import DataError
from transformer.precision import autocast_type, stored_precision
from transformer.split_translation import write_lines
from transformer.tokenizer import Tokenizer, TokenizerError
from transformer.train_config import TrainConfig
from transformer.training_checkpoints import average_checkpoints
from transformer.validation import count_words, validate


def epoch_folders(folder: Path) -> dict[int, Path]:
    """epoch number -> checkpoint folder, for the epoch-NNN folders that hold weights."""
    found = {
        int(path.name.removeprefix(layout.EPOCH)): path
        for path in folder.glob(f"{layout.EPOCH}[0-9][0-9][0-9]")
        if (path / layout.WEIGHTS).is_file()
    }
    if len(found) < 2:
        raise CheckpointError(f"{folder} holds fewer than two epoch checkpoints")
    return found


def windows(epochs: list[int], k: int) -> list[tuple[int, int]]:
    """(first, last) epochs of the windows to average, each of consecutive kept epochs: every
    window of k ending at a kept epoch; the last 1 and 10; and the last stretch without gaps."""
    kept, last = set(epochs), epochs[-1]
    stretch = last
    while stretch - 1 in kept:
        stretch -= 1
    wanted = [(end - k + 1, end) for end in epochs]
    wanted += [(last, last), (last - 9, last), (stretch, last)]
    whole = {w for w in wanted if kept.issuperset(range(w[0], w[1] + 1))}
    return sorted(whole, key=lambda w: (w[1] - w[0], w[1]))


def report(
    folder: Path,
    k: int,
    cache_dir: Path,
    *,
    val: EncodedSplit | None = None,
    device: str = "cpu",
) -> dict:
    """The windows' validation metrics, on `device`; `val` instead of the pair's cached
    split, if given."""
    found = epoch_folders(folder)
    epochs = sorted(found)
    train = read_record(found[epochs[-1]])["train"]
    model, tokenizer = load_model(found[epochs[-1]], device=device)
    if val is None:  # the cache's ids must be the checkpoint's vocabulary's
        val = load_encoded(tokenizer.pair, "val", cache_dir)
        cached = Tokenizer.load(Path(cache_dir) / tokenizer.pair / layout.TOKENIZER)
        check_compatible(found[epochs[-1]], model_config=model.config, tokenizer=cached)
    # the autocast the trainer had: the run's precision (one stored before the field: bf16
    # on a GPU unless its bf16 flag said otherwise)
    precision = TrainConfig.from_dict(train).precision
    autocast = autocast_type(stored_precision(precision, torch.device(device).type))
    batches = list(
        iterate_batches(
            val,
            tokenizer,
            max_tokens=train["max_tokens"],
            shuffle=False,
            max_len=model.config.max_len,
        )
    )
    words = count_words(tokenizer, val)
    rows = []
    chosen_windows = windows(epochs, k)
    if not any(last - first + 1 == k for first, last in chosen_windows):
        raise CheckpointError(f"{folder} has no {k} consecutive kept epochs")
    for first, last in chosen_windows:
        chosen = [found[e] for e in range(first, last + 1)]
        load_tensors_into(
            model, average_checkpoints(chosen), f"{folder} {first}-{last}"
        )
        validation = validate(
            model,
            batches,
            pad_id=tokenizer.pad_id,
            smoothing=train["label_smoothing"],
            words=words,
            autocast=autocast,
        )
        rows.append({"first": first, "last": last, **validation.metrics()})
        print(
            f"epochs {first}-{last}: ppl/word {rows[-1]['val_ppl_word']:.3f}",
            flush=True,
        )
    return {"split": "val", "pair": tokenizer.pair, "windows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("epochs", type=Path, help="a folder of epoch-NNN checkpoints")
    parser.add_argument("dest", type=Path, help="the comparison run's folder")
    parser.add_argument("--k", type=int, default=5, help="epochs per sliding window")
    parser.add_argument("--cache-dir", type=Path, default=Path("cache"))
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda where there is one"
    )
    args = parser.parse_args()

    # A bad input: one line on standard error and status 2, as the package's commands.
    def fail(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if not (args.dest / layout.METRICS).is_file():
        fail(f"{args.dest} is not a comparison run's folder (no {layout.METRICS})")
    if args.k < 1:
        fail(f"--k must be at least 1, got {args.k}")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        fail(f"--device {args.device!r} is not a device: choose cpu, or cuda")
    if device.type not in {"cpu", "cuda"}:
        fail(f"--device {args.device}: choose cpu, or cuda where there is one")
    # torch would fail only once the first checkpoint is moved, with a traceback
    if device.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device {args.device}, but no CUDA GPU is available")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        last = torch.cuda.device_count() - 1
        fail(f"--device {args.device}, but the GPUs here are cuda:0 to cuda:{last}")
    try:
        summary = report(args.epochs, args.k, args.cache_dir, device=args.device)
    except (CheckpointError, DataError, TokenizerError) as err:
        fail(str(err))
    write_lines(args.dest / "averages.json", [json.dumps(summary, indent=1)])


if __name__ == "__main__":
    main()
