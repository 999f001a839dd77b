# Generated from chapters/a08_translating.ipynb: edit it, not this file.
"""A Multi30k split translated: its translations timed, and written one per
line."""

# %% auto #0
__all__ = ["SplitTranslations", "translate_split", "write_lines"]

# %% ../chapters/a08_translating.ipynb #fa0cecc5

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformer.atomic import atomic_write
from transformer.checked_data import load_pairs
from transformer.decode_options import DecodeOptions, with_changes
from transformer.model import Transformer
from transformer.multi30k import parse_pair
from transformer.paths import DATA_DIR
from transformer.tokenizer import Tokenizer
from transformer.translation import translate


@dataclass(frozen=True)
class SplitTranslations:
    """The sources and references of (part of) a split, a model's translations
    of the sources, and the wall-clock seconds that the translation took."""

    pair: str
    split: str
    sources: list[str]
    references: list[str]
    hypotheses: list[str]
    seconds: float

    @property
    def sentences_per_second(self) -> float:
        return len(self.sources) / self.seconds


def translate_split(
    model: Transformer,
    tokenizer: Tokenizer,
    pair: str,
    split: str = "test_2016_flickr",
    options: DecodeOptions | None = None,
    *,
    data_dir: Path = DATA_DIR,
    limit: int | None = None,
    warn: Callable[[str], None] | None = None,
    **changes,
) -> SplitTranslations:
    """Translate the first `limit` sentences (default: all) of a Multi30k split
    with `transformer.translation.translate` and `options` (default:
    the defaults; `changes` such as beam_size=1 change them), and time it."""
    options = with_changes(options, **changes)
    if tokenizer.languages != parse_pair(pair):
        raise ValueError(f"the model translates {tokenizer.pair}, not {pair}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    pairs = load_pairs(split, pair, data_dir)[:limit]
    sources = [source for source, _ in pairs]
    if sources:
        # spaCy loads its rules on first use: not part of the timing
        tokenizer.encode(sources[0])
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, options, warn=warn)
    seconds = time.perf_counter() - started
    return SplitTranslations(
        pair=pair,
        split=split,
        sources=sources,
        references=[reference for _, reference in pairs],
        hypotheses=hypotheses,
        seconds=seconds,
    )


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write one line per item, UTF-8, atomically (a temporary file beside
    `path`, synced to disk, then renamed): a failed write leaves the old file
    as it was."""
    atomic_write(
        Path(path), "".join(f"{line}\n" for line in lines).encode("utf-8")
    )
