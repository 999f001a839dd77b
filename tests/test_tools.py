"""The scripts in tools/ explain themselves: `--help` prints each one's whole docstring."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

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
