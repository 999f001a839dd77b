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
# pairs, small enough to train a real model on one GPU in minutes and to understand every step.
#
# | split | sentences | used for |
# | --- | --- | --- |
# | `train` | 29,000 | learning the weights and the subword vocabulary |
# | `val` | 1,014 | choosing hyperparameters and checkpoints |
# | `test_2016_flickr` | 1,000 | the BLEU scores we report, never used to choose anything |
#
# Tutorials that download Multi30k at run time break when the download does (the URLs that
# torchtext used are dead). This book ships the raw text in the repository, in `data/multi30k/`,
# gzipped (about 2 MB), with a `SHA256SUMS` file.
#
# A model reads integers, not text. This chapter builds the whole road from one to the other and
# back, and exports it as `transformer.data`:
#
# 1. a loader that reads a split and checks it;
# 2. one normalisation of the text, then words from spaCy's rule-based tokenizers;
# 3. a subword vocabulary learned by byte-pair encoding (BPE) and shared by source and target, as
#    in the paper, with an exact round trip from text to ids and back;
# 4. an on-disk cache of every split as token ids, so that training needs neither spaCy nor a
#    second pass over the text;
# 5. batches of sentences of similar length holding about a fixed number of tokens, as in the
#    paper's Section 5.1.

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
    # [notebooks]: spaCy's tokenizers, Altair and pandas, at the versions the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e", where + "[notebooks]"]
    subprocess.run(pip, check=True)
    sys.path.insert(0, where)  # an editable install is seen only after a restart

# %% tags=["remove-cell"]
#| default_exp data

# %% [markdown]
# ## Reading a split, safely
#
# Every file is checked against `SHA256SUMS` before it is used, so that a truncated download, a
# file edited by accident or a wrong copy fails at once with the file's name, rather than
# training a model on the wrong data. A folder without `SHA256SUMS` fails too, with advice
# that depends on whose folder it is: for the package's own `data/multi30k`, to install
# the package from a clone of the repository; for one named with `--data-dir`, to name
# a copy of it. The three languages of a split are line-aligned (line $n$ of
# `train.de.gz` translates line $n$ of `train.en.gz`), so the loader also checks that both sides
# have the same number of lines. A translation direction is named by a *pair*, `de-en` or `fr-en`:
# this book always translates into English, where the paper's headline task translates English
# into German. One target language for both pairs keeps them comparable: the same English
# references, the same English word statistics, translations every reader can judge.

# %%
#| export
"""Multi30k: reading, checking, tokenising, caching and batching the data in data/multi30k."""

import gzip
import hashlib
import importlib.util
import string
import zlib
from pathlib import Path


def _repository_root() -> Path:
    # The package is <root>/transformer. In it this file has a __file__; in its chapter (a
    # notebook, which may run anywhere, e.g. Colab's /content) the installed package says.
    here = globals().get("__file__") or importlib.util.find_spec("transformer").origin
    return Path(here).resolve().parent.parent


DATA_DIR = _repository_root() / "data" / "multi30k"
PAIRS = {"de-en": ("de", "en"), "fr-en": ("fr", "en")}
SPLITS = ("train", "val", "test_2016_flickr")


class DataError(Exception):
    """A data file is missing, corrupt or inconsistent, or a split or pair is unknown."""


def check_split(split: str, signature: str) -> None:
    """A clear error for a split the book does not have, naming a swapped argument order.

    The loaders of raw text take the split first, `load_encoded` takes the pair first (as the
    cache is laid out, one folder per pair): `signature` is the caller's, shown when `split`
    looks like the other argument.
    """
    if split not in SPLITS:
        languages = {lang for pair in PAIRS.values() for lang in pair}
        swapped = split in PAIRS or split in languages
        hint = f" (the arguments are {signature}: swapped?)" if swapped else ""
        raise DataError(
            f"unknown split {split!r}: choose one of {', '.join(SPLITS)}{hint}"
        )


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), with a clear error for a pair the book does not have."""
    if pair not in PAIRS:
        raise DataError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    return PAIRS[pair]


def _data_dir_advice(data_dir: Path) -> str:
    """What to do about a data folder without SHA256SUMS: it depends on whose it is."""
    if Path(data_dir).absolute() == DATA_DIR:  # the package's own, data/multi30k
        return (
            "the package reads the data of the repository it was installed from: install "
            "it with `pip install -e .` in a clone"
        )
    # A folder the user named (--data-dir): reinstalling would not help.
    multi30k = (
        "the repository's data/multi30k, which holds the data files and SHA256SUMS"
    )
    if Path(data_dir).is_dir():
        return f"{data_dir} is not a copy of {multi30k}"
    return f"there is no folder {data_dir}: name a copy of {multi30k}"


def expected_checksums(data_dir: Path = DATA_DIR) -> dict[str, str]:
    """File name -> SHA-256 from data_dir/SHA256SUMS."""
    sums = Path(data_dir) / "SHA256SUMS"
    if not sums.is_file():
        raise DataError(f"missing checksum file {sums} ({_data_dir_advice(data_dir)})")
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
        if len(fields) != 2 or len(digest) != 64 or set(digest) - set(string.hexdigits):
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
            f"corrupt or truncated data file {path}: SHA-256 {digest[:12]}…, "
            f"expected {sha256[:12]}… (restore it with `git checkout -- {path}`)"
        )
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise DataError(f"cannot read data file {path}: {err}") from err
    # "\n" only: str.splitlines would also cut at \r, \x0c, U+2028 and others inside a line.
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def load_split(split: str, language: str, data_dir: Path = DATA_DIR) -> list[str]:
    """The sentences of one split in one language, one per line of the file."""
    check_split(split, "load_split(split, language)")
    name = f"{split}.{language}.gz"
    checksums = expected_checksums(data_dir)
    if name not in checksums:
        raise DataError(f"no checksum for {name} in {Path(data_dir) / 'SHA256SUMS'}")
    return read_lines(Path(data_dir) / name, checksums[name])


def load_pairs(
    split: str, pair: str, data_dir: Path = DATA_DIR
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a split, e.g. load_pairs("val", "de-en")."""
    check_split(split, "load_pairs(split, pair)")
    src_lang, tgt_lang = parse_pair(pair)
    src = load_split(split, src_lang, data_dir)
    tgt = load_split(split, tgt_lang, data_dir)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}.{src_lang}.gz has {len(src)} lines but {split}.{tgt_lang}.gz has {len(tgt)}"
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
# A damaged file is named in the error. Here we copy the data to a scratch folder, cut one file
# short, and try to load it:

# %%
import shutil
import tempfile
from pathlib import Path

from transformer.data import DATA_DIR, DataError

with tempfile.TemporaryDirectory() as scratch:
    copy = Path(scratch) / "multi30k"
    shutil.copytree(DATA_DIR, copy)
    damaged = copy / "val.de.gz"
    damaged.write_bytes(damaged.read_bytes()[:1000])
    try:
        load_pairs("val", "de-en", data_dir=copy)
    except DataError as err:
        message = str(err).replace(scratch, "<scratch>")
        print(message)
assert "val.de.gz" in message and "corrupt or truncated" in message

# %% [markdown]
# ## From text to words
#
# The paper says only that "sentences were encoded using byte-pair encoding" (Section 5.1).
# Two steps come before that, and they decide whether a translation can be turned back into
# text exactly.
#
# **One normalisation.** A sentence is put in Unicode normal form C (an "é" is always one code
# point, never an "e" followed by a combining accent), every run of whitespace (spaces, tabs,
# non-breaking spaces) becomes one space, and the ends are stripped. That is the *only* change
# the text ever undergoes: for every sentence $x$ of every split,
#
# $$
# \mathrm{decode}(\mathrm{encode}(x)) = \mathrm{normalize}(x).
# $$
#
# The raw files need it: a few of their sentences hold a double space, a tab, a non-breaking
# space, or a space at the start or the end (the sentences changed are counted below).
#
# **Words.** Subwords are learned inside words, so the text is first cut into words and
# punctuation marks by spaCy's rule-based tokenizers {cite:p}`honnibal2020spacy`:
# `spacy.blank("de")`, `spacy.blank("fr")` and `spacy.blank("en")` apply each language's rules
# for punctuation, elisions and abbreviations, with no trained model to download. *Büsche.*
# becomes *Büsche* and *.*; French *l'homme* becomes *l'* and *homme*. The cut loses where the
# spaces were, so each word that starts the sentence or follows a space gets the prefix ▁
# (U+2581), the convention of SentencePiece {cite:p}`kudo2018sentencepiece`: gluing the words
# together and turning each ▁ into a space gives the normalised sentence back. The mark is
# reserved; a ▁ in the input is read as a character never seen in training (below, such
# characters become `<unk>`).

