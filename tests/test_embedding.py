"""Token embeddings and positional encodings (the embeddings chapter): the table is the paper's
formula, offsets act as fixed linear maps, and the layers add the right rows or fail clearly."""

from __future__ import annotations

import math

import pytest
import torch

from transformer.embedding import (
    LearnedPositionalEncoding,
    PositionalEncoding,
    TokenEmbedding,
    sinusoidal_encoding,
)


def formula_table(max_len: int, d_model: int) -> torch.Tensor:
    """Section 3.5 evaluated entry by entry in float64 with the math module."""
    rows = []
    for pos in range(max_len):
        row = []
        for j in range(d_model):
            i = j // 2
            angle = pos / 10000 ** (2 * i / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64)


def offset_map(k: int, d_model: int) -> torch.Tensor:
    """M_k built from the frequencies: 2x2 rotations by k·ω_i on the (sin, cos) pairs."""
    m = torch.zeros(d_model, d_model, dtype=torch.float64)
    for i in range(d_model // 2):
        angle = k / 10000 ** (2 * i / d_model)
        c, s = math.cos(angle), math.sin(angle)
        m[2 * i, 2 * i], m[2 * i, 2 * i + 1] = c, s
        m[2 * i + 1, 2 * i], m[2 * i + 1, 2 * i + 1] = -s, c
    return m


@pytest.mark.parametrize("max_len,d_model", [(40, 8), (100, 32), (17, 6)])
def test_table_matches_the_formula(max_len: int, d_model: int):
    table = sinusoidal_encoding(max_len, d_model)
    assert table.shape == (max_len, d_model) and table.dtype == torch.float32
    expected = formula_table(max_len, d_model)
    # float32 storage: half an ulp of values in [-1, 1] is below 6e-8.
    assert (table.double() - expected).abs().max() < 1e-7
    exact = sinusoidal_encoding(max_len, d_model, dtype=torch.float64)
    assert (exact - expected).abs().max() < 1e-12


def test_table_first_rows_and_columns():
    table = sinusoidal_encoding(10, 16, dtype=torch.float64)
    # Position 0: sin 0 = 0 in even dimensions, cos 0 = 1 in odd ones.
    assert torch.equal(table[0, 0::2], torch.zeros(8, dtype=torch.float64))
    assert torch.equal(table[0, 1::2], torch.ones(8, dtype=torch.float64))
    # Pair 0 has frequency 1: PE(pos, 0) = sin(pos).
    assert torch.allclose(table[:, 0], torch.sin(torch.arange(10, dtype=torch.float64)))


def test_odd_d_model_is_rejected():
    with pytest.raises(ValueError, match="d_model"):
        sinusoidal_encoding(10, 7)


@pytest.mark.parametrize("k", [1, 3, 17, 100])
def test_offset_is_a_fixed_linear_map(k: int):
    d_model = 64
    table = sinusoidal_encoding(300, d_model, dtype=torch.float64)
    m_k = offset_map(k, d_model)
    # PE(pos + k) = M_k PE(pos) for every pos; rows as vectors: table[k:] = table[:-k] M_kᵀ.
    assert (table[:-k] @ m_k.T - table[k:]).abs().max() < 1e-5
    # Also from a float32 table, as the model stores it.
    table32 = sinusoidal_encoding(300, d_model).double()
    assert (table32[:-k] @ m_k.T - table32[k:]).abs().max() < 1e-5
    # The map does not depend on the table it is applied to: it also holds past its end.
    longer = sinusoidal_encoding(1000, d_model, dtype=torch.float64)
    assert (longer[:-k] @ m_k.T - longer[k:]).abs().max() < 1e-5


def test_offset_maps_compose_on_the_encoding():
    # Shifting the real encoding by 3 and then by 4 is shifting it by 7:
    # M_4 M_3 PE(pos) = PE(pos + 7) for every pos; rows as vectors, table[:-7] (M_4 M_3)ᵀ.
    table = sinusoidal_encoding(200, 32, dtype=torch.float64)
    m_3, m_4 = offset_map(3, 32), offset_map(4, 32)
    assert (table[:-3] @ m_3.T - table[3:]).abs().max() < 1e-12
    assert (table[:-7] @ (m_4 @ m_3).T - table[7:]).abs().max() < 1e-12


def test_dot_product_depends_on_distance_only():
    table = sinusoidal_encoding(200, 64, dtype=torch.float64)
    for k in (0, 1, 5, 30):
        dots = (table[: 200 - k] * table[k:]).sum(
            -1
        )  # PE(pos)·PE(pos + k) for every pos
        assert torch.allclose(dots, dots[0].expand_as(dots), atol=1e-9)


def test_the_first_column_changes_sign_every_three_or_four_positions():
    table = sinusoidal_encoding(64, 64)
    signs = table[1:, 0].sign()  # sin(pos), from pos = 1: no zero
    changes = (signs[1:] != signs[:-1]).nonzero().flatten()
    assert set(changes.diff().tolist()) == {3, 4}  # half a period: π ≈ 3.14
    assert torch.pdist(table).min() > 0.1  # no two rows are the same


def test_offset_maps_are_rotations():
    for k in (1, 5, 50, 200):
        m_k = offset_map(k, 64)
        assert torch.allclose(m_k @ m_k.T, torch.eye(64, dtype=torch.float64))


def test_dot_product_is_the_sum_of_cosines_of_the_distance():
    """PE(pos)·PE(pos+k) = Σ_i cos(k ω_i): symmetric in k, largest (d_model/2) at k = 0."""
    d_model, distances = 512, range(-64, 65)
    table = sinusoidal_encoding(512, d_model, dtype=torch.float64)
    omega = 10000 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    formula = torch.stack([torch.cos(k * omega).sum() for k in distances])
    for pos in (64, 128, 256):
        measured = torch.stack([table[pos] @ table[pos + k] for k in distances])
        assert torch.allclose(measured, formula, atol=1e-9)
    assert torch.allclose(formula, formula.flip(0))
    assert formula.argmax() == 64 and math.isclose(formula.max().item(), d_model / 2)
    assert formula.min() > 0  # the slow pairs keep it above zero


def test_token_embedding_has_unit_variance_at_initialisation():
    torch.manual_seed(0)
    embed = TokenEmbedding(vocab_size=4000, d_model=64)
    assert abs(embed.embedding.weight.std().item() - 64**-0.5) < 0.005
    with torch.no_grad():
        out = embed(torch.arange(4000).unsqueeze(0))
    assert abs(out.std().item() - 1.0) < 0.02


def test_positional_encoding_adds_the_table():
    layer = PositionalEncoding(d_model=16, max_len=30, dropout=0.1).eval()
    x = torch.randn(3, 12, 16)
    assert torch.equal(layer(x), x + sinusoidal_encoding(30, 16)[:12])
    assert layer.pe.shape == (30, 16)
    assert "pe" not in layer.state_dict()


@pytest.mark.parametrize("start", [0, 1, 9, 25])
def test_start_offset_equals_slicing_the_table(start: int):
    layer = PositionalEncoding(d_model=16, max_len=30, dropout=0.1).eval()
    x = torch.randn(2, 5, 16)
    assert torch.equal(layer(x, start=start), x + layer.pe[start : start + 5])


def test_incremental_positions_match_the_whole_sequence():
    for layer in (
        PositionalEncoding(d_model=8, max_len=20, dropout=0.1).eval(),
        LearnedPositionalEncoding(d_model=8, max_len=20, dropout=0.1).eval(),
    ):
        x = torch.randn(2, 9, 8)
        steps = torch.cat([layer(x[:, t : t + 1], start=t) for t in range(9)], dim=1)
        assert torch.equal(steps, layer(x))


@pytest.mark.parametrize("cls", [PositionalEncoding, LearnedPositionalEncoding])
def test_exceeding_max_len_raises_a_clear_error(cls):
    layer = cls(d_model=8, max_len=10, dropout=0.1)
    layer(torch.zeros(1, 10, 8))  # exactly max_len positions are fine
    with pytest.raises(ValueError, match="max_len=10"):
        layer(torch.zeros(1, 11, 8))
    with pytest.raises(ValueError, match="max_len=10"):
        layer(torch.zeros(1, 3, 8), start=8)
    with pytest.raises(ValueError, match="start"):
        layer(torch.zeros(1, 3, 8), start=-1)


def test_dropout_is_applied_to_the_sum_in_training_only():
    torch.manual_seed(0)
    layer = PositionalEncoding(d_model=64, max_len=100, dropout=0.1)
    x = torch.randn(4, 100, 64)
    total = x + layer.pe
    layer.train()
    out = layer(x)
    kept = out != 0
    assert abs((~kept).float().mean().item() - 0.1) < 0.02
    assert torch.allclose(out[kept], (total / 0.9)[kept])
    layer.eval()
    assert torch.equal(layer(x), total)


def test_learned_positional_encoding_is_a_parameter():
    layer = LearnedPositionalEncoding(d_model=8, max_len=12, dropout=0.1).eval()
    assert isinstance(layer.embedding, torch.nn.Embedding)
    assert layer.embedding.weight.shape == (12, 8)
    assert "embedding.weight" in layer.state_dict()
    x = torch.randn(2, 4, 8)
    assert torch.equal(layer(x, start=3), x + layer.embedding.weight[3:7])
    layer(x).sum().backward()
    grad = layer.embedding.weight.grad
    assert grad[:4].abs().sum() > 0 and torch.equal(grad[4:], torch.zeros(8, 8))
