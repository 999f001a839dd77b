"""Scores per word: the word-level units (spaCy's tokens and <eos>) that word-level
implementations predict, against the training loop's own figures, and words grouped by how often
the training split has them."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from experiments.words import (
    FREQUENCY_GROUPS,
    UnitScore,
    WordLevel,
    by_frequency,
    frequency_group,
    word_level_evaluation,
)
from transformer.checked_batches import checked_collate
from transformer.config import TransformerConfig
from transformer.loss import LABEL_SMOOTHING
from transformer.model import Transformer
from transformer.multi30k import load_pairs
from transformer.tokenizer import pretokenize, train_bpe
from transformer.validation import validate

TINY_MODEL = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.1)


class _Oracle(torch.nn.Module):
    """Predicts every reference piece (fed the reference prefix) and misses every <eos>:
    log-probability log p_hit on the piece it picks."""

    def __init__(self, vocab: int, wrong: int) -> None:
        super().__init__()
        self.vocab, self.wrong = vocab, wrong
        self.anchor = torch.nn.Parameter(torch.zeros(()))  # gives the device

    def forward(self, src, tgt_in, *, src_mask, tgt_mask):
        nxt = torch.cat([tgt_in[:, 1:], tgt_in[:, :1]], dim=1)
        pick = torch.where(nxt == 0, self.wrong, nxt)  # 0 is <pad>: where <eos> is due
        logits = torch.zeros(*tgt_in.shape, self.vocab)
        logits.scatter_(-1, pick.unsqueeze(-1), 3.0)
        return torch.log_softmax(logits, dim=-1)


def _val_pairs(n: int = 24) -> list[tuple[str, str]]:
    return load_pairs("val", "de-en")[:n]


def _tokenizer_of(pairs, vocab_size: int):
    words = pretokenize([s for s, _ in pairs], "de") + pretokenize(
        [t for _, t in pairs], "en"
    )
    return train_bpe(words, vocab_size, languages=("de", "en"))


@pytest.mark.parametrize("vocab_size", [60, 2_000])
def test_word_level_evaluation_groups_pieces_into_words(vocab_size):
    pairs = _val_pairs()
    tokenizer = _tokenizer_of(pairs, vocab_size)
    n = len(pairs)
    model = _Oracle(tokenizer.vocab_size, wrong=tokenizer.unk_id)
    w = word_level_evaluation(model, tokenizer, pairs, batch_size=5)
    references = pretokenize([t for _, t in pairs], "en")
    assert w.units == sum(len(r) + 1 for r in references)
    assert w.words == sum(len(t.split()) for _, t in pairs)
    tokens = sum(count for _, count in w.pieces.values())
    # every piece right, every <eos> wrong: a word-level token is right unless it is <eos>
    assert w.pieces["<eos>"] == (0, n)
    assert w.pieces["first piece"][1] == w.units - n
    assert w.unit_accuracy == (w.units - n) / w.units
    assert w.accuracy == (tokens - n) / tokens
    p_hit = math.exp(3) / (math.exp(3) + tokenizer.vocab_size - 1)
    p_miss = 1 / (math.exp(3) + tokenizer.vocab_size - 1)
    nll = -(tokens - n) * math.log(p_hit) - n * math.log(p_miss)
    assert w.nll_sum == pytest.approx(nll, rel=1e-5)
    assert w.ppl_word == pytest.approx(math.exp(nll / w.words), rel=1e-5)
    assert w.ppl_unit == pytest.approx(math.exp(nll / w.units), rel=1e-5)
    # one score per word-level token, in the references' order, <eos> after each sentence
    texts = [u.text for u in w.scores]
    assert texts == [t for r in references for t in [*r, None]]
    for u in w.scores:
        right = u.text is not None
        assert u.hits == (right,) * len(u.nll) and u.correct == right
        expected = -math.log(p_hit if right else p_miss)
        assert u.nll == pytest.approx((expected,) * len(u.nll), rel=1e-5)
    assert w.piece_nll["<eos>"] == pytest.approx(-n * math.log(p_miss), rel=1e-5)
    assert sum(w.piece_nll.values()) == pytest.approx(nll, rel=1e-5)
    later = w.pieces["later piece"][1]
    if vocab_size == 2_000:  # every word of these sentences is one piece
        assert later == 0 and tokens == w.units
    else:  # words split into several pieces
        assert later > 0 and tokens == w.units + later


def test_by_frequency_groups_word_level_tokens_by_training_count():
    w = WordLevel(
        words=4,
        scores=(
            UnitScore("▁a", (0.5,), (True,)),  # seen 120 times
            UnitScore("▁zyx", (3.0, 4.0), (False, True)),  # never seen
            UnitScore("▁b", (1.0,), (True,)),  # seen once
            UnitScore("▁c", (2.0,), (False,)),  # seen 4 times
            UnitScore(None, (0.1,), (True,)),
        ),
    )
    counts = Counter({"▁a": 120, "▁b": 1, "▁c": 4})
    assert [frequency_group(u, counts) for u in w.scores] == [
        "100+",
        "never",
        "once",
        "2-4",
        "<eos>",
    ]
    groups = by_frequency(w, counts)
    assert list(groups) == [name for _, name in FREQUENCY_GROUPS] + ["<eos>"]
    assert groups["never"] == {"tokens": 1, "nll": 7.0, "correct": 0}
    assert groups["100+"] == {"tokens": 1, "nll": 0.5, "correct": 1}
    assert groups["5-19"]["tokens"] == groups["20-99"]["tokens"] == 0
    assert sum(g["tokens"] for g in groups.values()) == w.units == 5
    assert sum(g["nll"] for g in groups.values()) == pytest.approx(w.nll_sum)
    assert sum(g["correct"] for g in groups.values()) == w.units_correct == 3
    assert w.pieces == {"first piece": (2, 4), "later piece": (1, 1), "<eos>": (1, 1)}
    assert w.piece_nll == pytest.approx(
        {"first piece": 6.5, "later piece": 4.0, "<eos>": 0.1}
    )


def test_word_level_evaluation_agrees_with_the_training_loop():
    pairs = _val_pairs()
    tokenizer = _tokenizer_of(pairs, 60)
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.small(tokenizer.vocab_size, **TINY_MODEL))
    w = word_level_evaluation(model, tokenizer, pairs, batch_size=7)
    src = tokenizer.encode_batch([s for s, _ in pairs], "de")
    tgt = tokenizer.encode_batch([t for _, t in pairs], "en")
    ids = dict(
        pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id
    )
    loop = validate(
        model,
        [checked_collate(list(zip(src, tgt, strict=True)), **ids)],
        pad_id=tokenizer.pad_id,
        smoothing=LABEL_SMOOTHING,
        words=w.words,
    )
    assert w.nll_sum == pytest.approx(loop.stats.nll_sum, rel=1e-5)
    assert w.accuracy == loop.stats.accuracy
    assert w.ppl_word == pytest.approx(loop.word_perplexity, rel=1e-5)
    assert model.training  # restored
    with pytest.raises(ValueError, match="at least one sentence pair"):
        word_level_evaluation(model, tokenizer, [])
