"""The command line as a user meets it: `translate` typed at a terminal answers each line as it
is entered, for either engine; and run from outside the clone it finds the data and the models
through TRANSFORMER_HOME, or says in one line that it needs it."""

from __future__ import annotations

import importlib.util
import os
import pty
import select
import shutil
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from transformer.cli.main import COMMANDS
from transformer.paths import HOME_VARIABLE

ROOT = Path(__file__).resolve().parent.parent
TRANSLATE = [sys.executable, "-m", "transformer", "translate", "--pair", "de-en"]
TIMEOUT_S = 120.0
LINES = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt Fahrrad."]


def read_line(fd: int, pending: bytearray) -> str:
    """The next line the program writes on the terminal (an error after TIMEOUT_S)."""
    deadline = time.monotonic() + TIMEOUT_S
    while b"\n" not in pending:
        ready, _, _ = select.select([fd], [], [], max(deadline - time.monotonic(), 0))
        if not ready:
            raise TimeoutError("no answer came back")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the program closed the terminal
            chunk = b""
        if not chunk:
            raise EOFError("the program ended without answering")
        pending += chunk
    line, _, rest = bytes(pending).partition(b"\n")
    pending[:] = rest
    return line.decode().removesuffix("\r")


def interact(argv: list[str], lines: list[str]) -> list[str]:
    """Run `argv` on a pseudo-terminal, type each line after the answer to the one before,
    and return the answers; each is read while the input is still open."""
    main_fd, child_fd = pty.openpty()
    attributes = termios.tcgetattr(child_fd)
    attributes[3] &= ~termios.ECHO  # read back answers, not what was typed
    termios.tcsetattr(child_fd, termios.TCSANOW, attributes)
    process = subprocess.Popen(
        argv, stdin=child_fd, stdout=child_fd, stderr=subprocess.PIPE, close_fds=True
    )
    os.close(child_fd)
    pending, answers = bytearray(), []
    try:
        for line in lines:
            os.write(main_fd, line.encode() + b"\n")
            answers.append(read_line(main_fd, pending))
            assert process.poll() is None  # answered before the end of input
        os.write(main_fd, b"\x04")  # Ctrl-D
        assert process.wait(timeout=TIMEOUT_S) == 0, process.stderr.read().decode()
        prompt, *warnings = process.stderr.read().decode().splitlines()
        assert prompt == "one sentence per line; end with Ctrl-D"
        # a warning names the line by its number (the tiny model's outputs run long)
        warned = [w.partition(": warning: ")[2].partition(":")[0] for w in warnings]
        assert set(warned) <= {f"sentence {n}" for n in range(1, len(lines) + 1)}
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()
        os.close(main_fd)
    return answers


def piped(argv: list[str], lines: list[str]) -> list[str]:
    """The translations of `lines` given on a pipe: read whole, batched by length."""
    done = subprocess.run(
        argv, input="".join(f"{s}\n" for s in lines), capture_output=True, text=True,
        timeout=TIMEOUT_S,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_a_terminal_gets_each_translation_as_its_line_is_entered(shipped):
    argv = [*TRANSLATE, "--checkpoint", str(shipped), "--device", "cpu"]
    answers = interact(argv, LINES)
    assert len(answers) == len(LINES) and all(answers)
    assert answers == piped(argv, LINES)


@pytest.mark.skipif(
    importlib.util.find_spec("ctranslate2") is None, reason="needs ctranslate2"
)
def test_a_terminal_gets_each_translation_from_ctranslate2_too(shipped, tmp_path):
    from transformer.checkpoint import load_model
    from transformer.ctranslate2 import export_ctranslate2

    export_ctranslate2(*load_model(shipped), tmp_path / "ct2")
    argv = [*TRANSLATE, "--engine", "ctranslate2", "--model", str(tmp_path / "ct2")]
    answers = interact([*argv, "--beam", "1"], LINES)
    assert len(answers) == len(LINES) and all(answers)
    # greedy decoding: the package's own translations
    package = [*TRANSLATE, "--checkpoint", str(shipped), "--device", "cpu"]
    assert answers == piped([*package, "--beam", "1"], LINES)


def test_outside_the_clone_the_models_are_found_through_transformer_home(tmp_path):
    """The package as installed elsewhere (a copy, first on the path), run from a folder
    outside the clone: without TRANSFORMER_HOME one line says what to set; with it pointing
    at the clone, the shipped model translates."""
    site = tmp_path / "site"
    shutil.copytree(
        ROOT / "transformer",
        site / "transformer",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    env = {k: v for k, v in os.environ.items() if k != HOME_VARIABLE}
    env["PYTHONPATH"] = str(site)
    argv = [*TRANSLATE, "--device", "cpu", "Zwei Hunde spielen im Schnee."]

    def run(env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(
            argv,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )

    alone = run(env)
    assert alone.returncode == 2 and alone.stdout == ""
    assert len(alone.stderr.splitlines()) == 1, alone.stderr
    assert alone.stderr.startswith(
        f"python -m transformer translate: error: no de-en model in {site / 'checkpoints'}"
    )
    assert (
        f"set {HOME_VARIABLE} to the folder that holds checkpoints/de-en"
        in alone.stderr
    )
    found = run(env | {HOME_VARIABLE: str(ROOT)})
    assert found.returncode == 0, found.stderr
    assert found.stdout == "Two dogs play in the snow.\n"


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"beam_size": 0}, "beam_size must be at least 1, got 0"),
        ({"batch_size": 0}, "batch_size must be at least 1, got 0"),
        ({"max_len": 0}, "max_len must be at least 1, got 0"),
        ({"alpha": -0.5}, "alpha must be >= 0 and at most 10, got -0.5"),
        ({"alpha": float("nan")}, "alpha must be >= 0 and at most 10, got nan"),
    ],
)
def test_decode_options_are_checked_once_when_made(changes, message):
    from transformer.decode_options import DecodeOptions, OptionError, with_changes

    with pytest.raises(OptionError, match=f"^{message}$") as err:
        with_changes(**changes)
    assert err.value.field == next(iter(changes))
    with pytest.raises(OptionError):
        DecodeOptions(**changes)


