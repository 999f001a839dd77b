"""The page "Translate and look inside" in headless Chromium with DNS blocked: a shared link,
`?pair=…&text=…`, opened from file:// and over HTTP, gives the package's translation in the
element #translation and draws the attention heatmap, with no console error and no network
request; what the link carries stays text; and no other page of the book loads the models."""

from __future__ import annotations

import functools
import http.server
import threading
from pathlib import Path
from urllib.parse import urlencode

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS

from transformer.translation import load_pair_model, translate

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGE = "chapters/16_translate.html"
SENTENCES = {
    "de-en": "Zwei Hunde spielen im Schnee.",
    "fr-en": "Un homme fait du vélo dans la rue.",
}


@functools.cache
def packages(pair: str, text: str, beam: int) -> str:
    model, tokenizer = load_pair_model(pair)
    return translate(model, tokenizer, [text], beam_size=beam)[0]


def visit(url: str, allowed: tuple[str, ...] = ("file:",), args=CHROMIUM_ARGS) -> dict:
    """Open `url` at 1280 x 1000 and wait until the page has translated: what it shows,
    and what went wrong (console errors, script errors, requests to the network)."""
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=args)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
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
                if not req.url.startswith((*allowed, "data:", "blob:", "about:"))
                else None
            ),
        )
        page.goto(url, wait_until="load", timeout=WAIT_MS)
        page.wait_for_selector(
            "#translator:is([data-state=done], [data-state=error])", timeout=WAIT_MS
        )
        if page.get_attribute("#translator", "data-state") == "done":
            page.wait_for_selector(
                "#translator-heatmap svg .mark-rect", timeout=WAIT_MS
            )
        shown = {
            "state": page.get_attribute("#translator", "data-state"),
            "status": page.text_content("#translator-status"),
            "translation": page.text_content("#translation"),
            "text": page.input_value("#translator-text"),
            "warnings": page.locator("#translator-warnings li").all_text_contents(),
            # the heatmap's cells: the marks labelled with their weight (not the legend)
            "cells": page.locator(
                "#translator-heatmap svg path[aria-label*='weight']"
            ).count(),
            "pieces": page.locator("#translator-source .translator-piece").count(),
            "outputs": page.locator("#translator-output .translator-piece").count(),
            "elements": page.locator("#translator b, #translator img").count(),
            "link": page.get_attribute("#translator-link", "href"),
        }
        browser.close()
    shown["problems"] = problems
    return shown


@pytest.mark.parametrize("pair", SENTENCES)
def test_a_shared_link_translates_from_file(book: Path, pair: str):
    text = SENTENCES[pair]
    url = f"{(book / PAGE).as_uri()}?{urlencode({'pair': pair, 'text': text})}"
    shown = visit(url)
    assert not shown["problems"], "\n".join(shown["problems"])
    assert shown["state"] == "done", shown["status"]
    assert shown["text"] == text
    assert shown["translation"] == packages(pair, text, 4)
    assert "on the page itself" not in shown["status"]  # the worker ran
    # the encoder-decoder heatmap: one cell per (output piece, source piece)
    assert shown["cells"] == shown["pieces"] * shown["outputs"] > 0, shown
    assert shown["warnings"] == []


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


def test_a_shared_link_translates_over_http_and_stays_text(book: Path):
    """Served by a local http.server, greedy decoding (beam=1), a sentence with markup:
    the markup is text to translate, as in the command line, and no element of it."""
    text = "Zwei <b>Hunde</b> spielen <img src=x onerror=alert(1)> im Schnee."
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(book))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        origin = f"http://127.0.0.1:{server.server_port}/"
        query = urlencode({"pair": "de-en", "text": text, "beam": "1"})
        # every host name still fails to resolve, but for the server's address
        args = [
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
            if arg.startswith("--host-resolver-rules")
            else arg
            for arg in CHROMIUM_ARGS
        ]
        shown = visit(f"{origin}{PAGE}?{query}", allowed=(origin,), args=args)
    finally:
        server.shutdown()
        server.server_close()
    assert not shown["problems"], "\n".join(shown["problems"])
    assert shown["state"] == "done", shown["status"]
    assert shown["text"] == text and shown["elements"] == 0
    assert shown["translation"] == packages("de-en", text, 1)
    assert shown["link"] == f"{origin}{PAGE}?{query}"  # a link to this translation


def test_no_other_page_loads_the_models(book: Path):
    pages = [p for p in book.rglob("*.html") if "_static" not in p.parts]
    loading = [
        str(p.relative_to(book))
        for p in pages
        if "translator/" in p.read_text(encoding="utf-8")
    ]
    assert loading == [PAGE]
    assert (book / "_static" / "translator" / "de-en.js").is_file()
