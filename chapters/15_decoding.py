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
# Translating means finding an output with a high probability. There are $V^n$ outputs of
# length $n$, so an exact search is out of the question; *decoding* is the approximate search.
# The paper's recipe is short (Section 6.1) {cite:p}`vaswani2017attention`: "we used beam search
# with a beam size of 4 and length penalty $\alpha = 0.6$", the length penalty of Google's
# neural machine translation system {cite:p}`wu2016google`, and "we set the maximum output
# length during inference to input length + 50, but terminate early when possible."
#
# This chapter writes `transformer.decode`: greedy decoding and beam search with the length
# penalty, both batched over sentences, and a cache of keys and values that lets each decoding
# step feed the decoder one token instead of the whole output so far. A translation model takes
# hours to train, so we try the functions on a tiny model trained here in seconds, on a task whose
# right answers we know: reversing a string of letters. The results chapter applies the same
# functions to the trained translation models.

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
    # [notebooks]: spaCy's tokenizers, Altair and pandas, at the versions the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e", where + "[notebooks]"]
    subprocess.run(pip, check=True)
    sys.path.insert(0, where)  # an editable install is seen only after a restart

# %% tags=["remove-cell"]
#| default_exp decode

# %%
import copy
import time

import altair as alt
import pandas as pd
import torch

torch.manual_seed(0)
torch.set_printoptions(precision=3, sci_mode=False)
# The models of this chapter are tiny: one thread runs them fastest, and keeps the timings
# below free of the noise of threads waiting for each other.
torch.set_num_threads(1)

# %% [markdown]
# ## A model to decode
#
# The task: the source is a random string of 3 to 10 letters from *a* to *j*, the target is the
# same string reversed. The vocabulary has $V = 13$ tokens: padding, BOS (the decoder's first
# input), EOS, and the ten letters. Reversal needs what translation needs, attention from each
# output position to the right source position, and every answer can be checked.
#
# The model is the configuration chapter's `small` preset shrunk to $d_\text{model} = 64$ with
# $H = 4$ heads, 2 layers and $d_{ff} = 256$, and without dropout: every batch is new random
# data, so there is nothing to overfit. It trains for 400 steps of 64 strings with Part II's
# label-smoothed loss and learning-rate schedule (a warm-up of 100 steps, at half the paper's
# rate). We also keep a copy of the weights at step 150, a *half-trained* model: search matters
# most when the model is unsure, as a translation model is about many sentences.

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
    """n random strings and their reversals: src (n, S), decoder input and labels (n, S + 1)."""
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
    vocab_size=V, d_model=64, n_heads=4, n_layers=2, d_ff=256, dropout=0.0, max_len=128
)
model = Transformer(config)
optimizer, scheduler = make_optimizer(model, d_model=64, warmup=100, factor=0.5)
criterion = LabelSmoothingLoss(pad_id=pad_id, smoothing=0.1)
losses = []
started = time.perf_counter()
for step in range(1, 401):
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
    f"trained in {training_seconds:.0f} s; loss over the last 50 steps {sum(losses[-50:]) / 50:.3f}"
)
assert sum(losses[-50:]) < 0.2 * sum(losses[:50])

# %% [markdown]
# The strings to decode: 200 new ones of the lengths seen in training. (The numbers printed from
# here on depend on the trained weights, hence on the floating-point details of the CPU that
# trained them; the book checks them with loose assertions, not digit by digit.)

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
# It decodes a batch of $B$ sentences at once, one step for all of them; the details that make
# that work:
#
# - **The length limit.** Each sentence may output at most its source length (its non-padding
#   tokens) + 50 tokens, as in the paper, EOS included, and never more than the model has
#   positions (`config.max_len`). A sentence stopped by its limit has no EOS: its `Hypothesis`
#   says `ended=False`.
# - **Ended sentences stay ended.** Once a sentence has output EOS it outputs padding, and its
#   log-probability stops changing, while the rest of the batch goes on; so a sentence decodes to
#   the same output whatever else is in its batch, and however much padding its source has.
# - **Padding and BOS are never output.** They are not words; their log-probabilities are set to
#   $-\infty$ before the choice. The others are not renormalised: `log_prob` stays the model's.
# - **No dropout.** The model is put in evaluation mode for the search (and back afterwards).
#
# Each step needs the decoder's output at the last position of every row, and there are two ways
# to get it (`use_cache`): run the decoder again on the whole output so far under the causal mask
# (the decoder chapter showed that the earlier positions' outputs do not change), or feed only the
# newest token and keep the keys and values of the earlier ones in a cache. The next section is
# about the second way.

# %%
#| export
"""Greedy decoding and beam search with a key/value cache: Section 6.1 of Vaswani et al. (2017),
with the length penalty of Wu et al. (2016); and `python -m transformer translate`."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.decoder import DecoderCache
from transformer.masking import causal_mask, padding_mask
from transformer.model import Transformer

EXTRA_LENGTH = 50  # "maximum output length ... input length + 50" (Section 6.1)


@dataclass(frozen=True)
class Hypothesis:
    """One decoded sentence.

    tokens: the output ids, without BOS and EOS.
    log_prob: log p(output | source), summed over the tokens and the final EOS, if any.
    score: what the search maximised: log_prob / lp(length) for beam search, log_prob for
        greedy decoding.
    ended: True if the output ended with EOS, False if the length limit cut it off.
    """

    tokens: list[int]
    log_prob: float
    score: float
    ended: bool


def output_limits(
    model: Transformer, src: Tensor, *, pad_id: int, max_len: int | None = None
) -> Tensor:
    """The most tokens each sentence may output, EOS included: (B, S) -> (B,).

    Each source's length (its non-padding tokens) + 50, as in the paper, or max_len if given;
    never more than the positions of the model's positional encoding (config.max_len).
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
    """A batch of sources must be a (B, S) tensor of token ids, each row with a real token."""
    if src.dim() != 2 or src.dtype != torch.long:
        raise ValueError(
            "src must be a (B, S) tensor of token ids (torch.long), got shape "
            f"{tuple(src.shape)} and {src.dtype}"
        )
    if src.size(1) == 0:
        raise ValueError("src has no positions: encode each source with its <eos>")
    # A row of padding alone would be decoded from a memory the mask hides entirely.
    empty = (src == pad_id).all(dim=1)  # (B,)
    if empty.any():
        raise ValueError(
            f"src row {int(empty.nonzero()[0])} is all padding: encode each source with "
            "its <eos>"
        )


def _check_ids(*, bos_id: int, eos_id: int, pad_id: int) -> None:
    if pad_id in (bos_id, eos_id):
        raise ValueError(
            f"pad_id ({pad_id}) must differ from bos_id ({bos_id}) and eos_id ({eos_id}): "
            "an ended sentence is recognised by its padding"
        )


