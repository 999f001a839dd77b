"""Chapter tooling: export the package, check the notebooks, execute them.

    python tools/nb.py export [NB...] # transformer/<module>.py from the #| export cells
    python tools/nb.py check          # export in sync, twins in sync, notebooks clean
    python tools/nb.py execute NB...  # run chapters in place, storing their outputs
    python tools/nb.py setup-cells    # rewrite each chapter's Colab cell from _config.yml

The chapters are the source. `export` runs nbdev's `nb_export` (no nbdev project needed) on each
chapter; `check` exports into a scratch copy of the repository and compares, so a hand edit of a
generated module, or a chapter changed without `make export`, fails `make check` and the tests.
"""

from __future__ import annotations

import ast
import filecmp
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
PACKAGE = ROOT / "transformer"
# The generated modules' lint and format settings (the chapters', whose code they are).
PACKAGE_RUFF = ROOT / "transformer" / "ruff.toml"
# Modules of the package written by hand rather than exported from a chapter, as paths relative
# to transformer/ (a subpackage's modules sit in its folder: cli/translate.py).
HAND_WRITTEN = {"__init__.py", "__main__.py", "cli/__init__.py"}
SETUP_TAG = "colab-setup"  # the book hides its input: it matters in Colab only
# The widest code line the book's article column shows without scrolling sideways
# (14-px monospace in the column at a 1280-px window; chapters/ruff.toml formats to it).
CODE_WIDTH = 79
REMOVED = {"remove-cell", "remove-input"}


def chapter_paths(root: Path = ROOT) -> list[Path]:
    """The book's notebooks: the intro (a notebook with a Colab set-up cell too), then the
    chapters and appendices in order."""
    intro = [root / "intro.ipynb"] if (root / "intro.ipynb").exists() else []
    chapters = root / "chapters"
    # Parts I to III are NN_name, the appendices aNN_name: sorted, the book's order.
    found = [
        *chapters.glob("[0-9][0-9]_*.ipynb"),
        *chapters.glob("a[0-9][0-9]_*.ipynb"),
    ]
    return intro + sorted(found)


def export(root: Path = ROOT, notebooks: list[Path] | None = None) -> list[Path]:
    """Export every chapter, or only `notebooks`, into `root/transformer`; return the
    modules written."""
    from nbdev.export import nb_export
    from nbdev.maker import ModuleMaker

    def written_whole(*args, is_new: bool = True, **kwargs) -> ModuleMaker:
        # A cell `#| export name` sends code to a module other than the chapter's own. nbdev
        # would append it to an existing file; each module has one chapter, so write it whole.
        return ModuleMaker(*args, is_new=True, **kwargs)

    lib = root / "transformer"
    before = {name: (lib / name).stat().st_mtime_ns for name in module_names(lib)}
    for nb in notebooks or chapter_paths(root):
        # nbdev writes "File to edit: <chapter relative to lib>", the same in a scratch copy.
        nb_export(str(nb), lib_path=str(lib), mod_maker=written_whole)
    names = module_names(lib) - HAND_WRITTEN
    if notebooks:  # only what these chapters wrote
        names = {n for n in names if (lib / n).stat().st_mtime_ns != before.get(n)}
    modules = [lib / name for name in sorted(names)]
    for module in modules:
        package = ".".join(module.relative_to(root).parent.parts)
        text = absolute_imports(module.read_text(), package)
        module.write_text(short_header(docstring_first(text)))
    # Sorted imports and the chapters' formatting, by the package's own ruff settings (named
    # explicitly: a scratch copy of the repository has none of its own).
    ruff = [str(Path(sys.executable).with_name("ruff")), "--config", str(PACKAGE_RUFF)]
    files = [str(m) for m in modules]
    subprocess.run(
        [ruff[0], "check", *ruff[1:], "-q", "--select", "I", "--fix", *files],
        check=True,
    )
    subprocess.run([ruff[0], "format", *ruff[1:], "-q", *files], check=True)
    return modules


def module_names(lib: Path) -> set[str]:
    """The package's modules, subpackages' included, as paths relative to `lib`."""
    return {p.relative_to(lib).as_posix() for p in lib.rglob("*.py")}


def absolute_imports(text: str, package: str = "transformer") -> str:
    """nbdev turns some `from transformer.x import` lines into `from .x import` (or, in a
    subpackage such as `transformer.cli`, `from ..x import`): the chapters write them absolute,
    and so does the package. `package` is the module's own package."""
    parts = package.split(".")

    def absolute(match: re.Match) -> str:
        dots, name = match.group(2), match.group(3)
        base = parts[: len(parts) - (len(dots) - 1)]
        return f"{match.group(1)}from {'.'.join([*base, name])} import"

    return re.sub(r"^(\s*)from (\.+)(\w+) import", absolute, text, flags=re.M)


def short_header(text: str) -> str:
    """nbdev's first line, "# AUTOGENERATED! DO NOT EDIT! File to edit: <chapter>.", said in
    the width of the package's lines."""
    first, _, rest = text.partition("\n")
    chapter = first.rsplit(" ", 1)[-1].rstrip(".")
    # "../chapters/x.ipynb", or "../../chapters/x.ipynb" from a subpackage
    chapter = re.sub(r"^(\.\./)+", "", chapter)
    return f"# Generated from {chapter}: edit it, not this file.\n{rest}"


def docstring_first(text: str) -> str:
    """Move the module's docstring, which nbdev leaves in the first cell after `__all__`, to
    the top, where Python (and `help()`) looks for it."""
    tree = ast.parse(text)
    found = next(
        (
            node
            for node in tree.body
            if isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ),
        None,
    )
    if found is None or found is tree.body[0]:
        return text
    lines = text.splitlines(keepends=True)
    doc = lines[found.lineno - 1 : found.end_lineno]
    rest = lines[: found.lineno - 1] + lines[found.end_lineno :]
    # After nbdev's first line (which names the chapter), before `__all__`.
    return "".join(rest[:1] + doc + ["\n"] + rest[1:])


def export_drift(root: Path = ROOT) -> list[str]:
    """Names of modules whose committed text differs from a fresh export (or is stale)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        shutil.copytree(root / "chapters", scratch / "chapters")
        (scratch / "transformer").mkdir()
        export(scratch)
        fresh = module_names(scratch / "transformer") - HAND_WRITTEN
        committed = module_names(root / "transformer") - HAND_WRITTEN
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
    """Write `text` so that an interrupted run leaves the chapter as it was, not
    cut short (the chapters are the source). The text ends with a newline, as
    nbformat's and jupytext's writers end it."""
    from transformer.files import atomic_write

    if not text.endswith("\n"):
        text += "\n"
    atomic_write(path, text.encode("utf-8"))


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
        notebooks = [Path(a).resolve() for a in args] or None
        for module in export(notebooks=notebooks):
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
