"""The page "Translate and look inside": the shipped models, translating in the reader's browser.

At `make book` this extension writes into the build, under `_static/translator/`:

- `<pair>.js` for each shipped pair (`checkpoints/<pair>`): its `config.json`, whose
  model config the package reads in full (a field added since the model was saved, such
  as LayerNorm's ε, at the value that model was built with), its
  `tokenizer.json` (BPE vocabulary and merges), spaCy's tokenizer rules for its source
  language and for its target, in which a forced prefix is written (special cases, and the
  prefix, suffix, infix, token and URL patterns converted to JavaScript by `js_regex`), and
  the list of `<pair>-1.js`, `<pair>-2.js`, …: its safetensors weights as they are, in
  base64, cut into chunks of CHUNK_BYTES, so that each is a short task to read and the
  page can show its progress. They are loaded as classic scripts (a `<script>` element,
  or a worker's importScripts), which work from `file://` where `fetch` does not, each
  named with a digest of its text, so that a browser may keep it in its cache.
  Writing them takes seconds; they are kept in the build folder and written again only
  when one of their inputs changes (a retrained model, other spaCy rules, this code).
  With them go the numbers that the package defines and the page must not type again:
  the special ids, the decoding defaults and the extra output length.
- `<pair>-test.js`: the pair's test_2016_flickr sources and references, sacreBLEU's
  settings and signatures, and the scores that the results chapter reports for the
  shipped model (its stored evaluation, checkpoints/scores/<pair>.json), for the page's
  button that scores the test set; loaded when it is pressed.
- `core.js`: the computing side, CORE_FILES of `translator/` (tokenizer, model, decoding,
  scoring, worker) inside one function, whose source the page also starts its Web Workers
  from, with WARM_UP, what a worker warms up on before a pair loads: a tiny model's
  config, every field of the package's, and the package's decoding defaults;
- `page.js`: the widget, PAGE_FILES of `translator/` inside one function, and
  `translator.css`.

The directive `translator` places the widget, and `translator search` (or `attention`,
`score`) each of its other parts, from `translator/widget.html`; only a page that has them
loads these files, and the scripts' element names each pair's data file, its test split
and their sizes. The extension imports only the package's public names.
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

from transformer import layout  # torch-free: the files of a model folder
from transformer.atomic import atomic_write

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "translator"
# The files of the computing side, in the order they are joined into core.js.
CORE_FILES = (
    "spacy.js",
    "tokenizer.js",
    "weights.js",
    "ops.js",
    "model.js",
    "knockout.js",
    "decode.js",
    "sacrebleu.js",
    "worker.js",
)
# The parts of the page, each with one job, in the order they are joined into page.js.
PAGE_FILES = (
    "view.js",  # pieces, colours and the theme
    "loader.js",  # the pairs' data and the Web Workers that translate
    "knockout.js",  # parts switched off: their spelling, as the package writes it
    "link.js",  # the search's settings, the link and the command line
    "hints.js",  # input the models cannot read
    "sentences.js",  # a text cut into sentences, by the package's rule
    "result_view.js",  # the translation, free and forced, and greedy beside beam
    "search_view.js",  # the beam search, step by step
    "heatmap.js",  # one attention heatmap
    "grid.js",  # every layer and head at once
    "attention_view.js",  # the pieces, the heatmap and the grid together
    "score_view.js",  # the test set, translated and scored
    "knockout_view.js",  # parts switched off, the grid's colours, the sample's score
    "page.js",  # the widget's controls: the parts together
)
# The names that core.js hands to the page and to the tests.
CORE_NAMES = (
    "LanguagePair",
    "Tokenizer",
    "Transformer",
    "CONFIG_KEYS",
    "WARM_UP",
    "warmUp",
    "readSafetensors",
    "translate",
    "greedyDecode",
    "beamSearch",
    "outputLimit",
    "finish",
    "SacreBleu",
    "pythonFixed",
    "SpacyTokenizer",
    "compileRegExp",
    "serve",
    "drive",
    "loadPair",
    "loadPairScripts",
    "parseKnockOut",
    "knockOutText",
)
# The names that page.js hands to the tests (its pure functions).
PAGE_NAMES = (
    "languageHint",
    "unreadablePieces",
    "readLink",
    "linkTo",
    "commandLine",
    "stepSummary",
    "splitSentences",
    "SENTENCE_RULE",
)
STATIC = "translator"  # the folder under _static
# Bump when the format of what is written changes: a new key makes the build rewrite it.
DATA_FORMAT = "transformer-book translator data 5"
# The bytes of weights in one data chunk: a multiple of 3, so that each chunk's base64
# stands alone; 2 MiB of base64 text, read in a few milliseconds.
CHUNK_BYTES = 3 << 19
# How many of a source language's most frequent words (those that are not among the
# other languages' as many) the page knows it by, to offer the right pair.
HINT_WORDS = 100
# The split that the page's score button translates, as the results chapter does.
TEST_SPLIT = "test_2016_flickr"
# The stored knockout table, where experiments/knockout_importance.py writes it (its
# RESULT, which a test holds equal: the build cannot import experiments/).
IMPORTANCE = ROOT / "experiments" / "results" / "knockout-importance.json"
# The page that reports the shipped models' scores, which the score button links to.
RESULTS_PAGE = "15_results"


def shipped_pairs() -> list[str]:
    """The language pairs with a shipped model, in the package's order."""
    from transformer.multi30k import PAIRS
    from transformer.paths import CHECKPOINTS_DIR

    return [p for p in PAIRS if (CHECKPOINTS_DIR / p / layout.CONFIG).is_file()]


