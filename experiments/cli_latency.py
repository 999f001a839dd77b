"""How long the command line takes to answer, side by side in one run.

    python -m experiments.cli_latency --out experiments/benchmarks/cli-latency.json

Every command runs in a fresh process, the commands take turns `--runs` times,
and each one's median wall time is reported:

- `import`: `python -c "import torch, spacy"`, the floor that loading the
  libraries sets;
- `help`: `python -m transformer translate --help`;
- `de-en`, `fr-en`: one sentence translated, `translate --pair P "..."`;
- `interactive`: `translate --pair de-en` in a pseudo-terminal, as a user types
  at it: the time from entering a second line to reading its translation, the
  model already loaded (and, beside it, the time to the first line's).

The goals that the record is checked against are in `GOALS`. Run it on an idle
machine: the timings are wall times of whole processes.
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import statistics
import subprocess
import sys
import termios
import time
from collections.abc import Callable
from pathlib import Path

from transformer.atomic import atomic_write

from .decode_bench import machine

PYTHON = sys.executable
TRANSLATE = [PYTHON, "-m", "transformer", "translate"]
SENTENCES = {
    "de-en": ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt Fahrrad."],
    "fr-en": ["Deux chiens jouent dans la neige.", "Un homme fait du vélo."],
}
COMMANDS = {
    "import": [PYTHON, "-c", "import torch, spacy"],
    "help": [*TRANSLATE, "--help"],
    "de-en": [*TRANSLATE, "--pair", "de-en", SENTENCES["de-en"][0]],
    "fr-en": [*TRANSLATE, "--pair", "fr-en", SENTENCES["fr-en"][0]],
}
MEASURES = [*COMMANDS, "interactive"]
# What the command line should reach, as (what, seconds): `help` alone; the
# French sentence against the German one; the German one against `import`;
# the interactive second line alone.
GOALS = {
    "help under 0.5 s": ("help", None, 0.5),
    "fr-en within 0.5 s of de-en": ("fr-en", "de-en", 0.5),
    "de-en within 1.5 s of import": ("de-en", "import", 1.5),
    "interactive second line under 0.3 s": ("interactive", None, 0.3),
}
# How long one command may take before the measurement gives up on it.
TIMEOUT_S = 120.0


def run_once(argv: list[str]) -> float:
    """Wall seconds of one process, from start to exit; it must succeed."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[1:])} exited with {done.returncode}: "
            f"{done.stderr.strip().splitlines()[-1:]}"
        )
    return seconds


def _read_line(fd: int, pending: bytearray, deadline: float) -> bytes:
    """The next line the program wrote on the terminal, or an error once the
    deadline passes."""
    while b"\n" not in pending:
        left = deadline - time.perf_counter()
        ready, _, _ = select.select([fd], [], [], max(left, 0))
        if not ready:
            raise TimeoutError("no line came back before the deadline")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the program closed the terminal
            chunk = b""
        if not chunk:
            raise EOFError("the program ended without answering")
        pending += chunk
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.rstrip(b"\r")


def interactive_once(argv: list[str], lines: list[str]) -> list[float]:
    """Start `argv` on a pseudo-terminal, type `lines` one at a time, each
    after the answer to the one before, and return for each the seconds from
    typing it (the first: from the start) to reading its answer."""
    main_fd, child_fd = pty.openpty()
    attributes = termios.tcgetattr(child_fd)
    attributes[3] &= ~termios.ECHO  # read back answers, not what was typed
    termios.tcsetattr(child_fd, termios.TCSANOW, attributes)
    start = time.perf_counter()
    process = subprocess.Popen(
        argv,
        stdin=child_fd,
        stdout=child_fd,
        stderr=subprocess.DEVNULL,
        close_fds=True,
    )
    os.close(child_fd)
    pending, seconds = bytearray(), []
    try:
        for line in lines:
            typed = time.perf_counter() if seconds else start
            os.write(main_fd, line.encode() + b"\n")
            _read_line(main_fd, pending, typed + TIMEOUT_S)
            seconds.append(time.perf_counter() - typed)
        os.write(main_fd, b"\x04")  # Ctrl-D: the end of input
        process.wait(timeout=TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(main_fd)
    return seconds


def measurements(names: list[str]) -> dict[str, Callable[[], list[float]]]:
    """For each measure, a function that runs it once: its seconds."""
    found = {}
    for name in names:
        if name == "interactive":
            argv = [*TRANSLATE, "--pair", "de-en"]
            found[name] = lambda argv=argv: interactive_once(argv, SENTENCES["de-en"])
        else:
            found[name] = lambda argv=COMMANDS[name]: [run_once(argv)]
    return found


def goals(medians: dict[str, float]) -> dict[str, bool | None]:
    """Each goal: met, missed, or None where a measure it needs was not run."""
    verdicts = {}
    for goal, (measure, against, limit) in GOALS.items():
        if measure not in medians or (against and against not in medians):
            verdicts[goal] = None
            continue
        gap = medians[measure] - (medians[against] if against else 0.0)
        verdicts[goal] = gap < limit
    return verdicts


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m experiments.cli_latency",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--runs", type=int, default=5, help="rounds (default 5)")
    p.add_argument(
        "--only",
        default=",".join(MEASURES),
        help=f"measures to run, comma-separated, of {','.join(MEASURES)}",
    )
    p.add_argument("--out", type=Path, help="write the record as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)

    def error(message: str) -> None:  # one line, as the package's commands
        p.exit(2, f"{p.prog}: error: {message}\n")

    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - set(MEASURES))
    if unknown or not names:
        error(f"unknown measures {unknown or names}: choose of {MEASURES}")
    if args.runs < 1:
        error(f"--runs must be at least 1, got {args.runs}")
    runs = {name: [] for name in names}
    second_lines: list[float] = []
    for _ in range(args.runs):  # in turns, so that drift falls on all alike
        for name, measure in measurements(names).items():
            try:
                seconds = measure()
            except (TimeoutError, EOFError) as e:
                p.exit(1, f"{p.prog}: {name}: {e}\n")
            runs[name].append(seconds[0])
            if name == "interactive":
                second_lines.append(seconds[1])
    medians = {name: statistics.median(s) for name, s in runs.items()}
    if second_lines:  # the interactive measure is the second line's time
        medians["interactive first line"] = medians.pop("interactive")
        medians["interactive"] = statistics.median(second_lines)
        runs["interactive first line"] = runs.pop("interactive")
        runs["interactive"] = second_lines
    record = {
        "machine": machine(),
        "python": sys.version.split()[0],
        "runs": args.runs,
        "median_s": {k: round(v, 3) for k, v in medians.items()},
        "all_s": {k: [round(s, 3) for s in v] for k, v in runs.items()},
        "goals": goals(medians),
    }
    text = json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    if args.out:
        atomic_write(args.out, text.encode())
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
