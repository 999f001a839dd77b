"""Score a trained model word by word on the validation split and write the summary beside a
comparison run's metrics, as word_level.json (the training chapter reads it):

    python tools/word_level_report.py /root/runs/d2-de-en/average \
        checkpoints/de-en/comparison/dropout-0.2-cpu

The model folder is a run's `average/` (or any checkpoint folder `load_model` reads); the
comparison folder keeps only metrics, so this file is what is left of the weights' word-level
scores: the perplexities and accuracies of `word_level_evaluation` and its tokens grouped by how
often the training split has them (`by_frequency`). The pair is the model's vocabulary's.
Needs spaCy.
"""

import argparse
import json
import sys
from pathlib import Path

from transformer.data import load_pairs
from transformer.evaluate import write_lines
from transformer.train import (
    CheckpointError,
    by_frequency,
    english_training_counts,
    load_model,
    word_level_evaluation,
)


def report(model_folder: Path) -> dict:
    model, tokenizer = load_model(model_folder)
    w = word_level_evaluation(model, tokenizer, load_pairs("val", tokenizer.pair))
    return {
        "split": "val",
        "words": w.words,
        "units": w.units,
        "ppl_word": w.ppl_word,
        "ppl_unit": w.ppl_unit,
        "accuracy": w.accuracy,
        "unit_accuracy": w.unit_accuracy,
        "groups": by_frequency(w, english_training_counts()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a folder load_model reads")
    parser.add_argument("dest", type=Path, help="the comparison run's folder")
    args = parser.parse_args()
    if not (args.dest / "metrics.jsonl").is_file():
        sys.exit(f"{args.dest} is not a comparison run's folder (no metrics.jsonl)")
    try:
        summary = report(args.model)
    except CheckpointError as err:
        sys.exit(f"cannot load a model from {args.model}: {err}")
    out = args.dest / "word_level.json"
    write_lines(out, [json.dumps(summary, indent=1)])
    print(
        f"{out}: ppl/word {summary['ppl_word']:.3f}, ppl/unit {summary['ppl_unit']:.3f}"
    )


if __name__ == "__main__":
    main()
