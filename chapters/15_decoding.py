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
# # Decoding: greedy search, beam search and a key/value cache
#
# A trained Transformer does not translate by itself. Given a source sentence $X$ and the first
# $t-1$ tokens of an output, it gives a probability to every possible next token,
# $p(y_t \mid y_{<t}, X)$, and the probability of a whole output $Y = (y_1, \dots, y_n)$, whose
# last token is the end-of-sentence token EOS, is the product of those:
#
# $$
# \log p(Y \mid X) = \sum_{t=1}^{n} \log p(y_t \mid y_{<t}, X).
# $$
#
# Translating means finding an output with a high probability; with $V^n$ outputs of length $n$,
# *decoding* can only search approximately. The paper's recipe is short (Section 6.1)
# {cite:p}`vaswani2017attention`: "we used beam search with a beam size of 4 and length penalty
# $\alpha = 0.6$", the length penalty of Google's neural machine translation system
# {cite:p}`wu2016google`, and "we set the maximum output length during inference to input
# length + 50, but terminate early when possible."
#
# This chapter writes `transformer.decode`: greedy decoding, a key/value cache, beam search with
# the length penalty, and `translate`, text in and text out. We try the search on a tiny model
# trained here on the CPU to reverse strings of letters, whose right answers we know, and end by
# translating with the book's trained models.

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
#| default_exp decode

# %%
import copy
import time

import altair as alt
import pandas as pd
import torch
from IPython.display import display

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)
# The models of this chapter are tiny: one thread runs them fastest.
torch.set_num_threads(1)

# %% [markdown]
# ## A model to decode
#
# The source is a random string of 3 to 10 letters from *a* to *j*, the target the same string
# reversed; $V = 13$ tokens: padding, BOS (the decoder's first input), EOS and the ten letters.
# Like translation, reversal needs attention from each output position to the right source
# position.
#
# The model is the `small` preset shrunk to $d_\text{model} = 64$, $H = 4$ heads, 2 layers and
# $d_{ff} = 256$, without dropout (every batch is fresh random data). It trains for 600 steps of 64
# strings with Part II's label-smoothed loss and schedule (scaled by `factor=0.25`: at higher rates
# this small model's loss spikes now and then). We also keep a copy from step 150, a *half-trained*
# model: search matters most when the model is unsure.

# %%
from transformer.config import TransformerConfig
from transformer.loss import LabelSmoothingLoss
from transformer.masking import padding_mask, target_mask
from transformer.model import Transformer
from transformer.schedule import make_optimizer

letters = "abcdefghij"
pad_id, bos_id, eos_id = 0, 1, 2
ids = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
V = 3 + len(letters)


def reversal_batch(n: int, shortest: int, longest: int, generator=None):
    """n random strings and their reversals: src (n, S), decoder input and
    labels (n, S + 1)."""
    lengths = torch.randint(shortest, longest + 1, (n,), generator=generator)
    S = int(lengths.max())
    src = torch.full((n, S), pad_id)
    tgt_in = torch.full((n, S + 1), pad_id)
    labels = torch.full((n, S + 1), pad_id)
    for i, length in enumerate(lengths.tolist()):
        string = torch.randint(3, V, (length,), generator=generator)
        src[i, :length] = string
        tgt_in[i, 0], tgt_in[i, 1 : length + 1] = bos_id, string.flip(0)
        labels[i, :length], labels[i, length] = string.flip(0), eos_id
    return src, tgt_in, labels


def spell(tokens: list[int]) -> str:
    return "".join(letters[t - 3] for t in tokens)


