"""The encoder: shapes, padding invariance, explicit layers, and the pre-norm final LayerNorm."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import assert_gradients_reach_every_parameter
from torch import nn

from transformer.encoder import Encoder, EncoderLayer
from transformer.layer_config import LayerConfig
from transformer.masking import padding_mask

PAD = 0  # the toy vocabulary's pad id in these tests
D_MODEL, N_HEADS, D_FF, N_LAYERS = 16, 4, 32, 2
CONFIG = LayerConfig(d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF, dropout=0.1)


def tiny_encoder(norm_first: bool = False) -> Encoder:
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, norm_first=norm_first)
    return Encoder(config, N_LAYERS).eval()


def padded_batch() -> torch.Tensor:
    """Three sentences of lengths 5, 2 and 4 in ids 1..19, padded with PAD to S = 5."""
    lengths = [5, 2, 4]
    ids = torch.randint(
        1, 20, (len(lengths), max(lengths)), generator=torch.Generator().manual_seed(3)
    )
    for b, n in enumerate(lengths):
        ids[b, n:] = PAD
    return ids


def embed(ids: torch.Tensor) -> torch.Tensor:
    """A fixed random vector per token id and per position (stands in for the embeddings)."""
    g = torch.Generator().manual_seed(7)
    table, positions = (
        torch.randn(20, D_MODEL, generator=g),
        torch.randn(64, D_MODEL, generator=g),
    )
    return table[ids] + positions[: ids.size(1)]


def test_shapes_and_weights():
    encoder = tiny_encoder()
    ids = padded_batch()
    memory, weights = encoder(embed(ids), padding_mask(ids, PAD), need_weights=True)
    B, S = ids.shape
    assert memory.shape == (B, S, D_MODEL)
    assert len(weights) == N_LAYERS
    assert all(w.shape == (B, N_HEADS, S, S) for w in weights)
    assert encoder(embed(ids), padding_mask(ids, PAD))[1] is None


def test_padding_keys_get_no_weight():
    encoder = tiny_encoder()
    ids = padded_batch()
    mask = padding_mask(ids, PAD)
    _, weights = encoder(embed(ids), mask, need_weights=True)
    for w in weights:
        assert (w.masked_select(~mask) == 0).all()
        assert torch.allclose(w.sum(-1), torch.ones_like(w.sum(-1)))


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("extra", [1, 6])
def test_appending_padding_changes_no_real_position(norm_first: bool, extra: int):
    encoder = tiny_encoder(norm_first)
    ids = padded_batch()
    longer = torch.cat([ids, torch.full((ids.size(0), extra), PAD)], dim=1)
    with torch.no_grad():
        short, _ = encoder(embed(ids), padding_mask(ids, PAD))
        long, _ = encoder(embed(longer), padding_mask(longer, PAD))
    real = ids != PAD
    torch.testing.assert_close(
        long[:, : ids.size(1)][real], short[real], atol=1e-5, rtol=0
    )


def test_without_the_mask_padding_leaks():
    # The invariance above is the mask's doing: without it the real positions change.
    encoder = tiny_encoder()
    ids = padded_batch()
    longer = torch.cat([ids, torch.full((ids.size(0), 3), PAD)], dim=1)
    with torch.no_grad():
        short, _ = encoder(embed(ids), padding_mask(ids, PAD))
        leaky, _ = encoder(embed(longer), None)
    real = ids != PAD
    assert (leaky[:, : ids.size(1)][real] - short[real]).abs().max() > 1e-3


def test_a_sentence_is_encoded_the_same_alone_and_in_a_batch():
    encoder = tiny_encoder()
    ids = padded_batch()
    with torch.no_grad():
        batch, _ = encoder(embed(ids), padding_mask(ids, PAD))
        alone_ids = ids[1:2, :2]  # the length-2 sentence, no padding
        alone, _ = encoder(embed(alone_ids), padding_mask(alone_ids, PAD))
    torch.testing.assert_close(batch[1, :2], alone[0], atol=1e-5, rtol=0)


def test_layers_are_built_separately_not_copied():
    encoder = tiny_encoder()
    first, second = encoder.layers[0], encoder.layers[1]
    assert first is not second
    assert (
        first.self_attn.w_q.weight.data_ptr() != second.self_attn.w_q.weight.data_ptr()
    )
    assert not torch.equal(first.self_attn.w_q.weight, second.self_attn.w_q.weight)
    assert not torch.equal(first.feed_forward.w_1.bias, second.feed_forward.w_1.bias)


def test_layer_structure_and_parameter_count():
    layer = EncoderLayer(CONFIG)
    assert len(layer.sublayers) == 2
    expected = (
        4 * (D_MODEL**2 + D_MODEL) + 2 * D_MODEL * D_FF + D_FF + D_MODEL + 4 * D_MODEL
    )
    assert sum(p.numel() for p in layer.parameters()) == expected


def test_prenorm_stack_has_a_final_layernorm_and_postnorm_does_not():
    post, pre = tiny_encoder(norm_first=False), tiny_encoder(norm_first=True)
    assert isinstance(post.final_norm, nn.Identity)
    assert isinstance(pre.final_norm, nn.LayerNorm)
    assert all(not s.norm_first for layer in post.layers for s in layer.sublayers)
    assert all(s.norm_first for layer in pre.layers for s in layer.sublayers)
    # The pre-norm output is normalised by the final LayerNorm: zero mean per position.
    ids = padded_batch()
    with torch.no_grad():
        out, _ = pre(embed(ids), padding_mask(ids, PAD))
    torch.testing.assert_close(
        out.mean(-1), torch.zeros(out.shape[:2]), atol=1e-5, rtol=0
    )


def test_dropout_is_active_in_training_and_gradients_reach_every_parameter():
    encoder = tiny_encoder().train()
    ids = padded_batch()
    x, mask = embed(ids), padding_mask(ids, PAD)
    torch.manual_seed(1)
    a, _ = encoder(x, mask)
    b, _ = encoder(x, mask)
    assert not torch.equal(a, b)
    # A weighted sum: the plain sum of a LayerNorm's output (γ = 1) does not depend on its
    # input, so it would give every parameter below the last LayerNorm a zero gradient.
    (a * torch.linspace(-1, 1, D_MODEL)).sum().backward()
    assert_gradients_reach_every_parameter(encoder)
