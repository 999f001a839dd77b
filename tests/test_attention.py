"""transformer.attention: against PyTorch's own attention, queries that see no key, and dropout
on the weights (the attention chapter)."""

import pytest
import torch
import torch.nn.functional as F

from transformer.attention import scaled_dot_product_attention
from transformer.masking import causal_mask, padding_mask

PAD = 0
B, H, T, S, D_K, D_V = 2, 3, 5, 6, 8, 4


@pytest.fixture(autouse=True)
def seed():
    torch.manual_seed(0)


def inputs(*lead: int, t_q: int, t_k: int, requires_grad: bool = False):
    """Random query (*lead, t_q, D_K), key (*lead, t_k, D_K) and value (*lead, t_k, D_V)."""
    return (
        torch.randn(*lead, t_q, D_K, requires_grad=requires_grad),
        torch.randn(*lead, t_k, D_K, requires_grad=requires_grad),
        torch.randn(*lead, t_k, D_V, requires_grad=requires_grad),
    )


# Source ids of B sentences of S tokens; the first is padded after three tokens.
SRC = torch.tensor([[1, 5, 6, PAD, PAD, PAD], [1, 5, 6, 7, 8, 9]])
TGT = torch.tensor([[1, 5, 6, 7, PAD], [1, 5, 6, 7, 8]])


def masks_4d() -> dict:
    """Masks broadcastable to (B, H, T_q, T_k) with their (T_q, T_k), none fully masking a row."""
    target = padding_mask(TGT, PAD) & causal_mask(T)  # (B, 1, T, T)
    return {
        "none": (None, T, T),
        "padding (B, 1, 1, S), self-attention": (padding_mask(SRC, PAD), S, S),
        "padding (B, 1, 1, S), cross-attention": (padding_mask(SRC, PAD), T, S),
        "causal (1, 1, T, T)": (causal_mask(T), T, T),
        "padding & causal (B, 1, T, T)": (target, T, T),
    }


@pytest.mark.parametrize("name", list(masks_4d()))
def test_agrees_with_pytorch_on_4d_inputs(name: str):
    mask, t_q, t_k = masks_4d()[name]
    q, k, v = inputs(B, H, t_q=t_q, t_k=t_k)
    ours, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert ours.shape == (B, H, t_q, D_V) and weights.shape == (B, H, t_q, t_k)
    assert torch.allclose(ours, theirs, atol=1e-6)
    if mask is not None:
        assert (weights.masked_select(~mask.expand_as(weights)) == 0).all()


@pytest.mark.parametrize("name", list(masks_4d()))
def test_agrees_with_pytorch_on_3d_inputs(name: str):
    mask, t_q, t_k = masks_4d()[name]
    mask = None if mask is None else mask[:, 0]  # no heads: (B or 1, 1 or T_q, T_k)
    q, k, v = inputs(B, t_q=t_q, t_k=t_k)
    ours, weights = scaled_dot_product_attention(q, k, v, mask=mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert ours.shape == (B, t_q, D_V) and weights.shape == (B, t_q, t_k)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_a_blind_query_agrees_with_pytorch():
    # PyTorch's function (2.5 or later, the versions the package accepts) also returns zeros.
    q, k, v = inputs(B, H, t_q=T, t_k=S)
    mask = padding_mask(SRC, PAD).expand(B, 1, T, S).clone()
    mask[0, 0, 1] = False  # query 1 of sentence 0 sees no key, in every head
    ours, _ = scaled_dot_product_attention(q, k, v, mask=mask)
    theirs = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert torch.allclose(ours, theirs, atol=1e-6)


def test_a_query_with_no_visible_key_attends_to_nothing():
    q, k, v = inputs(B, H, t_q=T, t_k=S, requires_grad=True)
    mask = torch.rand(B, 1, T, S) > 0.3
    mask[..., 0] = True  # every other query sees at least one key
    mask[1, 0, 3] = False  # query 3 of sentence 1 sees none
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask)

    assert torch.equal(weights[1, :, 3], torch.zeros(H, S))
    assert torch.equal(out[1, :, 3], torch.zeros(H, D_V))
    others = torch.ones(B, H, T, dtype=torch.bool)
    others[1, :, 3] = False
    assert torch.allclose(weights.sum(-1)[others], torch.ones(int(others.sum())))

    # The blind row passes no gradient back; the other rows' gradients stay finite.
    out[1, :, 3].sum().backward(retain_graph=True)
    for tensor in (q, k, v):
        assert torch.equal(tensor.grad, torch.zeros_like(tensor))
    out.sum().backward()
    for tensor in (q, k, v):
        assert tensor.grad.isfinite().all() and tensor.grad.abs().sum() > 0
    assert torch.equal(q.grad[1, :, 3], torch.zeros(H, D_K))


def test_dropout_is_applied_to_the_weights_after_the_blind_rows_are_zeroed():
    q, k, v = inputs(B, H, t_q=T, t_k=S)
    mask = padding_mask(SRC, PAD).expand(B, 1, T, S).clone()
    mask[0, 0, 2] = False  # a blind query
    _, plain = scaled_dot_product_attention(q, k, v, mask=mask)

    seen = []
    keep = torch.rand(B, H, T, S) > 0.5

    def dropout(weights: torch.Tensor) -> torch.Tensor:
        seen.append(weights)
        return weights * keep * 2.0  # a fixed dropout pattern with p = 0.5

    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout=dropout)
    assert len(seen) == 1
    # It received the finished weights: zero at masked keys and on the blind row, not NaN.
    assert torch.equal(seen[0], plain)
    assert not seen[0].isnan().any()
    # What it returns is both the weights returned and the weights that average the values.
    assert torch.equal(weights, plain * keep * 2.0)
    assert torch.allclose(out, weights @ v)


def test_an_nn_dropout_module_in_training_mode():
    q, k, v = inputs(B, H, t_q=T, t_k=S)
    mask = padding_mask(SRC, PAD)
    _, plain = scaled_dot_product_attention(q, k, v, mask=mask)
    drop = torch.nn.Dropout(p=0.5).train()
    out, weights = scaled_dot_product_attention(q, k, v, mask=mask, dropout=drop)
    kept = weights != 0
    assert 0 < kept.sum() < (plain != 0).sum()  # some weights dropped, some kept
    # The survivors are scaled by 1/(1 - p).
    assert torch.allclose(weights[kept], 2.0 * plain[kept])
    assert torch.allclose(out, weights @ v)
    drop.eval()
    assert torch.equal(scaled_dot_product_attention(q, k, v, mask, drop)[1], plain)
