# Generated from chapters/a08_translating.ipynb: edit it, not this file.
"""Translating text with a trained model: sentences in, translations out, in
batches of similar lengths, and the shipped models loaded by language pair."""

# %% auto #0
__all__ = [
    "ENDS",
    "CLOSING",
    "OPENING",
    "TITLES",
    "SENTENCE_END",
    "load_pair_model",
    "length_sorted_batches",
    "split_sentences",
    "translate",
    "translate_batches",
]

# %% ../chapters/a08_translating.ipynb #aa35ad21

import re
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from transformer.batched_search import (
    batched_beam_search,
    batched_greedy_decode,
)
from transformer.checkpoint import CheckpointError, load_model
from transformer.decode import Hypothesis
from transformer.decode_options import DecodeOptions, with_changes
from transformer.knockout import KnockOut, knocked_out
from transformer.model import Transformer
from transformer.multi30k import parse_pair
from transformer.paths import CHECKPOINTS_DIR, HOME_VARIABLE
from transformer.tokenizer import Tokenizer, normalize


def load_pair_model(
    pair: str,
    checkpoint: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
) -> tuple[Transformer, Tokenizer]:
    """The model (eval mode) and tokenizer that translate `pair` ("de-en" or
    "fr-en"): those of the folder `checkpoint`, a shipped model or a training
    checkpoint, or by default the shipped model CHECKPOINTS_DIR / pair.

    Raises CheckpointError, one line that names the folder, if it is missing
    (for the default folder: how to train a model), does not load, or holds a
    model of another pair.
    """
    languages = parse_pair(pair)
    folder = CHECKPOINTS_DIR / pair if checkpoint is None else Path(checkpoint)
    if not folder.is_dir():
        if checkpoint is None:
            raise CheckpointError(
                f"no {pair} model in {folder}: set {HOME_VARIABLE} to the"
                f" folder that holds checkpoints/{pair} (a clone of the"
                " book's repository), name a model folder with --checkpoint"
                f" DIR, or train one with `python -m transformer train --pair"
                f" {pair} --export {folder}`"
            )
        raise CheckpointError(f"no model folder {folder}")
    try:
        model, tokenizer = load_model(folder, device=device)
    # Not a whole, readable model, whatever the reason: say why.
    except Exception as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if str(folder) not in message:
            message = f"{folder}: {message}"
        raise CheckpointError(f"cannot load the model: {message}") from err
    if tokenizer.languages != languages:
        raise CheckpointError(
            f"{folder} holds a {tokenizer.pair} model, not a {pair} one"
        )
    return model, tokenizer


# %% ../chapters/a08_translating.ipynb #bbf6ba90
def length_sorted_batches(
    lengths: Sequence[int], batch_size: int
) -> list[list[int]]:
    """The indices 0 … n-1 of n sentences in batches of at most batch_size,
    longest first (ties in input order), so that each batch holds sentences of
    similar lengths."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [
        order[i : i + batch_size] for i in range(0, len(order), batch_size)
    ]


def _listed(items: list[str], most: int = 10) -> str:
    """'a', 'a and b', 'a, b and c', '… and 3 more'."""
    if len(items) > most:
        return f"{', '.join(items[:most])} and {len(items) - most} more"
    return (
        items[0]
        if len(items) == 1
        else f"{', '.join(items[:-1])} and {items[-1]}"
    )


def _sentences(indices: list[int]) -> str:
    """'sentence 3' or 'sentences 3, 8 and 12' for indices 2, 7, 11: numbered
    from 1, as lines are."""
    noun = "sentence" if len(indices) == 1 else "sentences"
    return f"{noun} {_listed([str(i + 1) for i in indices])}"


# %% ../chapters/a08_translating.ipynb #6b3a0281
ENDS = ".!?…"  # the punctuation that ends a sentence
CLOSING = "\"'”’“»«›‹)]"  # quotes and brackets that close before the space
OPENING = "\"'“‘„‚«‹"  # quotes that open a sentence
# Titles before a name, whose full stop ends no sentence (German, French,
# English).
TITLES = frozenset({"Dr", "Prof", "Hr", "Fr", "St", "Mr", "Mrs", "Ms", "Mme"})
# A run of ENDS (group 1), any CLOSING and the space before the next sentence.
SENTENCE_END = re.compile(
    f"([{re.escape(ENDS)}]+)[{re.escape(CLOSING)}]* (?=\\S)"
)


def _ends_sentence(text: str, end: re.Match) -> bool:
    """Whether a match of SENTENCE_END ends a sentence: the next one starts
    with an upper-case letter or an opening quote, and a single full stop
    follows no title, letter or number."""
    after = text[end.end()]
    if after not in OPENING and unicodedata.category(after) != "Lu":
        return False
    if end.group(1) != ".":
        return True
    start = end.start()  # the word before the stop: its letters and digits
    while start and (text[start - 1].isalpha() or text[start - 1].isdecimal()):
        start -= 1
    word = text[start : end.start()]
    return not (len(word) == 1 or word.isdecimal() or word in TITLES)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, normalised as the tokenizer does, by the rule
    above: [] for a text of white space only."""
    text = normalize(text)
    ends = [m for m in SENTENCE_END.finditer(text) if _ends_sentence(text, m)]
    starts = [0] + [m.end() for m in ends]
    stops = [m.end() - 1 for m in ends] + [len(text)]  # before the space
    return [text[a:b] for a, b in zip(starts, stops, strict=True) if b > a]


