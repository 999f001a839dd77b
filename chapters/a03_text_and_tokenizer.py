# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Text and the tokenizer
#
# On the data chapter's code this appendix builds what makes the text dependable and fast: the
# loaders with a check of every data file first (`transformer.checked_data`), spaCy's French
# tokenizer built in a fraction of a second (`transformer.spacy_french`, handed to the tokenizer
# by `transformer.words`), and the tokenizer's file, with the errors a damaged one gives.

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)


# %% tags=["remove-cell"]
#| default_exp spacy_french

# %% [markdown]
# ## Where the data and the models are
#
# The commands find `data/multi30k`, `cache` and `checkpoints` in the clone that the package was
# installed from (`pip install -e .`), or under the folder that the environment variable
# `TRANSFORMER_HOME` names. `transformer.paths`, built in the chapter, is the one place that
# decides these defaults; `--data-dir`, `--cache-dir` and `--checkpoint` override them one at a
# time. A command run outside the clone without either says in one line where it looked and
# what to set.


# %% [markdown]
# The defaults as a process started with `TRANSFORMER_HOME=/srv/transformer` sees them:

# %%
import os
import subprocess
import sys

from transformer.paths import HOME_VARIABLE

code = "from transformer import paths; print(paths.DATA_DIR, paths.CACHE_DIR)"
found = subprocess.run(
    [sys.executable, "-c", code],
    env=os.environ | {HOME_VARIABLE: "/srv/transformer"},
    capture_output=True,
    text=True,
    check=True,
).stdout
print(found)
assert found.split() == [
    "/srv/transformer/data/multi30k",
    "/srv/transformer/cache",
]


# %% [markdown]
# ## The files and their checksums
#
# `transformer.checked_data` gives the chapter's `load_split` and `load_pairs` with a check
# first: every file against its SHA-256 digest in `SHA256SUMS` (the output of `sha256sum`), so
# that a truncated or edited file fails at once with its name, never as a silently different
# data set. Every reader of the package goes through them (a test holds it to that), and every
# failure is a `DataError` with a one-line message that the command line prints as it is. A
# folder without `SHA256SUMS` is the package's own, installed without its data, or one named
# with `--data-dir`: the error gives the advice that fits. A file is read once: the bytes whose
# digest was checked are the bytes that the chapter's `gzip_lines` unzips.

# %%
#| export checked_data
"""The package's Multi30k loaders: the chapter's `load_split` and
`load_pairs`, each file checked first against its SHA-256 digest."""

import hashlib
import string
from pathlib import Path

from transformer import multi30k
from transformer.multi30k import DataError, check_split, gzip_lines
from transformer.paths import DATA_DIR

_MULTI30K = (
    "the repository's data/multi30k, which holds the data files and SHA256SUMS"
)


def _data_dir_advice(data_dir: Path) -> str:
    """What to do about a data folder without SHA256SUMS: it depends on whose
    it is."""
    # the package's own, data/multi30k
    if Path(data_dir).absolute() == DATA_DIR:
        return (
            "the package reads the data of the repository it was installed"
            " from: install it with `pip install -e .` in a clone"
        )
    # A folder the user named (--data-dir): reinstalling would not help.
    if Path(data_dir).is_dir():
        return f"{data_dir} is not a copy of {_MULTI30K}"
    return f"there is no folder {data_dir}: name a copy of {_MULTI30K}"


def expected_checksums(data_dir: Path = DATA_DIR) -> dict[str, str]:
    """File name -> SHA-256 from data_dir/SHA256SUMS."""
    sums = Path(data_dir) / "SHA256SUMS"
    if not sums.is_file():
        raise DataError(
            f"missing checksum file {sums} ({_data_dir_advice(data_dir)})"
        )
    try:
        text = sums.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise DataError(
            f"corrupt checksum file {sums}: not UTF-8 text ({err})"
        ) from err
    checksums = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        # `sha256sum` writes "digest  name", or "digest *name" in binary mode
        fields = line.split(maxsplit=1)
        digest = fields[0].lower()
        if (
            len(fields) != 2
            or len(digest) != 64
            or set(digest) - set(string.hexdigits)
        ):
            raise DataError(f"{sums}:{number}: malformed line {line!r}")
        checksums[fields[1].strip().removeprefix("*")] = digest
    return checksums


# %%
#| export checked_data
def checked_bytes(path: Path, sha256: str) -> bytes:
    """The bytes of a file, after checking their SHA-256."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"missing data file {path}")
    raw = path.read_bytes()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != sha256:
        raise DataError(
            f"corrupt or truncated data file {path}: SHA-256 {digest[:12]}…,"
            f" expected {sha256[:12]}… (restore it with `git checkout --"
            f" {path}`)"
        )
    return raw


def load_split(
    split: str, language: str, data_dir: Path = DATA_DIR
) -> list[str]:
    """The chapter's `load_split`, the file checked first."""
    check_split(split, "load_split(split, language)")
    name = f"{split}.{language}.gz"
    checksums = expected_checksums(data_dir)
    if name not in checksums:
        raise DataError(
            f"no checksum for {name} in {Path(data_dir) / 'SHA256SUMS'}"
        )
    path = Path(data_dir) / name
    return gzip_lines(checked_bytes(path, checksums[name]), path)


