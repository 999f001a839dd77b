"""Scores of a model on a split, word by word: the word-level tokens (spaCy's tokens and `<eos>`)
that word-level implementations predict, beside the training loop's BPE tokens and whitespace
words, and those tokens grouped by how often the training split has them.

The scripts `word_level_report` and `ensemble_report` and the experiments appendix use it; it
needs spaCy (`pip install -e '.[data]'`).
"""

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from transformer.checked_batches import checked_collate
from transformer.checked_data import load_split
from transformer.paths import DATA_DIR
from transformer.tokenizer import Tokenizer, normalize, pretokenize
from transformer.training_loop import batch_log_probs


@dataclass(frozen=True)
class UnitScore:
    """One word-level token of a reference under teacher forcing: its text (spaCy's token,
    `None` for `<eos>`) and, for each of its BPE pieces, the NLL and whether the model's most
    probable next piece was that piece."""

    text: str | None
    nll: tuple[float, ...]
    hits: tuple[bool, ...]

    @property
    def correct(self) -> bool:
        return all(self.hits)


@dataclass(frozen=True)
class WordLevel:
    """Teacher-forced scores of a split, counted in three units: the model's BPE tokens (as
    the training loop counts them), whitespace words W, and word-level tokens W' (spaCy's
    tokens and one `<eos>` per sentence, what word-level models predict)."""

    words: int  # W
    scores: tuple[UnitScore, ...]  # one per word-level token, in order: W' of them

    @property
    def units(self) -> int:
        """W'."""
        return len(self.scores)

    @property
    def nll_sum(self) -> float:
        """Over every BPE token and `<eos>`: the training loop's validation NLL."""
        return sum(self.piece_nll.values())

    @property
    def units_correct(self) -> int:
        return sum(u.correct for u in self.scores)

    def _by_kind(self) -> dict[str, list[tuple[float, bool]]]:
        kinds: dict[str, list[tuple[float, bool]]] = {
            "first piece": [],
            "later piece": [],
            "<eos>": [],
        }
        for u in self.scores:
            pieces = list(zip(u.nll, u.hits, strict=True))
            if u.text is None:
                kinds["<eos>"] += pieces
            else:
                kinds["first piece"].append(pieces[0])
                kinds["later piece"] += pieces[1:]
        return kinds

    @property
    def pieces(self) -> dict[str, tuple[int, int]]:
        """Kind of BPE piece -> (correct, count)."""
        kinds = self._by_kind().items()
        return {k: (sum(h for _, h in v), len(v)) for k, v in kinds}

    @property
    def piece_nll(self) -> dict[str, float]:
        """Kind of BPE piece -> the NLL summed over its positions."""
        kinds = self._by_kind().items()
        return {k: sum(n for n, _ in v) for k, v in kinds}

    @property
    def accuracy(self) -> float:
        """BPE token accuracy, the training loop's `val_accuracy`."""
        pieces = self.pieces.values()
        return sum(c for c, _ in pieces) / sum(n for _, n in pieces)

    @property
    def unit_accuracy(self) -> float:
        return self.units_correct / self.units

    @property
    def ppl_word(self) -> float:
        return math.exp(self.nll_sum / self.words)

    @property
    def ppl_unit(self) -> float:
        return math.exp(self.nll_sum / self.units)


@torch.no_grad()
def word_level_evaluation(
    model: nn.Module,
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 64,
) -> WordLevel:
    """Score (source, English reference) texts with teacher forcing, word by word (needs spaCy).

    A word-level token counts as correct when, fed the reference prefix, the model's most
    probable next piece is the reference's at each of its BPE pieces: the greedy counterpart
    of a word-level model's most probable word. BPE never merges across spaCy's tokens, so
    every piece belongs to exactly one of them.
    """
    if not pairs:
        raise ValueError("word_level_evaluation needs at least one sentence pair")
    src_lang = tokenizer.languages[0]
    sources = tokenizer.encode_words(pretokenize([s for s, _ in pairs], src_lang))
    references = pretokenize([r for _, r in pairs], "en")
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    scores: list[UnitScore] = []
    for start in range(0, len(pairs), batch_size):
        texts = references[start : start + batch_size]  # spaCy's tokens per sentence
        segments = [tokenizer.encode_words([(t,) for t in tokens]) for tokens in texts]
        examples = [
            (src, [i for word in words for i in word])
            for src, words in zip(
                sources[start : start + batch_size], segments, strict=True
            )
        ]
        batch = checked_collate(
            examples,
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
        ).to(device)
        log_probs = batch_log_probs(model, batch, pad_id=tokenizer.pad_id).float()
        target = batch.tgt_out.unsqueeze(-1)
        nll = (-log_probs.gather(-1, target).squeeze(-1)).tolist()
        right = (log_probs.argmax(-1) == batch.tgt_out).tolist()
        for nll_row, hit_row, words, tokens in zip(
            nll, right, segments, texts, strict=True
        ):
            at = 0
            for word, token in zip(words, tokens, strict=True):
                end = at + len(word)
                scores.append(
                    UnitScore(token, tuple(nll_row[at:end]), tuple(hit_row[at:end]))
                )
                at = end
            scores.append(UnitScore(None, (nll_row[at],), (hit_row[at],)))
    model.train(was_training)
    return WordLevel(
        words=sum(len(normalize(r).split()) for _, r in pairs), scores=tuple(scores)
    )


FREQUENCY_GROUPS = (
    (0, "never"),
    (1, "once"),
    (2, "2-4"),
    (5, "5-19"),
    (20, "20-99"),
    (100, "100+"),
)  # (least count, name)


def english_training_counts(data_dir: Path = DATA_DIR) -> Counter[str]:
    """How often each of spaCy's English tokens occurs in the training split, the target side
    of both pairs (needs spaCy)."""
    english = load_split("train", "en", data_dir)
    return Counter(token for tokens in pretokenize(english, "en") for token in tokens)


def frequency_group(unit: UnitScore, counts: Mapping[str, int]) -> str:
    """The group of a word-level token by how often `counts` has it; `<eos>` is its own."""
    if unit.text is None:
        return "<eos>"
    count = counts.get(unit.text, 0)
    return [name for least, name in FREQUENCY_GROUPS if count >= least][-1]


def by_frequency(
    w: WordLevel, counts: Mapping[str, int]
) -> dict[str, dict[str, float]]:
    """Group -> the number of its word-level tokens, their NLL and how many are right."""
    names = [name for _, name in FREQUENCY_GROUPS] + ["<eos>"]
    groups = {name: {"tokens": 0, "nll": 0.0, "correct": 0} for name in names}
    for unit in w.scores:
        group = groups[frequency_group(unit, counts)]
        group["tokens"] += 1
        group["nll"] += sum(unit.nll)
        group["correct"] += unit.correct
    return groups
