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
# This chapter writes greedy decoding, the key/value cache that makes each step cheap, and beam
# search with the length penalty, each for one sentence, and tries them on the book's
# German→English model.

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

# %% [markdown]
# ## A model to decode
#
# The shipped model, loaded as the training chapter saved it, and 50 sentences of the validation
# split, each cut into BPE tokens and ended with EOS: one sentence is one tensor of $S$ ids.

# %%
import time

import altair as alt
import pandas as pd
import torch

from transformer.multi30k import load_pairs
from transformer.paths import CHECKPOINTS_DIR
from transformer.plots import use_book_renderer
from transformer.training_loop import load_trained

use_book_renderer()
pd.set_option("display.max_colwidth", None)
model, tokenizer = load_trained(CHECKPOINTS_DIR / "de-en")
model.eval()  # no dropout while decoding
eos_id = tokenizer.eos_id
ids = dict(bos_id=tokenizer.bos_id, eos_id=eos_id, pad_id=tokenizer.pad_id)
pairs = load_pairs("val", "de-en")[:50]
encoded = tokenizer.encode_batch([source for source, _ in pairs])
sources = [torch.tensor(tokens + [eos_id]) for tokens in encoded]  # (S,)
sources[0]

# %% [markdown]
# ## The next token
#
# Every search needs one thing from the model: the log-probabilities of the next token after an
# output so far. The decoder reads BOS and the tokens so far, $(N, t)$ for $N$ outputs at once,
# under the causal mask, and the output layer turns its last position into $(N, V)$
# log-probabilities. Two tokens are never chosen: padding, and BOS, which only starts an output.
# A `Hypothesis` is a finished output: its tokens without BOS and EOS, $\log p(Y \mid X)$, the
# score the search ranked it by, and whether it ended with EOS or was cut by the length limit,
# the source's length + 50. The paper's beam size and $\alpha$ are named `PAPER_BEAM_SIZE` and
# `PAPER_ALPHA`; the package's defaults, `BEAM_SIZE` and `ALPHA`, are set from them.

# %%
#| export paper_search
"""The paper's search (Section 6.1): "beam search with a beam size of 4 and
length penalty α = 0.6", and "maximum output length ... input length + 50";
and the package's default search, set from it."""

PAPER_BEAM_SIZE = 4
PAPER_ALPHA = 0.6
EXTRA_LENGTH = 50
BEAM_SIZE = PAPER_BEAM_SIZE  # the package's defaults
ALPHA = PAPER_ALPHA


# %%
#| export
"""Greedy decoding and beam search for one sentence (Section 6.1 of Vaswani et
al., 2017, with the length penalty of Wu et al., 2016)."""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.kv_cache import DecoderCache, decode_step
from transformer.masking import causal_mask, padding_mask
from transformer.model import Transformer
from transformer.paper_search import ALPHA, BEAM_SIZE, EXTRA_LENGTH


@dataclass(frozen=True)
class Hypothesis:
    """One output: its tokens without BOS and EOS, log p(Y | X), the score the
    search maximised, and ended (False: the length limit cut it off)."""

    tokens: list[int]
    log_prob: float
    score: float
    ended: bool


def next_log_probs(model, ys, memory, src_mask) -> Tensor:
    """log p(next token | ys, source) for every row, ys (N, t) -> (N, V): the
    decoder over the whole output so far."""
    tgt_mask = causal_mask(ys.size(1), device=ys.device)  # (1, 1, t, t)
    out = model.decode(ys, memory, src_mask=src_mask, tgt_mask=tgt_mask)
    return model.generator(out[:, -1])  # (N, V)


def forbid_specials(log_probs: Tensor, *, bos_id, eos_id, pad_id) -> Tensor:
    """Never choose padding, nor BOS unless it doubles as EOS."""
    log_probs[..., pad_id] = float("-inf")
    if bos_id != eos_id:
        log_probs[..., bos_id] = float("-inf")
    return log_probs


