"""The comparison runs kept under experiments/runs/<pair>/<run>/: each run's training
configuration and metrics, the run it is compared with, what differs between the two, and how
much the difference moves the validation perplexity per word. The experiments appendix reads
the runs through this module.

A folder holds `train_config.json` and `metrics.jsonl` (the trainer's records: one per epoch,
one per average of the last epochs' weights), and for some runs the scripts' reports:
`word_level.json` (word_level_report), `averages.json` (average_windows) and `ensemble.json`
(ensemble_report). The shipped models' folders, checkpoints/<pair>, are read as the run
`shipped`.
"""

import json
from collections.abc import Collection
from pathlib import Path

from transformer import layout
from transformer.files import read_jsonl
from transformer.train_config import TrainConfig
from transformer.translation import CHECKPOINTS_DIR

RUNS_DIR = Path(__file__).resolve().parent / "runs"
SHIPPED = "shipped"
CPU_BASELINE = (
    "dropout-0.2-cpu"  # the recipe's model at dropout 0.2, 20 epochs on a CPU
)
# Runs compared with another than the rule of `reference` gives: each one's own twin.
TWINS = {
    "no-label-smoothing": "dropout-0.2",
    "recipe-seed-1-cpu-60-epochs": "recipe-seed-1-cpu",
}
# The question each run asks, in the order the appendix answers them.
QUESTIONS = {
    "chance": ["dropout-0.2-cpu-seed-1", "recipe-seed-1-cpu"],
    "dropout": [
        "dropout-0.1-cpu",
        "dropout-0.2-cpu",
        "dropout-0.2",
        "dropout-0.4-cpu",
        "inner-dropout-cpu",
    ],
    "label smoothing": [
        "no-label-smoothing",
        "label-smoothing-0.05-cpu",
        "label-smoothing-0.2-cpu",
    ],
    "size": ["d_ff-1024", "base", "base-lr-0.45", "base-dropout-0.3"],
    "depth and norm order": [
        "4-layers",
        "4-layers-cpu",
        "4-layers-lr-0.35-cpu",
        "pre-norm-cpu",
        "4-layers-pre-norm-cpu",
        "recipe-pre-norm-cpu",
        "recipe-pre-norm-cpu-seed-1",
        "recipe-4-layers-pre-norm-cpu",
        "recipe-4-layers-pre-norm-cpu-seed-1",
    ],
    "vocabulary": [
        "vocab-4000-cpu",
        "vocab-4000-cpu-seed-1",
        "vocab-12000-cpu",
        "bpe-dropout-cpu",
        "bpe-dropout-source-cpu",
    ],
    "batch size": ["tokens-1500-cpu", "tokens-6000-cpu"],
    "length": ["110-epochs", "recipe-seed-1-cpu-60-epochs"],
}
QUESTION = {run: question for question, names in QUESTIONS.items() for run in names}


def read_run(folder: Path) -> tuple[dict, list[dict]]:
    """A run's training configuration and metric records: a comparison run's folder, or a
    shipped model's (whose config.json holds the training configuration under `train`)."""
    folder = Path(folder)
    if (folder / "train_config.json").is_file():
        config = json.loads((folder / "train_config.json").read_text())
    else:
        config = json.loads((folder / layout.CONFIG).read_text())["train"]
    return config, read_jsonl(folder / layout.METRICS)


def runs(
    pair: str, runs_dir: Path = RUNS_DIR, checkpoints_dir: Path = CHECKPOINTS_DIR
) -> dict[str, tuple[dict, list[dict]]]:
    """Run name -> (training configuration, metrics) for a pair: the shipped run first, then
    the comparison runs by name."""
    found = {SHIPPED: read_run(Path(checkpoints_dir) / pair)}
    for folder in sorted(p for p in (Path(runs_dir) / pair).iterdir() if p.is_dir()):
        found[folder.name] = read_run(folder)
    return found


def trained_on(name: str, config: dict) -> str:
    """Where a run trained: a CPU (float32), or a GPU in float32 or under bfloat16 autocast
    (`bf16` unset: autocast on a GPU)."""
    if "cpu" in name.split("-"):
        return "CPU"
    return "GPU, float32" if config.get("bf16") is False else "GPU, bfloat16"


def settings(config: dict) -> dict[str, object]:
    """What a run's recipe sets: the model's shape and dropout, and the training's."""
    train = TrainConfig.from_dict(config)
    model = train.model_config(train.vocab_size)
    return {
        "layers": model.n_layers,
        "d_model": model.d_model,
        "d_ff": model.d_ff,
        "dropout": model.dropout,
        "attention/FFN dropout": (model.attention_dropout, model.ffn_dropout),
        "pre-norm": model.norm_first,
        "label smoothing": train.label_smoothing,
        "vocabulary": train.vocab_size,
        "tokens per batch": train.max_tokens,
        "warm-up": train.warmup,
        "lr factor": train.lr_factor,
        "BPE-dropout": (train.bpe_dropout, train.bpe_dropout_sides)
        if train.bpe_dropout
        else 0.0,
        "seed": train.seed,
        "epochs": train.epochs,
    }


def differences(name: str, config: dict, ref_name: str, ref_config: dict) -> str:
    """What a run changes against its reference, in a few words: each setting that differs,
    with the run's value, and the machine where it differs."""
    mine, theirs = settings(config), settings(ref_config)
    changed = []
    for key, value in mine.items():
        if value == theirs[key]:
            continue
        if key == "BPE-dropout":
            value = f"{value[0]} ({value[1]})" if value else "off"
        elif key == "attention/FFN dropout":
            value = "/".join(map(str, value))
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        elif key in ("vocabulary", "tokens per batch", "warm-up"):
            value = f"{value:,}"
        changed.append(f"{key} {value}")
    if trained_on(name, config) != trained_on(ref_name, ref_config):
        changed.append(trained_on(name, config))
    return ", ".join(changed)


def reference(name: str, config: dict, names: Collection[str]) -> str:
    """The run, among `names`, that a comparison run is measured against: its twin where it
    has one, the CPU baseline for a run of at most 20 epochs on a CPU (a twin that changes
    one thing, or two), and otherwise the shipped run of its pair."""
    if name in TWINS:
        return TWINS[name]
    short = trained_on(name, config) == "CPU" and config["epochs"] <= 20
    if short and name != CPU_BASELINE and CPU_BASELINE in names:
        return CPU_BASELINE
    return SHIPPED


def epochs(metrics: list[dict]) -> dict[int, dict]:
    """Epoch number -> its record."""
    return {int(r["epoch"]): r for r in metrics if r["kind"] == "epoch"}


def average(metrics: list[dict]) -> dict:
    """The record of the run's average; a run continued after it ended has one per end, and
    the last counts."""
    return [r for r in metrics if r["kind"] == "average"][-1]


def effect(metrics: list[dict], ref_metrics: list[dict]) -> tuple[float, str]:
    """How much a run changes the validation perplexity per word against its reference, as
    (ratio - 1, what was compared): the two averaged models where the run is at least as
    long as its reference, otherwise the two runs after the run's last epoch (an average of a
    run's last epochs is only as late as the run)."""
    mine, theirs = epochs(metrics), epochs(ref_metrics)
    if max(mine) >= max(theirs):
        ratio = average(metrics)["val_ppl_word"] / average(ref_metrics)["val_ppl_word"]
        return ratio - 1, "averages"
    last = max(mine)
    ratio = mine[last]["val_ppl_word"] / theirs[last]["val_ppl_word"]
    return ratio - 1, f"epoch {last}"
