"""The CTranslate2 export takes LayerNorm's ε from the model's config: with another ε, the
engine scores a translation as the package does, and far from the same weights at
tensor2tensor's ε."""

import dataclasses
import json

import pytest
import torch

pytest.importorskip("ctranslate2")

from helpers import tiny_tokenizer  # noqa: E402

from transformer.config import TransformerConfig  # noqa: E402
from transformer.ctranslate2 import CTranslate2Model, export_ctranslate2  # noqa: E402
from transformer.masking import padding_mask, target_mask  # noqa: E402
from transformer.model import Transformer  # noqa: E402


def package_log_probs(model: Transformer, src: list[int], tgt: list[int], tok) -> list:
    """log p of each target token and of the final <eos>, behind <bos>."""
    source = torch.tensor([src])
    inputs = torch.tensor([[tok.bos_id, *tgt]])
    labels = torch.tensor([[*tgt, tok.eos_id]])
    with torch.inference_mode():
        log_probs = model(
            source,
            inputs,
            src_mask=padding_mask(source, tok.pad_id),
            tgt_mask=target_mask(inputs, tok.pad_id),
        )
    return log_probs.gather(-1, labels[..., None])[0, :, 0].tolist()


def test_the_export_takes_epsilon_from_the_models_config(tmp_path):
    tokenizer = tiny_tokenizer()
    torch.manual_seed(0)
    sizes = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32)
    config = TransformerConfig(tokenizer.vocab_size, **sizes, layer_norm_eps=0.5)
    model = Transformer(config).eval()
    usual = Transformer(dataclasses.replace(config, layer_norm_eps=1e-6)).eval()
    usual.load_state_dict(model.state_dict())
    engine = CTranslate2Model(export_ctranslate2(model, tokenizer, tmp_path / "out"))
    engine_config = json.loads((engine.folder / "config.json").read_text())
    assert engine_config["layer_norm_epsilon"] == 0.5
    src = tokenizer.encode("Ein Hund läuft.") + [tokenizer.eos_id]
    tgt = tokenizer.encode("A dog runs.")
    pieces = [tokenizer.pieces(ids) for ids in (src[:-1], tgt)]
    scored = engine.translator.score_batch([pieces[0]], [pieces[1]])[0].log_probs
    gaps = [
        max(abs(a - b) for a, b in zip(scored, theirs, strict=True))
        for theirs in (
            package_log_probs(m, src, tgt, tokenizer) for m in (model, usual)
        )
    ]
    assert gaps[0] < 1e-4 < 1e-2 < gaps[1], gaps
