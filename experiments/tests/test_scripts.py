"""The scripts of experiments/ explain themselves (`--help` prints each one's whole docstring),
refuse a bad input with one line and status 2, leave no half-written file, and validate and
export as the trainer does."""

import argparse
import ast
import contextlib
import dataclasses
import importlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

# On the path from tests/ (conftest.py): the training tests' tiny data and configuration.
from test_train import tiny_config, tiny_data

from transformer.checkpoint import CheckpointError
from transformer.epoch_data import TrainingData
from transformer.multi30k import PAIRS, DataError
from transformer.paper_search import ALPHA, BEAM_SIZE
from transformer.trainer import train

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(
    p
    for p in (ROOT / "experiments").glob("*.py")
    if "argparse" in p.read_text(encoding="utf-8")
)


def test_every_script_with_options_is_covered():
    assert {p.name for p in SCRIPTS} == {
        "average_windows.py",
        "decode_bench.py",
        "ensemble_report.py",
        "gemm_backends.py",
        "gpu_bench.py",
        "gpu_call.py",
        "gpu_sweep.py",
        "model_card.py",
        "train_bench.py",
        "translator_bench.py",
        "word_level_report.py",
        "cli_latency.py",
        "knockout_importance.py",
        "compiled_step.py",
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_help_prints_the_whole_docstring(script: Path):
    """Not cut after the first paragraph, and with its example commands as written (a
    backslash at a line's end continues a shell command; it must not vanish)."""
    source = script.read_text(encoding="utf-8")
    assert ast.get_docstring(ast.parse(source)), f"{script.name} has no docstring"
    doc = source.split('"""')[1]  # as written, before Python reads its escapes
    assert f"python -m experiments.{script.stem}" in doc  # how it runs
    shown = subprocess.run(
        [sys.executable, "-m", f"experiments.{script.stem}", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    for line in doc.strip().splitlines():
        assert line.rstrip() in shown, line


# The scripts' own behaviour: each is imported as a module of the experiments package, and its
# main() called with sys.argv set, in this process (CPU only, no subprocess).


@pytest.fixture
def tool():
    """Imports a script of experiments/ by its name."""
    return lambda name: importlib.import_module(f"experiments.{name}")


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


def test_gpu_bench_records_a_variant_that_fails_and_goes_on(
    tmp_path: Path, tool, monkeypatch, capsys
):
    """A variant that fails (torch.compile without a C compiler, say) gets its error as its
    row, and the next variant is measured; OUT names the card and both rates."""
    gpu_bench = tool("gpu_bench")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a card")
    monkeypatch.setattr(gpu_bench, "measured_peak", lambda dtype: 7e14)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(gpu_bench, "default_precision", lambda device: "bf16")

    def measure(name, fields, cache_dir, pair):
        if name == "recipe-25k bf16":
            raise RuntimeError("Failed to find C compiler\nmore")
        row = dict(variant=name, tokens_per_s=1.0, mfu=0.5, updates_per_epoch=2)
        return row | dict(run_seconds=3.0)

    monkeypatch.setattr(gpu_bench, "measure", measure)
    out = tmp_path / "bench.json"
    argv = ["--out", str(out), "--only", "base-25k bf16", "recipe-25k bf16"]
    assert run_main(gpu_bench, argv, monkeypatch, capsys)[0] == 0
    result = json.loads(out.read_text())
    assert result["device"] == "a card" and result["measured_bf16_flops"] == 7e14
    assert result["measured_fp16_flops"] == 7e14
    assert (result["capability"], result["default_precision"]) == ("9.0", "bf16")
    assert result["rows"][0] == {
        "variant": "recipe-25k bf16",
        "error": "RuntimeError: Failed to find C compiler",
    }
    assert result["rows"][1]["variant"] == "base-25k bf16"
    assert result["rows"][1]["device"] == "a card"


@pytest.fixture
def shipped(tmp_path: Path) -> Path:
    """A tiny shipped model as gpu_sweep exports it: no last/ yet."""
    from helpers import ship, tiny_tokenizer

    return ship(tmp_path / "de-en", tiny_tokenizer())


def store_scores(folder: Path, scores: Path, name: str, options=None) -> dict:
    """`evaluate --json`'s record of a perfect translation of the tiny test split by the
    model in `folder`, stored as scores/<name>.json."""
    from helpers import ENGLISH

    from transformer.cli.evaluate import model_digest
    from transformer.decode_options import DecodeOptions
    from transformer.evaluate import score, scores_record

    record = scores_record(
        score(ENGLISH, ENGLISH),
        pair="de-en",
        split="test_2016_flickr",
        options=dataclasses.asdict(options or DecodeOptions()),
        model=model_digest(folder),
    )
    scores.mkdir(exist_ok=True)
    (scores / f"{name}.json").write_text(json.dumps(record), encoding="utf-8")
    return record


def test_model_card_checks_the_folder_and_its_scores_first(
    shipped: Path, tool, monkeypatch, capsys
):
    """A folder without last/, without an average in its metrics, or without stored scores
    of both its weights is one line and status 2, before the validation split is scored."""
    model_card = tool("model_card")
    monkeypatch.setattr(model_card, "CHECKPOINTS_DIR", shipped.parent)
    monkeypatch.setattr(model_card, "word_level_evaluation", never)
    scores = shipped.parent / "scores"
    monkeypatch.setattr(model_card, "STORED_SCORES", scores)
    argv = ["de-en", "--command", "c", "--hardware", "h"]
    status, err = run_main(model_card, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, str(shipped / "last"))
    shutil.copytree(shipped, shipped / "last", ignore=lambda *_: ["last"])
    status, err = run_main(model_card, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, "no epoch or no average record")
    (shipped / "metrics.jsonl").write_text(
        '{"kind": "epoch", "step": 1, "wall_time": 1.0, "tokens_per_s": 1.0}\n'
        '{"kind": "average"}\n'
    )
    status, err = run_main(model_card, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, f"no {scores / 'de-en.json'}", "--json")
    store_scores(shipped, scores, "de-en")
    record = store_scores(shipped / "last", scores, "de-en.last")
    record["model_sha256"] = "0" * 64  # the scores of other weights
    (scores / "de-en.last.json").write_text(json.dumps(record), encoding="utf-8")
    status, err = run_main(model_card, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, "de-en.last.json scores other weights")
    assert not (shipped / "README.md").exists()


@pytest.fixture
def model_card(shipped: Path, tool, monkeypatch):
    """model_card with a complete tiny folder (last/, an epoch and an average) and a test
    split translated perfectly, so a card is written in seconds."""
    from helpers import ENGLISH, GERMAN

    model_card = tool("model_card")
    shutil.copytree(shipped, shipped / "last", ignore=lambda *_: ["last"])
    epoch = dict(kind="epoch", step=10, wall_time=60.0, tokens_per_s=100.0, mfu=None)
    average = dict(
        kind="average", val_ppl_word=9.0, val_ppl_token=5.0, val_accuracy=0.5
    )
    (shipped / "metrics.jsonl").write_text(
        f"{json.dumps(epoch)}\n{json.dumps(average)}\n"
    )

    scores = shipped.parent / "scores"
    store_scores(shipped, scores, "de-en")
    store_scores(shipped / "last", scores, "de-en.last")
    monkeypatch.setattr(model_card, "STORED_SCORES", scores)
    monkeypatch.setattr(
        model_card, "load_pairs", lambda *_: list(zip(GERMAN, ENGLISH, strict=True))
    )
    return model_card


def test_model_card_states_measurements_not_targets(
    model_card, shipped: Path, tmp_path: Path
):
    """The status line says what the model is and its test score; the card holds the
    measurements and judges none of them against a target (issue 30)."""
    text = model_card.card("de-en", "c", "h", shipped, tmp_path / "runs")
    assert (
        "**Status:** trained with the book's recipe on a CPU, 1 epoch\nin 1.0 minutes; "
        f"100.0 sacreBLEU on test_2016_flickr (beam {BEAM_SIZE}, α {ALPHA:g}).\n"
        in text
    )
    assert "perplexity per word 9.00, per token 5.00, token\naccuracy 50.0%. " in text
    judged = re.compile(r"\btargets?\b(?! tokens)|\bmet\b", re.IGNORECASE)
    assert not judged.findall(text)
    for pair in PAIRS:  # and the shipped cards are written this way
        shipped_card = (model_card.CHECKPOINTS_DIR / pair / "README.md").read_text()
        assert "**Status:** trained with the book's recipe on one GPU" in shipped_card
        assert not judged.findall(shipped_card), pair


def test_model_card_names_the_comparison_runs_where_there_are_any(
    model_card, shipped: Path, tmp_path: Path
):
    """A pair without runs in experiments/runs (gpu_sweep's exports are scored alone): the
    card says nothing of them; with runs, it names them and where they are."""
    runs = tmp_path / "runs"
    assert model_card.comparison_runs("de-en", runs) == []
    text = model_card.card("de-en", "c", "h", shipped, runs)
    assert "experiments/runs" not in text
    assert "(for the results chapter's ablation).\n" in text
    (runs / "de-en" / "dropout-0.2-cpu").mkdir(parents=True)
    assert model_card.comparison_runs("de-en", runs) == ["dropout-0.2-cpu"]
    text = model_card.card("de-en", "c", "h", shipped, runs)
    assert (
        "tried (`dropout-0.2-cpu`) are in the\nrepository's `experiments/runs/de-en/`; "
        "the experiments appendix compares them.\n" in text
    )
    # the shipped cards name the runs this repository keeps
    for pair in PAIRS:
        shipped_card = (model_card.CHECKPOINTS_DIR / pair / "README.md").read_text()
        names = ", ".join(f"`{c}`" for c in model_card.comparison_runs(pair))
        assert (
            f"tried ({names}) are in the\nrepository's `experiments/runs/{pair}/`"
            in (shipped_card)
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


# Trained in the test: the training tests' tiny model on random ids, no spaCy, no cache.


@pytest.fixture(scope="module")
def data() -> TrainingData:
    return tiny_data()


def test_gpu_sweep_exports_again_over_its_own_folder(tmp_path: Path, tool, data):
    """gpu_sweep exports the best run into runs/export/<pair> and its last epoch into last/
    there, beside a RUN file: a second sweep starts that folder afresh."""
    gpu_sweep = tool("gpu_sweep")
    runs = tmp_path / "runs"
    train(tiny_config(runs / "tiny", epochs=2), data=data, echo=False)
    row = dict(name="tiny", pair="de-en", candidate=True, avg_ppl_word=1.0, epochs=2)
    args = argparse.Namespace(runs=str(runs), out=str(tmp_path / "packed"))
    args.choose_by, args.shipped = "ppl", None
    (tmp_path / "packed").mkdir()
    for _ in range(2):
        with contextlib.redirect_stdout(io.StringIO()):
            gpu_sweep.export_best([row], args)
        export = runs / "export" / "de-en"
        assert (export / "RUN").read_text() == "tiny\n"
        assert json.loads((export / "config.json").read_text())["source"] == "average"
        last = json.loads((export / "last" / "config.json").read_text())
        assert last["source"] == "epoch-002"


def test_gpu_sweep_ships_a_run_only_when_it_beats_the_shipped_model(
    tmp_path: Path, tool, monkeypatch
):
    """Chosen by validation BLEU among the candidates, a pair's best run is exported only
    when it beats the shipped model's validation BLEU by the margin."""
    gpu_sweep = tool("gpu_sweep")
    rows = [
        dict(name="de-a", pair="de-en", candidate=True, avg_val_bleu=44.0),
        dict(name="de-b", pair="de-en", candidate=True, avg_val_bleu=45.0, epochs=7),
        dict(name="de-big", pair="de-en", candidate=False, avg_val_bleu=47.0),
        dict(name="fr-a", pair="fr-en", candidate=True, avg_val_bleu=56.2),
    ]
    shipped = {"de-en": 44.4, "fr-en": 56.0}
    monkeypatch.setattr(gpu_sweep, "val_bleu", lambda f, pair, c: shipped[pair])
    exported = []
    monkeypatch.setattr(
        "transformer.checkpoint.export_model", lambda run, dest: exported.append(run)
    )
    monkeypatch.setattr(gpu_sweep, "write_tar", lambda *a: None)
    monkeypatch.setattr(gpu_sweep, "tar_bytes", lambda *a: b"")
    monkeypatch.setattr(gpu_sweep, "write_lines", lambda *a: None)
    args = argparse.Namespace(runs=str(tmp_path), out=str(tmp_path), cache_dir="c")
    args.choose_by, args.shipped, args.margin = "bleu", "checkpoints", 0.5
    with contextlib.redirect_stdout(io.StringIO()):
        decisions = gpu_sweep.export_best(rows, args)
    assert decisions["de-en"]["best"] == "de-b" and decisions["de-en"]["ship"]
    assert decisions["fr-en"] == {
        "best": "fr-a",
        "ship": False,  # 0.2 better: within the margin
        "shipped_val_bleu": 56.0,
        "best_val_bleu": 56.2,
        "margin": 0.5,
    }
    assert [run.name for run in exported] == ["de-b", "epoch-007"]
    assert gpu_sweep.best_run(rows, "de-en", "ppl") is None  # no perplexities scored


@pytest.mark.parametrize("phase", ["quality", "targets-long", "targets-batch"])
def test_gpu_sweep_asks_train_for_configurations_it_accepts(phase: str, tool):
    """Every run of the phases not yet run on a GPU parses and builds a valid TrainConfig,
    so that a misspelt option cannot cost a GPU call; the quality sweep's are its five."""
    from transformer.cli.train import config_from_args, train_parser

    gpu_sweep = tool("gpu_sweep")
    runs = gpu_sweep.PHASES[phase]
    for name, (pair, options, _) in runs.items():
        argv = gpu_sweep.train_command(pair)[3:] + gpu_sweep.RECIPE
        argv += ["--epochs", "400", "--time-limit", "6", *options, "--out", "x"]
        config = config_from_args(train_parser().parse_args(argv[1:]))
        assert config.pair == pair and config.time_limit == 6, name
    if phase == "quality":
        assert len(runs) == 10 and sum(r[0] == "de-en" for r in runs.values()) == 5
        d128 = config_from_args(
            train_parser().parse_args(
                ["--pair", "de-en", *gpu_sweep.RECIPE, *gpu_sweep.T6K, *gpu_sweep.D128]
            )
        )
        peak = d128.lr_factor * 128**-0.5 * d128.warmup**-0.5  # equation 3's peak
        assert peak == pytest.approx(5e-3, rel=0.01)


def test_gpu_sweep_refuses_a_shipped_folder_without_the_pair(
    tmp_path: Path, tool, monkeypatch, capsys
):
    gpu_sweep = tool("gpu_sweep")
    monkeypatch.setattr(gpu_sweep, "launch", never)
    (tmp_path / "shipped" / "de-en").mkdir(parents=True)
    argv = ["quality", "--minutes", "1", "--runs", str(tmp_path / "runs")]
    argv += ["--shipped", str(tmp_path / "shipped"), "--cache-dir", str(tmp_path)]
    status, err = run_main(gpu_sweep, argv, monkeypatch, capsys)
    assert_one_line_error(status, err, f"no shipped model {tmp_path / 'shipped'}/fr-en")


def test_average_windows_reproduce_the_trainers_own_records(tmp_path: Path, tool, data):
    """average_windows validates as the trainer does: its window of the last three epochs
    gives the run's `average` record, its last epoch alone the epoch's record; windows never
    cross a gap in the kept epochs."""
    average_windows = tool("average_windows")
    run = tmp_path / "run"
    result = train(tiny_config(run, epochs=3, average_last=3), data=data, echo=False)
    with contextlib.redirect_stdout(io.StringIO()):
        summary = average_windows.report(run / "checkpoints", 2, tmp_path, val=data.val)
    found = {(w["first"], w["last"]): w for w in summary["windows"]}
    assert sorted(found) == [(1, 2), (1, 3), (2, 3), (3, 3)]
    records = {r["kind"]: r for r in result.metrics}  # the last epoch's, the average's
    for window, kind in (((1, 3), "average"), ((3, 3), "epoch")):
        for key in ("val_loss", "val_ppl_word", "val_accuracy"):
            assert found[window][key] == pytest.approx(records[kind][key], rel=1e-9)
    assert found[(1, 3)]["val_ppl_word"] != found[(3, 3)]["val_ppl_word"]
    # epoch 4 missing: no window of two crosses it, and the last stretch is 5-6
    assert average_windows.windows([1, 2, 3, 5, 6], 2) == [
        (6, 6),
        (1, 2),
        (2, 3),
        (5, 6),
    ]
    assert (3, 12) in average_windows.windows(list(range(1, 13)), 5)  # the last ten
    with pytest.raises(CheckpointError, match="no 4 consecutive kept epochs"):
        average_windows.report(run / "checkpoints", 4, tmp_path, val=data.val)
    shutil.rmtree(run / "checkpoints" / "epoch-001")
    shutil.rmtree(run / "checkpoints" / "epoch-002")
    with pytest.raises(CheckpointError, match="fewer than two epoch checkpoints"):
        average_windows.epoch_folders(run / "checkpoints")


def test_gpu_sweep_keeps_the_windows_of_a_run_that_kept_more_than_five_epochs(
    tmp_path: Path, tool, data, monkeypatch
):
    """A sweep run with --average-last above 5 gets averages.json (every window of five of
    its kept epochs, and all of them: the run's own average) and its best five in the
    summary, once the cache's vocabulary is the run's; a run that kept five gets nothing."""
    gpu_sweep, average_windows = tool("gpu_sweep"), tool("average_windows")
    monkeypatch.setattr(average_windows, "load_encoded", lambda *args: data.val)
    run = tmp_path / "run"
    result = train(tiny_config(run, epochs=6, average_last=6), data=data, echo=False)
    (tmp_path / "de-en").mkdir()  # the cache's tokenizer, checked against the run's
    tiny_data(seed=1).tokenizer.save(tmp_path / "de-en" / "tokenizer.json")
    row = gpu_sweep.windows_of(run, str(tmp_path))
    assert "another vocabulary" in row["windows_error"]
    data.tokenizer.save(tmp_path / "de-en" / "tokenizer.json")
    row = gpu_sweep.windows_of(run, str(tmp_path))
    saved = json.loads((run / "averages.json").read_text())["windows"]
    ppl = {(w["first"], w["last"]): w["val_ppl_word"] for w in saved}
    fives = {w: p for w, p in ppl.items() if w[1] - w[0] == 4}
    assert sorted(fives) == [(1, 5), (2, 6)]
    assert row["best_five_ppl_word"] == min(fives.values())
    assert tuple(row["best_five"]) == min(fives, key=fives.get)
    average = [r for r in result.metrics if r["kind"] == "average"][-1]
    assert ppl[(1, 6)] == pytest.approx(average["val_ppl_word"], rel=1e-9)
    short = tmp_path / "short"
    train(tiny_config(short, epochs=2), data=data, echo=False)
    assert gpu_sweep.windows_of(short, str(tmp_path)) == {}
    assert not (short / "averages.json").exists()


def test_decode_bench_times_both_engines_on_the_same_sentences(tmp_path: Path, tool):
    pytest.importorskip("ctranslate2")
    out = tmp_path / "bench.json"
    argv = ["--sentences", "3", "--one-at-a-time", "2", "--repeats", "1"]
    argv += [
        "--batch-sizes",
        "2,1",
        "--engines",
        "package,ct2-float32",
        "--out",
        str(out),
    ]
    assert tool("decode_bench").main(argv) == 0
    result = json.loads(out.read_text())
    rows = {(r["engine"], r["decoding"], r["batch_size"]): r for r in result["rows"]}
    assert len(rows) == 2 * 2 * 2 and result["threads"] == 2
    for (engine, decoding, batch_size), row in rows.items():
        assert row["sentences"] == (3 if batch_size == 2 else 2)
        assert row["sentences_per_s"] > 0 and row["ratio"] > 0
        if engine == "ct2-float32":
            assert row["ratio"] == 1.0
        if decoding == "greedy":  # the engines' greedy translations are the same
            assert row["same_as_package"] == row["sentences"]


def test_the_fixed_shape_step_decodes_as_the_package(tool):
    """compiled_step's step of one shape, run eagerly, gives the package's greedy tokens."""
    module = tool("compiled_step")
    model, tok = module.load_pair_model("de-en")
    sources, _ = module.test_set(model, tok, "de-en", 6)
    specials = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
    src = torch.full((6, max(map(len, sources))), tok.pad_id)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids)
    package = module.batched_greedy_decode(model, src, **specials)
    found = module.fixed_greedy(model, module.fixed_step, src, 90, specials)
    assert found == [h.tokens for h in package]
    assert all(len(ids) > 3 for ids in found)


def test_decode_bench_runs_the_package_in_bfloat16(tmp_path: Path, tool):
    """Half precision is for GPUs; on the CPU it runs too, which is what this test needs."""
    pytest.importorskip("ctranslate2")
    out = tmp_path / "bench.json"
    argv = [
        "--sentences",
        "2",
        "--batch-sizes",
        "2",
        "--repeats",
        "1",
        "--out",
        str(out),
    ]
    argv += ["--engines", "package,package-bfloat16,ct2-float32"]
    assert tool("decode_bench").main(argv) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["baseline"] == "ct2-float32"
    engines = {r["engine"] for r in result["rows"]}
    assert engines == {"package", "package-bfloat16", "ct2-float32"}
    assert all(r["ratio"] > 0 and "same_as_package" in r for r in result["rows"])


def test_decode_bench_leaves_out_an_engine_that_cannot_start(
    tmp_path: Path, tool, monkeypatch
):
    """CTranslate2's wheel on a GPU machine without the CUDA libraries it was built for: the
    package's rows are kept, the engine is named with its reason, and the speeds are
    relative to the package's."""
    module = tool("decode_bench")

    def no_cublas(*args, **kwargs):
        raise RuntimeError("Library libcublas.so.12 is not found or cannot be loaded")

    monkeypatch.setattr(module, "CTranslate2Model", no_cublas)
    out = tmp_path / "bench.json"
    argv = ["--engines", "package,ct2-float32", "--baseline", "ct2-float32"]
    argv += ["--sentences", "2", "--batch-sizes", "2", "--repeats", "1"]
    argv += ["--out", str(out)]
    assert module.main(argv) == 0
    result = json.loads(out.read_text())
    assert result["unavailable"] == {
        "ct2-float32": "RuntimeError: Library libcublas.so.12 is not found or cannot be "
        "loaded"
    }
    assert result["baseline"] == "package"
    assert {r["engine"] for r in result["rows"]} == {"package"}
    assert all(r["ratio"] == 1.0 for r in result["rows"])


def test_decode_bench_reads_the_sources_from_an_encoded_cache(
    tmp_path: Path, tool, monkeypatch
):
    """With --cache-dir the ids come from the cache (no spaCy), whose vocabulary must be
    the model's."""
    module = tool("decode_bench")
    cache = tmp_path / "cache"
    (cache / "de-en").mkdir(parents=True)
    shipped = ROOT / "checkpoints" / "de-en" / "tokenizer.json"
    shutil.copy(shipped, cache / "de-en" / "tokenizer.json")
    asked = []

    def load_encoded(pair, split, folder):
        asked.append((pair, split, folder))
        return [([5, 6, 7], [8])] * 3

    monkeypatch.setattr(module, "load_encoded", load_encoded)
    monkeypatch.setattr(module, "normalize", never)  # no tokenising of the text
    out = tmp_path / "bench.json"
    argv = ["--sentences", "3", "--batch-sizes", "3", "--repeats", "1"]
    argv += ["--engines", "package", "--baseline", "package", "--out", str(out)]
    assert module.main([*argv, "--cache-dir", str(cache)]) == 0
    assert asked == [("de-en", "test_2016_flickr", cache)]
    assert json.loads(out.read_text())["sentences"] == 3

    (cache / "de-en" / "tokenizer.json").write_text("{}")  # another vocabulary
    with pytest.raises(SystemExit) as stop:
        module.main([*argv, "--cache-dir", str(cache)])
    assert stop.value.code == 2


@pytest.mark.parametrize(
    ("argv", "gpu", "named"),
    [
        (["--engines", "package,ct2-float64"], True, "unknown engine 'ct2-float64'"),
        (["--engines", "package", "--baseline", "ct2-float32"], True, "not among"),
        (["--device", "tpu"], True, "--device must be cpu or cuda"),
        (["--device", "cuda"], False, "PyTorch sees no GPU here"),
        (["--device", "cuda", "--profile"], True, "CPU only"),
    ],
)
def test_decode_bench_refuses_what_it_cannot_run(
    argv, gpu, named, tool, monkeypatch, capsys
):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    module = tool("decode_bench")
    monkeypatch.setattr(module, "load_pair_model", never)
    assert_one_line_error(*run_main(module, argv, monkeypatch, capsys), named)


def test_gemm_backends_names_the_library_each_engine_run_used(tmp_path: Path, tool):
    """The engine runs twice in fresh processes (the only subprocesses of these tests: the
    engine reads its choice of library once per process)."""
    pytest.importorskip("ctranslate2")
    out = tmp_path / "gemm.json"
    argv = ["--sentences", "3", "--rounds", "1", "--repeats", "2", "--out", str(out)]
    assert tool("gemm_backends").main(argv) == 0
    result = json.loads(out.read_text())
    libraries = {r["sgemm"]: r["library"] for r in result["engine"]}
    assert libraries["MKL forced"] == "MKL" and libraries["own choice"] != "unknown"
    assert all(len(r["seconds"]) == 1 and r["seconds"][0] > 0 for r in result["engine"])
    assert len(result["products"]) == 5 * 3  # five shapes, batches of 1, 4 and 32 rows
    assert {tuple(r["shape"]) for r in result["products"]} >= {(8000, 256), (768, 256)}
    assert all(r["mkl"] > 0 and r["onednn"] > 0 for r in result["products"])
    for row in result["package"]:  # the same products: the same translations
        assert row["same"] == 3 and row["mkl"][0] > 0 and row["onednn"][0] > 0


def test_train_bench_compares_stacks_of_the_same_size(tool):
    """Only the stacks differ: nn.Transformer adds a LayerNorm after each of its two stacks."""
    train_bench = tool("train_bench")
    ours, theirs = train_bench.package_model(100), train_bench.LibraryTransformer(100)
    count = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    assert count(theirs) - count(ours) == 2 * 2 * 256
    src, tgt = torch.randint(3, 100, (2, 5)), torch.randint(3, 100, (2, 4))
    assert theirs(src, tgt, pad_id=0).shape == (2, 4, 100)


def test_cli_latency_times_commands_and_writes_its_record(tmp_path: Path, tool):
    out = tmp_path / "latency.json"
    assert (
        tool("cli_latency").main(["--runs", "1", "--only", "help", "--out", str(out)])
        == 0
    )
    record = json.loads(out.read_text())
    assert record["runs"] == 1 and set(record["median_s"]) == {"help"}
    assert record["all_s"]["help"][0] > 0
    assert record["goals"]["help under 0.5 s"] in (True, False)
    assert record["goals"]["interactive second line under 0.3 s"] is None


def test_cli_latency_reads_each_answer_from_a_terminal(tool):
    """A program that answers each line as it comes: both lines are answered,
    each timed from its own typing."""
    echo = "import sys\nfor line in sys.stdin:\n    print(line.upper(), end='', flush=True)"
    seconds = tool("cli_latency").interactive_once(
        [sys.executable, "-c", echo], ["one", "two"]
    )
    assert len(seconds) == 2 and all(s > 0 for s in seconds)


def test_cli_latency_says_when_a_terminal_gets_no_answer(tool, monkeypatch):
    module = tool("cli_latency")
    monkeypatch.setattr(module, "TIMEOUT_S", 1.0)
    waits = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    with pytest.raises(TimeoutError):
        module.interactive_once(waits, ["one"])


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["--runs", "0"], "--runs"), (["--only", "help,nothing"], "nothing")],
)
def test_cli_latency_refuses_bad_options(argv, named, tool, monkeypatch, capsys):
    assert_one_line_error(
        *run_main(tool("cli_latency"), argv, monkeypatch, capsys), named
    )