def hypothesis(row, log_prob, score, *, eos_id, pad_id, **_) -> Hypothesis:
    """The output of one row after BOS: its tokens before EOS or padding."""
    tokens = row.tolist()
    ended = eos_id in tokens
    for stop in (eos_id, pad_id):
        if stop in tokens:
            tokens = tokens[: tokens.index(stop)]
    return Hypothesis(tokens, log_prob, score, ended)


def output_limit(length: int, positions: int, max_len=None) -> int:
    """The most tokens a sentence of `length` source tokens may output, EOS
    included: length + 50 (or max_len, if given), never more than a model's
    `positions`: the one rule of every search's length."""
    limit = length + EXTRA_LENGTH if max_len is None else max_len
    return min(limit, positions)


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
# The source is encoded once; its memory serves every step. `use_cache` chooses how each step
# reaches the decoder's last position: the next section explains the cache.


# %%
#| export
def greedy_decode(
    model: Transformer,
    src: Tensor,
    *,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    use_cache: bool = True,
) -> Hypothesis:
    """The most probable next token at each step, for one sentence: src (S,)
    token ids ending with EOS -> its output (score: log_prob). The model is
    in eval mode: no dropout."""
    specials = dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    with torch.inference_mode():
        src = src[None]  # (1, S)
        src_mask = padding_mask(src, pad_id)  # (1, 1, 1, S)
        memory = model.encode(src, src_mask)  # (1, S, d_model)
        cache = DecoderCache.empty(len(model.decoder.layers))
        ys, log_prob = torch.tensor([[bos_id]], device=src.device), 0.0
        for _ in range(output_limit(src.size(1), model.config.max_len)):
            if use_cache:  # the newest token; the cache holds the others
                token_log_p = decode_step(
                    model, ys[:, -1:], memory, src_mask, cache
                )
            else:  # the whole output so far, under the causal mask
                token_log_p = next_log_probs(model, ys, memory, src_mask)
            token_log_p = forbid_specials(token_log_p[0], **specials)  # (V,)
            best, token = token_log_p.max(dim=-1)
            ys, log_prob = (
                torch.cat([ys, token.view(1, 1)], 1),
                log_prob + best,
            )
            if token == eos_id:
                break
    lp = float(log_prob)
    return hypothesis(ys[0, 1:], lp, lp, eos_id=eos_id, pad_id=pad_id)


# %% [markdown]
# Three of the sentences, decoded greedily:

# %% tags=["nbval-ignore-output"]
from transformer.decode import greedy_decode

greedy = [greedy_decode(model, src, **ids) for src in sources]
for (source, reference), h in list(zip(pairs, greedy, strict=True))[:3]:
    print(f"{source}\n  greedy:    {tokenizer.decode(h.tokens)}")
    print(f"  reference: {reference}")

# %% [markdown]
# (kv-cache-decoding)=
# ## The key/value cache
#
# Without a cache, step $t$ runs the decoder over all $t$ positions of the output so far to use
# the last one's output. The causal mask guarantees that the other $t - 1$ have not changed since
# earlier steps, and the new position needs only their keys and values in each self-attention
# layer. So keep those: a `KVCache` holds one attention block's keys and values, and each step
# appends the new position's, so that the new query attends over all of them. A single query at
# the end of the output may see every earlier position, so no mask is needed. The
# encoder–decoder attention's keys and values are projections of the encoder's memory, which does
# not change while a sentence is decoded, so they are projected once, at the first step.
#
# Part I's layers take whole sequences; the cache needs a layer to run on its newest position
# only. `decode_step` walks the decoder's layers itself with the layers' own weights: each
# self-attention projects the new position's query, key and value with the multi-head chapter's
# `project` and attends over the cached keys and values and its own, each encoder–decoder
# attention reads the memory's cached ones, and the sublayer connections and feed-forward
# networks run as in the decoder chapter. The new token is embedded at position $t$ (the
# positional encoding's `start`). `reorder` keeps the rows that a search keeps, in its order, as
# beam search needs below.