def test_the_help_calls_a_default_the_papers_only_while_it_is(monkeypatch):
    import argparse
    import functools

    import transformer.cli.base as base
    from transformer.decode_options import DecodeOptions

    def help_text() -> str:
        p = argparse.ArgumentParser()
        base.add_model_options(p)
        return " ".join(p.format_help().split())

    paper = functools.partial(DecodeOptions, beam_size=4, alpha=0.6)
    monkeypatch.setattr(base, "DecodeOptions", paper)
    text = help_text()
    assert "(default: 4, the paper's)" in text and "(default: 0.6, the paper's)" in text
    monkeypatch.setattr(base, "DecodeOptions", functools.partial(paper, alpha=1.0))
    text = help_text()
    assert "(default: 4, the paper's)" in text
    assert "(default: 1)" in text and "(default: 1, the paper's)" not in text


def test_the_papers_search_and_the_defaults_set_from_it_and_the_decoders_agree():
    import inspect

    from transformer.decode import beam_search
    from transformer.decode_options import DecodeOptions, with_changes
    from transformer.paper_search import ALPHA, BEAM_SIZE, PAPER_ALPHA, PAPER_BEAM_SIZE

    # the paper's "beam size of 4 and length penalty α = 0.6" (Section 6.1)
    assert (PAPER_BEAM_SIZE, PAPER_ALPHA) == (4, 0.6)
    defaults = DecodeOptions()
    assert (defaults.beam_size, defaults.alpha) == (BEAM_SIZE, ALPHA)
    assert with_changes(beam_size=1).greedy
    assert with_changes(defaults, alpha=1.0) == DecodeOptions(alpha=1.0)
    # beam_search, the decoding chapter's teaching function, has the same defaults
    teaching = inspect.signature(beam_search).parameters
    assert (teaching["beam_size"].default, teaching["alpha"].default) == (
        BEAM_SIZE,
        ALPHA,
    )
    # the overflow within a model's positions: float32's bound, as the search computes lp
    DecodeOptions(alpha=10.0).check_alpha(40_000)
    with pytest.raises(ValueError, match="overflow at the model's 50000 positions"):
        DecodeOptions(alpha=10.0).check_alpha(50_000)


def test_translate_takes_options_or_changes_alike(shipped):
    from transformer.checkpoint import load_model
    from transformer.decode_options import DecodeOptions
    from transformer.translation import translate

    model, tokenizer = load_model(shipped)
    options = DecodeOptions(beam_size=2, alpha=1.0, batch_size=1)
    by_options = translate(model, tokenizer, LINES, options)
    assert by_options == translate(model, tokenizer, LINES, beam_size=2, alpha=1.0)
    short = translate(model, tokenizer, LINES, options, max_len=3)
    assert all(len(t.split()) <= 3 for t in short)  # at most 3 tokens


def test_train_help_explains_the_precision_and_its_default():
    """`train --help` names the precisions and says how the default is chosen; the earlier
    --bf16 options still work but are not offered."""
    done = subprocess.run(
        [sys.executable, "-m", "transformer", "train", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    text = " ".join(done.stdout.split())
    assert "--precision {bf16,fp16,fp32}" in text
    assert (
        "(default: what the GPU has in hardware, bf16 from compute capability 8.0, fp16"
        " with loss scaling on 7.x, fp32 on older GPUs and CPUs; a resumed run keeps its"
        " own)" in text
    )
    assert "--bf16" not in text and "--no-bf16" not in text


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_answers_help_without_torch(command):
    """Each command's `--help` prints its usage and options with torch (and spaCy) blocked:
    `import torch` fails in the process, so a command that loads it before its help cannot
    answer."""
    code = (
        "import sys\n"
        "sys.modules['torch'] = sys.modules['spacy'] = None  # `import torch` fails\n"
        "from transformer.cli.main import main\n"
        f"sys.exit(main([{command!r}, '--help']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"usage: python -m transformer {command} ")
    assert "-h, --help" in done.stdout


def test_the_ctranslate2_commands_quantizations_are_the_exports():
    """`ctranslate2 --quantize` offers the types that export_ctranslate2 takes, named in the
    command's module so that its help loads no torch."""
    from transformer import ctranslate2
    from transformer.cli import ctranslate2 as command

    assert command.QUANTIZATIONS == ctranslate2.QUANTIZATIONS
