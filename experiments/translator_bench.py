r"""How fast the page "Translate and look inside" translates, in headless Chromium.

    python -m experiments.translator_bench --out experiments/benchmarks/translator-chromium.json

Opens the built book's page (`make book` first; --book names another build) from file://,
with DNS blocked as in the offline test, at a link that translates a test sentence of 15
words (--words) with beam 4, and measures:

- loading: the longest task of the page's main thread (Chromium's long tasks, over 50 ms,
  observed from before the page's first script) from opening the page to its first
  translation, and on to the first translation drawn, in a fresh browser at 1280 px and at
  a phone's 390 px (touch, --loads times each, alternating; --only-loading stops there);
  and, from Chromium's trace of the same run, the most time that the translator's scripts
  took in one task, and the longest task of the rest of the book's page (its theme's
  scripts, its layout);
- the time from opening the page to that first translation, split into loading the pair's
  data, starting its model and translating;
- then the time of each translation of the same sentence, greedy and with beam 4, --repeats
  times each, alternating, as the page reports it (from the click to the translation), and
  with beam 4 the time until the beam search's view is drawn;
- a paragraph of 300 words (--long-words), test sentences one after another: the longest
  task of the page's main thread while it translates and draws it (Chromium's long tasks,
  those over 50 ms), and the longest wait for a trivial evaluation meanwhile;
- the score button: the whole test split translated in one worker per core and scored,
  with the scores the page prints (--no-test-set leaves it out: minutes on a laptop);
- and the page's weight: the bytes of every file it loaded, by kind.

Goals: the first translation within 3 s, a 15-word sentence with beam 4 within 1 s, no task
of the main thread over 100 ms while the page loads, nor on the long paragraph. The JSON
written to OUT (atomically) names the machine, its load and the browser.
"""

import argparse
import bisect
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import unquote, urlencode, urlparse

from transformer.atomic import atomic_write
from transformer.checked_data import load_split
from transformer.multi30k import PAIRS

ROOT = Path(__file__).resolve().parents[1]
PAGE = "chapters/16_translate.html"
# the goals: the first translation and a 15-word sentence with beam 4 (seconds), and the
# longest task of the main thread on the long paragraph (milliseconds)
GOALS = {
    "first_translation_s": 3.0,
    "beam4_median_s": 1.0,
    "loading_longest_task_ms": 100.0,
    "long_input_longest_task_ms": 100.0,
}
# The viewports of the loading measure: a laptop's column and a phone's.
VIEWPORTS = {
    "1280": {"viewport": {"width": 1280, "height": 1000}},
    "390": {
        "viewport": {"width": 390, "height": 844},
        "has_touch": True,
        "is_mobile": True,
    },
}
# What Chromium's trace records: the tasks and the scripts they run, and the page's marks.
TRACE_CATEGORIES = ["toplevel", "devtools.timeline", "blink.user_timing"]
TASKS = {"RunTask", "ThreadControllerImpl::RunTask"}  # a task, as the trace names it
SCRIPTS = {"EvaluateScript", "FunctionCall", "v8.compile"}  # a script's time in a task
# Registered before any script of the page runs: every long task from then on.
LONG_TASKS = """
window.benchLoadTasks = [];
new PerformanceObserver((list) => {
  for (const task of list.getEntries()) {
    window.benchLoadTasks.push([task.startTime, task.duration]);
  }
}).observe({ type: "longtask", buffered: true });
"""
# How long the whole test split may take in the browser before the bench gives up.
TEST_SET_WAIT_MS = 3_600_000


def paragraph(pair: str, words: int) -> str:
    """Test sentences of the pair's source, one after another, cut at `words` words."""
    text: list[str] = []
    for sentence in load_split("test_2016_flickr", PAIRS[pair][0]):
        text += sentence.split()
        if len(text) >= words:
            return " ".join(text[:words])
    raise ValueError(f"the test split of {pair} has fewer than {words} words")


def sentence_of(pair: str, words: int) -> str:
    """The first test sentence of `words` words (split at spaces) in the pair's source."""
    source = PAIRS[pair][0]
    for text in load_split("test_2016_flickr", source):
        if len(text.split()) == words:
            return text
    raise ValueError(f"no test sentence of {words} words in {pair}")


def kind_of(path: Path) -> str:
    if path.parent.name == "translator":
        if path.name.endswith("-test.js"):
            return "test split"  # loaded by the score button only
        # a pair's data, <pair>.js, and its weights' chunks, <pair>-1.js, ...
        pair = re.fullmatch(r"([a-z]+-[a-z]+)(-\d+)?\.js", path.name)
        return "model data" if pair and pair[1] in PAIRS else "translator code"
    return "the rest of the page"


