"""The page "Translate and look inside" in headless Chromium with DNS blocked, from file://
and over HTTP: a shared link, `?pair=…&text=…`, gives the package's translation in the
element #translation, with the beam search's steps, the heatmap and the grid of heads; the
step control, a forced piece and the grid each change what the page shows, and a forced
start keeps the free translation beside it, with its command line; loading shows its
progress in the files' true size, each file named by its digest; a 300-word paragraph
leaves the page responsive; Cancel stops the work and clears what it replaced, as an
error does; bad input gets its message, text in the other pair's language a hint that
offers it; the score names its pair and opens its worst sentences above; parts
switched off in the grid and the panel translate again as the package does, kept by the
link, beside the translation with everything on, and a sample scored both ways; a phone's
viewport has large controls, a grid that enlarges and no overflow; the dark theme keeps
every part readable; what a link carries stays text; there is no page error and no
network request; and no other page of the book loads the models."""

from __future__ import annotations

import functools
import hashlib
import http.server
import json
import re
import shlex
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from html import unescape as html_unescape
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlparse

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS

from transformer.multi30k import load_split
from transformer.translation import load_pair_model, split_sentences, translate

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE = "chapters/16_translate.html"
SENTENCES = {
    "de-en": "Zwei Hunde spielen im Schnee.",
    "fr-en": "Un homme fait du vélo dans la rue.",
}
# A sentence where greedy decoding and beam search part.
PARTING = "Zwei Pudel rennen durch den Schnee."
SETTLED = (
    "#translator:is([data-state=done], [data-state=error], [data-state=cancelled])"
)
# Registered before the page's scripts: window.statuses, each status line shown, with
# the progress bar's value and maximum.
STATUSES = """
window.statuses = [];
new MutationObserver(() => {
  const status = document.getElementById("translator-status");
  if (status && status.textContent !== window.statuses.at(-1)?.[0]) {
    const bar = document.getElementById("translator-progress");
    window.statuses.push([status.textContent, bar.value, bar.max]);
  }
}).observe(document, { subtree: true, childList: true, characterData: true });
"""


@functools.cache
def packages(pair: str, text: str, beam: int) -> str:
    model, tokenizer = load_pair_model(pair)
    # the page translates sentence by sentence
    return translate(model, tokenizer, [text], beam_size=beam, by_sentence=True)[0]


def commanded(command: str) -> str:
    """What the package translates for the command line that the page shows."""
    from transformer.cli.translate import translate_parser

    words = shlex.split(command)
    assert words[:4] == ["python", "-m", "transformer", "translate"], command
    args = translate_parser().parse_args(words[4:])
    model, tokenizer = load_pair_model(args.pair)
    options = {"beam_size": args.beam, "alpha": args.alpha, "prefix": args.prefix}
    return translate(model, tokenizer, args.sentences, **options)[0]


def paragraph(words: int = 300) -> str:
    """Test sentences, one after another, up to `words` words: a long German text."""
    text: list[str] = []
    for sentence in load_split("test_2016_flickr", "de"):
        text += sentence.split()
        if len(text) >= words:
            return " ".join(text[:words])
    raise AssertionError("the test split has fewer words")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """Serves the book without a log line per file, and answers the browser's request
    for a site icon, which the book has none of, with no content rather than a 404 (which
    the console would report, on every page)."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/favicon.ico":
            self.send_response(204)
            self.end_headers()
            return
        super().do_GET()


@pytest.fixture(scope="module")
def served(book: Path) -> Iterator[str]:
    """The book served by a local http.server: its origin."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(book))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


def address(book: Path, origin: str | None, **params) -> str:
    """The page's URL, from file:// or from `origin`, with a query."""
    base = f"{origin}{PAGE}" if origin else (book / PAGE).as_uri()
    return f"{base}?{urlencode(params)}" if params else base


