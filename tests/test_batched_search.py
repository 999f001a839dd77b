"""transformer.batched_step (the batched searches' decoding step): it equals the decoding
chapter's decode_step, for every variant of the layers, with beams reordered and sentences
dropped; its weights are laid out once per model and again when one changes; the memory is
projected once per sentence, not once per beam."""

import pytest
import torch
from helpers import VARIANTS, tiny_model

from transformer.batched_step import BatchCache, attend_rows, step_weights
from transformer.kv_cache import DecoderCache, decode_step
from transformer.masking import padding_mask

PAD = 0
n, K, S, D_MODEL, H = 3, 2, 5, 16, 4


pytestmark = pytest.mark.usefixtures("one_thread")


def sources() -> torch.Tensor:
    """(n, S) ids, the last two rows padded."""
    src = torch.randint(3, 23, (n, S), generator=torch.Generator().manual_seed(1))
    src[1, 3:], src[2, 1:] = PAD, PAD
    return src


@pytest.mark.parametrize("overrides", VARIANTS)
def test_the_step_is_the_chapters_with_beams_reordered_and_sentences_dropped(overrides):
    """K rows per sentence, as beam search makes them: at every step the rows move to
    random parents among their sentence's, and after step 2 the middle sentence leaves.
    The chapter's cache runs over the memory repeated K times and follows the same rows."""
    model = tiny_model(**overrides)
    src = sources()
    src_mask = padding_mask(src, PAD)  # (n, 1, 1, S)
    g = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        memory = model.encode(src, src_mask)  # (n, S, d_model)
        cache = BatchCache(model, memory, src_mask, beams=K, length=6)
        chapter = DecoderCache.empty(len(model.decoder.layers))
        memory, src_mask = (
            memory.repeat_interleave(K, 0),
            src_mask.repeat_interleave(K, 0),
        )
        sentences = n
        token = torch.randint(3, 23, (n * K, 1), generator=g)
        for t in range(6):
            ours = cache.step(token)
            theirs = decode_step(model, token, memory, src_mask, chapter)
            torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
            assert cache.length == chapter.length == t + 1
            parents = torch.randint(0, K, (sentences, K), generator=g)
            rows = (torch.arange(sentences)[:, None] * K + parents).view(-1)
            if t == 2:  # the middle sentence leaves
                stays = torch.tensor([True, False, True])
                keep = stays.repeat_interleave(K).nonzero()[:, 0]
                cache.keep(rows[keep], sentences=stays)
                chapter.reorder(rows[keep])
                memory, src_mask = memory[keep], src_mask[keep]
                sentences, rows = 2, rows[keep]
            else:
                cache.keep(rows)
                chapter.reorder(rows, memory=False)
            token = torch.randint(3, 23, (sentences * K, 1), generator=g)
    assert cache.kv.shape[2] == 2 * K  # the rows of the two sentences left


def test_the_memory_is_projected_once_per_sentence_not_per_beam():
    model = tiny_model()
    src = sources()
    src_mask = padding_mask(src, PAD)
    with torch.inference_mode():
        cache = BatchCache(
            model, model.encode(src, src_mask), src_mask, beams=4, length=3
        )
    d_k = D_MODEL // H
    assert [k.shape for k, _ in cache.memory_kv] == [(n * H, S, d_k)] * 2
    assert cache.memory_bias.shape == (n * H, 1, S)
    assert cache.kv.shape == (2, 2, n * 4, H, 3, d_k)  # layers, K and V, rows, ...


def test_the_weights_are_laid_out_once_and_again_when_one_changes():
    model = tiny_model()
    first = step_weights(model)
    assert step_weights(model) is first  # kept with the model
    torch.testing.assert_close(first.output, model.generator.proj.weight.t())
    with torch.no_grad():
        model.decoder.layers[1].self_attn.w_v.bias.add_(1.0)  # written in place
    second = step_weights(model)
    assert second is not first
    weight, bias = second.layers[1].qkv
    torch.testing.assert_close(
        bias[-D_MODEL:], model.decoder.layers[1].self_attn.w_v.bias
    )
    with torch.no_grad():
        # the tied embedding, as training moves it
        model.generator.proj.weight.mul_(2.0)
    torch.testing.assert_close(
        step_weights(model).output, model.generator.proj.weight.t()
    )
    model.to(torch.float64)  # new tensors
    assert step_weights(model).output.dtype == torch.float64


def test_attend_rows_is_scaled_dot_product_attention():
    """attend_rows takes the queries already scaled by 1/√d_k."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(6, shape, 8, generator=g) for shape in (2, 5, 5))
    mask = torch.rand(6, 1, 5, generator=g) > 0.3
    mask[:, :, 0] = True  # every query sees a key
    bias = torch.zeros(mask.shape).masked_fill(~mask, -torch.inf)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scaled = q / 8**0.5
    torch.testing.assert_close(
        attend_rows(scaled, k, v, bias), expected, atol=1e-6, rtol=0
    )
    plain = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(attend_rows(scaled, k, v), plain, atol=1e-6, rtol=0)


def test_a_quantised_feed_forward_network_is_called_as_it_is():
    """PyTorch's dynamic int8 quantisation of the feed-forward layers (the decoding bench's
    package-int8): their modules hold no float weight to lay out, so the step calls them."""
    model = tiny_model()
    feed_forward = {
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear) and ".feed_forward." in name
    }
    model = torch.ao.quantization.quantize_dynamic(
        model, feed_forward, dtype=torch.qint8
    )
    src = sources()
    src_mask = padding_mask(src, PAD)
    token = torch.randint(3, 23, (n, 1), generator=torch.Generator().manual_seed(4))
    with torch.inference_mode():
        memory = model.encode(src, src_mask)
        ours = BatchCache(model, memory, src_mask, beams=1, length=2).step(token)
        chapter = DecoderCache.empty(len(model.decoder.layers))
        theirs = decode_step(model, token, memory, src_mask, chapter)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)
