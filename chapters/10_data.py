# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The data: Multi30k
#
# The paper trains on WMT 2014, 4.5 million English–German sentence pairs. This book trains on
# Multi30k {cite:p}`elliott2016multi30k`, image captions in English with German translations and,
# since the WMT 2017 shared task {cite:p}`elliott2017findings`, French ones: 29,000 training
# pairs, small enough to train a real model on one GPU in minutes.
#
# | split | sentences | used for |
# | --- | --- | --- |
# | `train` | 29,000 | learning the weights and the subword vocabulary |
# | `val` | 1,014 | choosing hyperparameters and checkpoints |
# | `test_2016_flickr` | 1,000 | the BLEU scores we report, never used to choose anything |
#
# A model reads integers, not text. This chapter builds the road from one to the other and back,
# in two modules: `transformer.tokenizer` (spaCy's words and a subword vocabulary shared by both
# languages) and `transformer.data` (the files, a cache of token ids, and batches of sentences
# of similar length).

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)

# %% tags=["remove-cell"]
#| default_exp data

# %% [markdown]
# ## Reading a split
#
# The raw text ships with the repository, gzipped in `data/multi30k/` (about 2 MB). Every file is checked against its SHA-256 digest in `SHA256SUMS` before
# it is used, and both sides of a split must have as many lines, so a truncated or edited file
# fails at once with its name. A translation direction is a *pair*, `de-en` or `fr-en`: the book
# always translates into English, so both pairs share their references and every reader can judge
# the output.

# %%
#| export
"""Multi30k: the checked files of data/multi30k, the encoded cache, batches and
BPE-dropout."""

import gzip
import hashlib
import importlib.util
import string
import zlib
from pathlib import Path


def _repository_root() -> Path:
    # The package is <root>/transformer. In it this file has a __file__; in its
    # chapter (a notebook, which may run anywhere, e.g. Colab's /content) the
    # installed package says.
    here = (
        globals().get("__file__")
        or importlib.util.find_spec("transformer").origin
    )
    return Path(here).resolve().parent.parent


DATA_DIR = _repository_root() / "data" / "multi30k"
PAIRS = {"de-en": ("de", "en"), "fr-en": ("fr", "en")}
SPLITS = ("train", "val", "test_2016_flickr")


class DataError(Exception):
    """A data file is missing, corrupt or inconsistent, or a split or pair is
    unknown."""


def check_split(split: str, signature: str) -> None:
    """A clear error for a split the book does not have; `signature`, the
    caller's, is shown when `split` looks like a pair or a language (raw text
    loaders take the split first, `load_encoded` the pair)."""
    if split not in SPLITS:
        swapped = split in PAIRS or any(
            split in langs for langs in PAIRS.values()
        )
        hint = f" (the arguments are {signature}: swapped?)" if swapped else ""
        raise DataError(
            f"unknown split {split!r}: choose one of {', '.join(SPLITS)}{hint}"
        )


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), with a clear error for a pair the book does not
    have."""
    if pair not in PAIRS:
        raise DataError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    return PAIRS[pair]


_MULTI30K = (
    "the repository's data/multi30k, which holds the data files and SHA256SUMS"
)


def _data_dir_advice(data_dir: Path) -> str:
    """What to do about a data folder without SHA256SUMS: it depends on whose
    it is."""
    if (
        Path(data_dir).absolute() == DATA_DIR
    ):  # the package's own, data/multi30k
        return (
            "the package reads the data of the repository it was installed"
            " from: install it with `pip install -e .` in a clone"
        )
    # A folder the user named (--data-dir): reinstalling would not help.
    if Path(data_dir).is_dir():
        return f"{data_dir} is not a copy of {_MULTI30K}"
    return f"there is no folder {data_dir}: name a copy of {_MULTI30K}"


def expected_checksums(data_dir: Path = DATA_DIR) -> dict[str, str]:
    """File name -> SHA-256 from data_dir/SHA256SUMS."""
    sums = Path(data_dir) / "SHA256SUMS"
    if not sums.is_file():
        raise DataError(
            f"missing checksum file {sums} ({_data_dir_advice(data_dir)})"
        )
    try:
        text = sums.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"corrupt checksum file {sums}: not UTF-8 text ({err})"
        ) from err
    checksums = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        # `sha256sum` writes "digest  name", or "digest *name" in binary mode
        fields = line.split(maxsplit=1)
        digest = fields[0].lower()
        if (
            len(fields) != 2
            or len(digest) != 64
            or set(digest) - set(string.hexdigits)
        ):
            raise DataError(f"{sums}:{number}: malformed line {line!r}")
        checksums[fields[1].strip().removeprefix("*")] = digest
    return checksums


def read_lines(path: Path, sha256: str) -> list[str]:
    """The lines of a gzipped UTF-8 file, after checking its SHA-256."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing data file {path}")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise DataError(
            f"corrupt or truncated data file {path}: SHA-256 {digest[:12]}…,"
            f" expected {sha256[:12]}… (restore it with `git checkout --"
            f" {path}`)"
        )
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise DataError(f"cannot read data file {path}: {err}") from err
    # "\n" only: str.splitlines would also cut at \r, \x0c, U+2028 and others
    # inside a line.
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def load_split(
    split: str, language: str, data_dir: Path = DATA_DIR
) -> list[str]:
    """The sentences of one split in one language, one per line of the file."""
    check_split(split, "load_split(split, language)")
    name = f"{split}.{language}.gz"
    checksums = expected_checksums(data_dir)
    if name not in checksums:
        raise DataError(
            f"no checksum for {name} in {Path(data_dir) / 'SHA256SUMS'}"
        )
    return read_lines(Path(data_dir) / name, checksums[name])