@functools.cache
def language_name(code: str) -> str:
    """The name of spaCy's class for a language: German for de."""
    import spacy

    return type(spacy.blank(code)).__name__


def package_spacy_tokenizer(language: str):
    """The spaCy tokenizer that the package's `fast_pretokenize` applies to `language`."""
    # The package's own, whatever it is built from (spaCy's blank tokenizer, or a faster
    # build of the same rules).
    from transformer.words import spacy_tokenizer

    return spacy_tokenizer(language)


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


def package_numbers(pair: str) -> dict:
    """What the package defines that the page needs, read from the package: the
    tokenizer's special ids, and decoding's defaults (DecodeOptions) and extra output
    length (EXTRA_LENGTH)."""
    from transformer.paths import CHECKPOINTS_DIR

    return _package_numbers(CHECKPOINTS_DIR / pair)


def decoding_defaults() -> dict:
    """The package's search: DecodeOptions' defaults and EXTRA_LENGTH."""
    from transformer.decode_options import DecodeOptions
    from transformer.paper_search import EXTRA_LENGTH

    defaults = DecodeOptions()
    return {
        "beam_size": defaults.beam_size,
        "alpha": defaults.alpha,
        "extra_length": EXTRA_LENGTH,
    }


@functools.cache
def _package_numbers(folder: Path) -> dict:
    from transformer.checkpoint import load_model

    _, tokenizer = load_model(folder)  # and the model checked against it
    return {
        "special_ids": {
            "pad": tokenizer.pad_id,
            "unk": tokenizer.unk_id,
            "bos": tokenizer.bos_id,
            "eos": tokenizer.eos_id,
        },
        "decoding": decoding_defaults(),
    }


def config_record(folder: Path) -> dict:
    """A model folder's config.json, its model config as the package reads it: every
    field, one that the config gained after the model was saved at the value that model
    was built with (LayerNorm's ε)."""
    from transformer.config_checks import config_from_dict

    record = json.loads((folder / layout.CONFIG).read_text(encoding="utf-8"))
    return record | {"model": config_from_dict(record["model"]).to_dict()}


def warm_up_data() -> dict:
    """What a worker warms up on before a pair loads (worker.js): the config of a tiny
    model of the package's TransformerConfig, every field with its default but the sizes,
    and the package's search."""
    from transformer.config import TransformerConfig

    sizes = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, max_len=32)
    config = TransformerConfig(src_vocab_size=1000, **sizes)
    return {"config": config.to_dict(), "decoding": decoding_defaults()}


