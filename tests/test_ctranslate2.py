"""transformer.ctranslate2 and the `ctranslate2` command: a model exported to CTranslate2
translates as the package does, and a model the export does not convert is refused."""

import json
import subprocess
import sys
from unittest import mock

import pytest
import sacrebleu
import torch

pytest.importorskip("ctranslate2")

from helpers import ship, tiny_tokenizer  # noqa: E402

import transformer.ctranslate2 as ct2_module  # noqa: E402
from transformer.batched_search import (  # noqa: E402
    batched_beam_search,
    batched_greedy_decode,
)
from transformer.cli.main import main  # noqa: E402
from transformer.config import TransformerConfig  # noqa: E402
from transformer.ctranslate2 import CTranslate2Model, export_ctranslate2  # noqa: E402
from transformer.decode_options import DecodeOptions  # noqa: E402
from transformer.model import Transformer  # noqa: E402
from transformer.multi30k import (
    PAIRS,
    load_pairs,  # noqa: E402
)
from transformer.translation import load_pair_model, translate  # noqa: E402


@pytest.fixture(scope="module", params=list(PAIRS))
def exported(request, tmp_path_factory):
    """(pair, model, tokenizer, the engine on the exported float32 model)."""
    model, tokenizer = load_pair_model(request.param)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    folder = tmp_path_factory.mktemp("ct2") / request.param
    export_ctranslate2(model, tokenizer, folder)
    # The engine's quantisation works in place: the export must copy, not share, the weights.
    export_ctranslate2(model, tokenizer, folder.with_name("int8"), quantization="int8")
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    return request.param, model, tokenizer, CTranslate2Model(folder, threads=2)


@pytest.mark.slow
def test_greedy_translations_are_the_packages_and_beam_search_scores_the_same(exported):
    pair, model, tokenizer, engine = exported
    test = load_pairs("test_2016_flickr", pair)
    sources, references = [s for s, _ in test], [[t for _, t in test]]
    ours = translate(model, tokenizer, sources, beam_size=1)
    assert engine.translate(sources, beam_size=1) == ours  # all 1,000 sentences
    ours, theirs = (
        f(sources, beam_size=4)
        for f in (
            lambda s, **kw: translate(model, tokenizer, s, **kw),
            engine.translate,
        )
    )
    bleu = [sacrebleu.corpus_bleu(list(t), references).score for t in (ours, theirs)]
    assert abs(bleu[0] - bleu[1]) < 0.3


def test_the_folder_holds_the_engines_model_and_the_packages_tokenizer(exported):
    pair, model, _, engine = exported
    names = {p.name for p in engine.folder.iterdir()}
    assert {
        "model.bin",
        "config.json",
        "tokenizer.json",
        ct2_module.EXPORT_RECORD,
    } <= names
    record = json.loads((engine.folder / ct2_module.EXPORT_RECORD).read_text())
    assert record == {
        "pair": pair,
        "max_len": model.config.max_len,
        "quantization": "float32",
    }
    assert engine.translate([]) == [] and engine.translate(["", " "]) == ["", ""]
    with pytest.raises(TypeError, match="sequence of sentences"):
        engine.translate("Ein Hund.")


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"norm_first": True}, "pre-norm"),
        ({"positional": "learned"}, "learned positional"),
        (
            {"share_embeddings": False, "tgt_vocab_size": 12},
            "separate source and target",
        ),
        ({"tie_output": False}, "not tied"),
    ],
)
def test_a_model_the_export_does_not_convert_is_refused(tmp_path, fields, named):
    _, tokenizer = load_pair_model("de-en")
    config = dict(src_vocab_size=tokenizer.vocab_size, d_model=16, n_heads=2, d_ff=32)
    model = Transformer(TransformerConfig(**(config | dict(n_layers=1) | fields)))
    with pytest.raises(ValueError, match=f"cannot export to CTranslate2 .*{named}"):
        export_ctranslate2(model, tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_each_sentence_keeps_its_own_length_limit(tmp_path):
    """In one batch of a short and a long source, the engine stops each output at its own
    source length + 50, as the package's searches do: an untrained model never says <eos>."""
    model, tokenizer = load_pair_model(
        "de-en", ship(tmp_path / "tiny", tiny_tokenizer(), max_len=128)
    )
    engine = CTranslate2Model(export_ctranslate2(model, tokenizer, tmp_path / "out"))
    eos, pad = tokenizer.eos_id, tokenizer.pad_id
    sources = [[30, 30, eos], [30] * 20 + [eos]]  # 3 and 21 tokens
    src = torch.full((2, 21), pad)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids)
    special = dict(bos_id=tokenizer.bos_id, eos_id=eos, pad_id=pad)
    for beam in (1, 2):
        options = DecodeOptions(beam_size=beam)
        search = batched_greedy_decode if beam == 1 else batched_beam_search
        ours = [h.tokens for h in search(model, src, options, **special)]
        theirs = engine.decode_batch(sources, options)
        assert [len(t) for t in ours] == [len(t) for t in theirs] == [53, 71]
        assert engine.limits(sources, options) == [53, 71]


