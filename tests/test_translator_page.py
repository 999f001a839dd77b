"""The page "Translate and look inside" in headless Chromium with DNS blocked, from file://
and over HTTP: a shared link, `?pair=…&text=…`, gives the package's translation in the
element #translation, with the beam search's steps, the heatmap and the grid of heads; the
step control, a forced piece and the grid each change what the page shows; a 300-word
paragraph leaves the page responsive; Cancel stops the work; bad input gets its message; a
phone's viewport has large controls and no overflow; what a link carries stays text; there
is no page error and no network request; and no other page of the book loads the models."""

from __future__ import annotations

import functools
import http.server
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlparse

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS

from transformer.multi30k import load_split
from transformer.translation import load_pair_model, translate

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


@functools.cache
def packages(pair: str, text: str, beam: int) -> str:
    model, tokenizer = load_pair_model(pair)
    return translate(model, tokenizer, [text], beam_size=beam)[0]


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
    url: str, *, width: int = 1280, height: int = 1000, touch: bool = False
) -> Iterator:
    """The page at `url`, loaded, in headless Chromium; on leaving, no page error, no
    console error or warning, and no request beyond the page's own origin."""
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
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.on("pageerror", lambda exc: problems.append(f"script error: {exc}"))
        page.on(
            "console",
            lambda msg: (
                problems.append(f"console {msg.type}: {msg.text}")
                if msg.type in ("error", "warning")
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
    assert after["translation"] != before["translation"]
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


def test_a_long_paragraph_leaves_the_page_responsive(book: Path):
    """300 words: while the page translates and draws, it answers within 200 ms; the
    heatmap keeps readable cells, and scrolls."""
    text = paragraph(300)
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
    with opened(address(book, None, pair="de-en", text="Привет, как дела?")) as page:
        assert settle(page) == "done"
        (warning,) = shown(page)["warnings"]
        assert "<unk>" in warning and "German or French only" in warning
    with opened(address(book, None, pair="de-en", text="Hallo", beam="9")) as page:
        assert settle(page) == "error"
        assert "1 to 8 beams" in page.text_content("#translator-status")


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
        small = page.evaluate(
            """() => [...document.querySelectorAll(
                   '.translator button, .translator select, .translator input,'
                   + ' .translator textarea, .translator a')]
                 .filter(e => e.offsetParent !== null)
                 .map(e => [e.id || e.textContent.trim().slice(0, 20),
                            e.getBoundingClientRect().height])
                 .filter(([, h]) => h < 40)"""
        )
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
        cleared = page.text_content("#translator-cell")
    assert overflow[0] <= overflow[1], overflow
    assert not small, small
    assert "weight" in value and value != hint and cleared == hint


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