def load_pairs(
    split: str, pair: str, data_dir: Path = DATA_DIR
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a split, e.g. load_pairs("val",
    "de-en")."""
    check_split(split, "load_pairs(split, pair)")
    src_lang, tgt_lang = parse_pair(pair)
    src = load_split(split, src_lang, data_dir)
    tgt = load_split(split, tgt_lang, data_dir)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}.{src_lang}.gz has {len(src)} lines but"
            f" {split}.{tgt_lang}.gz has {len(tgt)}"
        )
    return list(zip(src, tgt, strict=True))


# %% [markdown]
# Every split of both pairs loads, with the sizes of the table above:

# %%
import pandas as pd

from transformer.data import PAIRS, SPLITS, load_pairs

sizes = pd.DataFrame(
    [
        {"pair": p, "split": s, "sentence pairs": len(load_pairs(s, p))}
        for p in PAIRS
        for s in SPLITS
    ]
).pivot(index="split", columns="pair", values="sentence pairs")
assert sizes.loc["train"].tolist() == [29_000, 29_000]
assert sizes.loc["val"].tolist() == [1_014, 1_014]
assert sizes.loc["test_2016_flickr"].tolist() == [1_000, 1_000]
sizes

# %% [markdown]
# The first three training pairs of each direction:

# %%
for pair in PAIRS:
    for source, target in load_pairs("train", pair)[:3]:
        print(f"{pair}  {source}\n       {target}")

# %% [markdown]
# ## From text to words
#
# The paper says only that "sentences were encoded using byte-pair encoding" (Section 5.1). Two
# steps come first, and they decide whether a translation can be turned back into text exactly.
#
# **One normalisation.** A sentence is put in Unicode normal form C (an "é" is always one code
# point, never an "e" followed by a combining accent), every run of whitespace becomes one space,
# and the ends are stripped. That is the only change the text ever undergoes: for every
# sentence $x$,
#
# $$
# \mathrm{decode}(\mathrm{encode}(x)) = \mathrm{normalize}(x).
# $$
#
# **Words.** Subwords are learned inside words, so the text is first cut into words and
# punctuation marks by spaCy's rule-based tokenizers {cite:p}`honnibal2020spacy`
# (`spacy.blank("de")`, with no trained model to download): *Büsche.* becomes *Büsche* and *.*;
# French *l'homme* becomes *l'* and *homme*. Each word that starts the sentence or follows a
# space gets the prefix ▁ (U+2581), as in SentencePiece {cite:p}`kudo2018sentencepiece`, so that
# gluing the words together and turning each ▁ into a space gives the normalised sentence back.
# A ▁ in the input is read as an unknown character.

# %%
#| export tokenizer
"""Text to token ids and back: one normalisation, spaCy's words and a joint BPE
vocabulary."""

import unicodedata
from collections.abc import Sequence
from functools import cache, lru_cache

# "▁": this word starts the sentence or follows a space (as in SentencePiece)
MARK = "\u2581"
# A literal ▁ in the input becomes this character, absent from the training
# text: <unk>.
_MARK_STAND_IN = "\ufffd"


def normalize(text: str) -> str:
    """The one normalisation: Unicode NFC, each run of whitespace to one space,
    ends stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


@cache
def _spacy_tokenizer(language: str):
    # Imported here, not at the top of the module: training from an encoded
    # cache (see `prepare`) runs on machines without spaCy.
    try:
        import spacy
    except ImportError as err:
        raise ImportError(
            "tokenising text needs spaCy: pip install -e '.[data]' in the"
            " repository (training from a prepared cache does not)"
        ) from err
    return spacy.blank(language).tokenizer  # rule-based; no trained pipeline


def _pretokenize(
    language: str, texts: tuple[str, ...]
) -> tuple[tuple[str, ...], ...]:
    clean = [normalize(t).replace(MARK, _MARK_STAND_IN) for t in texts]
    sentences = []
    for doc in _spacy_tokenizer(language).pipe(clean, batch_size=1_000):
        words, after_space = [], True
        for token in doc:
            words.append(MARK + token.text if after_space else token.text)
            after_space = bool(token.whitespace_)
        sentences.append(tuple(words))
    return tuple(sentences)


# The chapter, `train_tokenizer` and `prepare` split the same whole splits:
# remember those.
_pretokenize_split = lru_cache(maxsize=12)(_pretokenize)


def pretokenize(
    texts: Sequence[str], language: str
) -> tuple[tuple[str, ...], ...]:
    """Normalise each text and cut it into spaCy words, marking with ▁ each
    word that starts the sentence or follows a space."""
    if isinstance(texts, str):
        raise TypeError(
            "pretokenize takes a sequence of texts, not one string"
        )
    texts = tuple(texts)
    if len(texts) >= 1_000:
        return _pretokenize_split(language, texts)
    return _pretokenize(language, texts)


# %% [markdown]
# A messy sentence, normalised and cut into words:

# %%
from transformer.data import load_split
from transformer.tokenizer import MARK, normalize, pretokenize

messy = " Ein  Hund\tläuft\u00a0über die Wiese, nicht wahr? "
print(repr(normalize(messy)))
print(pretokenize([messy], "de")[0])
assert normalize(messy) == "Ein Hund läuft über die Wiese, nicht wahr?"
assert pretokenize(["l'homme"], "fr")[0] == (MARK + "l'", "homme")

# %% [markdown]
# Every sentence of every file, cut into words, glues back into its normalised self (spaCy over
# the three languages takes a few seconds):

# %%
LANGUAGES = ("de", "fr", "en")
raw = {
    lang: {split: load_split(split, lang) for split in SPLITS}
    for lang in LANGUAGES
}
words = {
    lang: {split: pretokenize(raw[lang][split], lang) for split in SPLITS}
    for lang in LANGUAGES
}
for lang in LANGUAGES:
    for split in SPLITS:
        for sentence, ws in zip(
            raw[lang][split], words[lang][split], strict=True
        ):
            assert normalize(sentence)  # no sentence is empty
            assert "".join(ws).replace(MARK, " ").strip() == normalize(
                sentence
            )
n = sum(len(words[lang][split]) for lang in LANGUAGES for split in SPLITS)
print(f"{n:,} sentences")
print("the first German training sentence:", words["de"]["train"][0])

# %% [markdown]
# ## A subword vocabulary shared by both languages
#
# A vocabulary of whole words has no entry for a word it has not seen, and German compounds
# (*Feuerwehrangehörige*) make many of those. Byte-pair encoding {cite:p}`sennrich2016neural`
# starts from single characters and learns *merges*: it repeatedly fuses the most frequent pair
# of adjacent symbols in the training words into a new symbol, until the vocabulary holds the
# number of entries asked for. Frequent words end up as one symbol, rare ones as a few pieces,
# and every word made of known characters can be written. The paper learns "a shared
# source-target vocabulary" (Section 5.1), which lets the model use one embedding matrix for the
# encoder, the decoder and the output layer (Section 3.4, {cite:p}`press2017using`). So does the
# book, with Hugging Face's `tokenizers`: one vocabulary per pair, learned from both sides of the
# training split only, since validation and test stand for text the model has never seen.
#
# **Four special tokens.** `<pad>` fills a batch's rows up to its longest sentence, `<unk>`
# stands for a character never seen in training, `<bos>` starts the decoder's input and `<eos>`
# ends a sentence. Every other module reads their ids from the tokenizer (`pad_id`, `unk_id`,
# `bos_id`, `eos_id`), never from a constant.
#
# **Unknown characters become `<unk>`.** The vocabulary holds exactly the characters of the
# training text; anything else encodes as `<unk>` and decodes as the text `<unk>`, so encoding
# never fails. `encode` returns the pieces of the text and nothing else, and never truncates;
# `collate`, below, adds `<bos>` and `<eos>`.

# %%
#| export tokenizer
import json
from collections.abc import Iterable
from pathlib import Path

import tokenizers

from transformer.files import atomic_write

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)
VOCAB_SIZE = (
    8_000  # entries, specials included; the chapter explains the choice
)
TOKENIZER_FORMAT = "transformer-book tokenizer 1"


class TokenizerError(Exception):
    """A tokenizer file is unreadable or malformed, or a vocabulary lacks the
    special tokens."""


