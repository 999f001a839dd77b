r"""Score an ensemble of trained models of one pair on the validation split, beside each of its
members alone, and write the summary as ensemble.json into a comparison run's folder (the
experiments appendix reads it):

    python -m experiments.ensemble_report checkpoints/fr-en runs/fr-recipe-s1/average \
        --dest experiments/runs/fr-en/recipe-seed-1-cpu

The ensemble's probability of each next target token is the mean of its members'
probabilities, fed the reference prefix (teacher forcing), and it is scored as a model is, by
`word_level_evaluation`: perplexity per whitespace word and per word-level token, accuracy per
BPE token and per word-level token. An ensemble is not a model the book ships (translating with
one runs every member at each step); it measures how much a second run of the same recipe adds
to the first. The members must share one vocabulary (checked). Needs spaCy. A bad input is one
line on standard error and exit status 2.
"""

import argparse
import json
import math
from pathlib import Path
from typing import NoReturn

import torch
from torch import Tensor, nn

from experiments.words import WordLevel, word_level_evaluation
from transformer import layout
from transformer.checked_data import load_pairs
from transformer.checkpoint import CheckpointError, load_model, read_record
from transformer.multi30k import DataError
from transformer.split_translation import write_lines


class Ensemble(nn.Module):
    """The members' mean probability of each next token, as log-probabilities."""

    def __init__(self, members: list[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)

    def forward(self, src: Tensor, tgt: Tensor, **masks: Tensor) -> Tensor:
        """Shapes: src (B, S), tgt (B, T); returns (B, T, V), as each member does."""
        log_probs = torch.stack(
            [m(src, tgt, **masks) for m in self.members]
        )  # (M, B, T, V)
        # log of the mean probability, without leaving log space
        return torch.logsumexp(log_probs, dim=0) - math.log(len(self.members))


def scores(w: WordLevel) -> dict[str, float]:
    """What ensemble.json keeps of one evaluation."""
    return {
        "ppl_word": w.ppl_word,
        "ppl_unit": w.ppl_unit,
        "accuracy": w.accuracy,
        "unit_accuracy": w.unit_accuracy,
    }


def report(folders: list[Path]) -> dict:
    """Each member's scores and the ensemble's, on the validation split of their pair."""
    digests = {read_record(f)["vocab"].get("sha256") for f in folders}
    if len(digests) != 1:
        raise CheckpointError(
            "the models do not share one vocabulary: an ensemble averages the "
            "probabilities of the same tokens"
        )
    loaded = [load_model(f) for f in folders]
    tokenizer = loaded[0][1]
    pairs = load_pairs("val", tokenizer.pair)
    members = [word_level_evaluation(m, tokenizer, pairs) for m, _ in loaded]
    together = word_level_evaluation(Ensemble([m for m, _ in loaded]), tokenizer, pairs)
    return {
        "split": "val",
        "pair": tokenizer.pair,
        "words": together.words,
        "units": together.units,
        "members": [
            {"model": str(f)} | scores(w) for f, w in zip(folders, members, strict=True)
        ],
        "ensemble": scores(together),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "models", type=Path, nargs="+", help="two or more folders load_model reads"
    )
    parser.add_argument(
        "--dest", type=Path, required=True, help="the comparison run's folder"
    )
    args = parser.parse_args()

    # A bad input: one line on standard error and status 2, as the package's commands.
    def fail(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message}\n")

    if len(args.models) < 2:
        fail("an ensemble needs two or more models")
    if not (args.dest / layout.METRICS).is_file():
        fail(f"{args.dest} is not a comparison run's folder (no {layout.METRICS})")
    try:
        summary = report(args.models)
    except (CheckpointError, DataError, ImportError) as err:
        fail(str(err))
    out = args.dest / "ensemble.json"
    write_lines(out, [json.dumps(summary, indent=1)])
    print(
        f"{out}: ppl/word {summary['ensemble']['ppl_word']:.3f} (members "
        + ", ".join(f"{m['ppl_word']:.3f}" for m in summary["members"])
        + ")"
    )


if __name__ == "__main__":
    main()