def _inputs_digest(pair: str) -> str:
    """What the data of `pair` is made from: a change to any of it rewrites it."""
    from transformer.multi30k import PAIRS
    from transformer.paths import CHECKPOINTS_DIR

    folder = CHECKPOINTS_DIR / pair
    config = json.loads((folder / layout.CONFIG).read_text(encoding="utf-8"))
    digest = hashlib.sha256()
    for part in (
        DATA_FORMAT.encode(),
        json.dumps(package_numbers(pair)).encode(),
        *(spacy_fingerprint(language) for language in PAIRS[pair]),
        Path(__file__).read_bytes(),
        (Path(__file__).parent / "js_regex.py").read_bytes(),
        (folder / layout.CONFIG).read_bytes(),
        json.dumps(config_record(folder)).encode(),
        json.dumps(knockout_importance(pair)).encode(),
        (folder / layout.TOKENIZER).read_bytes(),
        *(path.read_bytes() for path in layout.weight_files(folder, config)),
    ):
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


def knockout_importance(pair: str) -> dict | None:
    """What the stored knockout table (experiments/knockout_importance.py, drawn by the
    appendix "What the heads do") says of `pair`'s heads, for the page's grid: the
    split, its size and the search that scored it, the BLEU with nothing off, and per
    head (the package's spelling) the change in BLEU when that head alone is off; None
    if the table holds no such pair."""
    if not IMPORTANCE.is_file():
        return None
    record = json.loads(IMPORTANCE.read_text(encoding="utf-8"))
    found = record["pairs"].get(pair)
    if found is None:
        return None
    baseline = found["baseline_bleu"]
    return {
        "split": record["split"],
        "sentences": record["sentences"],
        "decoding": record["decoding"],
        "baseline_bleu": baseline,
        "changes": {h["part"]: round(h["bleu"] - baseline, 2) for h in found["heads"]},
    }


def pair_data(pair: str) -> dict:
    """All that the page needs of one pair but its weights."""
    from transformer.checked_data import load_split
    from transformer.multi30k import PAIRS
    from transformer.paths import CHECKPOINTS_DIR

    folder = CHECKPOINTS_DIR / pair
    source, target = PAIRS[pair]
    return {
        "format": DATA_FORMAT,
        "pair": pair,
        "names": [language_name(source), language_name(target)],
        "config": config_record(folder),
        "tokenizer": json.loads(
            (folder / layout.TOKENIZER).read_text(encoding="utf-8")
        ),
        "spacy": spacy_rules(source),
        # the target's, to write a forced prefix as text that the command line reads
        "target_spacy": spacy_rules(target),
        **package_numbers(pair),
        # the first validation sentence: what the page translates when given none
        "example": load_split("val", source)[0],
        "importance": knockout_importance(pair),
    }


def scoring_settings() -> dict:
    """sacreBLEU's default BLEU and chrF, which the package's scores use, as
    translator/sacrebleu.js takes them: their settings and signatures (with one
    reference per sentence), and Python's whitespace, at which sacreBLEU splits."""
    from js_regex import to_javascript
    from sacrebleu.metrics import BLEU, CHRF

    bleu, chrf = BLEU(), CHRF()
    for metric in (bleu, chrf):  # a signature names the references' count once scored
        metric.corpus_score(["a"], [["a"]])
    return {
        "bleu": {
            "tokenize": bleu.tokenizer_signature,
            "smooth_method": bleu.smooth_method,
            "lowercase": bleu.lowercase,
            "effective_order": bleu.effective_order,
            "max_ngram_order": bleu.max_ngram_order,
            "signature": str(bleu.get_signature()),
        },
        "chrf": {
            "char_order": chrf.char_order,
            "word_order": chrf.word_order,
            "beta": chrf.beta,
            "lowercase": chrf.lowercase,
            "whitespace": chrf.whitespace,
            "eps_smoothing": chrf.eps_smoothing,
            "signature": str(chrf.get_signature()),
        },
        "whitespace": to_javascript(re.compile(r"\s+")),
    }


