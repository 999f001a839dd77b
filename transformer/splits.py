# Generated from chapters/a08_translating.ipynb: edit it, not this file.
"""A Multi30k split translated and scored: its translations timed and written
one per line, its BLEU by source length, and the lowercased spaCy-tokenised
BLEU that published Multi30k results report."""

# %% auto #0
__all__ = [
    "LENGTH_BOUNDS",
    "LC_TOK_BLEU",
    "SplitTranslations",
    "translate_split",
    "write_lines",
    "LengthGroup",
    "bleu_by_length",
    "spacy_words",
    "lc_tok_bleu",
]

# %% ../chapters/a08_translating.ipynb #fa0cecc5

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sacrebleu.metrics import BLEU

from transformer.decode_options import DecodeOptions, decode_options
from transformer.files import atomic_write
from transformer.model import Transformer
from transformer.multi30k import load_pairs, parse_pair
from transformer.paths import DATA_DIR
from transformer.tokenizer import MARK, Tokenizer, pretokenize
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
    with `transformer.translation.translate` and `options` (default: the
    paper's; `changes` such as beam_size=1 change them), and time it."""
    options = decode_options(options, **changes)
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


# %% ../chapters/a08_translating.ipynb #f9de85fc
LENGTH_BOUNDS = (
    1,
    10,
    15,
    20,
)  # the first source length, in words, of each group


@dataclass(frozen=True)
class LengthGroup:
    """The sentences whose source has `words` words: how many, their sacreBLEU
    and BLEU's output/reference length ratio (both nan for an empty group)."""

    words: str
    sentences: int
    bleu: float
    length_ratio: float


def bleu_by_length(
    sources: Sequence[str],
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    bounds: Sequence[int] = LENGTH_BOUNDS,
) -> list[LengthGroup]:
    """sacreBLEU of the sentences grouped by the length of their source in
    words (separated by spaces): group i holds bounds[i] to bounds[i+1] - 1
    words, the last bounds[-1] or more, and a source shorter than bounds[0]
    counts in the first."""
    if not len(sources) == len(hypotheses) == len(references):
        raise ValueError(
            f"{len(sources)} sources, {len(hypotheses)} translations and "
            f"{len(references)} references"
        )
    bounds = list(bounds)
    if not bounds or bounds != sorted(set(bounds)) or bounds[0] < 0:
        raise ValueError(f"bounds must increase from 0 or more, got {bounds}")
    groups: list[list[int]] = [[] for _ in bounds]
    for i, source in enumerate(sources):
        n = len(source.split())
        groups[
            max((k for k, b in enumerate(bounds) if n >= b), default=0)
        ].append(i)
    results = []
    for k, members in enumerate(groups):
        last = bounds[k + 1] - 1 if k + 1 < len(bounds) else None
        words = (
            f"{bounds[k]}+"
            if last is None
            else str(last)
            if last == bounds[k]
            else f"{bounds[k]}–{last}"
        )
        if not members:
            results.append(LengthGroup(words, 0, math.nan, math.nan))
            continue
        found = BLEU().corpus_score(
            [hypotheses[i] for i in members],
            [[references[i] for i in members]],
        )
        results.append(
            LengthGroup(words, len(members), found.score, found.ratio)
        )
    return results


# %% ../chapters/a08_translating.ipynb #a56dd128
# The name of the lowercased tokenised BLEU wherever it is printed: not
# comparable with sacreBLEU.
LC_TOK_BLEU = "BLEU lowercased, spaCy-tokenised"


def spacy_words(texts: Sequence[str], language: str = "en") -> list[str]:
    """Each text cut into words by spaCy's rules for `language`, the words
    joined by spaces."""
    return [
        " ".join(word.removeprefix(MARK) for word in words)
        for words in pretokenize(texts, language)
    ]


def lc_tok_bleu(
    hypotheses: Sequence[str], references: Sequence[str], language: str = "en"
) -> tuple[float, str]:
    """BLEU of lowercased text cut into words by spaCy (tok:none after that),
    and its signature: comparable with published Multi30k results that use
    spaCy's words (torchtext's `bleu_score`), only roughly with
    Moses-tokenised ones, and not with sacreBLEU's BLEU."""
    # The text is cut into words already: no second tokenizer, and no warning
    # about it.
    bleu = BLEU(lowercase=True, tokenize="none", force=True)
    found = bleu.corpus_score(
        spacy_words(hypotheses, language), [spacy_words(references, language)]
    )
    return found.score, str(bleu.get_signature())