# %%
#| export kv_cache
"""The key/value cache of incremental decoding: each decoder layer's keys and
values, kept between steps, so that a step runs on its newest token only."""

from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor

from transformer.model import Transformer
from transformer.multihead import (
    MultiHeadAttention,
    attend,
    merge_heads,
    project,
)


@dataclass
class KVCache:
    """One attention block's keys and values, (N, H, L, d_k) each."""

    key: Tensor | None = None
    value: Tensor | None = None


@dataclass
class DecoderCache:
    """Every decoder layer's caches: each self-attention's grows by one
    position per step; each encoder-decoder attention's holds the memory's."""

    self_attn: list[KVCache]
    cross_attn: list[KVCache]

    @classmethod
    def empty(cls, n_layers: int) -> "DecoderCache":
        """The cache of an n_layers decoder before the first step."""
        self_attn = [KVCache() for _ in range(n_layers)]
        return cls(self_attn, [KVCache() for _ in range(n_layers)])

    @property
    def length(self) -> int:
        """The number of target positions decoded so far."""
        key = self.self_attn[0].key
        return 0 if key is None else key.size(2)

    def reorder(self, rows: Tensor, *, memory: bool = True) -> None:
        """Keep rows `rows` (N',), in that order. memory=False leaves the
        encoder-decoder caches alone, when rows only move among the outputs of
        one sentence, whose memory is the same."""
        for kv in self.self_attn + (self.cross_attn if memory else []):
            if kv.key is not None:
                kv.key, kv.value = kv.key[rows], kv.value[rows]


# %% [markdown]
# One attention block on the newest position, and one step of the whole decoder:


# %%
#| export kv_cache
def cached_attention(
    attn: MultiHeadAttention,
    x: Tensor,
    *,
    cache: KVCache,
    memory: Tensor | None = None,
    mask: Tensor | None = None,
) -> Tensor:
    """MultiHead for the newest position x (N, 1, d_model): self-attention
    over the cached positions and x's own, or, given the memory (N, S,
    d_model), encoder-decoder attention over its keys and values."""
    n = attn.n_heads
    if memory is None:  # the new position's key and value join the cache
        q, k, v = project(x, n, attn.w_q, attn.w_k, attn.w_v)  # (N, H, 1, d_k)
        if cache.key is not None:
            k = torch.cat([cache.key, k], dim=2)  # (N, H, L + 1, d_k)
            v = torch.cat([cache.value, v], dim=2)
        cache.key, cache.value = k, v
    else:  # the memory's keys and values, projected at the first step
        (q,) = project(x, n, attn.w_q)
        if cache.key is None:
            cache.key, cache.value = project(memory, n, attn.w_k, attn.w_v)
    out, _ = attend(q, cache.key, cache.value, mask, attn.attn_dropout, False)
    return attn.w_o(merge_heads(out))  # (N, 1, d_model)


def decode_step(
    model: Transformer,
    token: Tensor,
    memory: Tensor,
    src_mask: Tensor | None,
    cache: DecoderCache,
) -> Tensor:
    """log p(next token) for every row, given its newest token (N, 1), the
    earlier ones' keys and values in the cache: -> (N, V)."""
    x = model.tgt_embed(token)  # (N, 1, d_model), at position cache.length:
    x = model.tgt_pos(x, start=cache.length)
    caches = zip(cache.self_attn, cache.cross_attn, strict=True)
    for layer, (own, cross) in zip(model.decoder.layers, caches, strict=True):
        self_attention = partial(cached_attention, layer.self_attn, cache=own)
        cross_attention = partial(
            cached_attention, layer.cross_attn, cache=cross, memory=memory,
            mask=src_mask,
        )  # fmt: skip
        x = layer.sublayers[0](x, self_attention)
        x = layer.sublayers[1](x, cross_attention)
        x = layer.sublayers[2](x, layer.feed_forward)
    return model.generator(model.decoder.final_norm(x)[:, -1])  # (N, V)