@contextmanager
def _inference(model: Transformer) -> Iterator[None]:
    """No gradients and no dropout; the model's training mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
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
        # The whole output so far again, under the causal mask: t positions at step t.
        mask = causal_mask(ys.size(1), device=ys.device)  # (1, 1, t, t)
        out = model.decode(ys, memory, src_mask=src_mask, tgt_mask=mask)
    else:
        # The newest token only: the cache holds the keys and values of the others, and a
        # single query at the end of the sequence may see all of them, so there is no mask.
        out = model.decode(
            ys[:, -1:], memory, src_mask=src_mask, tgt_mask=None, cache=cache
        )
    return model.generator(out[:, -1])  # (N, V)


def _forbid_specials(
    log_probs: Tensor, *, bos_id: int, eos_id: int, pad_id: int
) -> Tensor:
    """Padding and BOS (unless it doubles as EOS) are not outputs: never choose them."""
    log_probs[..., pad_id] = float("-inf")
    if bos_id != eos_id:
        log_probs[..., bos_id] = float("-inf")
    return log_probs


def _hypothesis(
    row: Tensor, log_prob: float, score: float, *, eos_id: int, pad_id: int
) -> Hypothesis:
    """The output of one decoded row (without its BOS): the tokens before EOS or padding."""
    tokens = row.tolist()
    ended = eos_id in tokens
    for stop in (eos_id, pad_id):
        if stop in tokens:
            tokens = tokens[: tokens.index(stop)]
    return Hypothesis(tokens=tokens, log_prob=log_prob, score=score, ended=ended)


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
    """The most probable next token at each step, for a batch of sentences at once.

    Shapes:
        src: (B, S) token ids, padded with pad_id
        returns B hypotheses, in the order of the batch (their score is their log_prob)
    """
    _check_ids(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    _check_src(src, pad_id)
    B = src.size(0)
    if B == 0:
        return []
    with _inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = output_limits(model, src, pad_id=pad_id, max_len=max_len)  # (B,)
        cache = DecoderCache.empty(len(model.decoder.layers)) if use_cache else None
        ys = torch.full((B, 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
        log_prob = torch.zeros(B, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        for t in range(int(limits.max())):
            step = _next_log_probs(model, ys, memory, src_mask, cache)  # (B, V)
            step = _forbid_specials(step, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
            best, token = step.max(dim=-1)  # (B,)
            # A finished sentence outputs padding, and its log-probability stays as it is.
            token = token.masked_fill(done, pad_id)
            log_prob += best.masked_fill(done, 0.0)
            ys = torch.cat([ys, token[:, None]], dim=1)  # (B, t + 2)
            done |= (token == eos_id) | (t + 1 >= limits)
            if done.all():
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

# %% [markdown]
# How many of the 200 outputs are exactly right, for the trained and the half-trained model:


# %%
def exact(hypotheses) -> float:
    """The share of outputs that are exactly the reversed source."""
    return sum(
        spell(h.tokens) == r for h, r in zip(hypotheses, references, strict=True)
    ) / len(references)


greedy_half = greedy_decode(half_trained, test_src, **ids)
assert exact(greedy) > 0.8

# %% tags=["nbval-ignore-output"]
print(
    f"exactly right, greedy: trained {exact(greedy):.1%}, half-trained {exact(greedy_half):.1%}"
)

# %% [markdown]
# ## The cache
#
# Without a cache, step $t$ runs the decoder over all $t$ positions of the output so far, to use
# the output of the last one. The other $t - 1$ were computed at the earlier steps already, and
# the causal mask guarantees that they have not changed, since no position sees the ones after
# it. What the new position needs from them is, in each self-attention layer, their keys and
# values. So keep those: the multi-head attention chapter's `KVCache` appends the new position's
# key and value at each step and lets its query attend over all the cached ones. The new token
# is embedded at position $t$ (the `start` argument of the positional encoding), and a single
# query at the end of the sequence may see every earlier position, so the self-attention needs no
# mask; the source's padding mask still applies in the encoder–decoder attention. That attention
# has a cache too: its keys and values are projections of the encoder's memory, which does not
# change while a sentence is decoded, so they are computed at the first step and reused (a
# *static* cache). The decoder chapter's `DecoderCache` holds both caches of every layer, and
# `Transformer.decode(..., cache=cache)` (the full-model chapter) then reads only the new
# tokens.
#
# The saving: to output $T$ tokens, the decoder without a cache processes
# $1 + 2 + \dots + T = T(T+1)/2$ positions, with a cache $T$. Every position costs the same in
# the projections and feed-forward networks, $O(d_\text{model}^2)$ per layer, which dominate at
# sentence lengths; so that work per sentence drops from $O(T^2)$ to $O(T)$. (The attention of a
# new position to the cached ones still grows with $t$: $O(T^2 d_\text{model})$ in all, against
# $O(T^3 d_\text{model})$ without the cache.) The price is memory: per sentence,
# $2\, n_\text{layers}\, T\, d_\text{model}$ numbers for the self-attention keys and values and
# $2\, n_\text{layers}\, S\, d_\text{model}$ for the memory's.
#
# First, the two ways give the same outputs:

# %%
uncached = greedy_decode(model, test_src, **ids, use_cache=False)
assert [h.tokens for h in uncached] == [h.tokens for h in greedy]
gap = max(abs(a.log_prob - b.log_prob) for a, b in zip(greedy, uncached, strict=True))
assert gap < 1e-4
print("the same 200 outputs with and without the cache")

# %% [markdown]
# Then the work. A hook on the decoder counts the positions it processes at each step, for the
# 200 strings at once:


# %%
def decoder_positions(use_cache: bool) -> list[int]:
    """Positions (rows x length) that the decoder processes at each step of greedy decoding."""
    counts = []
    hook = model.decoder.register_forward_pre_hook(
        lambda module, args: counts.append(args[0].shape[0] * args[0].shape[1])
    )
    try:
        greedy_decode(model, test_src, **ids, use_cache=use_cache)
    finally:
        hook.remove()
    return counts


with_cache, without_cache = decoder_positions(True), decoder_positions(False)
n_steps, B = len(with_cache), test_src.size(0)
assert with_cache == [B] * n_steps
assert without_cache == [B * t for t in range(1, n_steps + 1)]
assert sum(without_cache) == B * n_steps * (n_steps + 1) // 2
print(
    f"{n_steps} steps: {sum(with_cache):,} positions with the cache, "
    f"{sum(without_cache):,} without ({sum(without_cache) / sum(with_cache):.1f} times as many)"
)

# %% [markdown]
# And the time: greedy decoding of the same 200 strings, with and without the cache, the best of
# three runs each, on this machine's CPU (the times vary from run to run and machine to machine;
# the outputs do not).


# %%
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

# %% tags=["nbval-ignore-output"]
print(
    f"greedy, 200 strings: with the cache {cached_seconds * 1000:.0f} ms, "
    f"without {uncached_seconds * 1000:.0f} ms"
)
print(f"the cache is {uncached_seconds / cached_seconds:.1f} times as fast")
assert cached_seconds < uncached_seconds

# %% [markdown]
# These outputs are short, as the number of steps above shows; the longer the outputs, the larger
# the ratio, as the count of positions says. For a translation model, whose layers are wider, the
# positions' work dominates even more.

# %% [markdown]
# ## Beam search
#
# Greedy decoding commits to one token at each step; a token that looked best may lead only to
# poor continuations, and there is no going back. Beam search keeps $K$ hypotheses, *beams*, per
# sentence: at each step it extends every beam by every token, $K \cdot V$ candidates, and keeps
# the $K$ best. With $K = 1$ it is greedy decoding.
#
# **The length penalty.** Every token multiplies the probability of an output by a number below
# one, so $\log p(Y \mid X)$ only falls as $Y$ grows: a long output pays for every one of its
# tokens, and ranked by log-probability, beam search tends to prefer short outputs. The paper
# ranks hypotheses as Google's system does
# {cite:p}`wu2016google`, by the log-probability divided by a *length penalty*:
#
# $$
# s(Y) = \frac{\log p(Y \mid X)}{lp(Y)}, \qquad lp(Y) = \frac{(5 + |Y|)^\alpha}{(5 + 1)^\alpha},
# $$
#
# where $|Y|$ counts the output tokens, EOS included. With $\alpha = 0$ there is no penalty; with
# $\alpha = 1$ the score is proportional to the average log-probability per token for long
# outputs (the 5, with the 6 that makes $lp = 1$ for one token, damps the penalty's growth: a
# 10-token output is divided by 2.5, not 10); the paper uses $\alpha = 0.6$. (Google's
# system also adds a *coverage* penalty for source words left untranslated; the paper does not
# mention one, and we do not use it.)
#
# **How the search runs**, batched over sentences:
#
# - The $K$ beams of sentence $b$ are rows $bK, \dots, bK + K - 1$ of one batch of $BK$ rows. At
#   the start only the first beam of each sentence is open (the others have $\log p = -\infty$),
#   so that the beams do not begin as $K$ copies of BOS.
# - At each step, every open beam is extended by every token and scored by
#   $\log p / lp(t + 1)$. A beam that has ended is one candidate, itself: it is extended by
#   padding, and its log-probability and score stay as they are. The $K$ best candidates by
#   score survive; every row then takes the output so far of the beam it extends (its *parent*),
#   and `DecoderCache.reorder` does the same with the cached keys and values of the
#   self-attention (those of the encoder–decoder attention are the same for every beam of a
#   sentence, so they stay where they are).
# - **What is kept aside.** An open beam's score can *rise* as it grows, since $lp$ grows too, so
#   open beams can outscore an ended one and push it out of the $K$. Each sentence therefore
#   also keeps its best ended hypothesis so far, outside the beam, and replaces it only with a
#   better one; the result is never worse than a hypothesis the search once held (a test pushes
#   one out and checks that it is still the result).
# - **When to stop.** The paper "terminate[s] early when possible" without saying how. A sentence
#   is finished when none of its open beams can overtake its best ended hypothesis: an open beam's
#   log-probability can only fall and $lp$ can only grow, up to $lp$ at the length limit, so the
#   best an open beam can still score is $\log p / lp(\text{limit})$. When the best ended score
#   is at least that, the result can no longer change; that includes the case where every beam
#   has ended. The search stops when every sentence of the batch is finished, or at the limit,
#   where every beam ends. Stopping early therefore returns exactly what searching to the limit
#   returns (a test checks it).
# - The result is each sentence's kept hypothesis, the best ended one by $s(Y)$.
#
# The reference implementation, tensor2tensor's {cite:p}`vaswani2018tensor2tensor`, keeps open and
# finished hypotheses in two separate sets of $K$ and draws $2K$ candidates at each step, so that
# $K$ beams always stay open. Ours keeps the ended hypotheses in the beam, where they compete with
# the open ones by the same score and take up slots, so fewer than $K$ beams may stay open; the best
# ended one is also kept aside, as above. Both rank by $s(Y)$; ours makes beam size 1 exactly greedy
# decoding (a test checks that too) and draws only $K$ candidates. What the difference costs a
# translation model is measured below, in "Ended beams that keep their slot".


# %%
#| export
def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α of Wu et al. (2016), |Y| counting the final EOS."""
    return ((5.0 + length) / 6.0) ** alpha


