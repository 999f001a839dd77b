"""tools/nb.py, the chapters' tooling, leaves no half-written chapter."""

import importlib
import os
import shutil
import time
from pathlib import Path

import jupytext
import nbformat
import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def test_nb_writes_a_chapter_and_its_twin_whole_or_not_at_all(
    tmp_path: Path, monkeypatch
):
    """The bytes of nbformat's and jupytext's own writers; interrupted before the rename, the
    chapter is left as it was and nothing beside it."""
    monkeypatch.syspath_prepend(str(TOOLS))
    nb = importlib.import_module("nb")
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

    monkeypatch.setattr(os, "fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nb._write_pair(path, notebook)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "01_x.ipynb",
        "01_x.py",
        "expected",
    ]


# `tools/nb.py edit` (`make chapter`), on a scratch copy of the repository holding a small
# chapter of its own: synced, executed and exported, as a chapter stands before an edit.
SCRATCH_CHAPTER = "chapters/90_scratch.ipynb"
SCRATCH_TWIN = "chapters/90_scratch.py"


@pytest.fixture
def nb_tool(monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    return importlib.import_module("nb")


@pytest.fixture
def scratch_repo(tmp_path: Path, nb_tool) -> Path:
    root = TOOLS.parent
    for name in ("chapters", "transformer"):
        shutil.copytree(root / name, tmp_path / name)
    for name in ("_config.yml", "pyproject.toml"):
        shutil.copy(root / name, tmp_path / name)
    code = nbformat.v4.new_code_cell
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Doubling\n\nA number, twice."),
            code(
                nb_tool.setup_cell_source(nb_tool.repository_url(tmp_path)),
                metadata={"tags": [nb_tool.SETUP_TAG, "hide-input"]},
            ),
            code("#| default_exp scratch_double"),
            code(
                '#| export\n"""Doubling."""\n\n\n'
                'def double(x: int) -> int:\n    """Twice `x`."""\n    return 2 * x'
            ),
            code("double(21)"),
        ],
        metadata={
            "jupytext": {"formats": "ipynb,py:percent"},
            "kernelspec": {
                "display_name": "Python 3",
                "language": "python",
                "name": "python3",
            },
        },
    )
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    for count, cell in enumerate(cells, 1):
        cell.execution_count = count
    cells[-1].outputs = [
        nbformat.v4.new_output(
            "execute_result", data={"text/plain": "42"}, execution_count=len(cells)
        )
    ]
    path = tmp_path / SCRATCH_CHAPTER
    nb_tool._write_pair(path, notebook)
    nb_tool.export(tmp_path, [path])
    # The edit comes later than the stored notebook, as an author's does.
    os.utime(path, (time.time() - 60, time.time() - 60))
    return tmp_path


def edit_twin(root: Path, old: str, new: str) -> list[str]:
    """Replace `old` by `new` in the scratch chapter's twin; return the twin's lines."""
    twin = root / SCRATCH_TWIN
    text = twin.read_text()
    assert old in text
    twin.write_text(text.replace(old, new))
    return twin.read_text().splitlines()


def test_edit_reports_lint_findings_by_the_twins_line(
    scratch_repo: Path, nb_tool, capsys
):
    """ruff's findings, with the rules `make check` applies to the notebook, and a fenced line
    wider than the book's column, each at the line and column of the twin."""
    wide = "w" * (nb_tool.CODE_WIDTH + 6)
    edit_twin(
        scratch_repo,
        "# A number, twice.",
        f"# A number, twice.\n#\n# ```\n# {wide}\n# ```",
    )
    lines = edit_twin(scratch_repo, "return 2 * x", "return 2 * undefined_width")
    undefined = lines.index("    return 2 * undefined_width") + 1
    fenced = lines.index(f"# {wide}") + 1
    assert nb_tool.edit([scratch_repo / SCRATCH_TWIN], root=scratch_repo) == 1
    out = capsys.readouterr().out.splitlines()
    assert f"{SCRATCH_TWIN}:{undefined}:16 F821 Undefined name `undefined_width`" in out
    assert any(
        line.startswith(f"{SCRATCH_TWIN}:{fenced}:{nb_tool.CODE_WIDTH + 3} width")
        for line in out
    ), out
    # A cell's imports stand where the prose needs them (E402, ignored for chapters).
    assert not any("E402" in line for line in out)
    assert out[-1] == f"FAILED: {SCRATCH_TWIN}: 2 lint findings, 0 other problems"


