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
# A model reads integers, not text. This chapter builds the road from one to the other and back:
# `transformer.multi30k` reads the text, `transformer.tokenizer` cuts it into spaCy's words and a
# subword vocabulary shared by both languages, and `transformer.batches` pads sentences of
# similar length into batches.

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
#| default_exp batches

# %% [markdown]
# ## Reading a split
#
# The text ships with the repository in `data/multi30k/`, one gzipped file per split and
# language: line $i$ of `train.de.gz` is the German of line $i$ of `train.en.gz`. `load_pairs`
# reads both sides of a split and refuses two sides of different lengths. A translation
# direction is a *pair*, `de-en` or `fr-en`: the book always translates into English, so both
# pairs share their references and every reader can judge the output.
#
# The cells below, hidden in the book, name the folders (`transformer.paths`) and read a split
# (`transformer.multi30k`); the package's commands also check each file's SHA-256 digest
# (appendix [Text and the tokenizer](a03_text_and_tokenizer.ipynb)). The sizes of the table
# above, and the first training pair of each direction:

# %% tags=["hide-input"]
#| export paths
"""Where the book's data, encoded caches and models are: in the clone of its
repository that holds the package, or under $TRANSFORMER_HOME."""

import importlib.util
import os
from pathlib import Path

HOME_VARIABLE = "TRANSFORMER_HOME"


def _repository_root() -> Path:
    # The package is <root>/transformer. In it this file has a __file__; in its
    # notebook (which may run anywhere, e.g. Colab's /content) the installed
    # package says.
    here = (
        globals().get("__file__")
        or importlib.util.find_spec("transformer").origin
    )
    return Path(here).resolve().parent.parent


def home() -> Path:
    """The folder that holds data/multi30k, cache and checkpoints:
    $TRANSFORMER_HOME if it is set, else the repository."""
    value = os.environ.get(HOME_VARIABLE)
    return Path(value).expanduser().absolute() if value else _repository_root()


HOME = home()
DATA_DIR = HOME / "data" / "multi30k"  # the Multi30k files and SHA256SUMS
CACHE_DIR = HOME / "cache"  # the encoded splits that `prepare` writes
CHECKPOINTS_DIR = HOME / "checkpoints"  # the shipped models, one per pair

# %% tags=["hide-input"]
#| export multi30k
"""The text of Multi30k in data/multi30k: a split of a language pair, as
sentence pairs."""

import gzip
import zlib
from collections.abc import Callable
from pathlib import Path

from transformer.paths import DATA_DIR

PAIRS = {"de-en": ("de", "en"), "fr-en": ("fr", "en")}
SPLITS = ("train", "val", "test_2016_flickr")


class DataError(Exception):
    """A data file is missing, corrupt or inconsistent, or a split or pair is
    unknown."""


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), with a clear error for a pair the book does not
    have."""
    if pair not in PAIRS:
        raise DataError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    return PAIRS[pair]


def check_split(split: str, signature: str) -> None:
    """A clear error for a split the book does not have; `signature`, the
    caller's, is shown when `split` looks like a pair or a language."""
    if split not in SPLITS:
        swapped = split in PAIRS or any(split in ls for ls in PAIRS.values())
        hint = f" (the arguments are {signature}: swapped?)" if swapped else ""
        raise DataError(
            f"unknown split {split!r}: choose one of {', '.join(SPLITS)}{hint}"
        )


# %% tags=["hide-input"]
#| export multi30k
def gzip_lines(raw: bytes, path: Path) -> list[str]:
    """The lines of the bytes of a gzipped UTF-8 file, cut at "\\n" only:
    `str.splitlines` would also cut a caption at U+2028."""
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise DataError(f"cannot read data file {path}: {err}") from err
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def load_split(
    split: str, language: str, data_dir: Path = DATA_DIR
) -> list[str]:
    """The sentences of one split in one language, one per line of the file."""
    check_split(split, "load_split(split, language)")
    path = Path(data_dir) / f"{split}.{language}.gz"
    if not path.is_file():
        raise DataError(f"missing data file {path}")
    return gzip_lines(path.read_bytes(), path)