# %% [markdown]
# The saving: to output $T$ tokens, the decoder processes $1 + 2 + \dots + T = T(T+1)/2$
# positions without a cache and $T$ with one. The projections and feed-forward networks cost the
# same per position and dominate at sentence lengths, so that work drops from $O(T^2)$ to $O(T)$,
# for $2\, n_\text{layers} (T + S)\, d_\text{model}$ numbers of memory per sentence. The two ways
# give the same outputs; a hook on the target's positional encoding counts the positions that
# each way runs through the decoder, over the 50 sentences:


# %% tags=["nbval-ignore-output"]
def greedy_run(use_cache: bool) -> tuple[list, int, float]:
    """The outputs, the decoder positions computed, and the seconds taken."""
    seen = []  # the target positions that enter the decoder, at each step
    hook = model.tgt_pos.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].shape[:2].numel())
    )
    started = time.perf_counter()
    outputs = [
        greedy_decode(model, s, **ids, use_cache=use_cache) for s in sources
    ]
    hook.remove()
    return outputs, sum(seen), time.perf_counter() - started


(cached, n, s), (uncached, n_without, s_without) = map(greedy_run, (1, 0))
assert [h.tokens for h in cached] == [h.tokens for h in uncached]
print(
    f"the same outputs; decoder positions: {n:,} with the cache,"
    f" {n_without:,} without; {s:.1f} s against {s_without:.1f} s"
)

# %% [markdown]
# ## Beam search
#
# Greedy decoding commits to one token at each step; a token that looked best may lead only to
# poor continuations. Beam search keeps $K$ partial outputs, *beams*: at each step it extends
# every beam by every token, $K \cdot V$ candidates, and keeps the $K$ best; with $K = 1$ it is
# greedy decoding. A beam's extensions share its $\log p$ and length, so only its $K$ most
# probable tokens can be kept: the batched search of the appendix and the page
# [Translate and look inside](16_translate.md) rank those $K \cdot K$ candidates instead, and keep
# the same beams.
#
# **The length penalty.** Every token multiplies an output's probability by a number below one,
# so ranked by $\log p(Y \mid X)$ beam search prefers short outputs. The paper ranks hypotheses
# as Google's system does {cite:p}`wu2016google`, dividing by a *length penalty*:
#
# $$
# s(Y) = \frac{\log p(Y \mid X)}{lp(Y)}, \qquad lp(Y) = \frac{(5 + |Y|)^\alpha}{(5 + 1)^\alpha},
# $$
#
# where $|Y|$ counts the output tokens, EOS included. With $\alpha = 0$ there is no penalty. With
# $\alpha = 1$, $s(Y) = 6 \log p(Y \mid X) / (5 + |Y|)$: for a long output, six times its average
# log-probability per token.


