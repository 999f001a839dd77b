"""transformer.knockout: parts of a model switched off by zeroing the weights that carry
them. The spelling reads back as it prints and refuses bad input in one line; a head off
equals its slice of the concatenation zeroed before W^O; a sublayer off adds zero to its
residual; the positional encoding off equals a zero table; the weights come back bit for
bit; nothing off writes nothing; the searches and the command line see it."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import VARIANTS, tiny_model

from transformer.batched_search import batched_beam_search, batched_greedy_decode
from transformer.cli.main import main
from transformer.decode import beam_search, greedy_decode
from transformer.knockout import ATTENTIONS, KnockOut, Part, knocked_out
from transformer.masking import causal_mask, padding_mask
from transformer.model import Transformer

ROOT = Path(__file__).resolve().parent.parent
PAD, BOS, EOS = 0, 1, 2
SPECIAL = dict(bos_id=BOS, eos_id=EOS, pad_id=PAD)

pytestmark = pytest.mark.usefixtures("one_thread")


def batch() -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Sources (3, 6) ending with <eos>, the last padded; targets (3, 5); their masks."""
    g = torch.Generator().manual_seed(1)
    src = torch.randint(3, 23, (3, 6), generator=g)
    src[:, -1], src[2, 3], src[2, 4:] = EOS, EOS, PAD
    tgt = torch.randint(3, 23, (3, 5), generator=g)
    return src, tgt, dict(src_mask=padding_mask(src, PAD), tgt_mask=causal_mask(5))


def every_tensor(model: Transformer) -> dict[str, torch.Tensor]:
    """The parameters and the buffers (the sinusoids are not in the state_dict)."""
    return dict([*model.named_parameters(), *model.named_buffers()])


# The spelling


@pytest.mark.parametrize(
    "text, printed",
    [
        ("enc-self:L1h3", "enc-self:L1h3"),
        ("dec-cross:L2h4, enc-self:L1h3", "enc-self:L1h3,dec-cross:L2h4"),
        ("dec-cross:L2,dec-cross:L2h1", "dec-cross:L2,dec-cross:L2h1"),
        ("pe", "pe"),
        ("dec-pe,enc-pe", "pe"),
        ("enc-pe", "enc-pe"),
        (
            "dec-ffn:L1,enc-ffn:L2,pe,dec-self:L2h2",
            "enc-ffn:L2,dec-self:L2h2,dec-ffn:L1,pe",
        ),
        ("enc-self:L1h3,enc-self:L1h3", "enc-self:L1h3"),
        ("", ""),
    ],
)
def test_the_spelling_prints_back_as_it_reads(text, printed):
    spec = KnockOut.parse(text)
    assert str(spec) == printed
    assert KnockOut.parse(str(spec)) == spec
    assert bool(spec) == bool(printed)


def test_parts_count_layers_and_heads_from_one():
    assert KnockOut.parse("dec-cross:L3h5,pe").parts == {
        Part("dec-cross", 3, 5),
        Part("enc-pe"),
        Part("dec-pe"),
    }


@pytest.mark.parametrize(
    "text, says",
    [
        ("enc-self:L0h1", "cannot read 'enc-self:L0h1'"),
        ("enc-self:L1h0", "cannot read"),
        ("enc-ffn:L1h2", "enc-ffn has no heads"),
        ("attention:L1h2", "cannot read 'attention:L1h2'"),
        ("enc-self", "cannot read"),
        ("enc-self:1h2", "cannot read"),
        ("enc-self:L1h", "cannot read"),
        ("pe:L1", "cannot read"),
        ("enc-self:L1,,pe", "cannot read ''"),
        ("enc-self:L1h2;pe", "cannot read"),
    ],
)
def test_bad_spellings_are_one_line_errors(text, says):
    with pytest.raises(ValueError, match=r"^[^\n]*$") as caught:
        KnockOut.parse(text)
    assert says in str(caught.value)