def load_pairs(
    split: str,
    pair: str,
    data_dir: Path = DATA_DIR,
    *,
    load: Callable[[str, str, Path], list[str]] = load_split,
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a split, e.g. load_pairs("val",
    "de-en"); `load` reads one side (default `load_split`)."""
    check_split(split, "load_pairs(split, pair)")
    src_lang, tgt_lang = parse_pair(pair)
    src = load(split, src_lang, data_dir)
    tgt = load(split, tgt_lang, data_dir)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}.{src_lang}.gz has {len(src)} lines but"
            f" {split}.{tgt_lang}.gz has {len(tgt)}"
        )
    return list(zip(src, tgt, strict=True))


# %%
from transformer.multi30k import PAIRS, SPLITS, load_pairs, load_split

for pair in PAIRS:
    print(pair, {split: len(load_pairs(split, pair)) for split in SPLITS})
    print(*load_pairs("train", pair)[0], sep="\n")

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
# A ▁ in the input is read as an unknown character. spaCy is imported only when text is cut:
# training reads token ids and needs none.

# %%
#| export tokenizer
"""Text to token ids and back: normalisation, spaCy's words, a joint BPE."""

import unicodedata
from collections.abc import Callable, Iterable, Sequence
from functools import cache, lru_cache

MARK = "\u2581"  # ▁: this word starts the sentence or follows a space


def normalize(text: str) -> str:
    """Unicode NFC, each run of whitespace to one space, ends stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


@cache
def spacy_tokenizer(language: str):
    """spaCy's rules for `language`, with no trained model."""
    try:  # imported here: training from token ids needs no spaCy
        import spacy
    except ImportError as err:
        raise ImportError(
            "tokenising text needs spaCy: pip install -e '.[data]' in the"
            " repository (training from a prepared cache does not)"
        ) from err
    return spacy.blank(language).tokenizer


def pretokenize(
    texts: Sequence[str], language: str, splitter: Callable | None = None
) -> tuple[tuple[str, ...], ...]:
    """Normalise each text and cut it into the words of `splitter(language)`
    (default `spacy_tokenizer`), marking with ▁ each word that starts the
    sentence or follows a space."""
    if isinstance(texts, str):
        raise TypeError("pretokenize takes texts, not one string")
    return _pretokenize(language, tuple(texts), splitter)


@lru_cache(maxsize=12)  # whole splits are cut more than once
def _pretokenize(language: str, texts: tuple, splitter) -> tuple:
    cut = (splitter or spacy_tokenizer)(language)
    clean = [normalize(t).replace(MARK, "\ufffd") for t in texts]  # <unk>
    sentences = []
    for doc in cut.pipe(clean, batch_size=1_000):
        words, after_space = [], True
        for token in doc:
            words.append(MARK + token.text if after_space else token.text)
            after_space = bool(token.whitespace_)
        sentences.append(tuple(words))
    return tuple(sentences)


# %% [markdown]
# A messy sentence, normalised and cut into words:

# %%
from transformer.tokenizer import normalize, pretokenize

messy = " Ein  Hund\tläuft\u00a0über die Wiese, nicht wahr? "
print(repr(normalize(messy)))
print(pretokenize([messy], "de")[0], pretokenize(["l'homme"], "fr")[0])

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
# **Merges by hand.** Spelled out, the loop is short. Every word starts as its characters, its ▁
# included; each pass counts the pairs of adjacent symbols, each word weighted by its frequency,
# and fuses the most frequent pair wherever it occurs. The fused pairs, in order, are the merges:
# a tokenizer encodes a word by spelling it out and replaying them. A tie goes to the pair whose
# symbols entered the vocabulary first (characters in code-point order, then merged symbols as
# made), the rule of the library used below.

# %%
#| export tokenizer
from collections import Counter
from itertools import pairwise


def learn_merges(
    sentences: Iterable[Sequence[str]], n_merges: int
) -> list[tuple[str, str]]:
    """BPE by hand: `n_merges` times, fuse the most frequent pair of adjacent
    symbols, counted over the marked words of `sentences`."""
    counts = Counter(word for words in sentences for word in words)
    spelling = {word: list(word) for word in counts}  # word -> its symbols
    # for ties: characters by code point, then merged symbols as made
    rank = {c: i for i, c in enumerate(sorted(set("".join(counts))))}
    merges = []
    for _ in range(n_merges):
        pairs = Counter()  # (left, right) -> occurrences in the corpus
        for word, count in counts.items():
            symbols = spelling[word]
            for pair in pairwise(symbols):
                pairs[pair] += count
        if not pairs:  # every word is one symbol
            break
        a, b = max(pairs, key=lambda p: (pairs[p], -rank[p[0]], -rank[p[1]]))
        merges.append((a, b))
        rank.setdefault(a + b, len(rank))
        for word, symbols in spelling.items():
            fused, i = [], 0
            while i < len(symbols):  # left to right, no overlaps
                both = symbols[i : i + 2] == [a, b]
                fused.append(a + b if both else symbols[i])
                i += 2 if both else 1
            spelling[word] = fused
    return merges


# %% [markdown]
# Four short captions with their German, and the loop's first merges. What recurs is fused
# first: *un* of *Hund* and *run*, then ▁ with the letters that start words, until *▁Hund*,
# *▁dog*, *▁run* and *▁renn* are single symbols.

# %%
from transformer.tokenizer import learn_merges

toy = {
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
toy_words = pretokenize(toy["de"], "de") + pretokenize(toy["en"], "en")
merges = learn_merges(toy_words, 16)
shown = [f"{a} + {b} → {a + b}".ljust(19) for a, b in merges]
for row in range(0, len(shown), 4):
    print("".join(shown[row : row + 4]).rstrip())
assert {"▁Hund", "▁dog", "▁run", "▁renn"} <= {a + b for a, b in merges}

# %% [markdown]
# **Four special tokens.** `<pad>` fills a batch's rows up to its longest sentence, `<unk>` stands
# for a character never seen in training, `<bos>` starts the decoder's input and `<eos>` ends a
# sentence. Every other module reads their ids from the tokenizer (`pad_id`, `unk_id`, `bos_id`,
# `eos_id`), never from a constant; `Vocabulary`, hidden below, holds them and the tokenizer's
# file. Anything outside the vocabulary encodes as `<unk>`, so encoding never fails; `encode`
# returns the pieces of the text and nothing else, and never truncates.

# %% tags=["hide-input"]
#| export atomic
"""Atomic writes: readers of a file see its old content or its new, never
half of each."""

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over
    `path`: readers see the old content or the new, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        # mkstemp lets its owner alone read the file: give it the mode that
        # open() would, so that a cache or a checkpoint can be shared.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# %% tags=["hide-input"]
#| export vocabulary
"""A BPE vocabulary: its entries, the ids of its special tokens, and the file
of a tokenizer."""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import tokenizers

from transformer.atomic import atomic_write

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)
TOKENIZER_FORMAT = "transformer-book tokenizer 1"


class TokenizerError(Exception):
    """A tokenizer file is unreadable or malformed, or a vocabulary lacks the
    special tokens."""


def tokenizer_json(bpe: tokenizers.Tokenizer, languages: Sequence[str]) -> str:
    """The text of a tokenizer's file: its format, its languages, and Hugging
    Face's BPE model (vocabulary and merges)."""
    return json.dumps(
        {
            "format": TOKENIZER_FORMAT,
            "languages": list(languages),
            "normalization": (
                "Unicode NFC; whitespace runs to one space; stripped"
            ),
            "word_mark": "\u2581",  # tokenizer.MARK
            "bpe": json.loads(bpe.to_str()),
        },
        ensure_ascii=False,
    )


def read_tokenizer_json(text: str, source: object) -> tuple:
    """(bpe, languages) of `tokenizer_json`'s text; `source` names it in
    errors."""
    try:
        spec = json.loads(text)
        if spec.get("format") != TOKENIZER_FORMAT:
            raise ValueError(
                f"format {spec.get('format')!r}, not {TOKENIZER_FORMAT!r}"
            )
        bpe = tokenizers.Tokenizer.from_str(json.dumps(spec["bpe"]))
        return bpe, tuple(spec["languages"])
    # Truncated, not JSON, wrong format: one message.
    except Exception as err:
        raise TokenizerError(f"cannot read tokenizer {source}: {err}") from err


# %% tags=["hide-input"]
#| export vocabulary
class Vocabulary:
    """A language pair's BPE vocabulary (Hugging Face's `bpe`): its entries,
    the ids of its special tokens and its file; `Tokenizer` adds encoding."""

    def __init__(
        self, bpe: tokenizers.Tokenizer, *, languages: tuple[str, str]
    ) -> None:
        self.bpe, self.languages = bpe, tuple(languages)
        self.pair = "-".join(self.languages)
        vocab = bpe.get_vocab()
        if missing := [t for t in SPECIALS if t not in vocab]:
            raise TokenizerError(
                f"the BPE vocabulary lacks the special tokens {missing}"
            )
        self._pieces = [""] * len(vocab)  # id -> entry
        for piece, i in vocab.items():
            self._pieces[i] = piece
        self.vocab_size = len(self._pieces)
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            vocab[t] for t in SPECIALS
        )

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(pair={self.pair!r}, vocab_size={self.vocab_size})"

    def check_language(self, language: str | None) -> str:
        """`language` (None: the source's); a ValueError for a third."""
        if language not in (None, *self.languages):
            raise ValueError(
                f"language {language!r} is not one of {self.languages}"
            )
        return language or self.languages[0]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary entry of each id, special tokens included."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if bad := [i for i in ids if not 0 <= i < self.vocab_size]:
            raise ValueError(
                f"token id {bad[0]} is outside the vocabulary of"
                f" {self.vocab_size}"
            )
        return [self._pieces[i] for i in ids]

    def to_json(self) -> str:
        """The tokenizer's file, as text."""
        return tokenizer_json(self.bpe, self.languages)

    def save(self, path: Path) -> None:
        """Write the tokenizer's file, atomically."""
        atomic_write(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read the file of `save` as a `cls` (Tokenizer); needs no spaCy."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TokenizerError(
                f"cannot read tokenizer {path}: {err}"
            ) from err
        return cls.from_json(text, source=path)

    @classmethod
    def from_json(cls, text: str, *, source: object = "JSON") -> Self:
        """The tokenizer of `to_json`'s text; `source` names it in errors."""
        bpe, languages = read_tokenizer_json(text, source)
        return cls(bpe, languages=languages)


