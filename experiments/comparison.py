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

import dataclasses
import json
from collections.abc import Collection
from pathlib import Path

from transformer import layout
from transformer.config import TransformerConfig
from transformer.precision import stored_precision
from transformer.records import read_jsonl
from transformer.train_config import TrainConfig, fixed_on_resume
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
# How the table names a setting, in the order it lists them. A field shares a label with the
# one it qualifies; a field not named here is listed under its own name, after these.
LABELS = {
    "n_layers": "layers",
    "d_model": "d_model",
    "d_ff": "d_ff",
    "dropout": "dropout",
    "attention_dropout": "attention/FFN dropout",
    "ffn_dropout": "attention/FFN dropout",
    "norm_first": "pre-norm",
    "label_smoothing": "label smoothing",
    "vocab_size": "vocabulary",
    "max_tokens": "tokens per batch",
    "warmup": "warm-up",
    "lr_factor": "lr factor",
    "bpe_dropout": "BPE-dropout",
    "bpe_dropout_sides": "BPE-dropout",
    "seed": "seed",
    "epochs": "epochs",
}
# Fixed on resume, but shown through the model they make, or (the precision) where the run
# trained.
_MODEL_CHOICE = ("pair", "preset", "model_overrides", "precision")
# The model's settings are sizes, written without a thousands separator (d_ff 2048).
_MODEL_LABELS = {
    LABELS.get(f.name, f.name) for f in dataclasses.fields(TransformerConfig)
}


def read_run(folder: Path) -> tuple[dict, list[dict]]:
    """A run's training configuration and metric records: a comparison run's folder, or a
    shipped model's (whose config.json holds the training configuration under `train`)."""
    folder = Path(folder)
    if (folder / layout.RUN_CONFIG).is_file():
        config = json.loads((folder / layout.RUN_CONFIG).read_text())
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


ARITHMETIC = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def trained_on(name: str, config: dict) -> str:
    """Where a run trained: a CPU (float32), or a GPU in its precision (a run stored before
    the field, with `bf16` unset, under bfloat16 autocast)."""
    if "cpu" in name.split("-"):
        return "CPU"
    precision = stored_precision(TrainConfig.from_dict(config).precision, "cuda")
    return f"GPU, {ARITHMETIC[precision]}"


def settings(config: dict) -> dict[str, object]:
    """What a run's recipe sets, under the table's labels: every field of its model but the
    vocabulary sizes, every training field fixed on resume (those that decide the updates),
    and the epochs. Read from the dataclasses, so that a new option is listed without an edit;
    fields that share a label give a tuple."""
    train = TrainConfig.from_dict(config)
    model = train.model_config(train.vocab_size).to_dict()
    values = {k: v for k, v in model.items() if not k.endswith("vocab_size")}
    fixed = [k for k in fixed_on_resume(type(train)) if k not in _MODEL_CHOICE]
    values |= {k: getattr(train, k) for k in [*fixed, "epochs"]}
    if not train.bpe_dropout:  # off: its sides are no setting
        values["bpe_dropout_sides"] = None
    order = [*LABELS, *(k for k in values if k not in LABELS)]
    found: dict[str, list] = {}
    for name in sorted(values, key=order.index):
        found.setdefault(LABELS.get(name, name), []).append(values[name])
    return {label: v[0] if len(v) == 1 else tuple(v) for label, v in found.items()}


def shown(label: str, value: object) -> str:
    """A setting's value as the table writes it."""
    if label == "BPE-dropout":
        rate, sides = value
        return f"{rate} ({sides})" if rate else "off"
    if isinstance(value, tuple):
        return "/".join(shown(label, v) for v in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and label not in _MODEL_LABELS:
        return f"{value:,}"
    return str(value)


def differences(name: str, config: dict, ref_name: str, ref_config: dict) -> str:
    """What a run changes against its reference, in a few words: each setting that differs,
    with the run's value, and the machine where it differs."""
    mine, theirs = settings(config), settings(ref_config)
    changed = []
    for key, value in mine.items():
        if value == theirs[key]:
            continue
        changed.append(f"{key} {shown(key, value)}")
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
