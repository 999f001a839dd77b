r"""How fast the page "Translate and look inside" translates, in headless Chromium.

    python -m experiments.translator_bench --out experiments/benchmarks/translator-chromium.json

Opens the built book's page (`make book` first; --book names another build) from file://,
with DNS blocked as in the offline test, at a link that translates a test sentence of 15
words (--words) with beam 4, and measures:

- the time from opening the page to that first translation, split into loading the pair's
  data, starting its model and translating;
- then the time of each translation of the same sentence, greedy and with beam 4, --repeats
  times each, alternating, as the page reports it (from the click to the translation);
- and the page's weight: the bytes of every file it loaded, by kind.

Goals (issue 37): the first translation within 3 s, a 15-word sentence with beam 4 within
1 s. The JSON written to OUT (atomically) names the machine, its load and the browser.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlencode, urlparse

from transformer.data import PAIRS, load_split
from transformer.files import atomic_write

ROOT = Path(__file__).resolve().parents[1]
PAGE = "chapters/16_translate.html"
# seconds, issue 37's goals: the first translation, and a 15-word sentence with beam 4
GOALS = {"first_translation_s": 3.0, "beam4_median_s": 1.0}


def sentence_of(pair: str, words: int) -> str:
    """The first test sentence of `words` words (split at spaces) in the pair's source."""
    source = PAIRS[pair][0]
    for text in load_split("test_2016_flickr", source):
        if len(text.split()) == words:
            return text
    raise ValueError(f"no test sentence of {words} words in {pair}")


def kind_of(path: Path) -> str:
    if path.parent.name == "translator":
        return "model data" if path.name.endswith("-en.js") else "translator code"
    return "the rest of the page"


def measure(book: Path, pair: str, text: str, repeats: int) -> dict:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests"))
    from browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS

    loaded: list[str] = []
    url = f"{(book / PAGE).as_uri()}?{urlencode({'pair': pair, 'text': text})}"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.on("request", lambda request: loaded.append(request.url))
        page.goto(url, wait_until="commit", timeout=WAIT_MS)
        page.wait_for_selector("#translator[data-state=done]", timeout=WAIT_MS)
        marks = page.evaluate(
            """() => Object.fromEntries(performance.getEntriesByType("mark")
                 .map(m => [m.name, {at: m.startTime, ms: m.detail && m.detail.ms}]))"""
        )
        first = {
            "first_translation_s": marks["translator: translated"]["at"] / 1000,
            "data_loaded_s": marks[f"translator: {pair} loaded"]["at"] / 1000,
            "model_ready_s": marks[f"translator: {pair} ready"]["at"] / 1000,
            "translating_s": marks["translator: translated"]["ms"] / 1000,
            "status": page.text_content("#translator-status"),
        }
        seconds: dict[str, list[float]] = {"greedy": [], "beam 4": []}
        for _ in range(repeats):
            for decoding, value in (("greedy", "1"), ("beam 4", "4")):
                page.check(f"input[name=translator-search][value='{value}']")
                # choosing a search translates; wait for that translation's mark
                page.wait_for_function(
                    """n => performance.getEntriesByName("translator: translated")
                         .length > n && document.querySelector("#translator")
                         .dataset.state === "done" """,
                    arg=sum(map(len, seconds.values())) + 1,
                    timeout=WAIT_MS,
                )
                seconds[decoding].append(
                    page.evaluate(
                        """() => performance.getEntriesByName("translator: translated")
                             .at(-1).detail.ms"""
                    )
                    / 1000
                )
        version = browser.version
        browser.close()
    weight: dict[str, int] = {}
    for request in loaded:
        address = urlparse(request)
        if address.scheme == "file":
            path = Path(unquote(address.path))
            weight[kind_of(path)] = weight.get(kind_of(path), 0) + path.stat().st_size
    return {
        "chromium": version,
        **first,
        "greedy_s": seconds["greedy"],
        "beam4_s": seconds["beam 4"],
        "bytes": weight,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--book", type=Path, default=ROOT / "_build" / "html")
    p.add_argument("--pair", choices=sorted(PAIRS), default="de-en")
    p.add_argument("--words", type=int, default=15)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)

    def refuse(message: str) -> None:
        """One line on standard error and status 2, as the package's commands."""
        p.exit(2, f"{p.prog}: error: {message}\n")

    if args.repeats < 1:
        refuse(f"--repeats must be at least 1, got {args.repeats}")
    if not (args.book / PAGE).is_file():
        refuse(f"no {PAGE} in {args.book}: build the book first (make book)")
    try:
        text = sentence_of(args.pair, args.words)
    except ValueError as err:
        refuse(str(err))
    from experiments.decode_bench import machine

    started = time.time()
    result = {
        "machine": machine(),
        # the machine may be shared: its load (runnable processes, over 1, 5 and 15
        # minutes) before the run, to read the times by
        "load_average": list(os.getloadavg()),
        "pair": args.pair,
        "sentence": text,
        "words": args.words,
        "repeats": args.repeats,
        **measure(args.book, args.pair, text, args.repeats),
    }
    result["greedy_median_s"] = statistics.median(result["greedy_s"])
    result["beam4_median_s"] = statistics.median(result["beam4_s"])
    result["page_bytes"] = sum(result["bytes"].values())
    result["goals_met"] = {name: result[name] <= goal for name, goal in GOALS.items()}
    print(
        f"{result['machine']} (load {result['load_average'][0]:.1f}),"
        f" Chromium {result['chromium']}, {args.pair}:\n"
        f"  first translation {result['first_translation_s']:.2f} s after opening"
        f" (data {result['data_loaded_s']:.2f} s, model ready"
        f" {result['model_ready_s']:.2f} s, translating {result['translating_s']:.2f} s)\n"
        f"  {args.words} words: greedy {result['greedy_median_s']:.2f} s,"
        f" beam 4 {result['beam4_median_s']:.2f} s (medians of {args.repeats})\n"
        f"  page weight {result['page_bytes'] / 1e6:.1f} MB: "
        + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(result["bytes"].items()))
        + f"\n  ({time.time() - started:.0f} s in all)",
        file=sys.stderr,
    )
    if args.out:
        atomic_write(args.out, (json.dumps(result, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
