"use strict";
/* global $, Problem, Cancelled, createLoader, readLink, linkTo, commandLine, languageHint,
   unreadablePieces, splitSentences, createResultView, createSearchView, createAttentionView,
   createScoreView, createKnockOutView, element */
/* exported startPage */

// The page "Translate and look inside": the widget's controls, and the parts together.
// Everything the reader types, and everything a link carries, reaches the page as text
// (textContent, a form field's value), never as HTML; nothing is asked of the network.
// The page's own work is cut into short tasks, so that it answers the reader at once
// whatever the input: the models load and run in workers, and a heatmap is drawn on a
// canvas, only the part in view. What the page is showing belongs to this part alone:
// the others are handed what they draw, and tell it what the reader asks for.

/**
 * Start the widget: `script` is page.js's element, which names the shipped pairs and
 * their files (_ext/translator.py). The pair that the link names (or the first) starts
 * loading at once, while the rest of the page loads.
 */
function startPage(script) {
  const shipped = script.dataset.pairs.split(" ");
  const loader = createLoader(script.src, JSON.parse(script.dataset.files));
  const asked = new URLSearchParams(window.location.search).get("pair");
  loader.load(shipped.includes(asked) ? asked : shipped[0]).catch(() => null); // shown later
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", () => startWidget(loader, shipped));
  } else {
    startWidget(loader, shipped);
  }
}

