"""transformer.multihead: against torch.nn.MultiheadAttention, fast path against explicit path,
fully masked queries, bad construction, and one projection per input, whatever the inputs."""

from unittest import mock

import pytest
import torch
from torch import nn

import transformer.multihead as multihead
from transformer.attention import scaled_dot_product_attention as explicit_attention
from transformer.attention_config import PAPER_D_MODEL, PAPER_N_HEADS, AttentionConfig
from transformer.masking import causal_mask, padding_mask, target_mask
from transformer.multihead import MultiHeadAttention

PAD = 0
B, T, S, D_MODEL, H = 3, 5, 6, 16, 4
CONFIG = AttentionConfig(d_model=D_MODEL, n_heads=H)


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def batch() -> dict:
    """A target batch (B, T) and a source batch (B, S) with padding, and their vectors."""
    tgt = torch.tensor([[1, 5, 6, PAD, PAD], [1, 5, 6, 7, 8], [1, 9, PAD, PAD, PAD]])
    src = torch.tensor(
        [[2, 3, 4, 5, PAD, PAD], [2, 3, 4, 5, 6, 7], [2, 3, PAD, PAD, PAD, PAD]]
    )
    return {
        "tgt": tgt,
        "src": src,
        "x": torch.randn(B, T, D_MODEL),
        "memory": torch.randn(B, S, D_MODEL),
    }


def torch_twin(ours: MultiHeadAttention) -> nn.MultiheadAttention:
    """torch.nn.MultiheadAttention holding the same weights as ours."""
    theirs = nn.MultiheadAttention(D_MODEL, ours.n_heads, batch_first=True)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(
            torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight])
        )
        theirs.in_proj_bias.copy_(
            torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias])
        )
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        theirs.out_proj.bias.copy_(ours.w_o.bias)
    return theirs.eval()


def test_matches_torch_with_a_padding_mask():
    data = batch()
    ours = MultiHeadAttention(CONFIG).eval()
    theirs = torch_twin(ours)
    mask = padding_mask(data["src"], PAD)  # (B, 1, 1, S)
    x, memory = data["x"], data["memory"]
    with torch.no_grad():
        out, weights = ours(x, memory, memory, mask=mask, need_weights=True)
        fast, _ = ours(x, memory, memory, mask=mask)
        # torch's convention is the opposite one: True means "may NOT attend".
        kwargs = {"key_padding_mask": ~mask[:, 0, 0]}
        ref, ref_avg = theirs(x, memory, memory, **kwargs)
        _, ref_heads = theirs(x, memory, memory, average_attn_weights=False, **kwargs)
    assert (out - ref).abs().max() < 1e-5
    assert (fast - ref).abs().max() < 1e-5
    assert weights.shape == ref_heads.shape == (B, H, T, S)
    assert (weights - ref_heads).abs().max() < 1e-5
    assert (weights.mean(dim=1) - ref_avg).abs().max() < 1e-5


def test_matches_torch_with_a_causal_mask():
    data = batch()
    ours = MultiHeadAttention(CONFIG).eval()
    theirs = torch_twin(ours)
    x = data["x"]
    with torch.no_grad():
        out, weights = ours(x, x, x, mask=causal_mask(T), need_weights=True)
        fast, _ = ours(x, x, x, mask=causal_mask(T))
        ref, _ = theirs(x, x, x, attn_mask=~causal_mask(T)[0, 0])
        _, ref_heads = theirs(
            x, x, x, attn_mask=~causal_mask(T)[0, 0], average_attn_weights=False
        )
    assert (out - ref).abs().max() < 1e-5
    assert (fast - ref).abs().max() < 1e-5
    assert (weights - ref_heads).abs().max() < 1e-5
    assert (weights.triu(diagonal=1) == 0).all()


def test_matches_torch_with_a_target_mask():
    data = batch()
    ours = MultiHeadAttention(CONFIG).eval()
    theirs = torch_twin(ours)
    x = data["x"]
    with torch.no_grad():
        out, _ = ours(x, x, x, mask=target_mask(data["tgt"], PAD))
        ref, _ = theirs(
            x,
            x,
            x,
            attn_mask=~causal_mask(T)[0, 0],
            key_padding_mask=~padding_mask(data["tgt"], PAD)[:, 0, 0],
        )
    assert (out - ref).abs().max() < 1e-5


