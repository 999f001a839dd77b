# Generated from chapters/08_model.ipynb: edit it, not this file.
"""The Transformer of Vaswani et al. (2017): Figure 1, Sections 3.1-3.4."""

# %% auto #0
__all__ = [
    "Generator",
    "positional_encoding",
    "init_weights",
    "Transformer",
    "attention_weights",
]

# %% ../chapters/08_model.ipynb #015bfca4

import torch
from torch import Tensor, nn

from transformer.config import TransformerConfig
from transformer.decoder import Decoder
from transformer.embedding import (
    LearnedPositionalEncoding,
    PositionalEncoding,
    TokenEmbedding,
)
from transformer.encoder import Encoder


class Generator(nn.Module):
    """The output layer: a linear map to the vocabulary, then log-softmax."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        # No bias, as in the reference code; the weight may be the embedding's.
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Shapes: x (B, T, d_model) -> log-probabilities (B, T, V)."""
        return torch.log_softmax(self.proj(x), dim=-1)


def positional_encoding(c: TransformerConfig) -> nn.Module:
    """The sinusoids (3.5), or learned positions (Table 3, row E)."""
    if c.positional == "learned":
        return LearnedPositionalEncoding(c.d_model, c.max_len, c.dropout)
    return PositionalEncoding(c.d_model, c.max_len, c.dropout)


def init_weights(model: "Transformer") -> None:
    """Glorot-uniform matrices and zero biases in both stacks, as in the
    reference code; the embedding table keeps its N(0, 1/d_model)."""
    for stack in (model.encoder, model.decoder):
        for module in stack.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
    if not model.config.tie_output:
        nn.init.xavier_uniform_(model.generator.proj.weight)


# %% ../chapters/08_model.ipynb #eea46377
class Transformer(nn.Module):
    """The encoder-decoder Transformer, built from a TransformerConfig."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = c = config
        self.src_embed = TokenEmbedding(c.src_vocab_size, c.d_model)
        # One table for both languages when they share a vocabulary (3.4).
        self.tgt_embed = (
            self.src_embed
            if c.share_embeddings
            else TokenEmbedding(c.target_vocab_size, c.d_model)
        )
        self.src_pos = positional_encoding(c)
        self.tgt_pos = positional_encoding(c)
        # Each layer reads the sizes it needs from the config; N per stack.
        self.encoder = Encoder(c, c.n_layers)
        self.decoder = Decoder(c, c.n_layers)
        self.generator = Generator(c.d_model, c.target_vocab_size)
        init_weights(self)
        if c.tie_output:  # the same Parameter, not a copy (3.4)
            self.generator.proj.weight = self.tgt_embed.embedding.weight

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """Shapes: src (B, S) ids, src_mask (B, 1, 1, S) -> (B, S, d_model)."""
        x = self.src_pos(self.src_embed(src))  # (B, S, d_model)
        return self.encoder(x, src_mask)[0]

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        """Shapes: tgt (B, T) ids, memory (B, S, d_model), tgt_mask (B, 1, T,
        T) -> (B, T, d_model)."""
        x = self.tgt_pos(self.tgt_embed(tgt))  # (B, T, d_model)
        out, _ = self.decoder(x, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return out

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        """Shapes: src (B, S), tgt (B, T) -> log-probabilities (B, T, V)."""
        memory = self.encode(src, src_mask)
        out = self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return self.generator(out)


# %% ../chapters/08_model.ipynb #8a85cb6d
def attention_weights(
    model: Transformer,
    src: Tensor,
    tgt: Tensor,
    *,
    src_mask: Tensor | None,
    tgt_mask: Tensor | None,
) -> dict[str, list[Tensor]]:
    """Every attention weight of one forward pass, one tensor per layer, for
    figures: "encoder" n_layers x (B, H, S, S), "decoder_self" (B, H, T, T),
    "decoder_cross" (B, H, T, S)."""
    x = model.src_pos(model.src_embed(src))  # (B, S, d_model)
    memory, encoder = model.encoder(x, src_mask, need_weights=True)
    y = model.tgt_pos(model.tgt_embed(tgt))  # (B, T, d_model)
    _, decoder = model.decoder(
        y, memory, src_mask=src_mask, tgt_mask=tgt_mask, need_weights=True
    )
    return {
        "encoder": encoder,
        "decoder_self": [w for w, _ in decoder],
        "decoder_cross": [w for _, w in decoder],
    }
