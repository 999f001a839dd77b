"use strict";
/* global translatorCore */

// The page "Translate and look inside": the widget's controls, the loading of a pair's
// model, the Web Workers that translate, the beam search step by step, the attention
// heatmaps, and the score of the test set. Everything the reader types, and everything a
// link carries, reaches the page as text (textContent, a form field's value), never as
// HTML; nothing is asked of the network. The page's own work is cut into short tasks, so
// that it answers the reader at once whatever the input: the models run in workers, and a
// heatmap is drawn on a canvas, only the part in view.

(() => {
  // core.js, page.js and the pairs' data lie side by side: _static/translator/. The
  // build names the shipped pairs on this script's element.
  const here = document.currentScript.src;
  const shipped = document.currentScript.dataset.pairs.split(" ");
  const pairs = {}; // pair -> {data, weights (base64), bytes}, as its script hands them over
  const testSets = {}; // pair -> its test split, once its script has run
  const loads = {}; // pair -> the promise of its loading
  const ready = new Set(); // the pairs whose model is ready to translate
  let worker; // a Worker; null where none starts and the page computes itself
  let pinged; // the promise of the worker's first answer
  const local = new Map(); // pair -> LanguagePair, where the page computes itself
  let core = null; // translatorCore's names, on the page itself
  let calls = 0;
  const waiting = new Map(); // call id -> {resolve, reject, onStep}
  let running = null; // the translation under way: {cancelled, calls}
  let shown = null; // the translation on display
  let linkProblem = null; // what is wrong with the link the page was opened with

  const $ = (id) => document.getElementById(`translator-${id}`);
  const MARK = "\u2581"; // the tokenizer's word marker, ▁
  const SHOWN_MARK = "\u2423"; // how the page shows it, ␣: a space before this piece

  /** A promise of the event loop's next turn: the page answers the reader in between. */
  const nextTurn = () =>
    globalThis.scheduler?.yield
      ? globalThis.scheduler.yield()
      : new Promise((resolve) => setTimeout(resolve, 0));

  class Cancelled extends Error {
    constructor() {
      super("cancelled");
      this.name = "Cancelled";
    }
  }

  /** Input that the page cannot translate: its message is for the reader, as it is. */
  class Problem extends Error {}

  function setState(state, status = "") {
    if (!$("status")) {
      return; // the page is still loading: start() sets the state
    }
    $("progress").hidden = !["loading", "translating"].includes(state);
    $("status").textContent = status;
    document.getElementById("translator").dataset.state = state;
  }

  /** While a translation runs, Translate waits and Cancel stops it. */
  function setBusy(busy) {
    $("go").disabled = busy;
    $("cancel").disabled = !busy;
  }

  // ---- Loading a pair: its script (weights as base64), then a worker that holds it.

  window.translatorData = (data, weights) => {
    pairs[data.pair] = { data, weights };
  };
  window.translatorTestSet = (data) => {
    testSets[data.pair] = data;
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

  /**
   * A Worker running core.js, made from its source (a blob URL works from file://), that
   * answers the calls of `calls` (id -> {resolve, reject, onStep}).
   */
  function startWorker(table = waiting) {
    try {
      const source = `(${translatorCore.toString()})(self);\n`;
      const url = URL.createObjectURL(new Blob([source], { type: "text/javascript" }));
      const started = new Worker(url);
      started.onmessage = ({ data: message }) => {
        const call = table.get(message.id);
        if (!call) {
          return;
        }
        if (message.step !== undefined) {
          call.onStep?.(message.step);
          return;
        }
        table.delete(message.id);
        if (message.error) {
          call.reject(new Error(message.error));
        } else if (message.cancelled) {
          call.reject(new Cancelled());
        } else {
          call.resolve(message.result ?? message.ready);
        }
      };
      // A worker that fails to run (its script refused, say) fails every call waiting.
      started.onerror = (event) => {
        event.preventDefault();
        for (const call of table.values()) {
          call.reject(new Error(event.message || "the worker stopped"));
        }
        table.clear();
      };
      return started;
    } catch {
      return null; // a page that forbids workers: compute here
    }
  }

  /** Ask `target` (a worker) for `message`: a promise of its answer, and the call's id. */
  function ask(target, table, message, { transfer = [], onStep = null, run = null } = {}) {
    const id = ++calls;
    const promise = new Promise((resolve, reject) => {
      table.set(id, { resolve, reject, onStep });
      target.postMessage({ ...message, id }, transfer);
    });
    run?.calls.add(id);
    return promise;
  }

  function callWorker(message, options = {}) {
    if (!worker) {
      return Promise.reject(new Error("no worker"));
    }
    return ask(worker, waiting, message, options);
  }

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

  /** "German → English model (12 MB)", once the widget is there. */
  function describe(pair) {
    const option = document.querySelector(`#translator-pair option[value="${pair}"]`);
    return option ? `${option.textContent} model (${option.dataset.megabytes} MB)` : "model";
  }

  /** The names of the pairs, "German → English (de-en) or French → English (fr-en)". */
  function choices() {
    const names = [...$("pair").options].map((o) => `${o.textContent} (${o.value})`);
    return names.length > 1 ? `${names.slice(0, -1).join(", ")} or ${names.at(-1)}` : names[0];
  }

  async function startPair(pair) {
    workerReady(); // it warms up while the data loads
    if (!pairs[pair]) {
      await loadScript(new URL(`${pair}.js`, here).href);
      performance.mark(`translator: ${pair} loaded`);
    }
    const entry = pairs[pair];
    // kept on the page: the score button's workers load them too
    entry.bytes ??= entry.weights.map(fromBase64);
    entry.weights = null; // the base64 text is no longer needed
    if (await workerReady()) {
      await callWorker({ load: entry.data, weights: entry.bytes });
    } else {
      await nextTurn(); // let the status show before the page is busy
      core ??= translatorCore(null);
      local.set(pair, new core.LanguagePair(entry.data, entry.bytes));
    }
    ready.add(pair);
    performance.mark(`translator: ${pair} ready`);
    return entry;
  }

  // ---- The search's settings, and the link

  const root = () => document.getElementById("translator");
  const defaults = () => ({
    beamSize: Number(root().dataset.beamSize),
    alpha: Number(root().dataset.alpha),
  });
  let prefix = []; // the pieces the output is forced to start with

  function settings() {
    return { beamSize: Number($("beam").value), alpha: Number($("alpha").value) };
  }

  function showSettings() {
    const { beamSize, alpha } = settings();
    $("beam-value").textContent = beamSize === 1 ? "1 (greedy)" : String(beamSize);
    $("alpha-value").textContent = alpha.toFixed(1);
  }

  function shareLink(pair, text) {
    const url = new URL(window.location.href);
    url.search = "";
    url.searchParams.set("pair", pair);
    url.searchParams.set("text", text);
    const { beamSize, alpha } = settings();
    if (beamSize !== defaults().beamSize) {
      url.searchParams.set("beam", String(beamSize));
    }
    if (alpha !== defaults().alpha) {
      url.searchParams.set("alpha", String(alpha));
    }
    if (prefix.length) {
      url.searchParams.set("prefix", prefix.join(" "));
    }
    url.hash = "";
    return url.href;
  }

  /** What the link's beam, alpha and pair ask for, or the one-line problem with them. */
  function readLink(params) {
    const range = (input) => [Number(input.min), Number(input.max)];
    const pair = params.get("pair");
    if (pair !== null && !shipped.includes(pair)) {
      return `This link asks for the language pair “${pair}”, which this page does not have: choose ${choices()}.`;
    }
    const beam = params.get("beam");
    const [beamMin, beamMax] = range($("beam"));
    if (beam !== null) {
      const k = Number(beam);
      if (!Number.isInteger(k) || k < beamMin || k > beamMax) {
        return `This link asks for a beam width of “${beam}”: the page searches with ${beamMin} to ${beamMax} beams.`;
      }
      $("beam").value = String(k);
    }
    const alpha = params.get("alpha");
    const [alphaMin, alphaMax] = range($("alpha"));
    if (alpha !== null) {
      const a = Number(alpha);
      if (alpha.trim() === "" || !(a >= alphaMin && a <= alphaMax)) {
        return `This link asks for α = “${alpha}”: the page takes α from ${alphaMin} to ${alphaMax}.`;
      }
      $("alpha").value = String(a);
    }
    prefix = (params.get("prefix") ?? "").split(" ").filter(Boolean);
    return null;
  }

  /** The prefix's ids in the pair's vocabulary, or the one-line problem with it. */
  function prefixIds(entry) {
    const vocab = entry.data.tokenizer.bpe.model.vocab;
    const ids = entry.data.special_ids;
    const unknown = prefix.filter((piece) => !Object.hasOwn(vocab, piece));
    if (unknown.length) {
      throw new Problem(
        `The forced start holds “${unknown[0]}”, which is not a piece of the model's` +
          " vocabulary: choose “Decode freely”.",
      );
    }
    const found = prefix.map((piece) => vocab[piece]);
    if (found.some((id) => [ids.bos, ids.eos, ids.pad].includes(id))) {
      throw new Problem(
        "The forced start holds a special piece, which the search adds itself: choose" +
          " “Decode freely”.",
      );
    }
    return found;
  }

  // ---- Translating

  /** Stop the translation under way: its calls in the worker, and its drawing. */
  function stopRunning() {
    if (!running) {
      return;
    }
    running.cancelled = true;
    for (const id of running.calls) {
      worker?.postMessage({ cancel: id });
    }
  }

  /** Translate the box's text with the page's settings; a new one stops the one running. */
  async function translateNow() {
    stopRunning();
    const run = { cancelled: false, calls: new Set() };
    running = run;
    setBusy(true);
    try {
      await translateRun(run);
    } catch (error) {
      if (running !== run) {
        return; // another one has started
      }
      if (error instanceof Cancelled || run.cancelled) {
        setState("cancelled", "Cancelled: nothing was translated.");
      } else {
        report(error);
      }
    } finally {
      if (running === run) {
        running = null;
        setBusy(false);
      }
    }
  }

  function check(run) {
    if (run.cancelled) {
      throw new Cancelled();
    }
  }

  async function translateRun(run) {
    const pair = $("pair").value;
    const text = $("text").value;
    $("text").lang = pair.split("-")[0]; // the source language, for spelling and speech
    $("link").parentElement.hidden = true;
    if (!text.trim()) {
      clearShown();
      setState("error", "Type a sentence to translate: the box is empty.");
      return;
    }
    if (!ready.has(pair)) {
      setState("loading", `Loading the ${describe(pair)}…`);
    }
    const entry = await loadPair(pair);
    check(run);
    const { beamSize, alpha } = settings();
    const options = { beamSize, alpha, prefix: prefixIds(entry) };
    const search = beamSize === 1 ? "greedy decoding" : `beam search, ${beamSize} beams`;
    setState("translating", `Translating (${search})…`);
    const onStep = (t) => {
      $("status").textContent = `Translating (${search}): step ${t + 1}`;
    };
    const started = performance.now();
    const result = await compute(run, { pair, inspect: text, options }, onStep, (c) =>
      c.inspect(text, options),
    );
    const ms = performance.now() - started;
    // for experiments/translator_bench.py: when, and how long the translation took
    performance.mark("translator: translated", { detail: { ms } });
    check(run);
    if (result.empty) {
      clearShown();
      setState("error", "Type a sentence to translate: the box is empty.");
      return;
    }
    const where = worker ? "" : " on the page itself: no worker could start";
    const status = `Translated in ${(ms / 1000).toFixed(2)} s${where}.`;
    show(result, entry, pair, text);
    const viewStarted = performance.now();
    await showSearch(run);
    performance.mark("translator: search shown", {
      detail: { ms: ms + performance.now() - viewStarted },
    });
    $("status").textContent = `${status} Reading its attention…`;
    const { source, target } = result;
    const attention = await compute(run, { pair, attention: { source, target } }, null, (c) =>
      c.attention(source, target),
    );
    check(run);
    await showInside(run, { ...attention, layers: entry.data.config.model.n_layers });
    setState("done", status);
    performance.mark("translator: drawn");
  }

  /**
   * A work of the model: in the worker (`message`), or on the page itself, in slices, where
   * no worker runs (`here(pair)` gives its generator). Either way it stops if cancelled.
   */
  async function compute(run, message, onStep, here) {
    if (worker) {
      return callWorker(message, { onStep, run });
    }
    return core.drive(here(local.get(message.pair)), () => run.cancelled, onStep);
  }

  /** What went wrong, in the status line (and the console, for whoever debugs it). */
  function report(error) {
    if (error instanceof Problem) {
      $("forced").hidden = !prefix.length;
      $("prefix").replaceChildren(...prefix.map((piece) => pieceSpan(piece)));
      setState("error", error.message);
      return;
    }
    setState("error", `Something went wrong: ${error.message.split("\n")[0]}`);
    console.warn(error);
  }

  // ---- Showing a translation

  /** The piece as the page writes it: ␣ for the word marker. */
  const shownPiece = (piece) => piece.replaceAll(MARK, SHOWN_MARK);

  /** A span for one piece, the marker greyed. */
  function pieceSpan(piece, className = "translator-piece") {
    const span = document.createElement("span");
    span.className = className;
    if (piece.startsWith(MARK)) {
      const mark = document.createElement("span");
      mark.className = "translator-mark";
      mark.textContent = SHOWN_MARK;
      span.append(mark, piece.slice(MARK.length));
    } else {
      span.textContent = piece;
    }
    return span;
  }

  /** The text of pieces, as the tokenizer decodes them (▁ a space). */
  const textOf = (pieces) => pieces.join("").replaceAll(MARK, " ").trim();

  function clearShown() {
    shown = null;
    document.getElementById("translation").textContent = "";
    $("warnings").replaceChildren();
    $("compare").hidden = true;
    for (const part of ["search", "inside"]) {
      if ($(part)) {
        $(part).hidden = true;
      }
    }
  }

  function show(result, entry, pair, text) {
    if (!entry.pieceOf) {
      entry.pieceOf = [];
      for (const [piece, id] of Object.entries(entry.data.tokenizer.bpe.model.vocab)) {
        entry.pieceOf[id] = piece;
      }
    }
    const { pieceOf } = entry;
    shown = { ...result, pair, pieceOf, entry };
    document.getElementById("translation").textContent = result.text;
    const warnings = [...result.warnings];
    const counted = result.source.length - 1; // without <eos>
    if (result.unknown > counted / 2) {
      const unk = pieceOf[entry.data.special_ids.unk];
      const languages = [...$("pair").options].map((o) => o.textContent.split(" → ")[0]);
      warnings.push(
        `${result.unknown} of ${counted} pieces of this text are ${unk}, characters the model` +
          ` never saw: this page's models know ${languages.join(" or ")} only.`,
      );
    }
    $("warnings").replaceChildren(
      ...warnings.map((message) => {
        const item = document.createElement("li");
        item.textContent = `warning: ${message}`;
        return item;
      }),
    );
    $("forced").hidden = !prefix.length;
    $("prefix").replaceChildren(...prefix.map((piece) => pieceSpan(piece)));
    // A link that opens the page with this translation. (The page's own address stays.)
    $("link").href = shareLink(pair, text);
    $("link").parentElement.hidden = false;
    showComparison(result);
  }

  function showComparison(result) {
    const { beam, greedy, options } = result;
    const row = (name, found) => {
      const cells = [
        name,
        found.text ?? result.text,
        found.logProb.toFixed(3),
        (found.penalised ?? found.score).toFixed(3), // log p / lp(|Y|)
      ].map((value) => {
        const cell = document.createElement("td");
        cell.textContent = value;
        return cell;
      });
      const tr = document.createElement("tr");
      tr.append(...cells);
      return tr;
    };
    const beamName =
      options.beamSize === 1 ? "beam width 1" : `beam search, ${options.beamSize} beams`;
    $("compare-rows").replaceChildren(
      row("greedy decoding", greedy),
      row(`${beamName}, α = ${options.alpha.toFixed(1)}`, beam),
    );
    const a = [...greedy.tokens, ...(greedy.ended ? [-1] : [])];
    const b = [...beam.tokens, ...(beam.ended ? [-1] : [])];
    let part = 0;
    while (part < a.length && part < b.length && a[part] === b[part]) {
      part += 1;
    }
    const note = $("part");
    if (part === a.length && part === b.length) {
      note.textContent =
        "Both give the same output; the score divides log p by the length penalty " +
        "lp = ((5 + |Y|) / 6)^α.";
    } else {
      const name = (tokens, t) =>
        t < tokens.length
          ? shownPiece(shown.pieceOf[tokens[t]])
          : shown.pieceOf[shown.entry.data.special_ids.eos];
      const jump = document.createElement("button");
      jump.type = "button";
      jump.textContent = `Show step ${part + 1}`;
      jump.addEventListener("click", () => {
        $("step").value = String(part + 1);
        drawStep();
        $("search").scrollIntoView({ block: "start" });
      });
      note.replaceChildren(
        `They part at step ${part + 1}: greedy decoding takes “${name(greedy.tokens, part)}”,` +
          ` beam search's output “${name(beam.tokens, part)}”. `,
        jump,
      );
      note.querySelector("button").hidden = !$("search");
    }
    $("compare").hidden = false;
  }

  // ---- The search, step by step

  /** The rows of every step's hypotheses, rebuilt from their parents: rows[t][k]. */
  function searchRows(record, bosId) {
    const rows = [];
    let previous = Array.from({ length: record.beamSize }, () => [bosId]);
    for (const step of record.steps) {
      previous = step.parents.map((p, k) => [...previous[p], step.tokens[k]]);
      rows.push(previous);
    }
    return rows;
  }

  /** The beam index, at each step, of the output's hypothesis: path[t]. */
  function resultPath(record) {
    let at = -1;
    let beam = -1;
    record.steps.forEach((step, t) => {
      if (step.kept >= 0) {
        [at, beam] = [t, step.kept];
      }
    });
    const path = new Array(record.steps.length).fill(-1);
    for (let t = at; t >= 0 && beam >= 0; t--) {
      path[t] = beam;
      beam = record.steps[t].parents[beam];
    }
    return { path, ended: at };
  }

  async function showSearch(run) {
    if (!$("search")) {
      return;
    }
    const { record } = shown.beam;
    const ids = shown.entry.data.special_ids;
    shown.rows = searchRows(record, ids.bos);
    shown.path = resultPath(record);
    const steps = record.steps.length;
    $("step").max = String(steps);
    // where the two searches part, or the last step
    $("step").value = String(Math.min(steps, firstDifference() + 1));
    shown.selected = null;
    $("search").hidden = false;
    await nextTurn();
    check(run);
    drawStep();
  }

  function firstDifference() {
    const a = shown.greedy.tokens;
    const b = shown.beam.tokens;
    let t = 0;
    while (t < a.length && t < b.length && a[t] === b[t]) {
      t += 1;
    }
    return t < a.length || t < b.length ? t : 0;
  }

  const fixed = (x, digits = 3) => (x === null || x === -Infinity ? "−∞" : x.toFixed(digits));

  /** The words of a row after <bos>, up to its <eos> (what the tokenizer decodes). */
  function wordsOf(row) {
    const { eos, pad } = shown.entry.data.special_ids;
    const ids = row.slice(1).filter((id) => id !== pad);
    const end = ids.indexOf(eos);
    return textOf((end < 0 ? ids : ids.slice(0, end)).map((id) => shown.pieceOf[id]));
  }

  /**
   * A table cell for a row of a step: its words, then its last piece apart (highlighted
   * if the step wrote it), <eos> included.
   */
  function hypothesisCell(row, written) {
    const cell = document.createElement("td");
    const { pad } = shown.entry.data.special_ids;
    const ids = row.slice(1).filter((id) => id !== pad);
    if (!ids.length) {
      cell.textContent = shown.pieceOf[row[0]];
      return cell;
    }
    const className = `translator-piece${written ? " translator-new" : ""}`;
    const before = textOf(ids.slice(0, -1).map((id) => shown.pieceOf[id]));
    cell.append(`${before} `, pieceSpan(shown.pieceOf[ids.at(-1)], className));
    return cell;
  }

  function drawStep() {
    if (!shown?.rows) {
      return;
    }
    const { record } = shown.beam;
    const t = Number($("step").value) - 1;
    const step = record.steps[t];
    const rows = shown.rows[t];
    const { path, ended: endedAt } = shown.path;
    const ids = shown.entry.data.special_ids;
    $("step-value").textContent = `step ${t + 1} of ${record.steps.length}`;
    $("previous").disabled = t === 0;
    $("next").disabled = t === record.steps.length - 1;
    // The K hypotheses after the step.
    $("beams").replaceChildren(
      ...step.tokens.flatMap((token, k) => {
        if (step.logProbs[k] === null || step.logProbs[k] === -Infinity) {
          return [];
        }
        const tr = document.createElement("tr");
        if (path[t] === k) {
          tr.className = "translator-path";
        }
        const rank = document.createElement("td");
        rank.textContent = `${k + 1}`;
        const state = document.createElement("td");
        const length = step.lengths[k];
        const endedNow = step.ended[k] && token === ids.eos;
        state.textContent = !step.ended[k]
          ? "open"
          : token !== ids.eos && token !== ids.pad
            ? "stopped by the length limit"
            : endedNow
              ? "ended here"
              : `ended at step ${length}`;
        const cells = [fixed(step.logProbs[k]), fixed(step.scores[k])].map((v) => {
          const td = document.createElement("td");
          td.textContent = v;
          return td;
        });
        tr.append(rank, hypothesisCell(rows[k], !step.ended[k] || endedNow), ...cells, state);
        return [tr];
      }),
    );
    // The summary: candidates kept and pruned, the kept output, and why the search stops.
    const live = step.entering.filter(Boolean);
    const open = live.filter((e) => e.top.length);
    const candidates = live.reduce((n, e) => n + e.candidates.length, 0);
    const kept = live.reduce((n, e) => n + e.candidates.filter((c) => c[3] >= 0).length, 0);
    const K = record.beamSize;
    const count = (n, one, many) => `${n} ${n === 1 ? one : many}`;
    const parts = [
      K === 1
        ? `Step ${t + 1}: the one hypothesis takes its most probable piece.`
        : `Step ${t + 1}: ${count(open.length, "open hypothesis", "open hypotheses")} offered` +
          ` ${open.length === 1 ? "its" : "their"} ${K} most probable pieces` +
          (live.length > open.length
            ? `, and ${count(live.length - open.length, "ended one stays", "ended ones stay")}` +
              " a candidate as it is"
            : "") +
          `: of ${count(candidates, "candidate", "candidates")} the ${kept} best scores were` +
          ` kept, ${candidates - kept} pruned.`,
    ];
    let keptAt = -1;
    for (let s = 0; s <= t; s++) {
      if (record.steps[s].kept >= 0) {
        keptAt = s;
      }
    }
    if (keptAt >= 0) {
      const best = record.steps[keptAt];
      const k = best.kept;
      const words = wordsOf(shown.rows[keptAt][k]);
      parts.push(
        `The best ended hypothesis so far: “${words}”, score ${fixed(best.scores[k])}` +
          ` (ended at step ${best.lengths[k]}).`,
      );
    }
    if (step.stop && t === record.steps.length - 1) {
      parts.push(
        step.bestOpen === undefined || step.bestOpen === null || step.bestOpen === -Infinity
          ? "No open hypothesis is left: the search stops."
          : `The search stops: the best open hypothesis, at log p ${fixed(step.bestOpen)}, can at` +
              ` best reach ${fixed(step.bestOpen / record.lpLimit)}` +
              ` at the length limit (${record.limit} pieces), below the kept score.`,
      );
    }
    if (endedAt >= 0 && t === endedAt) {
      parts.push("The output is the hypothesis marked in bold.");
    }
    $("step-summary").textContent = parts.join(" ");
    // The hypotheses entering the step, one of them chosen.
    const entering = step.entering
      .map((e, k) => (e && e.top.length ? k : -1))
      .filter((k) => k >= 0);
    const enteringRows = t === 0 ? [[ids.bos]] : shown.rows[t - 1];
    const onPath = t === 0 ? 0 : path[t - 1];
    if (!entering.includes(shown.selected?.k) || shown.selected?.t !== t) {
      shown.selected = { t, k: entering.includes(onPath) ? onPath : entering[0] };
    }
    $("entering").replaceChildren(
      ...entering.map((k) => {
        const button = document.createElement("button");
        button.type = "button";
        button.setAttribute("role", "tab");
        button.setAttribute("aria-selected", String(k === shown.selected.k));
        const words = wordsOf(enteringRows[k]);
        button.textContent = `#${k + 1} ${words || shown.pieceOf[ids.bos]}`;
        button.addEventListener("click", () => {
          shown.selected = { t, k };
          drawStep();
        });
        return button;
      }),
    );
    drawNextTokens(step, enteringRows, t);
  }

  /** The chosen entering hypothesis: its next pieces, their fate, and where it looked. */
  function drawNextTokens(step, enteringRows, t) {
    const { k } = shown.selected;
    const entry = step.entering[k];
    const ids = shown.entry.data.special_ids;
    const fate = new Map(
      entry.candidates.map(([token, , score, rank]) => [token, { score, rank }]),
    );
    const list = $("next-tokens");
    const row = enteringRows[k];
    list.replaceChildren(
      ...entry.top.map(([token, logProb]) => {
        const item = document.createElement("li");
        const probability = Math.exp(logProb);
        const button = document.createElement("button");
        button.type = "button";
        button.className = "translator-token";
        button.append(pieceSpan(shown.pieceOf[token]));
        if (token === ids.eos) {
          button.disabled = true;
          button.title = "The search adds <eos> itself: it cannot be forced.";
        } else {
          button.title = "Force this piece here and decode the rest again";
          button.addEventListener("click", () => force([...row.slice(1), token]));
        }
        const bar = document.createElement("span");
        bar.className = "translator-bar";
        const filled = document.createElement("span");
        filled.style.width = `${Math.max(1, Math.round(probability * 100))}%`;
        bar.append(filled);
        const about = document.createElement("span");
        const found = fate.get(token);
        const forced = entry.forced !== null && entry.forced !== undefined;
        about.textContent =
          `p = ${probability.toFixed(3)}` +
          (forced && token === entry.forced ? ", forced by the prefix" : "") +
          (found
            ? found.rank >= 0
              ? `, score ${fixed(found.score)}: kept as #${found.rank + 1}`
              : `, score ${fixed(found.score)}: pruned`
            : forced
              ? ""
              : ", not among its candidates");
        item.append(button, bar, about);
        return item;
      }),
    );
    // Where it looked: its encoder-decoder attention at this step, the top layer's heads
    // averaged, over the source pieces.
    const S = shown.source.length;
    const weights = step.attention.subarray(k * S, (k + 1) * S);
    const top = Math.max(...weights);
    $("looked-note").textContent =
      `Where “${wordsOf(row) || shown.pieceOf[ids.bos]}”` +
      ` looked before step ${t + 1} (encoder–decoder attention, top layer, heads averaged):`;
    $("looked").replaceChildren(
      ...shown.sourcePieces.map((piece, s) => {
        const span = pieceSpan(piece);
        shadePiece(span, weights[s] / (top || 1));
        span.title = `${weights[s].toFixed(3)}`;
        return span;
      }),
    );
  }

  function force(pieces) {
    prefix = pieces.map((id) => shown.pieceOf[id]);
    translateNow();
  }

  // ---- Attention: the pieces, a heatmap and the grid of heads

  // The colours of a weight from 0 (white) to the top of the scale (dark blue).
  const STOPS = [
    "#ffffff",
    "#deebf7",
    "#c6dbef",
    "#9ecae1",
    "#6baed6",
    "#4292c6",
    "#2171b5",
    "#08519c",
    "#08306b",
  ];
  const PALETTE = (() => {
    const rgb = STOPS.map((hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16)));
    const table = new Uint8ClampedArray(256 * 3);
    for (let i = 0; i < 256; i++) {
      const x = (i / 255) * (rgb.length - 1);
      const lo = Math.min(Math.floor(x), rgb.length - 2);
      const f = x - lo;
      for (let c = 0; c < 3; c++) {
        table[i * 3 + c] = rgb[lo][c] * (1 - f) + rgb[lo + 1][c] * f;
      }
    }
    return table;
  })();
  const GRADIENT = `linear-gradient(to right, ${STOPS.join(", ")})`;

  /** The palette's colour of x in [0, 1], as CSS. */
  function shade(x) {
    const i = Math.max(0, Math.min(255, Math.round(x * 255))) * 3;
    return `rgb(${PALETTE[i]}, ${PALETTE[i + 1]}, ${PALETTE[i + 2]})`;
  }

  /** Shade a piece's background by x in [0, 1] (null: clear), its text kept legible. */
  function shadePiece(span, x) {
    span.style.backgroundColor = x === null ? "" : shade(x);
    span.classList.toggle("translator-dark", x !== null && x > 0.55);
  }

  /** One pixel per cell, coloured: a canvas to draw from, scaled. */
  function cellImage(values, rows, cols, top) {
    const canvas = document.createElement("canvas");
    canvas.width = Math.max(1, cols);
    canvas.height = Math.max(1, rows);
    const context = canvas.getContext("2d");
    const image = context.createImageData(canvas.width, canvas.height);
    for (let i = 0; i < rows * cols; i++) {
      const c = Math.max(0, Math.min(255, Math.round((values[i] / top) * 255))) * 3;
      image.data.set([PALETTE[c], PALETTE[c + 1], PALETTE[c + 2], 255], i * 4);
    }
    context.putImageData(image, 0, 0);
    return canvas;
  }

  const TITLES = {
    cross: ["output piece (the step that wrote it)", "source piece"],
    encoder: ["source piece (query)", "source piece (key)"],
    decoderSelf: ["output piece (the step that wrote it)", "decoder input (key)"],
  };
  const WHAT_TO_SEE = {
    cross:
      "What to look for: in the upper layers some heads' bright cells run along a line, the " +
      "alignment of the two sentences, piece by piece; others put nearly all their weight on " +
      "one column, often the source's <eos> or full stop, where a head with nothing to add " +
      "at that step parks it.",
    encoder:
      "What to look for: heads that look at the piece just before or just after (a bright " +
      "line beside the diagonal), heads that join the pieces of one word, and heads that " +
      "spread their weight over the whole sentence.",
    decoderSelf:
      "What to look for: every cell above the diagonal is white, the causal mask: each step " +
      "sees only the pieces before it. Many heads look at the previous piece, or at <bos>.",
  };

  /**
   * The weights of one view: the chosen attention of layer `layer`, head `head` (-1: the
   * heads' mean), with its row and column labels. rows x cols, row-major.
   */
  function matrix(kind, layer, head) {
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
    let values;
    if (head >= 0) {
      values = weights.subarray(head * size, (head + 1) * size);
    } else {
      values = new Float32Array(size);
      for (let h = 0; h < H; h++) {
        for (let i = 0; i < size; i++) {
          values[i] += weights[h * size + i] / H;
        }
      }
    }
    return { rows, cols, values, titles: TITLES[kind] };
  }

  /**
   * A heatmap on a canvas the size of its view, over a scrolling area the size of the
   * whole matrix: only the cells in view are drawn, their labels stay at the edges, and
   * any number of pieces stays readable. Pointing at a cell (or tapping it: tap again to
   * clear) shows its value and fades the other rows.
   */
  class Heatmap {
    constructor(element, readout) {
      this.element = element;
      this.readout = readout;
      this.scroller = element.querySelector(".translator-map-scroll");
      this.size = element.querySelector(".translator-map-size");
      this.canvas = element.querySelector("canvas");
      this.view = null;
      this.hover = null;
      this.pinned = null;
      this.frame = 0;
      this.scroller.addEventListener("scroll", () => this.schedule());
      new ResizeObserver(() => this.schedule()).observe(this.scroller);
      this.scroller.addEventListener("pointermove", (event) => {
        if (event.pointerType === "mouse") {
          this.point(this.cellAt(event));
        }
      });
      this.scroller.addEventListener("pointerleave", () => this.point(null));
      this.scroller.addEventListener("click", (event) => {
        const cell = this.cellAt(event);
        const same = cell && this.pinned && cell.i === this.pinned.i && cell.j === this.pinned.j;
        this.pinned = same || !cell ? null : cell;
        this.tell();
        this.schedule();
      });
    }

    point(cell) {
      this.hover = cell;
      this.tell();
      this.schedule();
    }

    /** view: {rows, cols (labels), values, titles, cell (px), top (the scale's top)}. */
    show(view) {
      const context = this.canvas.getContext("2d");
      const labels = view.cell >= 9;
      const font = Math.min(12, view.cell - 1);
      context.font = `${font}px monospace`;
      const width = (pieces) =>
        Math.ceil(Math.max(0, ...pieces.map((p) => context.measureText(shownPiece(p)).width)));
      this.view = {
        ...view,
        font,
        labels,
        left: labels ? Math.min(140, width(view.rows) + 8) : 0,
        top: labels ? Math.min(120, width(view.cols) + 8) : 0,
        image: cellImage(view.values, view.rows.length, view.cols.length, view.top),
      };
      this.hover = this.pinned = null;
      const { left, top, cell } = this.view;
      this.size.style.width = `${left + cell * view.cols.length}px`;
      this.size.style.height = `${top + cell * view.rows.length}px`;
      this.tell();
      this.draw();
    }

    /** The cell under a pointer event: {i, j}, or null. */
    cellAt(event) {
      if (!this.view) {
        return null;
      }
      const { left, top, cell, rows, cols } = this.view;
      const box = this.scroller.getBoundingClientRect();
      const x = event.clientX - box.left;
      const y = event.clientY - box.top;
      if (x < left || y < top) {
        return null;
      }
      const j = Math.floor((x + this.scroller.scrollLeft - left) / cell);
      const i = Math.floor((y + this.scroller.scrollTop - top) / cell);
      return i >= 0 && j >= 0 && i < rows.length && j < cols.length ? { i, j } : null;
    }

    tell() {
      const focus = this.pinned ?? this.hover;
      if (!focus || !this.view) {
        this.readout.textContent = this.view
          ? "Point at a cell, or tap it, for its weight (tap again to clear)."
          : "";
        return;
      }
      const { rows, cols, values, titles } = this.view;
      const { i, j } = focus;
      this.readout.textContent =
        `${titles[0]} ${i + 1}, “${shownPiece(rows[i])}”; ${titles[1]} ${j + 1},` +
        ` “${shownPiece(cols[j])}”: weight ${values[i * cols.length + j].toFixed(3)}`;
    }

    schedule() {
      this.frame ||= requestAnimationFrame(() => {
        this.frame = 0;
        this.draw();
      });
    }

    draw() {
      if (!this.view) {
        return;
      }
      const { rows, cols, cell, left, top, image, labels, font } = this.view;
      const ratio = window.devicePixelRatio || 1;
      const width = this.scroller.clientWidth;
      const height = this.scroller.clientHeight;
      if (
        this.canvas.width !== Math.round(width * ratio) ||
        this.canvas.height !== Math.round(height * ratio)
      ) {
        this.canvas.width = Math.round(width * ratio);
        this.canvas.height = Math.round(height * ratio);
        this.canvas.style.width = `${width}px`;
        this.canvas.style.height = `${height}px`;
      }
      const context = this.canvas.getContext("2d");
      context.setTransform(ratio, 0, 0, ratio, 0, 0);
      context.clearRect(0, 0, width, height);
      const sx = this.scroller.scrollLeft;
      const sy = this.scroller.scrollTop;
      // the cells in view
      const j0 = Math.max(0, Math.floor(sx / cell));
      const j1 = Math.min(cols.length, Math.ceil((sx + width - left) / cell));
      const i0 = Math.max(0, Math.floor(sy / cell));
      const i1 = Math.min(rows.length, Math.ceil((sy + height - top) / cell));
      context.save();
      context.beginPath();
      context.rect(left, top, width - left, height - top);
      context.clip();
      context.imageSmoothingEnabled = false;
      const x0 = left + j0 * cell - sx;
      const y0 = top + i0 * cell - sy;
      if (j1 > j0 && i1 > i0) {
        context.drawImage(
          image,
          j0,
          i0,
          j1 - j0,
          i1 - i0,
          x0,
          y0,
          (j1 - j0) * cell,
          (i1 - i0) * cell,
        );
      }
      if (cell >= 8) {
        context.strokeStyle = "rgba(255, 255, 255, 0.9)";
        context.lineWidth = 1;
        context.beginPath();
        for (let j = j0; j <= j1; j++) {
          context.moveTo(left + j * cell - sx + 0.5, y0);
          context.lineTo(left + j * cell - sx + 0.5, y0 + (i1 - i0) * cell);
        }
        for (let i = i0; i <= i1; i++) {
          context.moveTo(x0, top + i * cell - sy + 0.5);
          context.lineTo(x0 + (j1 - j0) * cell, top + i * cell - sy + 0.5);
        }
        context.stroke();
      }
      const focus = this.pinned ?? this.hover;
      if (focus) {
        // the other rows fade: where the focused row's query looked stands out
        const y = top + focus.i * cell - sy;
        context.fillStyle = "rgba(255, 255, 255, 0.65)";
        context.fillRect(left, top, width, y - top);
        context.fillRect(left, y + cell, width, height);
        context.strokeStyle = "#d62728";
        context.lineWidth = 2;
        context.strokeRect(left + focus.j * cell - sx, y, cell, cell);
      }
      context.restore();
      if (!labels) {
        return;
      }
      context.font = `${font}px monospace`;
      context.fillStyle = "#ffffff";
      context.fillRect(0, 0, width, top);
      context.fillRect(0, 0, left, height);
      context.fillStyle = "#222222";
      context.textBaseline = "middle";
      context.textAlign = "right";
      context.save();
      context.beginPath();
      context.rect(0, top, left, height - top);
      context.clip();
      for (let i = i0; i < i1; i++) {
        context.fillStyle = focus?.i === i ? "#d62728" : "#222222";
        context.fillText(shownPiece(rows[i]), left - 4, top + i * cell + cell / 2 - sy, left - 6);
      }
      context.restore();
      context.save();
      context.beginPath();
      context.rect(left, 0, width - left, top);
      context.clip();
      for (let j = j0; j < j1; j++) {
        context.save();
        context.translate(left + j * cell + cell / 2 - sx, top - 4);
        context.rotate(-Math.PI / 2);
        context.textAlign = "left";
        context.fillStyle = focus?.j === j ? "#d62728" : "#222222";
        context.fillText(shownPiece(cols[j]), 0, 0, top - 6);
        context.restore();
      }
      context.restore();
    }
  }

  let heatmap = null;
  let stretched = false;
  let drawing = 0; // bumped for each new picture: older drawing in turns stops

  async function showInside(run, attention) {
    shown.attention = attention;
    if (!$("inside")) {
      return;
    }
    $("inside").hidden = false;
    fillOptions($("layer"), attention.layers, (i) => `${i + 1}`, attention.layers - 1);
    fillOptions($("head"), attention.heads + 1, (i) => (i === 0 ? "all, averaged" : `${i}`), 0);
    drawPieces();
    heatmap ??= new Heatmap($("heatmap"), $("cell"));
    $("zoom").value = String(autoCell());
    await nextTurn();
    check(run);
    drawHeatmap();
    await nextTurn();
    check(run);
    await drawGrid(run);
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

  const chosen = () => ({
    kind: $("kind").value,
    layer: Number($("layer").value),
    head: Number($("head").value) - 1,
  });

  /** Cells as large as the book's heatmaps (28 px), as small as 12 px to fit the column. */
  function autoCell() {
    const { kind } = chosen();
    const cols = (kind === "decoderSelf" ? shown.inputPieces : shown.sourcePieces).length;
    const room = $("heatmap").clientWidth - 100;
    return Math.max(12, Math.min(28, Math.floor(room / cols)));
  }

  function drawHeatmap() {
    const { kind, layer, head } = chosen();
    const view = matrix(kind, layer, head);
    const largest = Math.max(...view.values);
    const top = stretched ? largest || 1 : 1;
    $("top").textContent = stretched ? `${largest.toFixed(3)}, the largest here` : "1";
    $("gradient").style.backgroundImage = GRADIENT;
    $("axes").textContent = `Rows: ${view.titles[0]}. Columns: ${view.titles[1]}.`;
    heatmap.show({ ...view, cell: Number($("zoom").value), top });
    $("heatmap").dataset.drawn = `${kind} ${layer} ${head}`;
    for (const button of $("grid").querySelectorAll("button")) {
      button.setAttribute("aria-pressed", String(button.dataset.view === `${layer} ${head}`));
    }
  }

  /**
   * One small heatmap per layer and head (and the heads' mean), drawn one per turn, until
   * a newer grid starts or `run` (if given) is cancelled.
   */
  async function drawGrid(run = null) {
    const generation = ++drawing;
    const { kind } = chosen();
    const { layers, heads } = shown.attention;
    $("grid-note").textContent = WHAT_TO_SEE[kind];
    const grid = $("grid");
    grid.style.setProperty("--heads", String(heads + 1));
    const cells = [];
    const labels = document.createElement("div");
    labels.className = "translator-grid-row";
    for (let layer = layers - 1; layer >= 0; layer--) {
      for (let head = -1; head < heads; head++) {
        const button = document.createElement("button");
        button.type = "button";
        button.className = "translator-thumb";
        button.dataset.view = `${layer} ${head}`;
        const name =
          head < 0 ? `layer ${layer + 1}, heads averaged` : `layer ${layer + 1}, head ${head + 1}`;
        button.title = `${name}: show it large`;
        button.setAttribute("aria-label", name);
        const caption = document.createElement("span");
        caption.textContent = head < 0 ? `L${layer + 1} mean` : `L${layer + 1} h${head + 1}`;
        const canvas = document.createElement("canvas");
        button.append(canvas, caption);
        button.addEventListener("click", () => {
          $("layer").value = String(layer);
          $("head").value = String(head + 1);
          drawHeatmap();
          $("heatmap").scrollIntoView({ block: "nearest" });
        });
        cells.push({ canvas, layer, head });
        labels.append(button);
      }
    }
    grid.replaceChildren(labels);
    const { layer: current, head: currentHead } = chosen();
    for (const button of grid.querySelectorAll("button")) {
      button.setAttribute(
        "aria-pressed",
        String(button.dataset.view === `${current} ${currentHead}`),
      );
    }
    for (const { canvas, layer, head } of cells) {
      if (generation !== drawing || run?.cancelled) {
        return; // a newer grid is being drawn, or the reader cancelled
      }
      const view = matrix(kind, layer, head);
      const top = stretched ? Math.max(...view.values) || 1 : 1;
      const image = cellImage(view.values, view.rows.length, view.cols.length, top);
      const scale = 64 / Math.max(view.rows.length, view.cols.length);
      canvas.width = Math.max(1, Math.round(view.cols.length * Math.max(1, scale)));
      canvas.height = Math.max(1, Math.round(view.rows.length * Math.max(1, scale)));
      const context = canvas.getContext("2d");
      context.imageSmoothingEnabled = scale < 1;
      context.drawImage(image, 0, 0, canvas.width, canvas.height);
      await nextTurn();
    }
  }

  function drawPieces() {
    const { sourcePieces, outputPieces } = shown;
    const source = sourcePieces.map((piece) => pieceSpan(piece));
    const output = outputPieces.map((piece, t) => {
      const span = pieceSpan(piece);
      span.dataset.row = String(t);
      return span;
    });
    $("source").replaceChildren(...source);
    $("output").replaceChildren(...output);
    // Pointing at an output piece (or tapping it) shades each source piece by the
    // encoder-decoder attention of the step that wrote it (the layer and head chosen).
    let pinned = null;
    const shadeRow = (t) => {
      for (const span of output) {
        span.classList.toggle("translator-pointed", Number(span.dataset.row) === t);
      }
      if (t === null) {
        source.forEach((s) => shadePiece(s, null));
        return;
      }
      const { layer, head } = chosen();
      const { values, cols } = matrix("cross", layer, head);
      const row = values.subarray(t * cols.length, (t + 1) * cols.length);
      const top = Math.max(...row) || 1;
      source.forEach((s, j) => {
        shadePiece(s, row[j] / top);
      });
    };
    const rowOf = (event) => {
      const span = event.target.closest?.("[data-row]");
      return span ? Number(span.dataset.row) : null;
    };
    const box = $("output");
    box.onpointerover = (event) => {
      if (event.pointerType === "mouse" && pinned === null) {
        shadeRow(rowOf(event));
      }
    };
    box.onpointerout = (event) => {
      if (event.pointerType === "mouse" && pinned === null) {
        shadeRow(null);
      }
    };
    box.onclick = (event) => {
      const t = rowOf(event);
      pinned = t === null || t === pinned ? null : t;
      shadeRow(pinned);
    };
  }

  // ---- The score of the test set, translated here by one worker per core

  let scoring = null; // the run under way: {workers, cancelled}
  const SCORE_CHUNK = 8; // sentences a worker translates per message

  function duration(seconds) {
    const s = Math.round(seconds);
    return s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
  }

  function setScoreState(state, status) {
    $("score").dataset.state = state;
    $("score-status").textContent = status;
    $("score-go").disabled = state === "running";
    $("score-cancel").disabled = state !== "running";
    $("score-progress").hidden = state !== "running";
  }

  async function scoreTestSet() {
    const pair = $("pair").value;
    const run = { workers: [], cancelled: false, table: new Map() };
    scoring = run;
    $("score-result").hidden = true;
    setScoreState("running", "Loading the model and the test set…");
    try {
      const entry = await loadPair(pair);
      if (!testSets[pair]) {
        await loadScript(new URL(`${pair}-test.js`, here).href);
      }
      const test = testSets[pair];
      const total = test.sources.length;
      const cores = Math.max(1, navigator.hardwareConcurrency || 2);
      for (let i = 0; i < cores; i++) {
        const started = startWorker(run.table);
        if (!started) {
          throw new Error("no worker could start: the score needs them");
        }
        run.workers.push(started);
      }
      await Promise.all(
        run.workers.map((w) => ask(w, run.table, { load: entry.data, weights: entry.bytes })),
      );
      if (run.cancelled) {
        return;
      }
      const texts = new Array(total);
      const queue = [];
      for (let i = 0; i < total; i += SCORE_CHUNK) {
        queue.push(i);
      }
      let done = 0;
      const started = performance.now();
      const where = `${run.workers.length} ${run.workers.length === 1 ? "worker" : "workers"}`;
      setScoreState("running", `Translating ${total.toLocaleString("en")} sentences in ${where}…`);
      const progress = $("score-progress");
      progress.max = total;
      progress.value = 0;
      await Promise.all(
        run.workers.map(async (w) => {
          while (queue.length && !run.cancelled) {
            const first = queue.shift();
            const chunk = test.sources.slice(first, first + SCORE_CHUNK);
            const result = await ask(w, run.table, { pair, translate: chunk });
            result.texts.forEach((text, i) => (texts[first + i] = text));
            done += chunk.length;
            progress.value = done;
            const elapsed = (performance.now() - started) / 1000;
            const left = ((total - done) * elapsed) / done;
            $("score-status").textContent =
              `${done.toLocaleString("en")} of ${total.toLocaleString("en")} sentences` +
              (done < total ? `, about ${duration(left)} left` : "");
          }
        }),
      );
      if (run.cancelled) {
        return;
      }
      const seconds = (performance.now() - started) / 1000;
      const scores = await ask(run.workers[0], run.table, {
        score: { hypotheses: texts, references: test.references, settings: test.settings },
      });
      performance.mark("translator: test set scored", { detail: { ms: seconds * 1000 } });
      showScores(test, texts, scores);
      setScoreState("done", `Translated and scored in ${duration(seconds)}, in ${where}.`);
    } catch (error) {
      if (!run.cancelled) {
        setScoreState("error", `Something went wrong: ${error.message.split("\n")[0]}`);
        console.warn(error);
      }
    } finally {
      run.workers.forEach((w) => w.terminate());
      if (scoring === run) {
        scoring = null;
      }
    }
  }

  function cancelScore() {
    const run = scoring;
    if (!run) {
      return;
    }
    run.cancelled = true;
    run.workers.forEach((w) => w.terminate());
    for (const call of run.table.values()) {
      call.reject(new Cancelled());
    }
    run.table.clear();
    const done = $("score-progress").value;
    setScoreState("cancelled", `Cancelled after ${done.toLocaleString("en")} sentences.`);
  }

  function showScores(test, texts, { bleu, chrf }) {
    const { settings, reported } = test;
    $("score-lines").textContent =
      `sacreBLEU ${bleu.text.split(" ")[2]}  ${settings.bleu.signature}\n` +
      `          ${bleu.text}\n` +
      `chrF      ${chrf.text.split(" = ")[1]}  ${settings.chrf.signature}`;
    const ours = { bleu: bleu.text.split(" ")[2], chrf: chrf.text.split(" = ")[1] };
    const line = $("score-reported");
    if (reported) {
      const link = document.createElement("a");
      link.href = `${reported.chapter}.html`;
      link.textContent = "the results chapter";
      const same = ours.bleu === reported.bleu && ours.chrf === reported.chrf;
      line.replaceChildren(
        `With the package in Python, beam ${reported.beam_size} and α = ${reported.alpha},`,
        ` `,
        link,
        ` reports ${reported.bleu} sacreBLEU and ${reported.chrf} chrF for this model: ` +
          (same
            ? "this page, in your browser, gives the same figures."
            : `this page gives ${ours.bleu} and ${ours.chrf}, which differ.`),
      );
    } else {
      line.textContent = "";
    }
    const worst = chrf.sentences
      .map((score, i) => [score, i])
      .sort((a, b) => a[0] - b[0] || a[1] - b[1])
      .slice(0, 10);
    $("score-worst").replaceChildren(
      ...worst.map(([score, i]) => {
        const tr = document.createElement("tr");
        const value = document.createElement("td");
        value.textContent = score.toFixed(1);
        const texts3 = document.createElement("td");
        for (const [label, text] of [
          [`${i + 1}.`, test.sources[i]],
          ["→", texts[i]],
          ["reference:", test.references[i]],
        ]) {
          const p = document.createElement("div");
          p.textContent = `${label} ${text}`;
          texts3.append(p);
        }
        tr.append(value, texts3);
        return tr;
      }),
    );
    $("score-result").hidden = false;
  }

  // ---- Starting: the controls, and the sentence of the address or the pair's example

  function example(pair) {
    return pairs[pair]?.data.example ?? "";
  }

  async function start() {
    const params = new URLSearchParams(window.location.search);
    const pairSelect = $("pair");
    const { beamSize, alpha } = defaults();
    $("beam").value = String(beamSize);
    $("alpha").value = String(alpha);
    linkProblem = readLink(params);
    const pair = params.get("pair");
    if (pair && shipped.includes(pair)) {
      pairSelect.value = pair;
    }
    showSettings();
    $("text").value = params.get("text") ?? ""; // a form field's value: text, not HTML
    $("go").addEventListener("click", translateNow);
    $("cancel").addEventListener("click", stopRunning);
    $("text").addEventListener("input", () => {
      prefix = []; // a forced start belongs to the sentence it was chosen for
    });
    $("text").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        translateNow();
      }
    });
    let previous = pairSelect.value;
    pairSelect.addEventListener("change", async () => {
      // an untouched example follows the pair; a forced start belongs to the other
      const untouched = !$("text").value || $("text").value === example(previous);
      previous = pairSelect.value;
      prefix = [];
      if (untouched) {
        await loadPair(pairSelect.value).catch(() => null);
        $("text").value = example(pairSelect.value);
      }
      translateNow();
    });
    for (const name of ["beam", "alpha"]) {
      $(name).addEventListener("input", showSettings);
      $(name).addEventListener("change", translateNow); // re-decode at once
    }
    $("unforce").addEventListener("click", () => {
      prefix = [];
      translateNow();
    });
    if ($("search")) {
      $("step").addEventListener("input", drawStep);
      $("previous").addEventListener("click", () => {
        $("step").stepDown();
        drawStep();
      });
      $("next").addEventListener("click", () => {
        $("step").stepUp();
        drawStep();
      });
    }
    if ($("inside")) {
      $("kind").addEventListener("change", () => {
        if (shown?.attention) {
          $("zoom").value = String(autoCell());
          drawHeatmap();
          drawGrid();
        }
      });
      for (const name of ["layer", "head", "zoom"]) {
        $(name).addEventListener(
          name === "zoom" ? "input" : "change",
          () => shown?.attention && drawHeatmap(),
        );
      }
      $("stretch").addEventListener("click", () => {
        stretched = !stretched;
        $("stretch").setAttribute("aria-pressed", String(stretched));
        if (shown?.attention) {
          drawHeatmap();
          drawGrid();
        }
      });
    }
    if ($("score")) {
      $("score-go").addEventListener("click", scoreTestSet);
      $("score-cancel").addEventListener("click", cancelScore);
    }
    if (linkProblem) {
      setState("error", linkProblem);
      return; // the reader chooses, then translates
    }
    if (!params.has("text")) {
      setState("loading", `Loading the ${describe(pairSelect.value)}…`);
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
