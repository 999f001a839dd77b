"""TransformerConfig: the paper's values, its checks naming the field (the heads' split when
made, every field where a configuration enters), and JSON round trips."""

from __future__ import annotations

import copy
import dataclasses
import json
import typing
from pathlib import Path

import pytest

from transformer.config import TransformerConfig
from transformer.config_checks import ADDED_FIELDS, check_config, config_from_dict
from transformer.layer_config import TENSOR2TENSOR_LAYER_NORM_EPS


def test_defaults_are_the_papers_base_model():
    c = TransformerConfig(src_vocab_size=37_000)
    assert (c.n_layers, c.d_model, c.d_ff, c.n_heads, c.d_k) == (6, 512, 2048, 8, 64)
    assert c.dropout == 0.1 and c.attention_dropout == 0.0 and c.ffn_dropout == 0.0
    assert not c.norm_first and c.positional == "sinusoidal"
    assert c.share_embeddings and c.tie_output
    assert c == TransformerConfig.base(37_000)


def test_big_and_small_presets():
    big = TransformerConfig.big(37_000)
    assert (big.n_layers, big.d_model, big.d_ff, big.n_heads, big.d_k) == (
        6,
        1024,
        4096,
        16,
        64,
    )
    assert big.dropout == 0.3
    small = TransformerConfig.small(8_000)
    assert (small.n_layers, small.d_model, small.n_heads, small.d_ff) == (
        3,
        256,
        8,
        1024,
    )
    assert small.dropout == 0.1


def test_overrides_win_over_presets():
    c = TransformerConfig.big(37_000, dropout=0.1, norm_first=True)
    assert c.dropout == 0.1 and c.norm_first and c.d_model == 1024


def test_target_vocab_size():
    assert TransformerConfig.small(100).target_vocab_size == 100
    two = TransformerConfig.small(100, tgt_vocab_size=80, share_embeddings=False)
    assert two.target_vocab_size == 80 and two.src_vocab_size == 100


def test_frozen():
    c = TransformerConfig.small(100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.d_model = 128  # type: ignore[misc]
    # A variant is a new, validated config.
    with pytest.raises(ValueError, match=r"^d_model"):
        dataclasses.replace(c, d_model=100)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"d_model": 512, "n_heads": 7}, "d_model"),
        ({"d_model": 100, "n_heads": 8}, "d_model"),
        ({"src_vocab_size": 0}, "src_vocab_size"),
        ({"tgt_vocab_size": -5, "share_embeddings": False}, "tgt_vocab_size"),
        ({"d_model": 0}, "d_model"),
        ({"n_heads": -8}, "n_heads"),
        ({"n_layers": 0}, "n_layers"),
        ({"d_ff": 0}, "d_ff"),
        ({"max_len": 0}, "max_len"),
        ({"n_layers": 2.5}, "n_layers"),
        ({"n_heads": True}, "n_heads"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"dropout": "0.1"}, "dropout"),
        ({"attention_dropout": 1.5}, "attention_dropout"),
        ({"ffn_dropout": -0.01}, "ffn_dropout"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"norm_first": "yes"}, "norm_first"),
        ({"tie_output": 1}, "tie_output"),
        ({"positional": "rotary"}, "positional"),
        # The sinusoids pair a sine and a cosine: an odd width cannot hold them.
        ({"d_model": 513, "n_heads": 9}, "d_model"),
        ({"d_model": 9, "n_heads": 1}, "d_model"),
        ({"tgt_vocab_size": 9_000}, "share_embeddings"),
        ({"tgt_vocab_size": 8_000}, "share_embeddings"),
    ],
    ids=lambda v: "-".join(f"{k}={v[k]}" for k in v) if isinstance(v, dict) else v,
)
def test_bad_configs_name_the_field(overrides: dict, field: str):
    record = TransformerConfig(src_vocab_size=8_000).to_dict() | overrides
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        config_from_dict(record)


def test_valid_edge_values_are_accepted():
    c = TransformerConfig.base(
        8_000, dropout=0.0, attention_dropout=0.999, positional="learned"
    )
    check_config(c)
    check_config(
        TransformerConfig.base(8_000, tgt_vocab_size=8_000, share_embeddings=False)
    )
    # Learned positions have no sine/cosine pairs: an odd width is fine for them.
    odd = TransformerConfig.base(8_000, d_model=513, n_heads=9, positional="learned")
    check_config(odd)


