"""Parameter and FLOP counts: the formula of a training step, on a model small enough to count
by hand, and the same counts through the wrappers training puts around a model."""

from __future__ import annotations

import torch

from transformer.config import TransformerConfig
from transformer.flops import (
    cross_attention_kv_parameters,
    non_embedding_parameters,
    training_flops,
)
from transformer.model import Transformer


def small_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        TransformerConfig(src_vocab_size=50, d_model=8, n_heads=2, n_layers=3, d_ff=16)
    )


def test_training_flops_by_the_formula():
    model = small_model()
    n_enc, n_dec = non_embedding_parameters(model)
    # Per layer: attention 4(d² + d), feed-forward 2·d·d_ff + d_ff + d, a LayerNorm 2d.
    d, f = 8, 16
    assert n_enc == 3 * (4 * (d * d + d) + 2 * d * f + f + d + 2 * 2 * d)
    assert n_dec == 3 * (2 * 4 * (d * d + d) + 2 * d * f + f + d + 3 * 2 * d)
    # The cross-attention's W_K and W_V (with biases) act on the source positions.
    n_kv = 3 * 2 * (d * d + d)
    assert cross_attention_kv_parameters(model) == n_kv
    flops = training_flops(model, src_lengths=[5, 2], tgt_lengths=[7, 3])
    for s, t, value in zip([5, 2], [7, 3], flops, strict=True):
        linear = 6 * ((n_enc + n_kv) * s + (n_dec - n_kv + d * 50) * t)
        assert value == linear + 12 * d * 3 * (s * s + t * t + s * t)


def test_counts_see_through_torch_compile():
    model = small_model()
    compiled = torch.compile(model)  # wraps lazily: nothing is compiled until it runs
    assert compiled is not model
    assert non_embedding_parameters(compiled) == non_embedding_parameters(model)
    assert cross_attention_kv_parameters(compiled) == cross_attention_kv_parameters(
        model
    )
    lengths = dict(src_lengths=[4, 9], tgt_lengths=[6, 1])
    assert (
        training_flops(compiled, **lengths) == training_flops(model, **lengths)
    ).all()
