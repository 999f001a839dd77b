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
# This chapter writes `transformer.decode`: greedy decoding, a key/value cache, and beam search
# with the length penalty. We try them on the German→English model that the book ships, trained
# by Part II's recipe. The appendix [Translating text](a08_translating.ipynb) builds on them:
# sentences in, translations out.

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
# `load_pair_model` loads a shipped model with its tokenizer. The sources to decode: the first 50
# sentences of the validation split, cut into BPE tokens, each ended with EOS and padded into one
# batch.

# %%
import time

import altair as alt
import pandas as pd
import torch
from torch.nn.utils.rnn import pad_sequence

from transformer.data import load_pairs
from transformer.plots import use_book_renderer
from transformer.translation import load_pair_model

use_book_renderer()
pd.set_option("display.max_colwidth", None)
model, tokenizer = load_pair_model("de-en")
eos_id, pad_id = tokenizer.eos_id, tokenizer.pad_id
ids = dict(bos_id=tokenizer.bos_id, eos_id=eos_id, pad_id=pad_id)
pairs = load_pairs("val", "de-en")[:50]
encoded = tokenizer.encode_batch([source for source, _ in pairs])
rows = [torch.tensor(tokens + [eos_id]) for tokens in encoded]
src = pad_sequence(rows, batch_first=True, padding_value=pad_id)  # (B, S)
src.shape

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
#   in the paper, and never more than the model's positions. A sentence stopped by the limit has
#   no EOS: its `Hypothesis` says `ended=False`.
# - **Ended sentences leave the batch**, with their memory and cached keys and values, so the
#   later steps compute only the sentences still going. A sentence decodes the same whatever else
#   is in its batch.
# - **Padding and BOS are never output**: their log-probabilities are set to $-\infty$.
#
# The checks of the arguments, the length limits (`output_limits`) and the inference mode (no
# gradients, no dropout) come from the appendix [Translating text](a08_translating.ipynb). Each
# step needs the decoder's output at the last position of every row: the decoder can run again
# over the whole output so far under the causal mask, or read only the newest token and keep
# what it needs of the others in a cache (`use_cache`, the next section).

# %%
#| export
"""Greedy decoding and beam search with a key/value cache (Section 6.1 of
Vaswani et al., 2017, with the length penalty of Wu et al., 2016)."""

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from transformer.decoder import DecoderCache
from transformer.masking import causal_mask, padding_mask
from transformer.model import Transformer
from transformer.search_setup import check_search, inference, output_limits


@dataclass(frozen=True)
class Hypothesis:
    """One output: its tokens without BOS and EOS, log p(Y | X), the score the
    search maximised, and ended (False: the length limit cut it off)."""

    tokens: list[int]
    log_prob: float
    score: float
    ended: bool


def _next_log_probs(model, ys, memory, src_mask, cache) -> Tensor:
    """log p(next token | ys, source) for every row: ys (N, t) -> (N, V)."""
    if cache is None:  # the whole output so far, under the causal mask
        mask = causal_mask(ys.size(1), device=ys.device)  # (1, 1, t, t)
        out = model.decode(ys, memory, src_mask=src_mask, tgt_mask=mask)
    else:  # the newest token; the cache holds the others' keys and values
        out = model.decode(
            ys[:, -1:], memory, src_mask=src_mask, tgt_mask=None, cache=cache
        )
    return model.generator(out[:, -1])  # (N, V)


def _forbid_specials(log_probs: Tensor, *, bos_id, eos_id, pad_id) -> Tensor:
    """Never choose padding, nor BOS unless it doubles as EOS."""
    log_probs[..., pad_id] = float("-inf")
    if bos_id != eos_id:
        log_probs[..., bos_id] = float("-inf")
    return log_probs


def _hypothesis(row, log_prob, score, *, eos_id, pad_id) -> Hypothesis:
    """The output of one row after BOS: its tokens before EOS or padding."""
    tokens = row.tolist()
    ended = eos_id in tokens
    for stop in (eos_id, pad_id):
        if stop in tokens:
            tokens = tokens[: tokens.index(stop)]
    return Hypothesis(tokens, log_prob, score, ended)


