"""Chapter tooling: export the package, check the notebooks, execute them, edit one.

    python tools/nb.py export [NB...] # transformer/<module>.py from the #| export cells
    python tools/nb.py check          # export in sync, twins in sync, notebooks clean
    python tools/nb.py execute NB...  # run chapters in place, storing their outputs
    python tools/nb.py setup-cells    # rewrite each chapter's Colab cell from _config.yml
    python tools/nb.py edit [--execute] NB...  # an edited chapter, synced to checked

`edit` (`make chapter NB=chapters/NN_name.py`) is the edit loop of one chapter, named by its
twin or its notebook: jupytext --sync (the newer file wins), ruff format of its code cells,
export of its modules only, ruff's findings and the column check reported by the twin's
lines, the chapter's own checks, and what is left (`--execute`: run it and store the
outputs). An edited code cell keeps its outputs but loses its execution count, so the chapter
reads as not executed until it runs again. It also names the other chapters whose stored
outputs read a module whose code the edit changed (directly or through the package's own
imports), with the command that re-runs them. It exits 1 when something is wrong.

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
from dataclasses import dataclass, field
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
    if not modules:  # ruff given no file would format the working directory
        return modules
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
    from transformer.atomic import atomic_write

    if not text.endswith("\n"):
        text += "\n"
    atomic_write(path, text.encode("utf-8"))


def notebook_problems(path: Path, url: str) -> list[str]:
    """What is wrong with one stored chapter: errors, out-of-order runs, stale twin or set-up."""
    nb = nbformat.read(path, as_version=4)
    chapter = path.parent.name == "chapters"
    name = path.relative_to(path.parent.parent) if chapter else path.name
    problems = [f"{name}: cell {i} {p}" for i, p in output_problems(nb)]
    problems += [f"{name}: {w}" for w in wide_code(nb)]
    if not ran_in_order(nb):
        problems.append(
            f"{name}: not executed top to bottom in one run (`make execute NB={name}`)"
        )
    problems += [f"{name}: {p}" for p in pairing_problems(path, nb, url)]
    return problems


def output_problems(nb) -> list[tuple[int, str]]:
    """(cell index, problem) for each stored error output or printed traceback."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "error":
                found.append((i, f"holds an error output ({out.ename})"))
            if (
                out.output_type == "stream"
                and out.name == "stderr"
                and "Traceback" in out.text
            ):
                found.append((i, "printed a traceback"))
    return found


def ran_in_order(nb) -> bool:
    """Whether the stored outputs come from one run, top to bottom: the code cells are
    numbered 1, 2, 3, ... (empty cells aside)."""
    counts = [
        c.execution_count
        for c in nb.cells
        if c.cell_type == "code" and c.source.strip()
    ]
    return not counts or counts == list(range(1, len(counts) + 1))


def pairing_problems(path: Path, nb, url: str) -> list[str]:
    """The Colab set-up cell and the py:percent twin, each as the chapter's text makes them."""
    import jupytext

    problems = []
    setup = first_code_cell(nb)
    if setup is None or setup.source != setup_cell_source(url):
        problems.append(
            "first code cell is not the Colab set-up (`tools/nb.py setup-cells`)"
        )
    twin = path.with_suffix(".py")
    if not twin.exists():
        problems.append("no py:percent twin (`make sync`)")
    elif twin.read_text() != jupytext.writes(nb, fmt="py:percent"):
        problems.append("its .py twin is out of sync (`make sync`)")
    return problems


def wide_code(nb) -> list[str]:
    """Code lines a reader sees that are wider than the column: in code cells
    the book shows, and in the fenced blocks of markdown cells."""
    return [
        f"cell {i} has a line of {len(line)} characters, wider than the"
        f" column ({CODE_WIDTH}): {line[:40]}"
        for i, _, line in wide_lines(nb)
    ]


def wide_lines(nb) -> list[tuple[int, int, str]]:
    """(cell index, line index in the cell, line) of each line that `wide_code` reports."""
    found = []
    for i, cell in enumerate(nb.cells):
        lines = cell.source.splitlines()
        if cell.cell_type == "code":
            if REMOVED & set(cell.metadata.get("tags", [])):
                continue
            shown = list(enumerate(lines))
        elif cell.cell_type == "markdown":
            shown = fenced_lines(lines)
        else:
            continue
        found += [(i, j, line) for j, line in shown if len(line) > CODE_WIDTH]
    return found


def fenced_lines(lines: list[str]) -> list[tuple[int, str]]:
    """(index, line) of the lines inside closed ``` blocks of a markdown cell."""
    found, block = [], None
    for j, line in enumerate(lines):
        if line.startswith("```"):
            if block is None:
                block = []
            else:
                found += block
                block = None
        elif block is not None:
            block.append((j, line))
    return found


