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
        "attention", "masking", "multihead", "embedding", "sublayers", "encoder",
        "decoder", "config", "model", "loss", "schedule", "plots",
        "config_checks", "decoder_cache", "attention_maps",
    },
    {
        "files", "multi30k", "vocabulary", "tokenizer", "batch_checks", "batches",
        "encoded", "cache", "bpe_dropout", "data", "checkpoint", "distributed",
        "french", "counts",
    },
    {
        "train_config", "loop", "validation", "training_data", "logs",
        "run_checkpoints", "train",
    },
    {"search_setup", "decode", "translation", "splits", "evaluate", "export"},
    {"cli", "deploy", "__main__", "__init__"},
]  # fmt: skip
LAYER = {module: k for k, layer in enumerate(LAYERS) for module in layer}
MODULES = sorted(PACKAGE.glob("*.py"))


def imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from transformer.X import name` of a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.level == 1:
                module = node.module
            elif node.module.startswith("transformer."):
                module = node.module.removeprefix("transformer.")
            else:
                continue
            found += [(module, alias.name) for alias in node.names]
    return found


def test_every_module_has_a_layer():
    assert {p.stem for p in MODULES} == set(LAYER)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_a_module_imports_only_its_layer_or_below(path: Path):
    upward = [m for m, _ in imports(path) if LAYER[m] > LAYER[path.stem]]
    assert upward == []
    assert [f"{m}.{n}" for m, n in imports(path) if n.startswith("_")] == []


def test_decoding_and_evaluation_never_import_training():
    training = LAYERS[2]
    for name in ("decode", "evaluate", "export"):
        assert {m for m, _ in imports(PACKAGE / f"{name}.py")} & training == set()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_modules_classes_and_functions_stay_small(path: Path):
    text = path.read_text()
    assert len(text.splitlines()) <= 700
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            most = 250 if isinstance(node, ast.ClassDef) else 100
            assert node.end_lineno - start + 1 <= most, node.name


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
