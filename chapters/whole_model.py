"""The Transformer of Vaswani et al. (2017), with the paper's options; its
parameters have the names of the book's package, whose weights load here."""

import math

import torch
from torch import Tensor, nn


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """softmax(QKᵀ/√d_k)V, equation (1); mask: True where q may see k."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores.softmax(dim=-1) @ v  # (..., T_q, d_k)


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, S) token ids -> (B, 1, 1, S): every query sees the real tokens."""
    return (ids != pad_id)[:, None, None, :]


def target_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, T) -> (B, 1, T, T): position t sees the real tokens up to t."""
    T = ids.size(1)
    causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
    return padding_mask(ids, pad_id) & causal


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """(B, L, d_model) -> (B, H, L, d_k): head i is columns i·d_k onwards."""
    return x.unflatten(-1, (n_heads, -1)).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """(B, H, L, d_k) -> (B, L, d_model): Concat(head_1, ..., head_H)."""
    return x.transpose(1, 2).flatten(2)


class MultiHeadAttention(nn.Module):
    """Concat(head_1, ..., head_H)W^O, head_i = Attention(QW_i^Q, ...)."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads  # each w_ below: the H heads' W_i side by side
        self.w_q, self.w_k, self.w_v, self.w_o = (
            nn.Linear(d_model, d_model) for _ in range(4)
        )

    def forward(self, query, key, value, mask: Tensor | None) -> Tensor:
        q = split_heads(self.w_q(query), self.n_heads)  # (B, H, T_q, d_k)
        k = split_heads(self.w_k(key), self.n_heads)  # (B, H, T_k, d_k)
        v = split_heads(self.w_v(value), self.n_heads)  # (B, H, T_k, d_k)
        return self.w_o(merge_heads(attention(q, k, v, mask)))


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, xW_1 + b_1)W_2 + b_2, at every position (3.3)."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(torch.relu(self.w_1(x)))


class SublayerConnection(nn.Module):
    """LayerNorm(x + Dropout(Sublayer(x))), around every sublayer (3.1)."""

    def __init__(self, d_model: int, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model, eps=1e-6)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, sublayer) -> Tensor:
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    """Self-attention, then the feed-forward network (Figure 1, left)."""

    def __init__(self, d_model, n_heads, d_ff, dropout) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff)
        self.sublayers = nn.ModuleList(
            SublayerConnection(d_model, dropout) for _ in range(2)
        )

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sublayers[0](x, lambda x: self.self_attn(x, x, x, src_mask))
        return self.sublayers[1](x, self.feed_forward)  # (B, S, d_model)


class DecoderLayer(nn.Module):
    """Masked self-attention, attention to the memory, then feed-forward."""

    def __init__(self, d_model, n_heads, d_ff, dropout) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads)
        self.cross_attn = MultiHeadAttention(d_model, n_heads)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff)
        self.sublayers = nn.ModuleList(
            SublayerConnection(d_model, dropout) for _ in range(3)
        )

    def forward(self, x, memory, src_mask, tgt_mask) -> Tensor:
        x = self.sublayers[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayers[1](
            x, lambda x: self.cross_attn(x, memory, memory, src_mask)
        )
        return self.sublayers[2](x, self.feed_forward)  # (B, T, d_model)


class Stack(nn.Module):
    """The encoder or the decoder: N identical layers, each its own weights."""

    def __init__(self, layer: type, n_layers: int, *sizes) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layer(*sizes) for _ in range(n_layers))

    def forward(self, x: Tensor, *memory_and_masks: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, *memory_and_masks)
        return x


class TokenEmbedding(nn.Module):
    """Token ids -> vectors of width d_model, times √d_model (3.4)."""

    def __init__(self, vocab_size: int, d_model: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embedding.weight, std=d_model**-0.5)

    def forward(self, ids: Tensor) -> Tensor:
        return self.embedding(ids) * math.sqrt(self.embedding.embedding_dim)


def sinusoids(max_len: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(·)."""
    pos = torch.arange(max_len, dtype=torch.float64)[:, None]
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)
    angle = pos / 10000 ** (two_i / d_model)  # (max_len, d_model / 2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()


class Generator(nn.Module):
    """The linear map to the vocabulary, then log-softmax (3.4)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return torch.log_softmax(self.proj(x), dim=-1)  # (B, T, V)


class Transformer(nn.Module):
    """Figure 1, with one vocabulary for both languages and the output."""

    def __init__(self, vocab_size: int, n_layers=6, d_model=512, n_heads=8,
                 d_ff=2048, dropout=0.1, max_len=512) -> None:
        super().__init__()
        sizes = (d_model, n_heads, d_ff, dropout)
        self.src_embed = self.tgt_embed = TokenEmbedding(vocab_size, d_model)
        self.encoder = Stack(EncoderLayer, n_layers, *sizes)
        self.decoder = Stack(DecoderLayer, n_layers, *sizes)
        self.generator = Generator(d_model, vocab_size)
        for module in [*self.encoder.modules(), *self.decoder.modules()]:
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        # The output layer's matrix is the embedding table (Section 3.4).
        self.generator.proj.weight = self.src_embed.embedding.weight
        pe = sinusoids(max_len, d_model)  # fixed, not learned: not saved
        self.register_buffer("pe", pe, persistent=False)
        self.dropout = nn.Dropout(dropout)  # on embeddings + positions (5.4)

    def embed(self, ids: Tensor) -> Tensor:
        """(B, L) ids -> (B, L, d_model): embeddings + positional encoding."""
        return self.dropout(self.src_embed(ids) + self.pe[: ids.size(1)])

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        return self.encoder(self.embed(src), src_mask)  # (B, S, d_model)

    def forward(self, src, tgt, src_mask, tgt_mask) -> Tensor:
        """src (B, S), tgt (B, T) -> log p of each next token (B, T, V)."""
        memory = self.encode(src, src_mask)
        out = self.decoder(self.embed(tgt), memory, src_mask, tgt_mask)
        return self.generator(out)


if __name__ == "__main__":  # the base model on two random sentences
    V = 37_000  # the paper's English-German vocabulary
    model = Transformer(V).eval()
    src, tgt = torch.randint(1, V, (2, 9)), torch.randint(1, V, (2, 7))
    with torch.no_grad():  # pad_id 0, never drawn here
        log_p = model(src, tgt, padding_mask(src, 0), target_mask(tgt, 0))
    size = sum(p.numel() for p in model.parameters())
    print(f"{size:,} parameters; log-probabilities {list(log_p.shape)}")
