"""The package's shape: small modules with one job, and layers that point one way.

Layers, bottom to top: the model core; files, tokenizer, data and checkpoints; training;
decoding and evaluation; the command line. A module imports only from its own layer or below,
and never another module's private (underscore) names."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "transformer"
LAYERS = [
    {
        "attention", "masking", "attention_config", "multihead", "embedding",
        "layer_config", "sublayers", "encoder", "decoder", "config", "model", "loss",
        "schedule", "plots", "config_checks", "knockout",
    },
    {
        "paths", "atomic", "records", "layout", "multi30k", "checked_data", "vocabulary",
        "tokenizer",
        "checked_batches", "batches", "encoded_split", "encoded_cache", "bpe_dropout",
        "checkpoint", "distributed", "spacy_french", "words", "flops",
    },
    {
        "train_config", "training_loop", "validation", "epoch_data", "logs",
        "training_checkpoints", "rdrop", "trainer", "trainer_optimizer", "trainer_step",
        "precision",
    },
    {
        "paper_search", "decode_options", "kv_cache", "decode", "search_setup",
        "batched_step", "batched_search",
        "translation", "split_translation", "evaluate", "ctranslate2",
    },
    {
        "cli", "cli.base", "cli.main", "cli.prepare", "cli.train", "cli.translate",
        "cli.evaluate", "cli.ctranslate2", "__main__", "__init__",
    },
]  # fmt: skip
LAYER = {module: k for k, layer in enumerate(LAYERS) for module in layer}
MODULES = sorted(PACKAGE.rglob("*.py"))


def name(path: Path) -> str:
    """A module's name in the package: "decode", "cli.translate"; a subpackage's
    __init__ is the subpackage, "cli"."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if len(parts) > 1 and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from transformer.X import name` of a module,
    those inside functions included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level == 1:
                package = name(path).rpartition(".")[0]
                module = f"{package}.{node.module}".lstrip(".")
            elif node.module.startswith("transformer."):
                module = node.module.removeprefix("transformer.")
            elif node.module == "transformer":  # from transformer import decode
                found += [(a.name, "") for a in node.names if a.name in LAYER]
                continue
            else:
                continue
            found += [(module, alias.name) for alias in node.names]
    return found


def test_every_module_has_a_layer():
    assert {name(p) for p in MODULES} == set(LAYER)


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_a_module_imports_only_its_layer_or_below(path: Path):
    upward = [m for m, _ in imports(path) if LAYER[m] > LAYER[name(path)]]
    assert upward == []
    assert [f"{m}.{n}" for m, n in imports(path) if n.startswith("_")] == []


def test_decoding_and_evaluation_never_import_training():
    training = LAYERS[2]
    for module in (
        "kv_cache", "decode", "batched_search", "evaluate", "ctranslate2",
        "decode_options",
    ):  # fmt: skip
        assert {m for m, _ in imports(PACKAGE / f"{module}.py")} & training == set()


def test_no_import_circle():
    """No module reaches itself through the package's imports, those inside
    functions included."""
    graph = {name(p): {m for m, _ in imports(p)} for p in MODULES}

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        for m in graph.get(start, ()):
            if m == goal or (m not in seen and reaches(m, goal, seen | {m})):
                return True
        return False

    assert [m for m in graph if reaches(m, m, {m})] == []


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("cli/*.py")), ids=name)
def test_no_command_module_is_over_250_lines(path: Path):
    assert len(path.read_text().splitlines()) <= 250


@pytest.mark.parametrize("path", MODULES, ids=name)
def test_modules_classes_and_functions_stay_small(path: Path):
    """At most 500 lines a module, 200 a class and 80 a function."""
    text = path.read_text()
    assert len(text.splitlines()) <= 500
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            most = 200 if isinstance(node, ast.ClassDef) else 80
            assert node.end_lineno - start + 1 <= most, node.name


def test_the_package_has_no_unused_import():
    """The generated modules are linted as written ones: an import that no
    line uses fails."""
    ruff = Path(sys.executable).with_name("ruff")
    done = subprocess.run(
        [str(ruff), "check", "--select", "F401", "--no-cache", str(PACKAGE)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


def test_every_public_name_is_found_where_the_package_says():
    import transformer

    for name in transformer.__all__:
        assert getattr(transformer, name).__name__ == name
    with pytest.raises(AttributeError, match="no_such_name"):
        transformer.no_such_name  # noqa: B018


def test_importing_the_package_loads_no_module_of_it():
    """The package's names are found when first used: importing it costs
    nothing, so that the command line can answer `--help` at once."""
    code = "import sys, transformer; print(sorted(sys.modules))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "'torch'" not in loaded and "'transformer.model'" not in loaded


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["translate", "--help"], ["translate", "--pair", "xx-en", "x"],
     ["translate", "--pair", "de-en", "--beam", "0", "x"], ["nosuchcommand"]],
)  # fmt: skip
def test_help_and_usage_errors_load_neither_torch_nor_spacy(argv):
    """`--help` and a usage error answer at once: the command line imports a
    command's module only when it runs, and torch once its options are good."""
    code = (
        "import sys\n"
        "from transformer.cli.main import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'spacy') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "[]"