# %%
#| export tokenizer
import tokenizers

from transformer.vocabulary import BOS, EOS, PAD, SPECIALS, UNK, Vocabulary

# TokenizerError: for the callers of this module
from transformer.vocabulary import TokenizerError as TokenizerError

VOCAB_SIZE = 8_000  # entries, specials included (see below)


class Tokenizer(Vocabulary):
    """Text <-> token ids for a language pair, which shares one vocabulary."""

    segmentation_cache_size = 1 << 18  # distinct words remembered, ~50 MB
    splitter = None  # for pretokenize: language -> spaCy tokenizer

    def __init__(
        self, bpe: tokenizers.Tokenizer, *, languages: tuple[str, str]
    ) -> None:
        super().__init__(bpe, languages=languages)
        self._segmentations: dict[str, tuple[int, ...]] = {}  # word -> ids

    def encode(self, text: str, language: str | None = None) -> list[int]:
        """Token ids of one sentence, without special tokens."""
        return self.encode_batch([text], language)[0]

    def encode_batch(
        self, texts: Sequence[str], language: str | None = None
    ) -> list[list[int]]:
        """Token ids of sentences in `language` (default: the source's)."""
        language = self.check_language(language)
        return self.encode_words(pretokenize(texts, language, self.splitter))

    def encode_words(self, sentences: Iterable[Sequence[str]]) -> list:
        """Token ids of sentences cut into marked words by `pretokenize`."""
        return [[i for w in ws for i in self.segment(w)] for ws in sentences]

    def segment(self, word: str) -> tuple[int, ...]:
        """The ids of the BPE pieces of one marked word."""
        if word not in self._segmentations:
            if len(self._segmentations) >= self.segmentation_cache_size:
                self._segmentations.clear()
            tokens = self.bpe.model.tokenize(word)
            self._segmentations[word] = tuple(t.id for t in tokens)
        return self._segmentations[word]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids: up to the first <eos>, without <bos> and <pad>."""
        pieces = self.pieces(ids)
        pieces = pieces[: pieces.index(EOS)] if EOS in pieces else pieces
        text = "".join(p for p in pieces if p not in (PAD, BOS))
        return text.replace(MARK, " ").strip()


# %% [markdown]
# The library does the same loop, fast: counting pairs once and updating only the counts that
# a merge changes. Learning a vocabulary is one call to its trainer, which stops when the
# vocabulary holds `vocab_size` entries: the special tokens, every character of the training
# words, and the symbols that the merges made.


# %%
#| export tokenizer
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


# %% [markdown]
# On the four caption pairs, and with a vocabulary large enough for every word to become one
# symbol, the library learns the loop's merges, in the same order, to the last:

# %%
import json

from transformer.tokenizer import train_bpe

toy_tokenizer = train_bpe(toy_words, 1_000, languages=PAIRS["de-en"])
library = json.loads(toy_tokenizer.bpe.to_str())["model"]["merges"]
assert [tuple(m) for m in library] == learn_merges(toy_words, 1_000)
print(f"{len(library)} merges, the loop's and the library's alike")

# %% [markdown]
# One tokenizer per pair, learned from the words of both sides of its training split at once,
# and a sentence of each language cut into its pieces. Frequent words
# are one piece; a rarer word is spelled out of a few (▁ marks a piece that begins a word). A
# character that never occurs in the training text, here an emoji, a snowman and a Chinese word,
# becomes `<unk>`; so does a literal ▁.

# %%
from transformer.tokenizer import VOCAB_SIZE

trained = {}
for pair, (src_lang, tgt_lang) in PAIRS.items():
    sources, targets = zip(*load_pairs("train", pair), strict=True)
    words = pretokenize(sources, src_lang) + pretokenize(targets, tgt_lang)
    trained[pair] = train_bpe(words, VOCAB_SIZE, languages=PAIRS[pair])
for pair, lang, sentence in [
    ("de-en", "de", "Drei Feuerwehrangehörige neben einem Löschfahrzeug."),
    ("fr-en", "fr", "Un homme vêtu en noir joue une guitare électrique."),
    ("de-en", "de", "Ein Hund 😀 spielt im ☃-Schnee ▁ 北京."),
]:
    ids = trained[pair].encode(sentence, lang)
    print(f"{lang}: {' '.join(trained[pair].pieces(ids))}")
tokenizer = trained["de-en"]
print(tokenizer, "decodes the last as:", tokenizer.decode(ids))
assert ids.count(tokenizer.unk_id) == 5 and tokenizer.vocab_size == VOCAB_SIZE

# %% [markdown]
# Validation and test bring no character that training lacks, so every sentence of every split,
# on both sides of both pairs, comes back as its normalised self. The vocabulary size trades
# sequence length against how often each entry is seen: few entries make long sequences, many
# make a long tail of rare entries whose embeddings are barely trained. The paper's 37,000
# entries serve 4.5 million sentence pairs; for Multi30k's 29,000 the book takes 8,000
# (`VOCAB_SIZE`): small data wants small vocabularies {cite:p}`sennrich2019revisiting` (the runs
# that compare sizes are in [The experiments behind the recipe](a12_experiments.ipynb)).

# %%
for pair, tokenizer in trained.items():
    for lang in PAIRS[pair]:
        for split in SPLITS:
            text = load_split(split, lang)
            ids = tokenizer.encode_batch(text, lang)
            assert list(map(tokenizer.decode, ids)) == list(
                map(normalize, text)
            )
            assert not any(tokenizer.unk_id in x for x in ids)

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
# halfway, so the data pipeline refuses a pair that does not fit the model's positions (appendix
# [Batches and the encoded cache](a04_batches_and_cache.ipynb), which checks every batch's
# arguments before it calls `collate`).

# %%
#| export
"""Batches for the model: sentence pairs padded, with <bos> and <eos>, and
grouped by length."""

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class Batch:
    """A padded batch of sentence pairs, ready for the model.

    Shapes:
        src: (B, S) x_1 … x_m <eos>, then pad_id: the encoder's input
        tgt_in: (B, T) <bos> y_1 … y_n, then pad_id: the decoder's input
        tgt_out: (B, T) y_1 … y_n <eos>, then pad_id: the decoder's targets
        index: (B,) the line of each pair in its split
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    index: Tensor
    n_src_tokens: int  # non-pad tokens in src
    n_tgt_tokens: int  # non-pad tokens in tgt_out: what the loss averages

    def to(self, device: torch.device | str, non_blocking=False) -> "Batch":
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
) -> Batch:
    """Pad (source ids, target ids) pairs, given without special tokens, into a
    Batch; `index` gives each pair's line in its split (default 0 … B-1)."""
    index = range(len(examples)) if index is None else index
    src_len = np.array([len(x) + 1 for x, _ in examples])  # + <eos>
    tgt_len = np.array([len(y) + 1 for _, y in examples])  # + <bos> or <eos>
    B, S, T = len(examples), int(src_len.max()), int(tgt_len.max())
    src = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in, tgt_out = np.full((2, B, T), pad_id, dtype=np.int64)
    for row, (x, y) in enumerate(examples):
        m, n = len(x), len(y)
        src[row, :m], src[row, m] = x, eos_id
        tgt_in[row, 0], tgt_in[row, 1 : n + 1] = bos_id, y
        tgt_out[row, :n], tgt_out[row, n] = y, eos_id
    tensors = [torch.from_numpy(a) for a in (src, tgt_in, tgt_out)]
    index = torch.as_tensor(index, dtype=torch.long)
    return Batch(*tensors, index, int(src_len.sum()), int(tgt_len.sum()))