# %%
#| export
import unicodedata
from collections.abc import Sequence
from functools import cache, lru_cache

MARK = "\u2581"  # "▁": this word starts the sentence or follows a space (as in SentencePiece)
# A literal ▁ in the input becomes this character, absent from the training text: <unk>.
_MARK_STAND_IN = "\ufffd"


def normalize(text: str) -> str:
    """The one normalisation: Unicode NFC, each run of whitespace to one space, ends stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


@cache
def _spacy_tokenizer(language: str):
    # Imported here, not at the top of the module: training from an encoded cache (see
    # `prepare`) runs on machines without spaCy.
    try:
        import spacy
    except ImportError as err:
        raise ImportError(
            "tokenising text needs spaCy: pip install -e '.[data]' in the repository "
            "(training from a prepared cache does not)"
        ) from err
    return spacy.blank(language).tokenizer  # rule-based; no trained pipeline


def _pretokenize(language: str, texts: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
    clean = [normalize(t).replace(MARK, _MARK_STAND_IN) for t in texts]
    sentences = []
    for doc in _spacy_tokenizer(language).pipe(clean, batch_size=1_000):
        words, after_space = [], True
        for token in doc:
            words.append(MARK + token.text if after_space else token.text)
            after_space = bool(token.whitespace_)
        sentences.append(tuple(words))
    return tuple(sentences)


# The chapter, `train_tokenizer` and `prepare` split the same whole splits: remember those.
_pretokenize_split = lru_cache(maxsize=12)(_pretokenize)


def pretokenize(texts: Sequence[str], language: str) -> tuple[tuple[str, ...], ...]:
    """Normalise each text and cut it into spaCy words, marking with ▁ each word that starts
    the sentence or follows a space."""
    if isinstance(texts, str):
        raise TypeError("pretokenize takes a sequence of texts, not one string")
    texts = tuple(texts)
    if len(texts) >= 1_000:
        return _pretokenize_split(language, texts)
    return _pretokenize(language, texts)


# %% [markdown]
# A messy sentence, normalised and cut into words:

# %%
from transformer.data import MARK, load_split, normalize, pretokenize

messy = " Ein  Hund\tläuft\u00a0über die Wiese, nicht wahr? "
print(repr(normalize(messy)))
print(pretokenize([messy], "de")[0])
assert normalize(messy) == "Ein Hund läuft über die Wiese, nicht wahr?"
assert pretokenize(["l'homme"], "fr")[0] == (MARK + "l'", "homme")

# %% [markdown]
# How many sentences of each file the normalisation changes; none through NFC, all of them
# through whitespace:

# %%
import unicodedata

LANGUAGES = ("de", "fr", "en")
raw = {lang: {split: load_split(split, lang) for split in SPLITS} for lang in LANGUAGES}
changed = pd.DataFrame(
    [
        {
            "language": lang,
            "split": split,
            "changed": sum(normalize(s) != s for s in raw[lang][split]),
            "changed by NFC": sum(
                unicodedata.normalize("NFC", s) != s for s in raw[lang][split]
            ),
        }
        for lang in LANGUAGES
        for split in SPLITS
    ]
)
assert changed["changed by NFC"].sum() == 0
# and no sentence is empty, before or after normalisation
assert all(
    normalize(s) for lang in LANGUAGES for split in SPLITS for s in raw[lang][split]
)
changed.pivot(index="language", columns="split", values="changed").loc[
    list(LANGUAGES), list(SPLITS)
]

# %% [markdown]
# Every sentence of every file, cut into words, glues back into its normalised self. (This cell
# runs spaCy over every sentence of the three languages, a few seconds.)

# %%
words = {
    lang: {split: pretokenize(raw[lang][split], lang) for split in SPLITS}
    for lang in LANGUAGES
}
for lang in LANGUAGES:
    for split in SPLITS:
        for sentence, ws in zip(raw[lang][split], words[lang][split], strict=True):
            assert "".join(ws).replace(MARK, " ").strip() == normalize(sentence)
print(
    f"{sum(len(words[lang][split]) for lang in LANGUAGES for split in SPLITS):,} sentences"
)
print("the first German training sentence:", words["de"]["train"][0])

# %% [markdown]
# ## A subword vocabulary shared by both languages
#
# A vocabulary of whole words has no entry for a word it has not seen, and German compounds
# (*Kampfkunststellungen*, *Feuerwehrangehörige*) make many of those. Byte-pair encoding
# {cite:p}`sennrich2016neural` starts from single characters and learns *merges*: it repeatedly
# finds the most frequent pair of adjacent symbols in the training words and fuses it into a new
# symbol, until the vocabulary holds the number of entries asked for. Frequent words end up as
# one symbol, rare ones as a few pieces, and every word made of known characters can be
# written. The paper learns one vocabulary for source and target together, "a shared
# source-target vocabulary of about 37000 tokens" (Section 5.1); that is what lets the model use
# one embedding matrix for the encoder, the decoder and the output layer (Section 3.4,
# {cite:p}`press2017using`). The book does the same: one vocabulary per language pair, learned
# with Hugging Face's `tokenizers` from the German (or French) and the English sides of the
# training split together.
#
# **From the training split only.** Validation and test sentences stand for text the model has
# never seen; a vocabulary learned from them would leak their words into training.
# `train_tokenizer` takes no split argument: it reads `train` and nothing else.
#
# **Four special tokens.** `<pad>` fills the rows of a batch up to its longest sentence,
# `<unk>` stands for a character never seen in training, `<bos>` starts the decoder's input and
# `<eos>` ends a sentence. BPE gives them the first ids, but no code relies on that: every
# other module reads `tokenizer.pad_id`, `bos_id`, `eos_id` and `unk_id`.
#
# **Unknown characters become `<unk>`.** Byte fallback, the alternative, writes an unseen
# character as its UTF-8 bytes with 256 extra entries. The encoder would never meet those
# entries as input in training, so nothing would teach the model what they mean, and every
# character of the validation and test sets occurs in training anyway (checked below). So the
# vocabulary holds exactly the characters of the training text, and anything else encodes as
# `<unk>` and decodes as the text `<unk>`: it never crashes, and the round trip is exact for every
# sentence of Multi30k.
#
# **No special tokens in `encode`.** `encode` returns the pieces of the text and nothing else,
# and never truncates; `collate`, below, adds `<eos>` to the source and `<bos>`/`<eos>` to the
# target.

# %%
#| export
import json
import os
import tempfile
from collections.abc import Iterable

import tokenizers

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)
VOCAB_SIZE = 8_000  # entries, specials included; the chapter explains the choice
TOKENIZER_FORMAT = "transformer-book tokenizer 1"


def _atomic_write(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file readable by its owner only; give it the mode that open()
        # would have, so that a cache or a checkpoint can be shared like any other file.
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


class Tokenizer:
    """Text <-> token ids for one language pair: normalise, cut into spaCy words, then BPE.

    Source and target share the vocabulary. `decode(encode(text)) == normalize(text)` for any
    text made of characters seen in training; other characters encode as <unk>.
    """

    # distinct words whose segmentations are kept: all of Multi30k has 22,000 (fr-en) to
    # 30,000 (de-en); a long-lived tokenizer fed open text starts over at this many (about
    # 50 MB) instead of growing without end
    segmentation_cache_size = 1 << 18

    def __init__(
        self, bpe: tokenizers.Tokenizer, *, languages: tuple[str, str]
    ) -> None:
        self.bpe = bpe
        self.languages = tuple(languages)
        vocab = bpe.get_vocab()
        missing = [t for t in SPECIALS if t not in vocab]
        if missing:
            raise DataError(f"the BPE vocabulary lacks the special tokens {missing}")
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
            raise ValueError(f"language {language!r} is not one of {self.languages}")
        return language

    def encode(self, text: str, language: str | None = None) -> list[int]:
        """Token ids of one sentence, without special tokens; `language` selects spaCy's rules
        (default: the pair's source language)."""
        return self.encode_batch([text], language)[0]

    def encode_batch(
        self, texts: Sequence[str], language: str | None = None
    ) -> list[list[int]]:
        """`encode` for many sentences at once (spaCy is much faster on batches)."""
        return self.encode_words(pretokenize(texts, self._language(language)))

    def segment(self, word: str) -> tuple[int, ...]:
        """The ids of the BPE pieces of one marked word (a word of `pretokenize`)."""
        pieces = self._segmentations.get(word)
        if pieces is None:  # BPE works inside a word: segment each distinct one once
            pieces = tuple(t.id for t in self.bpe.model.tokenize(word))
            if len(self._segmentations) >= self.segmentation_cache_size:
                self._segmentations.clear()
            self._segmentations[word] = pieces
        return pieces

    def encode_words(self, sentences: Iterable[Sequence[str]]) -> list[list[int]]:
        """Token ids of sentences already cut into marked words by `pretokenize`."""
        segment = self.segment
        return [[i for word in words for i in segment(word)] for words in sentences]

    def _checked(self, ids: Sequence[int]) -> list[int]:
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise ValueError(
                f"token id {bad} is outside the vocabulary of {self.vocab_size}"
            )
        return ids

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary entry of each id, special tokens included."""
        return [self._pieces[i] for i in self._checked(ids)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of a sequence of ids: stops at the first <eos>, skips <bos> and <pad>, and
        writes <unk> as the text "<unk>"."""
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
                "normalization": "Unicode NFC; whitespace runs to one space; stripped",
                "word_mark": MARK,
                "bpe": json.loads(self.bpe.to_str()),
            },
            ensure_ascii=False,
        )

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file (atomically: a temporary file, then a rename)."""
        _atomic_write(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> "Tokenizer":
        """Read a tokenizer written by `save`; needs no spaCy."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise DataError(f"cannot read tokenizer {path}: {err}") from err
        return cls.from_json(text, source=path)

    @classmethod
    def from_json(cls, text: str, *, source: object = "JSON") -> "Tokenizer":
        """The tokenizer of `to_json`'s text; `source` names it in the error."""
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
            raise DataError(f"cannot read tokenizer {source}: {err}") from err
        return cls(bpe, languages=languages)


