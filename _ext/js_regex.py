"""Python regular expressions as JavaScript ones, for spaCy's tokenizer rules in the browser.

`to_javascript(pattern)` walks the tree that Python's own `re` parser makes of a compiled
pattern and writes the source of a JavaScript RegExp that matches the same strings, with the
`u` flag (code points, not UTF-16 units) and `i` where the pattern ignores case. Both engines
backtrack and try alternatives in order, so a search finds the same leftmost match.

Where the two languages' definitions differ, the Python one is written out:

- `\\d`, `\\w`, `\\s` and their negations, which JavaScript reads as ASCII only, become the
  code-point ranges that Python's `re` matches (its Unicode tables, found by asking it);
- `\\b` becomes look-arounds over those `\\w` ranges;
- `.` becomes "anything but a newline", JavaScript's `.` also excluding \\r, U+2028 and U+2029.

Python's `$` also matches before a final newline; JavaScript's does not. The tokenizer sees
normalised text, which has no newline, so `$` is written as `$`.

What has no JavaScript counterpart (back-references, flags scoped to a group, possessive
repeats, MULTILINE, LOCALE) raises ValueError rather than matching something else.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from re import _constants as C
from re import _parser as P

# Characters that mean something in a JavaScript pattern outside a class, and inside one.
_SYNTAX = set("^$\\.*+?()[]{}|/")
_CLASS_SYNTAX = set("\\]-^[")
# Letters, marks, numbers, punctuation and symbols are written as themselves.
_VISIBLE = {"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl", "No"}
_VISIBLE |= {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc", "Sk", "So"}


def _char(code: int, *, in_class: bool = False) -> str:
    """One code point as JavaScript pattern text."""
    c = chr(code)
    if 0x20 <= code < 0x7F:
        return "\\" + c if c in (_CLASS_SYNTAX if in_class else _SYNTAX) else c
    if code > 0x7F and unicodedata.category(c) in _VISIBLE:
        return c  # as itself: a third of the size of its escape, and readable
    if code <= 0xFFFF and not 0xD800 <= code <= 0xDFFF:
        return f"\\u{code:04X}"
    # \u{...} for astral code points, and for lone surrogates: written as \uD83D\uDE00 two
    # of them would join into one astral character under the u flag.
    return f"\\u{{{code:X}}}"


@functools.cache
def _category(escape: str, ascii_only: bool) -> tuple[tuple[int, int], ...]:
    """The code points that Python's `re` matches with `escape` (e.g. "\\w"), as runs."""
    # Every code point in order, lone surrogates included: each match of `escape`+ is a run.
    everything = "".join(map(chr, range(sys.maxunicode + 1)))
    found = re.finditer(escape + "+", everything, re.ASCII if ascii_only else 0)
    return tuple((ord(m.group()[0]), ord(m.group()[-1])) for m in found)


_CATEGORIES = {
    C.CATEGORY_DIGIT: "\\d",
    C.CATEGORY_NOT_DIGIT: "\\D",
    C.CATEGORY_SPACE: "\\s",
    C.CATEGORY_NOT_SPACE: "\\S",
    C.CATEGORY_WORD: "\\w",
    C.CATEGORY_NOT_WORD: "\\W",
}


def _runs_text(runs) -> str:
    return "".join(
        _char(a, in_class=True)
        if a == b
        else f"{_char(a, in_class=True)}-{_char(b, in_class=True)}"
        for a, b in runs
    )


