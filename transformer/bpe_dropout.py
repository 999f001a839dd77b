# Generated from chapters/a04_batches_and_cache.ipynb: edit it, not this file.
"""BPE-dropout (Provilkov et al., 2020): the training words spelt afresh each
epoch."""

# %% auto #0
__all__ = ["BPEDropout"]

# %% ../chapters/a04_batches_and_cache.ipynb #a4027891

import json
from collections.abc import Sequence
from dataclasses import replace
from random import Random

import numpy as np

from transformer.encoded_split import EncodedSplit, flatten
from transformer.multi30k import DataError
from transformer.tokenizer import Tokenizer


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
        arrays = {}
        for side in [side for side in ("src", "tgt") if side in sides]:
            ids = getattr(split, f"{side}_ids")
            offsets = getattr(split, f"{side}_offsets")
            first = np.flatnonzero(getattr(split, f"{side}_starts"))
            pieces = self.tokenizer.pieces(ids)
            bounds = zip(
                first.tolist(), [*first[1:].tolist(), len(ids)], strict=True
            )
            words = [
                self.segment("".join(pieces[a:b]), rng) for a, b in bounds
            ]
            new_ids, ends = flatten(words)  # ends: where each word ends
            starts = np.zeros(len(new_ids), dtype=np.bool_)
            starts[ends[:-1]] = True
            arrays[f"{side}_ids"], arrays[f"{side}_starts"] = new_ids, starts
            arrays[f"{side}_offsets"] = ends[np.searchsorted(first, offsets)]
        return replace(split, **arrays)