def train_bpe(
    sentences: Iterable[Sequence[str]], vocab_size: int, *, languages: tuple[str, str]
) -> Tokenizer:
    """Learn BPE merges over pre-tokenised sentences until the vocabulary holds `vocab_size`
    entries (special tokens and single characters included)."""
    if vocab_size <= len(SPECIALS):
        raise ValueError(f"vocab_size must exceed {len(SPECIALS)}, got {vocab_size}")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=UNK))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(SPECIALS), show_progress=False
    )
    bpe.train_from_iterator((" ".join(words) for words in sentences), trainer)
    return Tokenizer(bpe, languages=languages)


def train_tokenizer(
    pair: str, vocab_size: int = VOCAB_SIZE, *, data_dir: Path = DATA_DIR
) -> Tokenizer:
    """The joint BPE tokenizer of a pair, learned from both sides of its training split.

    There is no split argument: validation and test text never reach the vocabulary.
    """
    src_lang, tgt_lang = parse_pair(pair)
    train = load_pairs("train", pair, data_dir)
    sentences = pretokenize([s for s, _ in train], src_lang) + pretokenize(
        [t for _, t in train], tgt_lang
    )
    return train_bpe(sentences, vocab_size, languages=(src_lang, tgt_lang))


# %% [markdown]
# One tokenizer per language pair, each learned from the training sentences of its two
# languages:

# %%
from transformer.data import SPECIALS, VOCAB_SIZE, Tokenizer, train_tokenizer

trained = {pair: train_tokenizer(pair) for pair in PAIRS}
for tokenizer in trained.values():
    specials = [tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id]
    print(tokenizer, dict(zip(SPECIALS, specials, strict=True)))
    assert tokenizer.pieces(specials) == list(SPECIALS)
    assert tokenizer.vocab_size == VOCAB_SIZE

# %% [markdown]
# A sentence of each language, cut into its subword pieces. Frequent words are one piece; a
# rarer word is spelled out of a few (▁ marks a piece that begins a word):

# %%
german = "Drei Feuerwehrangehörige sprechen neben einem Löschfahrzeug miteinander."
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
# word, becomes `<unk>` and nothing breaks; so does a literal ▁. The rest of the sentence is
# encoded as usual:

# %%
tokenizer = trained["de-en"]
strange = "Ein Hund 😀 spielt im ☃-Schnee ▁ 北京."
ids = tokenizer.encode(strange)
print(" ".join(tokenizer.pieces(ids)))
print(tokenizer.decode(ids))
assert ids.count(tokenizer.unk_id) == 5
assert (
    tokenizer.decode(ids) == "Ein Hund <unk> spielt im <unk>-Schnee <unk> <unk><unk>."
)

# %% [markdown]
# ## The round trip holds on every sentence
#
# Decoding joins the pieces, turns each ▁ back into a space and strips the one space before the
# first word. The pieces of a word spell the word exactly, as long as every character has an
# entry of its own in the vocabulary. BPE puts every character of the training text there, so the
# question is whether validation and test bring new ones. They do not:

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
alphabet.pivot(
    index=["pair", "language"], columns="split", values="distinct characters"
)[list(SPLITS)]

# %% [markdown]
# So every sentence of every split of both pairs, source and target side, must come back as its
# normalised self. We encode them all (keeping the ids for the statistics below) and check:

# %%
encoded = {}
checked = 0
for pair, tokenizer in trained.items():
    for lang in PAIRS[pair]:
        for split in SPLITS:
            ids = tokenizer.encode_batch(raw[lang][split], lang)
            encoded[pair, lang, split] = ids
            for sentence, sentence_ids in zip(raw[lang][split], ids, strict=True):
                assert tokenizer.unk_id not in sentence_ids
                assert tokenizer.decode(sentence_ids) == normalize(sentence)
            checked += len(ids)
print(f"{checked:,} sentences encoded and decoded back exactly")

# %% [markdown]
# ## How large a vocabulary?
#
# The vocabulary size trades sequence length against how often each entry is seen. Few entries
# mean many pieces per word: longer sequences, more attention to compute, and more steps for
# the decoder to get right. Many entries mean short sequences, but a long tail of entries, each
# a rare word seen a handful of times in training, whose embeddings are barely trained. The
# paper's 37,000 shared entries serve 4.5 million sentence pairs; Multi30k has 29,000, and
# on small data smaller vocabularies work better {cite:p}`sennrich2019revisiting`.
#
# BPE is greedy: the merges learned for a small vocabulary are exactly the first merges learned
# for a large one. So one training run at the largest size gives every smaller vocabulary by
# keeping its first entries, and we can check that against the 8,000-entry tokenizers trained
# above:

# %%
import json
from collections import Counter

import tokenizers as hf


def truncated(tokenizer: Tokenizer, size: int) -> Tokenizer:
    """The tokenizer that BPE training with a vocabulary of `size` entries would have learned."""
    spec = json.loads(tokenizer.bpe.to_str())
    model = spec["model"]
    n_merges = size - (len(model["vocab"]) - len(model["merges"]))
    model["vocab"] = {piece: i for piece, i in model["vocab"].items() if i < size}
    model["merges"] = model["merges"][:n_merges]
    return Tokenizer(
        hf.Tokenizer.from_str(json.dumps(spec)), languages=tokenizer.languages
    )


SIZES = [1_000, 2_000, 4_000, 8_000, 12_000, 16_000, 24_000]
largest = {pair: train_tokenizer(pair, max(SIZES)) for pair in PAIRS}
for pair in PAIRS:
    assert largest[pair].vocab_size == max(SIZES)
    assert truncated(largest[pair], VOCAB_SIZE).to_json() == trained[pair].to_json()

# %% [markdown]
# For each size we measure, over the training split, the average number of pieces per word
# (a spaCy word: punctuation marks count as words) in each language, and the share of entries
# that occur fewer than 10 times in the encoded training text:

# %%
RARE = 10
fertility, rarity = [], []
for pair, big in largest.items():
    counts = {
        lang: Counter(w for s in words[lang]["train"] for w in s)
        for lang in PAIRS[pair]
    }
    for size in SIZES:
        tokenizer = truncated(big, size)
        occurrences = Counter()
        for lang, count in counts.items():
            types = list(count)
            n_pieces = 0
            for word, ids in zip(
                types, tokenizer.encode_words([[w] for w in types]), strict=True
            ):
                n_pieces += len(ids) * count[word]
                for i in ids:
                    occurrences[i] += count[word]
            fertility.append(
                {
                    "language": f"{lang} ({pair})",
                    "vocabulary size": size,
                    "tokens per word": round(n_pieces / count.total(), 4),
                }
            )
        specials = {
            tokenizer.pad_id,
            tokenizer.unk_id,
            tokenizer.bos_id,
            tokenizer.eos_id,
        }
        entries = [i for i in range(size) if i not in specials]
        rare = sum(occurrences[i] < RARE for i in entries)
        rarity.append(
            {
                "pair": pair,
                "vocabulary size": size,
                f"share of entries seen < {RARE} times": round(rare / len(entries), 4),
            }
        )
fertility, rarity = pd.DataFrame(fertility), pd.DataFrame(rarity)
sweep = fertility.pivot(
    index="vocabulary size", columns="language", values="tokens per word"
).join(rarity.pivot(index="vocabulary size", columns="pair").droplevel(0, axis=1))
sweep