class Tokenizer:
    """Text <-> token ids for one language pair: normalise, cut into spaCy
    words, then BPE.

    Source and target share the vocabulary. `decode(encode(text)) ==
    normalize(text)` for any text made of characters seen in training; other
    characters encode as <unk>.
    """

    # distinct words whose segmentations are kept: all of Multi30k has 22,000
    # (fr-en) to 30,000 (de-en); a long-lived tokenizer fed open text starts
    # over at this many (about 50 MB) instead of growing without end
    segmentation_cache_size = 1 << 18

    def __init__(
        self, bpe: tokenizers.Tokenizer, *, languages: tuple[str, str]
    ) -> None:
        self.bpe = bpe
        self.languages = tuple(languages)
        vocab = bpe.get_vocab()
        missing = [t for t in SPECIALS if t not in vocab]
        if missing:
            raise TokenizerError(
                f"the BPE vocabulary lacks the special tokens {missing}"
            )
        self._pieces = [""] * len(vocab)
        for piece, i in vocab.items():
            self._pieces[i] = piece
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            vocab[t] for t in SPECIALS
        )
        self._skip = {self.pad_id, self.bos_id}
        # word -> ids, filled on use, emptied when full (see `segment`)
        self._segmentations: dict[str, tuple[int, ...]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def pair(self) -> str:
        return "-".join(self.languages)

    def __repr__(self) -> str:
        return f"Tokenizer(pair={self.pair!r}, vocab_size={self.vocab_size})"

    def _language(self, language: str | None) -> str:
        if language is None:
            return self.languages[0]
        if language not in self.languages:
            raise ValueError(
                f"language {language!r} is not one of {self.languages}"
            )
        return language

    def encode(self, text: str, language: str | None = None) -> list[int]:
        """Token ids of one sentence, without special tokens; `language`
        selects spaCy's rules (default: the pair's source language)."""
        return self.encode_batch([text], language)[0]

    def encode_batch(
        self, texts: Sequence[str], language: str | None = None
    ) -> list[list[int]]:
        """`encode` for many sentences at once (spaCy is much faster on
        batches)."""
        return self.encode_words(pretokenize(texts, self._language(language)))

    def segment(self, word: str) -> tuple[int, ...]:
        """The ids of the BPE pieces of one marked word (a word of
        `pretokenize`)."""
        pieces = self._segmentations.get(word)
        if (
            pieces is None
        ):  # BPE works inside a word: segment each distinct one once
            pieces = tuple(t.id for t in self.bpe.model.tokenize(word))
            if len(self._segmentations) >= self.segmentation_cache_size:
                self._segmentations.clear()
            self._segmentations[word] = pieces
        return pieces

    def encode_words(
        self, sentences: Iterable[Sequence[str]]
    ) -> list[list[int]]:
        """Token ids of sentences already cut into marked words by
        `pretokenize`."""
        segment = self.segment
        return [
            [i for word in words for i in segment(word)] for words in sentences
        ]

    def _checked(self, ids: Sequence[int]) -> list[int]:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise ValueError(
                f"token id {bad} is outside the vocabulary of"
                f" {self.vocab_size}"
            )
        return ids

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary entry of each id, special tokens included."""
        return [self._pieces[i] for i in self._checked(ids)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of a sequence of ids: stops at the first <eos>, skips <bos> and
        <pad>, and writes <unk> as the text "<unk>"."""
        pieces = []
        for i in self._checked(ids):
            if i == self.eos_id:
                break
            if i not in self._skip:
                pieces.append(self._pieces[i])
        return "".join(pieces).replace(MARK, " ").strip()

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": TOKENIZER_FORMAT,
                "languages": list(self.languages),
                "normalization": (
                    "Unicode NFC; whitespace runs to one space; stripped"
                ),
                "word_mark": MARK,
                "bpe": json.loads(self.bpe.to_str()),
            },
            ensure_ascii=False,
        )

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file (atomically: a temporary file,
        then a rename)."""
        atomic_write(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        """Read a tokenizer written by `save`; needs no spaCy."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TokenizerError(
                f"cannot read tokenizer {path}: {err}"
            ) from err
        return cls.from_json(text, source=path)

    @classmethod
    def from_json(cls, text: str, *, source: object = "JSON") -> "Tokenizer":
        """The tokenizer of `to_json`'s text; `source` names it in errors."""
        try:
            spec = json.loads(text)
            if spec.get("format") != TOKENIZER_FORMAT:
                raise ValueError(
                    f"format {spec.get('format')!r}, not {TOKENIZER_FORMAT!r}"
                )
            bpe = tokenizers.Tokenizer.from_str(json.dumps(spec["bpe"]))
            languages = tuple(spec["languages"])
        # Truncated, not JSON, wrong format: one message.
        except Exception as err:
            raise TokenizerError(
                f"cannot read tokenizer {source}: {err}"
            ) from err
        return cls(bpe, languages=languages)


def train_bpe(
    sentences: Iterable[Sequence[str]],
    vocab_size: int,
    *,
    languages: tuple[str, str],
) -> Tokenizer:
    """Learn BPE merges over pre-tokenised sentences until the vocabulary holds
    `vocab_size` entries (special tokens and single characters included)."""
    if vocab_size <= len(SPECIALS):
        raise ValueError(
            f"vocab_size must exceed {len(SPECIALS)}, got {vocab_size}"
        )
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=UNK))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIALS),
        show_progress=False,
    )
    bpe.train_from_iterator((" ".join(words) for words in sentences), trainer)
    return Tokenizer(bpe, languages=languages)


def train_tokenizer(
    pairs: Sequence[tuple[str, str]],
    vocab_size: int = VOCAB_SIZE,
    *,
    languages: tuple[str, str],
) -> Tokenizer:
    """The joint BPE tokenizer of a language pair, learned from both sides of
    its (source, target) sentence pairs: give it the training split, and
    validation and test text never reach the vocabulary."""
    src_lang, tgt_lang = languages
    sentences = pretokenize([s for s, _ in pairs], src_lang) + pretokenize(
        [t for _, t in pairs], tgt_lang
    )
    return train_bpe(sentences, vocab_size, languages=(src_lang, tgt_lang))


# %% [markdown]
# One tokenizer per language pair, each learned from the training pairs of its two languages:

# %%
from transformer.data import PAIRS, load_pairs
from transformer.tokenizer import SPECIALS, VOCAB_SIZE, train_tokenizer

trained = {
    pair: train_tokenizer(load_pairs("train", pair), languages=PAIRS[pair])
    for pair in PAIRS
}
for tokenizer in trained.values():
    specials = [
        tokenizer.pad_id,
        tokenizer.unk_id,
        tokenizer.bos_id,
        tokenizer.eos_id,
    ]
    print(tokenizer, dict(zip(SPECIALS, specials, strict=True)))
    assert tokenizer.pieces(specials) == list(SPECIALS)
    assert tokenizer.vocab_size == VOCAB_SIZE

# %% [markdown]
# A sentence of each language, cut into its subword pieces. Frequent words are one piece; a
# rarer word is spelled out of a few (▁ marks a piece that begins a word):

# %%
german = (
    "Drei Feuerwehrangehörige sprechen neben einem Löschfahrzeug miteinander."
)
french = "Un homme vêtu en noir joue une guitare électrique lors d'un concert."
examples = {  # (pair, language): sentence
    ("de-en", "de"): german,
    ("de-en", "en"): "Three firefighters talk next to a fire engine.",
    ("fr-en", "fr"): french,
}
for (pair, lang), sentence in examples.items():
    tokenizer = trained[pair]
    ids = tokenizer.encode(sentence, lang)
    print(f"{lang}: {' '.join(tokenizer.pieces(ids))}")
    assert tokenizer.decode(ids) == sentence

# %% [markdown]
# A character that never occurs in the training text, here an emoji, a snowman and a Chinese
# word, becomes `<unk>`; so does a literal ▁. The rest of the sentence is encoded as usual:

# %%
tokenizer = trained["de-en"]
strange = "Ein Hund 😀 spielt im ☃-Schnee ▁ 北京."
ids = tokenizer.encode(strange)
print(" ".join(tokenizer.pieces(ids)))
print(tokenizer.decode(ids))
assert ids.count(tokenizer.unk_id) == 5
assert (
    tokenizer.decode(ids)
    == "Ein Hund <unk> spielt im <unk>-Schnee <unk> <unk><unk>."
)

# %% [markdown]
# Validation and test bring no character that training lacks (the table counts the distinct
# characters of each file), so every sentence of every split, on both sides of both pairs, comes
# back as its normalised self:

# %%
rows = []
for pair, tokenizer in trained.items():
    characters = {
        p for p in tokenizer.pieces(range(tokenizer.vocab_size)) if len(p) == 1
    }
    for lang in PAIRS[pair]:
        for split in SPLITS:
            text = set("".join(normalize(s) for s in raw[lang][split])) - {" "}
            rows.append(
                {
                    "pair": pair,
                    "language": lang,
                    "split": split,
                    "distinct characters": len(text),
                    "not in the vocabulary": len(text - characters),
                }
            )
alphabet = pd.DataFrame(rows)
assert alphabet["not in the vocabulary"].sum() == 0

encoded = {}
checked = 0
for pair, tokenizer in trained.items():
    for lang in PAIRS[pair]:
        for split in SPLITS:
            ids = tokenizer.encode_batch(raw[lang][split], lang)
            encoded[pair, lang, split] = ids
            for sentence, sentence_ids in zip(
                raw[lang][split], ids, strict=True
            ):
                assert tokenizer.unk_id not in sentence_ids
                assert tokenizer.decode(sentence_ids) == normalize(sentence)
            checked += len(ids)
print(f"{checked:,} sentences encoded and decoded back exactly")
alphabet.pivot(
    index=["pair", "language"], columns="split", values="distinct characters"
)[list(SPLITS)]