# The largest α accepted: far beyond any useful one, yet small enough that lp stays
# finite in float32 for outputs of 40,000 tokens (the decoding chapter, "The range of α").
MAX_ALPHA = 10.0


def _check_alpha(
    alpha: float, *, max_len: int | None = None, name: str = "alpha"
) -> None:
    """α must be a number from 0 to MAX_ALPHA: lp must grow with length (α >= 0) and
    stay finite, up to max_len tokens if given (an infinite lp makes scores NaN)."""
    if not 0 <= alpha <= MAX_ALPHA:  # also rejects NaN and infinity
        raise ValueError(f"{name} must be >= 0 and at most {MAX_ALPHA:g}, got {alpha}")
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

    Shapes (B sentences, K beams, best first):
        tokens: (B, K) the token each beam just output (pad_id once it has ended)
        parents: (B, K) the beam, at the step before, that each beam extends
        log_probs, scores: (B, K) log p(beam | source) and log_prob / lp(length)
        ended: (B, K) True for the beams that output EOS or reached the length limit
    """

    step: int
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
    """Beam search with the length penalty lp(Y) = ((5 + |Y|)/6)^α, for a batch of sentences.

    Each step extends the K beams of every sentence by every token and keeps the K best
    candidates by log p(Y | X) / lp(|Y|); a beam that has ended stays a candidate as it is.
    A sentence is finished when none of its open beams can overtake its best ended one; the
    search stops when every sentence is finished. on_step, if given, sees every step.

    Shapes:
        src: (B, S) token ids, padded with pad_id
        returns B hypotheses, each sentence's best, in the order of the batch
    """
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    _check_alpha(alpha, max_len=model.config.max_len)
    _check_ids(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    _check_src(src, pad_id)
    B, K, device = src.size(0), beam_size, src.device
    if B == 0:
        return []
    V = model.config.target_vocab_size
    with _inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = output_limits(model, src, pad_id=pad_id, max_len=max_len)  # (B,)
        # The K beams of sentence b are rows b*K ... b*K + K - 1 of one batch of B*K rows.
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, d_model)
        src_mask = src_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
        cache = DecoderCache.empty(len(model.decoder.layers)) if use_cache else None
        ys = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        # At the start the K beams would be K copies of BOS: keep one, the others at -inf.
        log_prob = torch.full((B, K), float("-inf"), device=device)
        log_prob[:, 0] = 0.0
        length = torch.zeros(B, K, dtype=torch.long, device=device)
        ended = torch.zeros(B, K, dtype=torch.bool, device=device)
        # An ended beam has one continuation, padding, which leaves its log-probability alone.
        stay = torch.full((V,), float("-inf"), device=device)
        stay[pad_id] = 0.0
        first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1)
        # Each sentence's best ended hypothesis so far. Open beams whose score rises with lp
        # can push an ended beam out of the K; the search must not lose it with the beam.
        kept_score = torch.full((B,), -torch.inf, device=device)
        kept_log_prob = torch.full((B,), -torch.inf, device=device)
        # its row: BOS, the tokens, then padding
        kept_ys = ys.new_full((B, int(limits.max()) + 1), pad_id)
        for t in range(int(limits.max())):
            step = _next_log_probs(model, ys, memory, src_mask, cache).view(B, K, V)
            step = _forbid_specials(step, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
            step = torch.where(ended[..., None], stay, step)  # (B, K, V)
            candidate_log_prob = (log_prob[..., None] + step).view(B, K * V)
            candidate_length = torch.where(ended, length, t + 1)  # (B, K)
            lp = length_penalty(candidate_length, alpha).repeat_interleave(V, dim=1)
            scores, best = (candidate_log_prob / lp).topk(K, dim=-1)  # (B, K)
            parents, tokens = best // V, best % V  # (B, K)
            log_prob = candidate_log_prob.gather(1, best)
            length = candidate_length.gather(1, parents)
            ended = ended.gather(1, parents) | (tokens == eos_id)
            ended |= t + 1 >= limits[:, None]
            # Every beam continues the row of its parent: reorder the rows, then append.
            rows = (first_row + parents).view(-1)  # (B*K,)
            ys = torch.cat([ys[rows], tokens.view(-1, 1)], dim=1)  # (B*K, t + 2)
            if cache is not None:  # rows stay within each sentence's beams: see reorder
                cache.reorder(rows, static=False)
            # Keep the best ended beam of each sentence if it beats the one kept so far
            # (an ended beam's score is log_prob / lp(length), as the candidates were scored).
            ended_score, ended_beam = torch.where(ended, scores, -torch.inf).max(dim=1)
            better = ended_score > kept_score  # (B,)
            kept_score = torch.where(better, ended_score, kept_score)
            kept_log_prob = torch.where(
                better, log_prob.gather(1, ended_beam[:, None])[:, 0], kept_log_prob
            )
            kept_ys[:, : t + 2] = torch.where(
                better[:, None], ys[first_row[:, 0] + ended_beam], kept_ys[:, : t + 2]
            )
            if on_step is not None:
                on_step(BeamStep(t, tokens, parents, log_prob, scores, ended))
            if _finished(kept_score, log_prob, ended, limits, alpha).all():
                break
    # Every sentence now has a kept hypothesis that none of its open beams can overtake.
    return [
        _hypothesis(row[1:], lp, score, eos_id=eos_id, pad_id=pad_id)
        for row, lp, score in zip(
            kept_ys, kept_log_prob.tolist(), kept_score.tolist(), strict=True
        )
    ]


def _finished(
    kept_score: Tensor, log_prob: Tensor, ended: Tensor, limits: Tensor, alpha: float
) -> Tensor:
    """The sentences whose best ended hypothesis (kept_score, (B,)) no open beam of
    (B, K) can overtake: -> (B,).

    An open beam's log-probability can only fall as it grows, and lp only rise, up to
    lp(limit): the best it can still score is log_prob / lp(limit).
    """
    best_open = torch.where(ended, -torch.inf, log_prob).amax(dim=1)  # (B,)
    reachable = best_open / length_penalty(limits, alpha)  # (B,)
    return (kept_score >= reachable) | (best_open == -torch.inf)


# %% [markdown]
# Beam search against greedy decoding, for both models. What a search is for is a higher score
# $s(Y)$, so the first measure scores greedy decoding's outputs the same way and counts the
# strings on which beam search found a higher one; exact matches, the second measure, are a
# coarser yardstick.

# %% tags=["nbval-ignore-output"]
from transformer.decode import beam_search

beam = beam_search(model, test_src, **ids)
beam_half = beam_search(half_trained, test_src, **ids)
accuracy = pd.DataFrame(
    {
        "greedy": [exact(greedy), exact(greedy_half)],
        "beam 4, α = 0.6": [exact(beam), exact(beam_half)],
    },
    index=pd.Index(["trained (400 steps)", "half-trained (150 steps)"], name="model"),
)
assert exact(beam) > 0.8


def gnmt_score(h: Hypothesis, alpha: float = 0.6) -> float:
    """s(Y) of any hypothesis, greedy decoding's included: log p / lp(|Y|), EOS counted."""
    length = torch.tensor(float(len(h.tokens) + h.ended))
    return h.log_prob / length_penalty(length, alpha).item()