def check(root: Path = ROOT) -> list[str]:
    url = repository_url(root)
    problems = export_drift(root)
    for path in chapter_paths(root):
        problems += notebook_problems(path, url)
    return problems


def execute(paths: list[Path], timeout: int = 1800) -> None:
    """Run each chapter top to bottom in a fresh kernel and store its outputs in place."""
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        print(f"executing {path} ...", flush=True)
        run_notebook(nb, path, timeout)
        _write_pair(path, nb)


def run_notebook(nb, path: Path, timeout: int = 1800) -> None:
    """Run `nb` (read from `path`) top to bottom in a fresh kernel, in its own folder."""
    from nbclient import NotebookClient

    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    ).execute()


# `edit`, the edit loop of one chapter (`make chapter NB=...`).


@dataclass
class Edit:
    """What `edit` did to one chapter, and what is wrong or left."""

    twin: str  # chapters/NN_name.py, as findings name it
    done: list[str] = field(default_factory=list)
    findings: int = 0  # ruff's and the column's, by twin line
    problems: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # other chapters reading a change

    def summary(self) -> str:
        if self.findings or self.problems:
            return (
                f"{self.twin}: {_count(self.findings, 'lint finding')},"
                f" {_count(len(self.problems), 'other problem')}"
            )
        return f"{self.twin}: {', '.join([*self.done, 'checks pass'])}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


class TwinLines:
    """Where each cell of a notebook stands in its py:percent twin, so that a finding in
    cell i, row r is reported at the line of the twin an author edits."""

    def __init__(self, nb, twin: str, notebook: str):
        import jupytext

        self.nb, self.twin, self.notebook = nb, twin, notebook
        self.lines = jupytext.writes(nb, fmt="py:percent").splitlines()
        # Each cell starts with a `# %%` line (after jupytext's YAML header), its source
        # below it line for line: markdown behind "# ", a magic commented out the same way.
        heads = [n for n, line in enumerate(self.lines, 1) if line.startswith("# %%")]
        self.heads = heads if len(heads) == len(nb.cells) else None

    def where(self, cell: int, row: int, col: int) -> str:
        """`twin:LINE:COL` for cell `cell` (0-based), row and column `row`, `col` (1-based)."""
        if self.heads is None:  # a twin laid out otherwise: name the notebook's cell
            return f"{self.notebook}:cell {cell}:{row}:{col}"
        line = self.heads[cell] + row
        source = self.nb.cells[cell].source.splitlines()
        text = self.lines[line - 1] if line <= len(self.lines) else ""
        if row <= len(source) and text == "# " + source[row - 1]:
            col += 2
        return f"{self.twin}:{line}:{col}"


def chapter_notebook(arg: str | Path, root: Path = ROOT) -> Path:
    """The notebook of a chapter named by its notebook or its twin; ValueError otherwise."""
    path = Path(arg).resolve()
    notebook = path.with_suffix(".ipynb")
    chapter = notebook.parent == root / "chapters" and re.fullmatch(
        r"a?[0-9][0-9]_.+", notebook.stem
    )
    if path.suffix not in {".py", ".ipynb"} or not (
        chapter or notebook == root / "intro.ipynb"
    ):
        raise ValueError(f"{arg} is not a chapter (chapters/NN_name.py or .ipynb)")
    if not (notebook.exists() or notebook.with_suffix(".py").exists()):
        raise ValueError(f"{arg} does not exist")
    return notebook


def edit(args: list[str | Path], root: Path = ROOT, run: bool = False) -> int:
    """Take each chapter, named by its twin or its notebook, from an edit to a checked
    chapter: sync the pair, format the code cells, export the chapter's modules, lint by the
    twin's lines, and check it (`run`: execute it too). Prints what it did, each finding and
    problem, what is left, and a one-line summary; returns 1 if anything is wrong."""
    root = root.resolve()
    try:
        notebooks = [chapter_notebook(a, root) for a in args]
    except ValueError as error:
        print(f"tools/nb.py edit: {error}", file=sys.stderr)
        return 2
    if not notebooks:
        print("tools/nb.py edit: name a chapter (chapters/NN_name.py)", file=sys.stderr)
        return 2
    edits = [
        _edit(path, root, run, twin_named=Path(a).suffix == ".py")
        for a, path in zip(args, notebooks, strict=True)
    ]
    failed = [e for e in edits if e.findings or e.problems]
    left = [e.twin for e in edits if e.left and e not in failed]
    clean = [e for e in edits if e not in failed]
    parts = [e.summary() for e in (edits if len(edits) == 1 else failed)]
    if len(edits) > 1 and clean:
        parts.append(
            f"{_count(len(clean), 'chapter')} synced, formatted, exported,"
            " lint clean, checks pass"
        )
    if left:
        parts.append(f"left: execute {', '.join(left)} (EXECUTE=1)")
    named = {str(Path(e.twin).with_suffix(".ipynb")) for e in edits}
    if stale := sorted({n for e in edits for n in e.stale} - named):
        parts.append(f'left: re-run `make execute NB="{" ".join(stale)}"`')
    print(f"{'FAILED' if failed else 'ok'}: {'; '.join(parts)}")
    return 1 if failed else 0


