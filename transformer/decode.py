# Generated from chapters/14_decoding.ipynb: edit it, not this file.
"""Greedy decoding and beam search for one sentence (Section 6.1 of Vaswani et
al., 2017, with the length penalty of Wu et al., 2016)."""

# %% auto #0
__all__ = [
    "Hypothesis",
    "next_log_probs",
    "forbid_specials",
    "hypothesis",
    "output_limit",
    "greedy_decode",
    "length_penalty",
    "beam_search",
]

# %% ../chapters/14_decoding.ipynb #6fbc89f9

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


# %% ../chapters/14_decoding.ipynb #289d21c0
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


# %% ../chapters/14_decoding.ipynb #5834809a
def length_penalty(length: Tensor, alpha: float) -> Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α of Wu et al. (2016), |Y| counting EOS."""
    return ((5.0 + length) / 6.0) ** alpha


# %% ../chapters/14_decoding.ipynb #4776bbe3
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
