"""The one prepared GPU call (experiments/gpu_call.py), on the CPU: it names what it lacks
before running anything, its planned commands are accepted by the scripts they run, and it
records every step, one that fails or runs out of time included, under OUT."""

import functools
import json
import shutil
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from experiments import decode_bench, gpu_bench, gpu_call, gpu_sweep
from experiments.tests.test_scripts import assert_one_line_error, never, run_main
from transformer.encoded_split import EncodedSplit
from transformer.epoch_data import TrainingData
from transformer.precision import default_precision, precision_for
from transformer.tokenizer import MARK, train_bpe

SHIPPED = gpu_call.ROOT / "checkpoints"


class Reached(BaseException):
    """Raised where a script starts its work, its checks of the options behind it (not an
    Exception: gpu_bench records a variant's Exception and goes on)."""


def reached(*args, **kwargs):
    raise Reached


def fake_wheel(folder: Path, name: str, module: str = "") -> Path:
    """A wheel named `name` holding one module, `module`, that sets FOUND = 1."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        if module:
            z.writestr(f"{module}/__init__.py", "FOUND = 1\n")
    return path


@pytest.fixture
def carried(tmp_path: Path) -> list[str]:
    """The options of a call whose cache and wheels are all there (the cache holds the
    shipped models' vocabularies, as `prepare` writes them)."""
    for pair in gpu_call.PAIRS:
        (tmp_path / "cache" / pair).mkdir(parents=True)
        (tmp_path / "cache" / pair / "manifest.json").write_text("{}")
        shutil.copy(SHIPPED / pair / "tokenizer.json", tmp_path / "cache" / pair)
    for spec in gpu_call.WHEELS:
        fake_wheel(tmp_path / "wheels", spec.split("==")[0].lower())
    return [
        "--cache-dir",
        str(tmp_path / "cache"),
        "--wheels",
        str(tmp_path / "wheels"),
    ]


def plan(tmp_path: Path, carried: list[str]) -> dict[str, list[str]]:
    out = tmp_path / "out"
    assert gpu_call.main(["--out", str(out), "--dry-run", *carried]) == 0
    steps = json.loads((out / "plan.json").read_text())
    assert all(s["status"] is None for s in steps)  # nothing ran
    return {s["name"]: s["argv"] for s in steps}


def test_the_planned_commands_pass_their_scripts_checks(
    tmp_path: Path, carried, monkeypatch, capsys
):
    """Each script takes its step's options and goes past its checks of them (into the
    work, stopped here by `reached`); the tests step names the files with GPU tests."""
    steps = plan(tmp_path, carried)
    assert list(steps) == ["train", "decode", "tests", "sweep"]
    capsys.readouterr()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "a card")
    for module, name, stop in (
        (gpu_bench, "train", "measure"),
        (decode_bench, "decode", "load_pair_model"),
        (gpu_sweep, "sweep", "launch"),
    ):
        argv = steps[name]
        assert argv[:3] == [sys.executable, "-m", module.__name__]
        monkeypatch.setattr(module, stop, reached)
        monkeypatch.setattr(gpu_bench, "measured_peak", lambda dtype: 1e15)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (7, 5))
        monkeypatch.setattr(gpu_bench, "default_precision", lambda device: "fp16")
        with pytest.raises(Reached):
            run_main(module, argv[3:], monkeypatch, capsys)
        assert capsys.readouterr().err == "", name
    tests = steps["tests"]
    assert tests[tests.index("-m", 2) + 1] == "gpu"
    assert set(tests) >= {"tests/test_schedule.py", "tests/test_translate.py"}
    sweep = steps["sweep"]
    assert sweep[sweep.index("--shipped") + 1] == str(SHIPPED)
    assert sweep[sweep.index("--choose-by") + 1] == "bleu"
    assert float(sweep[sweep.index("--minutes") + 1]) == gpu_call.SWEEP_MAX_MINUTES


