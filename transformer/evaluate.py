# Generated from chapters/15_results.ipynb: edit it, not this file.
"""Scoring translations: sacreBLEU's BLEU and chrF with their signatures (Post,
2018), and the lowercased tokenised BLEU of published Multi30k results."""

# %% auto #0
__all__ = [
    "LC_TOK_BLEU",
    "STORED_SCORES",
    "LENGTH_BOUNDS",
    "spacy_words",
    "lc_tok_bleu",
    "Scores",
    "score",
    "search_label",
    "scores_record",
    "stored_scores",
    "LengthGroup",
    "bleu_by_length",
]

# %% ../chapters/15_results.ipynb #ef74895a

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from sacrebleu.metrics import BLEU, CHRF

from transformer.paths import CHECKPOINTS_DIR
from transformer.tokenizer import MARK, pretokenize

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


@dataclass(frozen=True)
class Scores:
    """Corpus scores in percent, with their signatures: sacreBLEU's BLEU, its
    length ratio and brevity penalty, chrF, and the published results' BLEU."""

    sentences: int
    bleu: float
    chrf: float
    length_ratio: float
    brevity_penalty: float
    bleu_lc_tok: float
    bleu_signature: str
    chrf_signature: str
    bleu_lc_tok_signature: str

    def report(self) -> str:
        """The scores with their signatures, one per line."""
        lc_tok = (
            f"{LC_TOK_BLEU}, only to compare with published Multi30k results"
        )
        return (
            f"sacreBLEU {self.bleu:6.2f}  {self.bleu_signature}\n"
            f"          (output/reference length {self.length_ratio:.3f},"
            f" brevity penalty {self.brevity_penalty:.3f})\n"
            f"chrF      {self.chrf:6.2f}  {self.chrf_signature}\n"
            f"{lc_tok}: {self.bleu_lc_tok:.2f}  {self.bleu_lc_tok_signature}"
        )


# %% ../chapters/15_results.ipynb #c2b90acb
def score(
    hypotheses: Sequence[str],
    references: Sequence[str],
    *,
    language: str = "en",
) -> Scores:
    """sacreBLEU's BLEU and chrF of detokenised translations against the raw
    references (one per sentence), and the lowercased spaCy-tokenised BLEU;
    `language`: the references'."""
    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("score takes sequences of sentences, not one string")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"{len(hypotheses)} translations but {len(references)} references"
        )
    if not references:
        raise ValueError("no sentences to score")
    hypotheses, references = list(hypotheses), list(references)
    bleu, chrf = BLEU(), CHRF()
    bleu_score = bleu.corpus_score(hypotheses, [references])
    chrf_score = chrf.corpus_score(hypotheses, [references])
    lc_tok, lc_tok_signature = lc_tok_bleu(hypotheses, references, language)
    return Scores(
        sentences=len(references),
        bleu=bleu_score.score,
        chrf=chrf_score.score,
        length_ratio=bleu_score.ratio,
        brevity_penalty=bleu_score.bp,
        bleu_lc_tok=lc_tok,
        bleu_signature=str(bleu.get_signature()),
        chrf_signature=str(chrf.get_signature()),
        bleu_lc_tok_signature=lc_tok_signature,
    )


# %% ../chapters/15_results.ipynb #0da06664
# The shipped models' evaluations, as `evaluate --json` wrote them: <pair>.json
# with evaluate's defaults, <pair>.greedy.json with --beam 1, <pair>.last.json
# of the last epoch's weights (--checkpoint checkpoints/<pair>/last).
STORED_SCORES = CHECKPOINTS_DIR / "scores"


def search_label(beam_size: int, alpha: float, **_) -> str:
    """The search that made a score, as every score's label says it."""
    return "greedy" if beam_size == 1 else f"beam {beam_size}, α {alpha:g}"


def scores_record(
    scores: Scores, *, pair: str, split: str, options: dict, model: str
) -> dict:
    """A scored run as data: what was translated, by which options and model
    (`model`: the SHA-256 of its files), and the scores."""
    return {
        "pair": pair,
        "split": split,
        "options": options,
        "model_sha256": model,
        "scores": dataclasses.asdict(scores),
    }


def stored_scores(name: str) -> tuple[Scores, dict]:
    """The Scores of the stored record `name` ("de-en", "de-en.greedy"), and
    the record."""
    path = STORED_SCORES / f"{name}.json"
    record = json.loads(path.read_text(encoding="utf-8"))
    return Scores(**record["scores"]), record


# %% ../chapters/15_results.ipynb #49963f8b
# The first source length, in words, of each group
LENGTH_BOUNDS = (1, 10, 15, 20)


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
