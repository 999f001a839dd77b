r"""Everything the book measures on a GPU, in one command that fits one call to a GPU machine.

    python -m experiments.gpu_call --fetch-wheels          # first, on a machine with PyPI
    python -m experiments.gpu_call --out "$OUT" --minutes 9  # then on the GPU machine

A GPU machine has torch, tokenizers, sacrebleu, safetensors and numpy, but no spaCy and no
package registry: the encoded cache (cache/, from `python -m transformer prepare`) and the
wheels that --fetch-wheels downloads into gpu-carry/ (CTranslate2 and pytest, for that
machine's Python 3.12) travel with the tree. The steps, in this order, each a process with
its own time limit, its output in OUT/logs/<step>.log:

1. train: `experiments.gpu_bench`, training throughput and MFU of the book's recipe in
   float32, float16 (with loss scaling) and bf16, and of the paper's base model on
   25,000-token batches in float16, in bf16 and in bf16 with torch.compile, with the card's
   measured fp16 and bf16 rates and the precision it gets by default: OUT/train-gpu.json.
   It runs on any CUDA GPU: where bf16 is emulated (a T4), bf16 is measured as it runs.
2. decode: `experiments.decode_bench --device cuda`, the package in float32 and bfloat16
   against CTranslate2 in float32, bfloat16 and int8, greedy and beam 4, batches of 32 and
   of 1: OUT/decode-gpu.json. An engine that cannot start there is named with its reason.
3. tests: `pytest -m gpu` over the test files that hold GPU tests, among them a short run
   of every training variant of step 1 on this GPU: OUT/pytest-gpu.xml.
4. sweep: `experiments.gpu_sweep quality`, five runs a pair side by side, scored by
   validation BLEU; a pair's best run is exported into OUT/sweep only if it beats the
   shipped model's validation BLEU by 0.5. The tests run beside it: they are not timed.

The sweep's training gets what the first steps leave of --minutes, less the time that
closing and scoring its runs take, and at most six minutes. A step that fails or runs out of
time is recorded and the next one starts. OUT/call.json records each step's command, exit
status and seconds, rewritten (atomically) after each step; the last lines printed are a
table of the steps. --dry-run checks what the call needs and writes OUT/plan.json, running
nothing.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from threading import Thread

from transformer import layout
from transformer.multi30k import PAIRS
from transformer.split_translation import write_lines

ROOT = Path(__file__).resolve().parents[1]
CARRY = ROOT / "gpu-carry"
# What --fetch-wheels downloads for the GPU machine (CPython 3.12 on x86-64 Linux): the
# versions of constraints.txt, and only the dependencies that the machine lacks (its own
# numpy, which torch was built against, must not be shadowed).
WHEELS = ["ctranslate2==4.8.5", "PyYAML==6.0.3", "pytest==9.2.0", "pluggy==1.7.0"]
WHEELS += ["iniconfig==2.3.1", "packaging==26.3", "Pygments==2.21.0"]
PLATFORM = ["--python-version", "3.12", "--platform", "manylinux_2_28_x86_64"]
SWEEP_MAX_MINUTES = 6.0
# Closing the sweep's runs (their averages, side by side), scoring them and the two shipped
# models on the validation split one after the other (16 to 19 s a model on a 2-core CPU,
# less on a GPU), and packing.
SWEEP_RESERVE_S = 100.0
LIMITS_S = {"train": 210.0, "decode": 120.0, "tests": 180.0}
# the first two steps' limits, the reserve and a minute of training
MIN_MINUTES = (LIMITS_S["train"] + LIMITS_S["decode"] + SWEEP_RESERVE_S + 60) / 60
# measured in gpu_bench's order: the recipe's three precisions first, the compiled one, the
# longest, last
TRAIN_VARIANTS = ["recipe fp32", "recipe fp16", "recipe bf16"]
TRAIN_VARIANTS += ["base-25k fp16", "base-25k bf16", "base-25k bf16 compile"]
ENGINES = "package,package-bfloat16,ct2-float32,ct2-bfloat16,ct2-int8"


@dataclass
class Step:
    """One command of the call: its name, argv, and the seconds it may take."""

    name: str
    argv: list[str]
    limit_s: float
    status: int | None = None
    seconds: float | None = None
    timed_out: bool = False


def python(*args: str) -> list[str]:
    return [sys.executable, *args]


def gpu_test_files(root: Path = ROOT) -> list[str]:
    """The test files that hold a test marked gpu, relative to the root."""
    found = []
    tests = [*(root / "tests").glob("test_*.py")]
    for path in sorted(tests + [*(root / "experiments" / "tests").glob("test_*.py")]):
        if "@pytest.mark.gpu" in path.read_text(encoding="utf-8"):
            found.append(str(path.relative_to(root)))
    return found


def fixed_steps(out: Path, cache: str) -> list[Step]:
    """The steps before the sweep, and the tests, with their time limits."""
    train = python("-m", "experiments.gpu_bench", "--cache-dir", cache)
    train += ["--out", str(out / "train-gpu.json"), "--only", *TRAIN_VARIANTS]
    decode = python("-m", "experiments.decode_bench", "--device", "cuda")
    decode += ["--cache-dir", cache, "--engines", ENGINES, "--baseline", "ct2-bfloat16"]
    decode += ["--batch-sizes", "32,1", "--one-at-a-time", "100", "--repeats", "2"]
    decode += ["--out", str(out / "decode-gpu.json")]
    tests = python("-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider")
    tests += ["--junitxml", str(out / "pytest-gpu.xml"), *gpu_test_files()]
    return [
        Step("train", train, LIMITS_S["train"]),
        Step("decode", decode, LIMITS_S["decode"]),
        Step("tests", tests, LIMITS_S["tests"]),
    ]


def sweep_step(out: Path, cache: str, runs: Path, minutes: float) -> Step:
    """The quality sweep, its training cut to `minutes`."""
    argv = python("-m", "experiments.gpu_sweep", "quality", "--cache-dir", cache)
    argv += ["--runs", str(runs), "--out", str(out / "sweep")]
    argv += ["--minutes", f"{minutes:.2f}", "--choose-by", "bleu"]
    argv += ["--shipped", str(ROOT / "checkpoints"), "--margin", "0.5"]
    return Step("sweep", argv, 60 * minutes + SWEEP_RESERVE_S + 60)


def problems(args: argparse.Namespace) -> list[str]:
    """What the call lacks, one line each, found before anything runs."""
    found = []
    for pair in PAIRS:
        if not (Path(args.cache_dir) / pair / "manifest.json").is_file():
            found.append(
                f"no encoded cache {Path(args.cache_dir) / pair}: run `python -m "
                f"transformer prepare --pair {pair}` where spaCy is installed"
            )
        if not (ROOT / "checkpoints" / pair / layout.CONFIG).is_file():
            found.append(f"no shipped model {ROOT / 'checkpoints' / pair}")
    wheels = sorted(Path(args.wheels).glob("*.whl"))
    for name in (spec.split("==")[0].lower() for spec in WHEELS):
        if not any(w.name.lower().startswith(name + "-") for w in wheels):
            found.append(
                f"no {name} wheel in {args.wheels}: run `python -m experiments.gpu_call "
                "--fetch-wheels` where PyPI can be reached"
            )
    if args.minutes < MIN_MINUTES:
        found.append(
            f"--minutes must be at least {MIN_MINUTES:.1f}, got {args.minutes}"
        )
    return found


def unpack(wheels: Path, site: Path) -> list[str]:
    """Unpacks every wheel into `site`, a folder for PYTHONPATH (a wheel is a zip whose
    top level is what site-packages would hold); returns their names."""
    names = []
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
        names.append(wheel.name)
    return names


def run_step(step: Step, logs: Path, env: dict) -> None:
    """Runs the step to its end or its limit, its output into logs/<name>.log."""
    started = time.perf_counter()
    with open(logs / f"{step.name}.log", "w") as log:
        log.write("$ " + " ".join(step.argv) + "\n")
        log.flush()
        proc = subprocess.Popen(
            step.argv,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the sweep's runs go with it
        )
        try:
            step.status = proc.wait(timeout=step.limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            step.status, step.timed_out = proc.wait(), True
    step.seconds = time.perf_counter() - started


def record(out: Path, steps: list[Step], facts: dict) -> None:
    write_lines(
        out / "call.json",
        [json.dumps(facts | {"steps": [asdict(s) for s in steps]}, indent=1)],
    )


def table(steps: list[Step]) -> str:
    lines = ["| step | exit | seconds | limit |", "| --- | ---: | ---: | ---: |"]
    for s in steps:
        status = "not run" if s.status is None else str(s.status)
        status += " (time limit)" if s.timed_out else ""
        seconds = "" if s.seconds is None else f"{s.seconds:.0f}"
        lines.append(f"| {s.name} | {status} | {seconds} | {s.limit_s:.0f} |")
    return "\n".join(lines)


def card() -> str:
    """nvidia-smi's name, driver and memory of the card, or why there is none."""
    try:
        done = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no nvidia-smi: {err}"
    return done.stdout.strip() or done.stderr.strip()


