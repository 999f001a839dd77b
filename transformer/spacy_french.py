# Generated from chapters/a03_text_and_tokenizer.ipynb: edit it, not this file.
"""spaCy's French tokenizer, built in a fraction of a second: the same rules
as `spacy.blank("fr")`, whose one slow regular expression is rewritten to
match the same words."""

# %% auto #0
__all__ = ["BIG_CLASS", "regroup", "SourceChanged", "french_tokenizer"]

# %% ../chapters/a03_text_and_tokenizer.ipynb #e5639615

import ast
import re
import warnings
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import spacy
import spacy.lang
from spacy.language import BaseDefaults
from spacy.tokenizer import Tokenizer
from spacy.util import (
    compile_infix_regex,
    compile_prefix_regex,
    compile_suffix_regex,
)
from spacy.vocab import Vocab

# A character class this long (in the pattern's text) is what makes a
# pattern slow to compile; `regroup` factors out these and no others.
BIG_CLASS = 256

# What may follow a class and belongs to it: *, +, ?, {m,n}, and the lazy
# (?) or possessive (+) form of each.
_QUANTIFIER = re.compile(r"(?:[*+?]|\{\d*(?:,\d*)?\})[?+]?")
# Inline flags that apply to a whole pattern, such as spaCy's "(?iu)".
_GLOBAL_FLAGS = re.compile(r"\(\?[aiLmsux]+\)")


# One unit of a pattern: an escape, a character class (where "]" is
# literal first, after any "^"), or any other single character.
_UNIT = re.compile(r"\\.|\[\^?\]?[^\\\]]*(?:\\.[^\\\]]*)*\]|.", re.DOTALL)


def _units(pattern: str) -> Iterator[tuple[int, int]]:
    """The spans of `pattern`'s units: an escape, a character class, or
    any other single character (a parenthesis, "|", a literal...)."""
    for unit in _UNIT.finditer(pattern):
        yield unit.span()


def _depths(pattern: str) -> Iterator[tuple[str, int]]:
    """Each unit of `pattern` with the depth of parentheses after it."""
    depth = 0
    for i, end in _units(pattern):
        unit = pattern[i:end]
        depth += {"(": 1, ")": -1}.get(unit, 0)
        yield unit, depth


def _alternatives(pattern: str) -> list[str]:
    """`pattern` cut at each "|" outside parentheses and classes."""
    pieces, piece = [], []
    for unit, depth in _depths(pattern):
        if unit == "|" and depth == 0:
            pieces.append("".join(piece))
            piece = []
        else:
            piece.append(unit)
    pieces.append("".join(piece))
    return pieces


def _unwrapped(pattern: str) -> str:
    """`pattern` without a "(?:...)" around all of it, if it has one."""
    depths = [depth for _, depth in _depths(pattern)]
    if pattern.startswith("(?:") and depths.index(0) == len(depths) - 1:
        return pattern[3:-1]
    return pattern


def _refers_to_groups(pattern: str) -> bool:
    """Whether `pattern` refers to a group by number or name: merging
    alternatives renumbers groups, and so `regroup` leaves it be."""
    return (
        "(?P=" in pattern
        or "(?(" in pattern
        or any(re.fullmatch(r"\\[1-9]", unit) for unit, _ in _depths(pattern))
    )


def _depth_after(pattern: str) -> int:
    """The depth of parentheses at the end of `pattern`."""
    depths = [depth for _, depth in _depths(pattern)]
    return depths[-1] if depths else 0


# %% ../chapters/a03_text_and_tokenizer.ipynb #f6b15fb8
def _mergeable(fragment: str) -> bool:
    """Whether `fragment`, found outside all parentheses of its alternative
    (so under no quantifier), means the same as one option of
    "(?:...|...)": its parentheses balance, it has no "|" of its own
    outside them, and it starts with no quantifier, which would apply to
    what came before it."""
    if fragment[:1] in ("*", "+", "?", "{"):
        return False
    lowest = depth = 0
    for unit, depth in _depths(fragment):
        lowest = min(lowest, depth)
        if unit == "|" and depth == 0:
            return False
    return lowest == 0 and depth == 0


