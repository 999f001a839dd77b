# Generated from chapters/10_data.ipynb: edit it, not this file.
"""A BPE vocabulary: its entries, the ids of its special tokens, and the file
of a tokenizer."""

# %% auto #0
__all__ = [
    "PAD",
    "UNK",
    "BOS",
    "EOS",
    "SPECIALS",
    "TOKENIZER_FORMAT",
    "TokenizerError",
    "tokenizer_json",
    "read_tokenizer_json",
    "Vocabulary",
]

# %% ../chapters/10_data.ipynb #d997e8f0

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


# %% ../chapters/10_data.ipynb #3a63c5bf
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
