"""The scripts in tools/ explain themselves (`--help` prints each one's whole docstring), refuse
a bad input with one line and status 2, and leave no half-written file."""

import argparse
import ast
import importlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import jupytext
import nbformat
import pytest

from transformer.data import DataError

TOOLS = sorted((Path(__file__).resolve().parent.parent / "tools").glob("*.py"))
SCRIPTS = [p for p in TOOLS if "argparse" in p.read_text(encoding="utf-8")]


def test_every_script_with_options_is_covered():
    assert {p.name for p in SCRIPTS} >= {
        "average_windows.py",
        "gpu_bench.py",
        "gpu_sweep.py",
        "model_card.py",
        "word_level_report.py",
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_prints_the_whole_docstring(script: Path):
    """Not cut after the first paragraph, and with its example commands as written (a
    backslash at a line's end continues a shell command; it must not vanish)."""
    source = script.read_text(encoding="utf-8")
    assert ast.get_docstring(ast.parse(source)), f"{script.name} has no docstring"
    doc = source.split('"""')[1]  # as written, before Python reads its escapes
    shown = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=script.parent.parent,
    ).stdout
    for line in doc.strip().splitlines():
        assert line.rstrip() in shown, line


# The scripts' own behaviour: each is imported as a module, with tools/ on the path as when it
# runs, and its main() called with sys.argv set, in this process (CPU only, no subprocess).


@pytest.fixture
def tool(monkeypatch):
    """Imports a script of tools/ by its name."""
    monkeypatch.syspath_prepend(str(TOOLS[0].parent))
    return importlib.import_module


def run_main(module, argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """The exit status of `module.main()` with `argv`, and what it wrote on standard error."""
    monkeypatch.setattr(sys, "argv", [f"{module.__name__}.py", *argv])
    try:
        status = module.main()
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err


def assert_one_line_error(status: int, err: str, *named: str) -> None:
    assert status == 2, err
    assert err.count("\n") == 1 and "error: " in err and "Traceback" not in err, err
    for text in named:
        assert text in err, err


def never(*args, **kwargs):
    raise AssertionError("reached past the checks of the input")


def test_gpu_sweep_refuses_the_runs_of_an_earlier_sweep(
    tmp_path: Path, tool, monkeypatch, capsys
):
    """`train` would refuse a run's folder that holds an earlier run and exit, and the sweep
    would then score and export the old run as new: it refuses before launching anything."""
    gpu_sweep = tool("gpu_sweep")
    monkeypatch.setattr(gpu_sweep, "launch", never)
    runs, out = tmp_path / "runs", tmp_path / "packed"
    (runs / "de-en-tiny").mkdir(parents=True)
    (runs / "de-en-tiny-ls0").mkdir()
    argv = ["smoke", "--runs", str(runs), "--out", str(out), "--minutes", "1"]
    status, err = run_main(gpu_sweep, argv, monkeypatch, capsys)
    assert_one_line_error(
        status, err, str(runs / "de-en-tiny") + ",", str(runs / "de-en-tiny-ls0")
    )
    assert not out.exists()


def test_gpu_sweep_replaces_every_piece_of_an_earlier_export(
    tmp_path: Path, tool, monkeypatch
):
    """A tar larger than a piece is cut into pieces that `cat` joins; a later, smaller export
    leaves no piece of the earlier one beside it, and no temporary file anywhere."""
    gpu_sweep = tool("gpu_sweep")
    monkeypatch.setattr(gpu_sweep, "PIECE", 10)
    tar = tmp_path / "de-en.tar"
    gpu_sweep.write_tar(tar, bytes(range(25)))
    pieces = sorted(tmp_path.iterdir())
    assert [p.name for p in pieces] == ["de-en.tar.aa", "de-en.tar.ab", "de-en.tar.ac"]
    assert b"".join(p.read_bytes() for p in pieces) == bytes(range(25))
    gpu_sweep.write_tar(tar, b"0123456789ab")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "de-en.tar.aa",
        "de-en.tar.ab",
    ]
    gpu_sweep.write_tar(tar, b"small")
    assert [p.name for p in tmp_path.iterdir()] == ["de-en.tar"]
    assert tar.read_bytes() == b"small"
    assert gpu_sweep.letters(27) == "bb"  # as split names the 28th piece