@contextmanager
def opened(
    url: str,
    *,
    width: int = 1280,
    height: int = 1000,
    touch: bool = False,
    theme: str = "light",
    expect: tuple[str, ...] = (),
    routes: dict | None = None,
) -> Iterator:
    """The page at `url`, loaded, in headless Chromium, in the book's `theme`, with
    `routes` ({glob: handler}) answering some of its requests; on leaving, no page
    error, no console error or warning but those that hold a string of `expect`, and
    no request beyond the page's own origin."""
    from playwright.sync_api import sync_playwright

    origin = "file:" if url.startswith("file:") else url[: url.index("/", 8) + 1]
    args = CHROMIUM_ARGS
    if not url.startswith("file:"):
        # every host name still fails to resolve, but for the server's address
        args = [
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
            if arg.startswith("--host-resolver-rules")
            else arg
            for arg in CHROMIUM_ARGS
        ]
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        context = browser.new_context(
            viewport={"width": width, "height": height},
            has_touch=touch,
            is_mobile=touch,
        )
        # the theme that the book's switch stores, read as the page loads
        context.add_init_script(
            f"localStorage.setItem('mode', '{theme}');"
            f" localStorage.setItem('theme', '{theme}');"
        )
        # every status line the widget shows, in order
        context.add_init_script(STATUSES)
        page = context.new_page()
        for glob, handler in (routes or {}).items():
            page.route(glob, handler)
        page.set_default_timeout(WAIT_MS)
        page.on("pageerror", lambda exc: problems.append(f"script error: {exc}"))
        page.on(
            "console",
            lambda msg: (
                problems.append(f"console {msg.type}: {msg.text}")
                if msg.type in ("error", "warning")
                and not any(e in msg.text for e in expect)
                else None
            ),
        )
        page.on(
            "request",
            lambda req: (
                problems.append(f"network request: {req.url}")
                if not req.url.startswith((origin, "data:", "blob:", "about:"))
                else None
            ),
        )
        page.goto(url, wait_until="load")
        yield page
        browser.close()
    assert not problems, "\n".join(problems)


def cleared(page) -> bool:
    """Whether the page shows no translation: no text, table, link, search or heatmap."""
    return page.evaluate(
        """() => document.getElementById("translation").textContent === ""
             && ["compare", "search", "inside"].every(
                  (id) => document.getElementById(`translator-${id}`).hidden)
             && document.getElementById("translator-link").parentElement.hidden"""
    )


def settle(page) -> str:
    """Wait until the page has translated (or said why not), and drawn: its state."""
    page.wait_for_selector(SETTLED)
    return page.get_attribute("#translator", "data-state")


def shown(page) -> dict:
    return {
        "state": page.get_attribute("#translator", "data-state"),
        "status": page.text_content("#translator-status"),
        "translation": page.text_content("#translation"),
        "text": page.input_value("#translator-text"),
        "warnings": page.locator("#translator-warnings li").all_text_contents(),
        "link": page.get_attribute("#translator-link", "href"),
        "link shown": page.is_visible("#translator-link"),
        "pieces": page.locator("#translator-source .translator-piece").count(),
        "outputs": page.locator("#translator-output .translator-piece").count(),
        "drawn": page.get_attribute("#translator-heatmap", "data-drawn"),
        "heads": page.locator("#translator-grid canvas").count(),
        "steps": int(page.get_attribute("#translator-step", "max")),
        "summary": page.text_content("#translator-step-summary"),
        "compare": page.locator("#translator-compare-rows tr").count(),
        "elements": page.locator("#translator b, #translator img").count(),
    }


@pytest.mark.parametrize("pair", SENTENCES)
def test_a_shared_link_translates_from_file(book: Path, pair: str):
    text = SENTENCES[pair]
    with opened(address(book, None, pair=pair, text=text)) as page:
        assert settle(page) == "done", page.text_content("#translator-status")
        got = shown(page)
    assert got["text"] == text
    assert got["translation"] == packages(pair, text, 4)
    assert "on the page itself" not in got["status"]  # the worker ran
    assert got["pieces"] > 0 and got["outputs"] > 0 and got["drawn"]
    assert got["steps"] >= got["outputs"] and got["compare"] == 2
    assert got["heads"] == 3 * 9  # layers x (heads + their mean)
    assert got["warnings"] == []


def test_a_shared_link_translates_over_http_and_stays_text(book: Path, served: str):
    """Served by a local http.server, greedy decoding (beam=1), a sentence with markup:
    the markup is text to translate, as in the command line, and no element of it."""
    text = "Zwei <b>Hunde</b> spielen <img src=x onerror=alert(1)> im Schnee."
    url = address(book, served, pair="de-en", text=text, beam="1")
    with opened(url) as page:
        assert settle(page) == "done", page.text_content("#translator-status")
        got = shown(page)
    assert got["text"] == text and got["elements"] == 0
    assert got["translation"] == packages("de-en", text, 1)
    assert got["link"] == url  # a link to this translation


