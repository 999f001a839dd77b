"""transformer.kv_cache: a decoding step over the cache equals the decoder over the whole
output, for every variant of the layers; the memory is projected once; rows follow a
reorder."""

from unittest import mock

import pytest
import torch
from helpers import VARIANTS, tiny_model

import transformer.kv_cache as kv_cache
from transformer.attention_config import AttentionConfig
from transformer.kv_cache import DecoderCache, KVCache, cached_attention, decode_step
from transformer.masking import causal_mask, padding_mask
from transformer.multihead import MultiHeadAttention

PAD = 0
B, T, S, D_MODEL, H = 3, 6, 5, 16, 4


def sources() -> torch.Tensor:
    """(B, S) ids, the last two rows padded."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 23, (B, S), generator=g)
    src[1, 3:], src[2, 1:] = PAD, PAD
    return src


@pytest.mark.parametrize("overrides", VARIANTS)
def test_decode_step_equals_the_decoder_over_the_whole_output(overrides):
    model = tiny_model(**overrides)
    src = sources()
    tgt = torch.randint(3, 23, (B, T), generator=torch.Generator().manual_seed(2))
    src_mask = padding_mask(src, PAD)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        out = model.decode(tgt, memory, src_mask=src_mask, tgt_mask=causal_mask(T))
        whole = model.generator(out)  # (B, T, V)
        cache = DecoderCache.empty(len(model.decoder.layers))
        for t in range(T):
            assert cache.length == t
            step = decode_step(model, tgt[:, t : t + 1], memory, src_mask, cache)
            torch.testing.assert_close(step, whole[:, t], atol=1e-5, rtol=0)
    assert cache.length == T
    assert cache.self_attn[0].key.shape == (B, H, T, D_MODEL // H)
    assert cache.cross_attn[0].key.shape == (B, H, S, D_MODEL // H)


def test_cached_attention_projects_the_memory_once():
    mha = MultiHeadAttention(AttentionConfig(d_model=D_MODEL, n_heads=H)).eval()
    x, memory = torch.randn(B, T, D_MODEL), torch.randn(B, S, D_MODEL)
    mask = padding_mask(sources(), PAD)
    cache = KVCache()
    with (
        torch.no_grad(),
        mock.patch.object(kv_cache, "project", wraps=kv_cache.project) as project,
    ):
        whole, _ = mha(x, memory, memory, mask=mask)
        for t in range(T):
            out = cached_attention(
                mha, x[:, t : t + 1], cache=cache, memory=memory, mask=mask
            )
            torch.testing.assert_close(out[:, 0], whole[:, t], atol=1e-6, rtol=0)
    keys = [call for call in project.call_args_list if mha.w_k in call.args[2:]]
    assert len(keys) == 1  # at the first step only


def test_cached_self_attention_grows_by_one_position_a_step():
    mha = MultiHeadAttention(AttentionConfig(d_model=D_MODEL, n_heads=H)).eval()
    x = torch.randn(B, T, D_MODEL)
    cache = KVCache()
    with torch.no_grad():
        whole, _ = mha(x, x, x, mask=causal_mask(T))
        for t in range(T):
            out = cached_attention(mha, x[:, t : t + 1], cache=cache)
            assert cache.key.shape == cache.value.shape == (B, H, t + 1, D_MODEL // H)
            torch.testing.assert_close(out[:, 0], whole[:, t], atol=1e-6, rtol=0)


def test_reorder_keeps_the_rows_asked_for_in_their_order():
    cache = DecoderCache.empty(2)
    for kv in cache.self_attn + cache.cross_attn:
        kv.key, kv.value = torch.randn(3, H, 2, 4), torch.randn(3, H, 2, 4)
    before = [(kv.key, kv.value) for kv in cache.self_attn + cache.cross_attn]
    rows = torch.tensor([2, 2, 0, 1])
    cache.reorder(rows, memory=False)  # the memory's caches stay as they were
    for kv, (key, value) in zip(cache.self_attn, before[:2], strict=True):
        assert torch.equal(kv.key, key[rows]) and torch.equal(kv.value, value[rows])
    for kv, (key, _) in zip(cache.cross_attn, before[2:], strict=True):
        assert kv.key is key
    cache.reorder(rows)
    assert torch.equal(cache.cross_attn[0].key, before[2][0][rows])
    empty = DecoderCache.empty(1)
    empty.reorder(rows)  # nothing cached yet: nothing to do
    assert empty.length == 0 and empty.self_attn[0].key is None
