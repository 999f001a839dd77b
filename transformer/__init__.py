"""Attention Is All You Need, annotated: the package that the book's chapters build.

Every module except this one and `__main__` is generated from a chapter's `#| export` cells
(`make export`); edit the chapter, not the module.
"""

from transformer.attention import scaled_dot_product_attention
from transformer.checkpoint import export_model, load_model
from transformer.config import TransformerConfig
from transformer.decode import Hypothesis, beam_search, greedy_decode
from transformer.decoder import Decoder, DecoderLayer
from transformer.embedding import (
    LearnedPositionalEncoding,
    PositionalEncoding,
    TokenEmbedding,
    sinusoidal_encoding,
)
from transformer.encoder import Encoder, EncoderLayer
from transformer.evaluate import Scores, score
from transformer.loss import LabelSmoothingLoss, TokenStats, token_stats
from transformer.masking import causal_mask, padding_mask, target_mask
from transformer.model import Generator, Transformer
from transformer.multihead import MultiHeadAttention
from transformer.schedule import make_optimizer, noam_lr
from transformer.splits import bleu_by_length, translate_split
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection
from transformer.train import TrainConfig, train
from transformer.translation import load_pair_model, translate

__version__ = "0.1.0"
__all__ = [
    "TrainConfig",
    "export_model",
    "load_model",
    "train",
    "Hypothesis",
    "beam_search",
    "greedy_decode",
    "translate",
    "load_pair_model",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "Scores",
    "bleu_by_length",
    "score",
    "translate_split",
    "Generator",
    "Transformer",
    "TransformerConfig",
    "LabelSmoothingLoss",
    "TokenStats",
    "make_optimizer",
    "noam_lr",
    "token_stats",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "PositionalEncoding",
    "PositionwiseFeedForward",
    "SublayerConnection",
    "TokenEmbedding",
    "causal_mask",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
    "target_mask",
]
