# Generated from chapters/a04_batches_and_cache.ipynb: edit it, not this file.
"""The data pipeline that training reads: the batches of an epoch over an
encoded split, and the names of the modules it is built from."""

# %% auto #0
__all__ = ["iterate_batches"]

# %% ../chapters/a04_batches_and_cache.ipynb #bb493428

from collections.abc import Iterator

from transformer.batch_checks import collate, token_batches
from transformer.batches import MAX_TOKENS, Batch
from transformer.bpe_dropout import BPEDropout  # noqa: F401
from transformer.cache import (  # noqa: F401
    CACHE_DIR,
    cache_problems,
    load_encoded,
    prepare,
)
from transformer.encoded import EncodedSplit
from transformer.multi30k import (  # noqa: F401
    DATA_DIR,
    PAIRS,
    SPLITS,
    DataError,
    load_pairs,
    load_split,
    parse_pair,
)
from transformer.tokenizer import Tokenizer


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
