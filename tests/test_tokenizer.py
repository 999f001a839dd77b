"""Normalisation, spaCy's words and the joint BPE tokenizer: transformer.tokenizer,
transformer.vocabulary and transformer.words (the package's words)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tokenizers
import torch

from transformer import words
from transformer.encoded_cache import prepare, train_tokenizer
from transformer.multi30k import PAIRS, SPLITS, load_pairs, load_split
from transformer.tokenizer import (
    MARK,
    SPECIALS,
    VOCAB_SIZE,
    Tokenizer,
    TokenizerError,
    learn_merges,
    normalize,
    pretokenize,
    spacy_tokenizer,
    train_bpe,
)

needs_spacy = pytest.mark.skipif(
    importlib.util.find_spec("spacy") is None, reason="needs spaCy (transformer[data])"
)


@pytest.fixture(scope="module")
def trained() -> dict[str, Tokenizer]:
    """The book's tokenizer of each pair, learned from its training split."""
    return {
        pair: train_tokenizer(load_pairs("train", pair), languages=languages)
        for pair, languages in PAIRS.items()
    }


# BPE by hand and the library ------------------------------------------------------------------

# The data chapter's four caption pairs, on which it prints the loop's first merges.
TOY = {
    "de": [
        "Ein Hund rennt.",
        "Zwei Hunde rennen im Schnee.",
        "Ein Mann rennt mit seinem Hund.",
        "Die Hunde spielen im Schnee.",
    ],
    "en": [
        "A dog runs.",
        "Two dogs run in the snow.",
        "A man runs with his dog.",
        "The dogs play in the snow.",
    ],
}


def library_merges(words, vocab_size: int) -> list[tuple[str, str]]:
    """The merges of Hugging Face's BpeTrainer as the package runs it (train_bpe)."""
    bpe = train_bpe(words, vocab_size, languages=("de", "en")).bpe
    return [tuple(m) for m in json.loads(bpe.to_str())["model"]["merges"]]


def corpus(name: str) -> tuple[tuple[str, ...], ...]:
    """The words of the toy captions, or of the first 50 training pairs of a pair."""
    if name == "toy":
        return pretokenize(TOY["de"], "de") + pretokenize(TOY["en"], "en")
    src_lang, tgt_lang = PAIRS[name]
    sources, targets = zip(*load_pairs("train", name)[:50], strict=True)
    return pretokenize(sources, src_lang) + pretokenize(targets, tgt_lang)


@pytest.mark.parametrize("name", ["toy", *PAIRS])
def test_the_chapters_merges_are_the_librarys_to_the_last(name: str):
    """learn_merges, the loop the data chapter writes out, learns the merges that
    train_bpe gets from the library, in the same order, until every word is one symbol.
    Both see the same words: pretokenize's, marked with ▁ at a word's start, which
    train_bpe joins with spaces and the library splits there again (WhitespaceSplit, no
    end-of-word suffix, no continuing-subword prefix).

    Ties: BpeTrainer keeps the pairs in a heap ordered by count, then by the smaller
    (left id, right id), where ids number the special tokens, then the characters in
    code-point order, then each new symbol as a merge makes it. learn_merges ranks the
    symbols the same way. The tail of a real sample is mostly pairs seen once, so
    another rule (say, alphabetical order) parts from the library within the first
    twenty merges of each pair's sample."""
    words = corpus(name)
    merges = library_merges(words, 100_000)
    assert learn_merges(words, 100_000) == merges
    assert learn_merges(words, 10) == merges[:10]
    if name == "toy":
        assert len(merges) == 74 and merges[:3] == [("u", "n"), ("▁", "r"), ("e", "n")]


def test_the_library_stops_at_the_vocabulary_size_where_the_loop_stops_at_its_count():
    """train_bpe stops when the vocabulary holds vocab_size entries (4 specials, the
    characters, and the new symbol of each merge: here no merge makes a symbol twice);
    learn_merges after as many merges."""
    words = corpus("de-en")
    characters = len(set("".join(w for sentence in words for w in sentence)))
    merges = library_merges(words, len(SPECIALS) + characters + 300)
    assert len(merges) == 300
    assert learn_merges(words, 300) == merges


# Normalisation and the round trip -------------------------------------------------------------


def test_normalize_is_nfc_and_single_spaces():
    decomposed = "Cafe\u0301  am\u00a0Meer\t "
    assert normalize(decomposed) == "Café am Meer"
    assert normalize(normalize(decomposed)) == normalize(decomposed)
    assert normalize(" \t\n") == ""


@needs_spacy
@pytest.mark.parametrize("pair", list(PAIRS))
def test_round_trip_holds_for_every_sentence_of_every_split(trained, pair):
    tokenizer = trained[pair]
    for language in PAIRS[pair]:
        for split in SPLITS:
            sentences = load_split(split, language)
            encoded = tokenizer.encode_batch(sentences, language)
            for sentence, ids in zip(sentences, encoded, strict=True):
                assert tokenizer.unk_id not in ids, sentence
                assert tokenizer.decode(ids) == normalize(sentence)


