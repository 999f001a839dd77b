# Generated from chapters/a08_translating.ipynb: edit it, not this file.
"""Greedy decoding and beam search over a batch of sentences: the decoding
chapter's searches, with padding, the finished sentences leaving the batch,
and a forced prefix."""

# %% auto #0
__all__ = [
    "force_prefix",
    "batched_greedy_decode",
    "BeamStep",
    "BestEnded",
    "batched_beam_search",
]

# %% ../chapters/a08_translating.ipynb #a0d4b7e4

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


# %% ../chapters/a08_translating.ipynb #49ce854b
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


# %% ../chapters/a08_translating.ipynb #dd6b459f
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


# %% ../chapters/a08_translating.ipynb #216f647c
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


# %% ../chapters/a08_translating.ipynb #5e2c6fc3
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
