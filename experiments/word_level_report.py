r"""Score a trained model word by word on the validation split and write the summary beside a
comparison run's metrics, as word_level.json (the experiments appendix reads it):

    python -m experiments.word_level_report /root/runs/d2-de-en/average \
        experiments/runs/de-en/dropout-0.2-cpu

The model folder is a run's `average/` (or any checkpoint folder `load_model` reads); the
comparison folder keeps only metrics, so this file is what is left of the weights' word-level
scores: the perplexities and accuracies of `word_level_evaluation` and its tokens grouped by how
often the training split has them (`by_frequency`). The pair is the model's vocabulary's.
With `--bleu`, also the sacreBLEU and chrF of the model's translations of the validation
split with the default search (`DecodeOptions()`), under `val_bleu`. Needs spaCy. A bad input
(a folder without a model, a missing or corrupt data file, no spaCy) is one line on standard
error and exit status 2.
"""

import argparse
import json
from pathlib import Path
from typing import NoReturn

from experiments.words import (
    by_frequency,
    english_training_counts,
    word_level_evaluation,
)
from transformer import layout
from transformer.checked_data import load_pairs
from transformer.checkpoint import CheckpointError, load_model
from transformer.decode_options import DecodeOptions
from transformer.evaluate import score
from transformer.multi30k import DataError
from transformer.split_translation import translate_split, write_lines


def val_bleu(model, tokenizer) -> dict:
    """sacreBLEU and chrF, with their signatures, of translations of val with the default
    search (DecodeOptions()), and the search's options."""
    defaults = DecodeOptions()
    found = translate_split(model, tokenizer, tokenizer.pair, "val", defaults)
    s = score(found.hypotheses, found.references)
    return {
        "beam": defaults.beam_size,
        "alpha": defaults.alpha,
        "sentences": s.sentences,
        "sacrebleu": s.bleu,
        "chrf": s.chrf,
        "length_ratio": s.length_ratio,
        "signature": s.bleu_signature,
    }


def report(model_folder: Path, *, bleu: bool = False) -> dict:
    model, tokenizer = load_model(model_folder)
    w = word_level_evaluation(model, tokenizer, load_pairs("val", tokenizer.pair))
    extra = {"val_bleu": val_bleu(model, tokenizer)} if bleu else {}
    return {
        "split": "val",
        "words": w.words,
        "units": w.units,
        "ppl_word": w.ppl_word,
        "ppl_unit": w.ppl_unit,
        "accuracy": w.accuracy,
        "unit_accuracy": w.unit_accuracy,
        "groups": by_frequency(w, english_training_counts()),
    } | extra


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model", type=Path, help="a folder load_model reads")
    parser.add_argument("dest", type=Path, help="the comparison run's folder")
    parser.add_argument(
        "--bleu",
        action="store_true",
        help="also translate the validation split (the default search) and score it",
    )
    args = parser.parse_args()

    # A bad input: one line on standard error and status 2, as the package's commands.
    def fail(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if not (args.dest / layout.METRICS).is_file():
        fail(f"{args.dest} is not a comparison run's folder (no {layout.METRICS})")
    try:
        summary = report(args.model, bleu=args.bleu)
    except CheckpointError as err:
        fail(f"cannot load a model from {args.model}: {err}")
    except (DataError, ImportError) as err:  # a data file, or no spaCy: it says which
        fail(str(err))
    out = args.dest / "word_level.json"
    write_lines(out, [json.dumps(summary, indent=1)])
    print(
        f"{out}: ppl/word {summary['ppl_word']:.3f}, ppl/unit {summary['ppl_unit']:.3f}"
    )


if __name__ == "__main__":
    main()