@pytest.mark.parametrize("where", ["file", "http"])
def test_the_step_control_a_forced_piece_and_the_grid_change_the_page(
    book: Path, served: str, where: str
):
    url = address(book, served if where == "http" else None, pair="de-en", text=PARTING)
    with opened(url) as page:
        assert settle(page) == "done"
        before = shown(page)
        assert "They part at step" in page.text_content("#translator-part")
        # the step control: the slider's keys move through the steps
        page.focus("#translator-step")
        page.keyboard.press("Home")
        first = page.text_content("#translator-step-summary")
        page.keyboard.press("ArrowRight")
        second = page.text_content("#translator-step-summary")
        assert first.startswith("Step 1:") and second.startswith("Step 2:")
        page.click("#translator-next")
        assert page.text_content("#translator-step-summary").startswith("Step 3:")
        # the grid: a head shown large
        page.click("#translator-grid button[data-view='0 2']")
        assert page.get_attribute("#translator-heatmap", "data-drawn") == "cross 0 2"
        assert page.input_value("#translator-head") == "3"
        # a forced piece: the second most probable at step 2, then decoded again
        page.focus("#translator-step")
        page.keyboard.press("Home")
        page.click("#translator-next")
        tokens = page.locator("#translator-next-tokens button:not([disabled])")
        forced = tokens.nth(1).text_content()
        tokens.nth(1).click()
        page.wait_for_selector("#translator-forced:not([hidden])")
        assert settle(page) == "done"
        after = shown(page)
        prefix = page.locator("#translator-prefix .translator-piece")
        assert prefix.count() == 2 and prefix.nth(1).text_content() == forced
        # the forced view: labelled rows, the free translation beside them, the first
        # step after the forced start, and the command that gives the same
        rows = page.locator("#translator-compare-rows tr")
        names = rows.locator("td:first-child").all_text_contents()
        assert [n.endswith(", forced start") for n in names] == [True, True, False]
        assert names[2].endswith(", free")
        assert rows.nth(2).locator("td").nth(1).text_content() == before["translation"]
        assert (
            page.locator("#translator-compare-rows .translator-forced-row").count() == 2
        )
        assert page.input_value("#translator-step") == "3"
        assert page.text_content("#translator-step-summary").startswith("Step 3: ")
        page.focus("#translator-step")
        page.keyboard.press("Home")
        assert page.text_content("#translator-step-summary").startswith(
            "Step 1 is forced: "
        )
        command = page.text_content("#translator-command code")
    assert after["translation"] != before["translation"]
    assert command.startswith("python -m transformer translate --pair de-en --prefix ")
    assert commanded(command) == after["translation"]
    query = parse_qs(urlparse(after["link"]).query)
    assert len(query["prefix"][0].split(" ")) == 2
    # the link opens the page with the same forced start and translation
    with opened(after["link"]) as page:
        assert settle(page) == "done"
        assert shown(page)["translation"] == after["translation"]


def _answers_within(page, until: str) -> list[float]:
    """Ask the page for a trivial evaluation again and again until `until` holds: the
    seconds each answer took."""
    waits = []
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        started = time.monotonic()
        done = page.evaluate(until)
        waits.append(time.monotonic() - started)
        if done:
            return waits
        time.sleep(0.02)
    raise AssertionError(f"{until} did not hold in time")


def test_a_text_is_translated_sentence_by_sentence(book: Path):
    """Two sentences: the page translates each, as `translate --by-sentence` does, and
    joins them; the views show the first, and the chooser shows the second, which the
    link then records and restores."""
    text = "Ein Hund rennt über die Wiese. Zwei Kinder spielen im Sand."
    with opened(address(book, None, pair="de-en", text=text)) as page:
        assert settle(page) == "done", page.text_content("#translator-status")
        first = shown(page)
        options = page.locator("#translator-sentence option").all_text_contents()
        page.select_option("#translator-sentence", "1")
        page.wait_for_function(
            "document.querySelector('#translator').dataset.state === 'done'"
            " && !document.querySelector('#translator-go').disabled"
        )
        settle(page)
        second = shown(page)
    assert parse_qs(urlparse(second["link"]).query)["sentence"] == ["2"]
    assert "sentence" not in parse_qs(urlparse(first["link"]).query)
    with opened(second["link"]) as page:
        assert settle(page) == "done"
        assert page.input_value("#translator-sentence") == "1"
        assert shown(page)["pieces"] == second["pieces"]
    model, tokenizer = load_pair_model("de-en")
    parts = translate(model, tokenizer, split_sentences(text), beam_size=4)
    assert first["translation"] == " ".join(parts) == second["translation"]
    assert options == [
        f"{i + 1} of 2: {s}" for i, s in enumerate(split_sentences(text))
    ]
    assert first["pieces"] == len(tokenizer.encode(split_sentences(text)[0])) + 1
    assert second["pieces"] == len(tokenizer.encode(split_sentences(text)[1])) + 1


