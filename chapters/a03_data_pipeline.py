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
# # The data pipeline
#
# [The data: Multi30k](10_data.ipynb) builds the idea: spaCy's words, a subword vocabulary
# shared by both languages, and batches of similar length. This appendix holds what makes it
# dependable, in modules that build on the chapter's code:
#
# - `transformer.multi30k` reads the text of a split, after checking each file against its
#   SHA-256 digest;
# - `transformer.french` builds spaCy's French tokenizer in a fraction of a second;
# - `transformer.vocabulary` holds the table beneath the chapter's tokenizer: the entry of each
#   id, the special tokens, and the tokenizer's file;
# - `transformer.batch_checks` turns arguments that cannot make a batch into one clear error;
# - `transformer.encoded` holds a split as token ids in flat arrays, and `transformer.cache`
#   keeps every split that way on disk, so that training needs neither the text nor spaCy;
# - `transformer.bpe_dropout` spells the training words afresh each epoch, an option that is off
#   by default;
# - `transformer.data` serves the batches of an epoch to training, and gathers the names of the
#   pipeline that training and the command line read.

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
#| default_exp multi30k

# %% [markdown]
# ## Where the data and the models are
#
# The commands read Multi30k from `data/multi30k`, keep the encoded caches in `cache` and find
# the shipped models in `checkpoints`, all three in the clone of the book's repository that the
# package was installed from (`pip install -e .`). An installed package, or a notebook run
# elsewhere, names another folder with the environment variable `TRANSFORMER_HOME`: it holds
# the same three, `data/multi30k`, `cache` and `checkpoints`. `transformer/paths.py` is the one
# place that decides these defaults; `--data-dir`, `--cache-dir` and `--checkpoint` still
# override them one at a time. Without either, a command run outside the clone says in one
# line which folder it looked in and what to set.

# %%
#| export paths
"""Where the book's data, encoded caches and models are: in the clone of its
repository that holds the package, or under $TRANSFORMER_HOME."""

import importlib.util
import os
from pathlib import Path

HOME_VARIABLE = "TRANSFORMER_HOME"


def _repository_root() -> Path:
    # The package is <root>/transformer. In it this file has a __file__; in its
    # notebook (which may run anywhere, e.g. Colab's /content) the installed
    # package says.
    here = (
        globals().get("__file__")
        or importlib.util.find_spec("transformer").origin
    )
    return Path(here).resolve().parent.parent


def home() -> Path:
    """The folder that holds data/multi30k, cache and checkpoints:
    $TRANSFORMER_HOME if it is set, else the repository."""
    value = os.environ.get(HOME_VARIABLE)
    return Path(value).expanduser().absolute() if value else _repository_root()


HOME = home()
DATA_DIR = HOME / "data" / "multi30k"  # the Multi30k files and SHA256SUMS
CACHE_DIR = HOME / "cache"  # the encoded splits that `prepare` writes
CHECKPOINTS_DIR = HOME / "checkpoints"  # the shipped models, one per pair

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
# The raw text ships with the repository, gzipped in `data/multi30k/` (about 2 MB). Every file is
# checked against its SHA-256 digest in `SHA256SUMS` before it is used, and both sides of a split
# must have as many lines, so a truncated or edited file fails at once with its name, never as a
# silently different data set. Every such failure is a `DataError` with a one-line message, which
# the command line prints as it is. The loaders take the split first and `load_encoded` (below)
# the pair first; `check_split` names a swap when it sees one.

# %%
#| export
"""The text of Multi30k in data/multi30k: each file checked against its SHA-256
digest before it is read."""

import gzip
import hashlib
import string
import zlib
from pathlib import Path

from transformer.paths import DATA_DIR

PAIRS = {"de-en": ("de", "en"), "fr-en": ("fr", "en")}
SPLITS = ("train", "val", "test_2016_flickr")


class DataError(Exception):
    """A data file is missing, corrupt or inconsistent, or a split or pair is
    unknown."""


def check_split(split: str, signature: str) -> None:
    """A clear error for a split the book does not have; `signature`, the
    caller's, is shown when `split` looks like a pair or a language (raw text
    loaders take the split first, `load_encoded` the pair)."""
    if split not in SPLITS:
        swapped = split in PAIRS or any(
            split in langs for langs in PAIRS.values()
        )
        hint = f" (the arguments are {signature}: swapped?)" if swapped else ""
        raise DataError(
            f"unknown split {split!r}: choose one of {', '.join(SPLITS)}{hint}"
        )


def parse_pair(pair: str) -> tuple[str, str]:
    """'de-en' -> ('de', 'en'), with a clear error for a pair the book does not
    have."""
    if pair not in PAIRS:
        raise DataError(
            f"unknown language pair {pair!r}: choose one of {', '.join(PAIRS)}"
        )
    return PAIRS[pair]


# %% [markdown]
# `SHA256SUMS` is the output of `sha256sum`. A folder without it is either the package's own,
# when the package was installed without its data, or one the user named with `--data-dir`; the
# error gives the advice that fits.

# %%
#| export
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


# %% [markdown]
# A file is read whole, its digest checked, then unzipped. Lines are cut at `"\n"` only: Python's
# `str.splitlines` would also cut at characters such as U+2028 that may occur inside a caption.


# %%
#| export
def read_lines(path: Path, sha256: str) -> list[str]:
    """The lines of a gzipped UTF-8 file, after checking its SHA-256."""
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
    try:
        text = gzip.decompress(raw).decode("utf-8")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as err:
        raise DataError(f"cannot read data file {path}: {err}") from err
    lines = text.split("\n")
    return lines[:-1] if lines and lines[-1] == "" else lines


def load_split(
    split: str, language: str, data_dir: Path = DATA_DIR
) -> list[str]:
    """The sentences of one split in one language, one per line of the file."""
    check_split(split, "load_split(split, language)")
    name = f"{split}.{language}.gz"
    checksums = expected_checksums(data_dir)
    if name not in checksums:
        raise DataError(
            f"no checksum for {name} in {Path(data_dir) / 'SHA256SUMS'}"
        )
    return read_lines(Path(data_dir) / name, checksums[name])


def load_pairs(
    split: str, pair: str, data_dir: Path = DATA_DIR
) -> list[tuple[str, str]]:
    """(source, target) sentence pairs of a split, e.g. load_pairs("val",
    "de-en")."""
    check_split(split, "load_pairs(split, pair)")
    src_lang, tgt_lang = parse_pair(pair)
    src = load_split(split, src_lang, data_dir)
    tgt = load_split(split, tgt_lang, data_dir)
    if len(src) != len(tgt):
        raise DataError(
            f"{split}.{src_lang}.gz has {len(src)} lines but"
            f" {split}.{tgt_lang}.gz has {len(tgt)}"
        )
    return list(zip(src, tgt, strict=True))