def test_the_call_names_what_it_lacks_before_running_anything(
    tmp_path: Path, monkeypatch, capsys
):
    monkeypatch.setattr(gpu_call, "call", never)
    argv = ["--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "none")]
    argv += ["--wheels", str(tmp_path / "none"), "--minutes", "5"]
    status, err = run_main(gpu_call, argv, monkeypatch, capsys)
    assert status == 2 and "Traceback" not in err
    lines = err.splitlines()
    assert sum("no encoded cache" in line for line in lines) == 2
    assert "no ctranslate2 wheel" in err and "--fetch-wheels" in err
    assert f"--minutes must be at least {gpu_call.MIN_MINUTES:.1f}, got 5.0" in err
    assert not (tmp_path / "out").exists()
    status, err = run_main(gpu_call, [], monkeypatch, capsys)
    assert_one_line_error(status, err, "--out is required")


def test_the_call_records_every_step_and_gives_it_the_carried_wheels(
    tmp_path: Path, carried, monkeypatch
):
    """Steps that succeed, fail and run out of time: each is recorded with its status and
    log, and the steps after them still run; a carried wheel is importable in every step."""
    fake_wheel(tmp_path / "wheels", "carried", module="carried_module")
    out = tmp_path / "out"

    def step(name: str, code: str, limit: float) -> gpu_call.Step:
        return gpu_call.Step(name, [sys.executable, "-c", code], limit)

    wrote = f"import carried_module; open({str(out / 'train.txt')!r}, 'w').write('x')"
    monkeypatch.setattr(
        gpu_call,
        "fixed_steps",
        lambda out, cache: [
            step("train", wrote, 60),
            step("decode", "import sys; print('no engine'); sys.exit(3)", 60),
            step("tests", "import carried_module", 60),
        ],
    )
    monkeypatch.setattr(
        gpu_call,
        "sweep_step",
        lambda out, cache, runs, minutes: step(
            "sweep", "import time; time.sleep(60)", 1
        ),
    )
    monkeypatch.setattr(gpu_call, "card", lambda: "no card")
    argv = ["--out", str(out), "--minutes", str(gpu_call.MIN_MINUTES), *carried]
    assert gpu_call.main(argv) == 1  # not every step succeeded
    record = json.loads((out / "call.json").read_text())
    assert (
        record["card"] == "no card"
        and "carried-1.0-py3-none-any.whl" in record["wheels"]
    )
    steps = {s["name"]: s for s in record["steps"]}
    assert [s["status"] for s in record["steps"][:3]] == [0, 3, 0]
    assert steps["sweep"]["timed_out"] and steps["sweep"]["status"] != 0
    assert (out / "train.txt").read_text() == "x"
    assert "no engine" in (out / "logs" / "decode.log").read_text()
    assert all((out / "logs" / f"{name}.log").is_file() for name in steps)
    assert not list(out.glob("**/*.tmp*"))  # every file written whole


def tiny_training_data(seed: int = 0) -> TrainingData:
    """A tokenizer learned on random words, and random id sequences: neither spaCy nor the
    encoded cache, which a GPU machine may lack."""
    rng = np.random.default_rng(seed)
    letters = list("abcdefgh")
    words = [
        [MARK + "".join(rng.choice(letters, size=rng.integers(1, 4))) for _ in range(5)]
        for _ in range(30)
    ]
    tokenizer = train_bpe(words, 40, languages=("de", "en"))

    def split(n: int) -> EncodedSplit:
        ids = [
            rng.integers(4, tokenizer.vocab_size, rng.integers(1, 8)).tolist()
            for _ in range(2 * n)
        ]
        return EncodedSplit.from_lists(ids[:n], ids[n:])

    return TrainingData(tokenizer, split(40), split(12))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_calls_training_variants_run_on_the_gpu_it_meets(monkeypatch):
    """Every training variant of the call runs on the GPU found here, whatever 16-bit
    hardware it has (a T4 emulates bf16, and its float16 scales the loss), through the same
    `measure` as the call, on tiny data in place of Multi30k; the rates of both 16-bit matrix
    products are measured; and the default precision is the card's. A compiled variant is
    left out: torch.compile needs a C compiler, and the call records its error if there is
    none."""
    data = tiny_training_data()
    monkeypatch.setattr(
        gpu_bench, "train", functools.partial(gpu_bench.train, data=data)
    )
    for name in gpu_call.TRAIN_VARIANTS:
        fields = gpu_bench.VARIANTS[name]
        if fields.get("compile"):
            continue
        row = gpu_bench.measure(name, fields, "no-cache", "de-en")
        assert row["tokens_per_s"] > 0 and row["mfu"] > 0, name
    for dtype in (torch.float16, torch.bfloat16):
        assert gpu_bench.measured_peak(dtype, n=1024, repeats=3) > 0
    capability = torch.cuda.get_device_capability()
    assert default_precision(torch.device("cuda")) == precision_for(capability)