def test_a_long_paragraph_leaves_the_page_responsive(book: Path):
    """300 words in one sentence (no full stops, so the split keeps it whole): while the
    page translates and draws, it answers within 200 ms; the heatmap keeps readable
    cells, and scrolls."""
    text = paragraph(300).replace(".", ",")
    with opened(address(book, None, pair="de-en", text="Hallo.")) as page:
        assert settle(page) == "done"
        page.fill("#translator-text", text)
        page.click("#translator-go")
        assert page.is_disabled("#translator-go")  # one translation at a time
        waits = _answers_within(
            page,
            "document.querySelector('#translator').dataset.state === 'done'"
            " && document.querySelectorAll('#translator-grid canvas').length === 27"
            " && !document.querySelector('#translator-go').disabled",
        )
        # the grid draws one head per turn: wait for the last
        waits += _answers_within(
            page,
            "performance.getEntriesByName('translator: drawn').length === 2",
        )
        scroller = page.locator("#translator-heatmap .translator-map-scroll")
        sizes = scroller.evaluate("e => [e.scrollWidth, e.clientWidth]")
        zoom = int(page.input_value("#translator-zoom"))
        pieces = page.locator("#translator-source .translator-piece").count()
    assert pieces > 300
    assert max(waits) < 0.2, f"the page took {max(waits):.2f} s to answer"
    assert zoom >= 12 and sizes[0] > sizes[1]  # readable cells, in a view that scrolls


def test_cancel_stops_the_work(book: Path):
    with opened(address(book, None, pair="de-en", text="Hallo.")) as page:
        assert settle(page) == "done"
        page.fill("#translator-text", paragraph(300))
        page.click("#translator-go")
        page.wait_for_selector("#translator[data-state=translating]")
        page.click("#translator-cancel")
        page.wait_for_selector("#translator[data-state=cancelled]", timeout=5_000)
        assert page.is_enabled("#translator-go") and page.is_disabled(
            "#translator-cancel"
        )
        # the previous sentence's translation and views are not left under it
        assert cleared(page), shown(page)
        # the worker is free again at once
        page.fill("#translator-text", SENTENCES["de-en"])
        page.click("#translator-go")
        assert settle(page) == "done"
        assert page.text_content("#translation") == packages(
            "de-en", SENTENCES["de-en"], 4
        )
        # the test set's score: cancelled while its workers translate
        page.click("#translator-score-go")
        page.wait_for_function(
            "document.querySelector('#translator-score-progress').value > 0"
        )
        page.click("#translator-score-cancel")
        page.wait_for_selector("#translator-score[data-state=cancelled]")
        done = page.evaluate(
            "document.querySelector('#translator-score-progress').value"
        )
        time.sleep(1)
        assert done == page.evaluate(
            "document.querySelector('#translator-score-progress').value"
        )
        assert page.is_enabled("#translator-score-go")


def test_bad_input_gets_its_message(book: Path):
    with opened(address(book, None, pair="de-en", text="")) as page:
        assert settle(page) == "error"
        got = shown(page)
        assert got["status"] == "Type a sentence to translate: the box is empty."
        assert not got["link shown"] and got["translation"] == ""
    with opened(address(book, None, pair="xx-yy", text="Hallo")) as page:
        assert settle(page) == "error"
        status = page.text_content("#translator-status")
        assert "“xx-yy”" in status
        assert "German → English (de-en)" in status and "(fr-en)" in status
        assert page.text_content("#translation") == ""
    for unreadable in ("Привет, как дела?", "😀"):
        with opened(address(book, None, pair="de-en", text=unreadable)) as page:
            assert settle(page) == "done"
            (warning,) = shown(page)["warnings"]
            assert "<unk>" in warning and "German or French only" in warning
            assert page.is_hidden("#translator-hint")
    with opened(address(book, None, pair="de-en", text="Hallo", beam="9")) as page:
        assert settle(page) == "error"
        assert "1 to 8 beams" in page.text_content("#translator-status")