higher, lower = {}, {}
for name, (g_out, b_out) in {
    "trained": (greedy, beam),
    "half-trained": (greedy_half, beam_half),
}.items():
    gains = [b.score - gnmt_score(g) for g, b in zip(g_out, b_out, strict=True)]
    higher[name] = sum(gain > 1e-6 for gain in gains) / len(gains)
    lower[name] = sum(gain < -1e-6 for gain in gains) / len(gains)
    print(
        f"{name}: beam search scores higher than greedy decoding on {higher[name]:.0%} "
        f"of the strings, lower on {lower[name]:.0%}"
    )
# the unsure model leaves the search much more to find; it is rarely worse than greedy
assert higher["trained"] < 0.05
assert higher["half-trained"] > max(0.1, 4 * higher["trained"])
assert max(lower.values()) < 0.02

# %% tags=["nbval-ignore-output"]
both = list(zip(greedy_half, beam_half, references, strict=True))
beam_only = sum(spell(b.tokens) == r != spell(g.tokens) for g, b, r in both)
greedy_only = sum(spell(g.tokens) == r != spell(b.tokens) for g, b, r in both)
print(
    f"half-trained: beam search gets {beam_only} strings right that greedy decoding gets "
    f"wrong, and {greedy_only} wrong that greedy decoding gets right"
)
# exact matches move far less than the scores: the net change in strings right is at most
# half the number of strings on which beam search scored higher (the prose below)
assert beam_only + greedy_only <= 25
assert abs(beam_only - greedy_only) <= higher["half-trained"] * len(references) / 2
assert (accuracy.loc["trained (400 steps)"] > 0.8).all()
print("% of the 200 strings exactly right:")
(accuracy * 100).round(1)

# %% [markdown]
# With the trained model, greedy decoding already gets most strings right (the table), and beam
# search finds a higher-scoring output for almost none of them: there is little left for a search to
# find. On the half-trained one, beam search finds a higher score for many more strings, and
# (almost) never a lower one; but the exact matches move far less than that: it gets some strings
# right that greedy decoding gets wrong, and a few wrong that greedy decoding gets right (the counts
# above). A higher $s(Y)$ is not the same as the right answer when the model itself is unsure. (The
# shares and counts depend on the trained weights, which depend on the CPU that trained them; the
# cells assert what the prose says, not the figures.) What search does for the translation models,
# in BLEU, the results chapter measures.

# %% [markdown]
# ### What the length penalty does
#
# The same search on the half-trained model with several values of $\alpha$, and the length of
# its outputs relative to the right answers' (1 means as long as the answers on average). The
# larger $\alpha$, the less a long hypothesis is held back by its many factors below one, and the
# longer the outputs; $\alpha = 0$ gives the shortest.