@pytest.mark.parametrize("language", ["de", "fr", "en"])
def test_val_and_test_use_only_characters_of_train(language):
    seen = set("".join(normalize(s) for s in load_split("train", language)))
    for split in ("val", "test_2016_flickr"):
        new = set("".join(normalize(s) for s in load_split(split, language))) - seen
        assert new == set(), f"{split}.{language} has characters unseen in train: {new}"


# The vocabulary sees the training words only ---------------------------------------------------


@needs_spacy
def test_training_is_deterministic(trained):
    # A cache rebuilt from the same text holds the same vocabulary, byte for byte.
    again = train_tokenizer(load_pairs("train", "de-en"), languages=("de", "en"))
    assert again.to_json() == trained["de-en"].to_json()


@needs_spacy
def test_every_entry_comes_from_training_words_and_test_only_words_are_not_entries(
    trained,
):
    tokenizer = trained["de-en"]
    train = pretokenize(load_split("train", "de"), "de") + pretokenize(
        load_split("train", "en"), "en"
    )
    train_words = {w for s in train for w in s}
    everything = "\n".join(train_words)
    # A BPE entry is a run of adjacent symbols of some training word.
    entries = set(tokenizer.bpe.get_vocab()) - set(SPECIALS)
    assert [e for e in entries if e not in everything] == []
    # Hence a test word that no training word contains is never one: the tokenizer spells it
    # from several pieces of training words, without <unk>.
    test = pretokenize(load_split("test_2016_flickr", "de"), "de")
    unseen = {w for s in test for w in s if len(w) > 4 and w not in everything}
    assert len(unseen) > 50
    for word in unseen:
        ids = tokenizer.segment(word)
        assert len(ids) > 1 and tokenizer.unk_id not in ids, word
        assert "".join(tokenizer.pieces(ids)) == word


# Special tokens, unknown characters, empty and overlong sentences -------------------------------


def test_special_ids_are_read_from_the_vocabulary():
    vocab = {"a": 0, "<eos>": 1, "<pad>": 2, "<unk>": 3, "b": 4, "<bos>": 5, MARK: 6}
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>"))
    tokenizer = Tokenizer(bpe, languages=("de", "en"))
    assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id) == (
        2,
        3,
        5,
        1,
    )
    assert tokenizer.decode([5, 6, 0, 4, 1, 0, 2]) == "ab"
    del vocab["<bos>"]
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(vocab, [], unk_token="<unk>"))
    with pytest.raises(TokenizerError, match=r"lacks the special tokens \['<bos>'\]"):
        Tokenizer(bpe, languages=("de", "en"))


@needs_spacy
def test_the_trained_vocabulary_has_the_asked_size_and_four_specials(trained):
    for tokenizer in trained.values():
        assert tokenizer.vocab_size == VOCAB_SIZE
        ids = [tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id]
        assert len(set(ids)) == 4 and tokenizer.pieces(ids) == list(SPECIALS)
    with pytest.raises(ValueError, match="vocab_size must exceed 4, got 4"):
        train_bpe([("▁ab",)], 4, languages=("de", "en"))


@needs_spacy
def test_unknown_characters_become_unk_and_do_not_crash(trained):
    tokenizer = trained["de-en"]
    ids = tokenizer.encode("Ein Hund 😀 frisst 北京 für 5 €.")
    assert ids.count(tokenizer.unk_id) == 4
    assert tokenizer.decode(ids) == "Ein Hund <unk> frisst <unk><unk> für 5 <unk>."
    # The word mark ▁ is reserved: in the text it is an unknown character, not a space.
    ids = tokenizer.encode(f"ein{MARK}Hund")
    assert tokenizer.unk_id in ids and tokenizer.decode(ids) == "ein<unk>Hund"


@needs_spacy
def test_empty_and_overlong_sentences_are_encoded_whole(trained):
    tokenizer = trained["de-en"]
    assert tokenizer.encode("") == [] and tokenizer.encode(" \t ") == []
    assert tokenizer.decode([]) == ""
    text = " ".join(["Ein Hund läuft über die Wiese."] * 200)
    ids = tokenizer.encode(text)
    assert len(ids) > 1_000 and tokenizer.decode(ids) == text  # never truncated


@needs_spacy
def test_decode_stops_at_eos_skips_bos_and_pad_and_checks_ids(trained):
    tokenizer = trained["de-en"]
    ids = tokenizer.encode("Ein Hund.")
    framed = [tokenizer.bos_id, *ids, tokenizer.eos_id, *ids, tokenizer.pad_id]
    assert tokenizer.decode(framed) == "Ein Hund."
    assert tokenizer.decode(torch.tensor(framed)) == "Ein Hund."
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([tokenizer.vocab_size])
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tokenizer.decode([-1])


@needs_spacy
def test_encode_uses_the_source_language_by_default(trained):
    tokenizer = trained["fr-en"]
    text = "L'homme regarde l'eau."
    assert tokenizer.encode(text) == tokenizer.encode(text, "fr")
    with pytest.raises(ValueError, match="not one of"):
        tokenizer.encode(text, "de")
    with pytest.raises(TypeError):
        pretokenize("one string", "fr")