# %% ../chapters/a08_translating.ipynb #3e14811a
def translate(
    model: Transformer,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    options: DecodeOptions | None = None,
    *,
    prefix: str = "",
    warn: Callable[[str], None] | None = None,
    by_sentence: bool = False,
    knock_out: KnockOut | str | None = None,
    **changes,
) -> list[str]:
    """Translations of `sentences`, in their order: beam search, or greedy
    decoding, as `options` say (default: DecodeOptions(); `changes` such as
    beam_size=1 change them), over batches of similar lengths, on the model's
    device; each starts with `prefix`, text in the target language, if given.
    With `by_sentence`, each text is cut by split_sentences, each of its
    sentences translated (with the prefix) and the translations joined by a
    space. With `knock_out`, the model runs with those parts switched off
    (`knocked_out`), and its weights are restored after.

    An empty sentence translates to "". A source longer than the model's
    positions is cut to its first config.max_len - 1 tokens, then <eos>;
    `warn`, if given, is told about those and about translations that the
    length limit stopped before <eos>. Needs spaCy (to cut the sentences into
    words) unless every sentence is empty.
    """
    options = with_changes(options, **changes)
    special = {
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
    }
    device = next(model.parameters()).device
    forced = tokenizer.encode(prefix, tokenizer.languages[1]) if prefix else []

    def decode_batch(sources: list[list[int]]) -> list[Hypothesis]:
        src = torch.full(
            (len(sources), len(sources[0])), tokenizer.pad_id, dtype=torch.long
        )  # (B, S): the longest first
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(device)
        start = torch.tensor([forced] * len(sources), dtype=torch.long)
        start = start.to(device) if forced else None  # (B, P) or None
        search = (
            batched_greedy_decode if options.greedy else batched_beam_search
        )
        return search(model, src, options, prefix=start, **special)

    with knocked_out(model, knock_out):
        return translate_batches(
            decode_batch,
            tokenizer,
            sentences,
            max_len=model.config.max_len,
            batch_size=options.batch_size,
            warn=warn,
            by_sentence=by_sentence,
        )


def translate_batches(
    decode_batch: Callable[[list[list[int]]], list[Hypothesis]],
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    *,
    max_len: int,
    batch_size: int,
    warn: Callable[[str], None] | None = None,
    by_sentence: bool = False,
) -> list[str]:
    """`translate` around any decoder of id batches (the package's, or another
    engine's): `decode_batch` takes sources as ids with their <eos>, longest
    first, and returns their hypotheses; max_len is the model's number of
    positions, batch_size the sentences of a batch. A warning names a text by
    its number in `sentences`, split or not."""
    if isinstance(sentences, str):
        raise TypeError(
            "translate takes a sequence of sentences, not one string"
        )
    if by_sentence:  # owner[i]: the number of the text that texts[i] is from
        split = [split_sentences(s) for s in sentences]
        owner = [n for n, parts in enumerate(split) for _ in parts]
        texts = [part for parts in split for part in parts]
    else:
        texts = [normalize(s) for s in sentences]
        owner = list(range(len(texts)))
    todo = [i for i, text in enumerate(texts) if text]  # empty ones stay ""
    encoded = tokenizer.encode_batch([texts[i] for i in todo]) if todo else []
    room = max_len - 1  # source tokens that fit with their <eos>
    with_eos = {i: len(ids) + 1 for i, ids in zip(todo, encoded, strict=True)}
    too_long = {i: n for i, n in with_eos.items() if n > max_len}
    if too_long and warn is not None:
        sizes = _listed([str(n) for n in too_long.values()])
        named = sorted({owner[i] for i in too_long})
        warn(
            f"{_sentences(named)}: {sizes} tokens with <eos>, more"
            f" than the model's {max_len} positions: translating the first"
            f" {room}"
        )
    sources = [ids[:room] + [tokenizer.eos_id] for ids in encoded]
    results = [""] * len(texts)
    cut_off = []
    for batch in length_sorted_batches([len(s) for s in sources], batch_size):
        found = decode_batch([sources[j] for j in batch])
        for j, best in zip(batch, found, strict=True):
            results[todo[j]] = tokenizer.decode(best.tokens)
            if not best.ended:
                cut_off.append(todo[j])
    if cut_off and warn is not None:
        warn(
            f"{_sentences(sorted({owner[i] for i in cut_off}))}: the"
            " translation stopped at the length limit, before <eos>"
        )
    if by_sentence:
        joined = [[] for _ in sentences]
        for n, result in zip(owner, results, strict=True):
            joined[n].append(result)
        results = [" ".join(parts) for parts in joined]
    return results