# %%
rows = []
for alpha in (0.0, 0.6, 1.0, 2.0):
    found = beam_search(half_trained, test_src, alpha=alpha, **ids)
    rows.append(
        {
            "α": alpha,
            "% exactly right": 100 * exact(found),
            "output length / answer length": sum(len(h.tokens) for h in found)
            / sum(len(r) for r in references),
        }
    )
by_alpha = pd.DataFrame(rows).set_index("α")
lengths = by_alpha["output length / answer length"]
assert lengths.is_monotonic_increasing and lengths[0.0] < lengths[2.0]
# exact matches move by a few points (of 100) at most
right = by_alpha["% exactly right"]
assert right.max() - right.min() <= 10

# %% tags=["nbval-ignore-output"]
by_alpha.round({"% exactly right": 1, "output length / answer length": 3})

# %% [markdown]
# The length of the outputs grows with $\alpha$. Whether that gets more strings exactly right
# depends on whether the model's outputs were too short or too long to begin with (the length column
# says which), and the exact matches move by a few points at most (in the stored run, not at all),
# too few to rank the values. The penalty's purpose shows in translation, where, without it,
# "regular beam search will favor shorter results over longer ones on average"
# {cite:p}`wu2016google`. How BLEU and the output length of the translation models change with
# $\alpha$ and the beam size is measured with those models, in the results chapter ("Beam size and
# the length penalty").
#
# **The range of $\alpha$.** The search accepts $0 \le \alpha \le 10$ (`MAX_ALPHA`). A
# negative $\alpha$ would make $lp$ shrink as outputs grow. A large one is useless,
# since Wu et al. try values up to 1 and $\alpha = 2$ already lengthens the outputs most
# here, and it breaks the arithmetic: $lp = ((5 + |Y|)/6)^\alpha$ overflows 32-bit
# floats to $\infty$. Every candidate the search rules out has $\log p = -\infty$
# (padding, BOS, a beam not yet open, any continuation of an ended beam but padding),
# and its score $-\infty / \infty$ is NaN, which `topk` ranks above every number: the
# search would keep exactly what it had ruled out. At $\alpha = 10$, $lp$ stays finite
# for outputs of 40,000 tokens, far more positions than any model here has (the
# translation models have 512); the search checks it for the model's `max_len` all the
# same.

# %%
from transformer.decode import MAX_ALPHA

for length, alpha in [(2, 1e308), (40_000, MAX_ALPHA)]:
    lp = length_penalty(torch.tensor(float(length)), alpha)
    ruled_out = (-torch.inf / lp).item()
    print(f"α = {alpha:g}, {length:,} tokens: lp = {lp:.3g}, -inf / lp = {ruled_out}")
assert length_penalty(torch.tensor(2.0), 1e308).isinf()
assert length_penalty(torch.tensor(40_000.0), MAX_ALPHA).isfinite()
for bad in (-0.1, MAX_ALPHA + 0.1, float("inf"), float("nan")):
    message = ""
    try:
        beam_search(half_trained, test_src[:1], alpha=bad, **ids)
    except ValueError as err:
        message = str(err)
    assert message.startswith("alpha must be >= 0 and at most 10, got"), message
print(message)

# %% [markdown]
# ## A beam search tree
#
# What beam search does, drawn for one string: the first of the 200 that the half-trained model
# gets right with beam search and wrong with greedy decoding. Each column is a step, and each
# point one of the $K = 4$ hypotheses kept at that step, placed by its rank (1 = best score) and
# labelled with the letter it has just added; a grey line joins it to the hypothesis it extends.
# Hover over a point for the whole hypothesis, its log-probability and its score. Red points have
# just output EOS; grey ones ended earlier and are carried along unchanged, until open beams
# outscore them (the best ended one is kept aside all the same). Follow the dashed
# orange path, the one greedy decoding takes, and the black one, which leads to the result of
# beam search: where they part, the black path takes a token that was *not* the most probable
# continuation, a runner-up that greedy decoding discards for good, and a few steps later it is
# ahead.

# %% tags=["nbval-ignore-output"]
from transformer.decode import BeamStep

fixed = [
    i
    for i, (g, b, r) in enumerate(zip(greedy_half, beam_half, references, strict=True))
    if spell(b.tokens) == r != spell(g.tokens)
]
assert fixed, "beam search gets no string right that greedy decoding gets wrong"
chosen = fixed[0]
one_src = test_src[chosen : chosen + 1, : int((test_src[chosen] != pad_id).sum())]
steps: list[BeamStep] = []
[tree_result] = beam_search(half_trained, one_src, **ids, on_step=steps.append)


def beam_tree(steps: list[BeamStep]) -> pd.DataFrame:
    """One row per kept hypothesis and step (sentence 0), with its parent's rank."""
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
                text, label = texts[parent] + letters[token - 3], letters[token - 3]
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
    f"greedy       {spell(greedy_half[chosen].tokens)}  (log p {greedy_half[chosen].log_prob:.3f})"
)
print(f"beam search  {spell(tree_result.tokens)}  (score {tree_result.score:.3f})")
assert spell(tree_result.tokens) == spell(beam_half[chosen].tokens)

# %% tags=["nbval-ignore-output"]
# A hypothesis's text is its path: prefixes of an output are the points on the way to it.
result_text = spell(tree_result.tokens) + " EOS"
greedy_text = spell(greedy_half[chosen].tokens) + " EOS"
tree["path"] = [
    "result"
    if result_text.startswith(h)
    else "greedy"
    if greedy_text.startswith(h)
    else "other"
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
edge_encoding = dict(x="parent step:Q", x2="step:Q", y="parent rank:Q", y2="rank:Q")
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
        f"Beam search (K = 4, α = 0.6) for the source {spell(one_src[0].tolist())!r}",
        subtitle="black: the path to the result; dashed orange: greedy decoding's path",
    ),
)

# %% [markdown]
# ## How fast
#
# Sentences per second for beam search with $K = 4$ and for greedy decoding, on the 200 strings
# with the trained model and the cache, on this machine's CPU (one thread). The figures for the
# translation models are in the results chapter.

# %% tags=["nbval-ignore-output"]
beam_seconds = best_time(lambda: beam_search(model, test_src, **ids))
print(f"beam 4: {len(test_src) / beam_seconds:,.0f} sentences/s")
print(f"greedy: {len(test_src) / cached_seconds:,.0f} sentences/s")
print(f"beam search takes {beam_seconds / cached_seconds:.1f} times as long")
assert 1 < beam_seconds / cached_seconds < 8  # a timing: loose bounds

# %% [markdown]
# Beam search with four beams carries four rows per sentence through every step, yet takes
# only a few times as long as greedy decoding (the ratio printed above; a timing, so it moves
# from run to run): much of a step's cost, Python's and that of launching each operation, does
# not grow with its rows.