# %%
#| export
def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α of Wu et al. (2016), |Y| counting EOS."""
    return ((5.0 + length) / 6.0) ** alpha


# %% [markdown]
# **The search**, for one sentence, its lines numbered for the notes under it:


# %% mystnb={"number_source_lines": true}
#| export
def beam_search(
    model: Transformer,
    src: Tensor,
    *,
    beam_size: int = BEAM_SIZE,
    alpha: float = ALPHA,
    bos_id: int,
    eos_id: int,
    pad_id: int,
    on_step: Callable[..., None] = lambda *step: None,
) -> Hypothesis:
    """The best output by log p / lp for one sentence src (S,) ending with
    EOS, keeping K = beam_size beams. on_step sees each step's candidates,
    their log p (K, V) and their beams' lp (K,), then the K kept: their flat
    indices into the K·V, and whether they have ended."""
    K, ids = beam_size, dict(bos_id=bos_id, eos_id=eos_id, pad_id=pad_id)
    limit = output_limit(src.numel(), model.config.max_len)
    lp_limit = length_penalty(torch.tensor(limit), alpha)
    with torch.inference_mode():
        src_mask = padding_mask(src[None], pad_id)  # (1, 1, 1, S)
        memory = model.encode(src[None], src_mask).expand(K, -1, -1)
        cache = DecoderCache.empty(len(model.decoder.layers))
        ys = src.new_full((K, 1), bos_id)  # (K, 1): every beam starts at BOS
        log_p = memory.new_tensor([0.0] + [-torch.inf] * (K - 1))  # one open
        ended, length = src.new_zeros(K, dtype=torch.bool), src.new_zeros(K)
        best = Hypothesis([], -torch.inf, -torch.inf, ended=False)
        for t in range(limit):
            token_log_p = decode_step(
                model, ys[:, -1:], memory, src_mask, cache
            )
            token_log_p = forbid_specials(token_log_p, **ids)  # (K, V)
            V = token_log_p.size(1)
            token_log_p[ended] = -torch.inf  # an ended beam's one extension:
            token_log_p[ended, pad_id] = 0.0  # a padding token, at no cost
            length = torch.where(ended, length, t + 1)  # (K,): |Y|
            log_p_next = log_p[:, None] + token_log_p  # (K, V)
            lp = length_penalty(length, alpha)  # (K,)
            score, index = (log_p_next / lp[:, None]).flatten().topk(K)
            parent, token = index // V, index % V  # (K,) each
            ys = torch.cat([ys[parent], token[:, None]], dim=1)
            cache.reorder(parent, memory=False)
            log_p, length = log_p_next.flatten()[index], length[parent]
            ended = ended[parent] | (token == eos_id) | (t + 1 >= limit)
            on_step(log_p_next, lp, index, ended)
            s, k = torch.where(ended, score, -torch.inf).max(dim=0)
            if s > best.score:  # a better ended output: keep it aside
                best = hypothesis(ys[k, 1:], float(log_p[k]), float(s), **ids)
            reachable = torch.where(ended, -torch.inf, log_p).max() / lp_limit
            if best.score >= reachable:  # no open beam can overtake it
                break
    return best


# %% [markdown]
# - **Lines 24–27.** The state: each beam's row `ys` (BOS, then its tokens), its `log_p`, whether
#   it has `ended` (output EOS), and its `length` $|Y|$. Only the first beam starts open, at
#   $\log p = 0$, the others at $-\infty$, so that the beams are not $K$ copies of BOS. `best` is
#   the best ended output so far.
# - **Lines 29–32.** Each beam's next-token log-probabilities, $(K, V)$: one cached decoder step.
# - **Lines 34–35.** An ended beam's one extension is itself plus padding, at log-probability 0:
#   its $\log p$ stays, and it competes with the open beams until $K$ of their extensions score
#   higher. So $K = 1$ is exactly greedy decoding.
# - **Line 36.** `length` becomes the $|Y|$ of each beam's extensions: $t + 1$ for an open beam,
#   unchanged for an ended one, whose $lp$ stops growing.
# - **Lines 37–39.** Every extension's $\log p$ over its beam's $lp$ (`lp[:, None]` spreads it
#   over the beam's row); `topk` keeps the best $K$ of these $K \cdot V$ scores, best first.
# - **Line 40.** A kept candidate's `index` into the flattened scores names its `parent` beam and
#   its `token`.
# - **Lines 41–44.** Each kept candidate becomes a beam: its parent's row in `ys` plus the token,
#   its parent's cache, its own `log_p`, its parent's `length`. It has ended if its parent had,
#   if the token is EOS, or at the length limit.
# - **Lines 46–48. Keep aside.** An open beam's score can *rise* as it grows, since $lp$ grows
#   too, and push an ended beam out of the $K$. So the best ended output is kept outside the
#   beam, in `best`: the result is never worse than an output the search once held.
# - **Lines 49–50. Stop.** The paper terminates "early when possible". An open beam's $\log p$
#   can only fall, and $lp$ only grow up to the length limit, so it can score at most
#   $\log p / lp(\text{limit})$, `reachable`. Once `best` scores that much, no later step can
#   change the result.
#
# Traced on a short sentence: at each step, the $K$ candidates kept and the best one pruned, as
# text, with $\log p$, $lp$ and score. "best" marks an ended output that beats the one kept
# aside, and replaces it.

# %% tags=["hide-input", "nbval-ignore-output"]
from transformer.decode import beam_search


def trace(sentence: str) -> list:
    """Print beam search on one sentence, step by step; return its steps."""
    src = torch.tensor(tokenizer.encode(sentence) + [eos_id])
    steps = []
    found = beam_search(model, src, **ids, on_step=lambda *a: steps.append(a))
    lines = [sentence, "step log p    lp  score  state   hypothesis"]
    beams, was_ended, best = [()], [False], -torch.inf  # before step 1
    for t, (log_p_next, lp, index, ended) in enumerate(steps, start=1):
        V, log_p = log_p_next.size(1), log_p_next.flatten()
        score = (log_p_next / lp[:, None]).flatten()
        pruned = next(
            i for i in score.argsort(descending=True) if i not in index
        )
        rows = [*index.tolist(), int(pruned)]
        tokens = [
            beams[i // V] if was_ended[i // V] else (*beams[i // V], i % V)
            for i in rows
        ]
        for k, (i, ys) in enumerate(zip(rows, tokens, strict=True)):
            text = tokenizer.decode([w for w in ys if w != eos_id])
            text += " <eos>" if eos_id in ys else ""
            state = "kept" if k < len(index) else "pruned"
            if k < len(index) and ended[k] and score[i] > best:
                best, state = score[i], "best"
            numbers = f"{log_p[i]:6.2f}{lp[i // V]:6.2f}{score[i]:7.2f}"
            step = f"{t if k == 0 else '':<4}"
            lines.append(f"{step}{numbers}  {state:<8}{text}")
        beams, was_ended = tokens[: len(index)], ended.tolist()
    print(*lines, f"output: {tokenizer.decode(found.tokens)}", sep="\n")
    return steps


steps = trace("Ein Mann schläft.")

# %% [markdown]
# What to see: a step keeps the best extensions whichever beams they extend, so beams drop out;
# an ended beam keeps its $\log p$ and $lp$ while the open beams' $lp$ grows; the first output
# to end is kept aside until a better one ends; once all beams have ended, the search stops.

# %% tags=["remove-cell"]
# The trace shows what the text says.
from itertools import pairwise

rows = []  # each step's K kept: their parents, log p, lp and ended flags
for log_p_next, lp, index, ended in steps:
    parent = index // log_p_next.size(1)
    rows.append((parent, log_p_next.flatten()[index], lp[parent], ended))
assert any(p.unique().numel() < len(p) for p, *_ in rows[1:])  # drop-outs
for (_, log_p0, lp0, ended0), (parent, log_p, lp, _) in pairwise(rows):
    stays = ended0[parent]  # an ended beam's one extension: itself
    assert (log_p[stays] == log_p0[parent][stays]).all()
    assert (lp[stays] == lp0[parent][stays]).all()
assert any(ended0[p].any() for (*_, ended0), (p, *_) in pairwise(rows))
aside = (
    torch.stack(
        [
            torch.where(e, log_p / lp, -torch.inf).max()
            for _, log_p, lp, e in rows
        ]
    )
    .cummax(0)
    .values
)  # the score kept aside after each step
assert aside[aside.isfinite()].unique().numel() >= 2  # replaced
assert rows[-1][3].all()  # every beam has ended

# %% [markdown]
# Beam search against greedy decoding on the 50 sentences. A search is for a higher score
# $s(Y)$, so we score greedy decoding's outputs the same way and count the sentences on which beam
# search found a higher one, or a lower one:

# %% tags=["nbval-ignore-output"]
from transformer.decode import length_penalty
from transformer.paper_search import ALPHA

beam = [beam_search(model, src, **ids) for src in sources]  # the default K, α


def s(h) -> float:
    """s(Y) of a hypothesis, greedy decoding's too: log p / lp(|Y|)."""
    length = torch.tensor(len(h.tokens) + h.ended)
    return h.log_prob / length_penalty(length, ALPHA).item()