@pytest.mark.parametrize("which", ["none", "padding", "causal", "target", "cross"])
def test_fast_and_explicit_paths_agree(which):
    data = batch()
    mha = MultiHeadAttention(CONFIG).eval()
    x, memory = data["x"], data["memory"]
    key = memory if which in ("cross", "padding") else x
    mask = {
        "none": None,
        "padding": padding_mask(data["src"], PAD),
        "causal": causal_mask(T),
        "target": target_mask(data["tgt"], PAD),
        "cross": padding_mask(data["src"], PAD),
    }[which]
    with torch.no_grad():
        fast, no_weights = mha(x, key, key, mask=mask)
        explicit, weights = mha(x, key, key, mask=mask, need_weights=True)
    assert no_weights is None
    assert weights.shape == (B, H, T, key.size(1))
    assert fast.shape == explicit.shape == (B, T, D_MODEL)
    assert (fast - explicit).abs().max() < 1e-6


def test_the_fast_path_is_taken_unless_weights_are_requested():
    data = batch()
    mha = MultiHeadAttention(CONFIG).eval()
    x, mask = data["x"], target_mask(data["tgt"], PAD)
    fused = multihead.F.scaled_dot_product_attention
    with (
        mock.patch.object(
            multihead.F, "scaled_dot_product_attention", wraps=fused
        ) as fast,
        mock.patch.object(
            multihead, "scaled_dot_product_attention", wraps=explicit_attention
        ) as explicit,
    ):
        mha(x, x, x, mask=mask)
        assert fast.call_count == 1 and explicit.call_count == 0
        mha(x, x, x, mask=mask, need_weights=True)
        assert fast.call_count == 1 and explicit.call_count == 1


def test_attention_dropout_reaches_both_paths_in_training_only():
    data = batch()
    mha = MultiHeadAttention(
        AttentionConfig(d_model=D_MODEL, n_heads=H, attention_dropout=0.5)
    )
    x = data["x"]
    fused = multihead.F.scaled_dot_product_attention
    with mock.patch.object(
        multihead.F, "scaled_dot_product_attention", wraps=fused
    ) as fast:
        mha.train()
        mha(x, x, x)
        assert fast.call_args.kwargs["dropout_p"] == 0.5
        mha.eval()
        mha(x, x, x)
        assert fast.call_args.kwargs["dropout_p"] == 0.0
    mha.train()
    _, weights = mha(x, x, x, need_weights=True)
    assert (weights == 0).any()  # some weights dropped
    mha.eval()
    _, weights = mha(x, x, x, need_weights=True)
    assert torch.allclose(weights.sum(-1), torch.ones(B, H, T))


def blind_masks() -> dict:
    """A whole sentence that sees no key, and one query of one sentence that sees none."""
    src = torch.tensor([[2, 3, 4, PAD, PAD, PAD], [PAD] * S, [2, 3, 4, 5, 6, 7]])
    per_query = torch.ones(B, 1, T, S, dtype=torch.bool)
    per_query[2, 0, 3] = False
    return {
        "sentence": (padding_mask(src, PAD), (1, slice(None))),
        "query": (per_query, (2, 3)),
    }