# %% [markdown]
# A long validation pair, a short one and an empty one, collated; the table shows the short and
# the empty one. Read each column top to bottom: `tgt_in` is `tgt_out` moved down by one, and
# the shorter rows end in padding.

# %%
from transformer.batches import collate

tokenizer = trained["de-en"]
pairs = [
    (tokenizer.encode(de, "de"), tokenizer.encode(en, "en"))
    for de, en in load_pairs("val", "de-en")[:5]
]
short, long = sorted(pairs, key=lambda pair: len(pair[1]))[::4]
ids = {k: getattr(tokenizer, k) for k in ("pad_id", "bos_id", "eos_id")}
batch = collate([long, short, ([], [])], **ids)
print(batch.src.shape, batch.tgt_in.shape, batch.tgt_out.shape)
moved = batch.tgt_out[:, :-1] != tokenizer.eos_id  # tgt_in is tgt_out, moved
assert torch.equal(batch.tgt_in[:, 1:][moved], batch.tgt_out[:, :-1][moved])

# %% tags=["hide-input"]
import pandas as pd

pd.DataFrame(
    {
        (label, name): pd.Series(tokenizer.pieces(getattr(batch, name)[row]))
        for row, label in ((1, "short pair"), (2, "empty pair"))
        for name in ("src", "tgt_in", "tgt_out")
    }
).fillna("")

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
MAX_TOKENS = 8_000  # padded tokens per batch, each side (the paper: ~25,000)