def _stand_in_for_big_classes(pattern: str) -> tuple[str, dict[str, str]]:
    """`pattern` with each big class (and its quantifier) replaced by one
    character of Unicode's private use area that `pattern` does not use,
    and the classes by character: one pass over the long pattern, so that
    the rest of `regroup` reads a short one."""
    free = (chr(c) for c in range(0xE000, 0xF900) if chr(c) not in pattern)
    stand_ins: dict[str, str] = {}
    pieces, start = [], 0
    for i, end in _units(pattern):
        if i < start:  # the quantifier of a class already taken
            continue
        if pattern[i] == "[" and end - i >= BIG_CLASS:
            quantifier = _QUANTIFIER.match(pattern, end)
            stop = quantifier.end() if quantifier else end
            big_class = pattern[i:stop]
            if big_class not in stand_ins:
                stand_ins[big_class] = next(free)
            pieces += [pattern[start:i], stand_ins[big_class]]
            start = stop
    pieces.append(pattern[start:])
    return "".join(pieces), {c: s for s, c in stand_ins.items()}


def regroup(pattern: str) -> str:
    """A pattern that matches the same strings as the alternation `pattern`
    but writes each big character class once per group of alternatives.

    Alternatives that have the same big classes in the same order and
    differ in one text between them (`^anti-[a-z…]+$`, `^auto-[a-z…]+$`)
    become one alternative with that text alternated
    (`^(?:anti|auto)-[a-z…]+$`). Alternatives that cannot be merged so are
    kept as they are. `re` takes time for each copy of a big class that it
    compiles, and little for the number of alternatives.
    """
    flags = _GLOBAL_FLAGS.match(pattern)
    head = flags.group() if flags else ""
    if "x" in head:  # verbose: spaces and "#" would need reading apart
        return pattern
    short, classes = _stand_in_for_big_classes(pattern[len(head) :])
    if not classes or _refers_to_groups(short):
        return pattern
    cut = re.compile(f"[{''.join(classes)}]")
    # alternatives by their big classes: the texts between those classes
    groups: dict[tuple[str, ...], list[list[str]]] = {}
    for alternative in _alternatives(short):
        alternative = _unwrapped(alternative)
        key = tuple(cut.findall(alternative))
        groups.setdefault(key, []).append(cut.split(alternative))
    merged = []
    for key, members in groups.items():
        differ = [
            j
            for j in range(len(key) + 1)
            if len({texts[j] for texts in members}) > 1
        ]
        if (
            len(differ) == 1
            and _depth_after("".join(members[0][: differ[0]])) == 0
            and all(_mergeable(texts[differ[0]]) for texts in members)
        ):
            j = differ[0]
            options = dict.fromkeys(texts[j] for texts in members)
            texts = list(members[0])
            texts[j] = "(?:" + "|".join(options) + ")"
            members = [texts]
        for texts in members:
            pieces = [texts[0]]
            for stand_in, text in zip(key, texts[1:], strict=True):
                pieces += [stand_in, text]
            merged.append("".join(pieces))
    body = "|".join(f"(?:{m})" for m in merged)
    return head + body.translate({ord(c): s for c, s in classes.items()})


# %% ../chapters/a03_text_and_tokenizer.ipynb #25fa5e14
class SourceChanged(Exception):
    """spaCy's French files no longer have the shape this module reads."""


_FRENCH = Path(spacy.lang.__path__[0]) / "fr"


def _token_match_argument(node: ast.stmt) -> ast.expr | None:
    """X, when `node` is the statement `TOKEN_MATCH = re.compile(X).match`."""
    match node:
        case ast.Assign(
            targets=[ast.Name(id="TOKEN_MATCH")],
            value=ast.Attribute(
                value=ast.Call(
                    func=ast.Attribute(
                        value=ast.Name(id="re"), attr="compile"
                    ),
                    args=[argument],
                    keywords=[],
                ),
                attr="match",
            ),
        ):
            return argument
    return None