def long_input(page, text: str) -> dict:
    """Translate `text` on the open page: the longest task of its main thread (0: none
    over 50 ms) and the longest wait for a trivial evaluation, while it translates and
    draws, and the translation's time."""
    from browser import WAIT_MS

    page.evaluate(
        """() => {
             window.benchTasks = [];
             new PerformanceObserver((list) => {
               for (const task of list.getEntries()) window.benchTasks.push(task.duration);
             }).observe({ type: "longtask" });
           }"""
    )
    drawn = page.evaluate("performance.getEntriesByName('translator: drawn').length")
    page.fill("#translator-text", text)
    page.click("#translator-go")
    waits = []
    deadline = time.monotonic() + WAIT_MS / 1000
    done = f"""performance.getEntriesByName('translator: drawn').length > {drawn}
               && !document.querySelector('#translator-go').disabled"""
    while time.monotonic() < deadline:
        started = time.monotonic()
        finished = page.evaluate(done)
        waits.append(time.monotonic() - started)
        if finished:
            break
        time.sleep(0.02)
    else:
        raise RuntimeError("the long paragraph was not translated in time")
    tasks = page.evaluate("window.benchTasks")
    return {
        "long_input_longest_task_ms": max(tasks, default=0.0),
        "long_input_tasks_over_50ms": len(tasks),
        "long_input_answer_max_ms": 1000 * max(waits),
        "long_input_translating_s": page.evaluate(
            """() => performance.getEntriesByName("translator: translated")
                 .at(-1).detail.ms"""
        )
        / 1000,
        "long_input_pieces": page.locator(
            "#translator-source .translator-piece"
        ).count(),
    }


def owners(trace: bytes, mark: str) -> dict:
    """From a Chromium trace (devtools.timeline and user timing), of the tasks of the
    page's main thread before `mark`: the most time that the translator's scripts
    (_static/translator/) took in one task, with the promise callbacks they queued, and
    the longest task that ran none of them (the theme's scripts, the page's layout), in
    ms. A task such as DOMContentLoaded runs every script's handler: only the
    translator's count for it."""
    events = json.loads(trace)
    events = events["traceEvents"] if isinstance(events, dict) else events
    marked = [e for e in events if e.get("name") == mark]
    if not marked:
        raise RuntimeError(f"the trace holds no mark {mark!r}")
    thread = (marked[0]["pid"], marked[0]["tid"])
    until = marked[0]["ts"]
    on = sorted(
        (
            e
            for e in events
            if (e.get("pid"), e.get("tid")) == thread and e.get("ph") == "X"
        ),
        key=lambda e: (e["ts"], -e.get("dur", 0)),
    )

    def ours(event: dict) -> bool:
        address = str(event.get("args", {}).get("data", {}).get("url", ""))
        return "/_static/translator/" in address or address.startswith("blob:")

    starts = [e["ts"] for e in on]
    longest = {"translator": 0.0, "the rest": 0.0}
    for task in on:
        if task["name"] not in TASKS or task["ts"] > until:
            continue
        end = task["ts"] + task.get("dur", 0)
        spent = 0  # the translator's scripts, and the microtasks that follow them
        covered = task["ts"]  # nested events count once, in their outermost
        last = None  # whose script ran last: the microtasks after it are its
        ran = False
        inside = on[
            bisect.bisect_left(starts, task["ts"]) : bisect.bisect_right(starts, end)
        ]
        for e in inside:
            if e is task or e["ts"] < covered:
                continue
            if e["name"] in SCRIPTS:
                last = ours(e)
                ran |= last
            elif e["name"] != "RunMicrotasks":
                continue
            if last:
                spent += e.get("dur", 0)
            covered = e["ts"] + e.get("dur", 0)
        longest["translator"] = max(longest["translator"], spent / 1000)
        if not ran:
            longest["the rest"] = max(longest["the rest"], task.get("dur", 0) / 1000)
    return {
        "translator_longest_task_ms": longest["translator"],
        "rest_longest_task_ms": longest["the rest"],
    }