# %% [markdown]
# ## How large a vocabulary?
#
# The vocabulary size trades sequence length against how often each entry is seen: few entries
# make long sequences, many make a long tail of rare entries whose embeddings are barely trained.
# The paper's 37,000 entries serve 4.5 million sentence pairs; for Multi30k's 29,000 the book
# takes 8,000 (`VOCAB_SIZE`), where a larger vocabulary no longer shortens the sentences much but
# starts to fill up with rarely seen entries; small data wants small vocabularies
# {cite:p}`sennrich2019revisiting`. The measurements are in the appendix
# [The experiments behind the recipe](94_experiments.ipynb).
# An average training word takes little more than one piece:

# %%
rows = []
for pair in trained:
    for lang in PAIRS[pair]:
        n_words = sum(map(len, words[lang]["train"]))
        n_tokens = sum(map(len, encoded[pair, lang, "train"]))
        rows.append(
            {
                "pair": pair,
                "language": lang,
                "words": n_words,
                "tokens": n_tokens,
                "tokens per word": round(n_tokens / n_words, 3),
            }
        )
per_word = pd.DataFrame(rows).set_index(["pair", "language"])
assert (per_word["tokens per word"] < 1.3).all()
per_word

# %% [markdown]
# ## A cache on disk
#
# Training reads the same 29,000 pairs for dozens of epochs: tokenising them each time would be
# wasted work, and a training machine need not have spaCy at all. `prepare(pair)` encodes every
# split once into `cache/<pair>/`, with the tokenizer and a manifest of checksums, and
# `load_encoded(pair, split)` reads a split back without spaCy. `prepare` rebuilds a cache that is
# missing, stale or corrupt; `load_encoded` refuses one with a `DataError` that says how to
# rebuild it. The appendix [Engineering the package](91_engineering.ipynb) describes its files and how they are kept
# whole. From the command line, `python -m transformer prepare` builds the caches of both pairs.

# %%
#| export
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata

import numpy as np
from safetensors.numpy import load as _load_safetensors
from safetensors.numpy import save as _save_safetensors

from transformer.files import atomic_write
from transformer.tokenizer import (
    VOCAB_SIZE,
    Tokenizer,
    TokenizerError,
    pretokenize,
    train_tokenizer,
)

CACHE_DIR = _repository_root() / "cache"
CACHE_FORMAT = "transformer-book encoded multi30k 2"
_ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
_STARTS = ("src_starts", "tgt_starts")


def _flatten(
    sequences: Sequence[Sequence[int]], dtype: type = np.int32
) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(
        map(len, sequences), dtype=np.int64, count=len(sequences)
    )
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = itertools.chain.from_iterable(sequences)
    return np.fromiter(flat, dtype=dtype, count=int(offsets[-1])), offsets