def test_a_clean_edit_ends_synced_formatted_and_exported(
    scratch_repo: Path, nb_tool, capsys
):
    edit_twin(scratch_repo, "return 2 * x", "return x+x  # the same sum")
    assert nb_tool.edit([scratch_repo / SCRATCH_TWIN], root=scratch_repo) == 0
    out = capsys.readouterr().out
    module = (scratch_repo / "transformer" / "scratch_double.py").read_text()
    assert "    return x + x  # the same sum\n" in module
    path = scratch_repo / SCRATCH_CHAPTER
    notebook = nbformat.read(path, as_version=4)
    assert (scratch_repo / SCRATCH_TWIN).read_text() == jupytext.writes(
        notebook, fmt="py:percent"
    )
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert "return x + x  # the same sum" in code[2].source
    # The edited cell no longer claims the stored run; the others keep their outputs.
    assert [c.execution_count for c in code] == [1, 2, None, 4]
    assert code[3].outputs[0].data["text/plain"] == "42"
    assert f"`make chapter NB={SCRATCH_TWIN} EXECUTE=1`" in out
    assert out.splitlines()[-1].startswith(
        f"ok: {SCRATCH_TWIN}: synced, formatted, exported 1 module, lint clean"
    )
    assert nb_tool.notebook_problems(path, nb_tool.repository_url(scratch_repo)) == [
        f"{SCRATCH_CHAPTER}: not executed top to bottom in one run"
        f" (`make execute NB={SCRATCH_CHAPTER}`)"
    ]


def test_edit_fails_on_a_bad_edit_and_exports_nothing(
    scratch_repo: Path, nb_tool, capsys
):
    module = scratch_repo / "transformer" / "scratch_double.py"
    exported = module.read_bytes()
    lines = edit_twin(scratch_repo, "return 2 * x", "return 2 * (x")
    broken = lines.index("    return 2 * (x") + 1
    assert nb_tool.edit([scratch_repo / SCRATCH_TWIN], root=scratch_repo) == 1
    out = capsys.readouterr().out.splitlines()
    assert any(line.startswith(f"{SCRATCH_TWIN}:{broken}:") for line in out), out
    assert f"{SCRATCH_TWIN}: not exported: a code cell does not parse" in out
    assert out[-1].startswith(f"FAILED: {SCRATCH_TWIN}:")
    assert module.read_bytes() == exported
    # Anything but a chapter is refused with one line.
    assert nb_tool.edit([scratch_repo / "pyproject.toml"], root=scratch_repo) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("is not a chapter (chapters/NN_name.py or .ipynb)")
    )


def test_edit_keeps_a_named_twins_edit_that_jupytext_would_drop(
    scratch_repo: Path, nb_tool, capsys
):
    """Named as the edited file, a twin older than its (different) notebook is not
    overwritten by `jupytext --sync`, which takes the newer file's inputs."""
    twin = scratch_repo / SCRATCH_TWIN
    edit_twin(scratch_repo, "return 2 * x", "return x + x")
    os.utime(twin, (time.time() - 120, time.time() - 120))
    assert nb_tool.edit([twin], root=scratch_repo) == 1
    assert "return x + x" in twin.read_text()
    assert f"`touch {SCRATCH_TWIN}` to keep them" in capsys.readouterr().out


def test_edit_leaves_a_clean_chapter_as_it_is(scratch_repo: Path, nb_tool, capsys):
    paths = [
        scratch_repo / p
        for p in (
            "chapters/01_attention.ipynb",
            "chapters/01_attention.py",
            "transformer/attention.py",
        )
    ]
    before = [p.read_bytes() for p in paths]
    assert nb_tool.edit([paths[1]], root=scratch_repo) == 0
    assert [p.read_bytes() for p in paths] == before
    assert capsys.readouterr().out.splitlines()[-1] == (
        "ok: chapters/01_attention.py: synced, formatted, exported 1 module,"
        " lint clean, checks pass"
    )


def test_edit_names_the_chapters_whose_outputs_read_what_changed(
    scratch_repo: Path, nb_tool, capsys
):
    """A later chapter imports the scratch chapter's module (and another reads it through
    a module of the package that imports it): an edit that changes the module names both
    and the command that re-runs them; an edit that changes nothing names none."""
    code = nbformat.v4.new_code_cell
    lib = scratch_repo / "transformer"
    (lib / "scratch_quad.py").write_text(
        "from transformer.scratch_double import double\n\n\n"
        "def quad(x: int) -> int:\n    return double(double(x))\n"
    )
    readers = {
        "chapters/91_direct.ipynb": "from transformer.scratch_double import double",
        "chapters/92_through.ipynb": "from transformer import scratch_quad",
        "chapters/93_other.ipynb": "from transformer.attention import attend",
    }
    for name, source in readers.items():
        nbformat.write(
            nbformat.v4.new_notebook(cells=[code(source)]), scratch_repo / name
        )
    assert nb_tool.edit([scratch_repo / SCRATCH_TWIN], root=scratch_repo) == 0
    assert "stored outputs read" not in capsys.readouterr().out
    edit_twin(scratch_repo, "return 2 * x", "return x + x")
    nb_tool.edit([scratch_repo / SCRATCH_TWIN], root=scratch_repo)
    out = capsys.readouterr().out.splitlines()
    for reader in ("91_direct", "92_through"):
        assert (
            f"chapters/{reader}.ipynb: its stored outputs read"
            " transformer.scratch_double, which changed"
        ) in out
    assert not any("93_other" in line for line in out)
    stale = "chapters/91_direct.ipynb chapters/92_through.ipynb"
    assert out[-1].endswith(f'left: re-run `make execute NB="{stale}"`'), out[-1]
