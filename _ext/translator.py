"""The page "Translate and look inside": the shipped models, translating in the reader's browser.

At `make book` this extension writes into the build, under `_static/translator/`:

- `<pair>.js` for each shipped pair (`checkpoints/<pair>`): its `config.json`, its
  `tokenizer.json` (BPE vocabulary and merges), spaCy's tokenizer rules for its source
  language (special cases, and the prefix, suffix, infix, token and URL patterns converted
  to JavaScript by `js_regex`), and its safetensors weights as they are, in base64. The page
  loads it with a `<script>` element, which works from `file://` where `fetch` does not.
  Writing it takes seconds; it is kept in the build folder and written again only when one
  of its inputs changes (a retrained model, other spaCy rules, this code).
- `core.js`: `translator/*.js` (tokenizer, model, decoding, worker) inside one function,
  whose source the page also starts its Web Worker from;
- `page.js` and `translator.css`: the widget.

The directive `translator` places the widget; only a page that has it loads these files.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import json
import re
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import Directive

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "translator"
# The files of the computing side, in the order they are joined into core.js.
CORE_FILES = ("spacy.js", "tokenizer.js", "model.js", "decode.js", "worker.js")
STATIC = "translator"  # the folder under _static
# Bump when the format of what is written changes: a new key makes the build rewrite it.
DATA_FORMAT = "transformer-book translator data 1"


def shipped_pairs() -> list[str]:
    """The language pairs with a shipped model, in the package's order."""
    from transformer.multi30k import PAIRS
    from transformer.paths import CHECKPOINTS_DIR

    return [p for p in PAIRS if (CHECKPOINTS_DIR / p / "config.json").is_file()]


@functools.cache
def language_name(code: str) -> str:
    """The name of spaCy's class for a language: German for de."""
    import spacy

    return type(spacy.blank(code)).__name__


def package_spacy_tokenizer(language: str):
    """The spaCy tokenizer that the package's `pretokenize` applies to `language`."""
    # The package's own, whatever it is built from (spaCy's blank tokenizer, or a faster
    # build of the same rules): transformer.tokenizer keeps it under a private name.
    from transformer.fast_words import spacy_tokenizer as _spacy_tokenizer

    return _spacy_tokenizer(language)


def spacy_fingerprint(language: str) -> bytes:
    """What the rules of `language` are made from: spaCy's version, the special cases and
    the patterns (their text), cheap to read where converting them is not."""
    import spacy

    tokenizer = package_spacy_tokenizer(language)
    searches = (
        "prefix_search",
        "suffix_search",
        "infix_finditer",
        "token_match",
        "url_match",
    )
    patterns = [
        None
        if (f := getattr(tokenizer, name)) is None
        else (f.__self__.pattern, f.__self__.flags)
        for name in searches
    ]
    rules = sorted((text, repr(tokens)) for text, tokens in tokenizer.rules.items())
    parts = [spacy.__version__, tokenizer.faster_heuristics, patterns, rules]
    return json.dumps(parts, ensure_ascii=False).encode()


@functools.cache
def spacy_rules(language: str) -> dict:
    """The package's spaCy tokenizer for `language` as data for translator/spacy.js."""
    from js_regex import to_javascript
    from spacy.symbols import ORTH
    from spacy.tokenizer import Tokenizer as SpacyTokenizer

    tokenizer = package_spacy_tokenizer(language)
    rules = tokenizer.rules
    # The special cases that the final matching pass looks for are matched by the tokens
    # that the affix rules alone cut them into: a tokenizer without special cases gives
    # those.
    plain = SpacyTokenizer(
        tokenizer.vocab,
        rules={},
        prefix_search=tokenizer.prefix_search,
        suffix_search=tokenizer.suffix_search,
        infix_finditer=tokenizer.infix_finditer,
        token_match=tokenizer.token_match,
        url_match=tokenizer.url_match,
    )
    patterns = [
        [token.text for token in plain(text)]
        for text in sorted(rules)
        # as Tokenizer.add_special_case decides which special cases the matcher needs
        if not tokenizer.faster_heuristics
        or tokenizer.find_prefix(text)
        or tokenizer.find_infix(text)
        or tokenizer.find_suffix(text)
        or " " in text
    ]

    def pattern(search, **options):
        return None if search is None else to_javascript(search.__self__, **options)

    return {
        "specials": {text: [t[ORTH] for t in tokens] for text, tokens in rules.items()},
        "patterns": patterns,
        "prefix": pattern(tokenizer.prefix_search),
        "suffix": pattern(tokenizer.suffix_search),
        "infix": pattern(tokenizer.infix_finditer, non_empty=True),
        "token_match": pattern(tokenizer.token_match),
        "url_match": pattern(tokenizer.url_match),
        # Python's whitespace (str.split, str.isspace), for the package's normalize
        "whitespace": to_javascript(re.compile(r"\s+")),
    }