@pytest.mark.parametrize(
    "text, says",
    [
        ("enc-self:L3h1", "enc-self:L3h1: the model has 2 layers"),
        ("dec-ffn:L3", "dec-ffn:L3: the model has 2 layers"),
        ("dec-cross:L1h5", "dec-cross:L1h5: the model has 4 heads"),
    ],
)
def test_a_part_the_model_lacks_is_refused_before_anything_is_written(text, says):
    model = tiny_model()
    before = {k: v._version for k, v in every_tensor(model).items()}
    with pytest.raises(ValueError, match=says):
        with knocked_out(model, text):
            raise AssertionError("entered")
    assert {k: v._version for k, v in every_tensor(model).items()} == before


# What switching a part off means


def attention_module(model: Transformer, kind: str, layer: int):
    stack = model.encoder if kind == "enc-self" else model.decoder
    return getattr(
        stack.layers[layer - 1], "cross_attn" if kind == "dec-cross" else "self_attn"
    )


@pytest.mark.parametrize("overrides", VARIANTS)
@pytest.mark.parametrize("kind", ATTENTIONS)
def test_a_head_off_is_its_slice_of_the_concatenation_zeroed(kind, overrides):
    """Michel et al.'s definition, a forward pre-hook on W^O that zeroes head 3's d_k
    inputs, against the zeroed columns of W^O."""
    model = tiny_model(**overrides)
    src, tgt, masks = batch()
    attn = attention_module(model, kind, 2)
    d_k = attn.d_k

    def zero_head_3(module, inputs):
        (x,) = inputs
        return x.index_fill(-1, torch.arange(2 * d_k, 3 * d_k), 0.0)

    with torch.no_grad():
        whole = model(src, tgt, **masks)
        with knocked_out(model, f"{kind}:L2h3"):
            off = model(src, tgt, **masks)
        hook = attn.w_o.register_forward_pre_hook(zero_head_3)
        try:
            by_hook = model(src, tgt, **masks)
        finally:
            hook.remove()
    torch.testing.assert_close(off, by_hook, atol=1e-6, rtol=0)
    assert not torch.allclose(off, whole, atol=1e-4)


@pytest.mark.parametrize("overrides", VARIANTS[:2])
@pytest.mark.parametrize("kind", [*ATTENTIONS, "enc-ffn", "dec-ffn"])
def test_a_sublayer_off_adds_zero_to_its_residual(kind, overrides):
    """LayerNorm(x + 0) in post-norm, x + 0 in pre-norm."""
    model = tiny_model(**overrides)
    stack = model.encoder if kind.startswith("enc") else model.decoder
    layer = stack.layers[0]
    x, memory = torch.randn(3, 5, 16), torch.randn(3, 6, 16)
    if kind == "dec-cross":
        sublayer, module = 1, lambda h: layer.cross_attn(h, memory, memory)[0]
    elif kind.endswith("ffn"):
        sublayer, module = (1 if kind == "enc-ffn" else 2), layer.feed_forward
    else:
        sublayer, module = 0, lambda h: layer.self_attn(h, h, h)[0]
    connection = layer.sublayers[sublayer]
    expected = x if overrides else connection.norm(x)
    with torch.no_grad(), knocked_out(model, f"{kind}:L1"):
        assert torch.equal(connection(x, module), expected)


@pytest.mark.parametrize("overrides", [VARIANTS[0], VARIANTS[2]])
@pytest.mark.parametrize("text", ["pe", "enc-pe", "dec-pe"])
def test_the_positional_encoding_off_is_a_zero_table(text, overrides):
    model = tiny_model(**overrides)
    zeroed = copy.deepcopy(model)
    for name, encoding in (("enc-pe", zeroed.src_pos), ("dec-pe", zeroed.tgt_pos)):
        if Part(name) in KnockOut.parse(text).parts:
            table = encoding.embedding.weight if overrides else encoding.pe
            with torch.no_grad():
                table.zero_()
    src, tgt, masks = batch()
    with torch.no_grad():
        with knocked_out(model, text):
            off = model(src, tgt, **masks)
        assert torch.equal(off, zeroed(src, tgt, **masks))


# Restoring, and nothing off


