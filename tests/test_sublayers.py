"""The feed-forward network and the sublayer connection: the formulas, the two
normalisation orders, and position-wise independence."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from transformer.layer_config import TENSOR2TENSOR_LAYER_NORM_EPS, LayerConfig
from transformer.sublayers import PositionwiseFeedForward, SublayerConnection

EPS = LayerConfig().layer_norm_eps


def layer(d_model: int, **fields) -> LayerConfig:
    """A LayerConfig of width d_model, in one head so that any width splits."""
    return LayerConfig(d_model=d_model, n_heads=1, **fields)


def layer_norm(v: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    mean = v.mean(-1, keepdim=True)
    var = v.var(-1, keepdim=True, unbiased=False)
    return (v - mean) / torch.sqrt(var + eps)


def known_sublayer(v: torch.Tensor) -> torch.Tensor:
    """A fixed, non-linear, position-wise function whose output is easy to compute by hand."""
    return torch.tanh(2 * v) + 0.5


@pytest.fixture
def stream() -> torch.Tensor:
    torch.manual_seed(0)
    return 3.0 + 2.0 * torch.randn(2, 7, 16)  # (B, L, d_model), far from mean 0 / std 1


def test_ffn_shapes_and_attributes():
    ffn = PositionwiseFeedForward(layer(16, d_ff=64))
    assert ffn.w_1.weight.shape == (64, 16) and ffn.w_2.weight.shape == (16, 64)
    assert ffn(torch.randn(3, 5, 16)).shape == (3, 5, 16)
    assert ffn(torch.randn(16)).shape == (16,)


def test_ffn_matches_equation_2():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(layer(8, d_ff=32)).eval()
    x = torch.randn(2, 4, 8)
    w1, b1 = ffn.w_1.weight.T, ffn.w_1.bias
    w2, b2 = ffn.w_2.weight.T, ffn.w_2.bias
    expected = torch.clamp(x @ w1 + b1, min=0) @ w2 + b2
    assert torch.allclose(ffn(x), expected, atol=1e-6)


def test_ffn_is_position_wise():
    torch.manual_seed(0)
    ffn = PositionwiseFeedForward(layer(16, d_ff=48)).eval()
    x = torch.randn(3, 9, 16)
    whole = ffn(x)
    for t in range(9):
        assert torch.allclose(whole[:, t], ffn(x[:, t]), atol=1e-6)
    # Permuting the positions permutes the outputs the same way.
    perm = torch.randperm(9)
    assert torch.allclose(ffn(x[:, perm]), whole[:, perm], atol=1e-6)


def test_ffn_relu_zeroes_negative_pre_activations():
    ffn = PositionwiseFeedForward(layer(2, d_ff=2))
    with torch.no_grad():
        ffn.w_1.weight.copy_(torch.eye(2))
        ffn.w_1.bias.zero_()
        ffn.w_2.weight.copy_(torch.eye(2))
        ffn.w_2.bias.zero_()
    x = torch.tensor([[-3.0, 2.0], [1.5, -0.5], [-1.0, -1.0]])
    expected = torch.tensor([[0.0, 2.0], [1.5, 0.0], [0.0, 0.0]])
    assert torch.equal(ffn(x), expected)
    # With a negative bias on the hidden layer, everything below it is cut as well.
    with torch.no_grad():
        ffn.w_1.bias.fill_(-2.0)
    assert torch.equal(ffn(x), torch.tensor([[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]]))


def test_ffn_dropout_is_off_by_default_and_optional():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16)
    plain = PositionwiseFeedForward(layer(16, d_ff=64)).train()
    assert torch.equal(plain(x), plain.eval()(x))
    dropping = PositionwiseFeedForward(layer(16, d_ff=64, ffn_dropout=0.5)).train()
    assert not torch.allclose(dropping(x), dropping.eval()(x))


def test_post_norm_is_the_default_and_matches_its_formula(stream):
    connection = SublayerConnection(layer(16, dropout=0.0))
    assert connection.norm_first is False
    assert isinstance(connection.norm, nn.LayerNorm)
    out = connection(stream, known_sublayer)
    assert torch.allclose(out, layer_norm(stream + known_sublayer(stream)), atol=1e-5)
    assert not torch.allclose(
        out, stream + known_sublayer(layer_norm(stream)), atol=1e-2
    )


def test_pre_norm_matches_its_formula(stream):
    connection = SublayerConnection(layer(16, dropout=0.0, norm_first=True))
    out = connection(stream, known_sublayer)
    assert torch.allclose(out, stream + known_sublayer(layer_norm(stream)), atol=1e-5)
    assert not torch.allclose(
        out, layer_norm(stream + known_sublayer(stream)), atol=1e-2
    )


def test_post_norm_output_is_normalised_and_pre_norm_output_is_not(stream):
    post = SublayerConnection(layer(16, dropout=0.0))(stream, known_sublayer)
    assert post.mean(-1).abs().max() < 1e-5
    assert (post.std(-1, unbiased=False) - 1).abs().max() < 1e-4
    pre = SublayerConnection(layer(16, dropout=0.0, norm_first=True))(
        stream, known_sublayer
    )
    assert pre.mean(-1).abs().min() > 1.0  # keeps the stream's offset of about 3
    assert (pre.std(-1, unbiased=False) - 1).abs().max() > 0.1


def test_dropout_acts_on_the_sublayer_output_only(stream):
    torch.manual_seed(0)
    for norm_first in (False, True):
        connection = SublayerConnection(
            layer(16, dropout=0.5, norm_first=norm_first)
        ).train()
        # A zero sublayer output leaves nothing to drop: the residual path is untouched.
        out = connection(stream, torch.zeros_like)
        expected = stream if norm_first else layer_norm(stream)
        assert torch.allclose(out, expected, atol=1e-5)
    pre = SublayerConnection(layer(16, dropout=0.5, norm_first=True)).train()
    delta = pre(stream, known_sublayer) - stream  # = dropout(sublayer(norm(x)))
    update = known_sublayer(layer_norm(stream))
    dropped = delta == 0
    assert dropped.any() and not dropped.all()
    assert torch.allclose(delta[~dropped], (update / 0.5)[~dropped], atol=1e-5)


def test_layer_norm_takes_its_epsilon_from_the_config(stream):
    """ε is the config's, by default tensor2tensor's, and any other reaches the LayerNorm."""
    assert EPS == TENSOR2TENSOR_LAYER_NORM_EPS == 1e-6
    small = stream[..., :4] * 1e-3  # a variance near ε, where ε shows
    for eps in (EPS, 1e-5, 0.5):
        connection = SublayerConnection(layer(4, dropout=0.0, layer_norm_eps=eps))
        assert connection.norm.eps == eps
        out = connection(small, torch.zeros_like)
        assert torch.allclose(out, layer_norm(small, eps), atol=1e-6, rtol=0), eps


def test_sublayer_connection_in_eval_mode_is_deterministic(stream):
    connection = SublayerConnection(layer(16, dropout=0.3)).eval()
    assert torch.equal(
        connection(stream, known_sublayer), connection(stream, known_sublayer)
    )


def test_gradients_reach_the_input_through_both_paths(stream):
    # A weighted sum: the plain sum of a layer-normalised vector does not depend on x.
    weight = torch.linspace(-1, 1, 16)
    for norm_first in (False, True):
        x = stream.clone().requires_grad_(True)
        ffn = PositionwiseFeedForward(layer(16, d_ff=32))
        out = SublayerConnection(layer(16, dropout=0.0, norm_first=norm_first))(x, ffn)
        (out * weight).sum().backward()
        assert x.grad is not None and x.grad.abs().max() > 1e-3
        assert ffn.w_1.weight.grad.abs().max() > 1e-3
        # The gradient of the formula, residual path included (LayerNorm's γ = 1, β = 0).
        y = stream.clone().requires_grad_(True)
        formula = y + ffn(layer_norm(y)) if norm_first else layer_norm(y + ffn(y))
        (expected,) = torch.autograd.grad((formula * weight).sum(), y)
        assert torch.allclose(x.grad, expected, atol=1e-5), norm_first


def test_deep_stacks_post_norm_keeps_the_scale_and_pre_norm_the_gradients():
    """The chapter's 24-sublayer experiment: post-norm holds the stream's RMS at 1 while its
    gradients grow towards the output; pre-norm's RMS² grows linearly with depth while its
    gradients stay within 25% of the first sublayer's."""
    torch.manual_seed(0)
    d_model, d_ff = 512, 2048
    networks = [PositionwiseFeedForward(layer(d_model, d_ff=d_ff)) for _ in range(24)]
    for network in networks:
        for linear in (network.w_1, network.w_2):
            nn.init.xavier_uniform_(linear.weight)
            nn.init.zeros_(linear.bias)
    x0 = torch.randn(4, 32, d_model)
    readout = torch.randn(d_model)
    results = {}
    for norm_first in (False, True):
        x, rms = x0, []
        for network in networks:
            network.zero_grad()
            x = SublayerConnection(
                layer(d_model, dropout=0.1, norm_first=norm_first)
            ).eval()(x, network)
            rms.append(x.pow(2).mean().sqrt().item())
        if norm_first:
            x = nn.LayerNorm(d_model, eps=EPS)(x)
        (x @ readout).mean().backward()
        grads = torch.tensor(
            [
                torch.stack([p.grad.norm() for p in n.parameters()]).norm()
                for n in networks
            ]
        )
        results[norm_first] = torch.tensor(rms), grads / grads[0]
    post_rms, post_grad = results[False]
    pre_rms, pre_grad = results[True]
    assert (post_rms - 1).abs().max() < 1e-3
    assert 3.5 < post_grad[-1] < 6 and (post_grad[1:] >= post_grad[:-1] - 0.05).all()
    assert ((pre_grad > 0.75) & (pre_grad < 1.25)).all()
    depth = torch.arange(1, 25, dtype=torch.float64)
    square = pre_rms.double() ** 2
    slope, intercept = torch.linalg.lstsq(
        torch.stack([depth, torch.ones_like(depth)], 1), square[:, None]
    ).solution.squeeze(1)
    residual = square - (slope * depth + intercept)
    r_squared = 1 - residual.pow(2).sum() / (square - square.mean()).pow(2).sum()
    assert r_squared > 0.99 and abs(intercept - 1) < 0.15
