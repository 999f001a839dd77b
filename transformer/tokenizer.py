# Generated from chapters/10_data.ipynb: edit it, not this file.
"""Text to token ids and back: normalisation, spaCy's words, a joint BPE."""

# %% auto #0
__all__ = [
    "MARK",
    "VOCAB_SIZE",
    "normalize",
    "spacy_tokenizer",
    "pretokenize",
    "learn_merges",
    "Tokenizer",
    "train_bpe",
]

# %% ../chapters/10_data.ipynb #a6014f71

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


# %% ../chapters/10_data.ipynb #0094ce71
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


# %% ../chapters/10_data.ipynb #aa7c3ed0
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


# %% ../chapters/10_data.ipynb #4d68a1a1
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