def load_pairs(
    split: str, pair: str, data_dir: Path = DATA_DIR
) -> list[tuple[str, str]]:
    """The chapter's `load_pairs`, each file checked first."""
    return multi30k.load_pairs(split, pair, data_dir, load=load_split)


# %% [markdown]
# A damaged copy of the data shows the errors: a truncated file, a side with a line missing, a
# folder without `SHA256SUMS`, and arguments given in the wrong order.

# %%
import gzip
import hashlib
import shutil
import tempfile
from pathlib import Path

from transformer.checked_data import load_pairs, load_split
from transformer.multi30k import DataError
from transformer.paths import DATA_DIR

copy = Path(tempfile.mkdtemp()) / "multi30k"
shutil.copytree(DATA_DIR, copy)
(copy / "val.de.gz").write_bytes((copy / "val.de.gz").read_bytes()[:-100])
short = gzip.compress("\n".join(load_split("val", "en")[:-1]).encode())
(copy / "val.en.gz").write_bytes(short)
sums = (copy / "SHA256SUMS").read_text()
digest = hashlib.sha256(short).hexdigest()
sums = "\n".join(
    f"{digest}  val.en.gz" if line.endswith(" val.en.gz") else line
    for line in sums.splitlines()
)
(copy / "SHA256SUMS").write_text(sums + "\n")
attempts = {
    "truncated": lambda: load_pairs("val", "de-en", copy),
    "a line short": lambda: load_pairs("val", "fr-en", copy),
    "no SHA256SUMS": lambda: load_pairs("val", "de-en", copy.parent),
    "swapped": lambda: load_pairs("de-en", "val"),
}
for case, attempt in attempts.items():
    try:
        attempt()
    except DataError as err:
        print(f"{case}: {str(err).replace(str(copy.parent), '…')}")
    else:
        raise AssertionError(f"{case}: no error")


# %% [markdown]
# ## French words, built fast
#
# `spacy.blank("fr")` takes seconds to build where German and English take a tenth of one, and
# almost all of that time is one `re.compile`. Importing spaCy's French rules compiles their
# `token_match`: one case-insensitive alternation of 266 patterns for hyphenated and elided words
# ("anti-...", "entr'...", "saut-de-ski") that the tokenizer keeps whole. Of its 1.45 MB, 1.44 MB
# are 482 copies of the same few Unicode letter classes, and `re` case-folds every letter of
# every copy.
#
# `transformer.spacy_french` builds the same tokenizer from the same rules without that compile.
# Its `regroup` rewrites an alternation so that each big character class is written once per group
# of alternatives that share it: `^anti-[L]+$|^auto-[L]+$` becomes `(?:^anti-|^auto-)[L]+$`, which
# accepts the same strings. It merges only where that is sure to be so: the differing text lies
# outside every parenthesis (so under no quantifier), is balanced, has no `|` of its own and starts
# with no quantifier, and the pattern refers to no group by number or name.

# %%
#| export spacy_french
"""spaCy's French tokenizer, built in a fraction of a second: the same rules
as `spacy.blank("fr")`, whose one slow regular expression is rewritten to
match the same words."""

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


# %%
#| export spacy_french
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


# %% [markdown]
# The rules are spaCy's files `spacy/lang/fr/punctuation.py` and `tokenizer_exceptions.py`, run
# as they are but for the statement that compiles `TOKEN_MATCH`, and without importing
# `spacy.lang.fr`, whose `__init__` would import them the slow way. Should a later spaCy change
# the files' shape, `french_tokenizer` warns and falls back to `spacy.blank("fr")`: slow, but
# the same words.


# %%
#| export spacy_french
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


# %%
#| export spacy_french
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


# %% [markdown]
# The same words as spaCy's on the validation sentences, from a pattern about
# seventy times shorter (the tests compare every Multi30k French sentence, hard cases and random
# text):

# %%
import spacy

from transformer.multi30k import load_split
from transformer.spacy_french import french_tokenizer, regroup

letters = "[" + "a-zà-ÿ" * 60 + "]"  # a class big enough to be regrouped
toy = f"^anti-{letters}+$|^auto-{letters}+$"
print(regroup(toy).replace(letters, "[L]"))

fast, slow = french_tokenizer(), spacy.blank("fr").tokenizer
sentences = load_split("val", "fr")
same = sum(
    [t.text for t in fast(s)] == [t.text for t in slow(s)] for s in sentences
)
assert same == len(sentences)
sizes = (len(t.token_match.__self__.pattern) for t in (slow, fast))
print(
    f"{same:,} of {len(sentences):,} sentences cut alike;"
    " token_match {:,} characters instead of {:,}".format(*reversed([*sizes]))
)


