# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Translating text
#
# The [decoding chapter](14_decoding.ipynb) searches for the translation of one sentence. This
# appendix builds on it what the command line's `translate` and `evaluate` run: a search's
# options and checks, a faster decoding step, the two searches over a batch of sentences,
# `load_pair_model`, `translate` and the translation of a whole Multi30k split.

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)

# %% tags=["remove-cell"]
#| default_exp translation

# %% [markdown]
# ## The options of a translation
#
# Four values decide how a sentence is translated: the beam size and the length penalty
# $\alpha$ (the paper's 4 and 0.6; a beam of 1 is greedy decoding), how many sentences are
# decoded at once, and the longest output (by default each source's length + 50).
# `DecodeOptions` holds them, frozen, and checks them when it is made; a bad value is a
# one-line `OptionError` that starts with the field's name.

# %%
#| export decode_options
"""The options of a translation, with the package's defaults, checked once: the
search's beam size and length penalty α, the sentences decoded at once and the
longest output."""

import dataclasses
import math
from dataclasses import dataclass

from transformer.paper_search import ALPHA, BEAM_SIZE

# The largest α accepted: far beyond any useful one, yet small enough that lp
# stays finite in float32 for outputs of 40,000 tokens.
MAX_ALPHA = 10.0
_FLOAT32_MAX = 3.4028234663852886e38  # the search computes lp in float32


