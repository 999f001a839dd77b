"""`transformer.evaluate`: the scores against sacreBLEU called directly, BLEU by source length,
translating a split, writing translations atomically, and `python -m transformer evaluate` on a
tiny model (through the package's `main`, as a shell runs it), with its errors for bad options,
models and data."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ENGLISH, GERMAN, ship, tiny_tokenizer
from sacrebleu.metrics import BLEU, CHRF

import transformer.evaluate as evaluate_module
import transformer.split_translation as splits
import transformer.tokenizer as tokenizer_module
import transformer.translation as translation
from transformer.__main__ import main as package_main
from transformer.cli.evaluate import model_digest
from transformer.decode_options import DecodeOptions
from transformer.evaluate import (
    LC_TOK_BLEU,
    bleu_by_length,
    score,
    scores_record,
    spacy_words,
    stored_scores,
)
from transformer.multi30k import PAIRS, load_pairs
from transformer.paper_search import PAPER_ALPHA, PAPER_BEAM_SIZE
from transformer.paths import CHECKPOINTS_DIR
from transformer.split_translation import translate_split, write_lines
from transformer.translation import translate

FRENCH = [
    "Un chien court dans un pré.",
    "Deux enfants jouent dans la neige.",
    "Une femme avec un chapeau rouge est assise sur un banc.",
    "Un homme fait du vélo.",
    "Trois chiens jouent avec un ballon.",
    "Une petite fille rit.",
]


pytestmark = pytest.mark.usefixtures("one_thread")


def write_data(folder: Path, texts: dict[str, list[str]]) -> Path:
    """A Multi30k-like data folder: gzipped files named split.lang.gz and their SHA256SUMS."""
    folder.mkdir(parents=True, exist_ok=True)
    sums = []
    for name, lines in texts.items():
        raw = gzip.compress("".join(f"{line}\n" for line in lines).encode(), mtime=0)
        (folder / name).write_bytes(raw)
        sums.append(f"{hashlib.sha256(raw).hexdigest()}  {name}\n")
    (folder / "SHA256SUMS").write_text("".join(sums))
    return folder


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    return write_data(
        tmp_path_factory.mktemp("multi30k"),
        {
            "test_2016_flickr.de.gz": GERMAN,
            "test_2016_flickr.en.gz": ENGLISH,
            "test_2016_flickr.fr.gz": FRENCH,
            "val.de.gz": GERMAN[:3],
            "val.en.gz": ENGLISH[:3],
        },
    )


# -- score ------------------------------------------------------------------------------------

HYPOTHESES = ["A dog runs across a green field.", "two kids play in snow .", ""]
REFERENCES = [
    "A dog runs across a green meadow.",
    "Two children play in the snow.",
    "A man's bike.",
]


def test_score_is_sacrebleu_cased_on_detokenised_text():
    s = score(HYPOTHESES, REFERENCES)
    bleu_metric, chrf_metric = BLEU(), CHRF()
    bleu = bleu_metric.corpus_score(HYPOTHESES, [REFERENCES])
    chrf = chrf_metric.corpus_score(HYPOTHESES, [REFERENCES])
    assert s.sentences == 3
    assert s.bleu == bleu.score and s.chrf == chrf.score
    assert s.length_ratio == bleu.ratio and s.brevity_penalty == bleu.bp
    for part in ("nrefs:1", "case:mixed", "tok:13a", "smooth:exp", "version:"):
        assert part in s.bleu_signature, part
    assert s.bleu_signature == str(bleu_metric.get_signature())
    assert "case:mixed" in s.chrf_signature and "nc:6" in s.chrf_signature
    assert s.chrf_signature == str(chrf_metric.get_signature())
    assert score(REFERENCES, REFERENCES).bleu == pytest.approx(100.0)


def test_the_lowercased_tokenised_bleu_is_labelled_and_ignores_case():
    s = score(HYPOTHESES, REFERENCES)
    assert (
        "case:lc" in s.bleu_lc_tok_signature and "tok:none" in s.bleu_lc_tok_signature
    )
    words = spacy_words(REFERENCES)
    assert words[2] == "A man 's bike ."  # spaCy's English rules
    expected = BLEU(lowercase=True, tokenize="none").corpus_score(
        spacy_words(HYPOTHESES), [words]
    )
    assert s.bleu_lc_tok == expected.score
    # Case changes sacreBLEU, not the lowercased one.
    lower = score(["a dog runs across a green meadow."], [REFERENCES[0]])
    assert lower.bleu_lc_tok == pytest.approx(100.0) and lower.bleu < 99
    report = s.report().splitlines()
    assert report == [
        f"sacreBLEU {s.bleu:6.2f}  {s.bleu_signature}",
        f"          (output/reference length {s.length_ratio:.3f}, "
        f"brevity penalty {s.brevity_penalty:.3f})",
        f"chrF      {s.chrf:6.2f}  {s.chrf_signature}",
        f"{LC_TOK_BLEU}, only to compare with published Multi30k results: "
        f"{expected.score:.2f}  {s.bleu_lc_tok_signature}",
    ]


def test_score_refuses_mismatched_input():
    with pytest.raises(ValueError, match="2 translations but 3 references"):
        score(HYPOTHESES[:2], REFERENCES)
    with pytest.raises(ValueError, match="no sentences"):
        score([], [])
    with pytest.raises(TypeError, match="not one string"):
        score("A dog.", "A dog.")


# -- bleu_by_length ---------------------------------------------------------------------------


def words(n: int) -> str:
    return " ".join(["Wort"] * n)


def test_bleu_by_length_groups_by_source_words():
    sources = [words(n) for n in (0, 3, 9, 10, 14, 14, 20, 31)]
    hypotheses = [f"a b c d {i}" for i in range(len(sources))]
    references = [f"a b c d {i}" if i % 2 else f"x y z w {i}" for i in range(6)]
    references += ["nothing in common", "at all"]  # the 20+ group scores 0
    groups = bleu_by_length(sources, hypotheses, references)
    assert [(g.words, g.sentences) for g in groups] == [
        ("1–9", 3),  # 0 words counts in the first group
        ("10–14", 3),
        ("15–19", 0),
        ("20+", 2),
    ]
    assert math.isnan(groups[2].bleu) and math.isnan(groups[2].length_ratio)
    members = [3, 4, 5]
    expected = BLEU().corpus_score(
        [hypotheses[i] for i in members], [[references[i] for i in members]]
    )
    assert groups[1].bleu == expected.score and groups[1].length_ratio == expected.ratio
    assert groups[3].bleu == 0.0
    custom = bleu_by_length(sources, hypotheses, references, bounds=(0, 10, 11))
    assert [(g.words, g.sentences) for g in custom] == [
        ("0–9", 3),
        ("10", 1),
        ("11+", 4),
    ]


REFERENCE = Path(__file__).resolve().parent / "reference"


# The shipped models' stored evaluations, and the weights each scores.
STORED = {
    f"{pair}{suffix}": (pair, weights)
    for pair in PAIRS
    for suffix, weights in (("", ""), (".greedy", ""), (".last", "last"))
}


@pytest.mark.parametrize("pair", PAIRS)
def test_the_stored_scores_are_those_of_the_shipped_translations(pair):
    """checkpoints/scores/<pair>.json, the scores that the results chapter, the model cards,
    the introduction and the translator page read, are evaluate's defaults' scores of the
    shipped model's pinned translations with the paper's search (tests/
    test_shipped_translations.py checks that the model still gives them), to the last
    digit, with their signatures, while the defaults are the paper's."""
    stored, record = stored_scores(pair)
    assert record["options"] == dataclasses.asdict(DecodeOptions())
    if (DecodeOptions().beam_size, DecodeOptions().alpha) != (
        PAPER_BEAM_SIZE,
        PAPER_ALPHA,
    ):
        pytest.skip(
            "the pinned translations are the paper's search's, not the default's"
        )
    hypotheses = (REFERENCE / f"test_2016_flickr.{pair}.beam4.txt").read_text()
    references = [t for _, t in load_pairs(record["split"], pair)]
    assert score(hypotheses.splitlines(), references) == stored
    assert "version:2.6.0" in stored.bleu_signature


