"""The chapters are the source: transformer/ is their export, each twin matches its notebook,
and every stored notebook ran top to bottom without errors."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import nb  # noqa: E402

CHAPTERS = nb.chapter_paths()


def test_there_are_chapters():
    assert len(CHAPTERS) >= 2


def test_package_matches_a_fresh_export():
    assert nb.export_drift() == []


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_is_clean(path: Path):
    assert nb.notebook_problems(path, nb.repository_url()) == []


@pytest.fixture
def scratch_repo(tmp_path: Path) -> Path:
    for name in ("chapters", "transformer"):
        shutil.copytree(ROOT / name, tmp_path / name)
    shutil.copy(ROOT / "_config.yml", tmp_path / "_config.yml")
    return tmp_path


def test_a_hand_edited_module_is_caught(scratch_repo: Path):
    module = scratch_repo / "transformer" / "attention.py"
    module.write_text(module.read_text() + "\n# a hand edit\n")
    assert nb.export_drift(scratch_repo) == [
        "transformer/attention.py differs from its chapter: run `make export`"
    ]


def test_a_stale_twin_and_an_error_output_are_caught(scratch_repo: Path):
    path = scratch_repo / "chapters" / "01_attention.ipynb"
    notebook = nbformat.read(path, as_version=4)
    cell = next(c for c in notebook.cells if c.cell_type == "code" and c.outputs)
    cell.outputs.append(
        nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[])
    )
    nbformat.write(notebook, path)
    problems = nb.notebook_problems(path, nb.repository_url(scratch_repo))
    assert any("error output (ValueError)" in p for p in problems)
    (scratch_repo / "chapters" / "01_attention.py").write_text("# stale\n")
    problems = nb.notebook_problems(path, nb.repository_url(scratch_repo))
    assert any("out of sync" in p for p in problems)


def test_the_setup_cell_follows_the_configured_url(scratch_repo: Path):
    config = scratch_repo / "_config.yml"
    config.write_text(config.read_text().replace("transformer-book/", "someone-else/"))
    path = scratch_repo / "chapters" / "01_attention.ipynb"
    problems = nb.notebook_problems(path, nb.repository_url(scratch_repo))
    assert any("Colab set-up" in p for p in problems)
    nb.setup_cells(scratch_repo)
    assert nb.notebook_problems(path, nb.repository_url(scratch_repo)) == []
    assert "someone-else/" in nbformat.read(path, as_version=4).cells[1].source


def test_a_line_wider_than_the_column_is_caught(scratch_repo: Path):
    path = scratch_repo / "chapters" / "01_attention.ipynb"
    notebook = nbformat.read(path, as_version=4)
    code = next(c for c in notebook.cells if c.cell_type == "code" and c.outputs)
    code.source += "\nx = " + "1 + " * 30 + "1"
    text = next(c for c in notebook.cells if c.cell_type == "markdown")
    text.source += "\n\n```\n" + "y" * (nb.CODE_WIDTH + 1) + "\n```\n"
    problems = nb.wide_code(notebook)
    assert len(problems) == 2, problems
    assert all(f"wider than the column ({nb.CODE_WIDTH})" in p for p in problems)


def test_a_subpackages_modules_are_exported_and_checked(scratch_repo: Path):
    """`#| default_exp cli.translate` writes transformer/cli/translate.py: its imports are
    absolute, its header names the chapter, and a hand edit of it is caught too."""
    module = scratch_repo / "transformer" / "cli" / "translate.py"
    text = module.read_text()
    assert text.startswith("# Generated from chapters/a10_cli.ipynb: edit it")
    assert "from transformer.cli.base import" in text and "from ." not in text
    module.write_text(text + "\n# a hand edit\n")
    (scratch_repo / "transformer" / "cli" / "stale.py").write_text("")
    assert nb.export_drift(scratch_repo) == [
        "transformer/cli/stale.py is exported by no chapter: delete it",
        "transformer/cli/translate.py differs from its chapter: run `make export`",
    ]


def test_absolute_imports_resolve_a_subpackages_relative_ones():
    text = "from .base import A\nfrom ..multi30k import B\n"
    assert nb.absolute_imports(text, "transformer.cli") == (
        "from transformer.cli.base import A\nfrom transformer.multi30k import B\n"
    )