def test_the_engine_warns_as_the_package_does(tmp_path):
    """Of a source cut to the model's positions and of outputs the length limit stopped: an
    untrained model of 12 positions never says <eos>."""
    model, tokenizer = load_pair_model(
        "de-en", ship(tmp_path / "tiny", tiny_tokenizer(), max_len=12)
    )
    engine = CTranslate2Model(export_ctranslate2(model, tokenizer, tmp_path / "out"))
    sentences = ["Ein Hund.", "Ein Hund " + "läuft und springt " * 6 + "."]
    told = {"package": [], "engine": []}
    translate(model, tokenizer, sentences, beam_size=1, warn=told["package"].append)
    engine.translate(sentences, beam_size=1, warn=told["engine"].append)
    assert told["engine"] == told["package"]
    assert len(told["package"]) == 2
    assert "sentence 2: " in told["package"][0] and "12 positions" in told["package"][0]
    assert (
        "sentences 1 and 2: " in told["package"][1]
        and "length limit" in told["package"][1]
    )


def test_without_ctranslate2_the_export_says_how_to_install_it(tmp_path):
    model, tokenizer = load_pair_model("de-en")
    with mock.patch.dict(sys.modules, {"ctranslate2": None}):
        with pytest.raises(ImportError, match=r"pip install 'ctranslate2"):
            export_ctranslate2(model, tokenizer, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_ctranslate2_and_translate_commands(tmp_path, capsys):
    out = tmp_path / "de-en-ct2"
    assert main(["ctranslate2", "--pair", "de-en", str(out)]) == 0
    assert "written to" in capsys.readouterr().out
    # The command's old name still works, with a one-line note.
    old = [
        "export",
        "--format",
        "ctranslate2",
        "--pair",
        "de-en",
        str(tmp_path / "old"),
    ]
    assert main(old) == 0
    written = capsys.readouterr()
    assert "written to" in written.out
    assert written.err == "python -m transformer: note: `export` is now `ctranslate2`\n"
    sentence = "Ein Hund rennt über eine Wiese."
    engine = ["--engine", "ctranslate2", "--model", str(out), "--beam", "1"]
    assert main(["translate", "--pair", "de-en", *engine, sentence]) == 0
    from_engine = capsys.readouterr().out
    assert main(["translate", "--pair", "de-en", "--beam", "1", sentence]) == 0
    assert from_engine == capsys.readouterr().out
    # Errors: one line each, status 2.
    for argv, message in [
        (
            ["translate", "--pair", "de-en", "--engine", "ctranslate2", "x"],
            "needs --model",
        ),
        (["translate", "--pair", "fr-en", *engine, "x"], "holds a de-en model"),
        (
            [
                "translate",
                "--pair",
                "de-en",
                "--engine",
                "ctranslate2",
                "--model",
                str(tmp_path),
                "x",
            ],
            "not a model written",
        ),  # fmt: skip
        (
            ["ctranslate2", "--format", "onnx", "--pair", "de-en", str(out)],
            "invalid choice",
        ),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.splitlines()) == 1, err


def test_python_m_transformer_lists_the_ctranslate2_command():
    result = subprocess.run(
        [sys.executable, "-m", "transformer", "--help"], capture_output=True, text=True
    )
    assert result.returncode == 0 and "ctranslate2" in result.stdout