def test_text_in_the_other_pairs_language_gets_a_hint_that_offers_it(book: Path):
    """French typed into German → English, and a link without a pair: the page
    translates as asked, and offers French → English, which translates it."""
    french = SENTENCES["fr-en"]
    for url in (
        address(book, None, pair="de-en", text=french),
        address(book, None, text=french),
    ):
        with opened(url) as page:
            assert settle(page) == "done"
            assert page.input_value("#translator-pair") == "de-en"
            hint = page.text_content("#translator-hint")
            assert hint.startswith("This text looks like French."), hint
            before = page.text_content("#translation")
            page.click("#translator-hint button")
            # done with another translation: the state between, brief, is not waited for
            page.wait_for_function(
                "before => document.querySelector('#translator').dataset.state"
                " !== 'translating' && document.querySelector('#translation')"
                ".textContent !== before",
                arg=before,
            )
            assert settle(page) == "done", shown(page)
            assert page.input_value("#translator-pair") == "fr-en"
            assert page.text_content("#translation") == packages("fr-en", french, 4)
            assert page.is_hidden("#translator-hint")


def test_loading_shows_the_files_true_size_each_named_by_its_digest(book: Path):
    """The status counts the model's files in MB up to their size, which the page's
    element names with a digest of each file; the progress bar follows it."""
    folder = book / "_static" / "translator"
    html = (book / PAGE).read_text(encoding="utf-8")
    files = json.loads(html_unescape(re.search(r'data-files="([^"]*)"', html).group(1)))
    for pair, named in files.items():
        for name in (named["data"], named["test"]):
            path, digest = name.split("?v=")
            text = (folder / path).read_bytes()
            assert hashlib.sha256(text).hexdigest()[:16] == digest, name
        head = (folder / f"{pair}.js").read_text(encoding="utf-8")
        call = "translatorData("
        data = json.loads(head[head.index(call) + len(call) : head.rindex(")")])
        chunks = [chunk["src"].split("?")[0] for chunk in data["weights"]["chunks"]]
        size = (folder / f"{pair}.js").stat().st_size + sum(
            (folder / c).stat().st_size for c in chunks
        )
        assert named["bytes"] == size
    megabytes = f"{files['fr-en']['bytes'] / 1e6:.1f}"
    with opened(address(book, None, pair="de-en", text="Hallo.")) as page:
        assert settle(page) == "done"
        page.select_option("#translator-pair", "fr-en")  # not loaded yet
        page.wait_for_selector("#translator[data-state=loading]")
        assert settle(page) == "done"
        statuses = page.evaluate("window.statuses")
    loading = [
        s for s in statuses if s[0].startswith("Loading the French → English model")
    ]
    total = files["fr-en"]["bytes"]
    assert loading[0][0] == f"Loading the French → English model ({megabytes} MB)…"
    assert loading[-1] == [
        f"Loading the French → English model: {megabytes} of {megabytes} MB…",
        total,
        total,
    ]
    loaded = [float(line[0].split(": ")[1].split(" ")[0]) for line in loading[1:]]
    assert len(loaded) >= 3 and loaded == sorted(loaded), statuses


def _few_test_sentences(route, book: Path) -> None:
    """Answer the request for de-en's test split with its first 12 sentences."""
    path = book / unquote(urlparse(route.request.url).path).lstrip("/")
    text = path.read_text(encoding="utf-8")
    call = "translatorTestSet("
    data = json.loads(text[text.index(call) + len(call) : text.rindex(")")])
    for key in ("sources", "references"):
        data[key] = data[key][:12]
    route.fulfill(body=f"{call}{json.dumps(data)});", content_type="text/javascript")


def test_the_score_names_its_pair_and_opens_its_worst_sentences_above(
    book: Path, served: str
):
    """The score of a test split (its first 12 sentences, in this test) names the pair
    and the split; a sentence of its lowest chrF opens in the translator above, with the
    paper's search, and translates as the package does."""
    url = address(book, served, pair="de-en", text="Hallo.", beam="2")
    routes = {"**/de-en-test.js*": lambda route: _few_test_sentences(route, book)}
    with opened(url, routes=routes) as page:
        assert settle(page) == "done"
        page.click("#translator-score-go")
        page.wait_for_selector("#translator-score[data-state=done]")
        named = page.text_content("#translator-score-pair")
        worst = page.locator("#translator-score-worst tr").first
        sentence = worst.locator("td div").first.text_content().split(" ", 1)[1]
        worst.locator("button").click()
        page.wait_for_selector("#translator[data-state=translating]")
        assert settle(page) == "done"
        text = page.input_value("#translator-text")
        beam = page.input_value("#translator-beam")
        translation = page.text_content("#translation")
    assert named.startswith("German → English (de-en), the 12 sentences of"), named
    assert "test_2016_flickr" in named
    assert text == sentence and beam == "4"
    assert translation == packages("de-en", sentence, 4)