def reported_scores(pair: str) -> dict | None:
    """The shipped model's scores on the test split as the results chapter reports
    them: its stored evaluation (`evaluate --json`, read by `stored_scores`), as
    sacreBLEU prints them, with the search that made them ({bleu, chrf, beam_size,
    alpha, chapter}); None if none is stored for `pair` or it scores other weights."""
    from transformer.cli.evaluate import model_digest
    from transformer.evaluate import STORED_SCORES, stored_scores
    from transformer.paths import CHECKPOINTS_DIR

    if not (STORED_SCORES / f"{pair}.json").is_file():
        return None
    scores, record = stored_scores(pair)
    if record["model_sha256"] != model_digest(CHECKPOINTS_DIR / pair):
        return None
    options = record["options"]
    return {
        "bleu": f"{scores.bleu:.2f}",  # as sacreBLEU prints a score
        "chrf": f"{scores.chrf:.2f}",
        "beam_size": options["beam_size"],
        "alpha": options["alpha"],
        "chapter": RESULTS_PAGE,
    }


def test_set(pair: str) -> dict:
    """What the page's score button needs of `pair`: the test split's sources and
    references, sacreBLEU's settings and the results chapter's scores."""
    from transformer.checked_data import load_pairs

    sources, references = zip(*load_pairs(TEST_SPLIT, pair), strict=True)
    return {
        "pair": pair,
        "split": TEST_SPLIT,
        "sources": list(sources),
        "references": list(references),
        "settings": scoring_settings(),
        "reported": reported_scores(pair),
    }


def digest_name(name: str, text: str) -> str:
    """`name?v=DIGEST`: the file's address with a digest of its text, which a browser
    may cache for as long as the text stays."""
    return f"{name}?v={hashlib.sha256(text.encode()).hexdigest()[:16]}"


def _write_text(target: Path, text: str) -> None:
    """Write `text` to `target` unless it holds it already (atomically)."""
    if not target.is_file() or target.read_text(encoding="utf-8") != text:
        atomic_write(target, text.encode("utf-8"))


def write_test_script(pair: str, folder: Path) -> str:
    """Write `<pair>-test.js` into `folder` (if changed): one call of
    translatorTestSet(data). Its name with its digest."""
    text = (
        f"// The {TEST_SPLIT} split of {pair}, written by _ext/translator.py.\n"
        f"translatorTestSet({json.dumps(test_set(pair), ensure_ascii=False)});\n"
    )
    _write_text(Path(folder) / f"{pair}-test.js", text)
    return digest_name(f"{pair}-test.js", text)


def _chunk_name(pair: str, index: int) -> str:
    return f"{pair}-{index + 1}.js"


