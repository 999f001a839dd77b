# Generated from chapters/a08_translating.ipynb: edit it, not this file.
"""The decoding step of the batched searches: the decoding chapter's cached
step, with the keys and values written in place into buffers allocated once
per batch, the memory's keys and values projected once per sentence, and the
weights laid out once per model."""

# %% auto #0
__all__ = [
    "Weight",
    "transposed",
    "linear",
    "LayerWeights",
    "StepWeights",
    "step_weights",
    "attend_rows",
    "BatchCache",
]

# %% ../chapters/a08_translating.ipynb #d2bcacb6

import weakref
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer.model import Transformer
from transformer.multihead import project

# A linear map's weight (in, out) and bias, or a module that is not a plain
# nn.Linear (a quantised one, say), called as it is.
Weight = tuple[Tensor, Tensor | None] | nn.Module


def transposed(*linears: nn.Module, scale: float = 1.0) -> Weight:
    """The linear maps' weights stacked and transposed, (in, Σ out), and their
    biases, the first map's times `scale`: x @ W + b computes them all in one
    product. One map that is not an nn.Linear is kept as it is."""
    first, *rest = linears
    if type(first) is not nn.Linear and not rest and scale == 1.0:
        return first
    weights = [first.weight * scale] + [linear.weight for linear in rest]
    weight = torch.cat(weights).t().contiguous()
    if first.bias is None:
        return weight, None
    return weight, torch.cat([first.bias * scale] + [x.bias for x in rest])


def linear(x: Tensor, weight: Weight) -> Tensor:
    """x @ W + b: x (N, in) -> (N, out)."""
    if isinstance(weight, nn.Module):
        return weight(x)
    w, b = weight
    return x @ w if b is None else torch.addmm(b, x, w)


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's linear maps, transposed: the self-attention's W^Q,
    W^K and W^V stacked (d_model, 3·d_model), and its W^O; the encoder-decoder
    attention's W^Q and W^O; the feed-forward network's two maps. Both W^Q
    (and b^Q) come multiplied by 1/√d_k, the scale of the scores (Eq. 1). The
    three layer normalisations are the layer's own."""

    qkv: Weight
    self_out: Weight
    cross_q: Weight
    cross_out: Weight
    ff_1: Weight
    ff_2: Weight
    norms: list[nn.LayerNorm]

    @classmethod
    def of(cls, layer: nn.Module) -> "LayerWeights":
        """The weights of a DecoderLayer."""
        own, cross, ff = layer.self_attn, layer.cross_attn, layer.feed_forward
        scale = own.d_k**-0.5
        return cls(
            qkv=transposed(own.w_q, own.w_k, own.w_v, scale=scale),
            self_out=transposed(own.w_o),
            cross_q=transposed(cross.w_q, scale=scale),
            cross_out=transposed(cross.w_o),
            ff_1=transposed(ff.w_1),
            ff_2=transposed(ff.w_2),
            norms=[sublayer.norm for sublayer in layer.sublayers],
        )


@dataclass(frozen=True)
class StepWeights:
    """A decoder's weights as the step multiplies by them: each layer's, and
    the output layer's transposed, (d_model, V)."""

    layers: list[LayerWeights]
    output: Tensor
    made_from: tuple[tuple[int, int], ...]  # each source's address, version


# Each model's StepWeights, dropped with the model.
_STEP_WEIGHTS: "weakref.WeakKeyDictionary[nn.Module, StepWeights]" = (
    weakref.WeakKeyDictionary()
)


def step_weights(model: Transformer) -> StepWeights:
    """The step's weights of `model`: made once, and again when one of the
    weights they come from changes (another tensor, or one written to)."""
    sources = [*model.decoder.parameters(), model.generator.proj.weight]
    # A tensor's version counts the writes to it (autograd's in-place check).
    made_from = tuple((t.data_ptr(), t._version) for t in sources)
    weights = _STEP_WEIGHTS.get(model)
    if weights is None or weights.made_from != made_from:
        with torch.no_grad():
            layers = [LayerWeights.of(layer) for layer in model.decoder.layers]
            output = (
                model.generator.proj.weight.t().contiguous()
            )  # (d_model, V)
        weights = StepWeights(layers, output, made_from)
        _STEP_WEIGHTS[model] = weights
    return weights


def attend_rows(q: Tensor, k: Tensor, v: Tensor, bias=None) -> Tensor:
    """softmax(q kᵀ + bias) v, as two batched products, for queries q (R, Q,
    d_k) already scaled by 1/√d_k, keys and values k and v (R, L, d_k), and a
    bias broadcastable to (R, Q, L): -> (R, Q, d_k)."""
    if bias is None:
        scores = torch.bmm(q, k.transpose(1, 2))  # (R, Q, L)
    else:
        scores = torch.baddbmm(bias, q, k.transpose(1, 2))
    return torch.bmm(scores.softmax(dim=-1), v)


def _feed_forward(w: LayerWeights, x: Tensor) -> Tensor:
    """FFN(x) = max(0, x W1 + b1) W2 + b2 (Section 3.3), x (N, d_model)."""
    return linear(linear(x, w.ff_1).relu_(), w.ff_2)