# %% [markdown]
# ## The package's words
#
# The chapter's `pretokenize` asks `splitter(language)` for the spaCy tokenizer of a language,
# and a `Tokenizer` keeps that function as its `splitter`. `transformer.words` gives the
# package's: the fast build for French, spaCy's own for the other languages. Its
# `load_tokenizer` reads a tokenizer's file with the chapter's `Tokenizer.load` and plugs it in;
# the encoded cache, the shipped models and the command line read their tokenizers so, which
# keeps `translate --pair fr-en` from waiting seconds for spaCy's slow compile.

# %%
#| export words
"""The package's words: the chapter's tokenizer with spaCy's French rules
built fast (transformer.spacy_french), for every reader of text in the
package."""

import importlib.util
from collections.abc import Sequence
from functools import cache
from pathlib import Path

import transformer.tokenizer as chapter
from transformer.tokenizer import Tokenizer


def spacy_tokenizer(language: str):
    """The spaCy tokenizer that the package cuts `language` with: the same
    words as the chapter's `spacy_tokenizer`, French's built fast."""
    # looked up when called, so that a test may replace the chapter's
    return _french() if language == "fr" else chapter.spacy_tokenizer(language)


@cache
def _french():
    if importlib.util.find_spec("spacy") is None:
        return chapter.spacy_tokenizer("fr")  # its one-line error
    from transformer.spacy_french import french_tokenizer  # imports spaCy

    return french_tokenizer()


def fast_pretokenize(
    texts: Sequence[str], language: str
) -> tuple[tuple[str, ...], ...]:
    """The chapter's `pretokenize`, French built fast."""
    return chapter.pretokenize(texts, language, spacy_tokenizer)


def with_fast_words(tokenizer: Tokenizer) -> Tokenizer:
    """`tokenizer`, now cutting French with the fast build: the same ids."""
    tokenizer.splitter = spacy_tokenizer
    return tokenizer


def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer in the file `path` (`Tokenizer.load`), French built fast:
    how the package reads a tokenizer's file."""
    return with_fast_words(Tokenizer.load(path))


# %% [markdown]
# Both ways cut every French sentence of every split into the same words, and a tokenizer read
# with `load_tokenizer` gives the same ids as the chapter's:

# %%
import tempfile
from pathlib import Path

from transformer import words
from transformer.multi30k import PAIRS, SPLITS, load_pairs, load_split
from transformer.tokenizer import VOCAB_SIZE, pretokenize, train_bpe

french = {split: load_split(split, "fr") for split in SPLITS}
for sentences in french.values():
    fast = words.fast_pretokenize(sentences, "fr")
    assert fast == pretokenize(sentences, "fr")
sources, targets = zip(*load_pairs("train", "fr-en"), strict=True)
cut = words.fast_pretokenize(sources, "fr")
cut += words.fast_pretokenize(targets, "en")
chapters_tokenizer = train_bpe(cut, VOCAB_SIZE, languages=PAIRS["fr-en"])
folder = Path(tempfile.mkdtemp())
chapters_tokenizer.save(folder / "tokenizer.json")
loaded = words.load_tokenizer(folder / "tokenizer.json")
assert loaded.splitter is words.spacy_tokenizer
val = french["val"]
assert loaded.encode_batch(val, "fr") == chapters_tokenizer.encode_batch(
    val, "fr"
)
print(f"{sum(map(len, french.values())):,} French sentences cut alike")

# %% [markdown]
# ## The tokenizer's file
#
# The chapter's `Tokenizer` inherits from `Vocabulary` (hidden in the chapter) the entry of each
# id (`pieces`, which refuses an id outside the vocabulary), the ids of the four special tokens,
# the pair's languages (`check_language` refuses a third), and the tokenizer's file: one JSON
# file holding the name of its format, the two languages, a description of the normalisation
# and of the word mark, and Hugging Face's BPE model (vocabulary and merges). `save` writes it
# through `atomic_write` (appendix [Batches and the encoded cache](a04_batches_and_cache.ipynb)
# says why); loading needs no spaCy, and a file that cannot be read, is cut short or is of
# another format is one `TokenizerError` naming the file:

# %%
import json

from transformer.tokenizer import MARK, Tokenizer
from transformer.vocabulary import TokenizerError

tokenizer = loaded
loaded = Tokenizer.load(folder / "tokenizer.json")
assert loaded.to_json() == tokenizer.to_json() and type(loaded) is Tokenizer
assert json.loads(loaded.to_json())["word_mark"] == MARK
text = (folder / "tokenizer.json").read_text()
for case, damaged in {
    "cut short": text[:100],
    "another format": text.replace("tokenizer 1", "tokenizer 9", 1),
}.items():
    (folder / "tokenizer.json").write_text(damaged)
    try:
        Tokenizer.load(folder / "tokenizer.json")
    except TokenizerError as err:
        print(f"{case}: {str(err).replace(str(folder), '…')}")
for attempt in (
    lambda: tokenizer.encode("Ein Hund.", "de"),
    lambda: tokenizer.decode([5, tokenizer.vocab_size]),
):
    try:
        attempt()
    except ValueError as err:
        print(err)