def loading(launch, url: str, width: str) -> dict:
    """Open `url` in a fresh browser at viewport `width` and wait until its first
    translation is drawn: the longest task of the main thread until the translation
    (ms; 0: none over 50 ms) and until it is drawn, and when each came (s); and, from
    the trace, the translator's longest time in one task and the rest's longest task
    until the translation (see owners)."""
    from browser import WAIT_MS

    browser = launch()
    try:
        context = browser.new_context(**VIEWPORTS[width])
        context.add_init_script(LONG_TASKS)
        page = context.new_page()
        browser.start_tracing(page=page, categories=TRACE_CATEGORIES)
        page.goto(url, wait_until="commit", timeout=WAIT_MS)
        page.wait_for_function(
            """() => performance.getEntriesByName("translator: drawn").length > 0""",
            timeout=WAIT_MS,
        )
        page.wait_for_timeout(200)  # a task that ends the drawing is reported late
        tasks, translated, drawn = page.evaluate(
            """() => [window.benchLoadTasks,
                 performance.getEntriesByName("translator: translated")[0].startTime,
                 performance.getEntriesByName("translator: drawn")[0].startTime]"""
        )
        trace = browser.stop_tracing()
    finally:
        browser.close()

    def longest(until: float) -> float:
        return max((d for start, d in tasks if start < until), default=0.0)

    return {
        "longest_task_ms": longest(translated),
        "longest_task_until_drawn_ms": longest(drawn),
        "tasks_over_50ms": sum(start < drawn for start, _ in tasks),
        "translated_s": translated / 1000,
        "drawn_s": drawn / 1000,
        **owners(trace, "translator: translated"),
    }


def loadings(launch, url: str, times: int) -> dict:
    """loading() `times` times at each viewport, alternating: every run, and the
    worst longest task up to the first translation."""
    runs: dict[str, list[dict]] = {width: [] for width in VIEWPORTS}
    for _ in range(times):
        for width in VIEWPORTS:
            runs[width].append(loading(launch, url, width))
    every = [r for rs in runs.values() for r in rs]
    return {
        "loading": runs,
        "loading_longest_task_ms": max(r["longest_task_ms"] for r in every),
        "loading_translator_longest_task_ms": max(
            r["translator_longest_task_ms"] for r in every
        ),
        "loading_rest_longest_task_ms": max(r["rest_longest_task_ms"] for r in every),
    }


def test_set(page) -> dict:
    """Press the score button and wait for the scores: the run's time and what the page
    prints."""
    page.click("#translator-score-go")
    page.wait_for_selector(
        "#translator-score:is([data-state=done], [data-state=error])",
        timeout=TEST_SET_WAIT_MS,
    )
    return {
        "test_set_status": page.text_content("#translator-score-status"),
        "test_set_s": page.evaluate(
            """() => performance.getEntriesByName("translator: test set scored")
                 .at(-1).detail.ms"""
        )
        / 1000,
        "test_set_scores": page.text_content("#translator-score-lines"),
        "test_set_reported": page.text_content("#translator-score-reported"),
    }


