"""The comparison runs as the experiments appendix reads them: every kept run is read, asks one
question, and is measured against a reference that exists, with what differs named."""

import pytest

from experiments import comparison
from experiments.comparison import QUESTION, SHIPPED
from transformer.multi30k import PAIRS


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
