"""transformer.decode (the decoding chapter's searches, one sentence at a time) and
transformer.batched_search (the package's, a batch at a time): the two agree, on toy models and
on the shipped ones; the cache changes nothing; beam search against greedy decoding and against
brute force; padding changes nothing; ended sentences stay ended; the length limit; a forced
prefix."""

import itertools
import math
from unittest import mock

import pytest
import torch
from torch import nn

import transformer.batched_search as batched
import transformer.decode as decode
from transformer.batched_search import (
    BeamStep,
    batched_beam_search,
    batched_greedy_decode,
)
from transformer.config import TransformerConfig
from transformer.decode import beam_search, greedy_decode, length_penalty
from transformer.decode_options import MAX_ALPHA, DecodeOptions
from transformer.masking import causal_mask, padding_mask
from transformer.model import Transformer
from transformer.multi30k import PAIRS
from transformer.search_setup import sentence_output_limits

PAD, BOS, EOS = 0, 1, 2
IDS = {"bos_id": BOS, "eos_id": EOS, "pad_id": PAD}


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_model(vocab_size: int = 11, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    fields = dict(d_model=16, n_heads=2, n_layers=2, d_ff=32, max_len=128)
    config = TransformerConfig(src_vocab_size=vocab_size, **(fields | overrides))
    return Transformer(config).eval()


def sources(lengths: list[int], vocab_size: int = 11, seed: int = 0) -> torch.Tensor:
    """A batch of random sources of the given lengths, padded with PAD: (B, S)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths)), PAD)
    for b, n in enumerate(lengths):
        src[b, :n] = torch.randint(3, vocab_size, (n,), generator=g)
    return src


def sequence_log_prob(
    model: Transformer, src: torch.Tensor, output: list[int]
) -> float:
    """log p(output | src) by teacher forcing: one forward pass over BOS + output[:-1]."""
    tgt = torch.tensor([[BOS] + output[:-1]])
    with torch.no_grad():
        log_probs = model(
            src,
            tgt,
            src_mask=padding_mask(src, PAD),
            tgt_mask=causal_mask(tgt.size(1)),
        )  # (1, T, V)
    return log_probs[0].gather(1, torch.tensor(output)[:, None]).sum().item()


def gnmt_penalty(length: int, alpha: float) -> float:
    """lp(Y) = (5 + |Y|)^α / (5 + 1)^α, written out here as Wu et al. (2016) state it."""
    return (5 + length) ** alpha / (5 + 1) ** alpha


def test_the_length_penalty():
    lengths = torch.arange(1, 30)
    for alpha in (0.0, 0.6, 1.0):
        expected = torch.tensor([gnmt_penalty(n, alpha) for n in range(1, 30)])
        assert torch.allclose(length_penalty(lengths, alpha), expected)
    assert length_penalty(torch.tensor(1), 0.6) == 1.0  # one token: no penalty
    assert length_penalty(torch.tensor(7), 0.6) == pytest.approx(2**0.6)


def assert_same(a: list, b: list, atol: float = 1e-4) -> None:
    """The same outputs, and the same scores up to floating-point noise."""
    assert [h.tokens for h in a] == [h.tokens for h in b]
    assert [h.ended for h in a] == [h.ended for h in b]
    for x, y in zip(a, b, strict=True):
        assert x.log_prob == pytest.approx(y.log_prob, abs=atol)
        assert x.score == pytest.approx(y.score, abs=atol)


def search(kind: str, model, src, *, prefix=None, **options):
    """The package's search over the batch src (B, S), with DecodeOptions(**options)."""
    find = batched_greedy_decode if kind == "greedy" else batched_beam_search
    return find(model, src, DecodeOptions(**options), prefix=prefix, **IDS)


def one_by_one(kind: str, model, src, **kwargs):
    """The decoding chapter's search, one sentence (its padding removed) at a time."""
    fn = greedy_decode if kind == "greedy" else beam_search
    return [fn(model, row[row != PAD], **IDS, **kwargs) for row in src]


@pytest.mark.parametrize("kind", ["greedy", "beam"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_batched_search_is_the_chapters(kind, seed):
    model = tiny_model(seed=seed)
    src = sources([7, 3, 12, 1], seed=seed)
    found = search(kind, model, src)
    assert_same(found, one_by_one(kind, model, src))
    # The random model outputs sentences of several lengths, some cut at the limit.
    assert len({len(h.tokens) for h in found}) > 1


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_and_uncached_greedy_decoding_agree(seed):
    model = tiny_model(seed=seed)
    src = sources([7, 3, 12, 1], seed=seed)
    assert_same(
        one_by_one("greedy", model, src),
        one_by_one("greedy", model, src, use_cache=False),
    )


@pytest.mark.parametrize("norm_first", [False, True])
def test_the_cache_agrees_for_a_pre_norm_model_with_learned_positions(norm_first):
    model = tiny_model(seed=3, norm_first=norm_first, positional="learned")
    src = sources([5, 9], seed=3)
    uncached = one_by_one("greedy", model, src, use_cache=False)
    assert_same(search("greedy", model, src), uncached)
    assert_same(one_by_one("greedy", model, src), uncached)
    assert_same(search("beam", model, src), one_by_one("beam", model, src))


def test_beam_size_1_equals_greedy():
    model = tiny_model(seed=4)
    src = sources([6, 2, 9, 4, 11], seed=4)
    greedy = batched_greedy_decode(model, src, **IDS)
    beam = batched_beam_search(model, src, DecodeOptions(beam_size=1), **IDS)
    assert_same(one_by_one("beam", model, src, beam_size=1), beam)
    assert [h.tokens for h in beam] == [h.tokens for h in greedy]
    for g, b in zip(greedy, beam, strict=True):
        assert b.log_prob == pytest.approx(g.log_prob, abs=1e-5)
        length = len(g.tokens) + g.ended
        assert b.score == pytest.approx(
            g.log_prob / gnmt_penalty(length, 0.6), abs=1e-5
        )


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.5])
@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_a_wide_beam_finds_the_best_sequence_of_a_brute_force_search(alpha, seed):
    # V = 5: PAD, BOS, EOS and two words; outputs of at most 4 tokens: 15 that end with EOS
    # and 16 cut at the limit, 31 in all. A beam of 31 keeps every one of them.
    vocab_size, max_len, words = 5, 4, [3, 4]
    model = tiny_model(vocab_size=vocab_size, seed=seed)
    src = sources([3], vocab_size=vocab_size, seed=seed)
    candidates = [
        list(w) + [EOS]
        for k in range(max_len)
        for w in itertools.product(words, repeat=k)
    ]
    candidates += [list(w) for w in itertools.product(words, repeat=max_len)]
    assert len(candidates) == 31

    def score(output: list[int]) -> float:
        lp = gnmt_penalty(len(output), alpha)
        return sequence_log_prob(model, src, output) / lp

    scores = {tuple(c): score(c) for c in candidates}
    best = max(scores, key=scores.get)
    [found] = batched_beam_search(
        model, src, DecodeOptions(beam_size=31, alpha=alpha, max_len=max_len), **IDS
    )
    assert found.tokens == [t for t in best if t != EOS]
    assert found.ended == (best[-1] == EOS)
    assert found.score == pytest.approx(scores[best], abs=1e-5)
    # The scores differ enough to tell the winner from the runner-up.
    runner_up = sorted(scores.values())[-2]
    assert scores[best] - runner_up > 1e-4


def test_a_narrow_beam_can_miss_what_a_wide_one_finds():
    # The reason for the test above: with these sizes, beam 1 (greedy) is not always optimal.
    missed = 0
    for seed in range(20):
        model = tiny_model(vocab_size=5, seed=seed)
        src = sources([3], vocab_size=5, seed=seed)
        narrow = batched_beam_search(
            model, src, DecodeOptions(beam_size=1, max_len=4), **IDS
        )[0]
        wide = batched_beam_search(
            model, src, DecodeOptions(beam_size=31, max_len=4), **IDS
        )[0]
        assert wide.score >= narrow.score - 1e-6
        missed += wide.score > narrow.score + 1e-6
    assert missed > 0


def reference_beam_search(
    model: Transformer, src: torch.Tensor, *, beam_size: int, alpha: float, limit: int
) -> tuple[list[int], float]:
    """The chapter's beam search for one sentence, written out in plain Python without a
    cache: the K best candidates by s(Y), ended ones keeping their slot; the best ended one
    kept aside and replaced only by a better one; stop when no open beam can overtake it."""
    src_mask = padding_mask(src, PAD)
    with torch.no_grad():
        memory = model.encode(src, src_mask)

    def next_log_probs(prefix: list[int]) -> list[float]:
        ys = torch.tensor([[BOS, *prefix]])
        with torch.no_grad():
            out = model.decode(
                ys, memory, src_mask=src_mask, tgt_mask=causal_mask(ys.size(1))
            )
            return model.generator(out[:, -1])[0].tolist()

    beams = [([], 0.0, False)]  # (tokens, log p, ended)
    kept = (-math.inf, [])
    for t in range(limit):
        candidates = []  # (s(Y), tokens, log p, ended)
        for tokens, log_p, ended in beams:
            if ended:
                score = log_p / gnmt_penalty(len(tokens), alpha)
                candidates.append((score, tokens, log_p, True))
                continue
            for token, x in enumerate(next_log_probs(tokens)):
                if token not in (PAD, BOS):
                    ends = token == EOS or t + 1 == limit
                    score = (log_p + x) / gnmt_penalty(t + 1, alpha)
                    candidates.append((score, [*tokens, token], log_p + x, ends))
        candidates.sort(key=lambda c: -c[0])
        beams = [
            (tokens, log_p, ended) for _, tokens, log_p, ended in candidates[:beam_size]
        ]
        for score, tokens, _, ended in candidates[:beam_size]:
            if ended and score > kept[0]:
                kept = (score, tokens)
        open_log_ps = [log_p for _, log_p, ended in beams if not ended]
        if not open_log_ps or kept[0] >= max(open_log_ps) / gnmt_penalty(limit, alpha):
            break
    score, tokens = kept
    return [t for t in tokens if t != EOS], score


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("beam_size", [2, 3])
def test_a_narrow_beam_is_the_search_the_chapter_describes(beam_size, alpha):
    # The brute-force test keeps every hypothesis; this one checks the pruning, ended beams
    # sharing the K slots, and the stopping bound, against a plain reference.
    for seed in range(6):
        model = tiny_model(vocab_size=7, seed=seed)
        src = sources([3 + seed % 4], vocab_size=7, seed=seed)
        [found] = batched_beam_search(
            model,
            src,
            DecodeOptions(beam_size=beam_size, alpha=alpha, max_len=8),
            **IDS,
        )
        tokens, score = reference_beam_search(
            model, src, beam_size=beam_size, alpha=alpha, limit=8
        )
        assert found.tokens == tokens, seed
        assert found.score == pytest.approx(score, abs=1e-4), seed
        # without a limit of its own, the chapter's search is the batched one's
        chapter = beam_search(model, src[0], beam_size=beam_size, alpha=alpha, **IDS)
        [unlimited] = batched_beam_search(
            model, src, DecodeOptions(beam_size=beam_size, alpha=alpha), **IDS
        )
        assert_same([chapter], [unlimited])


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_batched_decoding_equals_one_by_one(kind):
    model = tiny_model(seed=5)
    lengths = [4, 10, 1, 7, 7, 2]
    src = sources(lengths, seed=5)
    found = search(kind, model, src)
    alone = [search(kind, model, src[b : b + 1, :n])[0] for b, n in enumerate(lengths)]
    assert_same(found, alone)


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_padding_in_the_batch_changes_nothing(kind):
    model = tiny_model(seed=6)
    src = sources([5, 8, 3], seed=6)
    padded = torch.cat([src, torch.full((3, 6), PAD)], dim=1)  # (B, S + 6)
    assert_same(search(kind, model, src), search(kind, model, padded))


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_scores_are_the_log_probabilities_of_the_outputs(kind):
    model = tiny_model(seed=7)
    src = sources([6, 3, 9], seed=7)
    for b, h in enumerate(search(kind, model, src)):
        output = h.tokens + [EOS] * h.ended
        expected = sequence_log_prob(model, src[b : b + 1], output)
        assert h.log_prob == pytest.approx(expected, abs=1e-4)
        if kind == "beam":
            lp = gnmt_penalty(len(output), 0.6)
            assert h.score == pytest.approx(expected / lp, abs=1e-4)
        assert PAD not in h.tokens and BOS not in h.tokens and EOS not in h.tokens


class ScriptedGenerator(nn.Module):
    """Log-probabilities from a script (N, steps, V) instead of the model's output layer:
    the row for sentence x[:, 0] (see scripted_model) at the current step."""

    def __init__(self, script: torch.Tensor) -> None:
        super().__init__()
        self.script, self.step = script, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.script[x[:, 0].long(), self.step]
        self.step += 1
        return out


def scripted(script: torch.Tensor) -> Transformer:
    """A model whose sentence b has the log-probabilities script[b, t] at step t (decode
    under `scripted_steps()`).

    Decoding drops the sentences that have finished from its batch, so a row of the batch
    is not always the same sentence: the encoder writes b into sentence b's memory, the
    decoding step hands it on, and the generator reads it.
    """
    model = tiny_model(vocab_size=script.size(-1))
    d_model = model.config.d_model

    def encode(src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        b = torch.arange(src.size(0), dtype=torch.float)
        return b[:, None, None].expand(-1, src.size(1), d_model)

    model.encode = encode
    model.generator = ScriptedGenerator(script)
    return model


class ScriptedCache:
    """The batched searches' BatchCache without the decoder: each row's step hands the
    generator the sentence index that the scripted encoder wrote into the memory."""

    def __init__(self, model, memory, src_mask, *, beams, length) -> None:
        self.model, self.rows = model, memory[:, 0].repeat_interleave(beams, dim=0)

    def step(self, token: torch.Tensor) -> torch.Tensor:
        return self.model.generator(self.rows)  # (N, V)

    def keep(self, rows: torch.Tensor, sentences=None) -> None:
        self.rows = self.rows[rows]


def scripted_steps():
    """Decoding steps that skip the decoder (see ScriptedCache)."""
    return mock.patch.object(batched, "BatchCache", ScriptedCache)


def scripted_model(steps: list[list[int]], vocab_size: int = 6) -> Transformer:
    """A model whose sentence b prefers token steps[b][t] at step t (log-prob log 0.6)."""
    script = torch.full((len(steps), len(steps[0]), vocab_size), 0.4 / (vocab_size - 1))
    for b, tokens in enumerate(steps):
        for t, token in enumerate(tokens):
            script[b, t, token] = 0.6
    return scripted(script.log())


@scripted_steps()
def test_a_sentence_that_ends_early_stays_ended():
    # Sentence 0 prefers EOS at its second step, then word 3 for ever; sentence 1 goes on.
    model = scripted_model([[4, EOS, 3, 3, 3, 3], [5, 5, 5, 5, EOS, 3]])
    src = sources([3, 3], vocab_size=6)
    greedy = batched_greedy_decode(model, src, **IDS)
    assert [h.tokens for h in greedy] == [[4], [5, 5, 5, 5]]
    assert [h.ended for h in greedy] == [True, True]
    log_06 = torch.tensor(0.6).log().item()
    assert greedy[0].log_prob == pytest.approx(2 * log_06)  # unchanged after its EOS
    assert greedy[1].log_prob == pytest.approx(5 * log_06)

    steps: list[BeamStep] = []
    model.generator.step = 0
    beam = batched_beam_search(
        model, src, DecodeOptions(beam_size=2, max_len=6), **IDS, on_step=steps.append
    )
    assert [h.tokens for h in beam] == [[4], [5, 5, 5, 5]]
    # From its EOS (step 1) on, sentence 0's best beam outputs padding, its score unchanged,
    # until the search drops the sentence; sentence 1 searches on alone.
    assert steps[1].sentences.tolist() == [0, 1]
    assert steps[-1].sentences.tolist() == [1]
    for step in steps[1:]:
        if step.sentences[0] == 0:
            assert step.ended[0, 0] and step.parents[0, 0] == 0
            assert step.log_probs[0, 0].item() == pytest.approx(2 * log_06)
            assert step.tokens[0, 0] == (EOS if step.step == 1 else PAD)


@scripted_steps()
def test_an_ended_hypothesis_pushed_out_of_the_beam_is_not_lost():
    # With α = 2 the score of an open beam rises with lp: at step 1 "a b" and "a c" both
    # outscore the ended "EOS" and take both slots of the beam; at step 2 they can only end
    # far lower. The best hypothesis found, the empty output, must still be the result.
    script = torch.full((1, 3, 6), 0.01)
    script[0, 0, [3, EOS, 4, 5]] = torch.tensor([0.6, 0.35, 0.025, 0.025])
    script[0, 1, [4, 5, 3, EOS]] = torch.tensor([0.5, 0.45, 0.03, 0.02])
    script[0, 2, EOS] = 0.05
    model = scripted(script.log())
    steps: list[BeamStep] = []
    src = sources([3], vocab_size=6)
    (best,) = batched_beam_search(
        model,
        src,
        DecodeOptions(beam_size=2, alpha=2.0, max_len=3),
        **IDS,
        on_step=steps.append,
    )
    assert not steps[1].ended.any()  # the ended "EOS" was pushed out at step 1 ...
    assert best.tokens == [] and best.ended  # ... and is still the result
    assert best.log_prob == pytest.approx(math.log(0.35))
    assert best.score == pytest.approx(math.log(0.35))  # lp(1) = 1
    assert best.score > steps[-1].scores.max().item()  # above every beam at the end


def forbid_eos_too(log_probs: torch.Tensor, **ids) -> torch.Tensor:
    """Stands in for decode.forbid_specials: forbids EOS as well, so no output ends."""
    log_probs[..., [PAD, BOS, EOS]] = float("-inf")
    return log_probs


def test_the_output_length_limit_is_the_source_length_plus_50():
    model = tiny_model(seed=8)
    lengths = [3, 9, 1]
    src = sources(lengths, seed=8)
    assert sentence_output_limits(model, src, pad_id=PAD).tolist() == [
        n + 50 for n in lengths
    ]
    assert sentence_output_limits(model, src, pad_id=PAD, max_len=5).tolist() == [
        5,
        5,
        5,
    ]
    # Without EOS, every output runs to its own limit, and not one token further.
    with (
        mock.patch.object(batched, "forbid_specials", forbid_eos_too),
        mock.patch.object(decode, "forbid_specials", forbid_eos_too),
    ):
        for kind in ("greedy", "beam"):
            for find in (search, one_by_one):
                outputs = find(kind, model, src)
                assert [len(h.tokens) for h in outputs] == [n + 50 for n in lengths]
                assert not any(h.ended for h in outputs)
            outputs = search(kind, model, src, max_len=4)
            assert [len(h.tokens) for h in outputs] == [4, 4, 4]


def test_the_limit_never_exceeds_the_models_positions():
    model = tiny_model(seed=8, max_len=20)
    src = sources([3, 15], seed=8)
    assert sentence_output_limits(model, src, pad_id=PAD).tolist() == [20, 20]
    outputs = batched_beam_search(model, src, **IDS)
    assert all(len(h.tokens) + h.ended <= 20 for h in outputs)
    assert_same(outputs, one_by_one("beam", model, src))


@pytest.mark.parametrize(
    ("alpha", "vocab_size", "seed", "by_the_bound"),
    [(0.0, 8, 9, True), (0.6, 8, 9, True), (2.0, 5, 11, False)],
)
def test_stopping_early_returns_what_searching_to_the_limit_returns(
    alpha, vocab_size, seed, by_the_bound
):
    # At alpha 0 and 0.6 the search stops with beams still open, by the bound; at alpha 2,
    # lp(limit) is so large that these tiny models stop only when every beam has ended.
    model = tiny_model(vocab_size=vocab_size, seed=seed)
    src = sources([4, 6, 2, 8, 5], vocab_size=vocab_size, seed=seed)
    early_steps, late_steps = [], []
    early = batched_beam_search(
        model, src, DecodeOptions(alpha=alpha), **IDS, on_step=early_steps.append
    )
    never = torch.zeros(src.size(0), dtype=torch.bool)
    with mock.patch.object(batched, "_finished", return_value=never):
        late = batched_beam_search(
            model, src, DecodeOptions(alpha=alpha), **IDS, on_step=late_steps.append
        )
    assert len(late_steps) == 8 + 50  # the longest source's limit
    assert len(early_steps) < len(late_steps)
    assert (~early_steps[-1].ended).any(dim=-1).all() == by_the_bound
    assert_same(early, late)


def test_decoding_restores_the_training_mode_and_checks_its_arguments():
    src = sources([3, 7, 5])
    for decode_fn in (batched_greedy_decode, batched_beam_search):
        # A model in training mode decodes without dropout, as in eval mode ...
        model = tiny_model(dropout=0.5).train()
        torch.manual_seed(0)
        assert_same(decode_fn(model, src, **IDS), decode_fn(model.eval(), src, **IDS))
        # ... and is left in the mode it was in.
        model.train()
        decode_fn(model, src, **IDS)
        assert model.training and all(m.training for m in model.modules())
    model = tiny_model().train()
    src = sources([3])
    with pytest.raises(ValueError, match="beam_size"):
        batched_beam_search(model, src, DecodeOptions(beam_size=0), **IDS)
    with pytest.raises(ValueError, match="alpha"):
        batched_beam_search(model, src, DecodeOptions(alpha=-0.1), **IDS)
    with pytest.raises(ValueError, match="alpha"):
        batched_beam_search(model, src, DecodeOptions(alpha=float("nan")), **IDS)
    for decode_fn in (batched_greedy_decode, batched_beam_search):
        with pytest.raises(ValueError, match=r"\(B, S\) tensor of token ids"):
            decode_fn(model, src[0], **IDS)  # one sentence without its batch dimension
        with pytest.raises(ValueError, match="no positions"):
            decode_fn(model, src[:, :0], **IDS)
        padding_only = torch.cat([src, torch.full_like(src, PAD)])  # row 1: no token
        with pytest.raises(ValueError, match="src row 1 is all padding"):
            decode_fn(model, padding_only, **IDS)
        assert decode_fn(model, src[:0], **IDS) == []  # an empty batch
    with pytest.raises(ValueError, match="pad_id"):
        batched_greedy_decode(model, src, bos_id=BOS, eos_id=PAD, pad_id=PAD)


@pytest.mark.parametrize("alpha", [float("inf"), float("-inf"), 1e308, 10.1, -0.1])
def test_alpha_must_be_a_number_from_0_to_10(alpha):
    # An infinite lp would make every ruled-out candidate -inf / inf = NaN, which topk
    # prefers: the search would return what it had ruled out.
    with pytest.raises(ValueError, match=r"alpha must be >= 0 and at most 10, got"):
        batched_beam_search(
            tiny_model(), sources([3]), DecodeOptions(alpha=alpha), **IDS
        )


def test_the_length_penalty_cannot_overflow_for_an_accepted_alpha():
    # At the bound, 10, lp is finite far beyond any model's positions ...
    assert length_penalty(torch.arange(1, 40_001), 10.0).isfinite().all()
    src = sources([3, 5])
    steps: list[BeamStep] = []
    found = batched_beam_search(
        tiny_model(), src, DecodeOptions(alpha=10.0), **IDS, on_step=steps.append
    )
    assert not any(step.scores.isnan().any() for step in steps)
    assert all(h.tokens and math.isfinite(h.score) for h in found)
    # ... and for a model with still more positions, the search checks it.
    model = tiny_model(max_len=50_000)
    with pytest.raises(ValueError, match="overflow at the model's 50000 positions"):
        batched_beam_search(model, src, DecodeOptions(alpha=10.0), **IDS)
    assert (
        len(batched_beam_search(model, src, DecodeOptions(alpha=0.6, max_len=4), **IDS))
        == 2
    )
    assert MAX_ALPHA == 10


# -- a forced prefix --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_a_forced_prefix_starts_every_output_and_counts_in_its_log_probability(kind):
    model = tiny_model(seed=12)
    src = sources([5, 8, 3], seed=12)
    prefix = torch.tensor(
        [[7, 7, 4], [5, PAD, PAD], [9, 3, PAD]]
    )  # PAD: the search chooses
    found = search(kind, model, src, prefix=prefix)
    free = search(kind, model, src)
    for b, h in enumerate(found):
        forced = [t for t in prefix[b].tolist() if t != PAD]
        assert h.tokens[: len(forced)] == forced
        output = h.tokens + [EOS] * h.ended
        expected = sequence_log_prob(model, src[b : b + 1], output)
        assert h.log_prob == pytest.approx(expected, abs=1e-4)
    assert [h.tokens for h in found] != [h.tokens for h in free]


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_a_prefix_the_search_would_choose_changes_nothing(kind):
    model = tiny_model(seed=13)
    src = sources([6, 4], seed=13)
    free = search(kind, model, src)
    width = min(len(h.tokens) for h in free)
    prefix = torch.tensor([h.tokens[:width] for h in free])
    assert_same(search(kind, model, src, prefix=prefix), free)


def test_a_prefix_is_checked():
    model = tiny_model()
    src = sources([3, 4])
    for prefix, problem in (
        (torch.tensor([3, 4]), r"\(B, P\) tensor"),
        (torch.tensor([[3, 4]]), "1 rows for 2 sources"),
        (torch.tensor([[3, EOS], [4, 4]]), "must not hold <bos> or <eos>"),
    ):
        with pytest.raises(ValueError, match=problem):
            batched_beam_search(model, src, prefix=prefix, **IDS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_only_a_beams_k_most_probable_tokens_can_be_kept(seed):
    """A beam's extensions share its log p and lp, so each kept one is among its beam's K
    most probable next tokens: the K·K candidates of the batched search and the translator
    page keep what the chapter's K·V keep."""
    model = tiny_model(seed=seed)
    steps = []
    for row in sources([7, 3, 12], seed=seed):
        beam_search(
            model,
            row[row != PAD],
            beam_size=3,
            **IDS,
            on_step=lambda *a: steps.append(a),
        )
    kept = 0
    for log_p_next, _, index, _ in steps:
        K, V = len(index), log_p_next.size(1)
        assert V > K  # so that the K·K candidates are fewer than the K·V
        best_tokens = log_p_next.topk(K, dim=1).indices  # (K, K)
        for i in index.tolist():
            assert i % V in best_tokens[i // V], (seed, i)
            kept += 1
    assert kept > 3 * 3


def test_the_chapters_notes_on_beam_search_quote_the_lines_they_number():
    """The decoding chapter numbers beam_search's lines and explains them in notes that start
    with the line numbers, "**Lines 32–33.**": every `code` span a note quotes is on its
    lines, so that a change to the function that moves a line fails here."""
    import json
    import re
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "chapters" / "14_decoding.ipynb"
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    [at] = [
        i
        for i, c in enumerate(cells)
        if c["metadata"].get("mystnb", {}).get("number_source_lines")
    ]
    lines = "".join(cells[at]["source"]).split("\n")
    assert any(line.startswith("def beam_search(") for line in lines)
    notes = "".join(cells[at + 1]["source"])
    quoted = 0
    for first, last, text in re.findall(
        r"^- \*\*Lines? (\d+)(?:–(\d+))?\.(.*?)(?=^- |^$|\Z)", notes, re.M | re.S
    ):
        numbered = "\n".join(lines[int(first) - 1 : int(last or first)])
        for span in re.findall(r"`([^`]+)`", text):
            assert span in numbered, (first, last, span)
            quoted += 1
    assert quoted >= 10


# -- the shipped models ----------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_chapters_searches_are_the_packages_on_200_test_sentences(pair):
    """The decoding chapter's one-sentence searches and the batched ones that `translate`
    runs give the same outputs for the shipped models, in batches of 32 sentences of similar
    lengths, as `translate` makes them."""
    from transformer.multi30k import load_pairs
    from transformer.translation import length_sorted_batches, load_pair_model

    model, tokenizer = load_pair_model(pair)
    model.eval()
    ids = {
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
    }
    texts = [source for source, _ in load_pairs("test_2016_flickr", pair)[:200]]
    encoded = [tokens + [tokenizer.eos_id] for tokens in tokenizer.encode_batch(texts)]
    for kind in ("greedy", "beam"):
        chapter = greedy_decode if kind == "greedy" else beam_search
        batched_fn = batched_greedy_decode if kind == "greedy" else batched_beam_search
        found = {}
        for batch in length_sorted_batches([len(e) for e in encoded], 32):
            src = torch.full((len(batch), len(encoded[batch[0]])), tokenizer.pad_id)
            for row, i in enumerate(batch):
                src[row, : len(encoded[i])] = torch.tensor(encoded[i])
            found.update(zip(batch, batched_fn(model, src, **ids), strict=True))
        for i, tokens in enumerate(encoded):
            h = chapter(model, torch.tensor(tokens), **ids)
            assert (h.tokens, h.ended) == (found[i].tokens, found[i].ended), (kind, i)
            assert h.score == pytest.approx(found[i].score, abs=1e-4)