# %% [markdown]
# In the figure, look at where each curve bends. On the left, pieces per word fall quickly up
# to a few thousand entries and then flatten out: past 8,000 (the grey rule), every doubling of
# the vocabulary shortens the sentences by only a few per cent. On the right, the share of
# rarely seen entries stays low up to 8,000 and then shoots up: most of what a larger vocabulary
# adds are words that training shows the model only a few times.

# %%
import altair as alt

from transformer.plots import use_book_renderer

use_book_renderer()
x = alt.X(
    "vocabulary size:Q",
    scale=alt.Scale(type="log", domain=[min(SIZES), max(SIZES)], nice=False),
    axis=alt.Axis(values=SIZES, format="~s"),
    title="vocabulary size (log scale)",
)
rule = (
    alt.Chart(pd.DataFrame({"vocabulary size": [VOCAB_SIZE]}))
    .mark_rule(color="grey", strokeDash=[4, 4])
    .encode(x="vocabulary size:Q")
)
left = (
    alt.Chart(fertility)
    .mark_line(point=True)
    .encode(
        x=x,
        y=alt.Y("tokens per word:Q", scale=alt.Scale(zero=False)),
        color=alt.Color("language:N", title="language (pair)"),
        tooltip=["language", "vocabulary size", "tokens per word"],
    )
)
right = (
    alt.Chart(rarity.rename(columns={f"share of entries seen < {RARE} times": "rare"}))
    .mark_line(point=True)
    .encode(
        x=x,
        y=alt.Y(
            "rare:Q",
            title=f"share of entries seen < {RARE} times",
            axis=alt.Axis(format="%"),
        ),
        color=alt.Color("pair:N"),
        tooltip=["pair", "vocabulary size", alt.Tooltip("rare:Q", format=".1%")],
    )
)
alt.hconcat(
    (left + rule).properties(width=280, height=220, title="Subword pieces per word"),
    (right + rule).properties(width=280, height=220, title="Rarely seen entries"),
).resolve_scale(color="independent")

# %% [markdown]
# The book takes 8,000 entries (`VOCAB_SIZE`), the last size before the bend on the right: an
# average word is little more than one piece, and most entries occur often enough in training
# to learn an embedding. The numbers behind that choice:

# %%
at, larger, double = (sweep.loc[k * VOCAB_SIZE // 2] for k in (2, 3, 4))
print(
    f"{VOCAB_SIZE:,} entries: {at['de (de-en)']:.2f} pieces per German word, "
    f"{at['fr (fr-en)']:.2f} per French word, {at['en (de-en)']:.2f} per English word; "
    f"{at['de-en']:.0%} of the de-en entries are seen fewer than {RARE} times."
)
print(
    f"{3 * VOCAB_SIZE // 2:,} entries: {larger['de-en']:.0%} rarely seen; "
    f"{2 * VOCAB_SIZE:,} entries: {double['de-en']:.0%} rarely seen, for German sentences "
    f"{1 - double['de (de-en)'] / at['de (de-en)']:.1%} and English ones "
    f"{1 - double['en (de-en)'] / at['en (de-en)']:.1%} shorter than at {VOCAB_SIZE:,}."
)
assert at["de-en"] < 0.2 and larger["de-en"] > 2 * at["de-en"]
assert 1 - double["de (de-en)"] / at["de (de-en)"] < 0.1

# %% [markdown]
# ### Pieces per word, split by split
#
# With the chosen vocabulary, the statistics of every split. A word is *split* when it takes two
# pieces or more. Validation and test look like training: the vocabulary, learned without them,
# segments them about as finely.

# %%
rows = []
for pair, tokenizer in trained.items():
    for lang in PAIRS[pair]:
        for split in SPLITS:
            sentences = words[lang][split]
            types = sorted({w for s in sentences for w in s})
            n_pieces = dict(
                zip(
                    types,
                    map(len, tokenizer.encode_words([[w] for w in types])),
                    strict=True,
                )
            )
            all_words = [w for s in sentences for w in s]
            n_tokens = sum(map(len, encoded[pair, lang, split]))
            assert n_tokens == sum(n_pieces[w] for w in all_words)
            rows.append(
                {
                    "pair": pair,
                    "language": lang,
                    "split": split,
                    "words": len(all_words),
                    "tokens": n_tokens,
                    "tokens per word": round(n_tokens / len(all_words), 3),
                    "words split": round(
                        sum(n_pieces[w] > 1 for w in all_words) / len(all_words), 3
                    ),
                }
            )
per_split = pd.DataFrame(rows).set_index(["pair", "language", "split"])
# the German training tokens that the attention chapter quotes: under 15 per sentence
assert per_split.loc[("de-en", "de", "train"), "tokens"] == 425_424 < 15 * 29_000
per_split

# %% [markdown]
# The vocabulary is shared, but not every entry serves both languages. Counting which entries
# the training text of each side uses: a large block serves both (names, numbers, punctuation,
# word pieces the languages have in common), and some entries are used by neither, because BPE
# kept merging them into longer ones:

# %%
rows = []
for pair, tokenizer in trained.items():
    src_lang, tgt_lang = PAIRS[pair]
    used = {
        lang: {i for ids in encoded[pair, lang, "train"] for i in ids}
        for lang in (src_lang, tgt_lang)
    }
    specials = {tokenizer.pad_id, tokenizer.unk_id, tokenizer.bos_id, tokenizer.eos_id}
    entries = set(range(tokenizer.vocab_size)) - specials
    rows.append(
        {
            "pair": pair,
            "source only": len(used[src_lang] - used[tgt_lang]),
            "English only": len(used[tgt_lang] - used[src_lang]),
            "both": len(used[src_lang] & used[tgt_lang]),
            "neither": len(entries - used[src_lang] - used[tgt_lang]),
        }
    )
sharing = pd.DataFrame(rows).set_index("pair")
assert (sharing.sum(axis=1) == VOCAB_SIZE - len(SPECIALS)).all()
sharing

# %% [markdown]
# ## Sentence lengths
#
# The figure shows, for each language and split, the share of sentences of each length, counted in
# words (left) and in subword tokens (right; English with the de-en vocabulary). Look at how closely
# the three splits of a language overlap: validation and test are the captions of other images of
# the same Flickr30k corpus as training. In tokens every curve moves a little to the right, German
# most, and keeps a long right tail of captions several times the typical length.

# %%
rows = []
for lang in LANGUAGES:
    pair = "fr-en" if lang == "fr" else "de-en"
    for split in SPLITS:
        n = len(words[lang][split])
        for unit, lengths in (
            ("words", map(len, words[lang][split])),
            ("subword tokens", map(len, encoded[pair, lang, split])),
        ):
            for length, count in sorted(Counter(lengths).items()):
                rows.append(
                    {
                        "language": lang,
                        "split": split,
                        "unit": unit,
                        "length": length,
                        "share": round(count / n, 4),
                    }
                )
lengths = pd.DataFrame(rows)
assert len(lengths) < 5_000
alt.Chart(lengths).mark_line().encode(
    x=alt.X("length:Q", title="sentence length"),
    y=alt.Y("share:Q", title="share of sentences", axis=alt.Axis(format="%")),
    color=alt.Color("split:N", sort=list(SPLITS)),
    tooltip=[
        "language",
        "split",
        "unit",
        "length",
        alt.Tooltip("share:Q", format=".2%"),
    ],
).properties(width=260, height=110).facet(
    row=alt.Row("language:N", sort=list(LANGUAGES)),
    column=alt.Column("unit:N", sort=["words", "subword tokens"], title=None),
)

# %% [markdown]
# The longest sentences, in subword tokens. Even with the `<bos>` or `<eos>` that the model adds,
# every one of them is far shorter than the 512 positions of the model's positional encoding:

# %%
longest = pd.DataFrame(
    [
        {
            "pair": pair,
            "language": lang,
            "split": split,
            "longest": max(map(len, encoded[pair, lang, split])),
        }
        for pair in PAIRS
        for lang in PAIRS[pair]
        for split in SPLITS
    ]
).pivot(index=["pair", "language"], columns="split", values="longest")[list(SPLITS)]
assert longest.to_numpy().max() + 1 < 512
longest

# %% [markdown]
# ## Encoding once: a cache on disk
#
# Training reads the same 29,000 pairs for dozens of epochs; tokenising them each time would be
# wasted work, and the GPU machine that trains the book's models has no spaCy at all. So
# `prepare(pair)` encodes every split once and stores it under `cache/<pair>/`:
#
# | file | holds |
# | --- | --- |
# | `tokenizer.json` | the tokenizer (`Tokenizer.save`): Hugging Face's BPE JSON plus the languages |
# | `train.safetensors`, `val.safetensors`, `test_2016_flickr.safetensors` | for each side, all token ids of the split as one flat int32 array, an int64 array of $N + 1$ offsets (sentence $i$ is `ids[offsets[i]:offsets[i + 1]]`), and one bool per id that is true where a word of `pretokenize` begins (BPE-dropout, at the end of the chapter, needs the words) |
# | `manifest.json` | what the cache was built from: the pair, the vocabulary size, the SHA-256 of the six data files and of each file above |
#
# The ids are stored without special tokens; `collate` adds them. The files are safetensors and
# JSON, never pickle, which would run code on loading. Every file is written atomically (to a
# temporary file, then renamed), and `manifest.json` is written last and deleted first when a
# rebuild starts, so a cache interrupted halfway has no manifest and counts as missing.
#
# **A stale or corrupt cache.** `cache_problems(pair)` lists what makes a cache unusable: no
# manifest, data files that have changed since it was built, another vocabulary size, a file
# whose checksum differs from the manifest. `prepare` *rebuilds* such a cache: it has the text
# and spaCy. `load_encoded(pair, split)`, which training calls and which needs no spaCy,
# *refuses* it with a `DataError` that lists the problems and says how to rebuild. Neither ever
# uses a cache that does not match the data.

# %%
#| export
import argparse
import itertools
import sys
from dataclasses import dataclass
from importlib import metadata

import numpy as np
from safetensors.numpy import load as _load_safetensors
from safetensors.numpy import save as _save_safetensors

CACHE_DIR = _repository_root() / "cache"
CACHE_FORMAT = "transformer-book encoded multi30k 2"
_ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
_STARTS = ("src_starts", "tgt_starts")


def _flatten(
    sequences: Sequence[Sequence[int]], dtype: type = np.int32
) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.fromiter(map(len, sequences), dtype=np.int64, count=len(sequences))
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = itertools.chain.from_iterable(sequences)
    return np.fromiter(flat, dtype=dtype, count=int(offsets[-1])), offsets


@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """The token ids of one split, without special tokens, as flat arrays.

    Pair i is (src_ids[src_offsets[i]:src_offsets[i + 1]], tgt_ids[tgt_offsets[i]:...]); ids
    are int32 and each offsets array holds N + 1 int64 entries, starting at 0. The optional
    `src_starts` and `tgt_starts` (bool, one per id) mark the ids that begin a word of
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
            ids, offsets = (
                getattr(self, f"{side}_ids"),
                getattr(self, f"{side}_offsets"),
            )
            if not (
                ids.ndim == 1
                and ids.dtype == np.int32
                and offsets.ndim == 1
                and offsets.dtype == np.int64
                and len(offsets) > 0
                and offsets[0] == 0
                and offsets[-1] == len(ids)
                and bool(np.all(np.diff(offsets) >= 0))
            ):
                raise DataError(f"inconsistent {side} ids and offsets")
            starts = getattr(self, f"{side}_starts")
            if starts is not None:
                first = offsets[:-1][np.diff(offsets) > 0]  # of each non-empty sentence
                if not (
                    starts.dtype == np.bool_
                    and starts.shape == ids.shape
                    and bool(starts[first].all())
                ):
                    raise DataError(
                        f"inconsistent {side} word starts: one bool per id, and every "
                        "sentence begins a word"
                    )
        if len(self.src_offsets) != len(self.tgt_offsets):
            raise DataError("source and target hold different numbers of sentences")
        if (self.src_starts is None) != (self.tgt_starts is None):
            raise DataError("word starts are given for one side only")

    @classmethod
    def from_lists(
        cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]
    ) -> "EncodedSplit":
        """From the token ids of each source and each target sentence (no word starts, so
        BPE-dropout cannot resample it: see `from_words`)."""
        return cls(*_flatten(src), *_flatten(tgt))

    @classmethod
    def from_words(
        cls,
        tokenizer: Tokenizer,
        src: Sequence[Sequence[str]],
        tgt: Sequence[Sequence[str]],
    ) -> "EncodedSplit":
        """From sentences cut into marked words by `pretokenize`, keeping the word starts."""
        arrays = {}
        for side, sentences in (("src", src), ("tgt", tgt)):
            pieces = [[tokenizer.segment(w) for w in words] for words in sentences]
            ids = [[i for word in sentence for i in word] for sentence in pieces]
            starts = [[k == 0 for w in s for k in range(len(w))] for s in pieces]
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


def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _data_files(pair: str) -> list[str]:
    return [f"{split}.{lang}.gz" for split in SPLITS for lang in parse_pair(pair)]


def cache_problems(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int | None = None,
    data_dir: Path = DATA_DIR,
) -> list[str]:
    """What makes the cache of a pair unusable; an empty list means it is complete and current.

    With vocab_size, a cache built with another vocabulary size is stale too.
    """
    return _read_cache(pair, cache_dir, vocab_size=vocab_size, data_dir=data_dir)[0]


def _read_cache(
    pair: str, cache_dir: Path, *, vocab_size: int | None, data_dir: Path
) -> tuple[list[str], dict[str, bytes]]:
    """(cache_problems, the content of each file whose checksum matched). The files are
    read once: what is checked is what the caller uses, even if a rebuild replaces them."""
    parse_pair(pair)
    folder = Path(cache_dir) / pair
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return ["no manifest.json: never built, or its build did not finish"], {}
    except (OSError, ValueError) as err:
        return [f"manifest.json is unreadable: {err}"], {}
    if not isinstance(manifest, dict) or manifest.get("format") != CACHE_FORMAT:
        return [f"manifest.json is not a {CACHE_FORMAT!r} manifest"], {}
    problems = []
    if manifest.get("pair") != pair:
        problems.append(
            f"manifest.json describes {manifest.get('pair')!r}, not {pair!r}"
        )
    if vocab_size is not None and manifest.get("vocab_size") != vocab_size:
        problems.append(
            f"built with vocab_size={manifest.get('vocab_size')}, asked for {vocab_size}"
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
                    problems.append(f"{name} has changed since the cache was built")
    try:
        files = {"tokenizer.json": manifest["tokenizer_sha256"]}
        if set(manifest["splits"]) != set(SPLITS):
            problems.append(
                f"manifest.json lists the splits {sorted(manifest['splits'])}"
            )
        files |= {
            entry["file"]: entry["sha256"] for entry in manifest["splits"].values()
        }
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


def _build_cache(pair: str, folder: Path, *, vocab_size: int, data_dir: Path) -> None:
    src_lang, tgt_lang = parse_pair(pair)
    # Everything that can fail for want of data or of spaCy fails before the old cache is
    # touched: a wrong --data-dir must not cost a good cache its manifest.
    texts = {split: load_pairs(split, pair, data_dir) for split in SPLITS}
    checksums = expected_checksums(data_dir)
    for language in (src_lang, tgt_lang):
        _spacy_tokenizer(language)  # raises ImportError without spaCy
    folder.mkdir(parents=True, exist_ok=True)
    # No valid cache until the build ends.
    (folder / "manifest.json").unlink(missing_ok=True)
    tokenizer = train_tokenizer(pair, vocab_size, data_dir=data_dir)
    tokenizer.save(folder / "tokenizer.json")
    splits = {}
    for split, pairs in texts.items():
        data = EncodedSplit.from_words(
            tokenizer,
            pretokenize([s for s, _ in pairs], src_lang),
            pretokenize([t for _, t in pairs], tgt_lang),
        )
        blob = data.to_bytes()
        _atomic_write(folder / f"{split}.safetensors", blob)
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
        "tokenizer_sha256": _sha256(folder / "tokenizer.json"),
        "splits": splits,
        "built_with": {
            name: metadata.version(name) for name in ("spacy", "tokenizers")
        },
    }
    _atomic_write(
        folder / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode()
    )


def prepare(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int = VOCAB_SIZE,
    data_dir: Path = DATA_DIR,
    rebuild: bool = False,
) -> Tokenizer:
    """The tokenizer of a pair, with every split encoded in cache_dir/pair.

    A complete, current cache is loaded and needs no spaCy; a missing, stale or corrupt one
    (see cache_problems) is rebuilt from the text, as is any cache with rebuild=True.
    """
    folder = Path(cache_dir) / pair
    options = dict(vocab_size=vocab_size, data_dir=data_dir)
    problems, contents = [], {}
    if not rebuild:  # a rebuild need not read and hash the old files first
        problems, contents = _read_cache(pair, cache_dir, **options)
    if rebuild or problems:
        _build_cache(pair, folder, **options)
        problems, contents = _read_cache(pair, cache_dir, **options)
        if problems:  # only if something rewrote the files while we built them
            raise DataError(f"the cache just built in {folder} is unusable: {problems}")
    return Tokenizer.from_json(
        contents["tokenizer.json"].decode("utf-8"), source=folder / "tokenizer.json"
    )


def load_encoded(
    pair: str, split: str, cache_dir: Path = CACHE_DIR, *, data_dir: Path = DATA_DIR
) -> EncodedSplit:
    """One split of a pair as token ids, from the cache that `prepare` wrote; needs no spaCy.

    A missing, stale or corrupt cache raises DataError; it is never used.
    """
    check_split(split, "load_encoded(pair, split)")
    folder = Path(cache_dir) / pair
    problems, contents = _read_cache(
        pair, cache_dir, vocab_size=None, data_dir=data_dir
    )
    if problems:
        raise DataError(
            f"cannot use the encoded cache {folder}: {'; '.join(problems)}. Rebuild it on a "
            f"machine with spaCy: `python -m transformer prepare --pair {pair}`"
        )
    return EncodedSplit.from_bytes(contents[f"{split}.safetensors"])


PROG = "python -m transformer prepare"


class _UsageError(Exception):
    """A mistake on the command line: one line on standard error and exit status 2, the
    convention of every `python -m transformer` command (train and translate use these too)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage block
        raise _UsageError(message)


def main(argv: list[str] | None = None) -> int:
    """`python -m transformer prepare`: build, or check and keep, the encoded caches.

    Returns the exit status: an error (an unknown pair or option, a missing or corrupt data
    file, no spaCy to build a cache, a cache folder that cannot be written) prints one line on
    standard error and returns 2.
    """
    parser = _Parser(
        prog=PROG,
        description="Tokenise Multi30k and cache every split as token ids (needs spaCy "
        "unless the cache is already current).",
    )
    parser.add_argument(
        "--pair",
        action="append",
        help=f"{' or '.join(PAIRS)}; may be repeated (default: all)",
    )
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument(
        "--rebuild", action="store_true", help="rebuild even a current cache"
    )
    try:
        args = parser.parse_args(argv)
        pairs = args.pair or list(PAIRS)
        for pair in pairs:  # every value checked before any work
            parse_pair(pair)
        if args.vocab_size <= len(SPECIALS):
            raise _UsageError(
                f"--vocab-size must exceed {len(SPECIALS)}, got {args.vocab_size}"
            )
        for k, pair in enumerate(pairs):
            tokenizer = prepare(
                pair,
                args.cache_dir,
                vocab_size=args.vocab_size,
                data_dir=args.data_dir,
                rebuild=args.rebuild,
            )
            splits = {
                split: load_encoded(pair, split, args.cache_dir, data_dir=args.data_dir)
                for split in SPLITS
            }
            if k == 0:
                print(
                    f"{'pair':<6} {'split':<17} {'sentences':>9} {'src tokens':>10} "
                    f"{'tgt tokens':>10}"
                )
            for split, data in splits.items():
                print(
                    f"{pair:<6} {split:<17} {len(data):>9,} {len(data.src_ids):>10,} "
                    f"{len(data.tgt_ids):>10,}"
                )
            where = os.path.relpath(Path(args.cache_dir) / pair)
            print(f"{pair:<6} {tokenizer!r} in {where}")
    except SystemExit as stop:  # --help
        return int(stop.code or 0)
    # ImportError: no spaCy; OSError: a cache folder that cannot be written
    except (_UsageError, DataError, ImportError, OSError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        print(f"{PROG}: error: {message}", file=sys.stderr)
        return 2
    return 0


# %% [markdown]
# The book's cache: for each pair, `prepare` builds it the first time (a few seconds) and loads
# it afterwards. What it holds is what we computed above: the same tokenizer, and the same ids
# for every sentence of every split.

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
sizes = pd.DataFrame(
    [
        {"pair": pair, "file": f.name, "MB": round(f.stat().st_size / 1e6, 1)}
        for pair in PAIRS
        for f in sorted((CACHE_DIR / pair).iterdir())
    ]
).pivot(index="file", columns="pair", values="MB")
sizes

# %% [markdown]
# A pair of the cache is two arrays of ids, with no special tokens yet:

# %%
val = load_encoded("de-en", "val")
source, target = val[0]
print(len(val), "pairs;", source.dtype, source.tolist(), target.tolist())
print(cached["de-en"].decode(source), "->", cached["de-en"].decode(target))

# %% [markdown]
# Now damage a copy of the cache: cut a few bytes off the validation file. `cache_problems`
# names the file, `load_encoded` refuses to use it, and `prepare` rebuilds it. Asking for
# another vocabulary size makes a cache stale as well:

# %%
import shutil
import tempfile

with tempfile.TemporaryDirectory() as scratch:
    shutil.copytree(CACHE_DIR / "de-en", Path(scratch) / "de-en")
    damaged = Path(scratch) / "de-en" / "val.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-8])
    print(cache_problems("de-en", scratch))
    try:
        load_encoded("de-en", "val", scratch)
    except DataError as err:
        message = str(err).replace(scratch, "<scratch>")
        print(message)
    assert "val.safetensors is corrupt" in message
    assert prepare("de-en", scratch).to_json() == cached["de-en"].to_json()
    assert cache_problems("de-en", scratch) == []
    print(cache_problems("de-en", scratch, vocab_size=4_000))

# %% [markdown]
# From the command line, `python -m transformer prepare` does the same for both pairs and prints
# what the cache holds. The folder `cache/` is all that a GPU machine without spaCy needs to
# train: copied into the repository there, it is loaded by `prepare` and `load_encoded` without
# tokenising anything. Like the book's other commands, it reports an error (an unknown pair, a
# missing or corrupt data file, no spaCy to build a cache) in one line on standard error and
# exits with status 2, as the last line of this cell shows.

# %%
from transformer.data import main

assert main(["--pair", "de-en", "--pair", "fr-en"]) == 0
assert main(["--pair", "en-de"]) == 2

# %% [markdown]
# ## Batches of similar length
#
# **What the model is given.** For a pair $(x_1 \dots x_m,\; y_1 \dots y_n)$ the encoder reads
# $x_1 \dots x_m$ `<eos>`: no `<bos>`, since the encoder sees the whole sentence at once and a
# start symbol would tell it nothing, but an `<eos>` that marks where the sentence ends (as
# tensor2tensor, the paper's code {cite:p}`vaswani2018tensor2tensor`, does). The decoder is
# trained to predict each target token from the ones before it, so its input is the target
# shifted right by one position and its expected output is the target itself, ended by `<eos>`:
#
# | position | 1 | 2 | … | $n$ | $n + 1$ |
# | --- | --- | --- | --- | --- | --- |
# | `tgt_in` | `<bos>` | $y_1$ | … | $y_{n-1}$ | $y_n$ |
# | `tgt_out` | $y_1$ | $y_2$ | … | $y_n$ | `<eos>` |
#
# Sentences of one batch have different lengths; `collate` pads every row to the longest with
# `pad_id`, giving `src` of shape (B, S) and `tgt_in`, `tgt_out` of shape (B, T). It also counts
# the real tokens, because the loss is averaged over target tokens, not sentences.
#
# **Empty and overlong sentences.** An empty sentence encodes as no ids at all, and becomes `<eos>`
# alone on the source side, `<bos>` in `tgt_in` and `<eos>` in `tgt_out`: `collate` accepts it,
# though Multi30k has no empty sentence (the normalisation cell checks), so the model never learns
# what to do with one; the translation command passes an empty line through as an empty line,
# without calling the model. In training nothing is ever truncated: `encode` returns every piece,
# and `collate(..., max_len=...)` raises a `ValueError` naming the pair when a side would not fit
# the model's positional table. A truncated target would teach the model translations that stop
# halfway; better to fail and let the caller filter. (No Multi30k sentence comes close, as the table
# of the longest ones above shows.) Translating is another matter: there the decoding chapter cuts
# an overlong source to fit, with a warning.

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
        tgt_out: (B, T) y_1 … y_n <eos>, then pad_id: what the decoder must predict
        index: (B,) the line of each pair in its split
    """

    src: Tensor
    tgt_in: Tensor
    tgt_out: Tensor
    index: Tensor
    n_src_tokens: int  # non-pad tokens in src
    # non-pad tokens in tgt_out: the predictions the loss is taken over
    n_tgt_tokens: int

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """The same batch on another device."""
        return replace(
            self,
            src=self.src.to(device, non_blocking=non_blocking),
            tgt_in=self.tgt_in.to(device, non_blocking=non_blocking),
            tgt_out=self.tgt_out.to(device, non_blocking=non_blocking),
            index=self.index.to(device, non_blocking=non_blocking),
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
    """Pad (source ids, target ids) pairs, given without special tokens, into a Batch.

    `index` gives each pair's line in its split (default 0 … B-1). A pair whose source with
    <eos> or target with <bos> is longer than max_len raises ValueError: nothing is truncated.
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
    tgt_len = np.array([len(y) + 1 for _, y in examples])  # + <bos> (in) or <eos> (out)
    if max_len is not None:
        over = np.flatnonzero((src_len > max_len) | (tgt_len > max_len))
        if over.size:
            k = over[0]
            raise ValueError(
                f"pair {int(index[k])} has {src_len[k]} source and {tgt_len[k]} target "
                f"tokens, more than max_len={max_len}; nothing is truncated: drop or split it"
            )
    B, S, T = len(examples), int(src_len.max()), int(tgt_len.max())
    src = np.full((B, S), pad_id, dtype=np.int64)
    tgt_in = np.full((B, T), pad_id, dtype=np.int64)
    tgt_out = np.full((B, T), pad_id, dtype=np.int64)
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
short, long = sorted((val[i] for i in range(5)), key=lambda pair: len(pair[1]))[::4]
batch = collate([long, short, ([], [])], **specials)
for name in ("src", "tgt_in", "tgt_out"):
    print(f"{name:<8}", tuple(getattr(batch, name).shape))
view = {}
for row, label in ((1, "short pair"), (2, "empty pair")):
    for name in ("src", "tgt_in", "tgt_out"):
        view[label, name] = tokenizer.pieces(getattr(batch, name)[row])
view = pd.DataFrame({key: pd.Series(pieces) for key, pieces in view.items()}).fillna("")
view.index.name = "position"

not_eos = batch.tgt_out[:, :-1] != tokenizer.eos_id
assert torch.equal(batch.tgt_in[:, 1:][not_eos], batch.tgt_out[:, :-1][not_eos])
assert batch.n_src_tokens == int((batch.src != tokenizer.pad_id).sum())
assert batch.n_tgt_tokens == int((batch.tgt_out != tokenizer.pad_id).sum())
assert batch.src[2, 0] == tokenizer.eos_id and batch.tgt_out[2, 0] == tokenizer.eos_id
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
# approximately 25000 source tokens and 25000 target tokens" (Section 5.1). Two ideas are in that
# sentence. Batches are measured in tokens, not sentences, so that every step sees about the
# same amount of text and needs about the same memory. And sentences of similar length go
# together, so that little of a batch is padding, which costs computation and carries nothing.
#
# `token_batches` does both, once per epoch. It sorts the pairs by their longer side (the length
# of an example in tensor2tensor), then by their total length; pairs of equal lengths, and in
# Multi30k many pairs share each length, come in a random order drawn from `(seed, epoch)`. It
# then cuts the sorted list into batches, adding pairs while the padded batch stays within
# `max_tokens` on each side, that is while $B \cdot S \le$ `max_tokens` and
# $B \cdot T \le$ `max_tokens`, and finally shuffles the order of the batches, so that a training
# run does not see short sentences first and long ones last.
# The same seed and epoch give the same batches; the next epoch gives others. With
# `shuffle=False` (for evaluation) the batches come sorted by length and are always the same.
#
# The default, `MAX_TOKENS` = 8,000 padded tokens a side, is a third of the paper's 25,000: the
# paper spread its batches over 8 GPUs and 4.5 million sentence pairs, while here an epoch is
# only a few dozen such batches (counted below); the training chapter tunes it.

# %%
#| export
MAX_TOKENS = 8_000  # padded tokens per batch, on each side (the paper: about 25,000)


def token_batches(
    src_lengths: Sequence[int],
    tgt_lengths: Sequence[int],
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
) -> list[np.ndarray]:
    """Group pairs into batches of similar length, each holding at most `max_tokens` padded
    tokens on each side; returns the pair indices of each batch.

    The lengths are those the model sees (with <eos>, or <bos>). Pairs are sorted by their
    longer side, then by their total length, with ties in a random order drawn from
    (seed, epoch); batches are cut greedily along that order and then, with shuffle, shuffled.
    """
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    if src.ndim != 1 or src.shape != tgt.shape:
        raise ValueError(
            f"one source and one target length per pair: {src.shape}, {tgt.shape}"
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
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        order = rng.permutation(len(src))
    else:
        order = np.arange(len(src))
    # lexsort is stable: pairs of equal lengths keep the random order drawn above.
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
    """The batches of one epoch over an encoded split (see token_batches and collate)."""
    groups = token_batches(
        data.src_lengths + 1,  # + <eos>
        data.tgt_lengths + 1,  # + <bos> or <eos>
        max_tokens=max_tokens,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
    )
    for index in groups:
        yield collate(
            [data[i] for i in index],
            pad_id=tokenizer.pad_id,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            index=index,
            max_len=max_len,
        )


# %% [markdown]
# One epoch over the de-en training split: every pair comes exactly once, no batch exceeds the
# budget on either side, the same seed and epoch give the same batches, and the next epoch
# gives different ones.

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
assert all(
    b.src.numel() <= MAX_TOKENS and b.tgt_in.numel() <= MAX_TOKENS for b in batches
)
per_batch = pd.DataFrame(
    {
        "sentences": [b.src.shape[0] for b in batches],
        "source tokens": [b.n_src_tokens for b in batches],
        "target tokens": [b.n_tgt_tokens for b in batches],
    }
)
print(f"{len(batches)} batches in epoch 0, {len(epoch_1)} in epoch 1")
per_batch.describe().loc[["mean", "min", "max"]].round(1)

# %% [markdown]
# ### How much of a batch is padding
#
# The alternative is the batching of many tutorials: shuffle the pairs and cut them into batches
# of a fixed number of sentences. To compare like with like, the random batches below hold as
# many sentences as the length-sorted ones do on average, so both make about the same number of
# steps per epoch. The table counts, over one epoch of the training split, the share of the
# padded tensors that is padding, and the size of the largest batch in padded target tokens,
# the memory a step needs:


# %%
def padding(groups: list[np.ndarray], src: np.ndarray, tgt: np.ndarray) -> dict:
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
        {"pair": pair, "batches of": "similar length"} | padding(by_length, src, tgt)
    )
    rows.append(
        {"pair": pair, "batches of": "random sentences"} | padding(random, src, tgt)
    )
padding_table = pd.DataFrame(rows).set_index(["pair", "batches of"])
for pair in PAIRS:
    sorted_, random_ = padding_table.loc[pair].iloc[0], padding_table.loc[pair].iloc[1]
    assert sorted_["target padding"] < random_["target padding"] / 4
    assert sorted_["largest batch (padded target tokens)"] <= MAX_TOKENS
padding_table

# %% [markdown]
# Batches of random sentences are mostly padding: each holds one long caption that every other
# row is padded to. Sorted batches waste a small fraction of that, and their size in tokens
# never exceeds the budget, while a random batch of the same number of sentences can be much
# larger when it happens to draw a long caption.

# %% [markdown]
# ## BPE-dropout: many spellings of one word (an option, off by default)
#
# BPE gives every word one segmentation. A frequent word is one piece; a word the training captions
# hold once or never is spelt out in several pieces, and each spelling is seen in few contexts. The
# chapter on the book's models measures what that costs: a quarter of the French→English model's
# validation NLL (counted per word-level token) falls on the 2% of words seen fewer than twice in
# training.
#
# **BPE-dropout** {cite:p}`provilkov2020bpe` segments each word of the training
# data afresh each time it is used. BPE segments a word by starting from its characters and
# applying, step by step, the highest-ranked merge among those that fit two adjacent symbols.
# BPE-dropout drops each of those candidate merges with probability $p$ at every step and
# applies the best of the rest; when every candidate is dropped, the word keeps its current
# pieces. With $p = 0$ it is BPE; as $p$ approaches 1 it approaches characters. Each epoch then
# spells a word in several ways, so the model sees the pieces of frequent words in more
# contexts and learns to read and write a word from more than one split of it. Validation and
# test text keep the deterministic segmentation, as Provilkov et al. do; they used $p = 0.1$.
#
# It is not part of "Attention Is All You Need": the book's models do not use it, and training
# turns it on with `TrainConfig(bpe_dropout=p)` (`--bpe-dropout p`). The chapter on the book's
# models compares a run with it to one without. Hugging Face's BPE has a `dropout` setting, but it
# draws from a random generator that cannot be seeded, and an epoch must be a function of
# the seed so that a resumed run makes the same updates. So `BPEDropout` segments
# in Python, from the tokenizer's merges, with a generator seeded by (seed, epoch). It reads
# the words from the cache's word starts: a piece boundary without a space can be a
# boundary between two words of spaCy's (`▁Büsche` `.`), and merges never cross one.

# %%
#| export
from random import Random


class BPEDropout:
    """BPE-dropout (Provilkov et al., 2020): segment words afresh, dropping each merge that
    could apply with probability p at every step; p = 0 is the tokenizer's own BPE."""

    def __init__(self, tokenizer: Tokenizer, p: float) -> None:
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < 1:
            raise ValueError(f"BPE-dropout probability must be in [0, 1), got {p!r}")
        self.tokenizer, self.p = tokenizer, float(p)
        merges = json.loads(tokenizer.bpe.to_str())["model"]["merges"]
        pairs = (tuple(m.split(" ") if isinstance(m, str) else m) for m in merges)
        self._rank = {pair: rank for rank, pair in enumerate(pairs)}
        self._vocab = tokenizer.bpe.get_vocab()

    def segment(self, word: str, rng: Random) -> list[int]:
        """The ids of one marked word's pieces, drawn with `rng`."""
        symbols, rank, p, draw = list(word), self._rank, self.p, rng.random
        while len(symbols) > 1:
            # The best merge that survives: scanning the candidates, a merge is only drawn
            # when it would beat the best survivor so far; the others cannot win anyway.
            best, at = None, -1
            for i in range(len(symbols) - 1):
                r = rank.get((symbols[i], symbols[i + 1]))
                if r is not None and (best is None or r < best) and draw() >= p:
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
                "BPE-dropout needs the word starts of the training split: build it with "
                "`EncodedSplit.from_words` or load it with `load_encoded` (`from_lists` "
                "records no word starts)"
            )

    def longest_spelling(
        self, split: EncodedSplit, sides: Sequence[str] = ("src", "tgt")
    ) -> int:
        """The most tokens a sentence of `sides` can take when resampled, <bos> and <eos>
        aside: one per character of its words, the spelling in which every merge drops."""
        longest = 0
        for side in sides:
            ids, offsets = (
                getattr(split, f"{side}_ids"),
                getattr(split, f"{side}_offsets"),
            )
            chars = np.zeros(len(ids) + 1, dtype=np.int64)
            np.cumsum(
                [len(piece) for piece in self.tokenizer.pieces(ids)], out=chars[1:]
            )
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
        """The split with every word of `sides` ("src", "tgt" or both) segmented afresh, as a
        function of (seed, epoch); the other side is kept as it is."""
        self.check(split)
        if not set(sides) <= {"src", "tgt"}:
            raise ValueError(f"sides must be 'src' and/or 'tgt', got {sides!r}")
        rng = Random(f"bpe-dropout {seed} {epoch}")
        arrays = {
            f"{side}_{name}": getattr(split, f"{side}_{name}")
            for side in ("src", "tgt")
            for name in ("ids", "offsets", "starts")
        }
        for side in ("src", "tgt"):
            if side not in sides:
                continue
            ids = getattr(split, f"{side}_ids")
            offsets = getattr(split, f"{side}_offsets")
            first = np.flatnonzero(getattr(split, f"{side}_starts"))
            pieces = self.tokenizer.pieces(ids)
            bounds = zip(first.tolist(), [*first[1:].tolist(), len(ids)], strict=True)
            words = [self.segment("".join(pieces[a:b]), rng) for a, b in bounds]
            ends = np.zeros(len(words) + 1, dtype=np.int64)
            np.cumsum([len(w) for w in words], out=ends[1:])
            starts = np.zeros(ends[-1], dtype=np.bool_)
            starts[ends[:-1]] = True
            arrays[f"{side}_ids"] = np.fromiter(
                itertools.chain.from_iterable(words), dtype=np.int32, count=ends[-1]
            )
            arrays[f"{side}_offsets"] = ends[np.searchsorted(first, offsets)]
            arrays[f"{side}_starts"] = starts
        return EncodedSplit(**arrays)


# %% [markdown]
# With $p = 0$, `BPEDropout` is the tokenizer: it segments every distinct word of every split,
# in both pairs, exactly as Hugging Face's BPE does. That checks the merge loop above against
# the library, rank order and ties included.

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
        plain.segment(w, Random(0)) == list(tokenizer.segment(w)) for w in distinct
    )
    print(f"{pair}: {len(distinct):,} distinct words, each segmented as by BPE")

# %% [markdown]
# With $p = 0.1$ a word comes out in several spellings. Here are the six commonest of those that
# 1,000 draws give two words of the German training captions, a frequent one and one seen once, with
# how often each came out; the first row is BPE's own spelling. `▁Mann` leaves it in 28% of the
# draws, `▁Polizeihund` in 16%: how often depends on the word's chain of merges, not on how often
# the word is seen. What differs is what the model gains: `▁Mann` is seen thousands of times anyway,
# while `▁Polizeihund` now also appears as `▁Poliz ei hund` and `▁Pol iz ei hund`, whose pieces the
# model meets in many other words.

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
    plain_spelling = " ".join(cached["de-en"].pieces(cached["de-en"].segment(word)))
    assert seen.most_common(1)[0][0] == plain_spelling
    left[word] = 1 - seen[plain_spelling] / 1_000
    spellings += [
        {"word": word, "in training": train_words[word], "spelling": s, "of 1,000": n}
        for s, n in seen.most_common(6)
    ]
assert round(left["▁Mann"], 2) == 0.28 and round(left["▁Polizeihund"], 2) == 0.16
pd.DataFrame(spellings).set_index(["word", "in training"])

# %% [markdown]
# Resampling a whole split keeps every sentence: decoding gives the same text, because the
# pieces of a word always spell the word. The sentences get longer, since some merges are
# skipped. The same (seed, epoch) gives the same split, and the next epoch another one:

# %%
train = load_encoded("de-en", "train")
epoch_0 = dropout.resample(train, seed=0, epoch=0)
decode = cached["de-en"].decode
assert all(decode(epoch_0[i][0]) == decode(train[i][0]) for i in range(len(train)))
assert all(decode(epoch_0[i][1]) == decode(train[i][1]) for i in range(len(train)))
again = dropout.resample(train, seed=0, epoch=0)
assert np.array_equal(again.tgt_ids, epoch_0.tgt_ids)
epoch_1 = dropout.resample(train, seed=0, epoch=1)
assert not np.array_equal(epoch_1.tgt_ids, epoch_0.tgt_ids)
growth = {
    side: len(getattr(epoch_0, f"{side}_ids")) / len(getattr(train, f"{side}_ids"))
    for side in ("src", "tgt")
}
assert round(growth["src"], 2) == 1.30 and round(growth["tgt"], 2) == 1.28
print(
    f"p = 0.1: {growth['src'] - 1:.0%} more German and {growth['tgt'] - 1:.0%} more "
    "English tokens"
)

# %% [markdown]
# How much longer can a sentence get? A draw that drops every merge spells each word letter
# by letter, and no draw is longer, so `longest_spelling` (the characters of a sentence's
# words) bounds every epoch to come. The training chapter checks, before the first update,
# that a batch and the model's positions hold that bound, not just BPE's own spelling. In
# German→English's training pairs, the longest sentence grows from its BPE spelling to (with
# `<eos>`):

# %%
longest_bpe = int(max(train.src_lengths.max(), train.tgt_lengths.max())) + 1
longest_drawn = int(max(epoch_0.src_lengths.max(), epoch_0.tgt_lengths.max())) + 1
longest_spelled = dropout.longest_spelling(train) + 1
assert longest_bpe < longest_drawn <= longest_spelled == 256
print(
    f"BPE {longest_bpe} tokens, one draw at p = 0.1 {longest_drawn}, "
    f"at most {longest_spelled} (one a character)"
)

# %% [markdown]
# And how long one epoch's resampling takes (a timing: it varies from run to run):

# %% tags=["nbval-ignore-output"]
import time

started = time.perf_counter()
dropout.resample(train, seed=0, epoch=2)
seconds = time.perf_counter() - started
n_words = int(train.src_starts.sum() + train.tgt_starts.sum())
print(f"{n_words:,} words resampled in {seconds:.1f} s on this machine")

# %% [markdown]
# The cost is one pass of Python over the training words each epoch, a few seconds of one CPU core,
# and the extra tokens: at $p = 0.1$ an epoch holds about 30% more of them (28% more English ones),
# and so about 30% more batches to compute. The chapter on the book's models measures what it buys
# on this corpus: nothing, in two CPU runs with the book's small model against the same model
# without it (the CPU baseline, with ordinary dropout 0.2): on both sides it was far worse and was
# stopped after 10 epochs, and on the source side only its average of the last five epochs' weights
# ended 9.8% worse in perplexity per word after 20.
#
# That is all the data the model needs. The training chapter calls `prepare(pair)` for the
# tokenizer, `load_encoded(pair, split)` for the ids, `token_batches` once per epoch and `collate`
# for each batch (and, with BPE-dropout, `BPEDropout.resample` before them), and `iterate_batches`
# for validation; the decoding chapter uses `tokenizer.encode` and `tokenizer.decode` to turn a
# sentence into a translation and back into text.
