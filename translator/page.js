"use strict";
/* global translatorCore, vegaEmbed */

// The page "Translate and look inside": the widget's controls, the loading of a pair's
// model, a Web Worker that translates, and the heatmaps of the translation's attention.
// Everything the reader types, and everything a link carries, reaches the page as text
// (textContent, a form field's value), never as HTML; nothing is asked of the network.

(() => {
  // core.js, page.js and the pairs' data lie side by side: _static/translator/. The
  // build names the shipped pairs on this script's element.
  const here = document.currentScript.src;
  const shipped = document.currentScript.dataset.pairs.split(" ");
  const pairs = {}; // pair -> {data, weights}, as its script hands them over
  const loads = {}; // pair -> the promise of its loading
  const ready = new Set(); // the pairs whose model is ready to translate
  let worker; // a Worker; null where none starts and the page computes itself
  let pinged; // the promise of the worker's first answer
  const local = new Map(); // pair -> LanguagePair, where the page computes itself
  let shown = null; // the translation on display, for the heatmap's controls
  let busy = null; // the promise of the work under way
  let calls = 0;
  const waiting = new Map(); // call id -> {resolve, reject, onStep}

  const $ = (id) => document.getElementById(`translator-${id}`);

  function setState(state, status = "") {
    if (!document.getElementById("translator")) {
      return; // the page is still loading: start() sets the state
    }
    $("progress").hidden = !["loading", "translating"].includes(state);
    $("status").textContent = status;
    document.getElementById("translator").dataset.state = state;
  }

  // ---- Loading a pair: its script (weights as base64), then a worker that holds it.

  window.translatorData = (data, weights) => {
    pairs[data.pair] = { data, weights };
  };

  function loadScript(url) {
    return new Promise((resolve, reject) => {
      const script = document.createElement("script");
      script.src = url;
      script.onload = resolve;
      script.onerror = () => reject(new Error(`cannot load ${url}`));
      document.head.append(script);
    });
  }

  function fromBase64(text) {
    if (Uint8Array.fromBase64) {
      return Uint8Array.fromBase64(text);
    }
    const binary = atob(text);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) {
      bytes[i] = binary.charCodeAt(i);
    }
    return bytes;
  }

  /** A Worker running core.js, made from its source: a blob URL works from file://. */
  function startWorker() {
    try {
      const source = `(${translatorCore.toString()})(self);\n`;
      const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      const started = new Worker(url);
      started.onmessage = ({ data: message }) => {
        const call = waiting.get(message.id);
        if (!call) {
          return;
        }
        if (message.step !== undefined) {
          call.onStep?.(message.step, message.limit);
          return;
        }
        waiting.delete(message.id);
        if (message.error) {
          call.reject(new Error(message.error));
        } else {
          call.resolve(message.result ?? message.ready);
        }
      };
      // A worker that fails to run (its script refused, say) fails every call waiting.
      started.onerror = (event) => {
        event.preventDefault();
        for (const call of waiting.values()) {
          call.reject(new Error(event.message || "the worker stopped"));
        }
        waiting.clear();
      };
      return started;
    } catch {
      return null; // a page that forbids workers: compute here
    }
  }

  function callWorker(message, transfer = [], onStep = null) {
    if (!worker) {
      return Promise.reject(new Error("no worker"));
    }
    return new Promise((resolve, reject) => {
      const id = ++calls;
      waiting.set(id, { resolve, reject, onStep });
      worker.postMessage({ ...message, id }, transfer);
    });
  }

  const pause = () => new Promise((resolve) => setTimeout(resolve, 0));

  /** The pair's data, once its model is ready to translate (loaded once). */
  function loadPair(pair) {
    loads[pair] ??= startPair(pair).catch((error) => {
      delete loads[pair]; // a later attempt starts over
      throw error;
    });
    return loads[pair];
  }

  /** A worker that answers, once it has warmed up (or false where none starts). */
  function workerReady() {
    if (worker === undefined) {
      worker = startWorker();
      pinged = callWorker({ ping: true }).then(
        () => true,
        () => {
          worker?.terminate();
          worker = null;
          return false;
        },
      );
    }
    return pinged;
  }

  /** "German → English model (12 MB of weights)", once the widget is there. */
  function describe(pair) {
    const option = document.querySelector(`#translator-pair option[value="${pair}"]`);
    return option ? `${option.textContent} model (${option.dataset.megabytes} MB)` : "model";
  }

  async function startPair(pair) {
    setState("loading", `Loading the ${describe(pair)}…`);
    workerReady(); // it warms up while the data loads
    if (!pairs[pair]) {
      await loadScript(new URL(`${pair}.js`, here).href);
      performance.mark(`translator: ${pair} loaded`);
    }
    const entry = pairs[pair];
    const weights = entry.weights.map(fromBase64);
    entry.weights = null; // the base64 text is no longer needed
    setState("loading", `Starting the ${describe(pair)}…`);
    if (await workerReady()) {
      // the weights move to the worker (transferred, not copied)
      await callWorker(
        { load: entry.data, weights },
        weights.map((w) => w.buffer),
      );
    } else {
      await pause(); // let the status show before the page is busy
      local.set(pair, new (translatorCore(null).LanguagePair)(entry.data, weights));
    }
    ready.add(pair);
    performance.mark(`translator: ${pair} ready`);
    return entry;
  }

  // ---- Translating

  function selectedBeam() {
    return Number(document.querySelector("input[name=translator-search]:checked").value);
  }

  function shareLink(pair, text, beam) {
    const url = new URL(window.location.href);
    url.search = "";
    url.searchParams.set("pair", pair);
    url.searchParams.set("text", text);
    if (beam === 1) {
      url.searchParams.set("beam", "1");
    }
    url.hash = "";
    return url.href;
  }

  async function run() {
    const pair = $("pair").value;
    const text = $("text").value;
    $("text").lang = pair.split("-")[0]; // the source language, for spelling and speech
    const beamSize = selectedBeam();
    if (!ready.has(pair)) {
      setState("loading", `Loading the ${describe(pair)}…`);
    }
    const entry = await loadPair(pair);
    const search = beamSize === 1 ? "greedy decoding" : `beam search, ${beamSize} beams`;
    setState("translating", `Translating (${search})…`);
    const onStep = (t) => {
      $("status").textContent = `Translating (${search}): step ${t + 1}`;
    };
    const started = performance.now();
    let result;
    if (worker) {
      result = await callWorker({ pair, translate: text, beamSize }, [], onStep);
    } else {
      await pause();
      result = local.get(pair).translate(text, { beamSize });
    }
    const ms = performance.now() - started;
    const seconds = (ms / 1000).toFixed(2);
    // for experiments/translator_bench.py: when, and how long the translation took
    performance.mark("translator: translated", { detail: { ms } });
    show(result);
    const where = worker ? "" : " on the page itself: no worker could start";
    const status = result.source ? `Translated in ${seconds} s${where}.` : "";
    if (result.source) {
      $("status").textContent = `${status} Reading its attention…`;
      const { source, target } = result;
      const attention = worker
        ? await callWorker({ pair, attention: { source, target } })
        : local.get(pair).attention(source, target);
      await showInside({ ...result, attention, layers: entry.data.config.model.n_layers });
    }
    setState("done", status);
    // A link that opens the page with this translation. (The page's own address stays:
    // Vega's legend refers to its gradient by the page's address, which must not change.)
    $("link").href = shareLink(pair, text, beamSize);
    $("link").parentElement.hidden = false;
  }

  /** What went wrong, in the status line (and the console, for whoever debugs it). */
  function report(error) {
    setState("error", `Something went wrong: ${error.message.split("\n")[0]}`);
    console.warn(error);
  }

  function translateNow() {
    busy = (busy ?? Promise.resolve()).then(run).catch(report);
    return busy;
  }

  // ---- Showing a translation and its attention

  function show(result) {
    document.getElementById("translation").textContent = result.text;
    const warnings = $("warnings");
    warnings.replaceChildren(
      ...result.warnings.map((message) => {
        const item = document.createElement("li");
        item.textContent = `warning: ${message}`;
        return item;
      }),
    );
    shown = null;
    $("inside").hidden = true;
  }

  /** The pieces and heatmap of a translation with its attention (from the worker). */
  function showInside(translation) {
    shown = translation;
    $("inside").hidden = false;
    fillOptions($("layer"), shown.layers, (i) => `${i + 1}`, shown.layers - 1);
    fillOptions(
      $("head"),
      shown.attention.heads + 1,
      (i) => (i === 0 ? "all, averaged" : `${i}`),
      0,
    );
    drawPieces();
    return drawHeatmap();
  }

  function fillOptions(select, count, label, selected) {
    const keep = select.options.length === count ? select.selectedIndex : selected;
    select.replaceChildren(
      ...Array.from({ length: count }, (_, i) => {
        const option = document.createElement("option");
        option.value = String(i);
        option.textContent = label(i);
        return option;
      }),
    );
    select.selectedIndex = keep;
  }

  /**
   * The matrix on display: the chosen attention of the chosen layer, one head or the mean
   * of all, with its row and column labels. rows x cols, row-major.
   */
  function matrix(kind = $("kind").value) {
    const layer = Number($("layer").value);
    const head = Number($("head").value) - 1; // -1: the heads' mean
    const { attention, sourcePieces, inputPieces, outputPieces } = shown;
    const H = attention.heads;
    const weights = {
      cross: attention.decoderCross,
      encoder: attention.encoder,
      decoderSelf: attention.decoderSelf,
    }[kind][layer];
    const rows = kind === "encoder" ? sourcePieces : outputPieces;
    const cols = kind === "decoderSelf" ? inputPieces : sourcePieces;
    const size = rows.length * cols.length;
    const values = new Float32Array(size);
    for (let h = 0; h < H; h++) {
      if (head < 0 || head === h) {
        for (let i = 0; i < size; i++) {
          values[i] += weights[h * size + i] / (head < 0 ? H : 1);
        }
      }
    }
    const titles = {
      cross: ["output piece (the step that wrote it)", "source piece"],
      encoder: ["source piece (query)", "source piece (key)"],
      decoderSelf: ["output piece (the step that wrote it)", "decoder input (key)"],
    }[kind];
    return { rows, cols, values, titles };
  }

  function drawPieces() {
    const { sourcePieces, outputPieces } = shown;
    const spans = (pieces) =>
      pieces.map((piece) => {
        const span = document.createElement("span");
        span.className = "translator-piece";
        span.textContent = piece;
        return span;
      });
    const source = spans(sourcePieces);
    const output = spans(outputPieces);
    $("source").replaceChildren(...source);
    $("output").replaceChildren(...output);
    // Pointing at an output piece shades each source piece by the encoder-decoder
    // attention of the step that wrote it (the layer and head chosen above).
    output.forEach((span, t) => {
      span.addEventListener("mouseenter", () => {
        const { values, cols } = matrix("cross");
        const row = values.subarray(t * cols.length, (t + 1) * cols.length);
        const top = Math.max(...row);
        source.forEach((s, j) => {
          s.style.backgroundColor = `rgba(33, 113, 181, ${(0.8 * row[j]) / top})`;
        });
        span.classList.add("translator-pointed");
      });
      span.addEventListener("mouseleave", () => {
        source.forEach((s) => {
          s.style.backgroundColor = "";
        });
        span.classList.remove("translator-pointed");
      });
    });
  }

  function drawHeatmap() {
    const { rows, cols, values, titles } = matrix();
    const target = $("heatmap");
    // Cells as large as the book's heatmaps (28 px), smaller where the column needs it.
    const room = target.clientWidth - 180; // the row labels and the chart's padding
    const step = Math.max(1, Math.min(28, Math.floor(room / cols.length)));
    // Position-prefixed labels keep a repeated piece apart, as in the book's heatmaps.
    const x = cols.map((piece, j) => `${j}:${piece}`);
    const y = rows.map((piece, i) => `${i}:${piece}`);
    const cells = [];
    y.forEach((query, i) => {
      x.forEach((key, j) => {
        cells.push({ query, key, weight: Math.round(values[i * cols.length + j] * 1e4) / 1e4 });
      });
    });
    const labels = step >= 10;
    const spec = {
      data: { values: cells },
      width: step * cols.length,
      height: step * rows.length,
      params: [
        {
          name: "pointed",
          select: { type: "point", fields: ["query"], on: "mouseover", clear: "mouseout" },
        },
      ],
      mark: "rect",
      encoding: {
        x: {
          field: "key",
          type: "nominal",
          sort: x,
          title: titles[1],
          axis: { labelAngle: -45, labels },
        },
        y: { field: "query", type: "nominal", sort: y, title: titles[0], axis: { labels } },
        color: { field: "weight", type: "quantitative", scale: { scheme: "blues" } },
        // pointing at a row (an output piece) fades the others: where that step looked
        opacity: { condition: { param: "pointed", empty: true, value: 1 }, value: 0.3 },
        tooltip: [
          { field: "query", title: titles[0] },
          { field: "key", title: titles[1] },
          { field: "weight", type: "quantitative", format: ".3f" },
        ],
      },
      config: { legend: { orient: "bottom" } },
    };
    // SVG, one element per cell, up to a few hundred pieces; a canvas beyond
    const renderer = cells.length > 40000 ? "canvas" : "svg";
    return vegaEmbed(target, spec, { actions: false, renderer });
  }

  // ---- Starting: the controls, and the sentence of the address or the pair's example

  function example(pair) {
    return pairs[pair]?.data.example ?? "";
  }

  async function start() {
    const params = new URLSearchParams(window.location.search);
    const pairSelect = $("pair");
    const pair = params.get("pair");
    if (pair && [...pairSelect.options].some((o) => o.value === pair)) {
      pairSelect.value = pair;
    }
    if (params.get("beam") === "1") {
      document.querySelector("input[name=translator-search][value='1']").checked = true;
    }
    $("text").value = params.get("text") ?? ""; // a form field's value: text, not HTML
    if (!ready.has(pairSelect.value)) {
      setState("loading", `Loading the ${describe(pairSelect.value)}…`);
    }
    $("go").addEventListener("click", translateNow);
    $("text").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        translateNow();
      }
    });
    let previous = pairSelect.value;
    pairSelect.addEventListener("change", async () => {
      // an untouched example follows the pair
      const untouched = !$("text").value || $("text").value === example(previous);
      previous = pairSelect.value;
      if (untouched) {
        await loadPair(pairSelect.value).catch(() => null);
        $("text").value = example(pairSelect.value);
      }
      translateNow();
    });
    for (const name of ["kind", "layer", "head"]) {
      $(name).addEventListener("change", () => shown && drawHeatmap().catch(report));
    }
    document.querySelectorAll("input[name=translator-search]").forEach((input) => {
      input.addEventListener("change", translateNow);
    });
    if (!params.has("text")) {
      try {
        await loadPair(pairSelect.value);
        $("text").value = example(pairSelect.value);
      } catch {
        // translateNow reports it
      }
    }
    translateNow();
  }

  // Start at once, while the rest of the page loads: the worker, and the data of the
  // pair that the link names (or the first). A failure shows when the page translates.
  const asked = new URLSearchParams(window.location.search).get("pair");
  loadPair(shipped.includes(asked) ? asked : shipped[0]).catch(() => null);

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