@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """The token ids of one split, without special tokens, as flat arrays.

    Pair i is (src_ids[src_offsets[i]:src_offsets[i + 1]],
    tgt_ids[tgt_offsets[i]:...]); ids are int32 and each offsets array holds N
    + 1 int64 entries, starting at 0. The optional `src_starts` and
    `tgt_starts` (bool, one per id) mark the ids that begin a word of
    `pretokenize`, which BPE-dropout needs to segment the words afresh.
    """

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    src_starts: np.ndarray | None = None
    tgt_starts: np.ndarray | None = None

    def __post_init__(self) -> None:
        for side in ("src", "tgt"):
            ids, offsets, starts = (
                getattr(self, f"{side}_{name}")
                for name in ("ids", "offsets", "starts")
            )
            if not (
                (ids.ndim, ids.dtype, offsets.ndim, offsets.dtype)
                == (1, np.int32, 1, np.int64)
                and len(offsets) > 0
                and offsets[0] == 0
                and offsets[-1] == len(ids)
                and (np.diff(offsets) >= 0).all()
            ):
                raise DataError(f"inconsistent {side} ids and offsets")
            if starts is not None:
                first = offsets[:-1][
                    np.diff(offsets) > 0
                ]  # of each non-empty sentence
                if not (
                    starts.dtype == np.bool_
                    and starts.shape == ids.shape
                    and bool(starts[first].all())
                ):
                    raise DataError(
                        f"inconsistent {side} word starts: one bool per id,"
                        " and every sentence begins a word"
                    )
        if len(self.src_offsets) != len(self.tgt_offsets):
            raise DataError(
                "source and target hold different numbers of sentences"
            )
        if (self.src_starts is None) != (self.tgt_starts is None):
            raise DataError("word starts are given for one side only")

    @classmethod
    def from_lists(
        cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]
    ) -> "EncodedSplit":
        """From the token ids of each source and each target sentence (no word
        starts, so BPE-dropout cannot resample it: see `from_words`)."""
        return cls(*_flatten(src), *_flatten(tgt))

    @classmethod
    def from_words(
        cls,
        tokenizer: Tokenizer,
        src: Sequence[Sequence[str]],
        tgt: Sequence[Sequence[str]],
    ) -> "EncodedSplit":
        """From sentences cut into marked words by `pretokenize`, keeping the
        word starts."""
        arrays = {}
        for side, sentences in (("src", src), ("tgt", tgt)):
            pieces = [
                [tokenizer.segment(w) for w in words] for words in sentences
            ]
            ids = [
                [i for word in sentence for i in word] for sentence in pieces
            ]
            starts = [
                [k == 0 for w in s for k in range(len(w))] for s in pieces
            ]
            arrays[f"{side}_ids"], arrays[f"{side}_offsets"] = _flatten(ids)
            arrays[f"{side}_starts"] = _flatten(starts, np.bool_)[0]
        return cls(**arrays)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The (source ids, target ids) of pair i."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} of a split of {len(self)}")
        i %= len(self)
        s, t = self.src_offsets, self.tgt_offsets
        return self.src_ids[s[i] : s[i + 1]], self.tgt_ids[t[i] : t[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def to_bytes(self) -> bytes:
        names = _ARRAYS if self.src_starts is None else _ARRAYS + _STARTS
        return _save_safetensors({name: getattr(self, name) for name in names})

    @classmethod
    def from_bytes(cls, data: bytes) -> "EncodedSplit":
        arrays = _load_safetensors(data)
        names = [name for name in _ARRAYS + _STARTS if name in arrays]
        return cls(**{name: arrays[name] for name in names})


def _data_files(pair: str) -> list[str]:
    return [
        f"{split}.{lang}.gz" for split in SPLITS for lang in parse_pair(pair)
    ]


def cache_problems(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int | None = None,
    data_dir: Path = DATA_DIR,
) -> list[str]:
    """What makes the cache of a pair unusable, [] if it is complete and
    current; with vocab_size, a cache built with another vocabulary size is
    stale too."""
    return _read_cache(
        pair, cache_dir, vocab_size=vocab_size, data_dir=data_dir
    )[0]


def _read_cache(
    pair: str,
    cache_dir: Path,
    *,
    data_dir: Path,
    vocab_size: int | None = None,
) -> tuple[list[str], dict[str, bytes]]:
    """(cache_problems, the content of each file whose checksum matched). The
    files are read once: what is checked is what the caller uses, even if a
    rebuild replaces them."""
    parse_pair(pair)
    folder = Path(cache_dir) / pair
    try:
        manifest = json.loads(
            (folder / "manifest.json").read_text(encoding="utf-8")
        )
    except FileNotFoundError:
        return [
            "no manifest.json: never built, or its build did not finish"
        ], {}
    except (OSError, ValueError) as err:
        return [f"manifest.json is unreadable: {err}"], {}
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != CACHE_FORMAT
    ):
        return [f"manifest.json is not a {CACHE_FORMAT!r} manifest"], {}
    problems, built_for, built_size = (
        [],
        manifest.get("pair"),
        manifest.get("vocab_size"),
    )
    if built_for != pair:
        problems.append(f"manifest.json describes {built_for!r}, not {pair!r}")
    if vocab_size is not None and built_size != vocab_size:
        problems.append(
            f"built with vocab_size={built_size}, asked for {vocab_size}"
        )
    try:
        checksums = expected_checksums(data_dir)
    except DataError as err:
        problems.append(str(err))
    else:
        recorded = manifest.get("data")
        if not isinstance(recorded, dict):
            problems.append(
                "manifest.json holds no table of data checksums (field data)"
            )
        else:
            for name in _data_files(pair):
                if recorded.get(name) != checksums.get(name):
                    problems.append(
                        f"{name} has changed since the cache was built"
                    )
    try:
        files = {"tokenizer.json": manifest["tokenizer_sha256"]}
        splits = manifest["splits"]
        if set(splits) != set(SPLITS):
            problems.append(f"manifest.json lists the splits {sorted(splits)}")
        files |= {entry["file"]: entry["sha256"] for entry in splits.values()}
    except (KeyError, TypeError, AttributeError) as err:
        return [*problems, f"manifest.json is malformed ({err!r})"], {}
    contents = {}
    for name, digest in files.items():
        try:
            blob = (folder / name).read_bytes()
        except FileNotFoundError:
            problems.append(f"{name} is missing")
            continue
        except OSError as err:
            problems.append(f"{name} is unreadable: {err}")
            continue
        if hashlib.sha256(blob).hexdigest() != digest:
            problems.append(
                f"{name} is corrupt: its SHA-256 differs from manifest.json"
            )
        else:
            contents[name] = blob
    return problems, contents


def _build_cache(
    pair: str, folder: Path, *, vocab_size: int, data_dir: Path
) -> None:
    src_lang, tgt_lang = parse_pair(pair)
    # Everything that can fail for want of data or of spaCy (training the
    # tokenizer needs it) fails before the old cache is touched: a wrong
    # --data-dir must not cost a good cache.
    texts = {split: load_pairs(split, pair, data_dir) for split in SPLITS}
    checksums = expected_checksums(data_dir)
    tokenizer = train_tokenizer(
        texts["train"], vocab_size, languages=(src_lang, tgt_lang)
    )
    folder.mkdir(parents=True, exist_ok=True)
    # No valid cache until the build ends.
    (folder / "manifest.json").unlink(missing_ok=True)
    tokenizer.save(folder / "tokenizer.json")
    tokenizer_json = (folder / "tokenizer.json").read_bytes()  # as written
    splits = {}
    for split, pairs in texts.items():
        data = EncodedSplit.from_words(
            tokenizer,
            pretokenize([s for s, _ in pairs], src_lang),
            pretokenize([t for _, t in pairs], tgt_lang),
        )
        blob = data.to_bytes()
        atomic_write(folder / f"{split}.safetensors", blob)
        splits[split] = {
            "file": f"{split}.safetensors",
            "sha256": hashlib.sha256(blob).hexdigest(),
            "sentences": len(data),
            "src_tokens": len(data.src_ids),
            "tgt_tokens": len(data.tgt_ids),
        }
    manifest = {
        "format": CACHE_FORMAT,
        "pair": pair,
        "vocab_size": vocab_size,
        "data": {name: checksums[name] for name in _data_files(pair)},
        "tokenizer_sha256": hashlib.sha256(tokenizer_json).hexdigest(),
        "splits": splits,
        "built_with": {
            name: metadata.version(name) for name in ("spacy", "tokenizers")
        },
    }
    atomic_write(
        folder / "manifest.json",
        (json.dumps(manifest, indent=2) + "\n").encode(),
    )


def prepare(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int = VOCAB_SIZE,
    data_dir: Path = DATA_DIR,
    rebuild: bool = False,
) -> Tokenizer:
    """The tokenizer of a pair, with every split encoded in cache_dir/pair: a
    complete, current cache is loaded and needs no spaCy; a missing, stale or
    corrupt one (see cache_problems) is rebuilt from the text, as is any cache
    with rebuild=True."""
    folder = Path(cache_dir) / pair
    options = dict(vocab_size=vocab_size, data_dir=data_dir)
    problems, contents = [], {}
    if not rebuild:  # a rebuild need not read and hash the old files first
        problems, contents = _read_cache(pair, cache_dir, **options)
    if rebuild or problems:
        _build_cache(pair, folder, **options)
        problems, contents = _read_cache(pair, cache_dir, **options)
        if problems:  # only if something rewrote the files while we built them
            raise DataError(
                f"the cache just built in {folder} is unusable: {problems}"
            )
    # Its checksum matched, but it may be a tokenizer that this version cannot
    # read.
    try:
        return Tokenizer.from_json(
            contents["tokenizer.json"].decode("utf-8"),
            source=folder / "tokenizer.json",
        )
    except TokenizerError as err:
        raise DataError(str(err)) from err


def load_encoded(
    pair: str,
    split: str,
    cache_dir: Path = CACHE_DIR,
    *,
    data_dir: Path = DATA_DIR,
) -> EncodedSplit:
    """One split of a pair as token ids, from the cache that `prepare` wrote;
    needs no spaCy. A missing, stale or corrupt cache raises DataError: it is
    never used."""
    check_split(split, "load_encoded(pair, split)")
    folder = Path(cache_dir) / pair
    problems, contents = _read_cache(pair, cache_dir, data_dir=data_dir)
    if problems:
        raise DataError(
            f"cannot use the encoded cache {folder}: {'; '.join(problems)}."
            " Rebuild it on a machine with spaCy: `python -m transformer"
            f" prepare --pair {pair}`"
        )
    return EncodedSplit.from_bytes(contents[f"{split}.safetensors"])


# %% [markdown]
# For each pair, `prepare` builds the cache the first time and loads it afterwards. It holds what
# we computed above: the same tokenizer and the same ids.

# %%
from transformer.data import (
    CACHE_DIR,
    EncodedSplit,
    cache_problems,
    load_encoded,
    prepare,
)

cached = {pair: prepare(pair) for pair in PAIRS}
for pair, tokenizer in cached.items():
    assert tokenizer.to_json() == trained[pair].to_json()
    assert cache_problems(pair, vocab_size=VOCAB_SIZE) == []
    src_lang, tgt_lang = PAIRS[pair]
    for split in SPLITS:
        data = load_encoded(pair, split)
        expected = EncodedSplit.from_lists(
            encoded[pair, src_lang, split], encoded[pair, tgt_lang, split]
        )
        assert all(
            np.array_equal(getattr(data, name), getattr(expected, name))
            for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
        )
        assert data.src_starts is not None and data.tgt_starts is not None
val = load_encoded("de-en", "val")
source, target = val[0]
print(len(val), "pairs;", source.dtype, source.tolist(), target.tolist())
print(cached["de-en"].decode(source), "->", cached["de-en"].decode(target))

# %% [markdown]
# ## Batches of similar length
#
# **What the model is given.** For a pair $(x_1 \dots x_m,\; y_1 \dots y_n)$ the encoder reads
# $x_1 \dots x_m$ `<eos>`, with no `<bos>`, as in tensor2tensor, the paper's code
# {cite:p}`vaswani2018tensor2tensor`. The decoder is trained to predict each target token from
# the ones before it, so its input is the target shifted right by one position:
#
# | position | 1 | 2 | … | $n$ | $n + 1$ |
# | --- | --- | --- | --- | --- | --- |
# | `tgt_in` | `<bos>` | $y_1$ | … | $y_{n-1}$ | $y_n$ |
# | `tgt_out` | $y_1$ | $y_2$ | … | $y_n$ | `<eos>` |
#
# `collate` pads every row to the longest with `pad_id`, giving `src` of shape (B, S) and
# `tgt_in`, `tgt_out` of shape (B, T), and counts the real tokens, since the loss is averaged over
# target tokens. Nothing is ever truncated: a truncated target would teach translations that stop
# halfway, so `collate(..., max_len=...)` refuses a pair that does not fit the model's positions.

# %%
#| export
from collections.abc import Iterator
from dataclasses import replace

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class Batch:
    """A padded batch of sentence pairs, ready for the model.

    Shapes:
        src: (B, S) x_1 … x_m <eos>, then pad_id: the encoder's input
        tgt_in: (B, T) <bos> y_1 … y_n, then pad_id: the decoder's input
        tgt_out: (B, T) y_1 … y_n <eos>, then pad_id: what the decoder must
            predict
        index: (B,) the line of each pair in its split
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    index: Tensor
    n_src_tokens: int  # non-pad tokens in src
    n_tgt_tokens: (
        int  # non-pad tokens in tgt_out: the predictions the loss averages
    )

    def to(
        self, device: torch.device | str, non_blocking: bool = False
    ) -> "Batch":
        """The same batch on another device."""
        move = dict(device=device, non_blocking=non_blocking)
        tensors = ("src", "tgt_in", "tgt_out", "index")
        return replace(
            self, **{n: getattr(self, n).to(**move) for n in tensors}
        )


def collate(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    pad_id: int,
    bos_id: int,
    eos_id: int,
    index: Sequence[int] | None = None,
    max_len: int | None = None,
) -> Batch:
    """Pad (source ids, target ids) pairs, given without special tokens, into a
    Batch.

    `index` gives each pair's line in its split (default 0 … B-1). A pair whose
    source with <eos> or target with <bos> is longer than max_len raises
    ValueError: nothing is truncated.
    """
    if len(examples) == 0:
        raise ValueError("cannot collate an empty batch")
    index = np.arange(len(examples)) if index is None else np.asarray(index)
    if index.shape != (len(examples),):
        raise ValueError(
            f"index has shape {index.shape}, not one entry for each of the "
            f"{len(examples)} pairs"
        )
    src_len = np.array([len(x) + 1 for x, _ in examples])  # + <eos>
    tgt_len = np.array(
        [len(y) + 1 for _, y in examples]
    )  # + <bos> (in) or <eos> (out)
    if max_len is not None:
        over = np.flatnonzero((src_len > max_len) | (tgt_len > max_len))
        if over.size:
            k = over[0]
            raise ValueError(
                f"pair {int(index[k])} has {src_len[k]} source and"
                f" {tgt_len[k]} target tokens, more than max_len={max_len};"
                " nothing is truncated: drop or split it"
            )
    B, S, T = len(examples), int(src_len.max()), int(tgt_len.max())
    src = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in, tgt_out = np.full((2, B, T), pad_id, dtype=np.int64)
    for row, (x, y) in enumerate(examples):
        m, n = len(x), len(y)
        src[row, :m], src[row, m] = x, eos_id
        tgt_in[row, 0], tgt_in[row, 1 : n + 1] = bos_id, y
        tgt_out[row, :n], tgt_out[row, n] = y, eos_id
    return Batch(
        src=torch.from_numpy(src),
        tgt_in=torch.from_numpy(tgt_in),
        tgt_out=torch.from_numpy(tgt_out),
        index=torch.as_tensor(index, dtype=torch.long),
        n_src_tokens=int(src_len.sum()),
        n_tgt_tokens=int(tgt_len.sum()),
    )


# %% [markdown]
# Two validation pairs and an empty one, collated. Read each column of the table top to bottom:
# `tgt_in` is `tgt_out` moved down by one, and the shorter rows end in padding.

# %%
from transformer.data import Batch, collate

tokenizer = cached["de-en"]
specials = dict(
    pad_id=tokenizer.pad_id, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id
)
short, long = sorted(
    (val[i] for i in range(5)), key=lambda pair: len(pair[1])
)[::4]
batch = collate([long, short, ([], [])], **specials)
for name in ("src", "tgt_in", "tgt_out"):
    print(f"{name:<8}", tuple(getattr(batch, name).shape))
view = {}
for row, label in ((1, "short pair"), (2, "empty pair")):
    for name in ("src", "tgt_in", "tgt_out"):
        view[label, name] = tokenizer.pieces(getattr(batch, name)[row])
view = pd.DataFrame(
    {key: pd.Series(pieces) for key, pieces in view.items()}
).fillna("")
view.index.name = "position"

not_eos = batch.tgt_out[:, :-1] != tokenizer.eos_id
assert torch.equal(
    batch.tgt_in[:, 1:][not_eos], batch.tgt_out[:, :-1][not_eos]
)
assert batch.n_src_tokens == int((batch.src != tokenizer.pad_id).sum())
assert batch.n_tgt_tokens == int((batch.tgt_out != tokenizer.pad_id).sum())
assert (
    batch.src[2, 0] == tokenizer.eos_id
    and batch.tgt_out[2, 0] == tokenizer.eos_id
)
assert (
    batch.tgt_in[2, 0] == tokenizer.bos_id
    and (batch.tgt_in[2, 1:] == tokenizer.pad_id).all()
)
view

# %% [markdown]
# And a pair longer than the model can place is refused, not cut:

# %%
overlong = (np.tile(long[0], 40), long[1])
try:
    collate([overlong], **specials, max_len=512)
except ValueError as err:
    print(err)
    assert "more than max_len=512" in str(err)
else:
    raise AssertionError("collate accepted an overlong pair")

# %% [markdown]
# **Batching by length.** The paper: "Sentence pairs were batched together by approximate
# sequence length. Each training batch contained a set of sentence pairs containing
# approximately 25000 source tokens and 25000 target tokens" (Section 5.1). Measuring batches in
# tokens gives every step about the same amount of text and memory; grouping similar lengths
# keeps padding, which costs computation and carries nothing, small.
#
# `token_batches` sorts the pairs by their longer side, with ties in a random order drawn from
# `(seed, epoch)`, cuts the sorted list into batches while $B \cdot \max(S, T) \le$
# `max_tokens`, and shuffles the order of the batches. The same seed and epoch give the same
# batches; the next epoch gives others. The default, `MAX_TOKENS` = 8,000 padded tokens a side,
# is a third of the paper's budget, which was spread over 8 GPUs.

# %%
#| export
MAX_TOKENS = (
    8_000  # padded tokens per batch, on each side (the paper: about 25,000)
)


def token_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Group pairs into batches of similar length, each holding at most
    `max_tokens` padded tokens on each side; returns the pair indices of each
    batch.

    The lengths are those the model sees (with <eos>, or <bos>). Pairs are
    sorted by their longer side, then by their total length, with ties in a
    random order drawn from (seed, epoch); batches are cut greedily along that
    order and then, with shuffle, shuffled.
    """
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    if src.ndim != 1 or src.shape != tgt.shape:
        raise ValueError(
            f"one source and one target length per pair: {src.shape},"
            f" {tgt.shape}"
        )
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    longest = np.maximum(src, tgt)
    over = np.flatnonzero(longest > max_tokens)
    if over.size:
        raise ValueError(
            f"pair {over[0]} has {longest[over[0]]} tokens, more than "
            f"max_tokens={max_tokens}: no batch can hold it"
        )
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src)) if shuffle else np.arange(len(src))
    # lexsort is stable: pairs of equal lengths keep the random order drawn
    # above.
    order = order[np.lexsort((src[order] + tgt[order], longest[order]))]
    batches, start, width = [], 0, 0
    for k, length in enumerate(longest[order].tolist()):
        width = max(width, length)
        # B · max(S, T) would exceed the budget
        if (k - start + 1) * width > max_tokens:
            batches.append(order[start:k])
            start, width = k, length
    if len(order):
        batches.append(order[start:])
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


