"""tools/nb.py, the chapters' tooling, leaves no half-written chapter."""

import importlib
import os
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