def fetch_wheels(folder: Path) -> int:
    """Downloads WHEELS for the GPU machine into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    command = python("-m", "pip", "download", "--no-deps", "--only-binary=:all:")
    command += PLATFORM
    command += ["-d", str(folder), *WHEELS]
    return subprocess.run(command).returncode


def call(args: argparse.Namespace) -> int:
    out = Path(args.out)
    deadline = time.perf_counter() + 60 * args.minutes
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    site = Path(tempfile.mkdtemp(prefix="gpu-call-site-"))
    runs = Path(tempfile.mkdtemp(prefix="gpu-call-runs-"))
    facts = {
        "card": card(),
        "minutes": args.minutes,
        "wheels": unpack(Path(args.wheels), site),
    }
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path.rstrip(os.pathsep), PYTHONUNBUFFERED="1")
    train, decode, tests = fixed_steps(out, args.cache_dir)
    steps = [train, decode]
    record(out, steps, facts)
    for step in steps:
        step.limit_s = min(step.limit_s, max(deadline - time.perf_counter() - 60, 1))
        run_step(step, logs, env)
        record(out, steps, facts)
    left = deadline - time.perf_counter() - SWEEP_RESERVE_S - 30
    sweep = sweep_step(
        out, args.cache_dir, runs, min(SWEEP_MAX_MINUTES, max(left, 30) / 60)
    )
    steps += [tests, sweep]
    # The tests run beside the sweep: they check results, not speed.
    threads = [Thread(target=run_step, args=(s, logs, env)) for s in (tests, sweep)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    record(out, steps, facts)
    shutil.rmtree(site, ignore_errors=True)
    print(table(steps))
    return 0 if all(s.status == 0 for s in steps) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", help="where every result goes (the call's $OUT)")
    p.add_argument(
        "--minutes", type=float, default=9.0, help="the whole call (default: 9)"
    )
    p.add_argument(
        "--cache-dir", default="cache", help="the encoded cache (default: cache)"
    )
    p.add_argument(
        "--wheels",
        default=str(CARRY),
        help=f"the carried wheels (default: {CARRY.name})",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="check and write OUT/plan.json only"
    )
    p.add_argument(
        "--fetch-wheels",
        action="store_true",
        help="download the wheels for the GPU machine into --wheels, and stop",
    )
    args = p.parse_args(argv)
    if args.fetch_wheels:
        return fetch_wheels(Path(args.wheels))
    if args.out is None:
        p.exit(2, f"{p.prog}: error: --out is required (the call's $OUT)\n")
    found = problems(args)
    for problem in found:
        print(f"{p.prog}: error: {problem}", file=sys.stderr)
    if found:
        return 2
    if args.dry_run:
        out = Path(args.out)
        steps = [
            *fixed_steps(out, args.cache_dir),
            sweep_step(out, args.cache_dir, Path("runs"), SWEEP_MAX_MINUTES),
        ]
        out.mkdir(parents=True, exist_ok=True)
        write_lines(
            out / "plan.json", [json.dumps([asdict(s) for s in steps], indent=1)]
        )
        print(table(steps))
        return 0
    return call(args)


if __name__ == "__main__":
    sys.exit(main())