def iterate_batches(
    data: EncodedSplit,
    tokenizer: Tokenizer,
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    max_len: int | None = None,
) -> Iterator[Batch]:
    """The batches of one epoch over an encoded split (see token_batches and
    collate)."""
    lengths = (
        data.src_lengths + 1,
        data.tgt_lengths + 1,
    )  # with <eos>; <bos> or <eos>
    groups = token_batches(
        *lengths,
        max_tokens=max_tokens,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
    )
    ids = {
        name: getattr(tokenizer, name)
        for name in ("pad_id", "bos_id", "eos_id")
    }
    for index in groups:
        yield collate(
            [data[i] for i in index], **ids, index=index, max_len=max_len
        )


# %% [markdown]
# One epoch over the de-en training split: every pair comes exactly once, no batch exceeds the
# budget on either side, and the same seed and epoch give the same batches.

# %%
from transformer.data import MAX_TOKENS, iterate_batches, token_batches

train = load_encoded("de-en", "train")
src_lengths, tgt_lengths = train.src_lengths + 1, train.tgt_lengths + 1
epoch_0 = token_batches(src_lengths, tgt_lengths, seed=0, epoch=0)
epoch_1 = token_batches(src_lengths, tgt_lengths, seed=0, epoch=1)

assert np.array_equal(np.sort(np.concatenate(epoch_0)), np.arange(len(train)))
for group in epoch_0:
    assert len(group) * src_lengths[group].max() <= MAX_TOKENS
    assert len(group) * tgt_lengths[group].max() <= MAX_TOKENS
