# Generated from chapters/a07_trainer.ipynb: edit it, not this file.
"""Parameter and FLOP counts of the Transformer: the cost of a training step,
for MFU."""

# %% auto #0
__all__ = [
    "non_embedding_parameters",
    "cross_attention_kv_parameters",
    "training_flops",
]

# %% ../chapters/a07_trainer.ipynb #50585a09

from collections.abc import Sequence

import numpy as np
from torch import nn

from transformer.distributed import unwrap


def non_embedding_parameters(model: nn.Module) -> tuple[int, int]:
    """N_enc and N_dec: the parameters of the encoder and decoder stacks."""
    model = unwrap(model)
    return (
        sum(p.numel() for p in model.encoder.parameters()),
        sum(p.numel() for p in model.decoder.parameters()),
    )


def cross_attention_kv_parameters(model: nn.Module) -> int:
    """N_kv: the parameters of the decoder's cross-attention key and value
    projections, which are applied to the source positions."""
    return sum(
        p.numel()
        for layer in unwrap(model).decoder.layers
        for projection in (layer.cross_attn.w_k, layer.cross_attn.w_v)
        for p in projection.parameters()
    )


def training_flops(
    model: nn.Module, *, src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> np.ndarray:
    """FLOPs of a forward and backward pass over each (source, target) pair, by
    the formula 6·((N_enc + N_kv)·S + (N_dec − N_kv + d_model·V)·T) +
    12·d_model·(L_e·S² + L_d·T² + L_d·S·T).

    Lengths count real tokens (<eos> of the source, <bos> or <eos> of the
    target included).
    """
    n_enc, n_dec = non_embedding_parameters(model)
    n_kv = cross_attention_kv_parameters(model)
    config = unwrap(model).config
    d, layers, vocab = (
        config.d_model,
        config.n_layers,
        config.target_vocab_size,
    )
    s = np.asarray(src_lengths, dtype=np.float64)
    t = np.asarray(tgt_lengths, dtype=np.float64)
    linear = 6 * ((n_enc + n_kv) * s + (n_dec - n_kv + d * vocab) * t)
    attention = 12 * d * (layers * s**2 + layers * t**2 + layers * s * t)
    return linear + attention