@pytest.mark.parametrize("case", ["sentence", "query"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_queries_give_zeros_and_finite_gradients(case, need_weights):
    data = batch()
    mask, blind = blind_masks()[case]
    mha = MultiHeadAttention(CONFIG, bias=False)
    x, memory = data["x"], data["memory"].requires_grad_()
    out, weights = mha(x, memory, memory, mask=mask, need_weights=need_weights)
    assert not out.isnan().any()
    assert (out[blind] == 0).all()
    assert out.abs().sum() > 0  # the other queries are not zeroed
    if need_weights:
        assert (weights[blind[0], :, blind[1]] == 0).all()
    out.sum().backward()
    assert memory.grad.isfinite().all()
    assert all(p.grad.isfinite().all() for p in mha.parameters())


def test_a_blind_query_gets_the_output_bias():
    data = batch()
    mask, blind = blind_masks()["sentence"]
    mha = MultiHeadAttention(CONFIG).eval()
    x, memory = data["x"], data["memory"]
    with torch.no_grad():
        out, _ = mha(x, memory, memory, mask=mask)
    assert torch.allclose(out[blind], mha.w_o.bias.expand(T, D_MODEL))


def naive_kernel(query, key, value, attn_mask=None, dropout_p=0.0, **_):
    """A kernel that, like some, turns a row of -inf scores into NaN."""
    scores = query @ key.transpose(-2, -1) / query.size(-1) ** 0.5
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    return scores.softmax(dim=-1) @ value


def test_the_fast_path_does_not_rely_on_the_kernel_for_blind_queries():
    data = batch()
    mask, blind = blind_masks()["sentence"]
    # The premise: this kernel really does give NaN for a blind query.
    q = torch.randn(1, 1, 2, 4)
    assert (
        naive_kernel(q, q, q, torch.tensor([[True, True], [False, False]]))
        .isnan()
        .any()
    )
    mha = MultiHeadAttention(CONFIG, bias=False).eval()
    with mock.patch.object(multihead.F, "scaled_dot_product_attention", naive_kernel):
        out, _ = mha(data["x"], data["memory"], data["memory"], mask=mask)
    assert not out.isnan().any()
    assert (out[blind] == 0).all()


def test_shapes_and_parameters():
    mha = MultiHeadAttention(CONFIG, bias=False)
    assert (mha.n_heads, mha.d_k) == (H, D_MODEL // H)
    for linear in (mha.w_q, mha.w_k, mha.w_v, mha.w_o):
        assert linear.weight.shape == (D_MODEL, D_MODEL) and linear.bias is None
    assert sum(p.numel() for p in mha.parameters()) == 4 * D_MODEL * D_MODEL
    out, weights = mha(
        torch.randn(2, 3, D_MODEL),
        torch.randn(2, 7, D_MODEL),
        torch.randn(2, 7, D_MODEL),
    )
    assert out.shape == (2, 3, D_MODEL) and weights is None


@pytest.mark.parametrize("d_model, n_heads", [(10, 3), (512, 6)])
def test_heads_that_do_not_split_the_width_are_refused_naming_both_numbers(
    d_model, n_heads
):
    with pytest.raises(
        ValueError, match=rf"d_model \({d_model}\).*n_heads \({n_heads}\)"
    ):
        AttentionConfig(d_model=d_model, n_heads=n_heads)


@pytest.mark.parametrize(
    ("field", "value"),
    [("n_heads", 0), ("d_model", -8), ("n_heads", True), ("d_model", 8.0)],
)
def test_a_size_that_is_no_positive_integer_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be a positive integer"):
        AttentionConfig(**{field: value})


def test_the_layer_takes_its_sizes_from_the_config():
    config = AttentionConfig(d_model=24, n_heads=3, attention_dropout=0.25)
    mha = MultiHeadAttention(config)
    assert (mha.d_model, mha.n_heads, mha.d_k) == (24, 3, 8) == (24, 3, config.d_k)
    assert mha.w_q.weight.shape == (24, 24) and mha.attn_dropout.p == 0.25
    default = AttentionConfig()
    assert (
        (default.d_model, default.n_heads) == (PAPER_D_MODEL, PAPER_N_HEADS) == (512, 8)
    )


def test_a_float_mask_is_refused():
    data = batch()
    mha = MultiHeadAttention(CONFIG)
    x = data["x"]
    with pytest.raises(TypeError, match="boolean"):
        mha(x, x, x, mask=causal_mask(T).float())


@pytest.mark.parametrize("which", ["self", "cross"])
def test_the_result_does_not_depend_on_whether_the_inputs_are_one_tensor(which):
    """Self-attention passes one tensor three times, cross-attention the memory twice: the
    layer gives what it gives three equal copies, bit for bit, and projects each input
    through its own matrix, with the output's four products in all."""
    data = batch()
    mha = MultiHeadAttention(CONFIG).eval()
    x, memory = data["x"], data["memory"]
    args = (x, x, x) if which == "self" else (x, memory, memory)
    copies = tuple(a.clone() for a in args)
    linear = nn.functional.linear
    with (
        torch.no_grad(),
        mock.patch.object(nn.functional, "linear", wraps=linear) as calls,
    ):
        shared, _ = mha(*args)
        assert calls.call_count == 4
        used = [c.args[1] for c in calls.call_args_list]
        expected = [mha.w_q.weight, mha.w_k.weight, mha.w_v.weight, mha.w_o.weight]
        assert all(a is b for a, b in zip(used, expected, strict=True))
        separate, _ = mha(*copies)
    assert torch.equal(shared, separate)


def test_project_gives_each_layers_heads():
    data = batch()
    mha = MultiHeadAttention(CONFIG).eval()
    x = data["x"]
    q, k, v = multihead.project(x, H, mha.w_q, mha.w_k, mha.w_v)
    for heads, layer in ((q, mha.w_q), (k, mha.w_k), (v, mha.w_v)):
        assert torch.equal(heads, multihead.split_heads(layer(x), H))


def test_split_heads_takes_each_heads_columns_and_merge_heads_undoes_it():
    x = torch.randn(B, T, D_MODEL)
    heads = multihead.split_heads(x, H)
    d_k = D_MODEL // H
    assert heads.shape == (B, H, T, d_k)
    for i in range(H):
        assert torch.equal(heads[:, i], x[..., i * d_k : (i + 1) * d_k])
    assert torch.equal(multihead.merge_heads(heads), x)