def test_a_worker_that_cannot_read_the_scripts_gets_them_from_the_page(
    book: Path, served: str
):
    """The first request for the pair's data (the worker's importScripts) fails: the
    page reads the scripts itself, hands them to the worker, and translates as the
    package does."""
    asked: list[str] = []

    def first_fails(route) -> None:
        asked.append(route.request.url)
        if len(asked) == 1:
            route.abort()
        else:
            route.continue_()

    text = SENTENCES["de-en"]
    url = address(book, served, pair="de-en", text=text)
    with opened(url, routes={"**/de-en.js*": first_fails}) as page:
        assert settle(page) == "done", page.text_content("#translator-status")
        translation = page.text_content("#translation")
        status = page.text_content("#translator-status")
    assert len(asked) == 2 and translation == packages("de-en", text, 4)
    assert "on the page itself" not in status  # the worker translated


def test_an_error_clears_the_translation_it_replaces(book: Path, served: str):
    """A pair whose data cannot be read: its error, and no trace of the translation
    of the pair before."""
    url = address(book, served, pair="de-en", text=SENTENCES["de-en"])
    routes = {"**/fr-en*.js*": lambda route: route.abort()}
    with opened(url, routes=routes, expect=("fr-en", "Failed to load")) as page:
        assert settle(page) == "done" and not cleared(page)
        page.select_option("#translator-pair", "fr-en")
        page.wait_for_selector("#translator[data-state=error]")
        status = page.text_content("#translator-status")
        assert status.startswith("Something went wrong: "), status
        assert cleared(page), shown(page)


