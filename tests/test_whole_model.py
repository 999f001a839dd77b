"""The page "The whole model on one page" shows the package's own code: every listing is an
object of the package, every kind of layer that a Transformer is built from is on it, and it
stays about 200 lines long."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import torch

from transformer.config import TransformerConfig
from transformer.model import Transformer

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "chapters" / "09_whole_model.md"
INCLUDE = re.compile(
    r"```\{literalinclude\} (?P<path>\S+)\n(?P<options>(?::\w+: .*\n)*)```"
)


def listings() -> list[tuple[Path, str]]:
    """(file, object) of every listing on the page, in order."""
    found = []
    for m in INCLUDE.finditer(PAGE.read_text()):
        options = dict(re.findall(r":(\w+): (.*)", m.group("options")))
        found.append(((PAGE.parent / m.group("path")).resolve(), options["pyobject"]))
    return found


def definition(path: Path, dotted: str) -> ast.AST | None:
    """The class or function `dotted` ("Class.method") defined in `path`, or None."""
    body = ast.parse(path.read_text()).body
    node = None
    for part in dotted.split("."):
        node = next(
            (n for n in body if isinstance(n, ast.ClassDef | ast.FunctionDef)
             and n.name == part),
            None,
        )  # fmt: skip
        if node is None:
            return None
        body = node.body
    return node


def test_every_listing_is_an_object_of_the_package():
    found = listings()
    assert len(found) >= 10
    for path, name in found:
        assert path.parent == ROOT / "transformer", path
        assert definition(path, name) is not None, f"{path.name}: {name}"


def test_every_kind_of_layer_of_the_model_is_on_the_page():
    with torch.device("meta"):
        model = Transformer(TransformerConfig(src_vocab_size=100))
    kinds = {
        type(m).__name__
        for m in model.modules()
        if type(m).__module__.startswith("transformer.")
    }
    shown = {name.split(".")[0] for _, name in listings()}
    assert kinds <= shown, kinds - shown


def test_the_page_shows_about_200_lines_of_code():
    lines = 0
    for path, name in listings():
        node = definition(path, name)
        lines += node.end_lineno - node.lineno + 1
    assert 150 <= lines <= 240, lines