def test_odd_width_error_names_the_positional_option():
    with pytest.raises(ValueError, match=r"^d_model \(513\).*positional='sinusoidal'"):
        check_config(TransformerConfig.base(8_000, d_model=513, n_heads=9))


def test_json_round_trip():
    c = TransformerConfig.small(
        8_000, tgt_vocab_size=6_000, share_embeddings=False, norm_first=True
    )
    text = json.dumps(c.to_dict())
    assert config_from_dict(json.loads(text)) == c


def test_from_dict_rejects_unknown_keys():
    d = TransformerConfig.small(8_000).to_dict() | {"n_head": 8, "vocab": 3}
    with pytest.raises(
        ValueError, match=r"unknown TransformerConfig field\(s\) n_head, vocab"
    ):
        config_from_dict(d)


@pytest.mark.parametrize(
    "removed",
    [("src_vocab_size",), ("n_layers", "norm_first"), ("tgt_vocab_size",)],
    ids=lambda names: "-".join(names),
)
def test_from_dict_rejects_missing_keys_even_with_a_default(removed: tuple[str, ...]):
    # to_dict writes every field; a record without norm_first and n_layers must not come
    # back as a post-norm, six-layer model.
    d = TransformerConfig.small(8_000, norm_first=True).to_dict()
    for name in removed:
        del d[name]
    with pytest.raises(
        ValueError, match=rf"missing TransformerConfig field\(s\) {', '.join(removed)}"
    ):
        config_from_dict(d)


SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints"


def test_every_shipped_model_config_has_every_field_and_loads():
    # The shipped models' config.json files are read by from_dict (train.load_model); a
    # stricter from_dict must still rebuild exactly the configs they record, and the
    # fields added since, at the values those models were built with.
    records = [
        json.loads(path.read_text()) for path in sorted(SHIPPED.rglob("config.json"))
    ]
    models = [r["model"] for r in records if isinstance(r.get("model"), dict)]
    assert len(models) >= 4  # de-en and fr-en, each with its last/ checkpoint
    for model in models:
        assert config_from_dict(model).to_dict() == ADDED_FIELDS | model


def test_a_record_without_epsilon_reads_as_the_epsilon_of_the_models_saved_before_it():
    """The shipped models were trained with tensor2tensor's ε before the config recorded
    it: a record without ε reads as that fact, not as the field's default, and a record
    that holds an ε keeps it."""
    assert ADDED_FIELDS == {"layer_norm_eps": TENSOR2TENSOR_LAYER_NORM_EPS}
    assert TENSOR2TENSOR_LAYER_NORM_EPS == 1e-6
    record = TransformerConfig.small(8_000).to_dict()
    del record["layer_norm_eps"]
    assert config_from_dict(record).layer_norm_eps == 1e-6
    assert config_from_dict(record | {"layer_norm_eps": 1e-5}).layer_norm_eps == 1e-5
    for bad in (0.0, -1e-6, float("inf"), float("nan"), True, "1e-6"):
        with pytest.raises(ValueError, match=r"^layer_norm_eps must be a positive"):
            config_from_dict(record | {"layer_norm_eps": bad})


def test_the_checks_find_integer_and_boolean_fields_by_their_type():
    """A new size or switch is checked without a line of its own: every integer field
    must be a positive integer, every boolean field True or False."""
    hints = typing.get_type_hints(TransformerConfig)
    sizes = [n for n, t in hints.items() if t in (int, int | None)]
    switches = [n for n, t in hints.items() if t is bool]
    assert {"d_model", "n_heads", "d_ff", "n_layers", "max_len"} <= set(sizes)
    assert set(switches) == {"norm_first", "share_embeddings", "tie_output"}
    base = TransformerConfig.small(8_000, tgt_vocab_size=None)
    for name in sizes:
        broken = copy.copy(base)
        object.__setattr__(broken, name, 0)
        with pytest.raises(ValueError, match=rf"^{name} must be a positive integer"):
            check_config(broken)
    for name in switches:
        broken = copy.copy(base)
        object.__setattr__(broken, name, "yes")
        with pytest.raises(ValueError, match=rf"^{name} must be True or False"):
            check_config(broken)


def test_from_dict_validates():
    d = TransformerConfig.small(8_000).to_dict() | {"n_heads": 6}
    with pytest.raises(
        ValueError, match=r"^d_model \(256\) must be divisible by n_heads \(6\)"
    ):
        config_from_dict(d)
