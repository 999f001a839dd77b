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


class Vocabulary:
    """The entries of a language pair's BPE vocabulary (Hugging Face's `bpe`)
    and the ids of its special tokens; `Tokenizer` adds encoding and
    decoding."""

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

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def pair(self) -> str:
        return "-".join(self.languages)

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(pair={self.pair!r}, vocab_size={self.vocab_size})"

    def check_language(self, language: str | None) -> str:
        """`language`, or the pair's source language for None; a ValueError
        for any other language than the pair's two."""
        if language is None:
            return self.languages[0]
        if language not in self.languages:
            raise ValueError(
                f"language {language!r} is not one of {self.languages}"
            )
        return language

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary entry of each id, special tokens included."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise ValueError(
                f"token id {bad} is outside the vocabulary of"
                f" {self.vocab_size}"
            )
        return [self._pieces[i] for i in ids]

    def to_json(self) -> str:
        """The tokenizer's file, as text."""
        return json.dumps(
            {
                "format": TOKENIZER_FORMAT,
                "languages": list(self.languages),
                "normalization": (
                    "Unicode NFC; whitespace runs to one space; stripped"
                ),
                "word_mark": "\u2581",  # tokenizer.MARK
                "bpe": json.loads(self.bpe.to_str()),
            },
            ensure_ascii=False,
        )

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file (atomically: a temporary file,
        then a rename)."""
        atomic_write(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read a tokenizer written by `save`, as an instance of `cls` (a
        Tokenizer); needs no spaCy."""
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
