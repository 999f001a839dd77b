# Generated from chapters/a02_model_engineering.ipynb: edit it, not this file.
"""Every attention weight of a Transformer's forward pass, for figures."""

# %% auto #0
__all__ = ["attention_weights"]

# %% ../chapters/a02_model_engineering.ipynb #8225f522

from torch import Tensor, nn


def attention_weights(
    model: nn.Module,
    src: Tensor,
    tgt: Tensor,
    *,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
) -> dict[str, list[Tensor]]:
    """Every attention weight of one forward pass, one tensor per layer; the
    method Transformer.attention_weights.

    Shapes:
        "encoder": n_layers x (B, H, S, S); "decoder_self": n_layers x (B,
            H, T, T); "decoder_cross": n_layers x (B, H, T, S)
    """
    x = model.src_pos(model.src_embed(src))  # (B, S, d_model)
    memory, encoder_weights = model.encoder(x, src_mask, need_weights=True)
    y = model.tgt_pos(model.tgt_embed(tgt))  # (B, T, d_model)
    _, decoder_weights = model.decoder(
        y, memory, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=True
    )
    return {
        "encoder": encoder_weights,
        "decoder_self": [w for w, _ in decoder_weights],
        "decoder_cross": [w for _, w in decoder_weights],
    }
