# Generated from chapters/10_data.ipynb: edit it, not this file.
"""Text to token ids and back: one normalisation, spaCy's words and a joint BPE
vocabulary."""

# %% auto #0
__all__ = [
    "MARK",
    "PAD",
    "UNK",
    "BOS",
    "EOS",
    "SPECIALS",
    "VOCAB_SIZE",
    "TOKENIZER_FORMAT",
    "normalize",
    "pretokenize",
    "TokenizerError",
    "Tokenizer",
    "train_bpe",
    "train_tokenizer",
]

# %% ../chapters/10_data.ipynb #20c59270

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


# %% ../chapters/10_data.ipynb #abf907d4
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