again = token_batches(src_lengths, tgt_lengths, seed=0, epoch=0)
assert all(np.array_equal(a, b) for a, b in zip(epoch_0, again, strict=True))
assert not np.array_equal(np.concatenate(epoch_0), np.concatenate(epoch_1))

batches = list(iterate_batches(train, tokenizer, epoch=0))
assert sum(b.src.shape[0] for b in batches) == len(train)
print(f"{len(batches)} batches in epoch 0, {len(epoch_1)} in epoch 1")

# %% [markdown]
# In the figure, each point is one batch of that epoch: its longest sentence across, its number
# of sentences up, the dashed curve the budget $B = 8000 / \max(S, T)$. See how the points hug
# the curve: a batch of short captions holds many of them, a batch of long ones few, and each but
# the last, the leftover of the longest pairs, is filled almost to the budget.

# %%
import altair as alt

from transformer.plots import use_book_renderer

use_book_renderer()
longest = np.maximum(src_lengths, tgt_lengths)
points = pd.DataFrame(
    {
        "longest sentence (tokens)": [int(longest[g].max()) for g in epoch_0],
        "sentences": [len(g) for g in epoch_0],
    }
)
widths = np.arange(8, 65)
assert (
    points["longest sentence (tokens)"].between(8, 64).all()
)  # the axes' range
budget = pd.DataFrame(
    {"longest sentence (tokens)": widths, "sentences": MAX_TOKENS // widths}
)
assert (
    points["sentences"] * points["longest sentence (tokens)"]
    > 0.9 * MAX_TOKENS
).mean() > 0.9
x = alt.X(
    "longest sentence (tokens):Q",
    scale=alt.Scale(type="log", domain=[8, 64], nice=False),
    axis=alt.Axis(values=[8, 16, 32, 64]),
)
y = alt.Y(
    "sentences:Q",
    scale=alt.Scale(type="log", domain=[64, 1024], nice=False),
    axis=alt.Axis(values=[64, 128, 256, 512, 1024]),
    title="sentences in the batch",
)
(
    alt.Chart(budget)
    .mark_line(color="grey", strokeDash=[4, 4])
    .encode(x=x, y=y)
    + alt.Chart(points)
    .mark_point(filled=True)
    .encode(x=x, y=y, tooltip=list(points.columns))
).properties(
    width=420,
    height=260,
    title=f"One epoch's batches under the budget of {MAX_TOKENS:,} tokens",
)

# %% [markdown]
# The alternative of many tutorials, shuffling the pairs and cutting them into batches of a fixed
# number of sentences, pads every row up to the one long caption of its batch. Over one epoch,
# with as many sentences per batch on average:

# %%
def padding(
    groups: list[np.ndarray], src: np.ndarray, tgt: np.ndarray
) -> dict:
    padded_src = sum(len(g) * src[g].max() for g in groups)
    padded_tgt = sum(len(g) * tgt[g].max() for g in groups)
    return {
        "batches": len(groups),
        "sentences per batch": round(np.mean([len(g) for g in groups]), 1),
        "source padding": round(1 - src.sum() / padded_src, 4),
        "target padding": round(1 - tgt.sum() / padded_tgt, 4),
        "largest batch (padded target tokens)": max(
            len(g) * tgt[g].max() for g in groups
        ),
    }


rows = []
for pair in PAIRS:
    data = load_encoded(pair, "train")
    src, tgt = data.src_lengths + 1, data.tgt_lengths + 1
    by_length = token_batches(src, tgt, seed=0, epoch=0)
    size = round(len(data) / len(by_length))
    shuffled = np.random.default_rng(0).permutation(len(data))
    random = [shuffled[i : i + size] for i in range(0, len(data), size)]
    rows.append(
        {"pair": pair, "batches of": "similar length"}
        | padding(by_length, src, tgt)
    )
    rows.append(
        {"pair": pair, "batches of": "random sentences"}
        | padding(random, src, tgt)
    )
padding_table = pd.DataFrame(rows).set_index(["pair", "batches of"])
for pair in PAIRS:
    sorted_, random_ = (
        padding_table.loc[pair].iloc[0],
        padding_table.loc[pair].iloc[1],
    )
    assert sorted_["target padding"] < random_["target padding"] / 4
    assert sorted_["largest batch (padded target tokens)"] <= MAX_TOKENS
padding_table


# %% [markdown]
# ## BPE-dropout (an option, off by default)
#
# BPE gives every word one segmentation, so a rare word is always spelt from the same pieces,
# each seen in few contexts. BPE-dropout {cite:p}`provilkov2020bpe` segments each training word
# afresh each time it is used: at every step of BPE's merging, each merge that could apply is
# dropped with probability $p$ and the best of the rest applies. With $p = 0$ it is BPE; as $p$
# approaches 1 it approaches characters. Validation and test keep the deterministic
# segmentation. It is not part of the paper: training turns it on with `--bpe-dropout p`.
# `BPEDropout` draws from a generator seeded by (seed, epoch), so that a resumed run makes the same
# updates, and reads the words from the cache's word starts.

# %%
#| export
from random import Random


class BPEDropout:
    """BPE-dropout (Provilkov et al., 2020): segment words afresh, dropping
    each merge that could apply with probability p at every step; p = 0 is the
    tokenizer's own BPE."""

    def __init__(self, tokenizer: Tokenizer, p: float) -> None:
        if (
            isinstance(p, bool)
            or not isinstance(p, int | float)
            or not 0 <= p < 1
        ):
            raise ValueError(
                f"BPE-dropout probability must be in [0, 1), got {p!r}"
            )
        self.tokenizer, self.p = tokenizer, float(p)
        merges = json.loads(tokenizer.bpe.to_str())["model"]["merges"]
        pairs = (
            tuple(m.split(" ") if isinstance(m, str) else m) for m in merges
        )
        self._rank = {pair: rank for rank, pair in enumerate(pairs)}
        self._vocab = tokenizer.bpe.get_vocab()

    def segment(self, word: str, rng: Random) -> list[int]:
        """The ids of one marked word's pieces, drawn with `rng`."""
        symbols, rank, p, draw = list(word), self._rank, self.p, rng.random
        while len(symbols) > 1:
            # The best merge that survives: scanning the candidates, a merge is
            # only drawn when it would beat the best survivor so far; the
            # others cannot win anyway.
            best, at = None, -1
            for i in range(len(symbols) - 1):
                r = rank.get((symbols[i], symbols[i + 1]))
                if (
                    r is not None
                    and (best is None or r < best)
                    and draw() >= p
                ):
                    best, at = r, i
            if best is None:
                break
            symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
        unk = self.tokenizer.unk_id
        return [self._vocab.get(symbol, unk) for symbol in symbols]

    @staticmethod
    def check(split: EncodedSplit) -> None:
        """Raise DataError if the split does not say where its words start."""
        if split.src_starts is None or split.tgt_starts is None:
            raise DataError(
                "BPE-dropout needs the word starts of the training split:"
                " build it with `EncodedSplit.from_words` or load it with"
                " `load_encoded` (`from_lists` records no word starts)"
            )

    def longest_spelling(
        self, split: EncodedSplit, sides: Sequence[str] = ("src", "tgt")
    ) -> int:
        """The most tokens a sentence of `sides` can take when resampled, <bos>
        and <eos> aside: one per character of its words, the spelling in which
        every merge drops."""
        longest = 0
        for side in sides:
            ids, offsets = (
                getattr(split, f"{side}_ids"),
                getattr(split, f"{side}_offsets"),
            )
            lengths = [len(piece) for piece in self.tokenizer.pieces(ids)]
            chars = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
            longest = max(longest, int(np.diff(chars[offsets]).max(initial=0)))
        return longest

    def resample(
        self,
        split: EncodedSplit,
        *,
        seed: int,
        epoch: int,
        sides: Sequence[str] = ("src", "tgt"),
    ) -> EncodedSplit:
        """The split with every word of `sides` ("src", "tgt" or both)
        segmented afresh, as a function of (seed, epoch); the other side is
        kept as it is."""
        self.check(split)
        if not set(sides) <= {"src", "tgt"}:
            raise ValueError(
                f"sides must be 'src' and/or 'tgt', got {sides!r}"
            )
        rng = Random(f"bpe-dropout {seed} {epoch}")
        arrays = {name: getattr(split, name) for name in _ARRAYS + _STARTS}
        for side in [side for side in ("src", "tgt") if side in sides]:
            ids, offsets = arrays[f"{side}_ids"], arrays[f"{side}_offsets"]
            first = np.flatnonzero(arrays[f"{side}_starts"])
            pieces = self.tokenizer.pieces(ids)
            bounds = zip(
                first.tolist(), [*first[1:].tolist(), len(ids)], strict=True
            )
            words = [
                self.segment("".join(pieces[a:b]), rng) for a, b in bounds
            ]
            new_ids, ends = _flatten(words)  # ends: where each word ends
            starts = np.zeros(len(new_ids), dtype=np.bool_)
            starts[ends[:-1]] = True
            arrays[f"{side}_ids"], arrays[f"{side}_starts"] = new_ids, starts
            arrays[f"{side}_offsets"] = ends[np.searchsorted(first, offsets)]
        return EncodedSplit(**arrays)


# %% [markdown]
# With $p = 0$, `BPEDropout` is the tokenizer: it segments every distinct word of every split,
# in both pairs, exactly as Hugging Face's BPE does, rank order and ties included.

# %%
for pair, (src_lang, tgt_lang) in PAIRS.items():
    tokenizer, plain = cached[pair], BPEDropout(cached[pair], 0.0)
    distinct = {
        word
        for split in SPLITS
        for lang in (src_lang, tgt_lang)
        for words in pretokenize(load_split(split, lang), lang)
        for word in words
    }
    assert all(
        plain.segment(w, Random(0)) == list(tokenizer.segment(w))
        for w in distinct
    )
    print(
        f"{pair}: {len(distinct):,} distinct words, each segmented as by BPE"
    )

# %% [markdown]
# With $p = 0.1$ a word comes out in several spellings. The six commonest of 1,000 draws for a
# frequent German word and one seen once in training, with how often each came out; the first
# row is BPE's own spelling:

# %%
from collections import Counter

dropout = BPEDropout(cached["de-en"], 0.1)
train_words = Counter(
    w for words in pretokenize(load_split("train", "de"), "de") for w in words
)
draws = Random(0)
spellings, left = [], {}  # left: the share of draws that leave BPE's spelling
for word in ("▁Mann", "▁Polizeihund"):
    seen = Counter(
        " ".join(cached["de-en"].pieces(dropout.segment(word, draws)))
        for _ in range(1_000)
    )
    plain_spelling = " ".join(
        cached["de-en"].pieces(cached["de-en"].segment(word))
    )
    assert seen.most_common(1)[0][0] == plain_spelling
    left[word] = 1 - seen[plain_spelling] / 1_000
    spellings += [
        {
            "word": word,
            "in training": train_words[word],
            "spelling": s,
            "of 1,000": n,
        }
        for s, n in seen.most_common(6)
    ]
assert (
    round(left["▁Mann"], 2) == 0.28 and round(left["▁Polizeihund"], 2) == 0.16
)
pd.DataFrame(spellings).set_index(["word", "in training"])

# %% [markdown]
# Resampling a whole split keeps every sentence's text, since the pieces of a word always spell
# the word, and makes it longer. The same (seed, epoch) gives the same split:

# %%
train = load_encoded("de-en", "train")
epoch_0 = dropout.resample(train, seed=0, epoch=0)
decode = cached["de-en"].decode
assert all(
    decode(epoch_0[i][0]) == decode(train[i][0]) for i in range(len(train))
)
assert all(
    decode(epoch_0[i][1]) == decode(train[i][1]) for i in range(len(train))
)
again = dropout.resample(train, seed=0, epoch=0)
assert np.array_equal(again.tgt_ids, epoch_0.tgt_ids)
epoch_1 = dropout.resample(train, seed=0, epoch=1)
assert not np.array_equal(epoch_1.tgt_ids, epoch_0.tgt_ids)
growth = {
    side: (
        len(getattr(epoch_0, f"{side}_ids"))
        / len(getattr(train, f"{side}_ids"))
    )
    for side in ("src", "tgt")
}
assert round(growth["src"], 2) == 1.30 and round(growth["tgt"], 2) == 1.28
print(
    f"p = 0.1: {growth['src'] - 1:.0%} more German and {growth['tgt'] - 1:.0%}"
    " more English tokens"
)

# %% [markdown]
# A draw that drops every merge spells each word letter by letter, and no draw is longer, so
# `longest_spelling` bounds every epoch to come; the training chapter checks the model's positions
# against it before the first update:

# %%
longest_bpe = int(max(train.src_lengths.max(), train.tgt_lengths.max())) + 1
longest_drawn = (
    int(max(epoch_0.src_lengths.max(), epoch_0.tgt_lengths.max())) + 1
)
longest_spelled = dropout.longest_spelling(train) + 1
assert longest_bpe < longest_drawn <= longest_spelled == 256
print(
    f"BPE {longest_bpe} tokens, one draw at p = 0.1 {longest_drawn}, "
    f"at most {longest_spelled} (one a character)"
)

# %% [markdown]
# ## Summary
#
# - Multi30k ships with the repository, and every file is checked against its SHA-256 digest.
# - Text goes through one normalisation, spaCy's words marked with ▁, and a BPE vocabulary of
#   8,000 entries shared by both languages and learned from the training split only;
#   decode(encode(x)) = normalize(x) holds on every sentence.
# - `prepare` caches every split as token ids, so training needs no spaCy.
# - `token_batches` groups pairs of similar length into batches of at most 8,000 padded tokens a
#   side, and `collate` adds `<bos>`, `<eos>` and padding.
# - BPE-dropout, off by default, respells the training words each epoch.
#
# ## Exercises
#
# 1. Build a cache with half the vocabulary,
#    `python -m transformer prepare --pair de-en --vocab-size 4000 --cache-dir cache-4k`,
#    compare its tokens per word with the table above, then train on it with
#    `--vocab-size 4000 --cache-dir cache-4k` and compare the BLEU scores.
# 2. Call `token_batches` on the de-en training lengths with `max_tokens=2_000` and with the
#    paper's 25,000: how do the number of batches and the padding change? Training takes the
#    budget as `--max-tokens`.
# 3. Train with `--bpe-dropout 0.1`, then with `--bpe-dropout-sides source` as well, and compare
#    them with a run without it.
