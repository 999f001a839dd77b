"""The built book works offline: every page opens in headless Chromium with DNS blocked, every
Altair chart draws its SVG or canvas, every formula is typeset by MathJax, no page logs a
script error or asks the network for anything, and nothing in a page's article is wider than
its column, at a 1280 x 1000 window and at 1920 x 1080.

Set BOOK_SCREENSHOTS=<folder> to also save a full-page screenshot of every page.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def pages(html: Path) -> list[Path]:
    skip = {"genindex.html", "search.html"}
    return sorted(
        p
        for p in html.rglob("*.html")
        if p.name not in skip and "_static" not in p.parts
    )


# Everything in the article that is wider than its column: an element whose
# content scrolls sideways, or that reaches past the column's right edge. Only
# the outermost offender is named, with the text it starts with.
OVERFLOWS_JS = """() => {
  const article = document.querySelector("article.bd-article");
  if (!article) {
    return [];
  }
  const edge = article.getBoundingClientRect().right;
  const found = [];
  for (const el of article.querySelectorAll("*")) {
    if (!el.getClientRects().length || found.some(f => f.el.contains(el))) {
      continue;
    }
    const style = getComputedStyle(el);
    const box = el.getBoundingClientRect();
    const scrolls = /auto|scroll/.test(style.overflowX)
      && el.scrollWidth > el.clientWidth + 1;
    const past = box.width > 0 && box.right > edge + 1;
    if (scrolls || past) {
      const over = Math.max(el.scrollWidth - el.clientWidth, box.right - edge);
      found.push({el, over: Math.round(over)});
    }
  }
  return found.map(({el, over}) => {
    const kind = el.id.startsWith("altair-viz") ? "chart"
      : el.tagName.toLowerCase() + (el.className ? "." + el.className : "");
    const text = (el.innerText || el.getAttribute("aria-label") || "").trim();
    return `${kind} ${over} px too wide: ${text.slice(0, 50).replace(/\\s+/g, " ")}`;
  });
}"""
# The two windows the book is checked at: a laptop's and a desktop's.
WINDOWS = [(1280, 1000), (1920, 1080)]


@pytest.fixture(scope="module")
def visits(book: Path) -> dict:
    """Open every page once, at each window size: what failed to render or
    load, what overflowed the column, and how many charts and formulas were
    checked."""
    from playwright.sync_api import sync_playwright

    shots = os.environ.get("BOOK_SCREENSHOTS")
    problems: list[str] = []
    overflows: list[str] = []
    checked_charts = checked_math = 0
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for page_path in pages(book):
            name = str(page_path.relative_to(book))
            width, height = WINDOWS[0]
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on(
                "pageerror",
                lambda exc, errors=errors: errors.append(f"script error: {exc}"),
            )
            page.on(
                "console",
                lambda msg, errors=errors: (
                    errors.append(f"console error: {msg.text}")
                    if msg.type == "error"
                    else None
                ),
            )
            page.on(
                "request",
                lambda req, errors=errors: (
                    errors.append(f"network request: {req.url}")
                    if not req.url.startswith(("file:", "data:", "blob:", "about:"))
                    else None
                ),
            )
            page.goto(page_path.as_uri(), wait_until="load", timeout=WAIT_MS)
            charts = page.locator("div[id^='altair-viz']").count()
            if charts:
                try:
                    page.wait_for_function(
                        """n => [...document.querySelectorAll("div[id^='altair-viz']")]
                               .filter(d => d.querySelector('svg, canvas')).length === n""",
                        arg=charts,
                        timeout=WAIT_MS,
                    )
                except Exception:
                    drawn = page.locator(
                        "div[id^='altair-viz'] :is(svg, canvas)"
                    ).count()
                    problems.append(f"{name}: {drawn} of {charts} charts drew")
                checked_charts += charts
            formulas = page.locator("div.math, span.math").count()
            if formulas:
                try:
                    page.wait_for_function(
                        "n => document.querySelectorAll('mjx-container').length >= n",
                        arg=formulas,
                        timeout=WAIT_MS,
                    )
                except Exception:
                    typeset = page.locator("mjx-container").count()
                    problems.append(
                        f"{name}: MathJax typeset {typeset} of {formulas} formulas"
                    )
                checked_math += formulas
            for width, height in WINDOWS:
                page.set_viewport_size({"width": width, "height": height})
                overflows += [
                    f"{name} at {width} px: {o}" for o in page.evaluate(OVERFLOWS_JS)
                ]
            if shots:
                width, height = WINDOWS[0]
                page.set_viewport_size({"width": width, "height": height})
                Path(shots).mkdir(parents=True, exist_ok=True)
                page.screenshot(
                    path=str(Path(shots) / (name.replace("/", "_") + ".png")),
                    full_page=True,
                )
            problems += [f"{name}: {e}" for e in errors]
            page.close()
        browser.close()
    return {
        "problems": problems,
        "overflows": overflows,
        "charts": checked_charts,
        "formulas": checked_math,
    }


def test_every_page_renders_offline(visits: dict):
    assert not visits["problems"], "\n".join(visits["problems"])
    assert visits["charts"] > 0 and visits["formulas"] > 0, (
        "the book should have charts and math to check"
    )


def test_every_page_fits_its_column(visits: dict):
    """No code block, table, chart or formula is wider than the article column,
    at either window: what scrolls sideways is skipped by readers."""
    assert not visits["overflows"], "\n".join(visits["overflows"])