# %%
#| export
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
    """The most probable next token at each step: src (B, S) token ids,
    padded with pad_id -> B hypotheses (score: log_prob), in batch order."""
    specials = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
    check_search(model, src, **specials)
    B, device = src.size(0), src.device
    if B == 0:
        return []
    with inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = output_limits(model, src, pad_id=pad_id, max_len=max_len)
        layers = len(model.decoder.layers)
        cache = DecoderCache.empty(layers) if use_cache else None
        # Row b: BOS, then sentence b's output, then padding once it has ended.
        ys = torch.full((B, int(limits.max()) + 1), pad_id, device=device)
        ys[:, 0] = bos_id
        log_prob = torch.zeros(B, device=device)
        going = torch.arange(B, device=device)  # the sentences still going
        for t in range(int(limits.max())):
            step = _next_log_probs(
                model, ys[going, : t + 1], memory, src_mask, cache
            )
            best, token = _forbid_specials(step, **specials).max(dim=-1)
            ys[going, t + 1] = token  # (n,): the n sentences still going
            log_prob[going] += best
            stays = (token != eos_id) & (t + 1 < limits)  # (n,)
            if not stays.all():  # the others leave the batch
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
# Three of the sentences, decoded greedily:

# %% tags=["nbval-ignore-output"]
from transformer.decode import greedy_decode

greedy = greedy_decode(model, src, **ids)
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
# layer. So keep those: the multi-head attention chapter's `KVCache` appends the new position's
# key and value at each step, and the new query attends over all the cached ones. A single query
# at the end of the sequence may see every earlier position, so no mask is needed; the new token
# is embedded at position $t$. The encoder–decoder attention's keys and values are projections of
# the encoder's memory, which does not change while a sentence is decoded, so they are computed
# once. The decoder chapter's `DecoderCache` holds both caches of every layer, and
# `Transformer.decode(..., cache=cache)` reads only the new tokens.
#
# The saving: to output $T$ tokens, the decoder processes $1 + 2 + \dots + T = T(T+1)/2$
# positions without a cache and $T$ with one. The projections and feed-forward networks cost the
# same per position and dominate at sentence lengths, so that work drops from $O(T^2)$ to $O(T)$,
# for $2\, n_\text{layers} (T + S)\, d_\text{model}$ numbers of memory per sentence. The two ways
# give the same outputs; a hook on the decoder counts the positions it reads, for the 50
# sentences at once:


# %% tags=["nbval-ignore-output"]
def greedy_run(use_cache: bool) -> tuple[list, int, float]:
    """The outputs, the positions the decoder read, and the seconds taken."""
    seen = []
    hook = model.decoder.register_forward_pre_hook(
        lambda module, args: seen.append(args[0].shape[:2].numel())
    )
    started = time.perf_counter()
    outputs = greedy_decode(model, src, **ids, use_cache=use_cache)
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
# $\alpha = 1$ the score approaches the average log-probability per token.
#
# **How the search runs**, batched over sentences, a step in four parts:
#
# 1. **Extend** (`_extend`). The $K$ beams of sentence $b$ are rows $bK, \dots, bK + K - 1$ of
#    one batch; at the start only the first is open, so the beams do not begin as $K$ copies of
#    BOS. Every open beam is extended by every token and scored by $\log p / lp(t + 1)$; an ended
#    beam is one candidate, itself, its score unchanged. All the extensions of one beam share its
#    $lp$, so only its $K$ most probable tokens can be among the $K$ best: ranking $K \cdot K$
#    candidates per sentence selects the same beams as $K \cdot V$.
# 2. **Follow the parents.** Every surviving beam takes the output so far of the beam it extends,
#    and `DecoderCache.reorder` does the same with the cached keys and values.
# 3. **Keep aside** (`Kept`). An open beam's score can *rise* as it grows, since $lp$ grows too,
#    and push an ended beam out of the $K$. So each sentence keeps its best ended hypothesis
#    outside the beam; the result is never worse than a hypothesis the search once held.
# 4. **Stop** (`_finished`). The paper terminates "early when possible". An open beam's
#    $\log p$ can only fall and $lp$ only grow, up to the length limit, so the best it can still
#    score is $\log p / lp(\text{limit})$. A sentence is finished when its kept score is at least
#    that, and leaves the batch with its $K$ rows; the search returns exactly what searching to
#    the limit would.
#
# tensor2tensor {cite:p}`vaswani2018tensor2tensor` keeps ended hypotheses in a separate set so
# that $K$ beams always stay open; ours lets them keep their slot, which makes $K = 1$ exactly
# greedy decoding. The appendix [Deviations from the paper](a01_deviations.ipynb) discusses what
# this costs.
#
# The length penalty, and `BeamStep`, the beams after a step, which the search carries from step
# to step:


# %%
#| export
def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α of Wu et al. (2016), |Y| counting EOS."""
    return ((5.0 + length) / 6.0) ** alpha


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


# %% [markdown]
# Part 1, `_extend`: the $K$ best of each sentence's $K \cdot K$ candidates.

# %%
#| export
def _extend(step, beams, t, limits, alpha, eos_id, pad_id) -> BeamStep:
    """Step t: the K best extensions of each sentence's K beams, given step
    (n, K, V), the log p of each beam's next token."""
    n, K, V = step.shape
    C = min(K, V)  # a beam's K most probable tokens are its K best candidates
    top, top_tokens = step.topk(C, dim=-1)  # (n, K, C)
    # An ended beam has one continuation, padding, which leaves its log p.
    stay = torch.full((C,), float("-inf"), device=step.device)
    stay[0] = 0.0
    top = torch.where(beams.ended[..., None], stay, top)
    top_tokens = top_tokens.masked_fill(beams.ended[..., None], pad_id)
    candidate_log_prob = (beams.log_probs[..., None] + top).view(n, K * C)
    candidate_length = torch.where(beams.ended, beams.lengths, t + 1)  # (n, K)
    lp = length_penalty(candidate_length, alpha).repeat_interleave(C, dim=1)
    scores, best = (candidate_log_prob / lp).topk(K, dim=-1)  # (n, K)
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
# Parts 3 and 4: the best ended hypothesis kept aside, and the test for a finished sentence.

# %%
#| export
@dataclass
class Kept:
    """Each sentence's best ended hypothesis so far, kept outside the beam:
    its score and log_prob (B,), and its row ys (B, L): BOS, its tokens, then
    padding."""

    score: Tensor
    log_prob: Tensor
    ys: Tensor

    @staticmethod
    def empty(B: int, L: int, pad_id: int, device: torch.device) -> "Kept":
        nothing = torch.full((B,), -torch.inf, device=device)
        ys = torch.full((B, L), pad_id, dtype=torch.long, device=device)
        return Kept(nothing, nothing.clone(), ys)

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
            _hypothesis(row[1:], lp, score, eos_id=eos_id, pad_id=pad_id)
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


# %% [markdown]
# The search puts the parts together:


# %%
#| export
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
    """Beam search with the length penalty: src (B, S) token ids, padded with
    pad_id -> each sentence's best hypothesis, in batch order. on_step, if
    given, sees the beams after every step."""
    specials = {"bos_id": bos_id, "eos_id": eos_id, "pad_id": pad_id}
    check_search(model, src, beam_size=beam_size, alpha=alpha, **specials)
    B, K, device = src.size(0), beam_size, src.device
    if B == 0:
        return []
    with inference(model):
        src_mask = padding_mask(src, pad_id)  # (B, 1, 1, S)
        memory = model.encode(src, src_mask)  # (B, S, d_model)
        limits = output_limits(model, src, pad_id=pad_id, max_len=max_len)
        layers = len(model.decoder.layers)
        cache = DecoderCache.empty(layers) if use_cache else None
        # The K beams of sentence b are rows b*K ... b*K + K - 1.
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, d_model)
        src_mask = src_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
        ys = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        beams = BeamStep.first(B, K, device)
        kept = Kept.empty(B, int(limits.max()) + 1, pad_id, device)
        first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1)
        for t in range(int(limits.max())):
            step = _next_log_probs(model, ys, memory, src_mask, cache)
            step = _forbid_specials(step.view(len(limits), K, -1), **specials)
            beams = _extend(step, beams, t, limits, alpha, eos_id, pad_id)
            # Every beam continues the row of its parent: reorder, then append.
            rows = (first_row[: len(limits)] + beams.parents).view(-1)
            ys = torch.cat([ys[rows], beams.tokens.view(-1, 1)], dim=1)
            if cache is not None:
                cache.reorder(rows, static=False)  # within each sentence
            kept.update(beams, ys)
            if on_step is not None:
                on_step(beams)
            kept_score = kept.score[beams.sentences]
            stays = ~_finished(kept_score, beams, limits, alpha)  # (n,)
            if not stays.all():  # finished sentences leave, with their K rows
                beams, limits = beams.select(stays), limits[stays]
                keep = stays.repeat_interleave(K).nonzero()[:, 0]  # (n'*K,)
                ys, memory, src_mask = ys[keep], memory[keep], src_mask[keep]
                if cache is not None:
                    cache.reorder(keep)
                if not stays.any():
                    break
    return kept.hypotheses(eos_id=eos_id, pad_id=pad_id)