def test_a_phone_has_large_controls_no_overflow_and_touch(book: Path):
    url = address(book, None, pair="de-en", text=PARTING)
    with opened(url, width=390, height=844, touch=True) as page:
        assert settle(page) == "done"
        page.wait_for_function(
            "performance.getEntriesByName('translator: drawn').length === 1"
        )
        overflow = page.evaluate(
            "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        small = page.evaluate(SMALL_CONTROLS)
        # the grid enlarges: three heads a row
        thumb = page.locator("#translator-grid button").first
        compact = thumb.bounding_box()["width"]
        page.click("#translator-grid-large")
        large = thumb.bounding_box()["width"]
        # tap the last cell: its value; tap again: cleared
        scroller = page.locator("#translator-heatmap .translator-map-scroll")
        scroller.scroll_into_view_if_needed()
        box = scroller.bounding_box()
        size = page.locator("#translator-heatmap .translator-map-size").bounding_box()
        half = int(page.input_value("#translator-zoom")) / 2
        x = min(box["x"] + box["width"], size["x"] + size["width"]) - half
        y = min(box["y"] + box["height"], size["y"] + size["height"]) - half
        hint = page.text_content("#translator-cell")
        page.touchscreen.tap(x, y)
        value = page.text_content("#translator-cell")
        page.touchscreen.tap(x, y)
        emptied = page.text_content("#translator-cell")
    assert overflow[0] <= overflow[1], overflow
    assert not small, small
    assert 40 <= compact and 100 <= large, (compact, large)
    assert "weight" in value and value != hint and emptied == hint


# The contrast of text with what lies under it (WCAG's ratio), for the first element in
# view of each selector: {selector: ratio}.
CONTRASTS = """(selectors) => {
  const rgb = (css) => {
    const c = document.createElement("canvas").getContext("2d");
    c.fillStyle = css;
    c.fillRect(0, 0, 1, 1);
    return [...c.getImageData(0, 0, 1, 1).data];
  };
  const luminance = ([r, g, b]) => {
    const f = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
    return 0.2126 * f(r) + 0.7152 * f(g) + 0.0722 * f(b);
  };
  const under = (e) => {
    for (; e; e = e.parentElement) {
      const c = rgb(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) return c;
    }
    return rgb(getComputedStyle(document.body).backgroundColor);
  };
  return Object.fromEntries(selectors.map((selector) => {
    const e = [...document.querySelectorAll(selector)].find((x) => x.offsetParent);
    if (!e) return [selector, null];
    const [a, b] = [luminance(rgb(getComputedStyle(e).color)), luminance(under(e))];
    return [selector, (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05)];
  }));
}"""
# What the dark theme must keep readable: the pieces (a new one, and ones shaded by
# their attention, light and dark), the controls, the tables and the grid's captions.
READABLE = [
    "#translation",
    "#translator-beams .translator-new",
    "#translator-looked .translator-ink-dark",
    "#translator-looked .translator-ink-light",
    "#translator-entering button[aria-selected=true]",
    "#translator-compare-rows td",
    "#translator-step-summary",
    "#translator-grid button span",
    "#translator-source .translator-piece",
]


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_part_of_the_page_is_readable_in_both_themes(book: Path, theme: str):
    """The book's theme switch set to light or dark: every text of the widget keeps a
    contrast of 4.5 with what lies under it, the heatmap's label strips take the page's
    background, and a weight of 0 is drawn in it too; switching the theme redraws."""
    with opened(address(book, None, pair="de-en", text=PARTING), theme=theme) as page:
        assert settle(page) == "done"
        page.wait_for_function(
            "performance.getEntriesByName('translator: drawn').length === 1"
        )
        assert page.evaluate("document.documentElement.dataset.theme") == theme
        contrasts = page.evaluate(CONTRASTS, READABLE)
        page.select_option("#translator-kind", "decoderSelf")
        background = page.evaluate(PIXELS)
        page.evaluate(
            "(t) => document.documentElement.dataset.theme = t",
            "light" if theme == "dark" else "dark",
        )
        page.wait_for_timeout(300)
        switched = page.evaluate(PIXELS)
    low = {k: v for k, v in contrasts.items() if v is None or v < 4.5}
    assert not low, low
    page_colour, strip, zero = background
    assert strip == page_colour and zero == page_colour, background
    assert switched[1] == switched[0] != page_colour, switched


# The page's background, the heatmap's top-left pixel (its label strip), and the colour
# of a weight of 0 on a thumbnail of the grid (the decoder's causal mask: top right).
PIXELS = """() => {
  const rgb = (css) => {
    const c = document.createElement("canvas").getContext("2d");
    c.fillStyle = css;
    c.fillRect(0, 0, 1, 1);
    return [...c.getImageData(0, 0, 1, 1).data.slice(0, 3)];
  };
  const style = getComputedStyle(document.documentElement);
  const page = rgb(style.getPropertyValue("--pst-color-background").trim() || "#fff");
  const at = (canvas, x, y) => {
    const copy = document.createElement("canvas").getContext("2d"); // read once each
    copy.drawImage(canvas, x, y, 1, 1, 0, 0, 1, 1);
    return [...copy.getImageData(0, 0, 1, 1).data.slice(0, 3)];
  };
  const map = document.querySelector("#translator-heatmap canvas");
  const thumb = document.querySelector("#translator-grid canvas");
  return [page, at(map, 1, 1), at(thumb, thumb.width - 1, 0)];
}"""


# The controls in view that are less than 40 px wide or high: [name, width, height].
SMALL_CONTROLS = """() => [...document.querySelectorAll(
       '.translator button, .translator select, .translator input,'
       + ' .translator textarea, .translator a')]
     .filter(e => e.offsetParent !== null)
     .map(e => [e.id || e.textContent.trim().slice(0, 20),
                e.getBoundingClientRect().width, e.getBoundingClientRect().height])
     .filter(([, w, h]) => w < 40 || h < 40)"""


def test_no_other_page_loads_the_models(book: Path):
    pages = [p for p in book.rglob("*.html") if "_static" not in p.parts]
    script = re.compile(r'src="[^"]*_static/translator/')
    loading = [
        str(p.relative_to(book))
        for p in pages
        if script.search(p.read_text(encoding="utf-8"))
    ]
    assert loading == [PAGE]
    assert (book / "_static" / "translator" / "de-en.js").is_file()
    assert (book / "_static" / "translator" / "de-en-test.js").is_file()


@functools.cache
def knocked(pair: str, text: str, beam: int, spec: str) -> str:
    """The package's translation with the parts of `spec` switched off."""
    model, tokenizer = load_pair_model(pair)
    return translate(
        model, tokenizer, [text], beam_size=beam, by_sentence=True, knock_out=spec
    )[0]


def _score_lines(page) -> list[list[str]]:
    rows = page.locator("#translator-knock-score-rows tr")
    return [rows.nth(i).locator("td").all_text_contents() for i in range(rows.count())]


def test_parts_switched_off_retranslate_and_the_link_keeps_them(
    book: Path, served: str
):
    """The grid is coloured by the stored importance before any click; a click on a
    head (in the mode that switches heads off) and on a sublayer's button translate
    again as the package does with those parts off, the translation with everything on
    shown beside; the link carries the set and restores it; "switch everything on"
    translates as before; the sample (the first 12 test sentences, in this test) is
    scored with the parts off and on, as sacreBLEU scores the package's greedy
    translations; a link with a bad set gets its one-line message."""
    from sacrebleu.metrics import BLEU, CHRF

    from transformer.multi30k import load_pairs

    text = PARTING
    url = address(book, served, pair="de-en", text=text)
    routes = {"**/de-en-test.js*": lambda route: _few_test_sentences(route, book)}
    with opened(url, routes=routes) as page:
        assert settle(page) == "done"
        before = page.text_content("#translation")
        assert page.is_hidden("#translator-intact")
        rated = page.locator("#translator-grid .translator-rated").count()
        legend = page.text_content("#translator-knock-legend")
        page.click("#translator-knock-mode")
        page.click("#translator-grid button[data-view='1 3']")  # layer 2, head 4
        page.wait_for_selector("#translator[data-state=translating]")
        assert settle(page) == "done"
        one = shown(page)
        intact = page.text_content("#translator-intact")
        off = page.locator("#translator-grid .translator-off").all()
        marked = [b.get_attribute("data-part") for b in off]
        page.click("#translator-knock-layers button[data-part='enc-self:L1']")
        page.wait_for_selector("#translator[data-state=translating]")
        assert settle(page) == "done"
        two = shown(page)
        pressed = page.get_attribute(
            "#translator-knock-layers button[data-part='enc-self:L1']", "aria-pressed"
        )
        started = time.monotonic()
        page.click("#translator-knock-score")
        page.wait_for_selector("#translator-knock-score-result:not([hidden])")
        seconds = time.monotonic() - started
        scores = _score_lines(page)
        named = page.text_content("#translator-knock-score-pair")
        page.click("#translator-knock-reset")
        page.wait_for_selector("#translator[data-state=translating]")
        assert settle(page) == "done"
        reset = shown(page)
        assert page.is_hidden("#translator-intact")
    spec = "enc-self:L1,dec-cross:L2h4"
    assert rated == 3 * 8 and "validation BLEU" in legend, (rated, legend)
    assert marked == ["dec-cross:L2h4"]
    assert one["translation"] == knocked("de-en", text, 4, "dec-cross:L2h4")
    assert before in intact and "With everything on" in intact
    assert two["translation"] == knocked("de-en", text, 4, spec) and pressed == "true"
    assert parse_qs(urlparse(two["link"]).query)["knock"] == [spec]
    assert reset["translation"] == before and "knock" not in reset["link"]
    # the sample's score, both ways, as sacreBLEU gives the package's translations
    sources, references = zip(
        *load_pairs("test_2016_flickr", "de-en")[:12], strict=True
    )
    model, tokenizer = load_pair_model("de-en")
    expected = []
    for knock in (spec, ""):
        found = translate(model, tokenizer, sources, beam_size=1, knock_out=knock)
        bleu = BLEU().corpus_score(found, [list(references)]).score
        chrf = CHRF().corpus_score(found, [list(references)]).score
        expected.append([f"{bleu:.2f}", f"{chrf:.2f}"])
    assert [row[1:] for row in scores] == expected, (scores, expected)
    assert scores[0][0].endswith(spec) and named.startswith("German → English (de-en)")
    print(f"sample of 12 scored both ways in {seconds:.1f} s")
    # the link restores the set
    with opened(two["link"]) as page:
        assert settle(page) == "done"
        assert page.text_content("#translation") == two["translation"]
        assert page.text_content("#translator-knock-set") == spec
    with opened(
        address(book, None, pair="de-en", text=text, knock="enc-ffn:L1h2")
    ) as page:
        assert settle(page) == "error"
        status = page.text_content("#translator-status")
    assert status.startswith("This link asks to switch off “enc-ffn:L1h2”"), status
    assert "\n" not in status