@pytest.mark.parametrize("name", STORED)
def test_each_stored_evaluation_names_the_weights_and_search_it_scored(name):
    """Each stored record is `evaluate --json`'s of the shipped folder's weights (or of its
    last/), on the whole test split, with the search its name says; the results chapter
    re-runs each and asserts that it gives the same record."""
    pair, weights = STORED[name]
    stored, record = stored_scores(name)
    folder = CHECKPOINTS_DIR / pair / weights
    assert record["model_sha256"] == model_digest(folder)
    assert (record["pair"], record["split"], stored.sentences) == (
        pair,
        "test_2016_flickr",
        1000,
    )
    defaults = dataclasses.asdict(DecodeOptions())
    greedy = defaults | {"beam_size": 1}
    assert record["options"] == (greedy if name.endswith(".greedy") else defaults)


def test_bleu_by_length_refuses_bad_input():
    with pytest.raises(ValueError, match="2 sources, 1 translations and 1 references"):
        bleu_by_length(["a", "b"], ["a"], ["a"])
    for bounds in ((), (10, 5), (1, 1, 5), (-1, 5)):
        with pytest.raises(ValueError, match="bounds"):
            bleu_by_length(["a"], ["a"], ["a"], bounds=bounds)


# -- translate_split --------------------------------------------------------------------------