gains = torch.tensor(
    [b.score - s(g) for g, b in zip(greedy, beam, strict=True)]
)
higher, lower, n = (gains > 1e-6).sum(), (gains < -1e-6).sum(), len(gains)
print(
    f"beam search scores higher on {higher} of the {n} sentences"
    f" ({higher / n:.0%}), lower on {lower} ({lower / n:.0%})"
)
assert higher > 0.15 * n and lower < higher / 3

# %% [markdown]
# On the sentences counted first the search finds an output that the model prefers to greedy
# decoding's; it finds a worse one less than a third as often. Whether a higher $s(Y)$ is a
# better translation is the [results chapter](15_results.ipynb)'s question, in BLEU.
#
# ### What the length penalty does
#
# The same search with several values of $\alpha$, and the length of the outputs relative to the
# references', in BPE tokens. The larger $\alpha$, the less a long hypothesis is held back, and
# the longer the outputs:

# %% tags=["hide-input", "nbval-ignore-output"]
targets = tokenizer.encode_batch([reference for _, reference in pairs], "en")
by_alpha = pd.Series(
    {
        alpha: sum(
            len(beam_search(model, src, alpha=alpha, **ids).tokens)
            for src in sources
        )
        / sum(map(len, targets))
        for alpha in sorted({0.0, ALPHA, 1.0, 2.0})
    },
    name="output length / reference length",
).rename_axis("α")
assert by_alpha.is_monotonic_increasing and by_alpha[2.0] > by_alpha[0.0]
by_alpha.round(3)

