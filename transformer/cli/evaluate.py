# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""`python -m transformer evaluate`: a model's translations of a Multi30k
split, scored."""

# %% auto #0
__all__ = [
    "ERRORS",
    "EVALUATE_EPILOG",
    "evaluate_parser",
    "check_evaluate_options",
    "model_digest",
    "write_scores",
    "evaluate_command",
]

# %% ../../chapters/a10_cli.ipynb #ee500307

import argparse
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from transformer.atomic import atomic_write
from transformer.checked_data import load_pairs
from transformer.cli.base import (
    PROG,
    Parser,
    UsageError,
    add_model_options,
    check_model_options,
    load_for_command,
    warning,
)
from transformer.multi30k import SPLITS, DataError, parse_pair
from transformer.paths import CHECKPOINTS_DIR, DATA_DIR

from .. import layout

ERRORS = (DataError, ImportError)  # reported in one line

EVALUATE_EPILOG = """\
Prints sacreBLEU (cased, its 13a tokenizer on the detokenised translations
against the raw references) and chrF, each with its signature; BLEU on
lowercased spaCy-tokenised text, only to compare with published Multi30k
results; and the time that the translation took. --json writes the scores with
the decoding options and the SHA-256 of the model's files.

Errors (an unknown pair, split or option, a missing or unusable model folder, a
missing or corrupt data file, an output file that cannot be written, no spaCy)
print one line on standard error and exit with status 2."""


# %% ../../chapters/a10_cli.ipynb #3d9c935a
def evaluate_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=f"{PROG} evaluate",
        description=(
            "Score a trained model on a Multi30k split with sacreBLEU and chrF"
            " (Part III)."
        ),
        epilog=EVALUATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_options(p)
    p.add_argument(
        "--split",
        default="test_2016_flickr",
        metavar="NAME",
        help=f"{', '.join(SPLITS)} (default: test_2016_flickr)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=DATA_DIR,
        metavar="DIR",
        help="the Multi30k files and their SHA256SUMS (default: data/multi30k,"
        " see TRANSFORMER_HOME)",
    )
    p.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="translate only the split's first N sentences (default: all)",
    )
    p.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help="also write the translations to FILE, one per line",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="also write the scores, the decoding options and the model's"
        " SHA-256 to FILE, as JSON",
    )
    return p


def check_evaluate_options(args: argparse.Namespace) -> None:
    """A one-line UsageError for a bad split, limit or output file."""
    if args.split not in SPLITS:
        raise UsageError(
            f"unknown split {args.split!r}: choose one of {', '.join(SPLITS)}"
        )
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    for path in (args.output, args.json):
        if path is not None and not path.parent.is_dir():
            raise UsageError(f"cannot write {path}: no folder {path.parent}")
        if path is not None and path.is_dir():
            raise UsageError(f"cannot write {path}: it is a folder")


def model_digest(folder: Path) -> str:
    """The SHA-256 of a model folder's model: of its config.json,
    tokenizer.json and weight files, the files that `load_model` reads."""
    config = json.loads((folder / layout.CONFIG).read_text(encoding="utf-8"))
    digest = hashlib.sha256()
    for path in (
        folder / layout.CONFIG,
        folder / layout.TOKENIZER,
        *layout.weight_files(folder, config),
    ):
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def write_scores(args: argparse.Namespace, scores, options) -> None:
    """The scores of the run that `args` and `options` asked for, as JSON in
    args.json (the results chapter's scores_record), written atomically, or a
    one-line UsageError."""
    from transformer.evaluate import scores_record

    record = scores_record(
        scores,
        pair=args.pair,
        split=args.split,
        options=dataclasses.asdict(options),
        model=model_digest(args.checkpoint or CHECKPOINTS_DIR / args.pair),
    )
    text = json.dumps(record, ensure_ascii=False, indent=2) + "\n"
    path = args.json
    try:
        atomic_write(path, text.encode("utf-8"))
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from err


# %% ../../chapters/a10_cli.ipynb #6c0480ee
def evaluate_command(argv: Sequence[str]) -> None:
    """`python -m transformer evaluate ...`: translate a split, print its
    scores."""
    args = evaluate_parser().parse_args(argv)
    options, device = check_model_options(args)
    check_evaluate_options(args)
    # a data error before the model's
    load_pairs(args.split, args.pair, args.data_dir)
    import torch

    from transformer.evaluate import score, search_label
    from transformer.split_translation import translate_split, write_lines

    model, tokenizer = load_for_command(
        args.pair, args.checkpoint, device, options
    )
    result = translate_split(
        model,
        tokenizer,
        args.pair,
        args.split,
        options,
        data_dir=args.data_dir,
        limit=args.limit,
        warn=warning("evaluate"),
    )
    scores = score(
        result.hypotheses, result.references, language=parse_pair(args.pair)[1]
    )
    if args.output is not None:
        try:
            write_lines(args.output, result.hypotheses)
        except OSError as err:
            raise UsageError(
                f"cannot write {args.output}: {err.strerror}"
            ) from err
    if args.json is not None:
        write_scores(args, scores, options)
    folder = args.checkpoint or f"the shipped model, checkpoints/{args.pair}"
    search = search_label(options.beam_size, options.alpha)
    print(
        f"{args.pair} {args.split}: {scores.sentences:,} sentences, {search},"
        f" model {folder}"
    )
    print(scores.report())
    threads = torch.get_num_threads()
    print(
        f"translated in {result.seconds:.1f} s"
        f" ({result.sentences_per_second:.1f} sentences/s on {device},"
        f" {threads} CPU thread{'s' if threads > 1 else ''})"
    )
    if args.output is not None:
        print(f"translations written to {args.output}")
    if args.json is not None:
        print(f"scores written to {args.json}")