# %% [markdown]
# ## Ended beams that keep their slot: what it costs
#
# Our search lets a hypothesis that has ended keep its slot among the $K$, where tensor2tensor keeps
# $K$ beams open at every step and sets the ended ones aside (the deviation named above). With a
# slot taken by an ended beam, fewer continuations are explored, so our search can miss an output
# that tensor2tensor's bookkeeping finds. The cost, measured on a real model: the shipped
# German→English model (the chapter on the book's models) translates the 1,000 sentences of the test
# set both ways. `two_set_beam_search` below is tensor2tensor's bookkeeping for one sentence, with
# our scores, length limit and stopping rule; it decodes one sentence at a time, so this cell takes
# a minute or two of CPU time.

# %% tags=["nbval-ignore-output"]
import math

from sacrebleu.metrics import BLEU

from transformer.data import DATA_DIR, load_pairs
from transformer.decode import _forbid_specials, _next_log_probs
from transformer.decoder import DecoderCache
from transformer.train import load_model


def two_set_beam_search(
    model: Transformer,
    src: Tensor,
    *,
    beam_size: int = 4,
    alpha: float = 0.6,
    bos_id: int,
    eos_id: int,
    pad_id: int,
) -> tuple[list[int], float]:
    """tensor2tensor's bookkeeping for one sentence, src (1, S): K beams stay open at every
    step; a hypothesis that ends leaves the beam, and the best of those is kept. The same
    scores, limit and stopping rule as beam_search. -> (tokens, score)."""
    K, V = beam_size, model.config.target_vocab_size
    with torch.no_grad():
        src_mask = padding_mask(src, pad_id)  # (1, 1, 1, S)
        memory = model.encode(src, src_mask).repeat(K, 1, 1)  # (K, S, d_model)
        src_mask = src_mask.repeat(K, 1, 1, 1)  # (K, 1, 1, S)
        limit = int(output_limits(model, src, pad_id=pad_id)[0])
        cache = DecoderCache.empty(len(model.decoder.layers))
        ys = torch.full((K, 1), bos_id)
        log_prob = torch.full((K,), -math.inf)
        log_prob[0] = 0.0  # one beam at the start, not K copies of BOS
        best_score, best_tokens = -math.inf, []
        for t in range(limit):
            step = _next_log_probs(model, ys, memory, src_mask, cache)  # (K, V)
            step = _forbid_specials(step, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
            candidates = log_prob[:, None] + step  # (K, V)
            lp = length_penalty(torch.tensor(t + 1.0), alpha)
            # the candidates that end with EOS leave the beam; the best of them is kept
            ending = candidates[:, eos_id] / lp  # (K,)
            k = int(ending.argmax())
            if ending[k] > best_score:
                best_score, best_tokens = float(ending[k]), ys[k, 1:].tolist()
            candidates[:, eos_id] = -math.inf
            log_prob, index = candidates.view(-1).topk(K)  # the K best open ones
            parents, tokens = index // V, index % V
            ys = torch.cat([ys[parents], tokens[:, None]], dim=1)  # (K, t + 2)
            cache.reorder(parents, static=False)
            if t + 1 == limit:  # the limit cuts the open beams: they end here too
                if log_prob[0] / lp > best_score:
                    best_score, best_tokens = (
                        float(log_prob[0] / lp),
                        ys[0, 1:].tolist(),
                    )
                break
            reachable = log_prob[0] / length_penalty(torch.tensor(float(limit)), alpha)
            if best_score >= reachable:
                break
    return best_tokens, best_score


de_en, de_en_tokenizer = load_model(DATA_DIR.parents[1] / "checkpoints" / "de-en")
test_pairs = load_pairs("test_2016_flickr", "de-en")
de_en_ids = dict(
    bos_id=de_en_tokenizer.bos_id,
    eos_id=de_en_tokenizer.eos_id,
    pad_id=de_en_tokenizer.pad_id,
)
sentences = [
    torch.tensor([de_en_tokenizer.encode(source) + [de_en_tokenizer.eos_id]])
    for source, _ in test_pairs
]
ours = [beam_search(de_en, src, **de_en_ids)[0] for src in sentences]
theirs = [two_set_beam_search(de_en, src, **de_en_ids) for src in sentences]
differ = [
    (mine, other)
    for mine, other in zip(ours, theirs, strict=True)
    if mine.tokens != other[0]
]
references = [[target for _, target in test_pairs]]
bleu = {
    name: BLEU().corpus_score([de_en_tokenizer.decode(t) for t in outputs], references)
    for name, outputs in (
        ("ours", [h.tokens for h in ours]),
        ("tensor2tensor's", [tokens for tokens, _ in theirs]),
    )
}
print(f"different outputs: {len(differ)} of {len(sentences):,}")
for mine, (tokens, score) in differ:
    print(
        f"  s(Y) {mine.score:.3f} -> {score:.3f}: {de_en_tokenizer.decode(mine.tokens)!r}"
    )
    print(f"{'':>24}{de_en_tokenizer.decode(tokens)!r}")
for name, result in bleu.items():
    print(f"{name} bookkeeping: BLEU {result.score:.2f}")
# a handful of sentences, each given a higher score, and a shorter output, by the two sets;
# BLEU barely moves
assert 1 <= len(differ) <= 10
assert all(score > mine.score for mine, (_, score) in differ)
assert all(len(tokens) < len(mine.tokens) for mine, (tokens, _) in differ)
assert min(len(tokens) for _, (tokens, _) in differ) <= 2
assert abs(bleu["ours"].score - bleu["tensor2tensor's"].score) < 0.2

# %% [markdown]
# A handful of the 1,000 outputs change (the count above), each to one that scores higher: an ended
# beam holding a slot does now and then cost our search a better hypothesis. But look at what the
# better search finds: each time a *shorter* output, a translation cut off halfway, once just "The".
# The model itself, even with the length penalty, rates these above the full sentences, and the
# search that finds more of what the model prefers translates worse, as Stahlberg and Byrne found
# with exact search, which often returns the empty translation {cite:p}`stahlberg2019nmt`. Corpus
# BLEU (sacreBLEU, the results chapter's measure) moves by less than 0.2 points. We keep our
# bookkeeping for what it buys: beam size 1 is exactly greedy decoding, the whole batch steps
# together with $K$ candidates per sentence, and the results chapter's scores were computed with it.

# %% [markdown]
# ## Translating from the command line
#
# The functions above take tensors of token ids. The command
# `python -m transformer translate --pair de-en` takes text: it loads a shipped model (the
# training chapter's `export_model` writes one, `load_model` reads it back with its tokenizer),
# and translates
#
# ```
# python -m transformer translate --pair de-en "Zwei Hunde spielen im Schnee."
# python -m transformer translate --pair fr-en --beam 1 < sentences.txt > translations.txt
# ```
#
# the sentences given as arguments, or else standard input, one sentence per line, writing one
# translation per line to standard output: the $n$-th output line translates the $n$-th input,
# so that the two files can be read side by side. How it goes, and what it does with inputs the
# model was not made for:
#
# - **The same text processing as in training.** Each sentence is normalised and cut into words
#   by spaCy's rules for the source language, then into BPE pieces (the data chapter), and the
#   encoder gets `x <eos>`, the form it was trained on. The output ids are decoded back into
#   text by the same tokenizer.
# - **Batched by length.** The sentences are sorted by their number of tokens, longest first, and
#   decoded `--batch-size` at a time, so that each batch holds sentences of similar lengths and
#   little padding; the translations are then put back in the input order. Batching changes no
#   output, up to floating-point rounding: the decoding functions give a sentence the same
#   result in any batch (their tests check it on the CPU; on a GPU, other batch shapes may run
#   other kernels, so a near-tie between two hypotheses could in principle go the other way).
# - **Empty lines** (or lines of spaces) give empty lines, and never reach the model.
# - **Unknown characters** (an emoji, a Chinese character: anything absent from the training
#   text) become the `<unk>` token, as in the data chapter; the translation may then contain the
#   text `<unk>`.
# - **Too long.** The model has `config.max_len` positions (its positional encoding), so a source
#   of more tokens than that, EOS included, cannot be encoded at all. We cut such a source to its
#   first `max_len - 1` tokens, translate those and EOS, and say so on standard error, naming the
#   sentence by its number (its line). We chose a warning over an error because a file of
#   thousands of lines should not lose every translation to one overlong line, and because the
#   output keeps its one line per input either way. A translation stopped by the length limit
#   (source length + 50, or `max_len`) without EOS is reported the same way.
# - **Errors** print one line on standard error, naming the path where a folder is at fault,
#   and exit with status 2, without a traceback: an unknown pair or option, a model folder that
#   does not exist (for the default folder, before any model has been shipped, the message
#   says how to train one), one whose files are missing, corrupt or do not fit together (the
#   checks of `load_model`: the model's configuration, the tokenizer's fingerprint, the names
#   and shapes of the weights), a model of the other language pair, or no spaCy.
# - **A file name given as a sentence**, `translate --pair de-en sätze.txt`, is most
#   likely a file meant as input; it is still translated as the sentence it is (the
#   usage says arguments are sentences, and a sentence may happen to name a file), with
#   a one-line warning that suggests standard input, `< sätze.txt`.
# - **The search** is the paper's, beam search with $K = 4$ and $\alpha = 0.6$, by
#   default; `--beam 1` is `greedy_decode`. `--alpha` must be a number from 0 to 10 (see
#   "The range of $\alpha$"): any other value, `inf` or `nan` included, is an error.
#
# The sorting into batches, first: the indices of the sentences, longest first, cut into
# batches.

# %%
#| export
from collections.abc import Sequence

from transformer.data import DATA_DIR, PAIRS, Tokenizer, normalize

BATCH_SIZE = 32  # sentences decoded at once by `translate`
# The shipped models, beside data/ in the repository: checkpoints/de-en, checkpoints/fr-en.
CHECKPOINTS_DIR = DATA_DIR.parents[1] / "checkpoints"


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """The indices 0 … n-1 of n sentences in batches of at most batch_size, longest first
    (ties in input order), so that each batch holds sentences of similar lengths."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


def _listed(items: list[str], most: int = 10) -> str:
    """'a', 'a and b', 'a, b and c', '… and 3 more'."""
    if len(items) > most:
        return f"{', '.join(items[:most])} and {len(items) - most} more"
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _sentences(indices: list[int]) -> str:
    """'sentence 3' or 'sentences 3, 8 and 12' for indices 2, 7, 11: numbered from 1, as
    lines are."""
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
    """Translations of `sentences`, in their order: beam search (beam_size 1: greedy decoding)
    over batches of similar lengths, on the model's device.

    An empty sentence translates to "". A source longer than the model's positions is cut to
    its first config.max_len - 1 tokens, then <eos>; `warn`, if given, is told about those and
    about translations that the length limit stopped before <eos>. Needs spaCy (to cut the
    sentences into words) unless every sentence is empty.
    """
    if isinstance(sentences, str):
        raise TypeError("translate takes a sequence of sentences, not one string")
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    _check_alpha(alpha, max_len=model.config.max_len)
    texts = [normalize(s) for s in sentences]
    todo = [i for i, text in enumerate(texts) if text]  # empty ones stay ""
    encoded = tokenizer.encode_batch([texts[i] for i in todo]) if todo else []
    room = model.config.max_len - 1  # source tokens that fit with their <eos>
    with_eos = {i: len(ids) + 1 for i, ids in zip(todo, encoded, strict=True)}
    too_long = {i: n for i, n in with_eos.items() if n > model.config.max_len}
    if too_long and warn is not None:
        sizes = _listed([str(n) for n in too_long.values()])
        warn(
            f"{_sentences(list(too_long))}: {sizes} tokens with <eos>, more than the model's "
            f"{model.config.max_len} positions: translating the first {room}"
        )
    sources = [ids[:room] + [tokenizer.eos_id] for ids in encoded]
    special = {
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
    }
    device = next(model.parameters()).device
    results = [""] * len(texts)
    cut_off = []
    for batch in length_sorted_batches([len(s) for s in sources], batch_size):
        src = torch.full(
            (len(batch), len(sources[batch[0]])), tokenizer.pad_id, dtype=torch.long
        )  # (B, S): the longest first
        for row, j in enumerate(batch):
            src[row, : len(sources[j])] = torch.tensor(sources[j])
        src = src.to(device)
        if beam_size == 1:
            found = greedy_decode(model, src, **special)
        else:
            found = beam_search(model, src, beam_size=beam_size, alpha=alpha, **special)
        for j, hypothesis in zip(batch, found, strict=True):
            results[todo[j]] = tokenizer.decode(hypothesis.tokens)
            if not hypothesis.ended:
                cut_off.append(todo[j])
    if cut_off and warn is not None:
        warn(
            f"{_sentences(sorted(cut_off))}: the translation stopped at the length "
            "limit, before <eos>"
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
assert sorted(i for b in length_sorted_batches(range(10), 3) for i in b) == list(
    range(10)
)

# %% [markdown]
# The command itself. Its options have the paper's values as defaults, and its help says what
# it does with empty, overlong and unknown input:

# %%
#| export
import argparse
import os
import shlex
import sys
from pathlib import Path

# the command-line conventions shared by every command: one line, status 2
from transformer.data import _Parser, _UsageError

PROG = "python -m transformer translate"
_EPILOG = """\
Input and output: the SENTENCEs given, or else standard input, one sentence per line
(UTF-8); one translation per line on standard output, in the same order. An empty line
gives an empty line. Characters that the vocabulary lacks become <unk>. Put -- before
sentences that begin with a dash. A SENTENCE that names an existing file is translated
as a sentence all the same, with a warning: a file of sentences goes on standard input,
< FILE.

A sentence longer than the model's positions (its config's max_len, <eos> included) is
cut to fit: its first max_len - 1 tokens are translated, and a warning on standard error
names it by its number (the line number, for standard input). So is a translation that
the length limit stopped before <eos>.