def write_pair_script(pair: str, folder: Path) -> dict:
    """Write `<pair>.js` and its weights' chunks into `folder` unless they are there
    already from the same inputs: one call of translatorData(data), whose
    data.weights lists the chunks, each one call of translatorWeights(pair, index,
    base64). Returns {"data": the first's name with its digest, "bytes": the size of
    them all}."""
    from transformer.paths import CHECKPOINTS_DIR

    folder = Path(folder)
    target = folder / f"{pair}.js"
    stamp = f"// {DATA_FORMAT}, inputs {_inputs_digest(pair)}\n"
    if target.is_file():
        text = target.read_text(encoding="utf-8")
        if text.startswith(stamp):
            call = "translatorData("
            head = json.loads(text[text.index(call) + len(call) : text.rindex(")")])
            names = [chunk["src"].split("?")[0] for chunk in head["weights"]["chunks"]]
            if all((folder / name).is_file() for name in names):
                return {
                    "data": digest_name(target.name, text),
                    "bytes": len(text.encode())
                    + sum((folder / name).stat().st_size for name in names),
                }
    data = pair_data(pair)
    files = layout.weight_files(CHECKPOINTS_DIR / pair, data["config"])
    weights = b"".join(path.read_bytes() for path in files)
    chunks = []
    for index, start in enumerate(range(0, len(weights), CHUNK_BYTES)):
        part = base64.b64encode(weights[start : start + CHUNK_BYTES]).decode("ascii")
        text = f'translatorWeights("{pair}", {index}, "{part}");\n'
        _write_text(folder / _chunk_name(pair, index), text)
        chunks.append(
            {
                "src": digest_name(_chunk_name(pair, index), text),
                "bytes": len(text.encode()),
            }
        )
    # the chunks of a larger model, written before, are no longer read
    for old in folder.glob(f"{pair}-*.js"):
        if re.fullmatch(rf"{re.escape(pair)}-(\d+)\.js", old.name) and int(
            old.name[len(pair) + 1 : -3]
        ) > len(chunks):
            old.unlink()
    data["weights"] = {
        "files": [path.stat().st_size for path in files],
        "chunks": chunks,
    }
    text = (
        stamp
        + f"// The {pair} model of checkpoints/{pair}, written by _ext/translator.py;"
        + f" its weights are in {_chunk_name(pair, 0)} to"
        + f" {_chunk_name(pair, len(chunks) - 1)}.\n"
        + f"translatorData({json.dumps(data, ensure_ascii=False, separators=(',', ':'))});\n"
    )
    _write_text(target, text)
    return {
        "data": digest_name(target.name, text),
        "bytes": len(text.encode()) + sum(chunk["bytes"] for chunk in chunks),
    }


def core_source() -> str:
    """core.js: the files of the computing side inside one function, translatorCore(scope),
    which returns their names and, in a Web Worker, answers the page's messages."""
    body = "\n".join(
        f"// ---- translator/{name}\n{(SOURCES / name).read_text(encoding='utf-8')}"
        for name in CORE_FILES
    )
    warm_up = json.dumps(warm_up_data(), separators=(",", ":"))
    return (
        "// Written by _ext/translator.py from translator/*.js: edit those.\n"
        "// eslint-disable-next-line no-unused-vars\n"
        "function translatorCore(scope) {\n"
        '"use strict";\n'
        "// What a worker warms up on: a tiny model's config, and the package's search.\n"
        f"const WARM_UP = {warm_up};\n"
        f"{body}\n"
        "if (scope) {\n  serve(scope);\n}\n"
        f"return {{ {', '.join(CORE_NAMES)} }};\n"
        "}\n"
    )


def page_source() -> str:
    """page.js: the page's parts inside one function, translatorPage(script), which
    starts the widget when given its script element and returns the parts' pure
    functions (for the tests, given null)."""
    body = "\n".join(
        f"// ---- translator/{name}\n{(SOURCES / name).read_text(encoding='utf-8')}"
        for name in PAGE_FILES
    )
    return (
        "// Written by _ext/translator.py from translator/*.js: edit those.\n"
        "function translatorPage(script) {\n"
        '"use strict";\n'
        f"{body}\n"
        "if (script) {\n  startPage(script);\n}\n"
        f"return {{ {', '.join(PAGE_NAMES)} }};\n"
        "}\n"
        'translatorPage(typeof document === "undefined" ? null : document.currentScript);\n'
    )


def write_static(folder: Path) -> None:
    """core.js, page.js and translator.css into `folder` (each written only if changed)."""
    files = {
        "core.js": core_source(),
        "page.js": page_source(),
        "translator.css": (SOURCES / "translator.css").read_text(encoding="utf-8"),
    }
    for name, text in files.items():
        _write_text(Path(folder) / name, text)


# ---- The directive and its node


class translator_widget(nodes.General, nodes.Element):  # noqa: N801 (docutils' style)
    """Where the widget goes."""


# The widget's parts, each placed by its own directive (```{translator} search```):
# widget.html holds them in this order, each after a comment `<!-- part NAME: … -->`.
PARTS = ("main", "search", "attention", "score")