def test_gpu_sweep_packs_each_runs_own_logs_only(tmp_path: Path, tool):
    """runs.tar.gz keeps de-en-d3's logs and files, not those of de-en-d3-ff1024, whose name
    starts with de-en-d3."""
    gpu_sweep = tool("gpu_sweep")
    runs = tmp_path / "runs"
    (runs / "de-en-d3").mkdir(parents=True)
    for name in (
        "de-en-d3.stdout",
        "de-en-d3.close.stdout",
        "de-en-d3-ff1024.stdout",
        "de-en-d3/metrics.jsonl",
        "de-en-d3/model.safetensors",
    ):
        (runs / name).write_text("x\n")
    args = argparse.Namespace(runs=str(runs))
    kept = gpu_sweep.run_files({"de-en-d3": ("de-en", [], True)}, args)
    assert [name for _, name in kept] == [
        "de-en-d3.stdout",
        "de-en-d3.close.stdout",
        "de-en-d3/metrics.jsonl",
    ]
    with tarfile.open(fileobj=io.BytesIO(gpu_sweep.tar_bytes(kept, "w:gz"))) as t:
        assert t.getnames() == [name for _, name in kept]


def test_gpu_bench_refuses_a_variant_it_does_not_have(tool, monkeypatch, capsys):
    """A misspelt --only name is an error naming it, not a run of nothing with status 0."""
    gpu_bench = tool("gpu_bench")
    monkeypatch.setattr(gpu_bench, "measure", never)
    argv = ["--only", "recipe bf16", "recipe fp23"]
    status, err = run_main(gpu_bench, argv, monkeypatch, capsys)
    assert status == 2 and "invalid choice: 'recipe fp23'" in err, err


