"""Chapter tooling: export the package, check the notebooks, execute them.

    python tools/nb.py export         # transformer/<module>.py from the #| export cells
    python tools/nb.py check          # export in sync, twins in sync, notebooks clean
    python tools/nb.py execute NB...  # run chapters in place, storing their outputs
    python tools/nb.py setup-cells    # rewrite each chapter's Colab cell from _config.yml

The chapters are the source. `export` runs nbdev's `nb_export` (no nbdev project needed) on each
chapter; `check` exports into a scratch copy of the repository and compares, so a hand edit of a
generated module, or a chapter changed without `make export`, fails `make check` and the tests.
"""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "transformer"
# Modules of the package written by hand rather than exported from a chapter.
HAND_WRITTEN = {"__init__.py", "__main__.py"}
SETUP_TAG = "colab-setup"  # the book hides its input: it matters in Colab only
# The widest code line the book's article column shows without scrolling sideways
# (14-px monospace in the column at a 1280-px window; chapters/ruff.toml formats to it).
CODE_WIDTH = 79
REMOVED = {"remove-cell", "remove-input"}


def chapter_paths(root: Path = ROOT) -> list[Path]:
    """The book's notebooks: the intro (a notebook with a Colab set-up cell too), then the
    chapters and appendices in order."""
    intro = [root / "intro.ipynb"] if (root / "intro.ipynb").exists() else []
    return intro + sorted((root / "chapters").glob("[0-9][0-9]_*.ipynb"))


def export(root: Path = ROOT) -> list[Path]:
    """Export every chapter into `root/transformer`; return the modules written."""
    from nbdev.export import nb_export
    from nbdev.maker import ModuleMaker

    def written_whole(*args, is_new: bool = True, **kwargs) -> ModuleMaker:
        # A cell `#| export name` sends code to a module other than the chapter's own. nbdev
        # would append it to an existing file; each module has one chapter, so write it whole.
        return ModuleMaker(*args, is_new=True, **kwargs)

    lib = root / "transformer"
    for nb in chapter_paths(root):
        # nbdev writes "File to edit: <chapter relative to lib>", the same in a scratch copy.
        nb_export(str(nb), lib_path=str(lib), mod_maker=written_whole)
    return sorted(p for p in lib.glob("*.py") if p.name not in HAND_WRITTEN)


def export_drift(root: Path = ROOT) -> list[str]:
    """Names of modules whose committed text differs from a fresh export (or is stale)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        shutil.copytree(root / "chapters", scratch / "chapters")
        (scratch / "transformer").mkdir()
        export(scratch)
        fresh = {p.name for p in (scratch / "transformer").glob("*.py")}
        committed = {p.name for p in (root / "transformer").glob("*.py")} - HAND_WRITTEN
        problems = []
        for name in sorted(fresh | committed):
            a, b = root / "transformer" / name, scratch / "transformer" / name
            if name not in committed:
                problems.append(f"transformer/{name} is missing: run `make export`")
            elif name not in fresh:
                problems.append(
                    f"transformer/{name} is exported by no chapter: delete it"
                )
            elif not filecmp.cmp(a, b, shallow=False):
                problems.append(
                    f"transformer/{name} differs from its chapter: run `make export`"
                )
        return problems


def repository_url(root: Path = ROOT) -> str:
    """The repository's URL, kept in one place: `repository.url` in _config.yml."""
    import yaml

    config = yaml.safe_load((root / "_config.yml").read_text())
    return config["repository"]["url"].rstrip("/")


def setup_cell_source(url: str) -> str:
    """The first code cell of every chapter: installs the project in Colab, nothing elsewhere."""
    return (
        "# Colab set-up: clone and install the book's package when it is not installed.\n"
        "# Elsewhere (a local clone after `make book`) this cell does nothing.\n"
        "import importlib.util\n"
        "\n"
        'if importlib.util.find_spec("transformer") is None:\n'
        "    import subprocess\n"
        "    import sys\n"
        "\n"
        f'    repo = "{url}"\n'
        '    where = "/content/transformer-book"\n'
        '    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)\n'
        "    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs\n"
        '    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]\n'
        '    subprocess.run([*pip, where + "[notebooks]"], check=True)\n'
        "    # An editable install is seen only after a restart.\n"
        "    sys.path.insert(0, where)"
    )


def first_code_cell(nb) -> nbformat.NotebookNode | None:
    return next((c for c in nb.cells if c.cell_type == "code"), None)


