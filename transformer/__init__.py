"""Attention Is All You Need, annotated: the package that the book's chapters
build.

Every module except this one and `__main__` is generated from a chapter's
`#| export` cells (`make export`); edit the chapter, not the module.
"""

import importlib
from typing import Any

__version__ = "0.1.0"

# Each public name and the module that defines it. A module is imported when
# one of its names is first used, not with the package: `python -m transformer
# --help` answers without loading torch.
_WHERE = {
    "scaled_dot_product_attention": "attention",
    "export_model": "checkpoint",
    "load_model": "checkpoint",
    "TransformerConfig": "config",
    "DecodeOptions": "decode_options",
    "Hypothesis": "decode",
    "beam_search": "decode",
    "greedy_decode": "decode",
    "batched_beam_search": "batched_search",
    "batched_greedy_decode": "batched_search",
    "translate": "translation",
    "load_pair_model": "translation",
    "Decoder": "decoder",
    "DecoderLayer": "decoder",
    "LearnedPositionalEncoding": "embedding",
    "PositionalEncoding": "embedding",
    "TokenEmbedding": "embedding",
    "sinusoidal_encoding": "embedding",
    "Encoder": "encoder",
    "EncoderLayer": "encoder",
    "Scores": "evaluate",
    "bleu_by_length": "evaluate",
    "score": "evaluate",
    "translate_split": "split_translation",
    "LabelSmoothingLoss": "loss",
    "TokenStats": "validation",
    "token_stats": "validation",
    "causal_mask": "masking",
    "padding_mask": "masking",
    "target_mask": "masking",
    "Generator": "model",
    "Transformer": "model",
    "MultiHeadAttention": "multihead",
    "make_optimizer": "schedule",
    "noam_lr": "schedule",
    "PositionwiseFeedForward": "sublayers",
    "SublayerConnection": "sublayers",
    "TrainConfig": "train_config",
    "train": "trainer",
}
__all__ = list(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'transformer' has no attribute {name!r}")
    value = getattr(
        importlib.import_module(f"transformer.{_WHERE[name]}"), name
    )
    globals()[name] = value  # found once, then an attribute like any other
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
