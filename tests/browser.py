"""Headless Chromium for the tests of the built book: where it is, how it is
started (no network: every host name fails to resolve), and how long a page may
take."""

from __future__ import annotations

import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--host-resolver-rules=MAP * ~NOTFOUND",
]

# How long a page may take to load, draw its charts or typeset its formulas. A page that
# draws returns as soon as it has, so a generous limit costs only broken pages time, and
# it keeps a slow or loaded 2-core CI machine from failing a page that would have drawn.
WAIT_MS = 90_000