# %% [markdown]
# A damaged copy of the data shows the errors: a truncated file, a side with a line missing, a
# folder without `SHA256SUMS`, and arguments given in the wrong order.

# %%
import gzip
import hashlib
import shutil
import tempfile
from pathlib import Path

from transformer.multi30k import DATA_DIR, DataError, load_pairs, load_split

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
# `transformer.french` builds the same tokenizer from the same rules without that compile. Its
# `regroup` rewrites an alternation so that each big character class is written once per group
# of alternatives that share it: `^anti-[L]+$|^auto-[L]+$` becomes `(?:^anti-|^auto-)[L]+$`, which
# accepts the same strings. It merges only where that is sure to be so: the differing text lies
# outside every parenthesis (so under no quantifier), is balanced, has no `|` of its own and starts
# with no quantifier, and the pattern refers to no group by number or name.

# %%
#| export french
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
#| export french
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
# The rules themselves are spaCy's files, `spacy/lang/fr/punctuation.py` and
# `tokenizer_exceptions.py`, run here as they are but for one statement: the one that compiles
# `TOKEN_MATCH` keeps its pattern instead. They are run without importing the package
# `spacy.lang.fr`, whose `__init__` would import them the slow way. Prefixes, suffixes, infixes,
# special cases and the URL matcher are put together as `spacy.blank` puts them together. Should
# a later spaCy change the files' shape, `french_tokenizer` warns and falls back to
# `spacy.blank("fr")`: slow, but the same words. The chapter's `pretokenize` takes this tokenizer
# for French.


# %%
#| export french
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
#| export french
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

from transformer.french import french_tokenizer, regroup
from transformer.multi30k import load_split

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
# ## Atomic files
#
# A process can be killed at any moment: by a time limit, a full disk, a power cut. A file that
# is being rewritten when that happens must not be left half old and half new, or a resumed run
# would read garbage. `atomic_write` writes the new content into a temporary file next to the
# destination, flushes it to the disk (`fsync`), and renames it over the destination. A rename
# within a file system is atomic: readers see the old file or the new one, never a mixture.
#
# A checkpoint is a folder of several files, and `atomic_folder` does the same for a folder: the
# block writes into a hidden temporary folder, which replaces the destination only when the block
# ends without error. Every file is flushed before the rename, and the rename after it, so that a
# power cut cannot leave a complete-looking folder of empty files. Every writer of the package
# (the data cache, the tokenizer, checkpoints, exports, translations) goes through these two.

# %%
#| export files
"""Atomic writes of files and folders, and the JSON Lines records of a run."""

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_write(path: Path, data: bytes) -> None:
    """Write a file so that readers see the old content or the new, never half
    of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(
        dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"
    )
    try:
        # mkstemp makes the file readable by its owner only; give it the mode
        # that open() would have, so that a cache or a checkpoint can be shared
        # like any other file.
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync(path: Path) -> None:
    """Ask the disk to hold what `path` (a file or a folder) says before going
    on."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_folder(path: Path) -> Iterator[Path]:
    """Yield a temporary folder that replaces `path` when the block ends
    without error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        yield tmp
        # A rename can reach the disk before the data of the files renamed:
        # after a power cut the folder would be there with empty files. The
        # data first, then the names.
        for folder, _, files in os.walk(tmp):
            for name in files:
                _fsync(Path(folder) / name)
            _fsync(Path(folder))
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        # a rename cannot replace a folder that has files in it
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync(path.parent)  # the renames themselves
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The records of a JSON Lines file; a last line cut short by a crash is
    skipped."""
    records = []
    if Path(path).is_file():
        for line in Path(path).read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    return records


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record to a JSON Lines file, on disk when this returns."""
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def truncate_jsonl(path: Path, step: int) -> None:
    """Keep the records up to update `step` (a resumed run writes the later
    ones again)."""
    if Path(path).exists():
        kept = [r for r in read_jsonl(path) if r.get("step", 0) <= step]
        atomic_write(
            path, "".join(json.dumps(r) + "\n" for r in kept).encode()
        )


def remove_stale(folder: Path) -> None:
    """Delete the temporary files and folders that a writer killed in
    `atomic_write` or `atomic_folder` left in `folder`."""
    for stale in [
        *Path(folder).glob(".*.tmp*"),
        *Path(folder).glob(".*.old-*"),
    ]:
        if stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


# %% [markdown]
# A block that fails leaves the old folder as it was, and one that succeeds replaces it whole:

# %%
import tempfile
from pathlib import Path

from transformer.files import atomic_folder, atomic_write

scratch = Path(tempfile.mkdtemp())
with atomic_folder(scratch / "run") as tmp:
    atomic_write(tmp / "a.txt", b"first")
try:
    with atomic_folder(scratch / "run") as tmp:
        (tmp / "a.txt").write_text("second, half writ")
        raise KeyboardInterrupt  # the process is stopped inside the block
except KeyboardInterrupt:
    pass
assert (scratch / "run" / "a.txt").read_text() == "first"
assert [p.name for p in scratch.iterdir()] == [
    "run"
]  # no temporary folder left
with atomic_folder(scratch / "run") as tmp:
    (tmp / "b.txt").write_text("second")
print(sorted(p.name for p in (scratch / "run").iterdir()))

# %% [markdown]
# ## The vocabulary and its file
#
# The chapter's `Tokenizer` turns text into ids and back; what it inherits from `Vocabulary` is
# the table beneath: the entry of each id (`pieces`, which refuses an id outside the vocabulary
# rather than decode it as some other entry), the ids of the four special tokens, which every
# vocabulary must hold, the pair's languages (`check_language` refuses a third), and the
# tokenizer's file.
#
# A tokenizer is saved as one JSON file: the name of its format, the two languages, a
# description of the normalisation and of the word mark, and Hugging Face's BPE model
# (vocabulary and merges). A file that cannot be read, is cut short, or is of another format is
# one `TokenizerError` naming the file; loading needs no spaCy. `save` writes through
# `atomic_write` (appendix [Training runs](a05_training_runs.ipynb)): a failed write
# leaves the old file whole.

# %%
#| export vocabulary
"""A BPE vocabulary: its entries, the ids of its special tokens, and the file
of a tokenizer."""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Self

import tokenizers

from transformer.files import atomic_write

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<bos>", "<eos>"
SPECIALS = (PAD, UNK, BOS, EOS)
TOKENIZER_FORMAT = "transformer-book tokenizer 1"


class TokenizerError(Exception):
    """A tokenizer file is unreadable or malformed, or a vocabulary lacks the
    special tokens."""


# %%
#| export vocabulary
class Vocabulary:
    """The entries of a language pair's BPE vocabulary (Hugging Face's `bpe`)
    and the ids of its special tokens; `Tokenizer` adds encoding and
    decoding."""

    def __init__(
        self, bpe: tokenizers.Tokenizer, *, languages: tuple[str, str]
    ) -> None:
        self.bpe = bpe
        self.languages = tuple(languages)
        vocab = bpe.get_vocab()
        missing = [t for t in SPECIALS if t not in vocab]
        if missing:
            raise TokenizerError(
                f"the BPE vocabulary lacks the special tokens {missing}"
            )
        self._pieces = [""] * len(vocab)
        for piece, i in vocab.items():
            self._pieces[i] = piece
        self.pad_id, self.unk_id, self.bos_id, self.eos_id = (
            vocab[t] for t in SPECIALS
        )

    @property
    def vocab_size(self) -> int:
        return len(self._pieces)

    @property
    def pair(self) -> str:
        return "-".join(self.languages)

    def __repr__(self) -> str:
        name = type(self).__name__
        return f"{name}(pair={self.pair!r}, vocab_size={self.vocab_size})"

    def check_language(self, language: str | None) -> str:
        """`language`, or the pair's source language for None; a ValueError
        for any other language than the pair's two."""
        if language is None:
            return self.languages[0]
        if language not in self.languages:
            raise ValueError(
                f"language {language!r} is not one of {self.languages}"
            )
        return language

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary entry of each id, special tokens included."""
        ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
        if ids and (min(ids) < 0 or max(ids) >= self.vocab_size):
            bad = next(i for i in ids if not 0 <= i < self.vocab_size)
            raise ValueError(
                f"token id {bad} is outside the vocabulary of"
                f" {self.vocab_size}"
            )
        return [self._pieces[i] for i in ids]

    def to_json(self) -> str:
        """The tokenizer's file, as text."""
        return json.dumps(
            {
                "format": TOKENIZER_FORMAT,
                "languages": list(self.languages),
                "normalization": (
                    "Unicode NFC; whitespace runs to one space; stripped"
                ),
                "word_mark": "\u2581",  # tokenizer.MARK
                "bpe": json.loads(self.bpe.to_str()),
            },
            ensure_ascii=False,
        )

    def save(self, path: Path) -> None:
        """Write the tokenizer as one JSON file (atomically: a temporary file,
        then a rename)."""
        atomic_write(Path(path), self.to_json().encode("utf-8"))

    @classmethod
    def load(cls, path: Path) -> Self:
        """Read a tokenizer written by `save`, as an instance of `cls` (a
        Tokenizer); needs no spaCy."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise TokenizerError(
                f"cannot read tokenizer {path}: {err}"
            ) from err
        return cls.from_json(text, source=path)

    @classmethod
    def from_json(cls, text: str, *, source: object = "JSON") -> Self:
        """The tokenizer of `to_json`'s text; `source` names it in errors."""
        try:
            spec = json.loads(text)
            if spec.get("format") != TOKENIZER_FORMAT:
                raise ValueError(
                    f"format {spec.get('format')!r}, not {TOKENIZER_FORMAT!r}"
                )
            bpe = tokenizers.Tokenizer.from_str(json.dumps(spec["bpe"]))
            languages = tuple(spec["languages"])
        # Truncated, not JSON, wrong format: one message.
        except Exception as err:
            raise TokenizerError(
                f"cannot read tokenizer {source}: {err}"
            ) from err
        return cls(bpe, languages=languages)