Errors (an unknown pair or option, a missing or unusable model folder, no spaCy) print
one line on standard error and exit with status 2."""


def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that decodes with a trained model (`translate` and
    chapter 16's `evaluate`): the pair, the search and its defaults, the model folder, the device
    and the batch size. `check_model_options` checks their values."""
    p.add_argument("--pair", required=True, help="de-en or fr-en")
    p.add_argument(
        "--beam",
        type=int,
        default=4,
        metavar="N",
        help="beam size; 1 is greedy decoding (default: 4, the paper's)",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=0.6,
        metavar="A",
        help=f"length penalty α of beam search, from 0 to {MAX_ALPHA:g} (default: 0.6, "
        "the paper's)",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="a shipped model or a checkpoint folder (default: checkpoints/<pair> in the "
        "repository)",
    )
    p.add_argument(
        "--device", choices=["cpu", "cuda"], help="default: cuda when available"
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=BATCH_SIZE,
        metavar="N",
        help=f"sentences decoded at once (default: {BATCH_SIZE})",
    )


def check_model_options(args: argparse.Namespace) -> str:
    """The device to decode on, once the values of `add_model_options`' options are checked:
    a bad one raises `_UsageError` with one line that names it."""
    if args.pair not in PAIRS:
        raise _UsageError(
            f"unknown language pair {args.pair!r}: choose one of {', '.join(PAIRS)}"
        )
    if args.beam < 1:
        raise _UsageError(f"--beam must be at least 1, got {args.beam}")
    try:
        _check_alpha(args.alpha, name="--alpha")
    except ValueError as err:
        raise _UsageError(str(err)) from None
    if args.batch_size < 1:
        raise _UsageError(f"--batch-size must be at least 1, got {args.batch_size}")
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise _UsageError("--device cuda, but no CUDA GPU is available")
    return device


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog=PROG,
        description="Translate sentences with a trained model (Part III).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sentences",
        nargs="*",
        metavar="SENTENCE",
        help="a sentence to translate (default: read standard input)",
    )
    add_model_options(p)
    return p