def test_nb_writes_a_chapter_and_its_twin_whole_or_not_at_all(
    tmp_path: Path, tool, monkeypatch
):
    """The bytes of nbformat's and jupytext's own writers; interrupted before the rename, the
    chapter is left as it was and nothing beside it."""
    nb = tool("nb")
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# A chapter"),
            nbformat.v4.new_code_cell("x = 1\nx"),
        ]
    )
    expected = tmp_path / "expected"
    expected.mkdir()
    nbformat.write(notebook, expected / "01_x.ipynb")
    jupytext.write(notebook, expected / "01_x.py", fmt="py:percent")
    path = tmp_path / "01_x.ipynb"
    nb._write_pair(path, notebook)
    for name in ("01_x.ipynb", "01_x.py"):
        assert (tmp_path / name).read_bytes() == (expected / name).read_bytes()
    before = path.read_bytes()
    notebook.cells.append(nbformat.v4.new_code_cell("y = 2"))

    def interrupted(fd: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(nb.os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nb._write_pair(path, notebook)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "01_x.ipynb",
        "01_x.py",
        "expected",
    ]


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """A tiny shipped model as gpu_sweep exports it: no comparison/, and no last/ yet."""
    from helpers import ship, tiny_tokenizer

    return ship(tmp_path / "de-en", tiny_tokenizer())


def test_model_card_checks_the_folder_before_translating(
    shipped: Path, tool, monkeypatch, capsys
):
    """A folder without last/, or without an average in its metrics, is one line and status
    2, before the two translations of the test split."""
    model_card = tool("model_card")
    monkeypatch.setattr(model_card, "CHECKPOINTS_DIR", shipped.parent)
    monkeypatch.setattr(model_card, "translate_split", never)
    argv = ["de-en", "--command", "c", "--hardware", "h"]
    status, err = run_main(model_card, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, str(shipped / "last"))
    shutil.copytree(shipped, shipped / "last", ignore=lambda *_: ["last"])
    status, err = run_main(model_card, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, "no epoch or no average record")
    assert not (shipped / "README.md").exists()


def test_model_card_of_a_folder_without_comparison_runs(
    shipped: Path, tool, monkeypatch
):
    """gpu_sweep's exports have no comparison/: the card says nothing of it."""
    from helpers import ENGLISH, GERMAN

    model_card = tool("model_card")
    assert model_card.comparison_runs(shipped) == []
    shutil.copytree(shipped, shipped / "last", ignore=lambda *_: ["last"])
    epoch = dict(kind="epoch", step=10, wall_time=60.0, tokens_per_s=100.0, mfu=None)
    average = dict(
        kind="average", val_ppl_word=9.0, val_ppl_token=5.0, val_accuracy=0.5
    )
    (shipped / "metrics.jsonl").write_text(
        f"{json.dumps(epoch)}\n{json.dumps(average)}\n"
    )

    def translate_split(model, tokenizer, pair, split):
        return SimpleNamespace(hypotheses=ENGLISH, references=ENGLISH)

    monkeypatch.setattr(model_card, "translate_split", translate_split)
    monkeypatch.setattr(
        model_card, "load_pairs", lambda *_: list(zip(GERMAN, ENGLISH, strict=True))
    )
    text = model_card.card("de-en", "c", "h", shipped)
    assert "comparison/" not in text
    assert "(for the results chapter's ablation).\n" in text
    (shipped / "comparison" / "dropout-0.2-cpu").mkdir(parents=True)
    assert model_card.comparison_runs(shipped) == ["dropout-0.2-cpu"]
    text = model_card.card("de-en", "c", "h", shipped)
    assert (
        "tried (`dropout-0.2-cpu`; the\nchapter on the book's models compares them).\n"
        in text
    )


@pytest.mark.parametrize(
    "error",
    [
        ImportError("tokenising text needs spaCy: pip install -e '.[data]'"),
        DataError("data/multi30k/val.de.gz is missing"),
    ],
    ids=["no spaCy", "no data"],
)
def test_word_level_report_names_what_is_missing(
    tmp_path: Path, tool, monkeypatch, capsys, error: Exception
):
    word_level_report = tool("word_level_report")

    def report(model_folder: Path, *, bleu: bool = False) -> dict:
        raise error

    monkeypatch.setattr(word_level_report, "report", report)
    (tmp_path / "metrics.jsonl").write_text("")
    argv = [str(tmp_path / "model"), str(tmp_path)]
    status, err = run_main(word_level_report, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, str(error))
    assert not (tmp_path / "word_level.json").exists()


def test_average_windows_wants_a_gpu_for_cuda_before_reading_a_checkpoint(
    tmp_path: Path, tool, monkeypatch, capsys
):
    average_windows = tool("average_windows")
    monkeypatch.setattr(average_windows, "report", never)
    monkeypatch.setattr(average_windows.torch.cuda, "is_available", lambda: False)
    (tmp_path / "metrics.jsonl").write_text("")
    argv = [str(tmp_path / "checkpoints"), str(tmp_path), "--device", "cuda"]
    status, err = run_main(average_windows, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, "--device cuda, but no CUDA GPU is available")
    argv[-1] = "gpu"
    status, err = run_main(average_windows, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, "--device 'gpu' is not a device")


def test_ensemble_report_scores_the_members_and_their_mean(
    tmp_path: Path, tool, monkeypatch, capsys
):
    from helpers import ENGLISH, GERMAN, ship, tiny_tokenizer

    ensemble_report = tool("ensemble_report")
    tokenizer = tiny_tokenizer()
    a = ship(tmp_path / "a" / "de-en", tokenizer, seed=0)
    b = ship(tmp_path / "b" / "de-en", tokenizer, seed=1)
    val = list(zip(GERMAN, ENGLISH, strict=True))
    monkeypatch.setattr(ensemble_report, "load_pairs", lambda *_: val)
    # An ensemble of a model with itself is that model.
    same = ensemble_report.report([a, a])
    alone = {k: v for k, v in same["members"][0].items() if k != "model"}
    assert same["ensemble"] == pytest.approx(alone)
    # The NLL of a mean probability is at most the mean of the members' NLLs (Jensen), and
    # below it where the members differ: the perplexity is below their geometric mean.
    two = ensemble_report.report([a, b])
    ppl_a, ppl_b = (m["ppl_word"] for m in two["members"])
    assert ppl_a != ppl_b
    assert two["ensemble"]["ppl_word"] < (ppl_a * ppl_b) ** 0.5
    assert two["pair"] == "de-en" and two["words"] == sum(
        len(s.split()) for s in ENGLISH
    )
    # The command: ensemble.json in the comparison folder, or one line and status 2.
    dest = tmp_path / "comparison"
    dest.mkdir()
    (dest / "metrics.jsonl").write_text("")
    argv = [str(a), str(b), "--dest", str(dest)]
    assert run_main(ensemble_report, argv, monkeypatch, capsys)[0] is None
    assert json.loads((dest / "ensemble.json").read_text()) == two
    status, err = run_main(
        ensemble_report, [str(a), "--dest", str(dest)], monkeypatch, capsys
    )
    assert_one_line_error(status, err, "two or more models")
    other = ship(tmp_path / "c" / "de-en", tiny_tokenizer(ENGLISH))
    status, err = run_main(
        ensemble_report, [str(a), str(other), "--dest", str(dest)], monkeypatch, capsys
    )
    assert_one_line_error(status, err, "do not share one vocabulary")