# %% [markdown]
# Without it, "regular beam search will favor shorter results over longer ones on average"
# {cite:p}`wu2016google`.
#
# ## A beam search tree
#
# Beam search drawn for one sentence: the shortest of the 50 whose beam-search output differs
# from greedy decoding's and scores higher. Each column is a step, each point a kept hypothesis
# at its rank, labelled with its new token (hover for the whole hypothesis); a line joins it to
# the beam it extends. Red points have just output EOS, grey ones ended earlier. What to see: the
# orange path is greedy decoding's, the black one beam search's; where they part, the black path
# takes a runner-up token that greedy decoding discarded for good, and it ends ahead.

# %% tags=["hide-input", "nbval-ignore-output"]
chosen = min(
    (i for i in range(len(pairs)) if gains[i] > 1e-6),
    key=lambda i: len(beam[i].tokens),
)
steps = []
beam_search(model, sources[chosen], **ids, on_step=lambda *a: steps.append(a))
V = steps[0][0].size(1)  # each step's kept: parents, tokens, ended
steps = [(index // V, index % V, ended) for _, _, index, ended in steps]
paths = {"beam search": beam[chosen], "greedy": greedy[chosen]}
paths = {name: (*h.tokens, eos_id) for name, h in paths.items()}
bos = {"step": 0, "rank": 1, "token": "<bos>", "state": "open"}
nodes, prefixes, was_ended = [bos], [()], [False]
for t, (parents, tokens, ended) in enumerate(steps, start=1):
    parents, tokens = parents.tolist(), tokens.tolist()
    now = [prefixes[p] + (w,) for p, w in zip(parents, tokens, strict=True)]
    for k, (p, prefix) in enumerate(zip(parents, now, strict=True)):
        on = [n for n, path in paths.items() if path[: len(prefix)] == prefix]
        nodes.append({
            "step": t, "rank": k + 1, "from": p + 1,
            "token": "" if was_ended[p] else tokenizer.pieces(prefix[-1:])[0],
            "hypothesis": tokenizer.decode(list(prefix)),
            "state": "ended before" if was_ended[p]
            else "ends here" if prefix[-1] == eos_id else "open",
            "path": on[0] if on and not was_ended[p] else "other",
        })  # fmt: skip
    prefixes, was_ended = now, ended.tolist()
tree = pd.DataFrame(nodes).assign(before=lambda d: d.step - 1)
rank = {"scale": alt.Scale(domain=[0.5, 4.5], reverse=True), "title": "rank"}
rank["axis"] = alt.Axis(values=[1, 2, 3, 4])
base = alt.Chart(tree).encode(alt.X("step:Q"), alt.Y("rank:Q", **rank))
edges = base.transform_filter("datum.step > 0")
lines = edges.mark_rule(strokeWidth=2).encode(
    x=alt.X("before:Q", title="step"), x2="step:Q",
    y=alt.Y("from:Q", **rank), y2="rank:Q",
    color=alt.Color("path:N", title="path", scale=alt.Scale(
        domain=["beam search", "greedy", "other"],
        range=["black", "#ff7f0e", "#dddddd"])),
)  # fmt: skip
points = base.mark_circle(size=120, opacity=1).encode(
    tooltip=["hypothesis", "state"],
    color=alt.Color("state:N", title="beam", scale=alt.Scale(
        domain=["open", "ends here", "ended before"],
        range=["#1f77b4", "#d62728", "#bbbbbb"])),
)  # fmt: skip
text = base.mark_text(dy=-12).encode(text="token:N")
(lines + points + text).resolve_scale(color="independent").properties(
    width=560, height=220, title=f"Beam search, K = 4: {pairs[chosen][0]}"
)

# %% [markdown]
# ## Translating with the shipped models
#
# A translation is these steps in a row: normalise and cut the sentence into tokens, add EOS,
# search, and turn the output's tokens back into text. Both shipped models, with the paper's
# search:

# %% tags=["nbval-ignore-output"]
examples = {
    "de-en": [
        "Ein Hund mit einem Stock im Maul schwimmt in einem See.",
        "Zwei Kinder bauen am Strand eine Sandburg.",
    ],
    "fr-en": ["Un groupe de musiciens joue sur une place animée."],
}
for pair, sentences in examples.items():
    pair_model, pair_tokenizer = load_trained(CHECKPOINTS_DIR / pair)
    pair_model.eval()
    special = dict(bos_id=pair_tokenizer.bos_id, eos_id=pair_tokenizer.eos_id,
                   pad_id=pair_tokenizer.pad_id)  # fmt: skip
    for sentence in sentences:
        src = torch.tensor(
            pair_tokenizer.encode(sentence) + [special["eos_id"]]
        )
        found = beam_search(pair_model, src, **special)
        print(f"{sentence}\n  {pair_tokenizer.decode(found.tokens)}")

# %% [markdown]
# The appendix [Translating text](a08_translating.ipynb) runs the same searches over batches of
# sentences of similar length, much faster, and a test holds its translations identical to this
# chapter's. From a shell, `python -m transformer translate` translates its arguments, or
# standard input line by line; `--beam`, `--alpha` and `--checkpoint` choose the search and the
# model.
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
#   partial outputs, ranked by $\log p(Y \mid X) / lp(Y)$ with the length penalty
#   $lp = ((5 + |Y|)/6)^\alpha$, the paper's $K = 4$ and $\alpha = 0.6$.
# - The key/value cache feeds the decoder one token per step: $T$ positions instead of
#   $T(T+1)/2$, with the same outputs.
# - The search stops when no open beam can overtake the best ended output.

# %% [markdown]
# ## Exercises
#
# 1. Translate a few sentences with `beam_size=1`, `4` and `12`. Where do the outputs differ?
# 2. Translate the sentences above with `alpha=0` and `alpha=2`. How do the translations'
#    lengths change?
# 3. Translate with a run of your own from the training chapter:
#    `python -m transformer translate --pair de-en --checkpoint runs/de-en/average`.
