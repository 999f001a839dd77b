"""Checks and tiny models shared by several test modules (pytest puts this folder on
sys.path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from transformer.checkpoint import export_model, save_weights
from transformer.config import TransformerConfig
from transformer.model import Transformer
from transformer.tokenizer import Tokenizer, pretokenize, train_bpe
from transformer.train_config import TrainConfig
from transformer.training_checkpoints import run_record

GERMAN = [
    "Ein Hund läuft über eine Wiese.",
    "Zwei Kinder spielen im Schnee.",
    "Eine Frau mit einem roten Hut sitzt auf einer Bank.",
    "Ein Mann fährt Fahrrad.",
    "Drei Hunde spielen mit einem Ball.",
    "Ein kleines Mädchen lacht.",
]
ENGLISH = [
    "A dog runs across a meadow.",
    "Two children play in the snow.",
    "A woman with a red hat sits on a bench.",
    "A man rides a bike.",
    "Three dogs play with a ball.",
    "A little girl laughs.",
]
MAX_LEN = 40  # the tiny model's positions: sources of more tokens are cut


def tiny_tokenizer(seed_text: list[str] = GERMAN) -> Tokenizer:
    words = pretokenize(seed_text, "de") + pretokenize(ENGLISH, "en")
    return train_bpe(words, 90, languages=("de", "en"))


def ship(
    folder: Path,
    tokenizer: Tokenizer,
    pair: str = "de-en",
    seed: int = 0,
    max_len: int = MAX_LEN,
) -> Path:
    """A tiny random model in the shipped form, as `export_model` writes it from a run."""
    torch.manual_seed(seed)
    config = TransformerConfig(
        src_vocab_size=tokenizer.vocab_size,
        d_model=16,
        n_heads=2,
        n_layers=1,
        d_ff=32,
        max_len=max_len,
    )
    checkpoint = folder.parent / f".{folder.name}-checkpoint"
    checkpoint.mkdir(parents=True)
    save_weights(Transformer(config), checkpoint / "model.safetensors")
    record = run_record(TrainConfig(pair=pair), config, tokenizer)
    (checkpoint / "config.json").write_text(json.dumps(record))
    tokenizer.save(checkpoint / "tokenizer.json")
    return export_model(checkpoint, folder)


def assert_gradients_reach_every_parameter(module: nn.Module) -> None:
    """After a backward pass, every parameter of `module` has a finite gradient above 1e-6,
    except the attention key biases: W^K's bias adds q·b to every score of a query, which the
    softmax ignores, so their gradient is zero up to rounding, whatever the loss."""
    for name, p in module.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        if name.endswith("attn.w_k.bias"):
            assert p.grad.abs().max() < 1e-5, name
        else:
            assert p.grad.abs().max() > 1e-6, name


# The model variants whose layers differ: the paper's, pre-norm, learned positions.
VARIANTS = [
    pytest.param({}, id="post-norm"),
    pytest.param({"norm_first": True}, id="pre-norm"),
    pytest.param({"positional": "learned"}, id="learned-positions"),
]


def tiny_model(**overrides) -> Transformer:
    """A 2-layer model of width 16, 4 heads and 23 ids, seeded, in eval mode."""
    torch.manual_seed(0)
    fields = dict(d_model=16, n_heads=4, n_layers=2, d_ff=32, max_len=64)
    config = TransformerConfig(src_vocab_size=23, **(fields | overrides))
    return Transformer(config).eval()