# %% [markdown]
# A tokenizer saved and loaded is the same tokenizer; a file cut short, or of another format,
# is refused with its name, and so are a language the pair lacks and an id outside the
# vocabulary. (`train_tokenizer`, from the cache below, learns the chapter's tokenizers again.)

# %%
import json

from transformer.cache import train_tokenizer
from transformer.multi30k import PAIRS
from transformer.tokenizer import MARK, Tokenizer
from transformer.vocabulary import TokenizerError

trained = {
    pair: train_tokenizer(load_pairs("train", pair), languages=languages)
    for pair, languages in PAIRS.items()
}
tokenizer = trained["de-en"]
folder = Path(tempfile.mkdtemp())
tokenizer.save(folder / "tokenizer.json")
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
    lambda: tokenizer.encode("Un chien.", "fr"),
    lambda: tokenizer.decode([5, tokenizer.vocab_size]),
):
    try:
        attempt()
    except ValueError as err:
        print(err)

# %% [markdown]
# ## The checks of a batch
#
# `collate` and `token_batches`, the chapter's batching, call three checks that turn arguments
# that cannot make a batch into one clear `ValueError`: an empty batch or an `index` that does
# not give one line per pair, a pair longer than the model's positions (nothing is ever
# truncated), and lengths that do not pair up, a budget that is not positive or a pair that no
# batch can hold.

# %%
#| export batch_checks
"""The checks of collate's and token_batches' arguments: one clear ValueError
for a batch that cannot be made."""

from collections.abc import Sequence

import numpy as np


def check_index(index: Sequence[int] | None, n: int) -> np.ndarray:
    """The line of each of n pairs in its split: `index`, or 0 … n-1."""
    if n == 0:
        raise ValueError("cannot collate an empty batch")
    index = np.arange(n) if index is None else np.asarray(index)
    if index.shape != (n,):
        raise ValueError(
            f"index has shape {index.shape}, not one entry for each of the "
            f"{n} pairs"
        )
    return index


def check_fit(
    src_len: np.ndarray,
    tgt_len: np.ndarray,
    index: np.ndarray,
    max_len: int | None,
) -> None:
    """Refuse a pair whose source with <eos>, or target with <bos>, is longer
    than max_len: nothing is truncated."""
    if max_len is None:
        return
    over = np.flatnonzero((src_len > max_len) | (tgt_len > max_len))
    if over.size:
        k = over[0]
        raise ValueError(
            f"pair {int(index[k])} has {src_len[k]} source and"
            f" {tgt_len[k]} target tokens, more than max_len={max_len};"
            " nothing is truncated: drop or split it"
        )


def check_lengths(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], max_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """The lengths of each pair's sides as int64 arrays, checked: one of each
    per pair, a positive budget, and no pair longer than it."""
    src = np.asarray(src_lengths, dtype=np.int64)
    tgt = np.asarray(tgt_lengths, dtype=np.int64)
    if src.ndim != 1 or src.shape != tgt.shape:
        raise ValueError(
            f"one source and one target length per pair: {src.shape},"
            f" {tgt.shape}"
        )
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    longest = np.maximum(src, tgt)
    over = np.flatnonzero(longest > max_tokens)
    if over.size:
        raise ValueError(
            f"pair {over[0]} has {longest[over[0]]} tokens, more than "
            f"max_tokens={max_tokens}: no batch can hold it"
        )
    return src, tgt