config = TransformerConfig.small(
    vocab_size=V,
    d_model=64,
    n_heads=4,
    n_layers=2,
    d_ff=256,
    dropout=0.0,
    max_len=128,
)
model = Transformer(config)
optimizer, scheduler = make_optimizer(
    model, d_model=64, warmup=100, factor=0.25
)
criterion = LabelSmoothingLoss(pad_id=pad_id, smoothing=0.1)
losses = []
started = time.perf_counter()
for step in range(1, 601):
    src, tgt_in, labels = reversal_batch(64, 3, 10)
    log_probs = model(
        src,
        tgt_in,
        src_mask=padding_mask(src, pad_id),
        tgt_mask=target_mask(tgt_in, pad_id),
    )  # (B, T, V)
    loss = criterion(log_probs, labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
    losses.append(loss.item())
    if step == 150:
        half_trained = copy.deepcopy(model).eval()
model.eval()
training_seconds = time.perf_counter() - started

# %% tags=["nbval-ignore-output"]
print(
    f"trained in {training_seconds:.0f} s; loss over the last 50 steps"
    f" {sum(losses[-50:]) / 50:.3f}"
)
assert sum(losses[-50:]) < 0.2 * sum(losses[:50])

# %% [markdown]
# The strings to decode: 200 new ones of the lengths seen in training. (The numbers printed from
# here on depend on the CPU that trained the weights; the assertions are loose.)

# %%
test_src, _, _ = reversal_batch(200, 3, 10, torch.Generator().manual_seed(1))
references = [spell(s[s != pad_id].flip(0).tolist()) for s in test_src]
test_src.shape

# %% [markdown]
# ## Greedy decoding
#
# The simplest search takes the most probable token at each step and feeds it back as the next
# input, until the model outputs EOS:
#
# $$
# y_t = \operatorname*{arg\,max}_{v}\ p(v \mid y_{<t}, X).
# $$
#
# It decodes a batch of $B$ sentences at once, one step for all of them:
#
# - **The length limit.** A sentence may output its source length + 50 tokens, EOS included, as
#   in the paper, and never more than the model's positions (`config.max_len`). A sentence
#   stopped by the limit has no EOS: its `Hypothesis` says `ended=False`.
# - **Ended sentences leave the batch.** After EOS a sentence's row is dropped, with its
#   memory and its cached keys and values, so the later steps compute only the sentences still
#   going; its output is padded to the batch's width. A sentence decodes the same whatever else
#   is in its batch.
# - **Padding and BOS are never output**: their log-probabilities are set to $-\infty$ before the
#   choice. The others are not renormalised.
# - **No dropout**: the model is put in evaluation mode for the search, and back afterwards.
#
# Each step needs the decoder's output at the last position of every row. The decoder can run
# again over the whole output so far under the causal mask, or read only the newest token and
# keep what it needs of the others in a cache (`use_cache`, the next section).

# %%
#| export
"""Greedy decoding and beam search with a key/value cache (Section 6.1 of
Vaswani et al., 2017, with the length penalty of Wu et al., 2016), and
translating text with a trained model."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.decoder import DecoderCache
from transformer.masking import causal_mask, padding_mask
from transformer.model import Transformer

EXTRA_LENGTH = (
    50  # "maximum output length ... input length + 50" (Section 6.1)
)


@dataclass(frozen=True)
class Hypothesis:
    """One decoded sentence.

    tokens: the output ids, without BOS and EOS. log_prob: log p(output |
    source), summed over the tokens and the final EOS, if any. score: what the
    search maximised: log_prob / lp(length) for beam search, log_prob for
        greedy decoding.
    ended: True if the output ended with EOS, False if the length limit cut it
    off.
    """

    tokens: list[int]
    log_prob: float
    score: float
    ended: bool


def output_limits(
    model: Transformer, src: Tensor, *, pad_id: int, max_len: int | None = None
) -> Tensor:
    """The most tokens each sentence may output, EOS included: (B, S) -> (B,).

    Each source's length (its non-padding tokens) + 50, as in the paper, or
    max_len if given; never more than the positions of the model's positional
    encoding (config.max_len).
    """
    if max_len is None:
        limits = (src != pad_id).sum(dim=1) + EXTRA_LENGTH  # (B,)
    else:
        if max_len < 1:
            raise ValueError(f"max_len must be at least 1, got {max_len}")
        limits = torch.full((src.size(0),), max_len, device=src.device)  # (B,)
    return limits.clamp(max=model.config.max_len)


# %%
#| export
def _check_src(src: Tensor, pad_id: int) -> None:
    """A batch of sources must be a (B, S) tensor of token ids, each row with a
    real token."""
    if src.dim() != 2 or src.dtype != torch.long:
        raise ValueError(
            "src must be a (B, S) tensor of token ids (torch.long), got shape "
            f"{tuple(src.shape)} and {src.dtype}"
        )
    if src.size(1) == 0:
        raise ValueError(
            "src has no positions: encode each source with its <eos>"
        )
    # A row of padding alone would be decoded from a memory the mask hides
    # entirely.
    empty = (src == pad_id).all(dim=1)  # (B,)
    if empty.any():
        raise ValueError(
            f"src row {int(empty.nonzero()[0])} is all padding: encode each"
            " source with its <eos>"
        )


def _check_ids(*, bos_id: int, eos_id: int, pad_id: int) -> None:
    if pad_id in (bos_id, eos_id):
        raise ValueError(
            f"pad_id ({pad_id}) must differ from bos_id ({bos_id}) and eos_id"
            f" ({eos_id}): an ended sentence is recognised by its padding"
        )


@contextmanager
def _inference(model: Transformer) -> Iterator[None]:
    """No gradients and no dropout; the model's training mode is restored
    afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def _next_log_probs(
    model: Transformer,
    ys: Tensor,
    memory: Tensor,
    src_mask: Tensor,
    cache: DecoderCache | None,
) -> Tensor:
    """log p(next token | ys, source) for every row: ys (N, t) -> (N, V)."""
    if cache is None:
        # The whole output so far again, under the causal mask: t positions at
        # step t.
        mask = causal_mask(ys.size(1), device=ys.device)  # (1, 1, t, t)
        out = model.decode(ys, memory, src_mask=src_mask, tgt_mask=mask)
    else:
        # The newest token only: the cache holds the keys and values of the
        # others, and a single query at the end of the sequence may see all of
        # them, so there is no mask.
        out = model.decode(
            ys[:, -1:], memory, src_mask=src_mask, tgt_mask=None, cache=cache
        )
    return model.generator(out[:, -1])  # (N, V)


def _forbid_specials(
    log_probs: Tensor, *, bos_id: int, eos_id: int, pad_id: int
) -> Tensor:
    """Padding and BOS (unless it doubles as EOS) are not outputs: never choose
    them."""
    log_probs[..., pad_id] = float("-inf")
    if bos_id != eos_id:
        log_probs[..., bos_id] = float("-inf")
    return log_probs


def _hypothesis(
    row: Tensor, log_prob: float, score: float, *, eos_id: int, pad_id: int
) -> Hypothesis:
    """The output of one decoded row (without its BOS): the tokens before EOS
    or padding."""
    tokens = row.tolist()
    ended = eos_id in tokens
    for stop in (eos_id, pad_id):
        if stop in tokens:
            tokens = tokens[: tokens.index(stop)]
    return Hypothesis(
        tokens=tokens, log_prob=log_prob, score=score, ended=ended
    )


def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len: int | None = None,
    use_cache: bool = True,
) -> list[Hypothesis]:
    """The most probable next token at each step, for a batch of sentences at
    once.

    Shapes:
        src: (B, S) token ids, padded with pad_id
        returns B hypotheses, in the order of the batch (their score is their
            log_prob)
    """
    _check_ids(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    _check_src(src, pad_id)
    B = src.size(0)
    if B == 0:
        return []
    with _inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = output_limits(
            model, src, pad_id=pad_id, max_len=max_len
        )  # (B,)
        cache = (
            DecoderCache.empty(len(model.decoder.layers))
            if use_cache
            else None
        )
        # Row b: BOS, then sentence b's output, then padding once it has ended.
        ys = torch.full((B, int(limits.max()) + 1), pad_id, device=src.device)
        ys[:, 0] = bos_id
        log_prob = torch.zeros(B, device=src.device)
        going = torch.arange(
            B, device=src.device
        )  # the sentences still decoding
        for t in range(int(limits.max())):
            step = _next_log_probs(
                model, ys[going, : t + 1], memory, src_mask, cache
            )
            step = _forbid_specials(
                step, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id
            )
            best, token = step.max(
                dim=-1
            )  # (n,) for the n sentences still going
            ys[going, t + 1] = token
            log_prob[going] += best
            stays = (token != eos_id) & (t + 1 < limits)  # (n,)
            if not stays.all():
                # A sentence that has ended leaves the batch: the next steps
                # compute the others only, and its row of ys keeps its padding.
                going, limits = going[stays], limits[stays]
                memory, src_mask = memory[stays], src_mask[stays]
                if cache is not None:
                    cache.reorder(stays.nonzero()[:, 0])
                if going.numel() == 0:
                    break
    return [
        _hypothesis(ys[b, 1:], lp, lp, eos_id=eos_id, pad_id=pad_id)
        for b, lp in enumerate(log_prob.tolist())
    ]


# %% [markdown]
# The first few strings, decoded greedily by the trained model:

# %% tags=["nbval-ignore-output"]
from transformer.decode import greedy_decode

greedy = greedy_decode(model, test_src, **ids)
pd.DataFrame(
    {
        "source": [spell(s[s != pad_id].tolist()) for s in test_src[:6]],
        "greedy output": [spell(h.tokens) for h in greedy[:6]],
        "ended with EOS": [h.ended for h in greedy[:6]],
        "log p(Y | X)": [round(h.log_prob, 4) for h in greedy[:6]],
    }
)


# %%
def exact(hypotheses) -> float:
    """The share of outputs that are exactly the reversed source."""
    return sum(
        spell(h.tokens) == r
        for h, r in zip(hypotheses, references, strict=True)
    ) / len(references)


greedy_half = greedy_decode(half_trained, test_src, **ids)
assert exact(greedy) > 0.8

# %% tags=["nbval-ignore-output"]
print(
    f"exactly right, greedy: trained {exact(greedy):.1%}, half-trained"
    f" {exact(greedy_half):.1%}"
)

# %% [markdown]
# (kv-cache-decoding)=
# ## The key/value cache
#
# Without a cache, step $t$ runs the decoder over all $t$ positions of the output so far to use
# the last one's output. The causal mask guarantees that the other $t - 1$ have not changed since
# earlier steps, and the new position needs only their keys and values in each self-attention
# layer. So keep those: the multi-head attention chapter's `KVCache` appends the new position's key and value at each step, and the new query attends over
# all the cached ones. A single query at the end of the sequence may see every earlier position,
# so no mask is needed; the new token is embedded at position $t$ (the `start` argument of the
# positional encoding). The encoder–decoder attention has a cache too: its keys and values are
# projections of the encoder's memory, which does not change while a sentence is decoded, so they
# are computed once (a *static* cache). The decoder chapter's `DecoderCache` holds both caches of
# every layer, and `Transformer.decode(..., cache=cache)` reads only the new tokens.
#
# The saving: to output $T$ tokens, the decoder processes $1 + 2 + \dots + T = T(T+1)/2$
# positions without a cache and $T$ with one. The projections and feed-forward networks cost the
# same per position and dominate at sentence lengths, so that work drops from $O(T^2)$ to $O(T)$,
# for $2\, n_\text{layers} (T + S)\, d_\text{model}$ numbers of memory per sentence.
#
# The two ways give the same outputs:

# %%
uncached = greedy_decode(model, test_src, **ids, use_cache=False)
assert [h.tokens for h in uncached] == [h.tokens for h in greedy]
gap = max(
    abs(a.log_prob - b.log_prob) for a, b in zip(greedy, uncached, strict=True)
)
assert gap < 1e-4
print("the same 200 outputs with and without the cache")

# %% [markdown]
# A hook on the decoder counts the rows and positions it processes at each step, for the 200
# strings at once (the rows shrink as strings end and leave the batch):


# %% tags=["nbval-ignore-output"]
def decoder_shapes(use_cache: bool) -> list[tuple[int, int]]:
    """(rows, length) of the decoder's input at each greedy step."""
    shapes = []
    hook = model.decoder.register_forward_pre_hook(
        lambda module, args: shapes.append(tuple(args[0].shape[:2]))
    )
    try:
        greedy_decode(model, test_src, **ids, use_cache=use_cache)
    finally:
        hook.remove()
    return shapes


cached, uncached_shapes = decoder_shapes(True), decoder_shapes(False)
rows = [n for n, _ in cached]
assert [
    n for n, _ in uncached_shapes
] == rows  # the same strings at every step
assert all(length == 1 for _, length in cached)  # the newest token only
assert [length for _, length in uncached_shapes] == list(
    range(1, len(rows) + 1)
)
n_steps = len(rows)
with_cache = [n * length for n, length in cached]
without_cache = [n * length for n, length in uncached_shapes]
print(
    f"{n_steps} steps: {sum(with_cache):,} positions with the cache,"
    f" {sum(without_cache):,} without"
    f" ({sum(without_cache) / sum(with_cache):.1f} times as many)"
)

# %% [markdown]
# And the time on this machine's CPU, the best of three runs each (it varies from run to run; the
# outputs do not):


# %% tags=["nbval-ignore-output"]
def best_time(function, repeats: int = 3) -> float:
    """The shortest of `repeats` wall-clock times of function(), in seconds."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        times.append(time.perf_counter() - started)
    return min(times)


cached_seconds = best_time(lambda: greedy_decode(model, test_src, **ids))
uncached_seconds = best_time(
    lambda: greedy_decode(model, test_src, **ids, use_cache=False)
)
print(
    f"greedy, 200 strings: with the cache {cached_seconds * 1000:.0f} ms, "
    f"without {uncached_seconds * 1000:.0f} ms"
)
assert cached_seconds < uncached_seconds

# %% [markdown]
# ## Beam search
#
# Greedy decoding commits to one token at each step; a token that looked best may lead only to
# poor continuations. Beam search keeps $K$ hypotheses, *beams*, per sentence: at each step it
# extends every beam by every token, $K \cdot V$ candidates, and keeps the $K$ best. With $K = 1$
# it is greedy decoding.
#
# **The length penalty.** Every token multiplies an output's probability by a number below one,
# so ranked by $\log p(Y \mid X)$ beam search prefers short outputs. The paper ranks hypotheses
# as Google's system does {cite:p}`wu2016google`, dividing by a *length penalty*:
#
# $$
# s(Y) = \frac{\log p(Y \mid X)}{lp(Y)}, \qquad lp(Y) = \frac{(5 + |Y|)^\alpha}{(5 + 1)^\alpha},
# $$
#
# where $|Y|$ counts the output tokens, EOS included. With $\alpha = 0$ there is no penalty; with
# $\alpha = 1$ the score approaches the average log-probability per token. The search accepts
# $0 \le \alpha \le 10$ (`MAX_ALPHA`): beyond that, $lp$ overflows 32-bit floats, and the
# $-\infty$ scores of ruled-out candidates would become NaN.
#
# **How the search runs**, batched over sentences:
#
# - The $K$ beams of sentence $b$ are rows $bK, \dots, bK + K - 1$ of one batch. At the start
#   only the first is open, so the beams do not begin as $K$ copies of BOS.
# - At each step every open beam is extended by every token and scored by $\log p / lp(t + 1)$;
#   an ended beam is one candidate, itself, with its score unchanged. The $K$ best survive; every
#   row takes the output so far of the beam it extends (its *parent*), and
#   `DecoderCache.reorder` does the same with the cached keys and values. All the extensions of
#   one beam share its $lp$, so only its $K$ most probable tokens can be among the $K$ best: the
#   search ranks $K \cdot K$ candidates per sentence, which select the same beams as $K \cdot V$.
# - **What is kept aside.** An open beam's score can *rise* as it grows, since $lp$ grows too,
#   and push an ended beam out of the $K$. So each sentence also keeps its best ended hypothesis
#   outside the beam; the result is never worse than a hypothesis the search once held.
# - **When to stop.** The paper terminates "early when possible". An open beam's $\log p$ can
#   only fall and $lp$ only grow, up to the length limit, so the best it can still score is
#   $\log p / lp(\text{limit})$. A sentence is finished when its best ended score is at least
#   that, and leaves the batch with its $K$ rows; the search stops when all are, returning
#   exactly what searching to the limit would.
#
# tensor2tensor {cite:p}`vaswani2018tensor2tensor` keeps ended hypotheses in a separate set so
# that $K$ beams always stay open; ours lets them keep their slot, which makes $K = 1$ exactly
# greedy decoding and lets the whole batch step together. The appendix
# [Deviations from the paper](90_deviations.ipynb) discusses what this costs.


# %%
#| export
def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α of Wu et al. (2016), |Y| counting the final
    EOS."""
    return ((5.0 + length) / 6.0) ** alpha


# The largest α accepted: far beyond any useful one, yet small enough that lp
# stays finite in float32 for outputs of 40,000 tokens.
MAX_ALPHA = 10.0


def check_alpha(
    alpha: float, *, max_len: int | None = None, name: str = "alpha"
) -> None:
    """α must be a number from 0 to MAX_ALPHA: lp must grow with length (α >=
    0) and stay finite, up to max_len tokens if given (an infinite lp makes
    scores NaN).

    Raises ValueError whose message names the value as `name`."""
    if not 0 <= alpha <= MAX_ALPHA:  # also rejects NaN and infinity
        raise ValueError(
            f"{name} must be >= 0 and at most {MAX_ALPHA:g}, got {alpha}"
        )
    if (
        max_len is not None
        and length_penalty(torch.tensor(float(max_len)), alpha).isinf()
    ):
        raise ValueError(
            f"{name} {alpha} makes the length penalty overflow at the model's "
            f"{max_len} positions: choose a smaller one"
        )


@dataclass(frozen=True)
class BeamStep:
    """The beams after one step of beam search, for figures and debugging.

    Shapes (n sentences still searching, K beams, best first):
        sentences: (n,) their indices in the batch; a finished sentence leaves
            the search
        tokens: (n, K) the token each beam just output (pad_id once it has
            ended)
        parents: (n, K) the beam, at the step before, that each beam extends
        log_probs, scores: (n, K) log p(beam | source) and log_prob /
            lp(length)
        ended: (n, K) True for the beams that output EOS or reached the length
            limit
    """

    step: int
    sentences: Tensor
    tokens: Tensor
    parents: Tensor
    log_probs: Tensor
    scores: Tensor
    ended: Tensor


def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    max_len: int | None = None,
    use_cache: bool = True,
    on_step: Callable[[BeamStep], None] | None = None,
) -> list[Hypothesis]:
    """Beam search with the length penalty lp(Y) = ((5 + |Y|)/6)^α, for a batch
    of sentences.

    Each step extends the K beams of every sentence by every token and keeps
    the K best candidates by log p(Y | X) / lp(|Y|); a beam that has ended
    stays a candidate as it is. A sentence is finished when none of its open
    beams can overtake its best ended one; the search stops when every sentence
    is finished. on_step, if given, sees every step.

    Shapes:
        src: (B, S) token ids, padded with pad_id
        returns B hypotheses, each sentence's best, in the order of the batch
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    check_alpha(alpha, max_len=model.config.max_len)
    _check_ids(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    _check_src(src, pad_id)
    B, K, device = src.size(0), beam_size, src.device
    if B == 0:
        return []
    with _inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = output_limits(
            model, src, pad_id=pad_id, max_len=max_len
        )  # (B,)
        # The K beams of sentence b are rows b*K ... b*K + K - 1 of one batch
        # of B*K rows.
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, d_model)
        src_mask = src_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
        cache = (
            DecoderCache.empty(len(model.decoder.layers))
            if use_cache
            else None
        )
        ys = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        # At the start the K beams would be K copies of BOS: keep one, the
        # others at -inf.
        log_prob = torch.full((B, K), float("-inf"), device=device)
        log_prob[:, 0] = 0.0
        length = torch.zeros(B, K, dtype=torch.long, device=device)
        ended = torch.zeros(B, K, dtype=torch.bool, device=device)
        first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1)
        # Each sentence's best ended hypothesis so far, and its row: BOS, the
        # tokens, then padding. Open beams whose score rises with lp can push
        # an ended beam out of the K; the search must not lose it with the
        # beam.
        kept_score = torch.full((B,), -torch.inf, device=device)
        kept_log_prob = torch.full((B,), -torch.inf, device=device)
        kept_ys = ys.new_full((B, int(limits.max()) + 1), pad_id)
        going = torch.arange(B, device=device)  # the sentences still searching
        for t in range(int(limits.max())):
            n = going.numel()
            step = _next_log_probs(model, ys, memory, src_mask, cache).view(
                n, K, -1
            )
            step = _forbid_specials(
                step, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id
            )
            beams = _extend(
                step, log_prob, length, ended, t, alpha, eos_id, pad_id
            )
            scores, parents, tokens, log_prob, length, ended = beams
            ended |= t + 1 >= limits[:, None]
            # Every beam continues the row of its parent: reorder the rows,
            # then append.
            rows = (first_row[:n] + parents).view(-1)  # (n*K,)
            ys = torch.cat(
                [ys[rows], tokens.view(-1, 1)], dim=1
            )  # (n*K, t + 2)
            if (
                cache is not None
            ):  # rows stay within each sentence's beams: see reorder
                cache.reorder(rows, static=False)
            # Keep the best ended beam of each sentence if it beats the one
            # kept so far (an ended beam's score is log_prob / lp(length), as
            # the candidates were scored).
            ended_score, ended_beam = torch.where(
                ended, scores, -torch.inf
            ).max(dim=1)
            better = ended_score > kept_score[going]  # (n,)
            kept_score[going] = torch.where(
                better, ended_score, kept_score[going]
            )
            gained = log_prob.gather(1, ended_beam[:, None])[:, 0]  # (n,)
            kept_log_prob[going] = torch.where(
                better, gained, kept_log_prob[going]
            )
            best_row = ys[first_row[:n, 0] + ended_beam]  # (n, t + 2)
            old_row = kept_ys[going, : t + 2]
            kept_ys[going, : t + 2] = torch.where(
                better[:, None], best_row, old_row
            )
            if on_step is not None:
                on_step(
                    BeamStep(
                        t, going, tokens, parents, log_prob, scores, ended
                    )
                )
            finished = _finished(
                kept_score[going], log_prob, ended, limits, alpha
            )
            if finished.any():
                # A finished sentence leaves the batch, with its K rows.
                stays = ~finished  # (n,)
                going, limits = going[stays], limits[stays]
                log_prob, length, ended = (
                    log_prob[stays],
                    length[stays],
                    ended[stays],
                )
                keep = stays.repeat_interleave(K).nonzero()[:, 0]  # (n'*K,)
                ys, memory, src_mask = ys[keep], memory[keep], src_mask[keep]
                if cache is not None:
                    cache.reorder(keep)
                if going.numel() == 0:
                    break
    # Every sentence now has a kept hypothesis that none of its open beams can
    # overtake.
    return [
        _hypothesis(row[1:], lp, score, eos_id=eos_id, pad_id=pad_id)
        for row, lp, score in zip(
            kept_ys, kept_log_prob.tolist(), kept_score.tolist(), strict=True
        )
    ]


def _extend(
    step: Tensor,
    log_prob: Tensor,
    length: Tensor,
    ended: Tensor,
    t: int,
    alpha: float,
    eos_id: int,
    pad_id: int,
) -> tuple[Tensor, ...]:
    """One step of beam search: the K best extensions of each sentence's K
    beams.

    Shapes:
        step: (n, K, V) log p(next token) of every beam; log_prob, length,
            ended: (n, K)
        returns the new beams' scores, parents, tokens, log_prob, length and
            ended, each
        (n, K), best first
    """
    n, K, V = step.shape
    # All the continuations of a beam share its lp, so its K most probable
    # tokens are its K best candidates: K * K candidates per sentence, not K *
    # V.
    C = min(K, V)
    top, top_tokens = step.topk(C, dim=-1)  # (n, K, C)
    # An ended beam has one continuation, padding, which leaves its
    # log-probability alone.
    stay = torch.full((C,), float("-inf"), device=step.device)
    stay[0] = 0.0
    top = torch.where(ended[..., None], stay, top)
    top_tokens = top_tokens.masked_fill(ended[..., None], pad_id)
    candidate_log_prob = (log_prob[..., None] + top).view(n, K * C)
    candidate_length = torch.where(ended, length, t + 1)  # (n, K)
    lp = length_penalty(candidate_length, alpha).repeat_interleave(C, dim=1)
    scores, best = (candidate_log_prob / lp).topk(K, dim=-1)  # (n, K)
    parents, tokens = best // C, top_tokens.view(n, K * C).gather(1, best)
    return (
        scores,
        parents,
        tokens,
        candidate_log_prob.gather(1, best),
        candidate_length.gather(1, parents),
        ended.gather(1, parents) | (tokens == eos_id),
    )


def _finished(
    kept_score: Tensor,
    log_prob: Tensor,
    ended: Tensor,
    limits: Tensor,
    alpha: float,
) -> Tensor:
    """The sentences whose best ended hypothesis (kept_score, (B,)) no open
    beam of (B, K) can overtake: -> (B,).

    An open beam's log-probability can only fall as it grows, and lp only rise,
    up to lp(limit): the best it can still score is log_prob / lp(limit).
    """
    best_open = torch.where(ended, -torch.inf, log_prob).amax(dim=1)  # (B,)
    reachable = best_open / length_penalty(limits, alpha)  # (B,)
    return (kept_score >= reachable) | (best_open == -torch.inf)


# %% [markdown]
# Beam search against greedy decoding, for both models. A search is for a higher score $s(Y)$, so
# the first measure scores greedy decoding's outputs the same way and counts the strings on which
# beam search found a higher one; exact matches are the second.

# %% tags=["nbval-ignore-output"]
from transformer.decode import beam_search

beam = beam_search(model, test_src, **ids)
beam_half = beam_search(half_trained, test_src, **ids)
accuracy = pd.DataFrame(
    {
        "greedy": [exact(greedy), exact(greedy_half)],
        "beam 4, α = 0.6": [exact(beam), exact(beam_half)],
    },
    index=pd.Index(
        ["trained (600 steps)", "half-trained (150 steps)"], name="model"
    ),
)
assert exact(beam) > 0.8


def gnmt_score(h: Hypothesis, alpha: float = 0.6) -> float:
    """s(Y) of any hypothesis, greedy decoding's included: log p / lp(|Y|), EOS
    counted."""
    length = torch.tensor(float(len(h.tokens) + h.ended))
    return h.log_prob / length_penalty(length, alpha).item()


higher, lower = {}, {}
for name, (g_out, b_out) in {
    "trained": (greedy, beam),
    "half-trained": (greedy_half, beam_half),
}.items():
    gains = [
        b.score - gnmt_score(g) for g, b in zip(g_out, b_out, strict=True)
    ]
    higher[name] = sum(gain > 1e-6 for gain in gains) / len(gains)
    lower[name] = sum(gain < -1e-6 for gain in gains) / len(gains)
    print(
        f"{name}: beam search scores higher than greedy decoding on"
        f" {higher[name]:.0%} of the strings, lower on {lower[name]:.0%}"
    )
# the unsure model leaves the search much more to find; it is rarely worse than
# greedy
assert higher["trained"] < 0.05
assert higher["half-trained"] > max(0.1, 4 * higher["trained"])
assert max(lower.values()) < 0.02
both = list(zip(greedy_half, beam_half, references, strict=True))
beam_only = sum(spell(b.tokens) == r != spell(g.tokens) for g, b, r in both)
greedy_only = sum(spell(g.tokens) == r != spell(b.tokens) for g, b, r in both)
# exact matches move far less than the scores
assert beam_only + greedy_only <= 25
assert (
    abs(beam_only - greedy_only)
    <= higher["half-trained"] * len(references) / 2
)
assert (accuracy.loc["trained (600 steps)"] > 0.8).all()
print("% of the 200 strings exactly right:")
(accuracy * 100).round(1)

# %% [markdown]
# With the trained model there is little left for a search to find: greedy decoding already gets
# most strings right. On the half-trained one, beam search finds a higher score for many more
# strings and almost never a lower one, yet the exact matches move far less: a higher $s(Y)$ is
# not the right answer when the model itself is unsure. The results chapter measures what search
# does for translation, in BLEU.
#
# ### What the length penalty does
#
# The same search on the half-trained model with several values of $\alpha$, and the length of
# its outputs relative to the right answers'. The larger $\alpha$, the less a long hypothesis is
# held back, and the longer the outputs:

# %%
rows = []
for alpha in (0.0, 0.6, 1.0, 2.0):
    found = beam_search(half_trained, test_src, alpha=alpha, **ids)
    rows.append(
        {
            "α": alpha,
            "% exactly right": 100 * exact(found),
            "output length / answer length": (
                sum(len(h.tokens) for h in found)
                / sum(len(r) for r in references)
            ),
        }
    )
by_alpha = pd.DataFrame(rows).set_index("α")
lengths = by_alpha["output length / answer length"]
assert lengths.is_monotonic_increasing and lengths[0.0] < lengths[2.0]
right = by_alpha["% exactly right"]
assert right.max() - right.min() <= 10  # a few points at most

# %% tags=["nbval-ignore-output"]
by_alpha.round({"% exactly right": 1, "output length / answer length": 3})

# %% [markdown]
# On reversal the exact matches barely move. The penalty's purpose shows in translation, where
# without it "regular beam search will favor shorter results over longer ones on average"
# {cite:p}`wu2016google`.
#
# ## A beam search tree
#
# Beam search drawn for one string: the first of the 200 that the half-trained model gets right
# with beam search and wrong with greedy decoding. Each column is a step and each point one of the
# $K = 4$ hypotheses kept, placed by its rank (1 = best score) and labelled with the letter it has
# just added; a grey line joins it to the hypothesis it extends (hover for the whole hypothesis and
# its score). Red points have just output EOS; grey ones ended earlier and are carried along. What
# to see: the dashed orange path is greedy decoding's, the black one leads to beam search's result.
# Where they part, the black path takes a runner-up token that greedy decoding discarded for good,
# and a few steps later it is ahead.

# %% tags=["nbval-ignore-output"]
from transformer.decode import BeamStep

fixed = [
    i
    for i, (g, b, r) in enumerate(
        zip(greedy_half, beam_half, references, strict=True)
    )
    if spell(b.tokens) == r != spell(g.tokens)
]
assert fixed, (
    "beam search gets no string right that greedy decoding gets wrong"
)
chosen = fixed[0]
one_src = test_src[
    chosen : chosen + 1, : int((test_src[chosen] != pad_id).sum())
]
steps: list[BeamStep] = []
[tree_result] = beam_search(half_trained, one_src, **ids, on_step=steps.append)


def beam_tree(steps: list[BeamStep]) -> pd.DataFrame:
    """One row per kept hypothesis and step (sentence 0), with its parent's
    rank."""
    nodes = [
        {
            "step": 0,
            "rank": 1,
            "parent rank": None,
            "label": "BOS",
            "hypothesis": "",
            "log p": 0.0,
            "score": 0.0,
            "state": "open",
        }
    ]
    texts = [""]
    was_ended = [False]
    for s in steps:
        new_texts, new_ended = [], []
        for k in range(s.tokens.size(1)):
            parent, token = int(s.parents[0, k]), int(s.tokens[0, k])
            # An empty slot: fewer candidates than K.
            if torch.isneginf(s.log_probs[0, k]):
                new_texts.append("")
                new_ended.append(True)
                continue
            if was_ended[parent]:
                text, label, state = texts[parent], "", "ended before"
            elif token == eos_id:
                text, label, state = texts[parent] + " EOS", "EOS", "ends here"
            else:
                text, label = (
                    texts[parent] + letters[token - 3],
                    letters[token - 3],
                )
                state = "ended by the limit" if s.ended[0, k] else "open"
            new_texts.append(text)
            new_ended.append(bool(s.ended[0, k]))
            nodes.append(
                {
                    "step": s.step + 1,
                    "rank": k + 1,
                    "parent rank": parent + 1,
                    "label": label,
                    "hypothesis": text,
                    "log p": round(float(s.log_probs[0, k]), 4),
                    "score": round(float(s.scores[0, k]), 4),
                    "state": state,
                }
            )
        texts, was_ended = new_texts, new_ended
    return pd.DataFrame(nodes)


tree = beam_tree(steps)
print(f"source {spell(one_src[0].tolist())}, answer {references[chosen]}")
print(
    f"greedy       {spell(greedy_half[chosen].tokens)}  (log p"
    f" {greedy_half[chosen].log_prob:.3f})"
)
print(
    f"beam search  {spell(tree_result.tokens)}  (score"
    f" {tree_result.score:.3f})"
)
assert spell(tree_result.tokens) == spell(beam_half[chosen].tokens)

# %% tags=["nbval-ignore-output"]
# A hypothesis's text is its path: prefixes of an output are the points on the
# way to it.
result_text = spell(tree_result.tokens) + " EOS"
greedy_text = spell(greedy_half[chosen].tokens) + " EOS"
tree["path"] = [
    (
        "result"
        if result_text.startswith(h)
        else "greedy"
        if greedy_text.startswith(h)
        else "other"
    )
    for h in tree["hypothesis"]
]
edges = tree.dropna(subset=["parent rank"]).assign(
    **{"parent step": lambda d: d["step"] - 1}
)
colours = alt.Scale(
    domain=["open", "ends here", "ended before", "ended by the limit"],
    range=["#1f77b4", "#d62728", "#bbbbbb", "#9467bd"],
)
y_rank = alt.Y(
    "rank:Q",
    scale=alt.Scale(domain=[0.5, 4.5], reverse=True),
    axis=alt.Axis(values=[1, 2, 3, 4]),
    title="rank in the beam",
)
x_step = alt.X("step:Q", title="step", axis=alt.Axis(tickMinStep=1))
edge_encoding = dict(
    x="parent step:Q", x2="step:Q", y="parent rank:Q", y2="rank:Q"
)
lines = alt.Chart(edges).mark_rule(color="#bbbbbb").encode(**edge_encoding)
greedy_lines = (
    alt.Chart(edges[edges["path"] == "greedy"])
    .mark_rule(color="#ff7f0e", strokeWidth=2.5, strokeDash=[5, 3])
    .encode(**edge_encoding)
)
result_lines = (
    alt.Chart(edges[edges["path"] == "result"])
    .mark_rule(color="black", strokeWidth=3)
    .encode(**edge_encoding)
)
points = (
    alt.Chart(tree)
    .mark_circle(size=140, opacity=1)
    .encode(
        x=x_step,
        y=y_rank,
        color=alt.Color("state:N", scale=colours, title=None),
        tooltip=["step", "rank", "hypothesis", "log p", "score", "state"],
    )
)
text = (
    alt.Chart(tree)
    .mark_text(dy=-13, fontSize=12)
    .encode(x=x_step, y=y_rank, text="label:N")
)
(lines + greedy_lines + result_lines + points + text).properties(
    width=560,
    height=220,
    title=alt.Title(
        "Beam search (K = 4, α = 0.6) for the source"
        f" {spell(one_src[0].tolist())!r}",
        subtitle=(
            "black: the path to the result; dashed orange: greedy decoding's"
            " path"
        ),
    ),
)

# %% [markdown]
# ## Translating text
#
# The functions above take tensors of token ids. `translate` takes sentences and returns their
# translations, in the same order:
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

# %%
#| export
from collections.abc import Sequence
from pathlib import Path

from transformer.checkpoint import CheckpointError, load_model
from transformer.data import DATA_DIR, PAIRS
from transformer.tokenizer import Tokenizer, normalize

BATCH_SIZE = 32  # sentences decoded at once by `translate`
# The shipped models, beside data/ in the repository: checkpoints/de-en,
# checkpoints/fr-en.
CHECKPOINTS_DIR = DATA_DIR.parents[1] / "checkpoints"


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


def translate(
    model: Transformer,
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    batch_size: int = BATCH_SIZE,
    warn: Callable[[str], None] | None = None,
) -> list[str]:
    """Translations of `sentences`, in their order: beam search (beam_size 1:
    greedy decoding) over batches of similar lengths, on the model's device.

    An empty sentence translates to "". A source longer than the model's
    positions is cut to its first config.max_len - 1 tokens, then <eos>;
    `warn`, if given, is told about those and about translations that the
    length limit stopped before <eos>. Needs spaCy (to cut the sentences into
    words) unless every sentence is empty.
    """
    check_alpha(alpha, max_len=model.config.max_len)
    special = {
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
    }
    device = next(model.parameters()).device

    def decode_batch(sources: list[list[int]]) -> list[Hypothesis]:
        src = torch.full(
            (len(sources), len(sources[0])), tokenizer.pad_id, dtype=torch.long
        )  # (B, S): the longest first
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(device)
        if beam_size == 1:
            return greedy_decode(model, src, **special)
        return beam_search(
            model, src, beam_size=beam_size, alpha=alpha, **special
        )

    return translate_batches(
        decode_batch,
        tokenizer,
        sentences,
        max_len=model.config.max_len,
        beam_size=beam_size,
        batch_size=batch_size,
        warn=warn,
    )


def translate_batches(
    decode_batch: Callable[[list[list[int]]], list[Hypothesis]],
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    *,
    max_len: int,
    beam_size: int,
    batch_size: int = BATCH_SIZE,
    warn: Callable[[str], None] | None = None,
) -> list[str]:
    """`translate` around any decoder of id batches (the package's, or another
    engine's): `decode_batch` takes sources as ids with their <eos>, longest
    first, and returns their hypotheses; max_len is the model's number of
    positions."""
    if isinstance(sentences, str):
        raise TypeError(
            "translate takes a sequence of sentences, not one string"
        )
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    texts = [normalize(s) for s in sentences]
    todo = [i for i, text in enumerate(texts) if text]  # empty ones stay ""
    encoded = tokenizer.encode_batch([texts[i] for i in todo]) if todo else []
    room = max_len - 1  # source tokens that fit with their <eos>
    with_eos = {i: len(ids) + 1 for i, ids in zip(todo, encoded, strict=True)}
    too_long = {i: n for i, n in with_eos.items() if n > max_len}
    if too_long and warn is not None:
        sizes = _listed([str(n) for n in too_long.values()])
        warn(
            f"{_sentences(list(too_long))}: {sizes} tokens with <eos>, more"
            f" than the model's {max_len} positions: translating the first"
            f" {room}"
        )
    sources = [ids[:room] + [tokenizer.eos_id] for ids in encoded]
    results = [""] * len(texts)
    cut_off = []
    for batch in length_sorted_batches([len(s) for s in sources], batch_size):
        found = decode_batch([sources[j] for j in batch])
        for j, hypothesis in zip(batch, found, strict=True):
            results[todo[j]] = tokenizer.decode(hypothesis.tokens)
            if not hypothesis.ended:
                cut_off.append(todo[j])
    if cut_off and warn is not None:
        warn(
            f"{_sentences(sorted(cut_off))}: the translation stopped at the"
            " length limit, before <eos>"
        )
    return results


# %% [markdown]
# Five sentences of 3, 9, 1, 4 and 9 tokens, in batches of two: the two of 9 tokens share the
# first batch, in their input order, and the shortest is last, alone.

# %%
from transformer.decode import length_sorted_batches

batches = length_sorted_batches([3, 9, 1, 4, 9], batch_size=2)
print(batches)
assert batches == [[1, 4], [3, 0], [2]]
assert sorted(
    i for b in length_sorted_batches(range(10), 3) for i in b
) == list(range(10))

# %% [markdown]
# ## Translating with the shipped models
#
# The book ships two models trained by Part II's recipe, German→English and French→English, in
# `checkpoints/de-en` and `checkpoints/fr-en`. `load_pair_model` loads one with its tokenizer (or
# any model folder given as `checkpoint`), and says in one line what is wrong with a folder that
# does not hold a whole model of the pair.


# %%
#| export
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
    if pair not in PAIRS:
        raise ValueError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    folder = CHECKPOINTS_DIR / pair if checkpoint is None else Path(checkpoint)
    if not folder.is_dir():
        if checkpoint is None:
            raise CheckpointError(
                f"no {pair} model in {folder}: none has been shipped yet."
                f" Train one with `python -m transformer train --pair {pair}"
                f" --export {folder}`, or name a model folder with"
                " --checkpoint DIR"
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
    if tokenizer.languages != PAIRS[pair]:
        raise CheckpointError(
            f"{folder} holds a {tokenizer.pair} model, not a {pair} one"
        )
    return model, tokenizer


# %% [markdown]
# Both models, translating with the paper's search, beam 4 and $\alpha = 0.6$, and with greedy
# decoding (`beam_size=1`). What to see: fluent sentences, on which the two searches mostly agree;
# where they differ, greedy decoding may take a word-for-word choice (*place* for *Platz*) that
# beam search, looking further ahead, replaces (*square*).

# %% tags=["nbval-ignore-output"]
from transformer.decode import load_pair_model, translate

examples = {
    "de-en": [
        "Ein Hund mit einem Stock im Maul schwimmt in einem See.",
        (
            "Eine Gruppe von Musikern spielt auf einem belebten Platz vor"
            " einer Kirche."
        ),
        (
            "Ein älterer Mann in einer orangefarbenen Weste repariert ein"
            " altes Fahrrad."
        ),
    ],
    "fr-en": [
        "Un chien avec un bâton dans la gueule nage dans un lac.",
        "Un groupe de musiciens joue sur une place animée devant une église.",
        (
            "Un homme âgé en gilet orange répare un vieux vélo au bord de la"
            " route."
        ),
    ],
}
live = []
for pair, sentences in examples.items():
    pair_model, pair_tokenizer = load_pair_model(pair)
    beam_out = translate(pair_model, pair_tokenizer, sentences)
    greedy_out = translate(pair_model, pair_tokenizer, sentences, beam_size=1)
    live += [
        {"pair": pair, "source": s, "beam 4": b, "greedy": g}
        for s, b, g in zip(sentences, beam_out, greedy_out, strict=True)
    ]
live = pd.DataFrame(live).set_index("pair")
assert "dog" in live["beam 4"].iloc[0] and "dog" in live["beam 4"].iloc[3]
assert (
    "square" in live["beam 4"].iloc[1]
    and (live["beam 4"] != live["greedy"]).any()
)
with pd.option_context("display.max_colwidth", None):
    display(live)

# %% [markdown]
# The same from a shell: `python -m transformer translate` translates its arguments, or standard
# input line by line, and prints one translation per line; `--beam`, `--alpha` and
# `--checkpoint` choose the search and the model.
#
# ```
# python -m transformer translate --pair de-en "Zwei Hunde spielen im Schnee."
# python -m transformer translate --pair fr-en --beam 1 < in.txt > out.txt
# ```
#
# What the shipped models' translations are worth is the subject of the results chapter.

# %% [markdown]
# ## Summary
#
# - Greedy decoding takes the most probable token at each step; beam search keeps the $K$ best
#   hypotheses, ranked by $\log p(Y \mid X) / lp(Y)$ with the length penalty
#   $lp = ((5 + |Y|)/6)^\alpha$, the paper's $K = 4$ and $\alpha = 0.6$.
# - The key/value cache feeds the decoder one token per step: $T$ positions instead of
#   $T(T+1)/2$, with the same outputs.
# - The search stops when no open beam can overtake a sentence's best ended hypothesis.
# - `translate` turns sentences into translations, in batches of similar lengths.

# %% [markdown]
# ## Exercises
#
# 1. Translate a few sentences with `--beam 1`, `--beam 4` and `--beam 12`. Where do the outputs
#    differ?
# 2. Translate the sentences above with `alpha=0` and `alpha=2` (`translate(..., alpha=...)`).
#    How do the translations' lengths change?
# 3. Translate with a run of your own from the training chapter:
#    `python -m transformer translate --pair de-en --checkpoint runs/de-en/average`.