def measure(
    book: Path,
    pair: str,
    text: str,
    repeats: int,
    long_text: str,
    whole_test_set: bool,
    loads: int = 3,
    only_loading: bool = False,
) -> dict:
    from playwright.sync_api import sync_playwright

    sys.path.insert(0, str(ROOT / "tests"))
    from browser import CHROMIUM, CHROMIUM_ARGS, WAIT_MS

    loaded: list[str] = []
    url = f"{(book / PAGE).as_uri()}?{urlencode({'pair': pair, 'text': text})}"
    with sync_playwright() as p:

        def launch():
            return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)

        loads_measured = loadings(launch, url, loads)
        if only_loading:
            return {"chromium": launch().version, **loads_measured}
        browser = launch()
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
        views: list[float] = []
        for _ in range(repeats):
            for decoding, value in (("greedy", "1"), ("beam 4", "4")):
                # a new beam width translates at once; wait for that translation
                page.eval_on_selector(
                    "#translator-beam",
                    """(slider, value) => {
                         slider.value = value;
                         slider.dispatchEvent(new Event("change"));
                       }""",
                    value,
                )
                page.wait_for_function(
                    """n => performance.getEntriesByName("translator: drawn")
                         .length > n && !document.querySelector("#translator-go")
                         .disabled""",
                    arg=sum(map(len, seconds.values())) + 1,
                    timeout=WAIT_MS,
                )
                last = """name => performance.getEntriesByName(name).at(-1).detail.ms"""
                seconds[decoding].append(
                    page.evaluate(last, "translator: translated") / 1000
                )
                if decoding == "beam 4":
                    views.append(page.evaluate(last, "translator: search shown") / 1000)
        longest = long_input(page, long_text)
        scored = test_set(page) if whole_test_set else {}
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
        **loads_measured,
        **first,
        "greedy_s": seconds["greedy"],
        "beam4_s": seconds["beam 4"],
        "beam4_view_s": views,
        **longest,
        **scored,
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
    p.add_argument("--long-words", type=int, default=300)
    p.add_argument(
        "--loads",
        type=int,
        default=3,
        help="how many times the page is opened at each viewport (default: 3)",
    )
    p.add_argument(
        "--only-loading",
        action="store_true",
        help="measure the loading only (the longest tasks), and stop there",
    )
    p.add_argument(
        "--no-test-set",
        action="store_true",
        help="leave out the score button's run over the whole test split",
    )
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)

    def refuse(message: str) -> None:
        """One line on standard error and status 2, as the package's commands."""
        p.exit(2, f"{p.prog}: error: {message}\n")

    if args.repeats < 1:
        refuse(f"--repeats must be at least 1, got {args.repeats}")
    if args.loads < 1:
        refuse(f"--loads must be at least 1, got {args.loads}")
    args.book = args.book.resolve()  # a file:// address needs the whole path
    if not (args.book / PAGE).is_file():
        refuse(f"no {PAGE} in {args.book}: build the book first (make book)")
    try:
        text = sentence_of(args.pair, args.words)
        long_text = paragraph(args.pair, args.long_words)
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
        "long_words": args.long_words,
        **measure(
            args.book,
            args.pair,
            text,
            args.repeats,
            long_text,
            whole_test_set=not args.no_test_set,
            loads=args.loads,
            only_loading=args.only_loading,
        ),
    }
    loading_lines = "".join(
        f"  loading at {width} px: the longest task"
        f" {max(r['longest_task_ms'] for r in runs):.0f} ms up to the first"
        " translation (the translator's scripts at most"
        f" {max(r['translator_longest_task_ms'] for r in runs):.0f} ms of one task,"
        f" the rest's longest {max(r['rest_longest_task_ms'] for r in runs):.0f} ms),"
        f" {max(r['longest_task_until_drawn_ms'] for r in runs):.0f} ms up to its"
        f" drawing (0: none over 50 ms; the worst of {len(runs)})\n"
        for width, runs in result["loading"].items()
    )
    if args.only_loading:
        print(
            f"{result['machine']} (load {result['load_average'][0]:.1f}),"
            f" Chromium {result['chromium']}, {args.pair}:\n{loading_lines}",
            file=sys.stderr,
            end="",
        )
        if args.out:
            atomic_write(args.out, (json.dumps(result, indent=1) + "\n").encode())
        return 0
    result["greedy_median_s"] = statistics.median(result["greedy_s"])
    result["beam4_median_s"] = statistics.median(result["beam4_s"])
    result["beam4_view_median_s"] = statistics.median(result["beam4_view_s"])
    result["page_bytes"] = sum(result["bytes"].values())
    result["goals_met"] = {name: result[name] <= goal for name, goal in GOALS.items()}
    print(
        f"{result['machine']} (load {result['load_average'][0]:.1f}),"
        f" Chromium {result['chromium']}, {args.pair}:\n"
        + loading_lines
        + f"  first translation {result['first_translation_s']:.2f} s after opening"
        f" (data {result['data_loaded_s']:.2f} s, model ready"
        f" {result['model_ready_s']:.2f} s, translating {result['translating_s']:.2f} s)\n"
        f"  {args.words} words: greedy {result['greedy_median_s']:.2f} s,"
        f" beam 4 {result['beam4_median_s']:.2f} s, its search drawn"
        f" {result['beam4_view_median_s']:.2f} s (medians of {args.repeats})\n"
        f"  {args.long_words} words ({result['long_input_pieces']} pieces): the longest"
        f" task {result['long_input_longest_task_ms']:.0f} ms (0: none over 50 ms), the"
        f" longest answer {result['long_input_answer_max_ms']:.0f} ms\n"
        + (
            f"  the test split: {result['test_set_s']:.0f} s;"
            f" {result['test_set_reported']}\n"
            if "test_set_s" in result
            else ""
        )
        + f"  page weight {result['page_bytes'] / 1e6:.1f} MB: "
        + ", ".join(f"{k} {v / 1e6:.2f} MB" for k, v in sorted(result["bytes"].items()))
        + f"\n  ({time.time() - started:.0f} s in all)",
        file=sys.stderr,
    )
    if args.out:
        atomic_write(args.out, (json.dumps(result, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