@needs_spacy
def test_segmentation_cache_is_bounded_and_changes_no_output(trained):
    tokenizer = Tokenizer(trained["de-en"].bpe, languages=("de", "en"))  # a fresh cache
    words = [f"▁{w}" for w in "Ein Mann fährt Fahrrad auf der Straße".split()] * 2
    expected = [tuple(t.id for t in tokenizer.bpe.model.tokenize(w)) for w in words]
    tokenizer.segmentation_cache_size = 3
    assert [tokenizer.segment(w) for w in words] == expected
    assert 0 < len(tokenizer._segmentations) <= 3


# The package's words ---------------------------------------------------------------------------


@needs_spacy
def test_the_packages_words_are_the_chapters(trained, tmp_path):
    """The package cuts French with a faster build of spaCy's rules (transformer.words):
    the words, and so the ids, are those of the chapter's spacy.blank tokenizer. Every
    tokenizer that the package learns or reads uses it; the chapter's Tokenizer.load does
    not."""
    for split in ("val", "test_2016_flickr"):
        french = load_split(split, "fr")
        assert words.fast_pretokenize(french, "fr") == pretokenize(french, "fr")
    assert words.spacy_tokenizer("de") is spacy_tokenizer("de")
    learned = trained["fr-en"]
    assert learned.splitter is words.spacy_tokenizer
    path = tmp_path / "tokenizer.json"
    learned.save(path)
    chapters = Tokenizer.load(path)
    assert chapters.splitter is None
    loaded = words.load_tokenizer(path)
    assert loaded.splitter is words.spacy_tokenizer
    assert loaded.to_json() == chapters.to_json()
    sentences = load_split("val", "fr")
    assert loaded.encode_batch(sentences, "fr") == chapters.encode_batch(
        sentences, "fr"
    )


@needs_spacy
def test_a_prepared_cache_gives_the_packages_words(tmp_path):
    tokenizer = prepare("fr-en", tmp_path, vocab_size=300)
    assert tokenizer.splitter is words.spacy_tokenizer


@needs_spacy
def test_a_shipped_model_translates_french_without_spacys_slow_build():
    """The command line and `translate` read a model's tokenizer with load_model, which plugs
    in the fast French build: spaCy's French package, whose import takes seconds, is never
    imported."""
    code = (
        "import sys; from transformer.translation import load_pair_model;"
        " model, tokenizer = load_pair_model('fr-en');"
        " print(tokenizer.encode_batch(['Un chien court.'], 'fr'));"
        " print('spacy.lang.fr' in sys.modules)"
    )
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=root,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "False"


# Saving and loading ---------------------------------------------------------------------------


@needs_spacy
def test_save_and_load_give_the_same_tokenizer(trained, tmp_path):
    tokenizer = trained["de-en"]
    path = tmp_path / "tokenizer.json"
    tokenizer.save(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenizer.json"]  # no temp
    loaded = Tokenizer.load(path)
    assert type(loaded) is Tokenizer and loaded.to_json() == tokenizer.to_json()
    assert json.loads(loaded.to_json())["word_mark"] == MARK
    sentences = load_split("val", "en")[:50]
    assert loaded.encode_batch(sentences, "en") == tokenizer.encode_batch(
        sentences, "en"
    )


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        ("missing", "No such file"),
        ("truncated", "Unterminated string|Expecting|EOF"),
        ("other format", "format 'something else', not 'transformer-book tokenizer 1'"),
        ("not UTF-8", "codec can't decode"),
    ],
)
def test_an_unreadable_tokenizer_file_is_one_clear_error(tmp_path, damage, needle):
    path = tmp_path / "tokenizer.json"
    train_bpe([("▁ab", "c")] * 3, 8, languages=("de", "en")).save(path)
    if damage == "missing":
        path.unlink()
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "other format":
        path.write_text(json.dumps({"format": "something else"}))
    else:
        path.write_bytes(b"\xff\xfe" + path.read_bytes())
    prefix = re.escape(f"cannot read tokenizer {path}: ")
    with pytest.raises(TokenizerError, match=prefix) as err:
        Tokenizer.load(path)
    assert err.match(needle)


@pytest.mark.parametrize("failing", ["fsync", "replace"])
def test_a_failed_save_keeps_the_old_file_and_leaves_no_temporary(
    tmp_path, monkeypatch, failing
):
    """When the disk fails during Tokenizer.save (here os.fsync or os.replace raises), the
    previous file is intact, byte for byte, and no temporary file is left in the folder."""
    old = train_bpe([("▁ab", "c")] * 3, 8, languages=("de", "en"))
    new = train_bpe([("▁xy", "z")] * 3, 8, languages=("de", "en"))
    path = tmp_path / "tokenizer.json"
    old.save(path)
    before = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(os, failing, fail)
        with pytest.raises(OSError, match="No space left"):
            new.save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["tokenizer.json"]
    assert Tokenizer.load(path).to_json() == old.to_json()