def _weight_files(folder: Path, config: dict) -> list[Path]:
    """The safetensors files of a model folder, as checkpoint.load_model reads them."""
    if "weight_map" in config:
        return [folder / name for name in sorted(set(config["weight_map"].values()))]
    return [folder / "model.safetensors"]


def _inputs_digest(pair: str) -> str:
    """What the data of `pair` is made from: a change to any of it rewrites it."""
    from transformer.multi30k import PAIRS
    from transformer.paths import CHECKPOINTS_DIR

    folder = CHECKPOINTS_DIR / pair
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    digest = hashlib.sha256()
    for part in (
        DATA_FORMAT.encode(),
        spacy_fingerprint(PAIRS[pair][0]),
        Path(__file__).read_bytes(),
        (Path(__file__).parent / "js_regex.py").read_bytes(),
        (folder / "config.json").read_bytes(),
        (folder / "tokenizer.json").read_bytes(),
        *(path.read_bytes() for path in _weight_files(folder, config)),
    ):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def pair_data(pair: str) -> dict:
    """All that the page needs of one pair but its weights."""
    from transformer.multi30k import PAIRS, load_split
    from transformer.paths import CHECKPOINTS_DIR

    folder = CHECKPOINTS_DIR / pair
    source, target = PAIRS[pair]
    return {
        "format": DATA_FORMAT,
        "pair": pair,
        "names": [language_name(source), language_name(target)],
        "config": json.loads((folder / "config.json").read_text(encoding="utf-8")),
        "tokenizer": json.loads(
            (folder / "tokenizer.json").read_text(encoding="utf-8")
        ),
        "spacy": spacy_rules(source),
        # the first validation sentence: what the page translates when given none
        "example": load_split("val", source)[0],
    }


def write_pair_script(pair: str, folder: Path) -> Path:
    """Write `<pair>.js` into `folder` unless it is there already from the same inputs:
    one call of translatorData(data, weights), the weights as base64 strings."""
    from transformer.paths import CHECKPOINTS_DIR

    target = Path(folder) / f"{pair}.js"
    stamp = f"// {DATA_FORMAT}, inputs {_inputs_digest(pair)}\n"
    if target.is_file():
        with target.open(encoding="utf-8") as f:
            if f.readline() == stamp:
                return target
    data = pair_data(pair)
    files = _weight_files(CHECKPOINTS_DIR / pair, data["config"])
    weights = [base64.b64encode(path.read_bytes()).decode("ascii") for path in files]
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(stamp)
        f.write(
            f"// The {pair} model of checkpoints/{pair}, written by _ext/translator.py.\n"
        )
        f.write("translatorData(")
        f.write(json.dumps(data, ensure_ascii=False, separators=(",", ":")))
        f.write(",")
        f.write(json.dumps(weights))
        f.write(");\n")
    tmp.replace(target)
    return target


def core_source() -> str:
    """core.js: the files of the computing side inside one function, translatorCore(scope),
    which returns their names and, in a Web Worker, answers the page's messages."""
    body = "\n".join(
        f"// ---- translator/{name}\n{(SOURCES / name).read_text(encoding='utf-8')}"
        for name in CORE_FILES
    )
    return (
        "// Written by _ext/translator.py from translator/*.js: edit those.\n"
        "// eslint-disable-next-line no-unused-vars\n"
        "function translatorCore(scope) {\n"
        '"use strict";\n'
        f"{body}\n"
        "if (scope) {\n  serve(scope);\n}\n"
        "return { LanguagePair, Tokenizer, Transformer, readSafetensors, translate,"
        " SpacyTokenizer, compileRegExp };\n"
        "}\n"
    )