class _Writer:
    def __init__(self, flags: int) -> None:
        unsupported = flags & (C.SRE_FLAG_MULTILINE | C.SRE_FLAG_LOCALE)
        if unsupported:
            raise ValueError(f"flags {unsupported} have no JavaScript counterpart here")
        self.flags = flags
        self.ascii = bool(flags & C.SRE_FLAG_ASCII)

    def category(self, code) -> str:
        if code not in _CATEGORIES:
            raise ValueError(f"character category {code} is not supported")
        return _runs_text(_category(_CATEGORIES[code], self.ascii))

    def word_class(self) -> str:
        return f"[{self.category(C.CATEGORY_WORD)}]"

    def set_item(self, op, av) -> str:
        if op is C.LITERAL:
            return _char(av, in_class=True)
        if op is C.RANGE:
            return f"{_char(av[0], in_class=True)}-{_char(av[1], in_class=True)}"
        if op is C.CATEGORY:
            return self.category(av)
        raise ValueError(f"{op} inside a character class is not supported")

    def sequence(self, items) -> str:
        return "".join(self.node(op, av) for op, av in items)

    def atom(self, items) -> str:
        """The text of `items`, grouped if a quantifier could not follow it as is."""
        text = self.sequence(items)
        if len(items) == 1 and items[0][0] in (
            C.LITERAL,
            C.NOT_LITERAL,
            C.ANY,
            C.IN,
            C.CATEGORY,
            C.SUBPATTERN,
            C.BRANCH,
        ):
            return text
        return f"(?:{text})"

    def node(self, op, av) -> str:
        if op is C.LITERAL:
            return _char(av)
        if op is C.NOT_LITERAL:
            return f"[^{_char(av, in_class=True)}]"
        if op is C.ANY:
            return "[\\s\\S]" if self.flags & C.SRE_FLAG_DOTALL else "[^\\n]"
        if op is C.IN:
            negate = bool(av) and av[0][0] is C.NEGATE
            items = av[1:] if negate else av
            body = "".join(self.set_item(o, a) for o, a in items)
            return f"[{'^' if negate else ''}{body}]"
        if op is C.CATEGORY:
            return f"[{self.category(av)}]"
        if op is C.BRANCH:
            return "(?:" + "|".join(self.sequence(b) for b in av[1]) + ")"
        if op is C.SUBPATTERN:
            _group, add_flags, del_flags, items = av
            if add_flags or del_flags:
                raise ValueError("flags scoped to a group are not supported")
            return f"(?:{self.sequence(items)})"  # no back-references: no captures
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            low, high, items = av
            if (low, high) == (0, C.MAXREPEAT):
                quantifier = "*"
            elif (low, high) == (1, C.MAXREPEAT):
                quantifier = "+"
            elif (low, high) == (0, 1):
                quantifier = "?"
            elif high == C.MAXREPEAT:
                quantifier = f"{{{low},}}"
            elif low == high:
                quantifier = f"{{{low}}}"
            else:
                quantifier = f"{{{low},{high}}}"
            lazy = "?" if op is C.MIN_REPEAT else ""
            return self.atom(items) + quantifier + lazy
        if op is C.AT:
            if av in (C.AT_BEGINNING, C.AT_BEGINNING_STRING):
                return "^"
            if av in (C.AT_END, C.AT_END_STRING):
                return "$"
            if av in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY):
                w = self.word_class()
                boundary = f"(?:(?<={w})(?!{w})|(?<!{w})(?={w}))"
                if av is C.AT_BOUNDARY:
                    return boundary
                return f"(?:(?<={w})(?={w})|(?<!{w})(?!{w}))"
            raise ValueError(f"anchor {av} is not supported")
        if op in (C.ASSERT, C.ASSERT_NOT):
            direction, items = av
            look = "<" if direction < 0 else ""
            sign = "=" if op is C.ASSERT else "!"
            return f"(?{look}{sign}{self.sequence(items)})"
        raise ValueError(f"{op} has no JavaScript counterpart here")


def _non_empty_branches(tree: P.SubPattern) -> list[P.SubPattern]:
    """The top-level alternatives of `tree` that never match the empty string.

    Raises ValueError if one matches it only sometimes: it could not be split so."""
    if len(tree.data) == 1 and tree.data[0][0] is C.BRANCH:
        branches = tree.data[0][1][1]
    else:
        branches = [tree]
    kept = []
    for branch in branches:
        low, high = branch.getwidth()
        if low >= 1:
            kept.append(branch)
        elif high > 0:
            raise ValueError(
                "an alternative that matches the empty string only sometimes"
            )
    return kept


def to_javascript(pattern: re.Pattern, *, non_empty: bool = False) -> dict:
    """A JavaScript RegExp's {"source", "flags"} for a compiled Python pattern.

    With non_empty, also "non_empty": the source of the pattern without its alternatives
    that match only the empty string. Python's finditer, after an empty match, looks for a
    non-empty one at the same position before moving on; JavaScript's matchAll does not, so
    the tokenizer does that with this pattern.

    Raises ValueError for what this translation does not support.
    """
    tree = P.parse(pattern.pattern, pattern.flags)
    writer = _Writer(tree.state.flags)
    flags = "u" + ("i" if tree.state.flags & C.SRE_FLAG_IGNORECASE else "")
    result = {"source": writer.sequence(tree.data), "flags": flags}
    if non_empty:
        kept = _non_empty_branches(tree)
        result["non_empty"] = "|".join(writer.sequence(b) for b in kept) or "(?!)"
    return result