def setup_cells(root: Path = ROOT) -> None:
    source = setup_cell_source(repository_url(root))
    for path in chapter_paths(root):
        nb = nbformat.read(path, as_version=4)
        cell = first_code_cell(nb)
        if cell is None or SETUP_TAG not in cell.metadata.get("tags", []):
            cell = nbformat.v4.new_code_cell(
                source, metadata={"tags": [SETUP_TAG, "hide-input"]}
            )
            first_md = next(
                i for i, c in enumerate(nb.cells) if c.cell_type == "markdown"
            )
            nb.cells.insert(first_md + 1, cell)
        cell.source = source
        _write_pair(path, nb)


def _write_pair(path: Path, nb) -> None:
    """The notebook and its py:percent twin, as `nbformat.write` and `jupytext.write` would
    write them, each atomically."""
    import jupytext

    _write_text(path, nbformat.writes(nb))
    _write_text(path.with_suffix(".py"), jupytext.writes(nb, fmt="py:percent"))


def _write_text(path: Path, text: str) -> None:
    """Write `text` into a temporary file beside `path`, then rename it over `path`: the
    chapters are the source, and an interrupted run must leave one as it was, not cut short.
    The text ends with a newline, as nbformat's and jupytext's writers end it; the file keeps
    its permissions (a new one gets those `open` would give it). This tool does not import
    the package, whose helper does the same: it must run while the package is broken."""
    if not text.endswith("\n"):
        text += "\n"
    if path.exists():
        mode = stat.S_IMODE(path.stat().st_mode)
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def notebook_problems(path: Path, url: str) -> list[str]:
    """What is wrong with one stored chapter: errors, out-of-order runs, stale twin or set-up."""
    import jupytext

    nb = nbformat.read(path, as_version=4)
    chapter = path.parent.name == "chapters"
    name = path.relative_to(path.parent.parent) if chapter else path.name
    problems = []
    counts = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                problems.append(f"{name}: cell {i} holds an error output ({out.ename})")
            if (
                out.output_type == "stream"
                and out.name == "stderr"
                and "Traceback" in out.text
            ):
                problems.append(f"{name}: cell {i} printed a traceback")
        if cell.source.strip():
            counts.append(cell.execution_count)
    problems += [f"{name}: {w}" for w in wide_code(nb)]
    if counts and (None in counts or counts != list(range(1, len(counts) + 1))):
        problems.append(
            f"{name}: not executed top to bottom in one run (`make execute NB={name}`)"
        )
    setup = first_code_cell(nb)
    if setup is None or setup.source != setup_cell_source(url):
        problems.append(
            f"{name}: first code cell is not the Colab set-up (`tools/nb.py setup-cells`)"
        )
    twin = path.with_suffix(".py")
    if not twin.exists():
        problems.append(f"{name}: no py:percent twin (`make sync`)")
    elif twin.read_text() != jupytext.writes(nb, fmt="py:percent"):
        problems.append(f"{name}: its .py twin is out of sync (`make sync`)")
    return problems


def wide_code(nb) -> list[str]:
    """Code lines a reader sees that are wider than the column: in code cells
    the book shows, and in the fenced blocks of markdown cells."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if REMOVED & set(cell.metadata.get("tags", [])):
                continue
            lines = cell.source.splitlines()
        elif cell.cell_type == "markdown":
            blocks = re.findall(r"^```[^\n]*\n(.*?)^```", cell.source, re.M | re.S)
            lines = "".join(blocks).splitlines()
        else:
            continue
        found += [
            f"cell {i} has a line of {len(line)} characters, wider than the"
            f" column ({CODE_WIDTH}): {line[:40]}"
            for line in lines
            if len(line) > CODE_WIDTH
        ]
    return found


def check(root: Path = ROOT) -> list[str]:
    url = repository_url(root)
    problems = export_drift(root)
    for path in chapter_paths(root):
        problems += notebook_problems(path, url)
    return problems


def execute(paths: list[Path], timeout: int = 1800) -> None:
    """Run each chapter top to bottom in a fresh kernel and store its outputs in place."""
    from nbclient import NotebookClient

    for path in paths:
        nb = nbformat.read(path, as_version=4)
        print(f"executing {path} ...", flush=True)
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name="python3",
            record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
        _write_pair(path, nb)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in {"export", "check", "execute", "setup-cells"}:
        print(__doc__)
        return 2
    command, args = argv[0], argv[1:]
    if command == "export":
        for module in export():
            print(f"exported {module.relative_to(ROOT)}")
    elif command == "setup-cells":
        setup_cells()
    elif command == "execute":
        execute([Path(a).resolve() for a in args] or chapter_paths())
    elif command == "check":
        problems = check()
        for p in problems:
            print(p, file=sys.stderr)
        if problems:
            return 1
        print(
            f"{len(chapter_paths())} chapters clean; transformer/ matches a fresh export"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