def token_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """The pair indices of each batch: pairs of similar length, at most
    `max_tokens` padded tokens a side (lengths with <eos>, or <bos>)."""
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    longest = np.maximum(src, tgt)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(src)) if shuffle else np.arange(len(src))
    # by the longer side, then the total; lexsort is stable: ties stay random
    order = order[np.lexsort((src[order] + tgt[order], longest[order]))]
    batches, start, width = [], 0, 0
    for k, length in enumerate(longest[order].tolist()):
        width = max(width, length)
        if (k - start + 1) * width > max_tokens:  # B · max(S, T) too large
            batches.append(order[start:k])
            start, width = k, length
    if len(order):
        batches.append(order[start:])
    if shuffle:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


# %% [markdown]
# One epoch over the de-en training split: every pair comes exactly once, no batch exceeds the
# budget on either side, and all but a few are almost full.

# %%
from transformer.batches import MAX_TOKENS, token_batches

de, en = zip(*load_pairs("train", "de-en"), strict=True)
src = np.array([len(x) + 1 for x in tokenizer.encode_batch(de, "de")])
tgt = np.array([len(y) + 1 for y in tokenizer.encode_batch(en, "en")])
epoch_0 = token_batches(src, tgt, seed=0, epoch=0)
assert np.array_equal(np.sort(np.concatenate(epoch_0)), np.arange(len(src)))
padded = np.array([len(g) * max(src[g].max(), tgt[g].max()) for g in epoch_0])
assert padded.max() <= MAX_TOKENS and np.mean(padded > 0.9 * MAX_TOKENS) > 0.9

