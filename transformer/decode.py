# Generated from chapters/15_decoding.ipynb: edit it, not this file.
"""Greedy decoding and beam search with a key/value cache (Section 6.1 of
Vaswani et al., 2017, with the length penalty of Wu et al., 2016), and
translating text with a trained model."""

# %% auto #0
__all__ = [
    "EXTRA_LENGTH",
    "MAX_ALPHA",
    "BATCH_SIZE",
    "CHECKPOINTS_DIR",
    "Hypothesis",
    "output_limits",
    "greedy_decode",
    "length_penalty",
    "check_alpha",
    "BeamStep",
    "beam_search",
    "length_sorted_batches",
    "translate",
    "translate_batches",
    "load_pair_model",
]

# %% ../chapters/15_decoding.ipynb #4c82686c

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


# %% ../chapters/15_decoding.ipynb #33c1c23b
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


# %% ../chapters/15_decoding.ipynb #f7bec3b9
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


# %% ../chapters/15_decoding.ipynb #1f6f814b
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


# %% ../chapters/15_decoding.ipynb #2e3ac55f
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