# %% [markdown]
# Each check at work, through the chapter's functions:

# %%
from transformer.batches import collate, token_batches

ids = dict(pad_id=0, bos_id=2, eos_id=3)
for attempt in (
    lambda: collate([], **ids),
    lambda: collate([([5], [6]), ([7], [8])], **ids, index=[9]),
    lambda: collate([([5] * 600, [6])], **ids, index=[41], max_len=512),
    lambda: token_batches([3, 4], [3], max_tokens=100),
    lambda: token_batches([3, 400], [3, 5], max_tokens=100),
):
    try:
        attempt()
    except ValueError as err:
        print(err)
    else:
        raise AssertionError("no error")

# %% [markdown]
# ## A split as token ids
#
# An `EncodedSplit` holds the token ids of one split without special tokens, each side as one
# flat array of ids and an array of offsets: pair $i$ is
# `src_ids[src_offsets[i]:src_offsets[i + 1]]` and the same for the target. Flat arrays load
# fast and take little memory. Optional arrays of word starts, one flag per id, say which ids
# begin a word of `pretokenize`: BPE-dropout, below, needs them to find the words again. The
# constructor checks that the arrays fit together, so a damaged split is an error, not wrong
# batches.

# %%
#| export encoded
"""One split of Multi30k as token ids in flat arrays (EncodedSplit)."""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from safetensors.numpy import load as _load_safetensors
from safetensors.numpy import save as _save_safetensors

from transformer.multi30k import DataError
from transformer.tokenizer import Tokenizer

ARRAYS = ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
STARTS = ("src_starts", "tgt_starts")