# %% [markdown]
# In the figure, each point is one batch of that epoch: its longest sentence across, its number
# of sentences up, the dashed curve the budget $B = 8000 / \max(S, T)$. See how the points hug
# the curve: a batch of short captions holds many of them, a batch of long ones few, and each but
# the last, the leftover of the longest pairs, is filled almost to the budget.

# %% tags=["hide-input"]
import altair as alt

from transformer.plots import use_book_renderer

use_book_renderer()
longest = [max(src[g].max(), tgt[g].max()) for g in epoch_0]
points = pd.DataFrame({"longest": longest, "sentences": map(len, epoch_0)})
budget = pd.DataFrame({"longest": np.arange(8, 65)})
budget["sentences"] = MAX_TOKENS // budget["longest"]
log = dict(type="log", nice=False)
x = alt.X("longest:Q", scale=alt.Scale(domain=[8, 64], **log))
x = x.title("longest sentence in the batch (tokens)")
y = alt.Y("sentences:Q", scale=alt.Scale(domain=[64, 1024], **log))
y = y.title("sentences in the batch")
line = alt.Chart(budget).mark_line(color="grey", strokeDash=[4, 4])
dots = alt.Chart(points).mark_point(filled=True)
(line.encode(x=x, y=y) + dots.encode(x=x, y=y)).properties(
    width=420, height=260, title="One epoch's batches under the budget"
)