def write_static(folder: Path) -> None:
    """core.js, page.js and translator.css into `folder` (each written only if changed)."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {
        "core.js": core_source(),
        "page.js": (SOURCES / "page.js").read_text(encoding="utf-8"),
        "translator.css": (SOURCES / "translator.css").read_text(encoding="utf-8"),
    }
    for name, text in files.items():
        path = folder / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")


# ---- The directive and its node


class translator_widget(nodes.General, nodes.Element):  # noqa: N801 (docutils' style)
    """Where the widget goes."""


def _widget_html(pairs: list[str]) -> str:
    from transformer.multi30k import PAIRS
    from transformer.paths import CHECKPOINTS_DIR

    def option(pair: str) -> str:
        source, target = (language_name(code) for code in PAIRS[pair])
        folder = CHECKPOINTS_DIR / pair
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        size = sum(path.stat().st_size for path in _weight_files(folder, config))
        return (
            f'<option value="{html.escape(pair)}" data-megabytes="{size / 1e6:.0f}">'
            f"{source} → {target}</option>"
        )

    options = "".join(option(p) for p in pairs)
    template = (SOURCES / "widget.html").read_text(encoding="utf-8")
    return template.replace("<!-- pairs -->", options)


def visit_translator_widget(self, node) -> None:
    # the pairs shipped now, not when the page was read: see _pages_to_rewrite
    self.body.append(_widget_html(shipped_pairs()))
    raise nodes.SkipNode


def skip_translator_widget(self, node) -> None:
    raise nodes.SkipNode


class TranslatorDirective(Directive):
    """```{translator}``` places the translation widget, for every shipped pair."""

    has_content = False

    def run(self):
        if not shipped_pairs():
            raise self.error("translator: no shipped model in checkpoints/")
        env = self.state.document.settings.env
        env.translator_pages = getattr(env, "translator_pages", set()) | {env.docname}
        return [translator_widget()]


# ---- Build events


def _pages_to_rewrite(app, env, added, changed, removed) -> list[str]:
    # The widget lists the shipped pairs, which its page's source does not name: a page
    # with it is written again at every build, so that a new model shows up.
    return sorted(getattr(env, "translator_pages", set()) - set(removed))


def _purge_page(app, env, docname) -> None:
    getattr(env, "translator_pages", set()).discard(docname)


def _merge_pages(app, env, docnames, other) -> None:
    env.translator_pages = getattr(env, "translator_pages", set()) | getattr(
        other, "translator_pages", set()
    )


def _static_folder(app) -> Path:
    return Path(app.doctreedir).parent / "translator_static"


def _write_assets(app) -> None:
    if app.builder.format != "html":
        return
    static = _static_folder(app)
    folder = static / STATIC
    write_static(folder)
    for pair in shipped_pairs():
        write_pair_script(pair, folder)
    # copied to _static/translator/ (a name that exclude_patterns must not hold: Sphinx
    # leaves out the static files that match them)
    app.config.html_static_path.append(str(static))


def _add_page_assets(app, pagename, templatename, context, doctree) -> None:
    # Only the page with the widget loads its scripts (added here, they are this page's).
    if doctree is None or not any(doctree.findall(translator_widget)):
        return
    app.add_css_file(f"{STATIC}/translator.css")
    app.add_js_file(f"{STATIC}/core.js")
    app.add_js_file(f"{STATIC}/page.js", **{"data-pairs": " ".join(shipped_pairs())})


def setup(app):
    app.add_node(
        translator_widget,
        html=(visit_translator_widget, None),
        latex=(skip_translator_widget, None),
        text=(skip_translator_widget, None),
        man=(skip_translator_widget, None),
        texinfo=(skip_translator_widget, None),
    )
    app.add_directive("translator", TranslatorDirective)
    app.connect("builder-inited", _write_assets)
    app.connect("env-get-outdated", _pages_to_rewrite)
    app.connect("env-purge-doc", _purge_page)
    app.connect("env-merge-info", _merge_pages)
    # before vega_offline's handler, which rebuilds the page's list of scripts
    app.connect("html-page-context", _add_page_assets, priority=400)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
