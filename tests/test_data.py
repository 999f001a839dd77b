"""The encoded cache, batching and BPE-dropout: transformer.encoded_cache, encoded, batches,
batch_checks, bpe_dropout and data.

The loader's own tests (checksums, missing files) are in test_data_files.py, the tokenizer's
in test_tokenizer.py.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from random import Random

import numpy as np
import pytest
import torch

import transformer.batches as chapter_batches
import transformer.checked_data as checked_data
import transformer.encoded_cache as cache_module
from transformer.atomic import atomic_write
from transformer.batches import Batch
from transformer.bpe_dropout import BPEDropout
from transformer.checked_batches import checked_collate, checked_token_batches
from transformer.checked_data import load_pairs, load_split
from transformer.encoded_cache import (
    cache_problems,
    load_encoded,
    prepare,
    train_tokenizer,
)
from transformer.encoded_split import EncodedSplit, iterate_batches
from transformer.multi30k import PAIRS, SPLITS, DataError
from transformer.paths import DATA_DIR
from transformer.tokenizer import VOCAB_SIZE, Tokenizer, pretokenize, train_bpe
from transformer.vocabulary import TOKENIZER_FORMAT

ROOT = Path(__file__).resolve().parent.parent
needs_spacy = pytest.mark.skipif(
    importlib.util.find_spec("spacy") is None, reason="needs spaCy (transformer[data])"
)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A de-en cache built once for the module; tests that damage it work on a copy."""
    folder = tmp_path_factory.mktemp("cache")
    prepare("de-en", folder)
    return folder


@pytest.fixture(scope="module")
def tokenizer(cache: Path) -> Tokenizer:
    return Tokenizer.load(cache / "de-en" / "tokenizer.json")


@pytest.fixture(scope="module")
def trained(tokenizer: Tokenizer) -> dict[str, Tokenizer]:
    # spaCy over the training text is the slow part: the de-en cache's tokenizer serves twice.
    french = train_tokenizer(load_pairs("train", "fr-en"), languages=("fr", "en"))
    return {"de-en": tokenizer, "fr-en": french}


@pytest.fixture
def cache_copy(cache: Path, tmp_path: Path) -> Path:
    shutil.copytree(cache, tmp_path / "cache")
    return tmp_path / "cache"


# The vocabulary sees the training split only ---------------------------------------------------


@needs_spacy
def test_prepare_learns_the_vocabulary_from_the_training_split_only(
    cache, tmp_path, monkeypatch
):
    given = []
    real = cache_module.train_tokenizer

    def spy(pairs, *args, **kwargs):
        given.append(list(pairs))
        return real(pairs, *args, **kwargs)

    monkeypatch.setattr(cache_module, "train_tokenizer", spy)
    prepare("de-en", tmp_path, vocab_size=300)
    assert given == [load_pairs("train", "de-en")]


# Special tokens and empty sentences -----------------------------------------------------------


@needs_spacy
def test_an_empty_sentence_becomes_eos_and_bos(tokenizer):
    assert tokenizer.encode("") == []
    specials = dict(
        pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id
    )
    batch = checked_collate([([], [])], **specials)
    assert batch.src.tolist() == [[tokenizer.eos_id]]
    assert batch.tgt_in.tolist() == [[tokenizer.bos_id]]
    assert batch.tgt_out.tolist() == [[tokenizer.eos_id]]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (1, 1)


@needs_spacy
def test_an_overlong_sentence_is_refused_by_collate_and_token_batches(tokenizer):
    ids = tokenizer.encode(" ".join(["Ein Hund läuft über die Wiese."] * 200))
    specials = dict(
        pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id
    )
    assert checked_collate([(ids, [5])], **specials).src.shape == (1, len(ids) + 1)
    with pytest.raises(
        ValueError, match=r"pair 7 has \d+ source .* more than max_len=512"
    ):
        checked_collate([([5], [5]), (ids, [5])], **specials, index=[3, 7], max_len=512)
    with pytest.raises(ValueError, match="more than max_tokens=1000"):
        checked_token_batches([3, len(ids) + 1], [3, 2], max_tokens=1_000)