function startWidget(loader, shipped) {
  const root = document.getElementById("translator");
  let prefix = []; // the pieces the output is forced to start with: written here only
  let running = null; // the translation under way: {cancelled}
  let shown = 0; // the sentence whose search and attention are shown; it takes the prefix
  let translated = null; // the text's sentences and what inspect found of each
  const examples = new Map(); // pair -> the sentence it starts with, once loaded

  const defaults = () => ({
    beamSize: Number(root.dataset.beamSize),
    alpha: Number(root.dataset.alpha),
  });
  const settings = () => ({ beamSize: Number($("beam").value), alpha: Number($("alpha").value) });
  const option = (pair) => $("pair").querySelector(`option[value="${pair}"]`);
  /** "German → English" */
  const nameOf = (pair) => option(pair)?.textContent ?? pair;
  /** "German → English model (16.3 MB)" */
  const describe = (pair) => `${nameOf(pair)} model (${(loader.bytes(pair) / 1e6).toFixed(1)} MB)`;
  /** "German → English (de-en) or French → English (fr-en)" */
  const choices = () => {
    const names = [...$("pair").options].map((o) => `${o.textContent} (${o.value})`);
    return names.length > 1 ? `${names.slice(0, -1).join(", ")} or ${names.at(-1)}` : names[0];
  };
  const languages = () =>
    [...$("pair").options].map((o) => ({
      pair: o.value,
      language: o.dataset.language,
      words: new Set(o.dataset.words.split(" ")),
    }));

  function setState(state, status = "", progress = null) {
    $("progress").hidden = !["loading", "translating"].includes(state);
    if (progress) {
      $("progress").max = progress.total;
      $("progress").value = progress.loaded;
    } else {
      $("progress").removeAttribute("value"); // running, for as long as it takes
    }
    $("status").textContent = status;
    root.dataset.state = state;
  }

  function showSettings() {
    const { beamSize, alpha } = settings();
    $("beam-value").textContent = beamSize === 1 ? "1 (greedy)" : String(beamSize);
    $("alpha-value").textContent = alpha.toFixed(1);
  }

  /** The output forced to start with `pieces` (none: decoded freely), translated again. */
  function setPrefix(pieces) {
    prefix = pieces;
    translateNow();
  }

  const result = createResultView({
    onJump: (step) => {
      search.goTo(step);
      $("search").scrollIntoView({ block: "start" });
    },
    onSwitch: (pair) => {
      $("pair").value = pair;
      prefix = [];
      translateNow();
    },
  });
  const search = createSearchView({ onForce: setPrefix });
  const knock = createKnockOutView({
    onChange: () => translateNow(),
    loader,
    pair: () => $("pair").value,
    name: nameOf,
  });
  const attention = createAttentionView({
    decorate: knock.decorate,
    clickHead: knock.clickHead,
  });
  createScoreView({
    loader,
    pair: () => $("pair").value,
    name: nameOf,
    onOpen: (pair, sentence) => {
      $("pair").value = pair;
      const { beamSize, alpha } = defaults(); // the score's search
      $("beam").value = String(beamSize);
      $("alpha").value = String(alpha);
      showSettings();
      $("text").value = sentence;
      prefix = [];
      root.scrollIntoView({ block: "start" });
      translateNow();
    },
  });

  /** Nothing shown but the status: no translation, or a stale one. */
  function clearShown() {
    $("sentences").hidden = true;
    result.clear();
    knock.showIntact([]);
    search.clear();
    attention.clear();
  }

  /** The prefix's ids in the pair's vocabulary, or the one-line problem with it. */
  function prefixIds(summary) {
    const ids = new Map(summary.pieces.map((piece, id) => [piece, id]));
    const unknown = prefix.filter((piece) => !ids.has(piece));
    if (unknown.length) {
      throw new Problem(
        `The forced start holds “${unknown[0]}”, which is not a piece of the model's` +
          " vocabulary: choose “Decode freely”.",
      );
    }
    const found = prefix.map((piece) => ids.get(piece));
    const { bos, eos, pad } = summary.specialIds;
    if (found.some((id) => [bos, eos, pad].includes(id))) {
      throw new Problem(
        "The forced start holds a special piece, which the search adds itself: choose" +
          " “Decode freely”.",
      );
    }
    return found;
  }

  /** Stop the translation under way: its calls in the worker, and its drawing. */
  function stopRunning() {
    if (running) {
      running.cancelled = true;
      loader.stop(running);
    }
  }

  /**
   * Translate the box's text with the page's settings (`example`: the pair's example
   * sentence, once its model is loaded); a new one stops the one running.
   */
  async function translateNow({ example = false, again = false } = {}) {
    stopRunning();
    const run = { cancelled: false, example, again };
    running = run;
    $("go").disabled = true;
    $("cancel").disabled = false;
    try {
      await translateRun(run);
    } catch (error) {
      if (running !== run) {
        return; // another one has started
      }
      // what is on display is not this text's translation
      clearShown();
      if (error instanceof Cancelled || run.cancelled) {
        setState("cancelled", "Cancelled: nothing was translated.");
      } else if (error instanceof Problem) {
        result.showForced(prefix);
        setState("error", error.message);
      } else {
        setState("error", `Something went wrong: ${error.message.split("\n")[0]}`);
        console.warn(error);
      }
    } finally {
      if (running === run) {
        running = null;
        $("go").disabled = false;
        $("cancel").disabled = true;
      }
    }
  }

  function check(run) {
    if (run.cancelled) {
      throw new Cancelled();
    }
  }

  /** The pair's model, loaded, with its progress in the status line. */
  async function loaded(run, pair) {
    const status = `Loading the ${describe(pair)}…`;
    setState("loading", status);
    const summary = await loader.load(pair, ({ loaded: bytes, total }) => {
      if (!run.cancelled && root.dataset.state === "loading") {
        const of = `${(bytes / 1e6).toFixed(1)} of ${(total / 1e6).toFixed(1)} MB`;
        setState("loading", `Loading the ${nameOf(pair)} model: ${of}…`, {
          loaded: bytes,
          total,
        });
      }
    });
    check(run);
    return summary;
  }

  async function translateRun(run) {
    const pair = $("pair").value;
    $("text").lang = pair.split("-")[0]; // the source language, for spelling and speech
    if (!run.example && !$("text").value.trim()) {
      clearShown();
      setState("error", "Type a sentence to translate: the box is empty.");
      return;
    }
    const summary = await loaded(run, pair);
    examples.set(pair, summary.example);
    if (run.example) {
      $("text").value = summary.example;
    }
    if (run.again && translated) {
      await showSentence(run, translated, 0); // another sentence of the same translation
      return;
    }
    const text = $("text").value;
    const sentences = splitSentences(text); // the package's translate --by-sentence
    shown = Math.min(shown, Math.max(sentences.length - 1, 0));
    const { beamSize, alpha } = settings();
    const forced = prefixIds(summary);
    knock.setModel(summary); // the parts switched off, checked against the model
    const knockOut = knock.text();
    const off = knockOut ? `, with ${knockOut} switched off` : "";
    const way = (beamSize === 1 ? "greedy decoding" : `beam search, ${beamSize} beams`) + off;
    setState("translating", `Translating (${way})…`);
    const started = performance.now();
    const found = [];
    for (const [i, sentence] of sentences.entries()) {
      const of = sentences.length > 1 ? ` sentence ${i + 1} of ${sentences.length},` : "";
      const onStep = (t) => {
        $("status").textContent = `Translating (${way}):${of} step ${t + 1}`;
      };
      const options = { beamSize, alpha, prefix: i === shown ? forced : [], knockOut };
      const message = { pair, inspect: sentence, options };
      found.push(await loader.compute(run, message, onStep, (c) => c.inspect(sentence, options)));
      check(run);
    }
    const ms = performance.now() - started;
    // for experiments/translator_bench.py: when, and how long the translation took
    performance.mark("translator: translated", { detail: { ms } });
    if (!found.length || found.some((one) => one.empty)) {
      clearShown();
      setState("error", "Type a sentence to translate: the box is empty.");
      return;
    }
    const where = loader.onPage() ? " on the page itself: no worker could start" : "";
    const count = sentences.length > 1 ? `${sentences.length} sentences ` : "";
    const without = knockOut ? `, with ${knockOut} switched off` : "";
    const status = `Translated ${count}in ${(ms / 1000).toFixed(2)} s${where}${without}.`;
    translated = { pair, text, sentences, found, summary, status, beamSize, alpha, knockOut };
    await showSentence(run, translated, ms);
  }

  /** What was found of the text, its sentence `shown` in the views (ms: to translate it). */
  async function showSentence(run, { pair, text, sentences, found, summary, ...rest }, ms) {
    const { status, beamSize, alpha, knockOut } = rest;
    const one = found[shown];
    const several = sentences.length > 1;
    $("sentences").hidden = !several;
    $("sentence").replaceChildren(
      ...sentences.map((sentence, i) => {
        const choice = element("option", "", `${i + 1} of ${sentences.length}: ${sentence}`);
        choice.value = String(i);
        return choice;
      }),
    );
    $("sentence").value = String(shown);
    // inspect names its one sentence "sentence 1"; here it is sentence i + 1 of the text
    const warnings = found.flatMap((f, i) =>
      f.warnings.map((w) => (several ? w.replace("sentence 1", `sentence ${i + 1}`) : w)),
    );
    const sources = { source: found.flatMap((f) => f.source) };
    const { pieces, specialIds: ids } = summary;
    result.show({
      result: one,
      translation: found.map((f) => f.text).join(" "),
      pieces,
      eos: ids.eos,
      warnings: [...warnings, ...unreadable(sources, summary)],
      hint: hintFor(text, pair),
      forced: { prefix, command: forcedCommand(one, pair, sentences[shown]) },
      link: linkTo(
        window.location.href,
        { pair, text, beamSize, alpha, prefix, knockOut, sentence: shown },
        defaults(),
      ),
    });
    knock.showIntact(found);
    const viewStarted = performance.now();
    search.clear();
    attention.clear();
    await search.show(run, one, { pieces, ids });
    performance.mark("translator: search shown", {
      detail: { ms: ms + performance.now() - viewStarted },
    });
    $("status").textContent = `${status} Reading its attention…`;
    const { source, target } = one;
    const message = { pair, attention: { source, target, knockOut } };
    const weights = await loader.compute(run, message, null, (c) =>
      c.attention(source, target, knockOut),
    );
    check(run);
    await attention.show(run, one, weights, summary.layers);
    setState("done", status);
    performance.mark("translator: drawn");
  }

  /** The warning for text the model cannot read, as Cyrillic or a lone emoji. */
  function unreadable(found, { pieces, specialIds }) {
    const { count, of } = unreadablePieces(found.source, specialIds, pieces);
    if (count <= of / 2) {
      return [];
    }
    const known = languages().map((l) => l.language);
    return [
      `${count} of ${of} pieces of this text are ${pieces[specialIds.unk]}, characters the` +
        ` model never saw, or a bare word marker ␣: this page's models read` +
        ` ${known.join(" or ")} only.`,
    ];
  }

  /** The pair whose language the text looks like, if not this one: {pair, language, name}. */
  function hintFor(text, pair) {
    const found = languageHint(text, pair, languages());
    return found && { ...found, name: nameOf(found.pair) };
  }

  /** The command line of a forced translation (LanguagePair.prefixText), or null. */
  function forcedCommand(found, pair, text) {
    if (!found.prefix) {
      return null;
    }
    const { beamSize, alpha } = found.options;
    const { text: prefixText, exact } = found.prefix;
    const { knockOut } = found;
    return exact
      ? { line: commandLine({ pair, text, beamSize, alpha, prefixText, knockOut }, defaults()) }
      : { text: prefixText };
  }

  function start() {
    const params = new URLSearchParams(window.location.search);
    const range = (input) => [Number(input.min), Number(input.max)];
    const link = readLink(params, {
      pairs: shipped,
      choices: choices(),
      limits: { beam: range($("beam")), alpha: range($("alpha")) },
    });
    const { beamSize, alpha } = defaults();
    $("beam").value = String(link.beamSize ?? beamSize);
    $("alpha").value = String(link.alpha ?? alpha);
    if (link.pair) {
      $("pair").value = link.pair;
    }
    prefix = link.prefix ?? [];
    knock.set(link.knockOut ?? "");
    shown = link.sentence ?? 0; // a sentence beyond the text's last shows its last
    showSettings();
    $("text").value = params.get("text") ?? ""; // a form field's value: text, not HTML
    $("go").addEventListener("click", () => translateNow());
    $("cancel").addEventListener("click", stopRunning);
    $("text").addEventListener("input", () => {
      prefix = []; // a forced start belongs to the sentence it was chosen for
      translated = null;
    });
    $("sentence").addEventListener("change", () => {
      shown = Number($("sentence").value);
      // a forced start belongs to the sentence it was chosen for: translate afresh
      const again = prefix.length === 0;
      prefix = [];
      translateNow({ again });
    });
    $("text").addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
        event.preventDefault();
        translateNow();
      }
    });
    $("pair").addEventListener("change", () => {
      // an untouched example follows the pair; a forced start belongs to the other
      const before = $("text").value;
      prefix = [];
      translateNow({ example: !before || [...examples.values()].includes(before) });
    });
    for (const name of ["beam", "alpha"]) {
      $(name).addEventListener("input", showSettings);
      $(name).addEventListener("change", () => translateNow()); // re-decode at once
    }
    $("unforce").addEventListener("click", () => setPrefix([]));
    if (link.problem) {
      setState("error", link.problem);
      return; // the reader chooses, then translates
    }
    translateNow({ example: link.text === null }); // no text: the pair's example
  }

  start();
}