def test_translate_split_translates_the_sources_in_order(loaded, data_dir):
    model, tokenizer = loaded
    result = translate_split(
        model, tokenizer, "de-en", data_dir=data_dir, beam_size=2, batch_size=2
    )
    assert (result.pair, result.split) == ("de-en", "test_2016_flickr")
    assert result.sources == GERMAN and result.references == ENGLISH
    assert result.hypotheses == translate(model, tokenizer, GERMAN, beam_size=2)
    assert result.seconds > 0 and result.sentences_per_second > 0
    val = translate_split(model, tokenizer, "de-en", "val", data_dir=data_dir, limit=2)
    assert val.sources == GERMAN[:2] and len(val.hypotheses) == 2
    with pytest.raises(ValueError, match="translates de-en, not fr-en"):
        translate_split(model, tokenizer, "fr-en", data_dir=data_dir)
    with pytest.raises(ValueError, match="limit"):
        translate_split(model, tokenizer, "de-en", data_dir=data_dir, limit=0)


# -- the command ------------------------------------------------------------------------------


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """`python -m transformer evaluate ARGV`: (status, stdout, stderr)."""
    capsys.readouterr()
    status = package_main(["evaluate", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def evaluate_args(shipped: Path, data_dir: Path, *more: str) -> list[str]:
    return [
        "--pair",
        "de-en",
        "--checkpoint",
        str(shipped),
        "--data-dir",
        str(data_dir),
        "--device",
        "cpu",
        *more,
    ]


def patch_everywhere(monkeypatch, name: str, value) -> None:
    """Replace `name` in every module that holds it (the library's and the command's)."""
    for module in (translation, splits, evaluate_module):
        if hasattr(module, name):
            monkeypatch.setattr(module, name, value)


def test_the_command_prints_scores_signatures_and_time(
    shipped, loaded, data_dir, tmp_path, capsys
):
    output = tmp_path / "translations.txt"
    status, out, err = run(
        evaluate_args(shipped, data_dir, "--beam", "1", "--output", str(output)), capsys
    )
    assert status == 0, err
    model, tokenizer = loaded
    hypotheses = translate(model, tokenizer, GERMAN, beam_size=1)
    expected = score(hypotheses, ENGLISH)
    lines = out.splitlines()
    assert lines[0] == (f"de-en test_2016_flickr: 6 sentences, greedy, model {shipped}")
    assert f"sacreBLEU {expected.bleu:6.2f}  {expected.bleu_signature}" in lines
    assert f"chrF      {expected.chrf:6.2f}  {expected.chrf_signature}" in lines
    assert (
        f"{LC_TOK_BLEU}, only to compare with published Multi30k results: "
        f"{expected.bleu_lc_tok:.2f}  {expected.bleu_lc_tok_signature}"
    ) in lines
    assert any(
        line.startswith("translated in ") and "sentences/s" in line for line in lines
    )
    # The translations, one per line, and no temporary file left behind.
    assert output.read_text(encoding="utf-8") == "".join(f"{h}\n" for h in hypotheses)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["translations.txt"]


def test_json_writes_the_scores_with_the_options_and_the_models_digest(
    shipped, loaded, data_dir, tmp_path, capsys
):
    """--json writes the run as data, atomically: the results chapter's scores_record of
    the scores that the command prints, the options that made them and the SHA-256 of the
    model folder's files."""
    path = tmp_path / "scores.json"
    argv = evaluate_args(shipped, data_dir, "--beam", "1", "--json", str(path))
    status, out, err = run(argv, capsys)
    assert status == 0, err
    model, tokenizer = loaded
    expected = score(translate(model, tokenizer, GERMAN, beam_size=1), ENGLISH)
    options = dataclasses.asdict(DecodeOptions(beam_size=1))
    assert json.loads(path.read_text(encoding="utf-8")) == scores_record(
        expected,
        pair="de-en",
        split="test_2016_flickr",
        options=options,
        model=model_digest(shipped),
    )
    assert out.splitlines()[-1] == f"scores written to {path}"
    assert [p.name for p in tmp_path.iterdir()] == ["scores.json"]  # no temporary


def test_the_models_digest_is_of_its_files(shipped, tmp_path):
    """model_digest changes with any file that load_model reads, and with nothing else."""
    copy = shutil.copytree(shipped, tmp_path / "copy")
    assert model_digest(copy) == model_digest(shipped)
    (copy / "notes.txt").write_text("not read by load_model")
    assert model_digest(copy) == model_digest(shipped)
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        changed = shutil.copytree(shipped, tmp_path / name)
        target = (
            next(changed.glob("model*.safetensors"))
            if "model" in name
            else changed / name
        )
        target.write_bytes(target.read_bytes() + b" ")
        assert model_digest(changed) != model_digest(shipped), name


def test_the_command_reads_the_split_beam_alpha_and_limit(
    shipped, loaded, data_dir, tmp_path, capsys
):
    output = tmp_path / "translations.txt"
    status, out, _ = run(
        evaluate_args(
            shipped,
            data_dir,
            "--split",
            "val",
            "--beam",
            "3",
            "--alpha",
            "2",
            "--limit",
            "2",
            "--output",
            str(output),
        ),
        capsys,
    )
    assert status == 0
    assert out.splitlines()[0].startswith("de-en val: 2 sentences, beam 3, α 2, model ")
    # The translations are those of the search the options ask for, not only the header's:
    # for the tiny model, α = 2 translates the first two validation sentences otherwise.
    model, tokenizer = loaded
    asked = translate(model, tokenizer, GERMAN[:2], beam_size=3, alpha=2.0)
    assert asked != translate(model, tokenizer, GERMAN[:2], beam_size=3)
    assert output.read_text(encoding="utf-8") == "".join(f"{h}\n" for h in asked)


def test_the_default_model_is_checkpoints_pair(
    shipped, data_dir, tmp_path, capsys, monkeypatch
):
    shutil.copytree(shipped, tmp_path / "checkpoints" / "de-en")
    patch_everywhere(monkeypatch, "CHECKPOINTS_DIR", tmp_path / "checkpoints")
    argv = ["--pair", "de-en", "--data-dir", str(data_dir), "--limit", "2"]
    status, out, _ = run(argv, capsys)
    assert status == 0
    assert "model the shipped model, checkpoints/de-en" in out.splitlines()[0]


def assert_error(status: int, out: str, err: str, *needles: str) -> None:
    assert status == 2, err
    assert out == "", out
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("python -m transformer evaluate: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


@pytest.mark.parametrize(
    "more, needle",
    [
        (["--pair", "en-de"], "unknown language pair 'en-de'"),
        (["--split", "test_2017"], "unknown split 'test_2017'"),
        (["--beam", "0"], "--beam must be at least 1, got 0"),
        (["--beam", "four"], "--beam"),
        (["--alpha", "-1"], "--alpha must be >= 0"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--device", "tpu"], "--device"),
        (["--no-such-option"], "--no-such-option"),
    ],
)
def test_bad_options(more, needle, shipped, data_dir, capsys):
    status, out, err = run(evaluate_args(shipped, data_dir, *more), capsys)
    assert_error(status, out, err, needle)


def test_an_alpha_whose_penalty_overflows_within_the_models_positions_is_one_line(
    data_dir, tmp_path, capsys
):
    long = ship(tmp_path / "de-en", tiny_tokenizer(), max_len=50_000)
    status, out, err = run(evaluate_args(long, data_dir, "--alpha", "10"), capsys)
    assert_error(status, out, err, "makes the length penalty overflow")


def test_no_pair_is_an_error(capsys):
    status, out, err = run([], capsys)
    assert_error(status, out, err, "--pair")


def test_a_missing_model_folder_is_named(data_dir, tmp_path, capsys):
    nowhere = tmp_path / "nowhere"
    status, out, err = run(evaluate_args(nowhere, data_dir), capsys)
    assert_error(status, out, err, f"no model folder {nowhere}")


def test_no_shipped_model_says_how_to_train_one(
    data_dir, tmp_path, capsys, monkeypatch
):
    patch_everywhere(monkeypatch, "CHECKPOINTS_DIR", tmp_path / "checkpoints")
    status, out, err = run(["--pair", "fr-en", "--data-dir", str(data_dir)], capsys)
    assert_error(
        status,
        out,
        err,
        str(tmp_path / "checkpoints" / "fr-en"),
        "python -m transformer train --pair fr-en",
    )


@pytest.mark.parametrize("damage", ["corrupt weights", "missing weights", "not json"])
def test_an_unusable_model_folder_is_named(shipped, data_dir, tmp_path, capsys, damage):
    folder = tmp_path / "broken"
    shutil.copytree(shipped, folder)
    weights = sorted(folder.glob("model-*.safetensors"))
    if damage == "corrupt weights":
        weights[0].write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not a header")
    elif damage == "missing weights":
        weights[0].unlink()
    else:
        (folder / "config.json").write_text("{")
    status, out, err = run(evaluate_args(folder, data_dir), capsys)
    assert_error(status, out, err, "cannot load the model", str(folder))


def test_a_model_of_the_other_pair(shipped, data_dir, capsys):
    argv = evaluate_args(shipped, data_dir)
    argv[argv.index("de-en")] = "fr-en"
    status, out, err = run(argv, capsys)
    assert_error(status, out, err, f"{shipped} holds a de-en model, not a fr-en one")


def test_missing_and_corrupt_data_files_are_named(shipped, data_dir, tmp_path, capsys):
    broken = tmp_path / "data"
    shutil.copytree(data_dir, broken)
    (broken / "test_2016_flickr.en.gz").unlink()
    status, out, err = run(evaluate_args(shipped, broken), capsys)
    assert_error(
        status, out, err, f"missing data file {broken / 'test_2016_flickr.en.gz'}"
    )
    (broken / "test_2016_flickr.de.gz").write_bytes(b"not gzip")
    status, out, err = run(evaluate_args(shipped, broken), capsys)
    assert_error(status, out, err, "corrupt", str(broken / "test_2016_flickr.de.gz"))
    nowhere = tmp_path / "no-data"
    status, out, err = run(evaluate_args(shipped, nowhere), capsys)
    assert_error(status, out, err, str(nowhere / "SHA256SUMS"))
    # A file that SHA256SUMS does not list.
    argv = evaluate_args(shipped, data_dir, "--split", "train")
    status, out, err = run(argv, capsys)
    assert_error(status, out, err, "train.de.gz")


def test_an_output_that_cannot_be_written_is_named(shipped, data_dir, tmp_path, capsys):
    target = tmp_path / "no-such-folder" / "out.txt"
    status, out, err = run(
        evaluate_args(shipped, data_dir, "--output", str(target)), capsys
    )
    assert_error(status, out, err, f"cannot write {target}")


def test_a_json_file_that_cannot_be_written_is_named_before_translating(
    shipped, data_dir, tmp_path, capsys, monkeypatch
):
    def never(*args, **kwargs):
        raise AssertionError("translated although the file cannot be written")

    patch_everywhere(monkeypatch, "translate_split", never)
    target = tmp_path / "no-such-folder" / "scores.json"
    for path, problem in ((target, "no folder"), (tmp_path, "it is a folder")):
        status, out, err = run(
            evaluate_args(shipped, data_dir, "--json", str(path)), capsys
        )
        assert_error(status, out, err, f"cannot write {path}: {problem}")


def test_an_output_that_is_a_folder_is_refused_before_translating(
    shipped, data_dir, tmp_path, capsys, monkeypatch
):
    def never(*args, **kwargs):
        raise AssertionError("translated although the output cannot be written")

    patch_everywhere(monkeypatch, "translate_split", never)
    status, out, err = run(
        evaluate_args(shipped, data_dir, "--output", str(tmp_path)), capsys
    )
    assert_error(status, out, err, f"cannot write {tmp_path}: it is a folder")


@pytest.mark.parametrize("failure", ["rename", "encoding"])
def test_a_failed_write_keeps_the_old_translations_and_leaves_no_temporary(
    tmp_path, monkeypatch, failure
):
    """--output is written atomically: whether the rename fails (a full or read-only disk) or
    the text cannot be encoded (a lone surrogate), the previous file is intact, byte for byte,
    and no temporary file is left beside it."""
    path = tmp_path / "translations.txt"
    write_lines(path, ["Ein Hund.", "Zwei Katzen."])
    before = path.read_bytes()
    lines = ["A dog.", "Two cats."]
    with monkeypatch.context() as m:
        if failure == "rename":

            def fail(*args, **kwargs):
                raise OSError(28, "No space left on device")

            m.setattr(os, "replace", fail)
        else:
            lines[1] = "Two \ud800 cats."
        with pytest.raises((OSError, UnicodeEncodeError)):
            write_lines(path, lines)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["translations.txt"]


def test_without_spacy_a_clear_error(shipped, data_dir, capsys, monkeypatch):
    def no_spacy(language: str):
        raise ImportError(
            "tokenising text needs spaCy: pip install 'transformer[data]'"
        )

    monkeypatch.setattr(tokenizer_module, "spacy_tokenizer", no_spacy)
    status, out, err = run(evaluate_args(shipped, data_dir, "--limit", "1"), capsys)
    assert_error(status, out, err, "needs spaCy")


def test_the_package_command_and_its_help():
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, transformer.evaluate; "
            "print(sorted(m for m in ('altair', 'pandas', 'IPython') if m in sys.modules))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stderr
    done = subprocess.run(
        [sys.executable, "-m", "transformer", "evaluate", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert text.startswith("usage: python -m transformer evaluate")
    listed = subprocess.run(
        [sys.executable, "-m", "transformer", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "evaluate     score a trained model with sacreBLEU and chrF" in listed.stdout
    for documented in (
        "--pair",
        "--split NAME",
        "--beam N",
        "--alpha A",
        "--checkpoint DIR",
        "--data-dir DIR",
        "--output FILE",
        "sacreBLEU",
        "chrF",
        "exit with status 2",
    ):
        assert documented in text, documented