def test_collate_refuses_an_overlong_target_as_well():
    ids = dict(pad_id=0, bos_id=1, eos_id=2)
    # <bos> y_1 … y_8 is 9 positions; <bos> y_1 … y_7 fits max_len=8 exactly.
    with pytest.raises(
        ValueError,
        match=r"pair 7 has 2 source and 9 target tokens, more than max_len=8",
    ):
        checked_collate([([5], [6]), ([5], [6] * 8)], **ids, index=[3, 7], max_len=8)
    batch = checked_collate([([5], [6]), ([5], [6] * 7)], **ids, max_len=8)
    assert batch.tgt_in.shape == batch.tgt_out.shape == (2, 8)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_cache_files_have_the_mode_that_open_would_give(tmp_path, umask):
    # The cache's files go through atomic_write; mkstemp alone makes 0600 files, which a cache
    # copied to another user could not be read from.
    previous = os.umask(umask)
    try:
        atomic_write(tmp_path / "manifest.json", b"{}")
    finally:
        os.umask(previous)
    assert (tmp_path / "manifest.json").stat().st_mode & 0o777 == 0o666 & ~umask


# Batches --------------------------------------------------------------------------------------


def lengths(n: int = 3_000, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(2, 60, n)
    tgt = np.clip(src + rng.integers(-5, 6, n), 2, None)
    return src, tgt


def test_every_pair_appears_exactly_once_per_epoch():
    src, tgt = lengths()
    for epoch in range(3):
        groups = checked_token_batches(src, tgt, max_tokens=2_000, seed=0, epoch=epoch)
        assert np.array_equal(np.sort(np.concatenate(groups)), np.arange(len(src)))


@pytest.mark.parametrize("max_tokens", [70, 500, 4_000])
def test_no_batch_exceeds_the_token_budget_on_either_side(max_tokens):
    src, tgt = lengths()
    for group in checked_token_batches(src, tgt, max_tokens=max_tokens):
        assert len(group) * src[group].max() <= max_tokens
        assert len(group) * tgt[group].max() <= max_tokens


@pytest.mark.parametrize("max_tokens", [70, 500, 4_000])
def test_batches_are_full_one_more_pair_would_break_the_budget(max_tokens):
    """The cut is greedy along the length order (the longer side, then the total): a batch
    ends only where the next pair would take B · max(S, T) over max_tokens. Shuffling changes
    which of several equally long pairs go together, and the order of the batches: nothing
    else."""
    src, tgt = lengths()
    longest = np.maximum(src, tgt)
    batches = checked_token_batches(src, tgt, max_tokens=max_tokens, shuffle=False)
    order = np.concatenate(batches)
    keys = list(zip(longest[order].tolist(), (src + tgt)[order].tolist(), strict=True))
    assert keys == sorted(keys)
    for batch, after in zip(batches[:-1], batches[1:], strict=True):
        width = longest[batch].max()
        assert len(batch) * width <= max_tokens
        assert (len(batch) + 1) * max(width, longest[after[0]]) > max_tokens

    def shapes(groups):  # each batch as the sorted (longest, total) of its pairs
        return sorted(
            sorted(zip(longest[g].tolist(), (src + tgt)[g].tolist(), strict=True))
            for g in groups
        )

    shuffled = checked_token_batches(src, tgt, max_tokens=max_tokens, seed=3, epoch=5)
    assert shapes(shuffled) == shapes(batches)


def test_the_batches_of_an_epoch_come_in_a_random_order():
    """Not shortest first: the widths (longest pair) of the batches, in the order an epoch
    serves them, are unsorted, and another epoch serves them in another order."""
    src, tgt = lengths()
    longest = np.maximum(src, tgt)

    def widths(epoch: int) -> list[int]:
        groups = checked_token_batches(src, tgt, max_tokens=2_000, seed=3, epoch=epoch)
        return [int(longest[g].max()) for g in groups]

    first, second = widths(5), widths(6)
    assert first != sorted(first) and first != sorted(first, reverse=True)
    assert second != first and sorted(second) == sorted(first)


def test_batches_are_reproducible_from_seed_and_epoch_and_change_between_epochs():
    src, tgt = lengths()

    def run(**kw):
        return [
            g.tolist() for g in checked_token_batches(src, tgt, max_tokens=2_000, **kw)
        ]

    assert run(seed=3, epoch=5) == run(seed=3, epoch=5)
    assert run(seed=3, epoch=5) != run(seed=3, epoch=6)
    assert run(seed=3, epoch=5) != run(seed=4, epoch=5)
    # Not only the order of the batches changes: their members do too.
    members = {frozenset(g) for g in run(seed=3, epoch=5)}
    assert members != {frozenset(g) for g in run(seed=3, epoch=6)}
    # Without shuffling, batches are sorted by length and the same for any seed and epoch.
    fixed = run(seed=0, epoch=0, shuffle=False)
    assert fixed == run(seed=9, epoch=9, shuffle=False)
    firsts = [max(src[g[0]], tgt[g[0]]) for g in fixed]
    assert firsts == sorted(firsts)


def test_length_batches_pad_far_less_than_random_ones():
    src, tgt = lengths(10_000)
    groups = checked_token_batches(src, tgt, max_tokens=4_000)
    size = round(len(src) / len(groups))
    order = np.random.default_rng(0).permutation(len(src))
    random = [order[i : i + size] for i in range(0, len(src), size)]

    def padding(gs):
        return 1 - tgt.sum() / sum(len(g) * tgt[g].max() for g in gs)

    assert padding(groups) < 0.1 < 0.4 < padding(random)


def test_token_batches_edge_cases():
    assert checked_token_batches([], [], max_tokens=10) == []
    with pytest.raises(ValueError, match="one source and one target length"):
        checked_token_batches([1, 2], [1], max_tokens=10)
    with pytest.raises(ValueError, match="max_tokens must be positive"):
        checked_token_batches([1], [1], max_tokens=0)


def test_collate_shifts_the_target_and_pads():
    batch = checked_collate(
        [([11, 12, 13], [21, 22]), ([14], [23, 24, 25, 26])],
        pad_id=0,
        bos_id=2,
        eos_id=3,
        index=[40, 41],
    )
    assert batch.src.tolist() == [[11, 12, 13, 3], [14, 3, 0, 0]]
    assert batch.tgt_in.tolist() == [[2, 21, 22, 0, 0], [2, 23, 24, 25, 26]]
    assert batch.tgt_out.tolist() == [[21, 22, 3, 0, 0], [23, 24, 25, 26, 3]]
    assert batch.index.tolist() == [40, 41]
    assert (batch.n_src_tokens, batch.n_tgt_tokens) == (6, 8)
    assert batch.src.dtype == torch.long
    moved = batch.to("cpu")
    assert isinstance(moved, Batch) and torch.equal(moved.tgt_out, batch.tgt_out)
    with pytest.raises(ValueError, match="empty batch"):
        checked_collate([], pad_id=0, bos_id=2, eos_id=3)
    with pytest.raises(ValueError, match="one entry for each of the 2 pairs"):
        checked_collate(
            [([5], [6]), ([7], [8])], pad_id=0, bos_id=2, eos_id=3, index=[9]
        )


def test_the_checked_batching_is_the_chapters_on_good_input():
    """transformer.checked_batches only checks: on arguments that make batches, its
    checked_collate and checked_token_batches give exactly what the chapter's give."""
    src, tgt = lengths()
    for options in ({}, {"seed": 3, "epoch": 5}, {"shuffle": False}):
        checked = checked_token_batches(src, tgt, max_tokens=2_000, **options)
        plain = chapter_batches.token_batches(src, tgt, max_tokens=2_000, **options)
        assert [g.tolist() for g in checked] == [g.tolist() for g in plain]
    pairs = [([11, 12, 13], [21, 22]), ([14], [23, 24, 25, 26]), ([], [])]
    ids = dict(pad_id=0, bos_id=2, eos_id=3)
    for index in (None, [7, 3, 9]):
        checked = checked_collate(pairs, **ids, index=index, max_len=6)
        plain = chapter_batches.collate(pairs, **ids, index=index)
        for name in ("src", "tgt_in", "tgt_out", "index"):
            assert torch.equal(getattr(checked, name), getattr(plain, name)), name
        assert checked.n_tgt_tokens == plain.n_tgt_tokens == 9


def test_iterate_batches_covers_the_split_within_budget():
    rng = np.random.default_rng(0)
    src = [rng.integers(4, 100, rng.integers(0, 30)).tolist() for _ in range(500)]
    tgt = [rng.integers(4, 100, rng.integers(0, 30)).tolist() for _ in range(500)]
    split = EncodedSplit.from_lists(src, tgt)
    specials = type("Specials", (), {"pad_id": 0, "bos_id": 2, "eos_id": 3})()
    seen = []
    for batch in iterate_batches(split, specials, max_tokens=300, epoch=2):
        assert batch.src.numel() <= 300 and batch.tgt_in.numel() <= 300
        for row, i in enumerate(batch.index.tolist()):
            seen.append(i)
            n = len(src[i])
            assert batch.src[row, :n].tolist() == src[i] and batch.src[row, n] == 3
            assert batch.tgt_out[row, : len(tgt[i])].tolist() == tgt[i]
    assert sorted(seen) == list(range(500))


def test_encoded_split_round_trips_through_bytes_and_checks_itself():
    split = EncodedSplit.from_lists([[1, 2], [], [3]], [[4], [5, 6, 7], []])
    assert len(split) == 3
    assert [a.tolist() for a in split[1]] == [[], [5, 6, 7]]
    assert [a.tolist() for a in split[-1]] == [[3], []]
    with pytest.raises(IndexError):
        split[3]
    again = EncodedSplit.from_bytes(split.to_bytes())
    assert np.array_equal(again.tgt_offsets, split.tgt_offsets)
    assert np.array_equal(again.src_ids, split.src_ids)
    with pytest.raises(DataError, match="inconsistent src"):
        EncodedSplit(
            split.src_ids[:-1], split.src_offsets, split.tgt_ids, split.tgt_offsets
        )


def test_encoded_split_keeps_word_starts_and_checks_them():
    tokenizer = train_bpe([("▁ab", "c", "▁abc")] * 5, 12, languages=("de", "en"))
    words = [("▁abc", "c"), (), ("▁ab", "▁c", "a")]
    split = EncodedSplit.from_words(tokenizer, words, words[::-1])
    assert split.src_starts.dtype == np.bool_
    for i, sentence in enumerate(words):
        ids, starts = (
            split[i][0],
            split.src_starts[split.src_offsets[i] : split.src_offsets[i + 1]],
        )
        assert ids.tolist() == [t for w in sentence for t in tokenizer.segment(w)]
        assert starts.tolist() == [
            k == 0 for w in sentence for k in range(len(tokenizer.segment(w)))
        ]
    again = EncodedSplit.from_bytes(split.to_bytes())
    assert np.array_equal(again.tgt_starts, split.tgt_starts)
    assert (
        EncodedSplit.from_bytes(
            EncodedSplit.from_lists([[1]], [[2]]).to_bytes()
        ).src_starts
        is None
    )
    ids = (split.src_ids, split.src_offsets, split.tgt_ids, split.tgt_offsets)
    with pytest.raises(DataError, match="one side only"):
        EncodedSplit(*ids, split.src_starts, None)
    with pytest.raises(DataError, match="inconsistent src word starts"):
        EncodedSplit(*ids, split.src_starts[:-1], split.tgt_starts)
    with pytest.raises(DataError, match="inconsistent tgt word starts"):
        EncodedSplit(
            *ids, split.src_starts, ~split.tgt_starts
        )  # sentences not on a word
    with pytest.raises(DataError, match="inconsistent src word starts"):
        EncodedSplit(*ids, split.src_starts.astype(np.uint8), split.tgt_starts)


# BPE-dropout ----------------------------------------------------------------------------------


@needs_spacy
def test_bpe_dropout_at_zero_is_the_tokenizer_on_every_training_word(trained):
    for pair, (src_lang, tgt_lang) in PAIRS.items():
        plain, rng = BPEDropout(trained[pair], 0.0), Random(0)
        distinct = {
            w
            for lang in (src_lang, tgt_lang)
            for words in pretokenize(load_split("train", lang), lang)
            for w in words
        }
        assert all(
            plain.segment(w, rng) == list(trained[pair].segment(w)) for w in distinct
        )


@needs_spacy
def test_bpe_dropout_keeps_the_text_and_is_a_function_of_seed_and_epoch(
    cache, tokenizer
):
    val = load_encoded("de-en", "val", cache)
    dropout = BPEDropout(tokenizer, 0.1)
    a = dropout.resample(val, seed=3, epoch=1)
    assert len(a) == len(val) and len(a.src_ids) > 1.1 * len(val.src_ids)
    for i in range(len(val)):
        for side in (0, 1):
            assert tokenizer.decode(a[i][side]) == tokenizer.decode(val[i][side])

    # Word starts still mark whole words: the pieces of each word spell the cached word.
    def words(split: EncodedSplit, side: str) -> list[str]:
        ids, starts = getattr(split, f"{side}_ids"), getattr(split, f"{side}_starts")
        cuts = [*np.flatnonzero(starts).tolist(), len(ids)]
        text = tokenizer.pieces(ids)
        return ["".join(text[x:y]) for x, y in zip(cuts[:-1], cuts[1:], strict=True)]

    assert words(a, "src") == words(val, "src") and words(a, "tgt") == words(val, "tgt")
    same = dropout.resample(val, seed=3, epoch=1)
    for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_starts"):
        assert np.array_equal(getattr(same, name), getattr(a, name))
    assert not np.array_equal(dropout.resample(val, seed=3, epoch=2).tgt_ids, a.tgt_ids)
    assert not np.array_equal(dropout.resample(val, seed=4, epoch=1).tgt_ids, a.tgt_ids)
    source_only = dropout.resample(val, seed=3, epoch=1, sides=("src",))
    assert np.array_equal(source_only.src_ids, a.src_ids)  # the same draws
    for name in ("tgt_ids", "tgt_offsets", "tgt_starts"):
        assert np.array_equal(getattr(source_only, name), getattr(val, name))
    with pytest.raises(ValueError, match="sides"):
        dropout.resample(val, seed=3, epoch=1, sides=("source",))
    plain = BPEDropout(tokenizer, 0).resample(val, seed=3, epoch=1)
    for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets", "src_starts"):
        assert np.array_equal(getattr(plain, name), getattr(val, name))
    # The longest spelling bounds every draw, and dropping every merge reaches it.
    bound = dropout.longest_spelling(val)
    assert max(a.src_lengths.max(), a.tgt_lengths.max()) <= bound
    letters = BPEDropout(tokenizer, 1 - 1e-12).resample(val, seed=0, epoch=0)
    assert max(letters.src_lengths.max(), letters.tgt_lengths.max()) == bound
    assert dropout.longest_spelling(val, ("src",)) == letters.src_lengths.max()


def bpe_dropout_by_definition(
    word: str, rank: dict[tuple[str, str], int], p: float
) -> dict[tuple[str, ...], float]:
    """The exact distribution of BPE-dropout's spellings of `word`, as Provilkov et al.
    define it: at each step every applicable merge is dropped independently with
    probability p and the best survivor (lowest rank, leftmost) applies; every case of
    kept and dropped merges enumerated."""
    spellings: dict[tuple[str, ...], float] = {}

    def walk(symbols: list[str], probability: float) -> None:
        candidates = [
            (rank[pair], i)
            for i, pair in enumerate(itertools.pairwise(symbols))
            if pair in rank
        ]
        for kept in itertools.product((False, True), repeat=len(candidates)):
            q = probability * math.prod(1 - p if k else p for k in kept)
            survivors = [c for c, k in zip(candidates, kept, strict=True) if k]
            if not survivors:
                spellings[tuple(symbols)] = spellings.get(tuple(symbols), 0.0) + q
                continue
            _, i = min(survivors)
            walk([*symbols[:i], symbols[i] + symbols[i + 1], *symbols[i + 2 :]], q)

    walk(list(word), 1.0)
    return spellings


@pytest.mark.parametrize("word", ["▁abab", "▁abc"])
def test_bpe_dropout_draws_the_spellings_of_its_definition(word):
    # segment draws only for merges that could still win; its spellings must still come
    # with the frequencies of the definition, where every candidate is drawn at every step
    tokenizer = train_bpe([("▁abab", "▁abc")] * 3, 14, languages=("de", "en"))
    p, n = 0.3, 20_000
    dropout, rng = BPEDropout(tokenizer, p), Random(0)
    piece = {i: s for s, i in tokenizer.bpe.get_vocab().items()}
    drawn: dict[tuple[str, ...], int] = {}
    for _ in range(n):
        spelling = tuple(piece[i] for i in dropout.segment(word, rng))
        drawn[spelling] = drawn.get(spelling, 0) + 1
    exact = bpe_dropout_by_definition(word, dropout._rank, p)
    assert set(drawn) <= set(exact) and math.isclose(sum(exact.values()), 1.0)
    assert len(exact) >= 4  # several spellings, with different frequencies
    for spelling, q in exact.items():
        # within 4.5 standard errors of a binomial count
        assert abs(drawn.get(spelling, 0) / n - q) < 4.5 * math.sqrt(q * (1 - q) / n)


def test_bpe_dropout_refuses_a_bad_probability_and_a_split_without_words():
    tokenizer = train_bpe([("▁ab",)] * 3, 8, languages=("de", "en"))
    for p in (1.0, -0.1, True, "0.1"):
        with pytest.raises(ValueError, match="probability"):
            BPEDropout(tokenizer, p)
    with pytest.raises(DataError, match="word starts"):
        BPEDropout(tokenizer, 0.1).resample(
            EncodedSplit.from_lists([[4]], [[5]]), seed=0, epoch=0
        )


# The cache ------------------------------------------------------------------------------------


@needs_spacy
def test_the_cache_holds_the_fresh_encoding(cache, tokenizer):
    for split in SPLITS:
        pairs = load_pairs(split, "de-en")
        fresh = EncodedSplit.from_lists(
            tokenizer.encode_batch([s for s, _ in pairs], "de"),
            tokenizer.encode_batch([t for _, t in pairs], "en"),
        )
        cached = load_encoded("de-en", split, cache)
        for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets"):
            assert np.array_equal(getattr(cached, name), getattr(fresh, name))
    assert not any(p.name.endswith(".tmp") for p in (cache / "de-en").iterdir())


@needs_spacy
def test_a_current_cache_is_loaded_not_rebuilt(cache, monkeypatch):
    def no_training(*args, **kwargs):
        raise AssertionError("prepare rebuilt a current cache")

    monkeypatch.setattr(cache_module, "train_tokenizer", no_training)
    assert prepare("de-en", cache).vocab_size == VOCAB_SIZE


@needs_spacy
def test_a_corrupt_cache_is_refused_by_load_encoded_and_rebuilt_by_prepare(cache_copy):
    folder = cache_copy / "de-en"
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    damaged = folder / "val.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-4])
    with pytest.raises(
        DataError, match=r"val\.safetensors is corrupt.*prepare --pair de-en"
    ):
        load_encoded("de-en", "train", cache_copy)
    prepare("de-en", cache_copy)
    assert cache_problems("de-en", cache_copy) == []
    # The rebuild trained the tokenizer again: training is deterministic, files are identical.
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert len(load_encoded("de-en", "val", cache_copy)) == 1_014


@needs_spacy
def test_a_tokenizer_this_version_cannot_read_is_a_data_error(cache_copy):
    # Its checksum matches the manifest, but its format is not ours: prepare says so in the
    # error every command reports in one line, not with a traceback.
    folder = cache_copy / "de-en"
    other = json.dumps({"format": TOKENIZER_FORMAT.replace("1", "99")}).encode()
    (folder / "tokenizer.json").write_bytes(other)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["tokenizer_sha256"] = hashlib.sha256(other).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(
        DataError, match="cannot read tokenizer .*tokenizer.json: format"
    ):
        prepare("de-en", cache_copy)


@needs_spacy
def test_the_cache_is_used_as_it_was_checked(cache_copy, monkeypatch):
    # Each file is read once, checked, and those bytes are used: a rebuild that replaced a
    # file between a check and a second read could hand out ids nobody checked.
    reads = []
    read_bytes = Path.read_bytes

    def counted(path: Path) -> bytes:
        if cache_copy in path.parents:  # the cache's files, not the data's SHA256SUMS
            reads.append(path.name)
        return read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", counted)
    load_encoded("de-en", "val", cache_copy)
    prepare("de-en", cache_copy)
    names = ["tokenizer.json", *(f"{split}.safetensors" for split in SPLITS)]
    assert sorted(reads) == sorted(names * 2)


@needs_spacy
def test_a_rebuild_without_readable_data_keeps_the_old_cache(cache_copy, tmp_path):
    # A wrong data folder makes the cache look stale to prepare, which then rebuilds; the
    # build must fail before it touches the good cache, not after deleting its manifest.
    with pytest.raises(DataError, match="missing checksum file"):
        prepare("de-en", cache_copy, data_dir=tmp_path / "nowhere")
    with pytest.raises(DataError, match="missing checksum file"):
        prepare("de-en", cache_copy, data_dir=tmp_path / "nowhere", rebuild=True)
    assert cache_problems("de-en", cache_copy) == []


@needs_spacy
def test_stale_and_incomplete_caches_are_named(cache_copy, tmp_path):
    folder = cache_copy / "de-en"
    assert cache_problems("de-en", cache_copy, vocab_size=VOCAB_SIZE) == []
    assert cache_problems("de-en", cache_copy, vocab_size=4_000) == [
        f"built with vocab_size={VOCAB_SIZE}, asked for 4000"
    ]
    # Data that changed since the build (here: a different checksum for one file).
    data_copy = tmp_path / "multi30k"
    shutil.copytree(DATA_DIR, data_copy)
    sums = data_copy / "SHA256SUMS"
    sums.write_text(sums.read_text().replace("val.de.gz", "old.de.gz"))
    assert cache_problems("de-en", cache_copy, data_dir=data_copy) == [
        "val.de.gz has changed since the cache was built"
    ]
    with pytest.raises(DataError, match="val.de.gz has changed"):
        load_encoded("de-en", "test_2016_flickr", cache_copy, data_dir=data_copy)
    # A manifest whose table of data checksums is not a table: named, not an AttributeError.
    manifest = folder / "manifest.json"
    intact = manifest.read_text()
    manifest.write_text(json.dumps(json.loads(intact) | {"data": None}))
    assert cache_problems("de-en", cache_copy) == [
        "manifest.json holds no table of data checksums (field data)"
    ]
    with pytest.raises(DataError, match=r"no table of data checksums \(field data\)"):
        load_encoded("de-en", "val", cache_copy)
    manifest.write_text(intact)
    # A missing split file, then a build that never finished (no manifest).
    (folder / "test_2016_flickr.safetensors").unlink()
    assert cache_problems("de-en", cache_copy) == [
        "test_2016_flickr.safetensors is missing"
    ]
    (folder / "manifest.json").unlink()
    with pytest.raises(DataError, match="no manifest.json"):
        load_encoded("de-en", "val", cache_copy)
    (folder / "manifest.json").write_text("{not json")
    assert cache_problems("de-en", cache_copy)[0].startswith(
        "manifest.json is unreadable"
    )
    with pytest.raises(DataError, match="unknown split"):
        load_encoded("de-en", "test", cache_copy)


def test_swapped_loader_arguments_are_named():
    """The raw-text loaders take the split first, load_encoded the pair: a swap says so."""
    for call, signature in [
        (lambda: load_split("de", "val"), r"load_split\(split, language\): swapped"),
        (lambda: load_pairs("de-en", "val"), r"load_pairs\(split, pair\): swapped"),
        (lambda: load_encoded("val", "de-en"), r"load_encoded\(pair, split\): swapped"),
    ]:
        with pytest.raises(DataError, match=signature):
            call()
    with pytest.raises(DataError, match="choose one of train, val, test_2016_flickr$"):
        load_split("test", "de")  # not a swap: no hint


@needs_spacy
def test_training_from_the_cache_needs_no_spacy(cache):
    """On a machine without spaCy (the GPU machine), the cache is all training needs."""
    script = textwrap.dedent(
        f"""
        import sys
        sys.modules["spacy"] = None  # import spacy now raises ImportError
        from transformer.encoded_cache import load_encoded, prepare
        from transformer.encoded_split import iterate_batches
        tokenizer = prepare("de-en", {str(cache)!r})
        train = load_encoded("de-en", "train", {str(cache)!r})
        batch = next(iterate_batches(train, tokenizer, max_tokens=1000))
        print(tokenizer.decode(batch.tgt_out[0]))
        try:
            tokenizer.encode("Ein Hund.")
        except ImportError as err:
            print("encode:", err)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "encode: tokenising text needs spaCy" in result.stdout


# The command ----------------------------------------------------------------------------------


def run_prepare(argv: list[str], capsys) -> tuple[int, str, str]:
    """`python -m transformer prepare ARGV...`, through the package's command dispatcher."""
    from transformer.__main__ import main

    capsys.readouterr()
    status = main(["prepare", *argv])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.mark.parametrize(
    "case",
    [
        "unknown pair",
        "bad option",
        "bad value",
        "missing data dir",
        "corrupt SHA256SUMS",
        "unwritable cache dir",
    ],
)
def test_prepare_errors_are_one_line_and_status_2(case, tmp_path, capsys):
    # A fresh cache folder each time: a failed build must not touch the book's cache.
    argv = ["--pair", "de-en", "--cache-dir", str(tmp_path / "cache")]
    if case == "unknown pair":
        argv[1] = "en-de"
        needle = "unknown language pair 'en-de': choose one of de-en, fr-en"
    elif case == "bad option":
        argv.append("--vocab-size=many")
        needle = "--vocab-size"
    elif case == "bad value":
        argv.append("--vocab-size=4")
        needle = "--vocab-size must exceed 4, got 4"
    elif case == "missing data dir":
        argv += ["--data-dir", str(tmp_path / "nowhere")]
        needle = f"missing checksum file {tmp_path / 'nowhere' / 'SHA256SUMS'}"
    elif case == "unwritable cache dir":
        if importlib.util.find_spec("spacy") is None:
            pytest.skip("the build reaches the cache folder only with spaCy")
        (tmp_path / "cache").write_text("a file where the cache folder should be\n")
        needle = f"Not a directory: '{tmp_path / 'cache' / 'de-en'}'"
    else:
        data_copy = tmp_path / "multi30k"
        shutil.copytree(DATA_DIR, data_copy)
        sums = data_copy / "SHA256SUMS"
        sums.write_text("not a checksum\n" + sums.read_text())
        argv += ["--data-dir", str(data_copy)]
        needle = f"{sums}:1: malformed line 'not a checksum'"
    status, out, err = run_prepare(argv, capsys)
    assert status == 2 and out == "", (out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("python -m transformer prepare: error: "), err
    assert needle in err, err


def test_a_missing_checksum_file_gives_advice_that_fits_whose_folder_it_is(
    tmp_path, capsys, monkeypatch
):
    # A folder the user named: advice about the folder, not to reinstall the package.
    nowhere = tmp_path / "nowhere"
    multi30k = (
        "the repository's data/multi30k, which holds the data files and SHA256SUMS"
    )
    with pytest.raises(DataError) as missing:
        checked_data.expected_checksums(nowhere)
    assert str(missing.value) == (
        f"missing checksum file {nowhere / 'SHA256SUMS'} (there is no folder "
        f"{nowhere}: name a copy of {multi30k})"
    )
    with pytest.raises(DataError) as empty:
        load_split("val", "de", data_dir=tmp_path)
    assert str(empty.value) == (
        f"missing checksum file {tmp_path / 'SHA256SUMS'} ({tmp_path} is not a copy "
        f"of {multi30k})"
    )
    cache = str(tmp_path / "cache")
    argv = ["--pair", "de-en", "--cache-dir", cache, "--data-dir", str(nowhere)]
    status, _, err = run_prepare(argv, capsys)
    assert status == 2 and f"there is no folder {nowhere}" in err
    assert "pip install" not in err
    # The package's own folder, by default or named: install the package from a clone.
    monkeypatch.setattr(checked_data, "DATA_DIR", tmp_path / "multi30k")
    reinstall = "install it with `pip install -e .` in a clone)"
    monkeypatch.chdir(tmp_path)
    for named in (checked_data.DATA_DIR, Path("multi30k")):
        with pytest.raises(DataError, match="missing checksum file") as default:
            checked_data.expected_checksums(named)
        assert str(default.value).endswith(reinstall)