def _widget_parts() -> dict[str, str]:
    template = (SOURCES / "widget.html").read_text(encoding="utf-8")
    pieces = re.split(r"^<!-- part (\w+): .*-->\n", template, flags=re.MULTILINE)
    parts = dict(zip(pieces[1::2], pieces[2::2], strict=True))
    if tuple(parts) != PARTS:
        raise ValueError(
            f"translator/widget.html has the parts {list(parts)}, not {PARTS}"
        )
    return parts


@functools.cache
def hint_words(language: str) -> tuple[str, ...]:
    """The HINT_WORDS most frequent words of `language` in the training split,
    lowercased, leaving out those among as many of another language's (the other
    sources' and the targets'): what the page tells a language by."""
    from collections import Counter

    from transformer.checked_data import load_split
    from transformer.multi30k import PAIRS

    def frequent(code: str) -> list[str]:
        words = Counter(
            word
            for sentence in load_split("train", code)
            for word in re.findall(r"[^\W\d_]+", sentence.lower())
        )
        return [word for word, _ in words.most_common(HINT_WORDS)]

    others = {code for pair in PAIRS.values() for code in pair} - {language}
    common = {word for code in sorted(others) for word in frequent(code)}
    return tuple(word for word in frequent(language) if word not in common)


def _widget_html(pairs: list[str], part: str = "main") -> str:
    from transformer.multi30k import PAIRS

    def option(pair: str) -> str:
        source, target = (language_name(code) for code in PAIRS[pair])
        words = " ".join(hint_words(PAIRS[pair][0]))
        return (
            f'<option value="{html.escape(pair)}" data-words="{html.escape(words)}"'
            f' data-language="{html.escape(source)}">{source} → {target}</option>'
        )

    options = "".join(option(p) for p in pairs)
    # the search that the page starts with: the package's defaults
    defaults = package_numbers(pairs[0])["decoding"]
    template = _widget_parts()[part]
    return (
        template.replace("<!-- pairs -->", options)
        .replace('data-beam-size=""', f'data-beam-size="{defaults["beam_size"]}"')
        .replace('data-alpha=""', f'data-alpha="{defaults["alpha"]}"')
    )


def visit_translator_widget(self, node) -> None:
    # the pairs shipped now, not when the page was read: see _pages_to_rewrite
    self.body.append(_widget_html(shipped_pairs(), node["part"]))
    raise nodes.SkipNode


def skip_translator_widget(self, node) -> None:
    raise nodes.SkipNode


class TranslatorDirective(Directive):
    """```{translator}``` places the translation widget, for every shipped pair;
    ```{translator} search``` (or attention, score) one of its other parts."""

    has_content = False
    optional_arguments = 1

    def run(self):
        if not shipped_pairs():
            raise self.error("translator: no shipped model in checkpoints/")
        part = self.arguments[0] if self.arguments else "main"
        if part not in PARTS:
            raise self.error(f"translator: no part {part!r}: one of {', '.join(PARTS)}")
        env = self.state.document.settings.env
        env.translator_pages = getattr(env, "translator_pages", set()) | {env.docname}
        return [translator_widget(part=part)]


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
    # what the page's script element names, in _add_page_assets
    app.translator_files = {
        pair: {
            **write_pair_script(pair, folder),
            "test": write_test_script(pair, folder),
        }
        for pair in shipped_pairs()
    }
    # copied to _static/translator/ (a name that exclude_patterns must not hold: Sphinx
    # leaves out the static files that match them)
    app.config.html_static_path.append(str(static))


def _add_page_assets(app, pagename, templatename, context, doctree) -> None:
    # Only the page with the widget loads its scripts (added here, they are this page's).
    if doctree is None or not any(doctree.findall(translator_widget)):
        return
    app.add_css_file(f"{STATIC}/translator.css")
    app.add_js_file(f"{STATIC}/core.js")
    files = getattr(app, "translator_files", {})
    app.add_js_file(
        f"{STATIC}/page.js",
        **{
            "data-pairs": " ".join(shipped_pairs()),
            "data-files": json.dumps(files, separators=(",", ":")),
        },
    )


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
