"""The Colab path, taken as Colab takes it: a fresh Python with PyTorch and a Jupyter kernel but
without the project, a notebook run top to bottom from outside the repository, its first cell
cloning the repository and installing the package with the `[notebooks]` extra from the package
registries. The clone comes from a local repository holding the working tree as it is, so the
test checks what a push would publish; only the set-up cell's clone URL and target folder are
pointed at it. Nothing is cached between runs.

Also here: every box of the intro's architecture figure links to a page of the book."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import nb  # noqa: E402

# The intro and one quick chapter of each part.
NOTEBOOKS = [
    "intro.ipynb",
    "chapters/01_attention.ipynb",
    "chapters/12_schedule.ipynb",
    "chapters/14_decoding.ipynb",
]
# What Colab has installed that the project needs: PyTorch, and a kernel to run notebooks in.
# TORCH_CPU holds pip arguments, as in the Makefile (on CI machines this pin is a CPU build).
PREINSTALLED = [*shlex.split(os.environ.get("TORCH_CPU", "torch==2.13.0")), "ipykernel"]
COLAB_TARGET = 'where = "/content/transformer-book"'
KERNEL = "colab-test"
GIT = [
    "git",
    "-c",
    "user.name=Colab test",
    "-c",
    "user.email=colab-test@example.invalid",
    "-c",
    "commit.gpgsign=false",
    "-c",
    "init.defaultBranch=main",
]


def published(root: Path, into: Path) -> Path:
    """A git repository whose one commit holds the working tree: the files git tracks or would
    track (not what it ignores: .venv, _build, caches), as they are now, uncommitted edits
    included."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = root / name
        if (
            source.is_file()
        ):  # a tracked file deleted in the working tree is not published
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"]):
        subprocess.run([*GIT, *command], cwd=into, check=True)
    return into


def colab_python(venv: Path, env: dict[str, str]) -> Path:
    """A fresh virtual environment with only what Colab has preinstalled that the book needs."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", *PREINSTALLED]
    subprocess.run(install, check=True, env=env)
    return python


def kernel_spec(python: Path, jupyter_path: Path) -> None:
    """A Jupyter kernel named KERNEL that runs in `python`."""
    spec = jupyter_path / "kernels" / KERNEL
    spec.mkdir(parents=True)
    argv = [str(python), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    kernel = {"argv": argv, "display_name": "Colab test", "language": "python"}
    (spec / "kernel.json").write_text(json.dumps(kernel))


def as_in_colab(path: Path, url: str, clone: str, where: Path) -> nbformat.NotebookNode:
    """The notebook with its set-up cell cloning `clone` into `where`, and a last cell that
    prints where the package was imported from."""
    notebook = nbformat.read(path, as_version=4)
    cell = nb.first_code_cell(notebook)
    assert cell is not None and cell.source == nb.setup_cell_source(url), (
        f"{path.name}: its first code cell is not the Colab set-up"
    )
    for old, new in (
        (f'repo = "{url}"', f'repo = "{clone}"'),
        (COLAB_TARGET, f'where = "{where}"'),
    ):
        assert cell.source.count(old) == 1, f"{path.name}: no line {old!r}"
        cell.source = cell.source.replace(old, new)
    check = "import transformer\n\nprint(transformer.__file__)"
    notebook.cells.append(nbformat.v4.new_code_cell(check))
    return notebook


def errors(notebook: nbformat.NotebookNode) -> list[str]:
    return [
        f"cell {i}: {out.ename}: {out.evalue}"
        for i, cell in enumerate(notebook.cells)
        if cell.cell_type == "code"
        for out in cell.outputs
        if out.output_type == "error"
    ]


@pytest.mark.slow
def test_the_intro_and_a_chapter_of_each_part_run_in_colab(tmp_path: Path, monkeypatch):
    url = nb.repository_url()
    origin = published(ROOT, tmp_path / "origin")
    env = {
        k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}
    }
    env["PIP_NO_CACHE_DIR"] = "1"
    python = colab_python(tmp_path / "colab", env)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    kernel_spec(python, tmp_path / "jupyter")
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    content = (
        tmp_path / "content"
    )  # the kernel's working folder, outside the repository
    content.mkdir()
    where = content / "transformer-book"
    for name in NOTEBOOKS:
        notebook = as_in_colab(ROOT / name, url, origin.as_uri(), where)
        client = NotebookClient(
            notebook,
            timeout=600,
            kernel_name=KERNEL,
            record_timing=False,
            resources={"metadata": {"path": str(content)}},
        )
        client.execute(env=env)
        assert errors(notebook) == [], name
        imported = Path(notebook.cells[-1].outputs[0].text.strip())
        assert imported.resolve() == where.resolve() / "transformer" / "__init__.py", (
            name
        )
        # The next notebook starts as in a new Colab runtime: no package, no clone.
        uninstall = [str(python), "-m", "pip", "uninstall", "-q", "-y", "transformer"]
        subprocess.run(uninstall, check=True, env=env)
        shutil.rmtree(where)


def book_pages(entries: list[dict]) -> set[str]:
    pages = set()
    for entry in entries or []:
        if "file" in entry:
            pages.add(entry["file"])
        pages |= book_pages(entry.get("sections"))
    return pages


def test_the_architecture_figure_links_to_pages_of_the_book():
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = set().union(*(book_pages(part["chapters"]) for part in toc["parts"]))
    figure = (ROOT / "images" / "transformer.svg").read_text()
    links = re.findall(r'<a href="([^"]*)"', figure)
    assert len(links) >= 10
    for link in links:
        assert link.endswith(".html") and link.removesuffix(".html") in pages, link