# %% [markdown]
# The alternative of many tutorials, shuffling the pairs and cutting them into batches of a fixed
# number of sentences, pads every row up to the one long caption of its batch. The share of
# target positions that are padding, over the same epoch and with as many batches:

# %%
shuffled = np.random.default_rng(0).permutation(len(tgt))
random = np.array_split(shuffled, len(epoch_0))  # as many batches
for name, groups in (("by length", epoch_0), ("at random", random)):
    padding = 1 - tgt.sum() / sum(len(g) * tgt[g].max() for g in groups)
    print(f"{len(groups)} batches {name}: {padding:.1%} of tgt_out is padding")

# %% [markdown]
# ## Summary
#
# - Multi30k ships with the repository; `load_pairs` reads a split of a pair.
# - Text goes through one normalisation and spaCy's words, marked with ▁.
# - BPE fuses the most frequent pair of adjacent symbols, again and again; the loop written out
#   here learns the library's merges. The book's vocabulary has 8,000 entries, shared by both
#   languages and learned from the training split only; decode(encode(x)) = normalize(x) holds
#   on every sentence.
# - `collate` adds `<bos>`, `<eos>` and padding, and `token_batches` groups pairs of similar
#   length into batches of at most 8,000 padded tokens a side.
# - The appendices [Text and the tokenizer](a03_text_and_tokenizer.ipynb) and [Batches and the
#   encoded cache](a04_batches_and_cache.ipynb) check the data files and every batch's
#   arguments, build the French words fast, cache every split as token ids so that training
#   needs no spaCy, and add BPE-dropout, an option.
#
# ## Exercises
#
# 1. Give `learn_merges` another rule for ties, the alphabetically first pair, and compare its
#    merges with the library's on the first 50 training pairs: where do they part?
# 2. Build a cache with half the vocabulary,
#    `python -m transformer prepare --pair de-en --vocab-size 4000 --cache-dir cache-4k`,
#    compare its tokens per word with the appendix's table, then train on it with
#    `--vocab-size 4000 --cache-dir cache-4k` and compare the BLEU scores.
# 3. Call `token_batches` on the de-en training lengths with `max_tokens=2_000` and with the
#    paper's 25,000: how do the number of batches and the padding change? Training takes the
#    budget as `--max-tokens`.
# 4. Train with `--bpe-dropout 0.1`, then with `--bpe-dropout-sides source` as well, and compare
#    them with a run without it.