def _load(
    pair: str, checkpoint: Path | None, device: str, *, alpha: float | None = None
) -> tuple[Transformer, Tokenizer]:
    """The model and tokenizer to translate with, or a one-line error naming the folder; with
    `alpha`, also one if the length penalty would overflow within the model's positions."""
    from transformer.train import load_model  # only now: --help stays quick

    folder = CHECKPOINTS_DIR / pair if checkpoint is None else Path(checkpoint)
    if not folder.is_dir():
        if checkpoint is None:
            raise _UsageError(
                f"no {pair} model in {folder}: none has been shipped yet. Train one with "
                f"`python -m transformer train --pair {pair} --export {folder}` (chapter "
                "13), or name a model folder with --checkpoint DIR"
            )
        raise _UsageError(f"no model folder {folder}")
    try:
        model, tokenizer = load_model(folder, device=device)
    # Not a whole, readable model, whatever the reason: say why.
    except Exception as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if str(folder) not in message:
            message = f"{folder}: {message}"
        raise _UsageError(f"cannot load the model: {message}") from err
    if tokenizer.languages != PAIRS[pair]:
        raise _UsageError(f"{folder} holds a {tokenizer.pair} model, not a {pair} one")
    if alpha is not None:
        try:
            _check_alpha(alpha, max_len=model.config.max_len, name="--alpha")
        except ValueError as err:
            raise _UsageError(str(err)) from None
    return model, tokenizer


def _read_lines(stream) -> list[str]:
    """The lines of a text stream, read as UTF-8 (undecodable bytes become U+FFFD)."""
    if hasattr(stream, "buffer"):
        text = stream.buffer.read().decode("utf-8", errors="replace")
    else:
        text = stream.read()
    lines = text.split("\n")  # not splitlines(): U+2028 and friends are inside a line
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


def main(argv: list[str] | None = None) -> int:
    """`python -m transformer translate ...`; returns the exit status."""

    def warn(message: str) -> None:
        print(f"{PROG}: warning: {message}", file=sys.stderr)

    try:
        argv = list(sys.argv[1:] if argv is None else argv)
        # After "--" every argument is a sentence (parse_intermixed_args mishandles "--").
        cut = argv.index("--") if "--" in argv else len(argv)
        args = _parser().parse_intermixed_args(argv[:cut])
        args.sentences += argv[cut + 1 :]
        device = check_model_options(args)
        model, tokenizer = _load(args.pair, args.checkpoint, device, alpha=args.alpha)
        if args.sentences:
            sentences = args.sentences
            # isfile, not Path.is_file: a sentence too long for a file name is no error
            for name in filter(os.path.isfile, sentences):
                # still a sentence, as the usage says; but a file was likely meant
                warn(
                    f"SENTENCE {name!r} names a file, translated here as a sentence: "
                    f"to translate the file's lines, give it as standard input, "
                    f"< {shlex.quote(name)}"
                )
        else:
            if sys.stdin.isatty():
                print("one sentence per line; end with Ctrl-D", file=sys.stderr)
            sentences = _read_lines(sys.stdin)
        translations = translate(
            model,
            tokenizer,
            sentences,
            beam_size=args.beam,
            alpha=args.alpha,
            batch_size=args.batch_size,
            warn=warn,
        )
    except SystemExit as stop:  # --help
        return int(stop.code or 0)
    # ImportError: no spaCy, and how to get it.
    except (_UsageError, ImportError) as err:
        print(f"{PROG}: error: {str(err).splitlines()[0]}", file=sys.stderr)
        return 2
    sys.stdout.write("".join(f"{t}\n" for t in translations))
    sys.stdout.flush()
    return 0


# %% [markdown]
# Its help (the command is the package's `python -m transformer translate`; here we call its
# `main` directly):

# %%
import contextlib
import io
from unittest import mock

from transformer.decode import main

with mock.patch.dict(os.environ, {"COLUMNS": "96"}):  # the help's width
    assert main(["--help"]) == 0

# %% [markdown]
# A folder that holds no model is an error, with exit status 2 and one line that names it:

# %%
errors = io.StringIO()
with contextlib.redirect_stderr(errors):
    status = main(["--pair", "de-en", "--checkpoint", "no-such-folder", "Ein Hund."])
print(f"exit status {status}: {errors.getvalue()}")
assert status == 2 and errors.getvalue().count("\n") == 1
assert "no-such-folder" in errors.getvalue()

# %% [markdown]
# The tests (`tests/test_translate.py`) run the command on a tiny model exported as the training
# chapter ships its models, and check the rest: arguments and standard input give the same
# translations, in the input order; an empty line gives an empty line; an overlong sentence
# gives a warning and a translation of its beginning; emoji and Chinese characters do not crash
# it; `--beam 1` gives the output of `greedy_decode`; missing, corrupt and mismatched model
# folders give an error that names them. What the shipped models' translations are worth is the
# subject of the results chapter.