class OptionError(ValueError):
    """A decoding option that cannot be used: one line that starts with the
    option's name, `field`."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


# %%
#| export decode_options
@dataclass(frozen=True)
class DecodeOptions:
    """Beam search with beam_size and length penalty alpha (beam_size 1:
    greedy decoding), batch_size sentences at a time, outputs of at most
    max_len tokens with EOS (None: each source's length + 50)."""

    beam_size: int = BEAM_SIZE  # the package's defaults (paper_search)
    alpha: float = ALPHA
    batch_size: int = 32
    max_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("beam_size", "batch_size", "max_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(name, f"must be at least 1, got {value}")
        self.check_alpha()

    @property
    def greedy(self) -> bool:
        return self.beam_size == 1

    def check_alpha(self, positions: int | None = None) -> None:
        """α from 0 to MAX_ALPHA: lp grows with length and stays finite (an
        infinite lp makes scores NaN), up to a model's `positions` if given."""
        alpha = self.alpha
        if not 0 <= alpha <= MAX_ALPHA:  # also rejects NaN and infinity
            raise OptionError(
                "alpha", f"must be >= 0 and at most {MAX_ALPHA:g}, got {alpha}"
            )
        if positions is None:
            return
        # lp(positions) = ((5 + positions) / 6)^α must stay a float32
        if alpha * math.log((5 + positions) / 6) >= math.log(_FLOAT32_MAX):
            raise OptionError(
                "alpha",
                f"{alpha} makes the length penalty overflow at the model's"
                f" {positions} positions: choose a smaller one",
            )


def with_changes(
    options: DecodeOptions | None = None, **changes
) -> DecodeOptions:
    """`options` (default: DecodeOptions()) with `changes`, checked: how
    `translate` and its kin take both, e.g. `translate(..., beam_size=1)`."""
    if options is not None and not changes:
        return options  # checked when it was made
    return dataclasses.replace(options or DecodeOptions(), **changes)


# %% [markdown]
# The default options, greedy decoding, and a value refused with its field's name:

# %%
from transformer.decode_options import (
    DecodeOptions,
    OptionError,
    with_changes,
)

print(DecodeOptions())
assert with_changes(beam_size=1).greedy
try:
    DecodeOptions(alpha=-1)
except OptionError as err:
    print(err)

# %% [markdown]
# ## Before a search: checks and limits
#
# Greedy decoding and beam search start the same way:
#
# - **`check_search`** turns token ids that the search cannot use into a one-line `ValueError`:
#   a `src` that is not a $(B, S)$ tensor of token ids, a row of padding alone (its memory would
#   be masked entirely), a `pad_id` equal to BOS or EOS (an ended sentence is recognised by its
#   padding), or a forced prefix of the wrong shape; and an $\alpha$ whose $lp$ overflows
#   32-bit floats within the model's positions, which would turn $-\infty$ scores into NaN.
# - **`sentence_output_limits`** gives each sentence the decoding chapter's `output_limit`: its
#   source length + 50 tokens, EOS included (or `max_len` if given), never more than the
#   positions of the model's positional encoding (`config.max_len`).
# - **`inference`** turns off gradients and dropout for the search, and puts the model back in
#   the mode it was in afterwards.

# %%
#| export search_setup
"""What a search sets up before it starts: its arguments checked, each
sentence's output length limit (Section 6.1), and inference mode."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from transformer.decode import output_limit
from transformer.model import Transformer


def sentence_output_limits(
    model: Transformer, src: Tensor, *, pad_id: int, max_len: int | None = None
) -> Tensor:
    """The most tokens each sentence may output, EOS included: (B, S) -> (B,).

    Each source's length (its non-padding tokens) + 50, as in the paper, or
    max_len if given; never more than the positions of the model's positional
    encoding (config.max_len).
    """
    lengths = (src != pad_id).sum(dim=1).tolist()
    positions = model.config.max_len
    limits = [output_limit(n, positions, max_len) for n in lengths]
    return torch.tensor(limits, device=src.device)  # (B,)


def check_search(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    prefix: Tensor | None = None,
) -> None:
    """Raise ValueError, in one line, for token ids that greedy decoding or
    beam search cannot use (the options were checked when they were made)."""
    if pad_id in (bos_id, eos_id):
        raise ValueError(
            f"pad_id ({pad_id}) must differ from bos_id ({bos_id}) and eos_id"
            f" ({eos_id}): an ended sentence is recognised by its padding"
        )
    if src.dim() != 2 or src.dtype != torch.long:
        raise ValueError(
            "src must be a (B, S) tensor of token ids (torch.long), got shape "
            f"{tuple(src.shape)} and {src.dtype}"
        )
    if src.size(1) == 0:
        raise ValueError(
            "src has no positions: encode each source with its <eos>"
        )
    empty = (src == pad_id).all(dim=1)  # (B,)
    if empty.any():
        raise ValueError(
            f"src row {int(empty.nonzero()[0])} is all padding: encode each"
            " source with its <eos>"
        )
    if prefix is not None:
        check_prefix(prefix, src, bos_id=bos_id, eos_id=eos_id)


def check_prefix(prefix: Tensor, src: Tensor, *, bos_id, eos_id) -> None:
    """A forced prefix is a (B, P) tensor of token ids, one row per source,
    without BOS or EOS (padding marks a position the search chooses)."""
    if prefix.dim() != 2 or prefix.dtype != torch.long:
        raise ValueError(
            "prefix must be a (B, P) tensor of token ids (torch.long), got"
            f" shape {tuple(prefix.shape)} and {prefix.dtype}"
        )
    if prefix.size(0) != src.size(0):
        raise ValueError(
            f"prefix has {prefix.size(0)} rows for {src.size(0)} sources"
        )
    if ((prefix == bos_id) | (prefix == eos_id)).any():
        raise ValueError(
            "prefix must not hold <bos> or <eos>: the search adds them"
        )


@contextmanager
def inference(model: Transformer) -> Iterator[None]:
    """No gradients and no dropout; the model's training mode is restored
    afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


# %% [markdown]
# A tiny model with 64 positions, and two sources with their EOS (id 2), padded with id 0: each
# may output its length + 50 tokens, and never more than 64, even when asked for 99. A sentence
# without its batch dimension is refused:

# %%
import torch

from transformer.config import TransformerConfig
from transformer.model import Transformer
from transformer.search_setup import check_search, sentence_output_limits

tiny = Transformer(
    TransformerConfig(
        src_vocab_size=11,
        d_model=16,
        n_heads=2,
        n_layers=1,
        d_ff=32,
        max_len=64,
    )
)
src = torch.tensor([[5, 6, 7, 2], [8, 9, 2, 0]])  # (B, S)
print(sentence_output_limits(tiny, src, pad_id=0).tolist())
print(sentence_output_limits(tiny, src, pad_id=0, max_len=99).tolist())
try:
    check_search(tiny, src[0], bos_id=1, eos_id=2, pad_id=0)
except ValueError as err:
    print(err)

# %% [markdown]
# ## A decoding step for a batch
#
# The decoding chapter's `decode_step` runs the decoder on each row's newest token, with the
# earlier positions' keys and values in a `DecoderCache`. It is written to be read: every step
# concatenates each layer's new keys and values to its cache, copies the whole cache to reorder
# the beams, and attends to a copy of the memory per beam. `BatchCache` computes the same step
# with less work, each change for one reason:
#
# - **One buffer, written in place.** The keys and values of every layer live in one tensor
#   allocated once per batch, $(n_\text{layers}, 2, N, H, L, d_k)$ for $N$ rows and the batch's
#   longest output $L$, and a step writes position $t$ into it: concatenating copies every
#   earlier position at every step.
# - **One reorder for all layers.** Moving beams to their parents' rows, or dropping the rows of
#   finished sentences, is one `index_select` of the positions written so far into a second
#   buffer, which then takes the first one's place: one copy, instead of an indexing and a
#   concatenation per tensor.
# - **The memory once per sentence.** The $K$ beams of a sentence attend to the same memory, so
#   its keys and values are projected once, $(n \cdot H, S, d_k)$, and the $K$ beams' queries
#   are one $(K, d_k)$ block of one batched product: repeating the memory $K$ times makes $K$
#   times the projections and copies, and it never needs reordering.
# - **Attention as two batched products.** With one query per row, the scores $q K^\top$ and
#   the weighted sum of the values are two small `bmm`s, with the source mask added as a bias
#   of $0$ or $-\infty$; the fused attention kernel costs more to set up than it saves here.
# - **Weights laid out once per model.** Every linear map's weight is stored transposed,
#   $(d_\text{in}, d_\text{out})$, a layout that PyTorch's CPU matrix library (Intel MKL)
#   multiplies faster at a step's few rows, the output layer's $d_\text{model} \times V$ above
#   all; the self-attention's $W^Q$, $W^K$ and $W^V$ are stacked into one product; and both
#   attentions' $W^Q$ and $b^Q$ come multiplied by $1/\sqrt{d_k}$, which saves scaling the
#   scores at every step. They are made once and kept with the model until one of its weights
#   changes.
# - **Functions, not modules.** The residual connections and layer normalisations are called
#   as functions, without the dropout that inference turns off: each module call costs Python
#   time that a step with one new position per row cannot hide.
#
# The rest is the chapters' code: the embedding, the positional encoding and the layer
# normalisations' weights. A test holds `BatchCache.step` equal to the chapter's `decode_step`,
# up to rounding, for post-norm and pre-norm layers, with beams reordered and sentences dropped
# (`tests/test_batched_search.py`).

# %%
#| export batched_step
"""The decoding step of the batched searches: the decoding chapter's cached
step, with the keys and values written in place into buffers allocated once
per batch, the memory's keys and values projected once per sentence, and the
weights laid out once per model."""

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


# %%
#| export batched_step
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


# %% [markdown]
# The tiny model from above, its two sources searched with two beams each: three steps of
# `BatchCache` and of the chapter's `decode_step`, over the memory repeated for the beams, give
# the same log-probabilities up to rounding.

# %%
from transformer.batched_step import BatchCache
from transformer.kv_cache import DecoderCache, decode_step
from transformer.masking import padding_mask

tiny.eval()  # no dropout: the chapter's step would apply it
with torch.inference_mode():
    src_mask = padding_mask(src, 0)  # (B, 1, 1, S)
    memory = tiny.encode(src, src_mask)
    cache = BatchCache(tiny, memory, src_mask, beams=2, length=3)
    chapter_cache = DecoderCache.empty(len(tiny.decoder.layers))
    token = torch.tensor([[1], [1], [1], [1]])  # BOS in each of 2 x 2 rows
    gap = 0.0
    for _ in range(3):
        ours = cache.step(token)  # (4, V)
        theirs = decode_step(
            tiny,
            token,
            memory.repeat_interleave(2, 0),
            src_mask.repeat_interleave(2, 0),
            chapter_cache,
        )
        gap = max(gap, (ours - theirs).abs().max().item())
        token = ours.argmax(-1, keepdim=True)
assert gap < 1e-5  # float32 rounding, which varies with the threads
print("largest difference under 1e-5")


# %% [markdown]
# ## Searching a batch of sentences
#
# The decoding chapter's `greedy_decode` and `beam_search` decode one sentence. A computer runs a
# matrix product over many rows at nearly the cost of one, so the package decodes $B$ sentences
# at once, with the same steps and the same results:
#
# - **Padding.** The sources are padded to one length $S$, and the source mask hides the padding.
# - **Rows.** Greedy decoding gives sentence $b$ row $b$; beam search gives it rows
#   $bK, \dots, bK + K - 1$, one per beam, and `BeamStep` carries every sentence's $K$ beams from
#   step to step.
# - **Top-$K \cdot K$ pruning.** All the extensions of one beam share its $lp$, so only its $K$
#   most probable tokens can be among the $K$ best: ranking $K \cdot K$ candidates per sentence
#   selects the beams that ranking $K \cdot V$ would.
# - **The step.** Each step is one `BatchCache.step` over the rows still going.
# - **Sentences leave.** A sentence that has ended (greedy), or that no open beam can change
#   (beam search), leaves the batch with its memory and its cached keys and values, so that the
#   later steps compute only the sentences still going; in beam search, the rows that stay move
#   to their parents' in the same copy.
# - **Ended beams counted once.** The best ended hypothesis of each sentence is kept aside, and
#   only a step in which a beam ends can change it, so the others skip that bookkeeping.
# - **A forced prefix.** `prefix`, a $(B, P)$ tensor of target ids, makes sentence $b$'s output
#   start with row $b$'s tokens (padding where the search chooses), as fairseq's `prefix_tokens`
#   do: at step $t < P$ every other token is ruled out, and the forced tokens' log-probabilities
#   count in the score. The command line's `translate --prefix` and the page
#   [Translate and look inside](16_translate.md) use it.
#
# A test holds the translations of both functions identical to the chapter's on the first 200
# test sentences of each pair (`tests/test_decode.py`).

# %%
#| export batched_search
"""Greedy decoding and beam search over a batch of sentences: the decoding
chapter's searches, with padding, the finished sentences leaving the batch,
and a forced prefix."""

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from transformer.batched_step import BatchCache
from transformer.decode import (
    Hypothesis,
    forbid_specials,
    hypothesis,
    length_penalty,
)
from transformer.decode_options import DecodeOptions
from transformer.masking import padding_mask
from transformer.model import Transformer
from transformer.search_setup import (
    check_search,
    inference,
    sentence_output_limits,
)


def force_prefix(
    token_log_p: Tensor, prefix: Tensor | None, t: int, pad_id
) -> Tensor:
    """At step t, only the prefix's token where a row has one: token_log_p
    (n, ..., V) log-probabilities, prefix (n, P) ids for the n sentences
    going."""
    if prefix is None or t >= prefix.size(1):
        return token_log_p
    forced = prefix[:, t]  # (n,)
    rows = (forced != pad_id).view(
        -1, *[1] * (token_log_p.dim() - 1)
    )  # (n, 1...)
    vocab = torch.arange(token_log_p.size(-1), device=token_log_p.device)
    chosen = vocab == forced.view(rows.shape)  # (n, ..., V)
    return torch.where(rows & ~chosen, -torch.inf, token_log_p)


# %%
#| export batched_search
def batched_greedy_decode(
    model: Transformer,
    src: Tensor,
    options: DecodeOptions | None = None,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    prefix: Tensor | None = None,
) -> list[Hypothesis]:
    """The most probable next token at each step: src (B, S) token ids,
    padded with pad_id -> B hypotheses (score: log_prob), in batch order, of
    at most options.max_len tokens; prefix (B, P), if given, the tokens each
    output starts with."""
    specials = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
    check_search(model, src, prefix=prefix, **specials)
    max_len = (options or DecodeOptions()).max_len
    B, device = src.size(0), src.device
    if B == 0:
        return []
    with inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = sentence_output_limits(
            model, src, pad_id=pad_id, max_len=max_len
        )
        L = int(limits.max())
        cache = BatchCache(model, memory, src_mask, beams=1, length=L)
        # Row b: BOS, then sentence b's output, then padding once it has ended.
        ys = torch.full((B, L + 1), pad_id, device=device)
        ys[:, 0] = bos_id
        log_prob = torch.zeros(B, device=device)
        going = torch.arange(B, device=device)  # the sentences still going
        token = ys[:, :1]  # (n, 1): each sentence's newest
        for t in range(L):
            token_log_p = forbid_specials(cache.step(token), **specials)
            if prefix is not None:
                token_log_p = force_prefix(
                    token_log_p, prefix[going], t, pad_id
                )
            best, token = token_log_p.max(dim=-1)
            ys[going, t + 1] = token  # (n,): the n sentences still going
            log_prob[going] += best
            stays = (token != eos_id) & (t + 1 < limits)  # (n,)
            token = token[:, None]
            if not stays.all():  # the others leave the batch
                going, limits, token = (
                    going[stays],
                    limits[stays],
                    token[stays],
                )
                cache.keep(stays.nonzero()[:, 0], sentences=stays)
                if going.numel() == 0:
                    break
    return [
        hypothesis(ys[b, 1:], lp, lp, eos_id=eos_id, pad_id=pad_id)
        for b, lp in enumerate(log_prob.tolist())
    ]


# %% [markdown]
# `BeamStep` holds the beams of the sentences still searching after a step, and `_extend` makes
# the next step's from the log-probabilities of each beam's next token, with the pruning above.


# %%
#| export batched_search
@dataclass(frozen=True)
class BeamStep:
    """The K beams of the n sentences still searching after a step, best
    first: (n, K) each; `sentences` (n,) are their indices in the batch, and
    a beam's token is pad_id after its EOS."""

    step: int
    sentences: Tensor
    tokens: Tensor
    parents: Tensor
    log_probs: Tensor
    scores: Tensor
    ended: Tensor
    lengths: Tensor

    @staticmethod
    def first(B: int, K: int, device: torch.device) -> "BeamStep":
        """Before step 0: one open beam per sentence, not K copies of BOS."""
        log_probs = torch.full((B, K), -torch.inf, device=device)
        log_probs[:, 0] = 0.0
        zeros = torch.zeros(B, K, dtype=torch.long, device=device)
        sentences = torch.arange(B, device=device)
        return BeamStep(
            -1, sentences, zeros, zeros, log_probs, log_probs, zeros > 0, zeros
        )

    def select(self, stays: Tensor) -> "BeamStep":
        """The beams of the sentences that stay, (n,) booleans."""
        kept = [getattr(self, f.name)[stays] for f in fields(self)[1:]]
        return BeamStep(self.step, *kept)


def _extend(token_log_p, beams, t, limits, alpha, eos_id, pad_id) -> BeamStep:
    """Step t: the K best extensions of each sentence's K beams, given
    token_log_p (n, K, V), the log p of each beam's next token."""
    n, K, V = token_log_p.shape
    C = min(K, V)  # a beam's K most probable tokens are its K best candidates
    top, top_tokens = token_log_p.topk(C, dim=-1)  # (n, K, C)
    # An ended beam has one continuation, padding, which leaves its log p.
    ended = beams.ended[..., None]  # (n, K, 1)
    top[..., 0].masked_fill_(beams.ended, 0.0)
    top[..., 1:].masked_fill_(ended, -torch.inf)
    top_tokens = top_tokens.masked_fill(ended, pad_id)
    candidate_log_prob = beams.log_probs[..., None] + top  # (n, K, C)
    candidate_length = torch.where(beams.ended, beams.lengths, t + 1)  # (n, K)
    lp = length_penalty(candidate_length, alpha)[..., None]  # (n, K, 1)
    candidate_log_prob = candidate_log_prob.view(n, K * C)
    scores = (candidate_log_prob.view(n, K, C) / lp).view(n, K * C)
    scores, best = scores.topk(K, dim=-1)  # (n, K)
    parents, tokens = best // C, top_tokens.view(n, K * C).gather(1, best)
    ended = beams.ended.gather(1, parents) | (tokens == eos_id)
    return BeamStep(
        step=t,
        sentences=beams.sentences,
        tokens=tokens,
        parents=parents,
        log_probs=candidate_log_prob.gather(1, best),
        scores=scores,
        ended=ended | (t + 1 >= limits[:, None]),  # or stopped by the limit
        lengths=candidate_length.gather(1, parents),
    )


# %% [markdown]
# `BestEnded` is each sentence's best ended hypothesis, kept aside, and `_finished` the test for a
# sentence that no open beam can change.


# %%
#| export batched_search
@dataclass
class BestEnded:
    """Each sentence's best ended hypothesis so far, kept outside the beam:
    its score and log_prob (B,), and its row ys (B, L): BOS, its tokens, then
    padding."""

    score: Tensor
    log_prob: Tensor
    ys: Tensor

    @staticmethod
    def empty(
        B: int, L: int, pad_id: int, device: torch.device
    ) -> "BestEnded":
        nothing = torch.full((B,), -torch.inf, device=device)
        ys = torch.full((B, L), pad_id, dtype=torch.long, device=device)
        return BestEnded(nothing, nothing.clone(), ys)

    def update(self, beams: BeamStep, ys: Tensor) -> None:
        """Keep each sentence's best ended beam if it scores higher than the
        one kept; ys (n*K, t) holds the beams' rows."""
        going, (n, K) = beams.sentences, beams.ended.shape
        ended_scores = torch.where(beams.ended, beams.scores, -torch.inf)
        best, beam = ended_scores.max(dim=1)  # (n,)
        better = best > self.score[going]  # (n,)
        self.score[going] = torch.where(better, best, self.score[going])
        gained = beams.log_probs.gather(1, beam[:, None])[:, 0]  # (n,)
        self.log_prob[going] = torch.where(
            better, gained, self.log_prob[going]
        )
        row = ys[torch.arange(n, device=ys.device) * K + beam]  # (n, t)
        old = self.ys[going, : ys.size(1)]
        self.ys[going, : ys.size(1)] = torch.where(better[:, None], row, old)

    def hypotheses(self, *, eos_id: int, pad_id: int) -> list[Hypothesis]:
        return [
            hypothesis(row[1:], lp, score, eos_id=eos_id, pad_id=pad_id)
            for row, lp, score in zip(
                self.ys,
                self.log_prob.tolist(),
                self.score.tolist(),
                strict=True,
            )
        ]


def _finished(kept_score, beams, limits, alpha) -> Tensor:
    """The sentences whose kept score (n,) no open beam can overtake, at best
    log_prob / lp(limit): -> (n,)."""
    best_open = torch.where(beams.ended, -torch.inf, beams.log_probs).amax(1)
    reachable = best_open / length_penalty(limits, alpha)  # (n,)
    return (kept_score >= reachable) | (best_open == -torch.inf)


# %%
#| export batched_search
def batched_beam_search(
    model: Transformer,
    src: Tensor,
    options: DecodeOptions | None = None,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    prefix: Tensor | None = None,
    on_step: Callable[[BeamStep], None] | None = None,
) -> list[Hypothesis]:
    """Beam search with the length penalty, options' beam_size, alpha and
    max_len (default: the defaults): src (B, S) token ids, padded with pad_id
    -> each sentence's best hypothesis, in batch order. prefix (B, P), if
    given, the tokens each output starts with; on_step, if given, sees the
    beams after every step."""
    options = options or DecodeOptions()
    options.check_alpha(model.config.max_len)  # lp finite at its positions
    specials = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
    check_search(model, src, prefix=prefix, **specials)
    alpha, max_len = options.alpha, options.max_len
    B, K, device = src.size(0), options.beam_size, src.device
    if B == 0:
        return []
    with inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = sentence_output_limits(
            model, src, pad_id=pad_id, max_len=max_len
        )
        L = int(limits.max())
        # The K beams of sentence b are rows b*K ... b*K + K - 1.
        cache = BatchCache(model, memory, src_mask, beams=K, length=L)
        ys = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        beams = BeamStep.first(B, K, device)
        kept = BestEnded.empty(B, L + 1, pad_id, device)
        first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1)
        for t in range(L):
            token_log_p = cache.step(ys[:, -1:]).view(len(limits), K, -1)
            token_log_p = forbid_specials(token_log_p, **specials)  # (n, K, V)
            if prefix is not None:
                token_log_p = force_prefix(
                    token_log_p, prefix[beams.sentences], t, pad_id
                )
            beams = _extend(
                token_log_p, beams, t, limits, alpha, eos_id, pad_id
            )
            # Every beam continues the row of its parent: reorder, then append.
            rows = (first_row[: len(limits)] + beams.parents).view(-1)
            ys = torch.cat([ys[rows], beams.tokens.view(-1, 1)], dim=1)
            if (beams.tokens == eos_id).any() or (t + 1 >= limits).any():
                kept.update(beams, ys)  # only a beam that ends here can count
            if on_step is not None:
                on_step(beams)
            kept_score = kept.score[beams.sentences]
            stays = ~_finished(kept_score, beams, limits, alpha)  # (n,)
            if stays.all():
                cache.keep(rows)
                continue
            # Finished sentences leave, with their K rows.
            beams, limits = beams.select(stays), limits[stays]
            keep = stays.repeat_interleave(K).nonzero()[:, 0]  # (n'*K,)
            ys = ys[keep]
            cache.keep(rows[keep], sentences=stays)  # one copy for both
            if not stays.any():
                break
    return kept.hypotheses(eos_id=eos_id, pad_id=pad_id)


# %% [markdown]
# ## Where the time goes
#
# `python -m experiments.decode_bench --profile` runs PyTorch's profiler over the decoding of
# the first 96 test sentences, 32 at a time, on the two CPU threads of the speed table in
# [Deploying with CTranslate2](a09_ctranslate2.ipynb), and sorts each operation's time into
# groups; "Python" is the time between operations. The table gives each group's milliseconds
# on the decoding chapter's step (before, `decode-cpu-before.json`) and on `BatchCache`
# (after, `decode-cpu.json`), scaled to the time the decoding takes without the profiler.

# %% tags=["hide-input"]
import json

import pandas as pd

from transformer.paths import HOME

benchmarks = HOME / "experiments" / "benchmarks"
runs = {
    when: json.loads((benchmarks / name).read_text())
    for when, name in [
        ("before", "decode-cpu-before.json"),
        ("after", "decode-cpu.json"),
    ]
}
profile = pd.DataFrame(
    {
        (decoding, when): pd.Series(run["profile"][decoding])
        * (1000 * run["profile_seconds"][decoding])
        for decoding in runs["after"]["profile"]
        for when, run in runs.items()
    }
).fillna(0.0)
profile.loc["total"] = profile.sum()
assert {run["machine"] for run in runs.values()} == {runs["after"]["machine"]}
print(f"{runs['after']['machine']}, {runs['after']['threads']} threads; ms")
for decoding in runs["after"]["profile"]:
    before, after = (runs[when]["profile"][decoding] for when in runs)
    top = max(after, key=after.get)
    print(
        f"{decoding}: the largest group, {top}, takes"
        f" {before[top]:.0%} before and {after[top]:.0%} after"
    )
profile.round(0).astype(int)


# %% [markdown]
# What to see: no group dominates, before or after; the largest holds a fifth to a third of
# the time, so what is left is many small products and copies per step, each with its call's cost.
# The two runs met different loads on a shared machine: trust the shares here, and the speed
# against CTranslate2 in the appendix [Deploying with CTranslate2](a09_ctranslate2.ipynb),
# which is measured side by side in one run.

# %% [markdown]
# ## Loading a shipped model
#
# The book ships two models trained by Part II's recipe, German→English and French→English, in
# `checkpoints/de-en` and `checkpoints/fr-en`. `load_pair_model` loads one with its tokenizer (or
# any model folder given as `checkpoint`), and says in one line what is wrong with a folder that
# does not hold a whole model of the pair.

# %%
#| export
"""Translating text with a trained model: sentences in, translations out, in
batches of similar lengths, and the shipped models loaded by language pair."""

import re
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from transformer.batched_search import (
    batched_beam_search,
    batched_greedy_decode,
)
from transformer.checkpoint import CheckpointError, load_model
from transformer.decode import Hypothesis
from transformer.decode_options import DecodeOptions, with_changes
from transformer.knockout import KnockOut, knocked_out
from transformer.model import Transformer
from transformer.multi30k import parse_pair
from transformer.paths import CHECKPOINTS_DIR, HOME_VARIABLE
from transformer.tokenizer import Tokenizer, normalize


def load_pair_model(
    pair: str,
    checkpoint: str | Path | None = None,
    *,
    device: str | torch.device = "cpu",
) -> tuple[Transformer, Tokenizer]:
    """The model (eval mode) and tokenizer that translate `pair` ("de-en" or
    "fr-en"): those of the folder `checkpoint`, a shipped model or a training
    checkpoint, or by default the shipped model CHECKPOINTS_DIR / pair.

    Raises CheckpointError, one line that names the folder, if it is missing
    (for the default folder: how to train a model), does not load, or holds a
    model of another pair.
    """
    languages = parse_pair(pair)
    folder = CHECKPOINTS_DIR / pair if checkpoint is None else Path(checkpoint)
    if not folder.is_dir():
        if checkpoint is None:
            raise CheckpointError(
                f"no {pair} model in {folder}: set {HOME_VARIABLE} to the"
                f" folder that holds checkpoints/{pair} (a clone of the"
                " book's repository), name a model folder with --checkpoint"
                f" DIR, or train one with `python -m transformer train --pair"
                f" {pair} --export {folder}`"
            )
        raise CheckpointError(f"no model folder {folder}")
    try:
        model, tokenizer = load_model(folder, device=device)
    # Not a whole, readable model, whatever the reason: say why.
    except Exception as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if str(folder) not in message:
            message = f"{folder}: {message}"
        raise CheckpointError(f"cannot load the model: {message}") from err
    if tokenizer.languages != languages:
        raise CheckpointError(
            f"{folder} holds a {tokenizer.pair} model, not a {pair} one"
        )
    return model, tokenizer


# %%
from transformer.checkpoint import CheckpointError
from transformer.translation import CHECKPOINTS_DIR, load_pair_model

model, tokenizer = load_pair_model("de-en")
for folder in ("no/such/folder", CHECKPOINTS_DIR / "fr-en"):
    try:
        load_pair_model("de-en", folder)
    except CheckpointError as err:
        print(str(err).replace(str(CHECKPOINTS_DIR), "checkpoints"))

# %% [markdown]
# ## Translating sentences
#
# `translate` takes sentences and returns their translations, in the same order:
#
# - **The training's text processing.** The data chapter's tokenizer cuts each sentence into BPE
#   pieces, the encoder gets `x <eos>` as in training, and the output ids are decoded into text.
# - **Batched by length.** The sentences are sorted by length, longest first, and decoded
#   `batch_size` at a time, so that batches hold little padding; a sentence decodes the same in
#   any batch.
# - **Empty sentences** give empty translations without reaching the model. **Unknown
#   characters** (an emoji, a Chinese character) become `<unk>`.
# - **Too long.** The model has `config.max_len` positions, so a longer source is cut to its
#   first `max_len - 1` tokens and EOS. `warn`, if given, is told about those and about
#   translations the length limit stopped before EOS.
#
# `translate_batches` does all but the search, around any decoder of batches of ids: the
# appendix [Deploying with CTranslate2](a09_ctranslate2.ipynb) hands it another engine's.

# %%
#| export


def length_sorted_batches(
    lengths: Sequence[int], batch_size: int
) -> list[list[int]]:
    """The indices 0 … n-1 of n sentences in batches of at most batch_size,
    longest first (ties in input order), so that each batch holds sentences of
    similar lengths."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [
        order[i : i + batch_size] for i in range(0, len(order), batch_size)
    ]


def _listed(items: list[str], most: int = 10) -> str:
    """'a', 'a and b', 'a, b and c', '… and 3 more'."""
    if len(items) > most:
        return f"{', '.join(items[:most])} and {len(items) - most} more"
    return (
        items[0]
        if len(items) == 1
        else f"{', '.join(items[:-1])} and {items[-1]}"
    )


def _sentences(indices: list[int]) -> str:
    """'sentence 3' or 'sentences 3, 8 and 12' for indices 2, 7, 11: numbered
    from 1, as lines are."""
    noun = "sentence" if len(indices) == 1 else "sentences"
    return f"{noun} {_listed([str(i + 1) for i in indices])}"


# %% [markdown]
# Five sentences of 3, 9, 1, 4 and 9 tokens, in batches of two: the two of 9 tokens share the
# first batch, in their input order, and the shortest is last, alone.

# %%
from transformer.translation import length_sorted_batches

batches = length_sorted_batches([3, 9, 1, 4, 9], batch_size=2)
print(batches)
assert batches == [[1, 4], [3, 0], [2]]
assert sorted(
    i for b in length_sorted_batches(range(10), 3) for i in b
) == list(range(10))


# %% [markdown]
# ## A text in sentences
#
# The models learned from single captions: given a paragraph, they translate its first sentence
# and stop. `split_sentences` cuts a text into sentences by one rule: **a sentence ends after
# `.`, `!`, `?` or `…` (or a run of them, as `...` or `?!`) and any closing quotes or brackets
# right after, where a space and then an upper-case letter or an opening quote follow, except a
# single full stop after a number (`am 3. Mai`), a single letter (`z. B.`, `J. Smith`) or a
# title in `TITLES` (`Dr.`, `Mme`).** The text is normalised first, as the tokenizer does, so
# any run of white space counts as one space. `3.5` has no space after its stop, and stays
# whole. The translator page splits by the same rule, in its own JavaScript.

# %%
#| export
ENDS = ".!?…"  # the punctuation that ends a sentence
CLOSING = "\"'”’“»«›‹)]"  # quotes and brackets that close before the space
OPENING = "\"'“‘„‚«‹"  # quotes that open a sentence
# Titles before a name, whose full stop ends no sentence (German, French,
# English).
TITLES = frozenset({"Dr", "Prof", "Hr", "Fr", "St", "Mr", "Mrs", "Ms", "Mme"})
# A run of ENDS (group 1), any CLOSING and the space before the next sentence.
SENTENCE_END = re.compile(
    f"([{re.escape(ENDS)}]+)[{re.escape(CLOSING)}]* (?=\\S)"
)


def _ends_sentence(text: str, end: re.Match) -> bool:
    """Whether a match of SENTENCE_END ends a sentence: the next one starts
    with an upper-case letter or an opening quote, and a single full stop
    follows no title, letter or number."""
    after = text[end.end()]
    if after not in OPENING and unicodedata.category(after) != "Lu":
        return False
    if end.group(1) != ".":
        return True
    start = end.start()  # the word before the stop: its letters and digits
    while start and (text[start - 1].isalpha() or text[start - 1].isdecimal()):
        start -= 1
    word = text[start : end.start()]
    return not (len(word) == 1 or word.isdecimal() or word in TITLES)


def split_sentences(text: str) -> list[str]:
    """The sentences of `text`, normalised as the tokenizer does, by the rule
    above: [] for a text of white space only."""
    text = normalize(text)
    ends = [m for m in SENTENCE_END.finditer(text) if _ends_sentence(text, m)]
    starts = [0] + [m.end() for m in ends]
    stops = [m.end() - 1 for m in ends] + [len(text)]  # before the space
    return [text[a:b] for a, b in zip(starts, stops, strict=True) if b > a]


# %% [markdown]
# The rule on six texts: two sentences; an abbreviation, an ordinal and a decimal, in one;
# a quoted sentence, then another; an ellipsis; a title; no final stop.

# %%
from transformer.translation import split_sentences

texts = [
    "Ein Hund rennt. Eine Katze schläft!",
    "Das ist z. B. am 3. Mai um 3.5 Uhr.",
    "Er ruft: „Komm!“ Dann geht er.",
    "Il attend... Puis il part ?",
    "Dr. Müller und Mme. Dupont lachen",
    "   ",
]
for text in texts:
    print(split_sentences(text))
assert [len(split_sentences(t)) for t in texts] == [2, 1, 2, 2, 1, 0]


# %%
#| export
def translate(
    model: Transformer,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    options: DecodeOptions | None = None,
    *,
    prefix: str = "",
    warn: Callable[[str], None] | None = None,
    by_sentence: bool = False,
    knock_out: KnockOut | str | None = None,
    **changes,
) -> list[str]:
    """Translations of `sentences`, in their order: beam search, or greedy
    decoding, as `options` say (default: DecodeOptions(); `changes` such as
    beam_size=1 change them), over batches of similar lengths, on the model's
    device; each starts with `prefix`, text in the target language, if given.
    With `by_sentence`, each text is cut by split_sentences, each of its
    sentences translated (with the prefix) and the translations joined by a
    space. With `knock_out`, the model runs with those parts switched off
    (`knocked_out`), and its weights are restored after.

    An empty sentence translates to "". A source longer than the model's
    positions is cut to its first config.max_len - 1 tokens, then <eos>;
    `warn`, if given, is told about those and about translations that the
    length limit stopped before <eos>. Needs spaCy (to cut the sentences into
    words) unless every sentence is empty.
    """
    options = with_changes(options, **changes)
    special = {
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
    }
    device = next(model.parameters()).device
    forced = tokenizer.encode(prefix, tokenizer.languages[1]) if prefix else []

    def decode_batch(sources: list[list[int]]) -> list[Hypothesis]:
        src = torch.full(
            (len(sources), len(sources[0])), tokenizer.pad_id, dtype=torch.long
        )  # (B, S): the longest first
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(device)
        start = torch.tensor([forced] * len(sources), dtype=torch.long)
        start = start.to(device) if forced else None  # (B, P) or None
        search = (
            batched_greedy_decode if options.greedy else batched_beam_search
        )
        return search(model, src, options, prefix=start, **special)

    with knocked_out(model, knock_out):
        return translate_batches(
            decode_batch,
            tokenizer,
            sentences,
            max_len=model.config.max_len,
            batch_size=options.batch_size,
            warn=warn,
            by_sentence=by_sentence,
        )


def translate_batches(
    decode_batch: Callable[[list[list[int]]], list[Hypothesis]],
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    *,
    max_len: int,
    batch_size: int,
    warn: Callable[[str], None] | None = None,
    by_sentence: bool = False,
) -> list[str]:
    """`translate` around any decoder of id batches (the package's, or another
    engine's): `decode_batch` takes sources as ids with their <eos>, longest
    first, and returns their hypotheses; max_len is the model's number of
    positions, batch_size the sentences of a batch. A warning names a text by
    its number in `sentences`, split or not."""
    if isinstance(sentences, str):
        raise TypeError(
            "translate takes a sequence of sentences, not one string"
        )
    if by_sentence:  # owner[i]: the number of the text that texts[i] is from
        split = [split_sentences(s) for s in sentences]
        owner = [n for n, parts in enumerate(split) for _ in parts]
        texts = [part for parts in split for part in parts]
    else:
        texts = [normalize(s) for s in sentences]
        owner = list(range(len(texts)))
    todo = [i for i, text in enumerate(texts) if text]  # empty ones stay ""
    encoded = tokenizer.encode_batch([texts[i] for i in todo]) if todo else []
    room = max_len - 1  # source tokens that fit with their <eos>
    with_eos = {i: len(ids) + 1 for i, ids in zip(todo, encoded, strict=True)}
    too_long = {i: n for i, n in with_eos.items() if n > max_len}
    if too_long and warn is not None:
        sizes = _listed([str(n) for n in too_long.values()])
        named = sorted({owner[i] for i in too_long})
        warn(
            f"{_sentences(named)}: {sizes} tokens with <eos>, more"
            f" than the model's {max_len} positions: translating the first"
            f" {room}"
        )
    sources = [ids[:room] + [tokenizer.eos_id] for ids in encoded]
    results = [""] * len(texts)
    cut_off = []
    for batch in length_sorted_batches([len(s) for s in sources], batch_size):
        found = decode_batch([sources[j] for j in batch])
        for j, best in zip(batch, found, strict=True):
            results[todo[j]] = tokenizer.decode(best.tokens)
            if not best.ended:
                cut_off.append(todo[j])
    if cut_off and warn is not None:
        warn(
            f"{_sentences(sorted({owner[i] for i in cut_off}))}: the"
            " translation stopped at the length limit, before <eos>"
        )
    if by_sentence:
        joined = [[] for _ in sentences]
        for n, result in zip(owner, results, strict=True):
            joined[n].append(result)
        results = [" ".join(parts) for parts in joined]
    return results


# %% [markdown]
# Three sentences, one empty and one longer than the model's 512 positions, translated greedily:
# the empty one stays empty, the long one is cut, and `warn` says so.

# %% tags=["nbval-ignore-output"]
from transformer.translation import translate

long = " ".join(["Ein Hund läuft durch den Schnee."] * 90)
warnings = []
found = translate(
    model,
    tokenizer,
    ["Zwei Hunde spielen im Schnee.", "", long],
    beam_size=1,
    warn=warnings.append,
)
print(found[:2], f"and {len(found[2].split())} words")
print("\n".join(warnings))
assert found[1] == "" and "more than the model's 512 positions" in warnings[0]

# %% [markdown]
# A text of two sentences, translated whole and with `by_sentence=True`: whole, the model
# translates its first sentence and stops; by sentence, each is translated, and the two
# translations are joined by a space.

# %%
text = "Ein Hund rennt über die Wiese. Zwei Kinder spielen im Sand."
whole, each = (
    translate(model, tokenizer, [text], beam_size=1, by_sentence=by)[0]
    for by in (False, True)
)
print(f"whole:       {whole}\nby sentence: {each}")
parts = translate(model, tokenizer, split_sentences(text), beam_size=1)
assert each == " ".join(parts) and len(whole) < len(each)

# %% [markdown]
# ## Translating a split
#
# `translate_split` translates the source side of a Multi30k split (or its first `limit`
# sentences) with `translate`, and times it; `write_lines` saves translations one per line,
# atomically, so that an interrupted run never leaves half a file.

# %%
#| export split_translation
"""A Multi30k split translated: its translations timed, and written one per
line."""

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from transformer.atomic import atomic_write
from transformer.checked_data import load_pairs
from transformer.decode_options import DecodeOptions, with_changes
from transformer.model import Transformer
from transformer.multi30k import parse_pair
from transformer.paths import DATA_DIR
from transformer.tokenizer import Tokenizer
from transformer.translation import translate


@dataclass(frozen=True)
class SplitTranslations:
    """The sources and references of (part of) a split, a model's translations
    of the sources, and the wall-clock seconds that the translation took."""

    pair: str
    split: str
    sources: list[str]
    references: list[str]
    hypotheses: list[str]
    seconds: float

    @property
    def sentences_per_second(self) -> float:
        return len(self.sources) / self.seconds


def translate_split(
    model: Transformer,
    tokenizer: Tokenizer,
    pair: str,
    split: str = "test_2016_flickr",
    options: DecodeOptions | None = None,
    *,
    data_dir: Path = DATA_DIR,
    limit: int | None = None,
    warn: Callable[[str], None] | None = None,
    **changes,
) -> SplitTranslations:
    """Translate the first `limit` sentences (default: all) of a Multi30k split
    with `transformer.translation.translate` and `options` (default:
    the defaults; `changes` such as beam_size=1 change them), and time it."""
    options = with_changes(options, **changes)
    if tokenizer.languages != parse_pair(pair):
        raise ValueError(f"the model translates {tokenizer.pair}, not {pair}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be at least 1, got {limit}")
    pairs = load_pairs(split, pair, data_dir)[:limit]
    sources = [source for source, _ in pairs]
    if sources:
        # spaCy loads its rules on first use: not part of the timing
        tokenizer.encode(sources[0])
    started = time.perf_counter()
    hypotheses = translate(model, tokenizer, sources, options, warn=warn)
    seconds = time.perf_counter() - started
    return SplitTranslations(
        pair=pair,
        split=split,
        sources=sources,
        references=[reference for _, reference in pairs],
        hypotheses=hypotheses,
        seconds=seconds,
    )


def write_lines(path: Path, lines: Sequence[str]) -> None:
    """Write one line per item, UTF-8, atomically (a temporary file beside
    `path`, synced to disk, then renamed): a failed write leaves the old file
    as it was."""
    atomic_write(
        Path(path), "".join(f"{line}\n" for line in lines).encode("utf-8")
    )


# %% [markdown]
# The first 20 sentences of the validation split:

# %% tags=["nbval-ignore-output"]
from transformer.split_translation import translate_split

few = translate_split(model, tokenizer, "de-en", "val", limit=20)
print(f"{len(few.hypotheses)} sentences, {few.seconds:.1f} s")
print(few.sources[0], "->", few.hypotheses[0])
