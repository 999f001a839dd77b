# Generated from chapters/08_model.ipynb: edit it, not this file.
"""The Transformer: embeddings, encoder, decoder and output layer, Figure 1 and
Sections 3.1-3.4 of Vaswani et al. (2017)."""

# %% auto #0
__all__ = ["Generator", "Transformer"]

# %% ../chapters/08_model.ipynb #e25a660a

import torch
from torch import Tensor, nn

from transformer.config import TransformerConfig
from transformer.decoder import Decoder, DecoderCache
from transformer.embedding import (
    LearnedPositionalEncoding,
    PositionalEncoding,
    TokenEmbedding,
)
from transformer.encoder import Encoder


class Generator(nn.Module):
    """The output layer: a linear map to the vocabulary and a log-softmax
    (Section 3.4)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        # No bias, as in the reference code; the weight may be the tied
        # embedding matrix.
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """Log-probabilities of the next token.

        Shapes:
            x: (B, T, d_model)
            returns (B, T, V)
        """
        return torch.log_softmax(self.proj(x), dim=-1)


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
        positional = (
            PositionalEncoding
            if c.positional == "sinusoidal"
            else LearnedPositionalEncoding
        )
        self.src_pos = positional(
            c.d_model, max_len=c.max_len, dropout=c.dropout
        )
        self.tgt_pos = positional(
            c.d_model, max_len=c.max_len, dropout=c.dropout
        )
        stack = dict(
            n_layers=c.n_layers,
            d_model=c.d_model,
            n_heads=c.n_heads,
            d_ff=c.d_ff,
            dropout=c.dropout,
            attention_dropout=c.attention_dropout,
            ffn_dropout=c.ffn_dropout,
            norm_first=c.norm_first,
        )
        self.encoder = Encoder(**stack)
        self.decoder = Decoder(**stack)
        self.generator = Generator(c.d_model, c.target_vocab_size)
        self._init_weights()
        if c.tie_output:
            # The same Parameter object, not a copy: one tensor, one gradient
            # (3.4).
            self.generator.proj.weight = self.tgt_embed.embedding.weight

    def _init_weights(self) -> None:
        # Glorot-uniform matrices in both stacks, as the reference code, and
        # zero biases: the attention biases, which the reference code does not
        # have, start inert. The embedding tables keep TokenEmbedding's N(0,
        # 1/d_model).
        for stack in (self.encoder, self.decoder):
            for module in stack.modules():
                if isinstance(module, nn.Linear):
                    nn.init.xavier_uniform_(module.weight)
                    if module.bias is not None:
                        nn.init.zeros_(module.bias)
        if not self.config.tie_output:
            nn.init.xavier_uniform_(self.generator.proj.weight)

    def _embed_source(self, src: Tensor) -> Tensor:
        return self.src_pos(self.src_embed(src))  # (B, S, d_model)

    def _embed_target(self, tgt: Tensor, start: int = 0) -> Tensor:
        return self.tgt_pos(
            self.tgt_embed(tgt), start=start
        )  # (B, T, d_model)

    def encode(self, src: Tensor, src_mask: Tensor | None) -> Tensor:
        """The encoder's memory of a batch of source sentences.

        Shapes:
            src: (B, S) token ids; src_mask: boolean (B, 1, 1, S)
                (padding_mask)
            returns (B, S, d_model)
        """
        memory, _ = self.encoder(self._embed_source(src), src_mask)
        return memory

    def decode(
        self,
        tgt: Tensor,
        memory: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
        cache: DecoderCache | None = None,
    ) -> Tensor:
        """The decoder's output vectors for a batch of (shifted) target
        sentences.

        Shapes:
            tgt: (B, T) token ids; memory: (B, S, d_model)
            src_mask: boolean (B, 1, 1, S); tgt_mask: boolean (B, 1, T, T)
                (target_mask)
            returns (B, T, d_model)

        With a cache (the decoding chapter), tgt holds only the new tokens,
        which take the positions after the cache.length ones already decoded,
        and tgt_mask, if any, covers all L cached positions, the new ones
        included: (B, 1, T, L).
        """
        start = cache.length if cache is not None else 0
        out, _ = self.decoder(
            self._embed_target(tgt, start=start),
            memory,
            src_mask=src_mask,
            tgt_mask=tgt_mask,
            cache=cache,
        )
        return out

    def forward(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> Tensor:
        """Log-probabilities of the next target token at every target position.

        Shapes:
            src: (B, S) and tgt: (B, T) token ids
            src_mask: boolean (B, 1, 1, S); tgt_mask: boolean (B, 1, T, T)
            returns (B, T, V)
        """
        memory = self.encode(src, src_mask)
        out = self.decode(tgt, memory, src_mask=src_mask, tgt_mask=tgt_mask)
        return self.generator(out)

    def attention_weights(
        self,
        src: Tensor,
        tgt: Tensor,
        *,
        src_mask: Tensor | None,
        tgt_mask: Tensor | None,
    ) -> dict[str, list[Tensor]]:
        """Every attention weight of one forward pass, one tensor per layer.

        Shapes:
            "encoder": n_layers x (B, H, S, S); "decoder_self": n_layers x (B,
                H, T, T);
            "decoder_cross": n_layers x (B, H, T, S)
        """
        memory, encoder_weights = self.encoder(
            self._embed_source(src), src_mask, need_weights=True
        )
        _, decoder_weights = self.decoder(
            self._embed_target(tgt),
            memory,
            src_mask=src_mask,
            tgt_mask=tgt_mask,
            need_weights=True,
        )
        return {
            "encoder": encoder_weights,
            "decoder_self": [w for w, _ in decoder_weights],
            "decoder_cross": [w for _, w in decoder_weights],
        }
