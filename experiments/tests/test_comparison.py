"""The comparison runs as the experiments appendix reads them: every kept run is read, asks one
question, and is measured against a reference that exists, with what differs named."""

import dataclasses

import pytest

from experiments import comparison
from experiments.comparison import QUESTION, SHIPPED
from transformer.multi30k import PAIRS
from transformer.train_config import RATE, RESUME_FIXED, TrainConfig, option


@pytest.mark.parametrize("pair", list(PAIRS))
def test_every_kept_run_has_a_question_and_a_reference(pair: str):
    runs = comparison.runs(pair)
    assert next(iter(runs)) == SHIPPED and len(runs) > 1
    for name, (config, metrics) in runs.items():
        assert comparison.epochs(metrics) and comparison.average(metrics), name
        if name == SHIPPED:
            continue
        assert name in QUESTION, f"{name} is in no question of comparison.QUESTIONS"
        ref = comparison.reference(name, config, runs)
        assert ref in runs and ref != name
        assert comparison.differences(name, config, ref, runs[ref][0]), name


def test_references_differences_and_effects():
    runs = comparison.runs("de-en")

    def against(name: str) -> tuple[str, str, float, str]:
        config, metrics = runs[name]
        ref = comparison.reference(name, config, runs)
        change, compared = comparison.effect(metrics, runs[ref][1])
        return (
            ref,
            comparison.differences(name, config, ref, runs[ref][0]),
            change,
            compared,
        )

    # a 20-epoch CPU twin: one setting, both averages
    ref, changed, change, compared = against("vocab-4000-cpu")
    assert (ref, changed, compared) == (
        "dropout-0.2-cpu",
        "vocabulary 4,000",
        "averages",
    )
    assert change == pytest.approx(
        comparison.average(runs["vocab-4000-cpu"][1])["val_ppl_word"]
        / comparison.average(runs["dropout-0.2-cpu"][1])["val_ppl_word"]
        - 1
    )
    # shorter than its reference: the two runs after its last epoch; the machine is named
    ref, changed, change, compared = against("4-layers")
    assert ref == SHIPPED and compared == "epoch 25"
    assert changed == "layers 4, epochs 25, GPU, bfloat16"
    assert change == pytest.approx(
        comparison.epochs(runs["4-layers"][1])[25]["val_ppl_word"]
        / comparison.epochs(runs[SHIPPED][1])[25]["val_ppl_word"]
        - 1
    )
    # a named twin, and a CPU run of the recipe's length against the shipped one
    assert against("recipe-seed-1-cpu-60-epochs")[:2] == (
        "recipe-seed-1-cpu",
        "epochs 60",
    )
    assert against("recipe-seed-1-cpu")[:2] == (SHIPPED, "seed 1, CPU")
    assert against("bpe-dropout-source-cpu")[1] == "BPE-dropout 0.1 (source)"
    # without a CPU baseline (French→English), a short CPU run is measured against shipped
    fr = comparison.runs("fr-en")
    config = fr["dropout-0.1-cpu"][0]
    assert comparison.reference("dropout-0.1-cpu", config, fr) == SHIPPED


def test_settings_read_every_option_from_the_config(monkeypatch):
    """The settings compared are the model's fields and the fields fixed on resume, read
    from the dataclasses: R-Drop and BPE-dropout's sides are among them, and an option added
    to TrainConfig is listed, under its own name, without an edit here."""
    config, _ = comparison.runs("de-en")[SHIPPED]
    listed = comparison.settings(config)
    assert listed["r_drop"] == 0.0 and listed["BPE-dropout"] == (0.0, None)
    for name in RESUME_FIXED:  # the precision shows where the run trained
        assert name in ("pair", "preset", "model_overrides", "precision") or (
            comparison.LABELS.get(name, name) in listed
        ), name
    assert comparison.trained_on("x", config | {"precision": "fp16"}) == "GPU, float16"
    grad_clip = option(1.0, help="largest gradient norm", on_resume="fixed", check=RATE)
    Clipped = dataclasses.make_dataclass(
        "Clipped", [("grad_clip", float, grad_clip)], bases=(TrainConfig,), frozen=True
    )
    monkeypatch.setattr(comparison, "TrainConfig", Clipped)
    clipped = config | {"grad_clip": 0.5}
    assert comparison.settings(clipped)["grad_clip"] == 0.5
    changed = comparison.differences("clipped", clipped, SHIPPED, config)
    assert changed == "grad_clip 0.5"
    sources = config | {
        "bpe_dropout": 0.1,
        "bpe_dropout_sides": "source",
        "r_drop": 1.0,
    }
    changed = comparison.differences("sources", sources, SHIPPED, config)
    assert changed == "BPE-dropout 0.1 (source), r_drop 1.0"
