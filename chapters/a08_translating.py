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
# appendix builds what a user of the package calls on top of it, and what the command line's
# `translate` and `evaluate` run: the options of a search, the checks and limits that every
# search starts with, the chapter's two searches run over a batch of sentences at once (with a
# forced start, if asked for), `load_pair_model`, which loads a shipped model, `translate`,
# which takes sentences and returns their translations, and the translation of a whole
# Multi30k split. It exports `transformer.decode_options`, `transformer.search_setup`,
# `transformer.batched_search`, `transformer.translation` and `transformer.split_translation`.

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
# $\alpha$ of the search (the paper's 4 and 0.6; a beam of 1 is greedy decoding), how many
# sentences are decoded at once, and the longest output (by default each source's length + 50).
# `DecodeOptions` holds them, frozen, and checks them once, when it is made: `translate`,
# `translate_split`, the command line and the CTranslate2 engine all take it. A bad value is a
# one-line `OptionError` that starts with the field's name, which the command line swaps for
# its option's.

# %%
#| export decode_options
"""The options of a translation, with the paper's values, checked once: the
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
# The paper's options, greedy decoding, and a value refused with its field's name:

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
#   a `src` that is not a $(B, S)$ tensor of token ids, a row of padding alone (it would be
#   decoded from a memory that the mask hides entirely), a `pad_id` equal to BOS or EOS (an ended
#   sentence is recognised by its padding), or a forced prefix of the wrong shape. The search's
#   options come checked, as a `DecodeOptions`; the one check that needs the model is made where
#   the search meets it: an $\alpha$ whose $lp$ overflows 32-bit floats within the model's
#   positions, which would turn the $-\infty$ scores of ruled-out candidates into NaN.
# - **`output_limits`** gives each sentence the paper's length limit, its source length + 50
#   tokens, EOS included (or `max_len` if given), never more than the positions of the model's
#   positional encoding (`config.max_len`).
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

from transformer.model import Transformer
from transformer.paper_search import EXTRA_LENGTH


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
        limits = torch.full((src.size(0),), max_len, device=src.device)  # (B,)
    return limits.clamp(max=model.config.max_len)


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
from transformer.search_setup import check_search, output_limits

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
print(output_limits(tiny, src, pad_id=0).tolist())
print(output_limits(tiny, src, pad_id=0, max_len=99).tolist())
try:
    check_search(tiny, src[0], bos_id=1, eos_id=2, pad_id=0)
except ValueError as err:
    print(err)

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
# - **Sentences leave.** A sentence that has ended (greedy), or that no open beam can change
#   (beam search), leaves the batch with its memory and its cached keys and values, so that the
#   later steps compute only the sentences still going.
# - **A forced prefix.** `prefix`, a $(B, P)$ tensor of target ids, makes sentence $b$'s output
#   start with row $b$'s tokens (padding where the search chooses), as fairseq's `prefix_tokens`
#   do: at step $t < P$ every other token is ruled out, and the forced tokens' log-probabilities
#   count in the score. The command line's `translate --prefix` and the page
#   [Translate and look inside](16_translate.md) use it.
#
# A test holds the translations of both functions identical to the chapter's on the first 200
# test sentences of each pair (`tests/test_batched_search.py`).

# %%
#| export batched_search
"""Greedy decoding and beam search over a batch of sentences: the decoding
chapter's searches, with padding, the finished sentences leaving the batch,
and a forced prefix."""

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from torch import Tensor

from transformer.decode import (
    Hypothesis,
    forbid_specials,
    hypothesis,
    length_penalty,
)
from transformer.decode_options import DecodeOptions
from transformer.kv_cache import DecoderCache, decode_step
from transformer.masking import padding_mask
from transformer.model import Transformer
from transformer.search_setup import check_search, inference, output_limits


def force_prefix(
    step: Tensor, prefix: Tensor | None, t: int, pad_id
) -> Tensor:
    """At step t, only the prefix's token where a row has one: step (n, ...,
    V) log-probabilities, prefix (n, P) ids for the n sentences going."""
    if prefix is None or t >= prefix.size(1):
        return step
    forced = prefix[:, t]  # (n,)
    rows = (forced != pad_id).view(-1, *[1] * (step.dim() - 1))  # (n, 1...)
    vocab = torch.arange(step.size(-1), device=step.device)
    chosen = vocab == forced.view(rows.shape)  # (n, ..., V)
    return torch.where(rows & ~chosen, -torch.inf, step)


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
        limits = output_limits(model, src, pad_id=pad_id, max_len=max_len)
        cache = DecoderCache.empty(len(model.decoder.layers))
        # Row b: BOS, then sentence b's output, then padding once it has ended.
        ys = torch.full((B, int(limits.max()) + 1), pad_id, device=device)
        ys[:, 0] = bos_id
        log_prob = torch.zeros(B, device=device)
        going = torch.arange(B, device=device)  # the sentences still going
        for t in range(int(limits.max())):
            token = ys[going, t : t + 1]  # (n, 1): each sentence's newest
            step = decode_step(model, token, memory, src_mask, cache)
            step = forbid_specials(step, **specials)
            if prefix is not None:
                step = force_prefix(step, prefix[going], t, pad_id)
            best, token = step.max(dim=-1)
            ys[going, t + 1] = token  # (n,): the n sentences still going
            log_prob[going] += best
            stays = (token != eos_id) & (t + 1 < limits)  # (n,)
            if not stays.all():  # the others leave the batch
                going, limits = going[stays], limits[stays]
                memory, src_mask = memory[stays], src_mask[stays]
                cache.reorder(stays.nonzero()[:, 0])
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
# `Kept` is each sentence's best ended hypothesis, kept aside, and `_finished` the test for a
# sentence that no open beam can change.


# %%
#| export batched_search
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
    max_len (default: the paper's): src (B, S) token ids, padded with pad_id
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
        limits = output_limits(model, src, pad_id=pad_id, max_len=max_len)
        cache = DecoderCache.empty(len(model.decoder.layers))
        # The K beams of sentence b are rows b*K ... b*K + K - 1.
        memory = memory.repeat_interleave(K, dim=0)  # (B*K, S, d_model)
        src_mask = src_mask.repeat_interleave(K, dim=0)  # (B*K, 1, 1, S)
        ys = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
        beams = BeamStep.first(B, K, device)
        kept = Kept.empty(B, int(limits.max()) + 1, pad_id, device)
        first_row = torch.arange(B, device=device)[:, None] * K  # (B, 1)
        for t in range(int(limits.max())):
            step = decode_step(model, ys[:, -1:], memory, src_mask, cache)
            step = forbid_specials(step.view(len(limits), K, -1), **specials)
            if prefix is not None:
                step = force_prefix(step, prefix[beams.sentences], t, pad_id)
            beams = _extend(step, beams, t, limits, alpha, eos_id, pad_id)
            # Every beam continues the row of its parent: reorder, then append.
            rows = (first_row[: len(limits)] + beams.parents).view(-1)
            ys = torch.cat([ys[rows], beams.tokens.view(-1, 1)], dim=1)
            cache.reorder(rows, memory=False)  # within each sentence
            kept.update(beams, ys)
            if on_step is not None:
                on_step(beams)
            kept_score = kept.score[beams.sentences]
            stays = ~_finished(kept_score, beams, limits, alpha)  # (n,)
            if not stays.all():  # finished sentences leave, with their K rows
                beams, limits = beams.select(stays), limits[stays]
                keep = stays.repeat_interleave(K).nonzero()[:, 0]  # (n'*K,)
                ys, memory, src_mask = ys[keep], memory[keep], src_mask[keep]
                cache.reorder(keep)
                if not stays.any():
                    break
    return kept.hypotheses(eos_id=eos_id, pad_id=pad_id)


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
    **changes,
) -> list[str]:
    """Translations of `sentences`, in their order: beam search, or greedy
    decoding, as `options` say (default: the paper's; `changes` such as
    beam_size=1 change them), over batches of similar lengths, on the model's
    device; each starts with `prefix`, text in the target language, if given.

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

    return translate_batches(
        decode_batch,
        tokenizer,
        sentences,
        max_len=model.config.max_len,
        batch_size=options.batch_size,
        warn=warn,
    )


