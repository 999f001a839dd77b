"""Serve Vega, Vega-Lite and vega-embed from the book's own _static folder.

Altair's HTML output loads these libraries from a CDN unless `VEGA_DEBUG` says that the versions
it wants are already on the page. This extension writes the bundle that vl-convert-python ships
(no network needed) into `_static/vega-bundle.js`, loads it in every page's <head>, and declares
the versions that Altair's output asks for, so the charts draw offline and stay interactive.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from transformer.atomic import atomic_write

BUNDLE = "vega-bundle.js"


def _requested_versions() -> dict[str, str]:
    """The versions Altair's html renderer asks `maybeLoadScript` for, keyed as in `VEGA_DEBUG`."""
    import altair as alt
    import pandas as pd

    with alt.renderers.enable(
        "html"
    ):  # the renderer the chapters use (plots.use_book_renderer)
        html = (
            alt.Chart(pd.DataFrame({"x": [0]}))
            .mark_point()
            ._repr_mimebundle_()["text/html"]
        )
    pairs = re.findall(r'maybeLoadScript\("([\w-]+)", "([^"]+)"\)', html)
    if not pairs:
        raise RuntimeError(
            "vega_offline: cannot find the Vega versions in Altair's html output"
        )
    return {f"{lib.replace('-', '')}_version": version for lib, version in pairs}


def _write_bundle(app) -> None:
    if app.builder.format != "html":
        return
    import vl_convert

    static = Path(app.doctreedir).parent / "vega_static"
    static.mkdir(parents=True, exist_ok=True)
    target = static / BUNDLE
    if not target.exists():
        # The bundle assigns window.vegaEmbed, vega and vegaLite; its top-level names (one is
        # `_`, which Sphinx's doctools.js also declares) stay private inside a function scope.
        bundle = f"(function () {{\n{vl_convert.javascript_bundle()}\n}})();\n"
        atomic_write(target, bundle.encode("utf-8"))
    app.config.html_static_path.append(str(static))
    app.add_js_file(BUNDLE, priority=200)
    versions = json.dumps(_requested_versions(), sort_keys=True)
    app.add_js_file(None, body=f"var VEGA_DEBUG = {versions};", priority=201)


def _dedupe_scripts(app, pagename, templatename, context, doctree) -> None:
    # Sphinx 7.4 lists an inline script twice when an extension adds it during builder-inited
    # (once with filename None, once with ""); a repeated `const` is then a script error.
    seen, unique = set(), []
    for script in context.get("script_files", []):
        key = (script.filename or "", tuple(sorted(script.attributes.items())))
        if key not in seen:
            seen.add(key)
            unique.append(script)
    context["script_files"] = unique


def setup(app):
    app.connect("builder-inited", _write_bundle)
    app.connect("html-page-context", _dedupe_scripts)
    return {"version": "1.0", "parallel_read_safe": True, "parallel_write_safe": True}
