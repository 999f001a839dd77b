# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""`python -m transformer prepare`: Multi30k tokenised and cached as token
ids."""

# %% auto #0
__all__ = ["ERRORS", "prepare_command"]

# %% ../../chapters/a10_cli.ipynb #38d6cdb9

import os
from collections.abc import Sequence
from pathlib import Path

from transformer.cli.base import PROG, Parser, UsageError, language_pair
from transformer.multi30k import PAIRS, SPLITS, DataError
from transformer.paths import CACHE_DIR, DATA_DIR
from transformer.tokenizer import SPECIALS, VOCAB_SIZE

ERRORS = (DataError, ImportError, OSError)  # reported in one line


# %% ../../chapters/a10_cli.ipynb #84f5b12c
def prepare_command(argv: Sequence[str]) -> None:
    """`python -m transformer prepare`: build, or check and keep, the encoded
    caches."""
    parser = Parser(
        prog=f"{PROG} prepare",
        description=(
            "Tokenise Multi30k and cache every split as token ids (needs spaCy"
            " unless the cache is already current)."
        ),
    )
    parser.add_argument(
        "--pair",
        action="append",
        type=language_pair,
        choices=list(PAIRS),
        help="may be repeated (default: all)",
    )
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument(
        "--rebuild", action="store_true", help="rebuild even a current cache"
    )
    args = parser.parse_args(argv)
    if args.vocab_size <= len(SPECIALS):
        raise UsageError(
            f"--vocab-size must exceed {len(SPECIALS)}, got {args.vocab_size}"
        )
    from transformer.encoded_cache import (  # torch, when needed
        load_encoded,
        prepare,
    )

    for k, pair in enumerate(args.pair or list(PAIRS)):
        tokenizer = prepare(
            pair,
            args.cache_dir,
            vocab_size=args.vocab_size,
            data_dir=args.data_dir,
            rebuild=args.rebuild,
        )
        splits = {
            split: load_encoded(
                pair, split, args.cache_dir, data_dir=args.data_dir
            )
            for split in SPLITS
        }
        if k == 0:  # once the first cache is whole: an error comes alone
            print(
                f"{'pair':<6} {'split':<17} {'sentences':>9}"
                f" {'src tokens':>10} {'tgt tokens':>10}"
            )
        for split, data in splits.items():
            print(
                f"{pair:<6} {split:<17} {len(data):>9,}"
                f" {len(data.src_ids):>10,} {len(data.tgt_ids):>10,}"
            )
        where = os.path.relpath(Path(args.cache_dir) / pair)
        print(f"{pair:<6} {tokenizer!r} in {where}")