@pytest.mark.parametrize("overrides", VARIANTS)
def test_leaving_restores_every_weight_bit_for_bit_also_after_an_error(overrides):
    model = tiny_model(**overrides)
    spec = (
        "enc-self:L1h2,enc-ffn:L2,dec-self:L2,dec-cross:L1h4,dec-cross:L1,dec-ffn:L1,pe"
    )
    before = {k: v.clone() for k, v in every_tensor(model).items()}
    with knocked_out(model, spec):
        changed = [
            k for k, v in every_tensor(model).items() if not torch.equal(v, before[k])
        ]
    assert len(changed) >= 7
    with pytest.raises(RuntimeError, match="inside"), knocked_out(model, spec):
        raise RuntimeError("inside")
    with knocked_out(model, spec), knocked_out(model, "enc-self:L1h2,pe"):  # nested
        pass
    after = every_tensor(model)
    assert all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("spec", [None, "", "  ", KnockOut()])
def test_nothing_off_writes_nothing(spec):
    """No tensor is written, so the searches' laid-out weights stay valid."""
    model = tiny_model()
    versions = {k: v._version for k, v in every_tensor(model).items()}
    with knocked_out(model, spec) as inside:
        assert inside is model
    assert {k: v._version for k, v in every_tensor(model).items()} == versions


# The searches


def test_the_batched_searches_agree_with_the_chapters_with_a_head_off():
    """The batched search lays out its weights once per model and again when one is
    written: run once with everything on, then with heads off, then on again."""
    model = tiny_model()
    src, _, _ = batch()
    spec = "dec-cross:L2h1,dec-self:L1h3,enc-self:L2h2"

    def batched() -> list[list[int]]:
        return [h.tokens for h in batched_greedy_decode(model, src, **SPECIAL)]

    def chapter() -> list[list[int]]:
        rows = [row[row != PAD] for row in src]
        return [greedy_decode(model, row, **SPECIAL).tokens for row in rows]

    def beams() -> tuple[list[list[int]], list[list[int]]]:
        rows = [row[row != PAD] for row in src]
        ours = batched_beam_search(model, src, **SPECIAL)
        theirs = [beam_search(model, row, **SPECIAL) for row in rows]
        return [h.tokens for h in ours], [h.tokens for h in theirs]

    everything = batched()
    assert everything == chapter()
    with knocked_out(model, spec):
        off = batched()
        assert off == chapter()
        ours, theirs = beams()
        assert ours == theirs
    assert off != everything
    assert batched() == everything


# translate and the command line, with the shipped German model


@pytest.fixture(scope="module")
def german():
    from transformer.translation import load_pair_model

    return load_pair_model("de-en")


SENTENCES = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt mit dem Fahrrad."]
SPEC = "dec-cross:L1,dec-cross:L2"


def test_translate_with_parts_off_runs_the_model_knocked_out(german):
    from transformer.translation import translate

    model, tokenizer = german
    everything = translate(model, tokenizer, SENTENCES, beam_size=1)
    off = translate(model, tokenizer, SENTENCES, beam_size=1, knock_out=SPEC)
    with knocked_out(model, SPEC):
        assert off == translate(model, tokenizer, SENTENCES, beam_size=1)
    assert off != everything
    assert (
        translate(model, tokenizer, SENTENCES, beam_size=1, knock_out="") == everything
    )


def test_the_command_line_translates_with_parts_off(german):
    from transformer.translation import translate

    model, tokenizer = german
    argv = [sys.executable, "-m", "transformer", "translate", "--pair", "de-en"]
    done = subprocess.run(
        [*argv, "--device", "cpu", "--knock-out", SPEC, *SENTENCES],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == translate(
        model, tokenizer, SENTENCES, knock_out=SPEC
    )


@pytest.mark.parametrize(
    "options, says",
    [
        (
            ["--knock-out", "enc-self:L1h9"],
            "--knock-out enc-self:L1h9: the model has 8 heads",
        ),
        (["--knock-out", "heads"], "--knock-out cannot read 'heads'"),
        (
            ["--engine", "ctranslate2", "--knock-out", "pe"],
            "--knock-out needs the package's",
        ),
    ],
)
def test_the_command_line_refuses_a_bad_knockout_in_one_line(options, says, capsys):
    status = main(
        ["translate", "--pair", "de-en", "--device", "cpu", *options, "Hallo."]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1 and says in err, err