def _edit(path: Path, root: Path, run: bool, twin_named: bool) -> Edit:
    name = path.relative_to(root).as_posix()
    twin = path.with_suffix(".py")
    report = Edit(twin.relative_to(root).as_posix())

    def problem(text: str) -> None:
        report.problems.append(text)
        print(text, flush=True)

    # 1. Sync: jupytext takes the inputs from the newer file, outputs from the notebook. A
    # twin named as the edited file is not overwritten by an older edit of the notebook.
    if twin_named and _notebook_would_win(path, twin):
        problem(
            f"{name} is newer than {report.twin} and differs from it: syncing would"
            f" drop the twin's edits (`touch {report.twin}` to keep them)"
        )
        return report
    before = _code_sources(path) if path.exists() else []
    jupytext = Path(sys.executable).with_name("jupytext")
    source = path if path.exists() else path.with_suffix(".py")
    synced = subprocess.run(
        [str(jupytext), "--sync", "--quiet", str(source)],
        cwd=root,
        capture_output=True,
        text=True,
    )
    if synced.returncode:
        why = (synced.stderr.strip() or synced.stdout.strip()).splitlines()
        problem(f"{report.twin}: jupytext --sync failed: {why[-1] if why else '?'}")
        return report
    nb = nbformat.read(path, as_version=4)
    edited = _forget_runs_of_edited_cells(nb, before)
    report.done.append("synced")

    # 2. Format the code cells as `make check` wants them: imports sorted, ruff format.
    reformatted = _format_cells(nb, name, root)
    if edited or reformatted:
        _write_pair(path, nb)
    if reformatted:
        print(f"{report.twin}: formatted {_count(reformatted, 'code cell')}")
    report.done.append("formatted")

    # 3. Lint with the rules `make check` applies to the notebook, by twin line; a cell
    # that does not parse stops the export (nbdev would write a broken module).
    lines = TwinLines(nb, report.twin, name)
    findings, parses = _lint(nb, name, root, lines)
    if parses:
        exported = {m: _code(m.read_text()) for m in _modules_of(root, name)}
        written = export(root, [path])
        changed = {m for m in written if _changed(root, m, exported.get(m))}
        for module in written:
            print(f"{report.twin}: exported {module.relative_to(root).as_posix()}")
        count = _count(len(written), "module") if written else "no module"
        report.done.append(f"exported {count}")
        for stale in sorted(_modules_of(root, name) - set(written)):
            problem(
                f"{stale.relative_to(root).as_posix()} is generated from {name}, which no"
                " longer exports it: delete it"
            )
    else:
        problem(f"{report.twin}: not exported: a code cell does not parse")
    for finding in findings:
        print(finding, flush=True)
    report.findings = len(findings)
    if not findings:
        report.done.append("lint clean")

    # Execute on request, once nothing above is wrong (a run takes minutes).
    if run and not (findings or report.problems):
        print(f"{report.twin}: executing {name} ...", flush=True)
        error = _run_in_place(path, nb, lines)
        if error:
            problem(error)
        else:
            edited = 0
            report.done.append("executed")

    # 4. The chapter's own checks from `check`, by twin line where they name a cell, and the
    # other chapters whose stored outputs read a module this edit changed.
    nb = nbformat.read(path, as_version=4)
    for i, what in output_problems(nb):
        problem(f"{lines.where(i, 1, 1)} cell {what}")
    for what in pairing_problems(path, nb, repository_url(root)):
        problem(f"{name}: {what}")
    if not ran_in_order(nb):
        why = f", {_count(edited, 'code cell')} edited since the run" if edited else ""
        report.left.append(
            f"left: {name} is not executed top to bottom{why}:"
            f" `make chapter NB={report.twin} EXECUTE=1`"
        )
        print(report.left[-1], flush=True)
    if parses:
        _report_stale(root, path, changed, report)
    return report