def flatten(
    sequences: Sequence[Sequence[int]], dtype: type = np.int32
) -> tuple[np.ndarray, np.ndarray]:
    """(all the items in one array, the N + 1 offsets where each sequence
    starts and the last ends)."""
    lengths = np.fromiter(
        map(len, sequences), dtype=np.int64, count=len(sequences)
    )
    offsets = np.zeros(len(sequences) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    flat = itertools.chain.from_iterable(sequences)
    return np.fromiter(flat, dtype=dtype, count=int(offsets[-1])), offsets


# %%
#| export encoded
@dataclass(frozen=True, eq=False)
class EncodedSplit:
    """The token ids of one split, without special tokens, as flat arrays.

    Pair i is (src_ids[src_offsets[i]:src_offsets[i + 1]],
    tgt_ids[tgt_offsets[i]:...]); ids are int32 and each offsets array holds N
    + 1 int64 entries, starting at 0. The optional `src_starts` and
    `tgt_starts` (bool, one per id) mark the ids that begin a word of
    `pretokenize`, which BPE-dropout needs to segment the words afresh.
    """

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray
    src_starts: np.ndarray | None = None
    tgt_starts: np.ndarray | None = None

    def __post_init__(self) -> None:
        for side in ("src", "tgt"):
            ids, offsets, starts = (
                getattr(self, f"{side}_{name}")
                for name in ("ids", "offsets", "starts")
            )
            if not (
                (ids.ndim, ids.dtype, offsets.ndim, offsets.dtype)
                == (1, np.int32, 1, np.int64)
                and len(offsets) > 0
                and offsets[0] == 0
                and offsets[-1] == len(ids)
                and (np.diff(offsets) >= 0).all()
            ):
                raise DataError(f"inconsistent {side} ids and offsets")
            if starts is not None:
                first = offsets[:-1][
                    np.diff(offsets) > 0
                ]  # of each non-empty sentence
                if not (
                    starts.dtype == np.bool_
                    and starts.shape == ids.shape
                    and bool(starts[first].all())
                ):
                    raise DataError(
                        f"inconsistent {side} word starts: one bool per id,"
                        " and every sentence begins a word"
                    )
        if len(self.src_offsets) != len(self.tgt_offsets):
            raise DataError(
                "source and target hold different numbers of sentences"
            )
        if (self.src_starts is None) != (self.tgt_starts is None):
            raise DataError("word starts are given for one side only")

    @classmethod
    def from_lists(
        cls, src: Sequence[Sequence[int]], tgt: Sequence[Sequence[int]]
    ) -> "EncodedSplit":
        """From the token ids of each source and each target sentence (no word
        starts, so BPE-dropout cannot resample it: see `from_words`)."""
        return cls(*flatten(src), *flatten(tgt))

    @classmethod
    def from_words(
        cls,
        tokenizer: Tokenizer,
        src: Sequence[Sequence[str]],
        tgt: Sequence[Sequence[str]],
    ) -> "EncodedSplit":
        """From sentences cut into marked words by `pretokenize`, keeping the
        word starts."""
        arrays = {}
        for side, sentences in (("src", src), ("tgt", tgt)):
            pieces = [
                [tokenizer.segment(w) for w in words] for words in sentences
            ]
            ids = [
                [i for word in sentence for i in word] for sentence in pieces
            ]
            starts = [
                [k == 0 for w in s for k in range(len(w))] for s in pieces
            ]
            arrays[f"{side}_ids"], arrays[f"{side}_offsets"] = flatten(ids)
            arrays[f"{side}_starts"] = flatten(starts, np.bool_)[0]
        return cls(**arrays)

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """The (source ids, target ids) of pair i."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"pair {i} of a split of {len(self)}")
        i %= len(self)
        s, t = self.src_offsets, self.tgt_offsets
        return self.src_ids[s[i] : s[i + 1]], self.tgt_ids[t[i] : t[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        return np.diff(self.src_offsets)

    @property
    def tgt_lengths(self) -> np.ndarray:
        return np.diff(self.tgt_offsets)

    def to_bytes(self) -> bytes:
        names = ARRAYS if self.src_starts is None else ARRAYS + STARTS
        return _save_safetensors({name: getattr(self, name) for name in names})

    @classmethod
    def from_bytes(cls, data: bytes) -> "EncodedSplit":
        arrays = _load_safetensors(data)
        names = [name for name in ARRAYS + STARTS if name in arrays]
        return cls(**{name: arrays[name] for name in names})


# %% [markdown]
# A German sentence of the validation split as words, and as pieces in an `EncodedSplit` (`|`
# marks a word start): each word begins with a start flag, whether it is one piece or several.

# %%
import numpy as np

from transformer.encoded import EncodedSplit
from transformer.tokenizer import pretokenize

german, english = load_split("val", "de"), load_split("val", "en")
words = pretokenize(german, "de")
split = EncodedSplit.from_words(tokenizer, words, pretokenize(english, "en"))
# the first sentence with a word of several pieces
i = next(i for i in range(len(split)) if len(split[i][0]) > len(words[i]))
starts = split.src_starts[split.src_offsets[i] : split.src_offsets[i + 1]]
pieces = tokenizer.pieces(split[i][0])
print(words[i])
print(
    " ".join(
        ("|" if s else "") + p for p, s in zip(pieces, starts, strict=True)
    )
)
assert starts.sum() == len(words[i])
again = EncodedSplit.from_bytes(split.to_bytes())
assert np.array_equal(again.src_starts, split.src_starts)
try:
    EncodedSplit(
        split.src_ids[:-1], split.src_offsets, split.tgt_ids, split.tgt_offsets
    )
except DataError as err:
    print(err)

# %% [markdown]
# ## The encoded cache
#
# Training reads the same 29,000 pairs for dozens of epochs: tokenising them each time would be
# wasted work, and a training machine need not have spaCy at all. `prepare(pair)` encodes every
# split once into `cache/<pair>/`:
#
# | file | holds |
# | --- | --- |
# | `tokenizer.json` | the tokenizer learned from the training split |
# | `train.safetensors`, `val.safetensors`, `test_2016_flickr.safetensors` | each split as an `EncodedSplit`, with its word starts |
# | `manifest.json` | the cache format, the pair, the vocabulary size, the checksums of the data files it was built from, and the SHA-256 of each file above |
#
# `load_encoded(pair, split)` reads a split back without spaCy. A cache whose manifest does not
# match (other data, another vocabulary size, a damaged or missing file) is never used:
# `cache_problems` names what is wrong, `prepare` rebuilds such a cache (which needs spaCy) and
# `load_encoded` refuses it with a `DataError` that says how to rebuild it. A build deletes the
# manifest first and writes it last, each file atomically, so a build that is interrupted leaves
# a cache that is recognisably unfinished. From the command line, `python -m transformer prepare`
# builds the caches of both pairs.

# %%
#| export cache
"""The encoded cache: every split of a pair as token ids on disk, written by
`prepare` and read by `load_encoded` without spaCy."""

import hashlib
import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from transformer.encoded import EncodedSplit
from transformer.files import atomic_write
from transformer.multi30k import (
    SPLITS,
    DataError,
    check_split,
    expected_checksums,
    load_pairs,
    parse_pair,
)
from transformer.paths import CACHE_DIR, DATA_DIR
from transformer.tokenizer import VOCAB_SIZE, Tokenizer, pretokenize, train_bpe
from transformer.vocabulary import TokenizerError

CACHE_FORMAT = "transformer-book encoded multi30k 2"


def train_tokenizer(
    pairs: Sequence[tuple[str, str]],
    vocab_size: int = VOCAB_SIZE,
    *,
    languages: tuple[str, str],
) -> Tokenizer:
    """The joint BPE tokenizer of a language pair, learned from both sides of
    its (source, target) sentence pairs: give it the training split, and
    validation and test text never reach the vocabulary."""
    src_lang, tgt_lang = languages
    sentences = pretokenize([s for s, _ in pairs], src_lang) + pretokenize(
        [t for _, t in pairs], tgt_lang
    )
    return train_bpe(sentences, vocab_size, languages=(src_lang, tgt_lang))


def _data_files(pair: str) -> list[str]:
    return [
        f"{split}.{lang}.gz" for split in SPLITS for lang in parse_pair(pair)
    ]


def cache_problems(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int | None = None,
    data_dir: Path = DATA_DIR,
) -> list[str]:
    """What makes the cache of a pair unusable, [] if it is complete and
    current; with vocab_size, a cache built with another vocabulary size is
    stale too."""
    return _read_cache(
        pair, cache_dir, vocab_size=vocab_size, data_dir=data_dir
    )[0]


# %% [markdown]
# The manifest is checked first, then every file against its digest. Each file is read once:
# the bytes that were checked are the bytes the caller gets, even if a rebuild replaces the
# files in between.


# %%
#| export cache
def _read_cache(
    pair: str,
    cache_dir: Path,
    *,
    data_dir: Path,
    vocab_size: int | None = None,
) -> tuple[list[str], dict[str, bytes]]:
    """(cache_problems, the content of each file whose checksum matched). The
    files are read once: what is checked is what the caller uses, even if a
    rebuild replaces them."""
    parse_pair(pair)
    folder = Path(cache_dir) / pair
    try:
        manifest = json.loads(
            (folder / "manifest.json").read_text(encoding="utf-8")
        )
    except FileNotFoundError:
        return [
            "no manifest.json: never built, or its build did not finish"
        ], {}
    except (OSError, ValueError) as err:
        return [f"manifest.json is unreadable: {err}"], {}
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != CACHE_FORMAT
    ):
        return [f"manifest.json is not a {CACHE_FORMAT!r} manifest"], {}
    problems, built_for, built_size = (
        [],
        manifest.get("pair"),
        manifest.get("vocab_size"),
    )
    if built_for != pair:
        problems.append(f"manifest.json describes {built_for!r}, not {pair!r}")
    if vocab_size is not None and built_size != vocab_size:
        problems.append(
            f"built with vocab_size={built_size}, asked for {vocab_size}"
        )
    try:
        checksums = expected_checksums(data_dir)
    except DataError as err:
        problems.append(str(err))
    else:
        recorded = manifest.get("data")
        if not isinstance(recorded, dict):
            problems.append(
                "manifest.json holds no table of data checksums (field data)"
            )
        else:
            for name in _data_files(pair):
                if recorded.get(name) != checksums.get(name):
                    problems.append(
                        f"{name} has changed since the cache was built"
                    )
    try:
        files = {"tokenizer.json": manifest["tokenizer_sha256"]}
        splits = manifest["splits"]
        if set(splits) != set(SPLITS):
            problems.append(f"manifest.json lists the splits {sorted(splits)}")
        files |= {entry["file"]: entry["sha256"] for entry in splits.values()}
    except (KeyError, TypeError, AttributeError) as err:
        return [*problems, f"manifest.json is malformed ({err!r})"], {}
    contents = {}
    for name, digest in files.items():
        try:
            blob = (folder / name).read_bytes()
        except FileNotFoundError:
            problems.append(f"{name} is missing")
            continue
        except OSError as err:
            problems.append(f"{name} is unreadable: {err}")
            continue
        if hashlib.sha256(blob).hexdigest() != digest:
            problems.append(
                f"{name} is corrupt: its SHA-256 differs from manifest.json"
            )
        else:
            contents[name] = blob
    return problems, contents


# %% [markdown]
# A build learns the tokenizer from both sides of the training split with `train_tokenizer`
# (above: the chapter's `pretokenize` and `train_bpe`), then encodes every split with it.
# Everything that can fail for want of data or of spaCy fails before the old cache is touched.


# %%
#| export cache
def _build_cache(
    pair: str, folder: Path, *, vocab_size: int, data_dir: Path
) -> None:
    src_lang, tgt_lang = parse_pair(pair)
    # Everything that can fail for want of data or of spaCy (training the
    # tokenizer needs it) fails before the old cache is touched: a wrong
    # --data-dir must not cost a good cache.
    texts = {split: load_pairs(split, pair, data_dir) for split in SPLITS}
    checksums = expected_checksums(data_dir)
    tokenizer = train_tokenizer(
        texts["train"], vocab_size, languages=(src_lang, tgt_lang)
    )
    folder.mkdir(parents=True, exist_ok=True)
    # No valid cache until the build ends.
    (folder / "manifest.json").unlink(missing_ok=True)
    tokenizer.save(folder / "tokenizer.json")
    tokenizer_json = (folder / "tokenizer.json").read_bytes()  # as written
    splits = {}
    for split, pairs in texts.items():
        data = EncodedSplit.from_words(
            tokenizer,
            pretokenize([s for s, _ in pairs], src_lang),
            pretokenize([t for _, t in pairs], tgt_lang),
        )
        blob = data.to_bytes()
        atomic_write(folder / f"{split}.safetensors", blob)
        splits[split] = {
            "file": f"{split}.safetensors",
            "sha256": hashlib.sha256(blob).hexdigest(),
            "sentences": len(data),
            "src_tokens": len(data.src_ids),
            "tgt_tokens": len(data.tgt_ids),
        }
    manifest = {
        "format": CACHE_FORMAT,
        "pair": pair,
        "vocab_size": vocab_size,
        "data": {name: checksums[name] for name in _data_files(pair)},
        "tokenizer_sha256": hashlib.sha256(tokenizer_json).hexdigest(),
        "splits": splits,
        "built_with": {
            name: metadata.version(name) for name in ("spacy", "tokenizers")
        },
    }
    atomic_write(
        folder / "manifest.json",
        (json.dumps(manifest, indent=2) + "\n").encode(),
    )


# %%
#| export cache
def prepare(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int = VOCAB_SIZE,
    data_dir: Path = DATA_DIR,
    rebuild: bool = False,
) -> Tokenizer:
    """The tokenizer of a pair, with every split encoded in cache_dir/pair: a
    complete, current cache is loaded and needs no spaCy; a missing, stale or
    corrupt one (see cache_problems) is rebuilt from the text, as is any cache
    with rebuild=True."""
    folder = Path(cache_dir) / pair
    options = dict(vocab_size=vocab_size, data_dir=data_dir)
    problems, contents = [], {}
    if not rebuild:  # a rebuild need not read and hash the old files first
        problems, contents = _read_cache(pair, cache_dir, **options)
    if rebuild or problems:
        _build_cache(pair, folder, **options)
        problems, contents = _read_cache(pair, cache_dir, **options)
        if problems:  # only if something rewrote the files while we built them
            raise DataError(
                f"the cache just built in {folder} is unusable: {problems}"
            )
    # Its checksum matched, but it may be a tokenizer that this version cannot
    # read.
    try:
        return Tokenizer.from_json(
            contents["tokenizer.json"].decode("utf-8"),
            source=folder / "tokenizer.json",
        )
    except TokenizerError as err:
        raise DataError(str(err)) from err


def load_encoded(
    pair: str,
    split: str,
    cache_dir: Path = CACHE_DIR,
    *,
    data_dir: Path = DATA_DIR,
) -> EncodedSplit:
    """One split of a pair as token ids, from the cache that `prepare` wrote;
    needs no spaCy. A missing, stale or corrupt cache raises DataError: it is
    never used."""
    check_split(split, "load_encoded(pair, split)")
    folder = Path(cache_dir) / pair
    problems, contents = _read_cache(pair, cache_dir, data_dir=data_dir)
    if problems:
        raise DataError(
            f"cannot use the encoded cache {folder}: {'; '.join(problems)}."
            " Rebuild it on a machine with spaCy: `python -m transformer"
            f" prepare --pair {pair}`"
        )
    return EncodedSplit.from_bytes(contents[f"{split}.safetensors"])


# %% [markdown]
# For each pair, `prepare` builds the cache the first time and loads it afterwards. It holds
# what the chapter computes: the same tokenizer, and the same ids as encoding each split afresh.

# %%
from transformer.cache import cache_problems, load_encoded, prepare
from transformer.multi30k import SPLITS
from transformer.tokenizer import VOCAB_SIZE

cached = {pair: prepare(pair) for pair in PAIRS}
for pair, tokenizer in cached.items():
    assert tokenizer.to_json() == trained[pair].to_json()
    assert cache_problems(pair, vocab_size=VOCAB_SIZE) == []
    src_lang, tgt_lang = PAIRS[pair]
    for split in SPLITS:
        data = load_encoded(pair, split)
        sources, targets = zip(*load_pairs(split, pair), strict=True)
        expected = EncodedSplit.from_lists(
            tokenizer.encode_batch(sources, src_lang),
            tokenizer.encode_batch(targets, tgt_lang),
        )
        assert all(
            np.array_equal(getattr(data, name), getattr(expected, name))
            for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")
        )
        assert data.src_starts is not None and data.tgt_starts is not None
val = load_encoded("de-en", "val")
source, target = val[0]
print(len(val), "pairs;", source.dtype, source.tolist(), target.tolist())
print(cached["de-en"].decode(source), "->", cached["de-en"].decode(target))

# %% [markdown]
# A copy of the cache with one file damaged is refused by `load_encoded`, with the rebuild
# command, and rebuilt by `prepare`; training is deterministic, so the rebuilt files are the
# same, byte for byte.

# %%
from transformer.cache import CACHE_DIR

copy = Path(tempfile.mkdtemp()) / "cache"
shutil.copytree(CACHE_DIR / "de-en", copy / "de-en")
before = {p.name: p.read_bytes() for p in (copy / "de-en").iterdir()}
damaged = copy / "de-en" / "val.safetensors"
damaged.write_bytes(damaged.read_bytes()[:-4])
print(cache_problems("de-en", copy))
try:
    load_encoded("de-en", "val", copy)
except DataError as err:
    print(str(err).replace(str(copy), "…"))
prepare("de-en", copy)
assert {p.name: p.read_bytes() for p in (copy / "de-en").iterdir()} == before

# %% [markdown]
# ## How large a vocabulary?
#
# The vocabulary size trades sequence length against how often each entry is seen: few entries
# make long sequences, many make a long tail of rare entries whose embeddings are barely trained.
# With the book's 8,000 entries (`VOCAB_SIZE`) an average training word takes little more than
# one piece; the training runs that compare vocabulary sizes are in
# [The experiments behind the recipe](a12_experiments.ipynb).

# %%
import pandas as pd

rows = []
for pair in cached:
    data = load_encoded(pair, "train")
    for lang, side in zip(PAIRS[pair], ("src", "tgt"), strict=True):
        n_words = int(getattr(data, f"{side}_starts").sum())
        n_tokens = len(getattr(data, f"{side}_ids"))
        rows.append(
            {
                "pair": pair,
                "language": lang,
                "words": n_words,
                "tokens": n_tokens,
                "tokens per word": round(n_tokens / n_words, 3),
            }
        )
per_word = pd.DataFrame(rows).set_index(["pair", "language"])
assert (per_word["tokens per word"] < 1.3).all()
per_word

# %% [markdown]
# ## BPE-dropout (an option, off by default)
#
# BPE gives every word one segmentation, so a rare word is always spelt from the same pieces,
# each seen in few contexts. BPE-dropout {cite:p}`provilkov2020bpe` segments each training word
# afresh each time it is used: at every step of BPE's merging, each merge that could apply is
# dropped with probability $p$ and the best of the rest applies. With $p = 0$ it is BPE; as $p$
# approaches 1 it approaches characters. Validation and test keep the deterministic
# segmentation. It is not part of the paper: training turns it on with `--bpe-dropout p`.
# `BPEDropout` draws from a generator seeded by (seed, epoch), so that a resumed run makes the
# same updates, and reads the words from the cache's word starts.

# %%
#| export bpe_dropout
"""BPE-dropout (Provilkov et al., 2020): the training words spelt afresh each
epoch."""

import json
from collections.abc import Sequence
from dataclasses import replace
from random import Random

import numpy as np

from transformer.encoded import EncodedSplit, flatten
from transformer.multi30k import DataError
from transformer.tokenizer import Tokenizer


class BPEDropout:
    """BPE-dropout (Provilkov et al., 2020): segment words afresh, dropping
    each merge that could apply with probability p at every step; p = 0 is the
    tokenizer's own BPE."""

    def __init__(self, tokenizer: Tokenizer, p: float) -> None:
        if (
            isinstance(p, bool)
            or not isinstance(p, int | float)
            or not 0 <= p < 1
        ):
            raise ValueError(
                f"BPE-dropout probability must be in [0, 1), got {p!r}"
            )
        self.tokenizer, self.p = tokenizer, float(p)
        merges = json.loads(tokenizer.bpe.to_str())["model"]["merges"]
        pairs = (
            tuple(m.split(" ") if isinstance(m, str) else m) for m in merges
        )
        self._rank = {pair: rank for rank, pair in enumerate(pairs)}
        self._vocab = tokenizer.bpe.get_vocab()

    def segment(self, word: str, rng: Random) -> list[int]:
        """The ids of one marked word's pieces, drawn with `rng`."""
        symbols, rank, p, draw = list(word), self._rank, self.p, rng.random
        while len(symbols) > 1:
            # The best merge that survives: scanning the candidates, a merge is
            # only drawn when it would beat the best survivor so far; the
            # others cannot win anyway.
            best, at = None, -1
            for i in range(len(symbols) - 1):
                r = rank.get((symbols[i], symbols[i + 1]))
                if (
                    r is not None
                    and (best is None or r < best)
                    and draw() >= p
                ):
                    best, at = r, i
            if best is None:
                break
            symbols[at : at + 2] = [symbols[at] + symbols[at + 1]]
        unk = self.tokenizer.unk_id
        return [self._vocab.get(symbol, unk) for symbol in symbols]

    @staticmethod
    def check(split: EncodedSplit) -> None:
        """Raise DataError if the split does not say where its words start."""
        if split.src_starts is None or split.tgt_starts is None:
            raise DataError(
                "BPE-dropout needs the word starts of the training split:"
                " build it with `EncodedSplit.from_words` or load it with"
                " `load_encoded` (`from_lists` records no word starts)"
            )

    def longest_spelling(
        self, split: EncodedSplit, sides: Sequence[str] = ("src", "tgt")
    ) -> int:
        """The most tokens a sentence of `sides` can take when resampled, <bos>
        and <eos> aside: one per character of its words, the spelling in which
        every merge drops."""
        longest = 0
        for side in sides:
            ids, offsets = (
                getattr(split, f"{side}_ids"),
                getattr(split, f"{side}_offsets"),
            )
            lengths = [len(piece) for piece in self.tokenizer.pieces(ids)]
            chars = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
            longest = max(longest, int(np.diff(chars[offsets]).max(initial=0)))
        return longest

    def resample(
        self,
        split: EncodedSplit,
        *,
        seed: int,
        epoch: int,
        sides: Sequence[str] = ("src", "tgt"),
    ) -> EncodedSplit:
        """The split with every word of `sides` ("src", "tgt" or both)
        segmented afresh, as a function of (seed, epoch); the other side is
        kept as it is."""
        self.check(split)
        if not set(sides) <= {"src", "tgt"}:
            raise ValueError(
                f"sides must be 'src' and/or 'tgt', got {sides!r}"
            )
        rng = Random(f"bpe-dropout {seed} {epoch}")
        arrays = {}
        for side in [side for side in ("src", "tgt") if side in sides]:
            ids = getattr(split, f"{side}_ids")
            offsets = getattr(split, f"{side}_offsets")
            first = np.flatnonzero(getattr(split, f"{side}_starts"))
            pieces = self.tokenizer.pieces(ids)
            bounds = zip(
                first.tolist(), [*first[1:].tolist(), len(ids)], strict=True
            )
            words = [
                self.segment("".join(pieces[a:b]), rng) for a, b in bounds
            ]
            new_ids, ends = flatten(words)  # ends: where each word ends
            starts = np.zeros(len(new_ids), dtype=np.bool_)
            starts[ends[:-1]] = True
            arrays[f"{side}_ids"], arrays[f"{side}_starts"] = new_ids, starts
            arrays[f"{side}_offsets"] = ends[np.searchsorted(first, offsets)]
        return replace(split, **arrays)


# %% [markdown]
# With $p = 0$, `BPEDropout` is the tokenizer: it segments every distinct word of every split,
# in both pairs, exactly as Hugging Face's BPE does, rank order and ties included.

# %%
from random import Random

from transformer.bpe_dropout import BPEDropout

for pair, (src_lang, tgt_lang) in PAIRS.items():
    tokenizer, plain = cached[pair], BPEDropout(cached[pair], 0.0)
    distinct = {
        word
        for split in SPLITS
        for lang in (src_lang, tgt_lang)
        for words in pretokenize(load_split(split, lang), lang)
        for word in words
    }
    assert all(
        plain.segment(w, Random(0)) == list(tokenizer.segment(w))
        for w in distinct
    )
    print(
        f"{pair}: {len(distinct):,} distinct words, each segmented as by BPE"
    )

# %% [markdown]
# With $p = 0.1$ a word comes out in several spellings. The six commonest of 1,000 draws for a
# frequent German word and one seen once in training, with how often each came out; the first
# row is BPE's own spelling:

# %%
from collections import Counter

dropout = BPEDropout(cached["de-en"], 0.1)
train_words = Counter(
    w for words in pretokenize(load_split("train", "de"), "de") for w in words
)
draws = Random(0)
spellings, left = [], {}  # left: the share of draws that leave BPE's spelling
for word in ("▁Mann", "▁Polizeihund"):
    seen = Counter(
        " ".join(cached["de-en"].pieces(dropout.segment(word, draws)))
        for _ in range(1_000)
    )
    plain_spelling = " ".join(
        cached["de-en"].pieces(cached["de-en"].segment(word))
    )
    assert seen.most_common(1)[0][0] == plain_spelling
    left[word] = 1 - seen[plain_spelling] / 1_000
    spellings += [
        {
            "word": word,
            "in training": train_words[word],
            "spelling": s,
            "of 1,000": n,
        }
        for s, n in seen.most_common(6)
    ]
assert (
    round(left["▁Mann"], 2) == 0.28 and round(left["▁Polizeihund"], 2) == 0.16
)
pd.DataFrame(spellings).set_index(["word", "in training"])

# %% [markdown]
# Resampling a whole split keeps every sentence's text, since the pieces of a word always spell
# the word, and makes it longer. The same (seed, epoch) gives the same split:

# %%
train = load_encoded("de-en", "train")
epoch_0 = dropout.resample(train, seed=0, epoch=0)
decode = cached["de-en"].decode
assert all(
    decode(epoch_0[i][0]) == decode(train[i][0]) for i in range(len(train))
)
assert all(
    decode(epoch_0[i][1]) == decode(train[i][1]) for i in range(len(train))
)
again = dropout.resample(train, seed=0, epoch=0)
assert np.array_equal(again.tgt_ids, epoch_0.tgt_ids)
epoch_1 = dropout.resample(train, seed=0, epoch=1)
assert not np.array_equal(epoch_1.tgt_ids, epoch_0.tgt_ids)
growth = {
    side: (
        len(getattr(epoch_0, f"{side}_ids"))
        / len(getattr(train, f"{side}_ids"))
    )
    for side in ("src", "tgt")
}
assert round(growth["src"], 2) == 1.30 and round(growth["tgt"], 2) == 1.28
print(
    f"p = 0.1: {growth['src'] - 1:.0%} more German and {growth['tgt'] - 1:.0%}"
    " more English tokens"
)

# %% [markdown]
# A draw that drops every merge spells each word letter by letter, and no draw is longer, so
# `longest_spelling` bounds every epoch to come; training checks the model's positions against it
# before the first update ([The training loop](13_training.ipynb)):

# %%
longest_bpe = int(max(train.src_lengths.max(), train.tgt_lengths.max())) + 1
longest_drawn = (
    int(max(epoch_0.src_lengths.max(), epoch_0.tgt_lengths.max())) + 1
)
longest_spelled = dropout.longest_spelling(train) + 1
assert longest_bpe < longest_drawn <= longest_spelled == 256
print(
    f"BPE {longest_bpe} tokens, one draw at p = 0.1 {longest_drawn}, "
    f"at most {longest_spelled} (one a character)"
)


# %% [markdown]
# ## An epoch's batches, and `transformer.data`
#
# Training reads the data through `transformer.data`: `iterate_batches` serves the batches of
# one epoch over an encoded split, cutting it with the chapter's `token_batches` and padding each
# batch with `collate`; the module also offers the names of the pipeline that training and the
# command line use, wherever they are defined.

# %%
#| export data
"""The data pipeline that training reads: the batches of an epoch over an
encoded split, and the names of the modules it is built from."""

from collections.abc import Iterator

from transformer.batches import MAX_TOKENS, Batch, collate, token_batches
from transformer.bpe_dropout import BPEDropout  # noqa: F401
from transformer.cache import (  # noqa: F401
    CACHE_DIR,
    cache_problems,
    load_encoded,
    prepare,
)
from transformer.encoded import EncodedSplit
from transformer.multi30k import (  # noqa: F401
    DATA_DIR,
    PAIRS,
    SPLITS,
    DataError,
    load_pairs,
    load_split,
    parse_pair,
)
from transformer.tokenizer import Tokenizer


def iterate_batches(
    data: EncodedSplit,
    tokenizer: Tokenizer,
    *,
    max_tokens: int = MAX_TOKENS,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool = True,
    max_len: int | None = None,
) -> Iterator[Batch]:
    """The batches of one epoch over an encoded split (see token_batches and
    collate)."""
    lengths = (
        data.src_lengths + 1,
        data.tgt_lengths + 1,
    )  # with <eos>; <bos> or <eos>
    groups = token_batches(
        *lengths,
        max_tokens=max_tokens,
        seed=seed,
        epoch=epoch,
        shuffle=shuffle,
    )
    ids = {
        name: getattr(tokenizer, name)
        for name in ("pad_id", "bos_id", "eos_id")
    }
    for index in groups:
        yield collate(
            [data[i] for i in index], **ids, index=index, max_len=max_len
        )


# %% [markdown]
# One epoch over the de-en training split from the cache: every pair comes once, in batches
# within the budget, and the batches are those of `token_batches` on the same lengths.

# %%
from transformer.data import iterate_batches

train = load_encoded("de-en", "train")
batches = list(iterate_batches(train, cached["de-en"], seed=0, epoch=3))
groups = token_batches(
    train.src_lengths + 1, train.tgt_lengths + 1, seed=0, epoch=3
)
assert [b.index.tolist() for b in batches] == [g.tolist() for g in groups]
assert sorted(i for b in batches for i in b.index.tolist()) == list(
    range(len(train))
)
assert all(
    b.src.numel() <= 8_000 and b.tgt_in.numel() <= 8_000 for b in batches
)
print(f"{len(batches)} batches of {len(train):,} pairs")
