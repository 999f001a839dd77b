# Generated from chapters/a03_text_and_tokenizer.ipynb: edit it, not this file.
"""The package's words: the chapter's tokenizer with spaCy's French rules
built fast (transformer.spacy_french), for every reader of text in the
package."""

# %% auto #0
__all__ = [
    "spacy_tokenizer",
    "fast_pretokenize",
    "with_fast_words",
    "load_tokenizer",
]

# %% ../chapters/a03_text_and_tokenizer.ipynb #3c823670

import importlib.util
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import transformer.tokenizer as chapter
from transformer.tokenizer import Tokenizer


def spacy_tokenizer(language: str):
    """The spaCy tokenizer that the package cuts `language` with: the same
    words as the chapter's `spacy_tokenizer`, French's built fast."""
    # looked up when called, so that a test may replace the chapter's
    return _french() if language == "fr" else chapter.spacy_tokenizer(language)


@cache
def _french():
    if importlib.util.find_spec("spacy") is None:
        return chapter.spacy_tokenizer("fr")  # its one-line error
    from transformer.spacy_french import french_tokenizer  # imports spaCy

    return french_tokenizer()


def fast_pretokenize(
    texts: Sequence[str], language: str
) -> tuple[tuple[str, ...], ...]:
    """The chapter's `pretokenize`, French built fast."""
    return chapter.pretokenize(texts, language, spacy_tokenizer)


def with_fast_words(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer`, now cutting French with the fast build: the same ids."""
    tokenizer.splitter = spacy_tokenizer
    return tokenizer


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer in the file `path` (`Tokenizer.load`), French built fast:
    how the package reads a tokenizer's file."""
    return with_fast_words(Tokenizer.load(path))
