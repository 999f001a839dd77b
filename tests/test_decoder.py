"""The decoder: causality, source-padding invariance, weights, and the pre-norm final LayerNorm."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from helpers import assert_gradients_reach_every_parameter
from torch import nn

from transformer.decoder import Decoder, DecoderLayer
from transformer.layer_config import LayerConfig
from transformer.masking import causal_mask, padding_mask, target_mask

PAD = 0  # the toy vocabulary's pad id in these tests
VOCAB = 20
D_MODEL, N_HEADS, D_FF, N_LAYERS = 16, 4, 32, 2
CONFIG = LayerConfig(d_model=D_MODEL, n_heads=N_HEADS, d_ff=D_FF, dropout=0.1)


def tiny_decoder(norm_first: bool = False) -> Decoder:
    torch.manual_seed(0)
    config = dataclasses.replace(CONFIG, norm_first=norm_first)
    return Decoder(config, N_LAYERS).eval()


def ids_with_padding(lengths: list[int], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), max(lengths)), generator=g)
    for b, n in enumerate(lengths):
        ids[b, n:] = PAD
    return ids


def embed(ids: torch.Tensor) -> torch.Tensor:
    """A fixed random vector per token id and per position (stands in for the embeddings)."""
    g = torch.Generator().manual_seed(7)
    table, positions = (
        torch.randn(VOCAB, D_MODEL, generator=g),
        torch.randn(64, D_MODEL, generator=g),
    )
    return table[ids] + positions[: ids.size(1)]


def batch():
    src = ids_with_padding([5, 3, 4], seed=1)
    tgt = ids_with_padding([6, 2, 4], seed=2)
    memory = torch.randn(
        3, src.size(1), D_MODEL, generator=torch.Generator().manual_seed(5)
    )
    return src, tgt, memory


def test_shapes_and_weights():
    decoder = tiny_decoder()
    src, tgt, memory = batch()
    out, weights = decoder(
        embed(tgt),
        memory,
        src_mask=padding_mask(src, PAD),
        tgt_mask=target_mask(tgt, PAD),
        need_weights=True,
    )
    (B, S), T = src.shape, tgt.size(1)
    assert out.shape == (B, T, D_MODEL)
    assert len(weights) == N_LAYERS
    for self_w, cross_w in weights:
        assert self_w.shape == (B, N_HEADS, T, T)
        assert cross_w.shape == (B, N_HEADS, T, S)
        # Nothing above the diagonal, nothing on the source's padding.
        assert (self_w.masked_select(~causal_mask(T)) == 0).all()
        assert (cross_w.masked_select(~padding_mask(src, PAD)) == 0).all()
    assert (
        decoder(
            embed(tgt),
            memory,
            src_mask=padding_mask(src, PAD),
            tgt_mask=target_mask(tgt, PAD),
        )[1]
        is None
    )


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_later_target_tokens_never_change_earlier_outputs(norm_first: bool):
    decoder = tiny_decoder(norm_first)
    src, tgt, memory = batch()
    src_mask = padding_mask(src, PAD)
    g = torch.Generator().manual_seed(11)
    T = tgt.size(1)
    with torch.no_grad():
        reference, _ = decoder(
            embed(tgt), memory, src_mask=src_mask, tgt_mask=target_mask(tgt, PAD)
        )
        for t in range(T - 1):
            for _ in range(3):
                changed = tgt.clone()
                # Any token, padding included, may follow position t.
                changed[:, t + 1 :] = torch.randint(
                    0, VOCAB, (tgt.size(0), T - t - 1), generator=g
                )
                out, _ = decoder(
                    embed(changed),
                    memory,
                    src_mask=src_mask,
                    tgt_mask=target_mask(changed, PAD),
                )
                torch.testing.assert_close(
                    out[:, : t + 1], reference[:, : t + 1], atol=1e-6, rtol=0
                )


def test_without_the_causal_mask_the_future_leaks():
    decoder = tiny_decoder()
    src, tgt, memory = batch()
    src_mask = padding_mask(src, PAD)
    changed = tgt.clone()
    changed[:, 1:] = (changed[:, 1:] % (VOCAB - 1)) + 1  # different real tokens
    with torch.no_grad():
        a, _ = decoder(
            embed(tgt), memory, src_mask=src_mask, tgt_mask=padding_mask(tgt, PAD)
        )
        b, _ = decoder(
            embed(changed),
            memory,
            src_mask=src_mask,
            tgt_mask=padding_mask(changed, PAD),
        )
    assert (a[:, 0] - b[:, 0]).abs().max() > 1e-3


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_source_padding_changes_nothing(norm_first: bool):
    decoder = tiny_decoder(norm_first)
    src, tgt, memory = batch()
    extra = 4
    longer_src = torch.cat([src, torch.full((src.size(0), extra), PAD)], dim=1)
    # Whatever the memory holds at padding positions must not matter.
    longer_memory = torch.cat(
        [memory, 100 * torch.randn(src.size(0), extra, D_MODEL)], dim=1
    )
    tgt_mask = target_mask(tgt, PAD)
    with torch.no_grad():
        a, _ = decoder(
            embed(tgt), memory, src_mask=padding_mask(src, PAD), tgt_mask=tgt_mask
        )
        b, _ = decoder(
            embed(tgt),
            longer_memory,
            src_mask=padding_mask(longer_src, PAD),
            tgt_mask=tgt_mask,
        )
    real = tgt != PAD
    torch.testing.assert_close(b[real], a[real], atol=1e-5, rtol=0)


def test_masks_are_keyword_only():
    # Both masks are boolean tensors; when S == T a swapped pair would broadcast silently.
    layer = DecoderLayer(CONFIG)
    x = torch.randn(1, 3, D_MODEL)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    with pytest.raises(TypeError):
        layer(x, x, mask, mask)  # type: ignore[misc]
    with pytest.raises(TypeError):
        tiny_decoder()(x, x, mask, mask)  # type: ignore[misc]


def test_layer_structure_and_parameter_count():
    layer = DecoderLayer(CONFIG)
    assert len(layer.sublayers) == 3
    assert layer.self_attn is not layer.cross_attn
    expected = (
        8 * (D_MODEL**2 + D_MODEL) + 2 * D_MODEL * D_FF + D_FF + D_MODEL + 6 * D_MODEL
    )
    assert sum(p.numel() for p in layer.parameters()) == expected


def test_layers_are_built_separately_not_copied():
    decoder = tiny_decoder()
    first, second = decoder.layers[0], decoder.layers[1]
    assert not torch.equal(first.cross_attn.w_k.weight, second.cross_attn.w_k.weight)
    assert not torch.equal(first.feed_forward.w_2.bias, second.feed_forward.w_2.bias)


def test_prenorm_stack_has_a_final_layernorm_and_postnorm_does_not():
    post, pre = tiny_decoder(norm_first=False), tiny_decoder(norm_first=True)
    assert isinstance(post.final_norm, nn.Identity)
    assert isinstance(pre.final_norm, nn.LayerNorm)
    assert all(not s.norm_first for layer in post.layers for s in layer.sublayers)
    assert all(s.norm_first for layer in pre.layers for s in layer.sublayers)
    # The pre-norm output is normalised by the final LayerNorm (γ = 1, β = 0 at the start):
    # zero mean and unit variance at every position.
    src, tgt, memory = batch()
    with torch.no_grad():
        out, _ = pre(
            embed(tgt),
            memory,
            src_mask=padding_mask(src, PAD),
            tgt_mask=target_mask(tgt, PAD),
        )
    torch.testing.assert_close(
        out.mean(-1), torch.zeros(out.shape[:2]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        out.var(-1, unbiased=False), torch.ones(out.shape[:2]), atol=1e-3, rtol=0
    )


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-norm", "pre-norm"])
def test_dropout_is_active_in_training_and_gradients_reach_every_parameter(
    norm_first: bool,
):
    config = dataclasses.replace(
        CONFIG, attention_dropout=0.1, ffn_dropout=0.1, norm_first=norm_first
    )
    decoder = Decoder(config, N_LAYERS).train()
    src, tgt, memory = batch()
    memory.requires_grad_(True)
    masks = {"src_mask": padding_mask(src, PAD), "tgt_mask": target_mask(tgt, PAD)}
    torch.manual_seed(1)
    a, _ = decoder(embed(tgt), memory, **masks)
    b, _ = decoder(embed(tgt), memory, **masks)
    assert not torch.equal(a, b)
    # A weighted sum: the plain sum of a LayerNorm's output (γ = 1) does not depend on its
    # input, so it would give every parameter below the last LayerNorm a zero gradient.
    (a * torch.linspace(-1, 1, D_MODEL)).sum().backward()
    assert memory.grad.abs().max() > 1e-6  # through the encoder-decoder attention
    assert_gradients_reach_every_parameter(decoder)