# %% ../chapters/a08_translating.ipynb #72aa6872
class BatchCache:
    """The decoder's state for the N rows of a batch, `beams` rows per
    sentence: every layer's self-attention keys and values, (n_layers, 2, N,
    H, L, d_k) for up to L positions; every layer's memory keys and values,
    (n·H, S, d_k), once per sentence."""

    def __init__(self, model, memory, src_mask, *, beams: int, length: int):
        """memory (n, S, d_model) and src_mask (n, 1, 1, S) of n sentences."""
        layers = model.decoder.layers
        n, S, d_model = memory.shape
        H = layers[0].self_attn.n_heads
        self.model, self.weights = model, step_weights(model)
        self.beams, self.heads, self.length = beams, H, 0
        self.norm_first = model.config.norm_first
        shape = (len(layers), 2, n * beams, H, length, d_model // H)
        self.kv, self.spare = memory.new_empty(shape), memory.new_empty(shape)
        self.memory_kv = []
        for layer in layers:
            attn = layer.cross_attn
            k, v = project(memory, H, attn.w_k, attn.w_v)  # (n, H, S, d_k)
            self.memory_kv.append((k.flatten(0, 1), v.flatten(0, 1)))
        # The source mask as scores added: 0 where a query may look, else -inf.
        bias = torch.zeros(
            src_mask.shape, dtype=memory.dtype, device=memory.device
        )
        bias = bias.masked_fill(~src_mask, -torch.inf).expand(n, H, 1, S)
        self.memory_bias = bias.flatten(0, 1)  # (n·H, 1, S)

    def step(self, token: Tensor) -> Tensor:
        """log p(next token) for every row, given its newest token (N, 1), as
        the decoding chapter's decode_step: -> (N, V)."""
        model, t = self.model, self.length
        x = model.tgt_pos(model.tgt_embed(token), start=t)  # (N, 1, d_model)
        x = x[:, 0]  # (N, d_model)
        for i, w in enumerate(self.weights.layers):
            x = self._residual(
                x, w.norms[0], partial(self._self_attention, i, w)
            )
            x = self._residual(
                x, w.norms[1], partial(self._cross_attention, i, w)
            )
            x = self._residual(x, w.norms[2], partial(_feed_forward, w))
        self.length += 1
        x = model.decoder.final_norm(x)
        return torch.log_softmax(self._logits(x), dim=-1)  # (N, V)

    def _logits(self, x: Tensor) -> Tensor:
        """The output layer's product, before the softmax: (N, V)."""
        return x @ self.weights.output

    def _residual(self, x: Tensor, norm: nn.LayerNorm, sublayer) -> Tensor:
        """The chapters' SublayerConnection without dropout, which inference
        turns off: LayerNorm(x + Sublayer(x)), or x + Sublayer(LayerNorm(x))
        with norm_first; calling the functions saves the modules' calls."""
        shape, eps = norm.normalized_shape, norm.eps
        if self.norm_first:
            return x + sublayer(
                F.layer_norm(x, shape, norm.weight, norm.bias, eps)
            )
        return F.layer_norm(
            x + sublayer(x), shape, norm.weight, norm.bias, eps
        )

    def _self_attention(self, i: int, w: LayerWeights, x: Tensor) -> Tensor:
        """Layer i's self-attention of the newest positions x (N, d_model)
        over theirs and the earlier ones."""
        N, H, t = x.size(0), self.heads, self.length
        qkv = linear(x, w.qkv).unflatten(1, (3, H, -1))  # (N, 3, H, d_k)
        q, kv = qkv.split((1, 2), dim=1)
        self.kv[i, :, :, :, t] = kv.transpose(
            0, 1
        )  # position t: (2, N, H, d_k)
        k, v = self.kv[i, :, :, :, : t + 1].flatten(1, 2)  # (N·H, t + 1, d_k)
        out = attend_rows(q.reshape(N * H, 1, -1), k, v)  # (N·H, 1, d_k)
        return linear(out.view(N, -1), w.self_out)

    def _cross_attention(self, i: int, w: LayerWeights, x: Tensor) -> Tensor:
        """Layer i's encoder-decoder attention: the beams of a sentence query
        its memory together, as one block of `beams` queries."""
        N, H, K = x.size(0), self.heads, self.beams
        q = linear(x, w.cross_q).view(N // K, K, H, -1).transpose(1, 2)
        k, v = self.memory_kv[i]  # q: (n, H, K, d_k)
        out = attend_rows(
            q.flatten(0, 1), k, v, self.memory_bias
        )  # (n·H, K, d_k)
        out = out.view(N // K, H, K, -1).transpose(1, 2)  # (n, K, H, d_k)
        return linear(out.reshape(N, -1), w.cross_out)

    def keep(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep rows `rows` (N',) of the keys and values, in that order: the
        beams' parents, or the rows of the sentences that stay; `sentences`
        (n,) booleans, if given, keeps those sentences' memory."""
        t, N = self.length, rows.numel()
        spare = self.spare[:, :, :N]
        torch.index_select(self.kv[..., :t, :], 2, rows, out=spare[..., :t, :])
        self.kv, self.spare = spare, self.kv
        if sentences is not None:
            n = sentences.numel()
            self.memory_kv = [
                tuple(
                    m.unflatten(0, (n, -1))[sentences].flatten(0, 1)
                    for m in kv
                )
                for kv in self.memory_kv
            ]
            bias = self.memory_bias.unflatten(0, (n, -1))[sentences]
            self.memory_bias = bias.flatten(0, 1)