def _notebook_would_win(path: Path, twin: Path) -> bool:
    """Whether `jupytext --sync` would take the inputs from the notebook rather than from
    its twin, and so rewrite the twin's text."""
    import jupytext

    if not (path.exists() and twin.exists()):
        return False
    if twin.stat().st_mtime >= path.stat().st_mtime:
        return False
    nb = nbformat.read(path, as_version=4)
    return twin.read_text() != jupytext.writes(nb, fmt="py:percent")


def _code_sources(path: Path) -> list[str]:
    nb = nbformat.read(path, as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "code"]


def _forget_runs_of_edited_cells(nb, before: list[str]) -> int:
    """Clear the execution count of each code cell whose source is not among `before`
    (jupytext keeps the outputs of an edited cell), so that the chapter reads as not run
    top to bottom until it is executed again; return how many."""
    from collections import Counter

    unchanged = Counter(before)
    edited = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if unchanged[cell.source]:
            unchanged[cell.source] -= 1
        elif cell.source.strip() and cell.execution_count is not None:
            cell.execution_count = None
            edited += 1
    return edited


def _ruff_notebook(args: list[str], nb_json: str, name: str, root: Path):
    """ruff over a notebook given as text, as if it were the file `name` of `root`: the
    settings and per-file ignores are those `ruff check .` finds for that file."""
    ruff = Path(sys.executable).with_name("ruff")
    return subprocess.run(
        [str(ruff), *args, "--stdin-filename", name],
        input=nb_json,
        capture_output=True,
        text=True,
        cwd=root,
    )


def _format_cells(nb, name: str, root: Path) -> int:
    """Sort the imports and format the code cells of `nb` in place; return how many changed
    (0 where a cell does not parse: the lint says where)."""
    text = nbformat.writes(nb)
    fix = ["check", "--select", "I", "--fix", "--exit-zero", "-q"]
    sorted_ = _ruff_notebook(fix, text, name, root)
    formatted = _ruff_notebook(["format", "-q"], sorted_.stdout or text, name, root)
    if sorted_.returncode or formatted.returncode:
        return 0
    new = nbformat.reads(formatted.stdout, as_version=4)
    changed = 0
    for cell, done in zip(nb.cells, new.cells, strict=True):
        if cell.cell_type == "code" and cell.source != done.source:
            cell.source = done.source
            changed += 1
    return changed


def _lint(nb, name: str, root: Path, lines: TwinLines) -> tuple[list[str], bool]:
    """ruff's findings and the lines wider than the book's column, as `twin:LINE:COL CODE
    message` in the twin's order, and whether every code cell parses."""
    import json

    args = ["check", "--output-format", "json", "--exit-zero", "--no-fix"]
    linted = _ruff_notebook(args, nbformat.writes(nb), name, root)
    if linted.returncode:
        why = linted.stderr.strip().splitlines()
        return [f"{lines.twin}:1:1 ruff {why[-1] if why else 'failed'}"], False
    found, parses, long_lines = [], True, set()
    for d in json.loads(linted.stdout):
        code = d.get("code") or "invalid-syntax"
        parses = parses and code != "invalid-syntax"
        cell, at = d["cell"] - 1, d["location"]  # ruff counts cells from 1
        if code == "E501":
            long_lines.add((cell, at["row"]))
        found.append((cell, at["row"], at["column"], f"{code} {d['message']}"))
    for cell, j, line in wide_lines(nb):
        if (cell, j + 1) not in long_lines:
            found.append(
                (
                    cell,
                    j + 1,
                    CODE_WIDTH + 1,
                    f"width line of {len(line)} characters, wider than the"
                    f" book's column ({CODE_WIDTH})",
                )
            )
    found.sort(key=lambda f: f[:3])
    return [f"{lines.where(c, r, k)} {what}" for c, r, k, what in found], parses


def _modules_of(root: Path, notebook: str) -> set[Path]:
    """The package's modules whose header names `notebook` as their source."""
    header = f"# Generated from {notebook}:"
    lib = root / "transformer"
    return {
        lib / name
        for name in module_names(lib) - HAND_WRITTEN
        if (lib / name).read_text().startswith(header)
    }


# Which chapters' stored outputs read a module: an edit that changes a module leaves them stale.


def _dotted(root: Path, module: Path) -> str:
    """transformer/cli/train.py -> transformer.cli.train (a package's __init__ its name)."""
    parts = list(module.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(source: str, known: set[str]) -> set[str]:
    """The package's modules (of `known`) that `source` imports: `import transformer.x`,
    `from transformer.x import y`, `from transformer import x`, and, for `-m transformer`,
    the command line's modules, which it imports by name when a command runs."""
    code = "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line
        for line in source.splitlines()
    )
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    if re.search(r"""-m['"]?,?\s*['"]?transformer\b""", source):
        found |= {name for name in known if name.startswith("transformer.cli")}
    return found & known