# %% tags=["remove-cell"]
#| export
def __getattr__(name: str):
    """The names of transformer.translation, which builds on this module
    (`translate`, `load_pair_model`, ...), are importable from it too."""
    from transformer import translation

    if name in translation.__all__:
        return getattr(translation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# %% [markdown]
# Beam search against greedy decoding on the 50 sentences. A search is for a higher score
# $s(Y)$, so we score greedy decoding's outputs the same way and count the sentences on which beam
# search found a higher one, or a lower one:

# %% tags=["nbval-ignore-output"]
from transformer.decode import beam_search, length_penalty

beam = beam_search(model, src, **ids)  # K = 4, α = 0.6


def s(h) -> float:
    """s(Y) of a hypothesis, greedy decoding's too: log p / lp(|Y|)."""
    length = torch.tensor(len(h.tokens) + h.ended)
    return h.log_prob / length_penalty(length, 0.6).item()


gains = torch.tensor(
    [b.score - s(g) for g, b in zip(greedy, beam, strict=True)]
)
higher, lower = (gains > 1e-6).float().mean(), (gains < -1e-6).float().mean()
print(f"beam search scores higher on {higher:.0%}, lower on {lower:.0%}")
assert higher > 0.15 and lower < higher / 3

# %% [markdown]
# On two sentences in five the search finds an output that the model prefers to greedy
# decoding's, and it is rarely worse. Whether a higher $s(Y)$ is a better translation is the
# [results chapter](15_results.ipynb)'s question, in BLEU.
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
            len(h.tokens) for h in beam_search(model, src, alpha=alpha, **ids)
        )
        / sum(map(len, targets))
        for alpha in (0.0, 0.6, 1.0, 2.0)
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
# from greedy decoding's and scores higher. Each column is a step and each point one of the
# $K = 4$ hypotheses kept, placed by its rank (1 = best score) and labelled with the token it has
# just added; a line joins it to the hypothesis it extends (hover for the whole hypothesis). Red
# points have just output EOS; grey ones ended earlier and are carried along. What to see: the
# orange path is greedy decoding's, the black one leads to beam search's result. Where they part,
# the black path takes a runner-up token that greedy decoding discarded for good, and it ends
# ahead.

# %% tags=["hide-input", "nbval-ignore-output"]
from transformer.decode import BeamStep

chosen = min(
    (i for i in range(len(pairs)) if gains[i] > 1e-6),
    key=lambda i: len(beam[i].tokens),
)
one = src[chosen : chosen + 1, : int((src[chosen] != pad_id).sum())]
steps: list[BeamStep] = []
beam_search(model, one, **ids, on_step=steps.append)
paths = {"beam search": beam[chosen], "greedy": greedy[chosen]}
paths = {name: (*h.tokens, eos_id) for name, h in paths.items()}
bos = {"step": 0, "rank": 1, "token": "<bos>", "state": "open"}
nodes, prefixes, was_ended = [bos], [()], [False]
for step in steps:
    parents, tokens = step.parents[0].tolist(), step.tokens[0].tolist()
    now = [prefixes[p] + (w,) for p, w in zip(parents, tokens, strict=True)]
    for k, (p, prefix) in enumerate(zip(parents, now, strict=True)):
        on = [n for n, path in paths.items() if path[: len(prefix)] == prefix]
        nodes.append({
            "step": step.step + 1, "rank": k + 1, "from": p + 1,
            "token": "" if was_ended[p] else tokenizer.pieces(prefix[-1:])[0],
            "hypothesis": tokenizer.decode(list(prefix)),
            "state": "ended before" if was_ended[p]
            else "ends here" if prefix[-1] == eos_id else "open",
            "path": on[0] if on and not was_ended[p] else "other",
        })  # fmt: skip
    prefixes, was_ended = now, step.ended[0].tolist()
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
# The functions above take tensors of token ids. The appendix
# [Translating text](a08_translating.ipynb) wraps them: `translate` takes sentences, cuts them into
# tokens, decodes them in batches of similar lengths, and returns their translations. Both shipped
# models, with the paper's search:

# %% tags=["nbval-ignore-output"]
from transformer.translation import translate

examples = {
    "de-en": [
        "Ein Hund mit einem Stock im Maul schwimmt in einem See.",
        "Zwei Kinder bauen am Strand eine Sandburg.",
    ],
    "fr-en": ["Un groupe de musiciens joue sur une place animée."],
}
for pair, sentences in examples.items():
    pair_model, pair_tokenizer = load_pair_model(pair)
    found = translate(pair_model, pair_tokenizer, sentences)
    for source, translation in zip(sentences, found, strict=True):
        print(f"{source}\n  {translation}")

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
# - `translate`, in the appendix, turns sentences into translations with these searches.

# %% [markdown]
# ## Exercises
#
# 1. Translate a few sentences with `--beam 1`, `--beam 4` and `--beam 12`. Where do the outputs
#    differ?
# 2. Translate the sentences above with `alpha=0` and `alpha=2` (`translate(..., alpha=...)`).
#    How do the translations' lengths change?
# 3. Translate with a run of your own from the training chapter:
#    `python -m transformer translate --pair de-en --checkpoint runs/de-en/average`.