def _run_french_file(
    name: str, siblings: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The globals of spaCy's `spacy/lang/fr/<name>.py`, run as it is with
    two exceptions. Its imports from sibling files take their names from
    `siblings` (our own runs of those files): importing
    `spacy.lang.fr.<sibling>` would run `spacy/lang/fr/__init__.py` and
    with it the slow compile. A statement `TOKEN_MATCH =
    re.compile(X).match` becomes `TOKEN_MATCH_PATTERN = X`."""
    path = _FRENCH / f"{name}.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    namespace: dict[str, Any] = {
        "__name__": f"spacy.lang.fr.{name}",
        "__package__": "spacy.lang.fr",  # for its imports from ..
        "__file__": str(path),
    }
    body = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module not in siblings:
                raise SourceChanged(f"{path} imports from .{node.module}")
            for alias in node.names:
                source = siblings[node.module]
                namespace[alias.asname or alias.name] = source[alias.name]
            continue
        argument = _token_match_argument(node)
        if argument is not None:
            node = ast.Assign(
                targets=[ast.Name("TOKEN_MATCH_PATTERN", ctx=ast.Store())],
                value=argument,
            )
            ast.copy_location(node, argument)
        body.append(node)
    tree.body = body
    ast.fix_missing_locations(tree)
    try:
        exec(compile(tree, str(path), "exec"), namespace)
    except Exception as err:  # spaCy's code, which we run out of place
        raise SourceChanged(f"{path} fails when run so: {err!r}") from err
    return namespace


# %% ../chapters/a03_text_and_tokenizer.ipynb #6d4f890e
@cache
def _french_settings() -> dict[str, Any]:
    """The keyword arguments with which `spacy.blank("fr")` makes its
    `Tokenizer` (less the vocabulary), with a fast `token_match`."""
    punctuation = _run_french_file("punctuation", {})
    exceptions = _run_french_file(
        "tokenizer_exceptions", {"punctuation": punctuation}
    )
    try:
        rules = exceptions["TOKENIZER_EXCEPTIONS"]
        prefixes, suffixes, infixes = (
            punctuation[f"TOKENIZER_{affixes}"]
            for affixes in ("PREFIXES", "SUFFIXES", "INFIXES")
        )
        token_match = exceptions["TOKEN_MATCH_PATTERN"]
    except KeyError as err:
        raise SourceChanged(f"spaCy's French files lack {err}") from err
    # As spaCy's `create_tokenizer` does for the Defaults of `French`
    # (spacy/lang/fr/__init__.py); the URL matcher is the base one.
    return dict(
        rules=rules,
        prefix_search=compile_prefix_regex(prefixes).search,
        suffix_search=compile_suffix_regex(suffixes).search,
        infix_finditer=compile_infix_regex(infixes).finditer,
        # a bound Pattern.match, as spaCy's own: `Tokenizer.to_bytes` saves
        # its pattern (the regrouped one, which loads as fast)
        token_match=re.compile(regroup(token_match)).match,
        url_match=BaseDefaults.url_match,
    )


def french_tokenizer() -> Tokenizer:
    """A new tokenizer that cuts any text into the same words as
    `spacy.blank("fr").tokenizer`, made in a small fraction of the time.

    It has a vocabulary of its own, without the French lexical attributes
    (`like_num`...) of `spacy.blank("fr")`'s: they do not change the words.
    Should spaCy's French files change shape so that they cannot be read
    without the slow import, this warns and returns spaCy's tokenizer.
    """
    try:
        settings = _french_settings()
    except SourceChanged as err:
        warnings.warn(
            f"the fast French tokenizer cannot read spaCy's rules ({err!r});"
            ' using spacy.blank("fr"), which takes seconds to build',
            stacklevel=2,
        )
        return spacy.blank("fr").tokenizer
    return Tokenizer(Vocab(), **settings)