def stale_readers(root: Path, changed: set[Path], edited: Path) -> dict[Path, set[str]]:
    """The notebooks other than `edited` whose code imports a module of `changed`, directly
    or through the package's own imports, each with the changed modules it reads."""
    lib = root / "transformer"
    modules = {_dotted(root, lib / n): lib / n for n in module_names(lib)}
    known = set(modules)
    imports = {
        name: _imported(path.read_text(), known) for name, path in modules.items()
    }
    reads = {
        _dotted(root, m): {_dotted(root, m)} for m in changed
    }  # module -> changed ones
    grew = True
    while grew:  # close over the package's imports: who reads a reader of a change
        grew = False
        for name, uses in imports.items():
            through = set().union(*(reads.get(u, set()) for u in uses)) - reads.get(
                name, set()
            )
            if through:
                reads[name] = reads.get(name, set()) | through
                grew = True
    found = {}
    for notebook in chapter_paths(root):
        if notebook == edited:
            continue
        nb = nbformat.read(notebook, as_version=4)
        uses = set().union(
            *(_imported(c.source, known) for c in nb.cells if c.cell_type == "code")
        )
        if hit := set().union(*(reads.get(u, set()) for u in uses)):
            found[notebook] = hit
    return found


def _code(text: str | None) -> str | None:
    """A module's code as Python reads it: a change in a comment or in the layout is none."""
    try:
        return None if text is None else ast.dump(ast.parse(text))
    except SyntaxError:
        return text


def _changed(root: Path, module: Path, before: str | None) -> bool:
    """Whether `module`'s code differs from `before` (the edit's) or from the last commit."""
    now, committed = _code(module.read_text()), _committed(root, module)
    return now != before or (committed is not None and now != committed)


def _committed(root: Path, module: Path) -> str | None:
    """`module`'s code at the last commit (None where it is new or `root` has no git): the
    code that the chapters' stored outputs were made with."""
    shown = subprocess.run(
        ["git", "show", f"HEAD:{module.relative_to(root).as_posix()}"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    return None if shown.returncode else _code(shown.stdout)


def _report_stale(root: Path, path: Path, changed: set[Path], report: Edit) -> None:
    """Name the other chapters whose stored outputs read a module this edit changed, and
    the command that re-runs them."""
    readers = stale_readers(root, changed, path)
    if not readers:
        return
    for notebook, modules in readers.items():
        print(
            f"{notebook.relative_to(root).as_posix()}: its stored outputs read"
            f" {', '.join(sorted(modules))}, which changed",
            flush=True,
        )
    report.stale = [n.relative_to(root).as_posix() for n in readers]
    print(
        f"left: re-run {_count(len(readers), 'other chapter')} that read what changed:"
        f' `make execute NB="{" ".join(report.stale)}"`',
        flush=True,
    )


def _run_in_place(path: Path, nb, lines: TwinLines) -> str | None:
    """Execute the chapter and store its outputs; None, or the one-line error of the cell
    that failed."""
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    try:
        run_notebook(nb, path)
    except (CellExecutionError, CellTimeoutError) as error:
        failed = [
            i
            for i, cell in enumerate(nb.cells)
            if any(out.output_type == "error" for out in cell.get("outputs", []))
        ]
        where = (
            lines.where(failed[0], _error_row(nb.cells[failed[0]]), 1)
            if failed
            else lines.twin
        )
        first = str(getattr(error, "evalue", "") or error).strip().splitlines()
        return f"{where} execution failed: {getattr(error, 'ename', 'error')}: " + (
            first[0] if first else ""
        )
    _write_pair(path, nb)
    return None


def _error_row(cell) -> int:
    """The line of the cell that raised, from IPython's traceback ("Cell In[3], line 2")."""
    for out in cell.get("outputs", []):
        for frame in out.get("traceback", []) if out.output_type == "error" else []:
            plain = re.sub(r"\x1b\[[0-9;]*m", "", frame)
            if found := re.search(r"Cell In\[\d*\], line (\d+)", plain):
                return int(found[1])
    return 1


def main(argv: list[str]) -> int:
    commands = {"export", "check", "execute", "setup-cells", "edit"}
    if not argv or argv[0] not in commands:
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
    elif command == "edit":
        run = "--execute" in args
        return edit([a for a in args if a != "--execute"], run=run)
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