def translate_batches(
    decode_batch: Callable[[list[list[int]]], list[Hypothesis]],
    tokenizer: Tokenizer,
    sentences: Sequence[str],
    *,
    max_len: int,
    batch_size: int,
    warn: Callable[[str], None] | None = None,
) -> list[str]:
    """`translate` around any decoder of id batches (the package's, or another
    engine's): `decode_batch` takes sources as ids with their <eos>, longest
    first, and returns their hypotheses; max_len is the model's number of
    positions, batch_size the sentences of a batch."""
    if isinstance(sentences, str):
        raise TypeError(
            "translate takes a sequence of sentences, not one string"
        )
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
        for j, best in zip(batch, found, strict=True):
            results[todo[j]] = tokenizer.decode(best.tokens)
            if not best.ended:
                cut_off.append(todo[j])
    if cut_off and warn is not None:
        warn(
            f"{_sentences(sorted(cut_off))}: the translation stopped at the"
            " length limit, before <eos>"
        )
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
    with `transformer.translation.translate` and `options` (default: the
    paper's; `changes` such as beam_size=1 change them), and time it."""
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

# %% [markdown]
# ## Summary
#
# - A search's options are checked once, when they are made; every search checks its token ids
#   in one line, limits each output to its source length + 50 tokens and the model's positions,
#   and runs without gradients or dropout.
# - The batched searches give the decoding chapter's results a batch at a time, the finished
#   sentences leaving the batch; a forced prefix starts every output with given tokens.
# - `translate` turns sentences into translations: normalised, tokenised, cut to the model's
#   positions, batched by length, with a warning for what was cut.
# - `translate_split` and `write_lines` translate a whole split, for
#   `python -m transformer evaluate`.
