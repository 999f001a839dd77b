"use strict";
/* global $, element, Cancelled */
/* exported createScoreView, testSetAndTeam, translateInTeam, duration */

// The score of the test set: its sentences translated here by one worker per core, with
// the paper's search, then sacreBLEU's BLEU and chrF, set beside the results chapter's.

const SCORE_CHUNK = 8; // sentences a worker translates per message

function duration(seconds) {
  const s = Math.round(seconds);
  return s >= 60 ? `${Math.floor(s / 60)} min ${s % 60} s` : `${s} s`;
}

/** The pair's test split and a team of workers, one per core (loader is createLoader's). */
function testSetAndTeam(loader, pair) {
  return Promise.all([
    loader.testSet(pair),
    loader.team(pair, Math.max(1, navigator.hardwareConcurrency || 2)),
  ]);
}

/**
 * Translate `sources` in the workers of `run.team` (loader.team's), a few at a time, each
 * message {pair, translate: chunk, ...extra} (serve's translate): their translations.
 * progress(done, total) is told after each chunk. Stops early when run.cancelled is set.
 */
async function translateInTeam(run, pair, sources, { extra = {}, progress = null } = {}) {
  const total = sources.length;
  const texts = new Array(total);
  const queue = [];
  for (let i = 0; i < total; i += SCORE_CHUNK) {
    queue.push(i);
  }
  let done = 0;
  await Promise.all(
    Array.from({ length: run.team.size }, async (_, w) => {
      while (queue.length && !run.cancelled) {
        const first = queue.shift();
        const chunk = sources.slice(first, first + SCORE_CHUNK);
        const result = await run.team.ask(w, { pair, translate: chunk, ...extra });
        result.texts.forEach((text, i) => (texts[first + i] = text));
        done += chunk.length;
        progress?.(done, total);
      }
    }),
  );
  return texts;
}

/**
 * The score view: loader (createLoader's) gives the workers and the test split;
 * pair() is the pair chosen, name(pair) its name ("German → English"); onOpen(pair,
 * sentence) opens a sentence in the translator.
 */
function createScoreView({ loader, pair: chosenPair, name, onOpen }) {
  let scoring = null; // the run under way: {team, cancelled}

  function setState(state, status) {
    $("score").dataset.state = state;
    $("score-status").textContent = status;
    $("score-go").disabled = state === "running";
    $("score-cancel").disabled = state !== "running";
    $("score-progress").hidden = state !== "running";
  }

  async function start() {
    const pair = chosenPair();
    const run = { team: null, cancelled: false };
    scoring = run;
    $("score-result").hidden = true;
    setState("running", `Loading the ${name(pair)} model and the test set…`);
    try {
      const [test, team] = await testSetAndTeam(loader, pair);
      run.team = team;
      if (run.cancelled) {
        return;
      }
      const where = `${team.size} ${team.size === 1 ? "worker" : "workers"}`;
      const total = test.sources.length;
      setState("running", `Translating ${total.toLocaleString("en")} sentences in ${where}…`);
      const started = performance.now();
      const progress = $("score-progress");
      progress.max = total;
      progress.value = 0;
      const texts = await translateInTeam(run, pair, test.sources, {
        progress: (done) => {
          progress.value = done;
          const elapsed = (performance.now() - started) / 1000;
          const left = ((total - done) * elapsed) / done;
          $("score-status").textContent =
            `${done.toLocaleString("en")} of ${total.toLocaleString("en")} sentences` +
            (done < total ? `, about ${duration(left)} left` : "");
        },
      });
      if (run.cancelled) {
        return;
      }
      const seconds = (performance.now() - started) / 1000;
      const scores = await team.ask(0, {
        score: { hypotheses: texts, references: test.references, settings: test.settings },
      });
      performance.mark("translator: test set scored", { detail: { ms: seconds * 1000 } });
      show(pair, test, texts, scores);
      setState("done", `Translated and scored in ${duration(seconds)}, in ${where}.`);
    } catch (error) {
      if (!run.cancelled && !(error instanceof Cancelled)) {
        setState("error", `Something went wrong: ${error.message.split("\n")[0]}`);
        console.warn(error);
      }
    } finally {
      run.team?.close();
      if (scoring === run) {
        scoring = null;
      }
    }
  }

  function cancel() {
    const run = scoring;
    if (!run) {
      return;
    }
    run.cancelled = true;
    run.team?.close();
    const done = $("score-progress").value;
    setState("cancelled", `Cancelled after ${done.toLocaleString("en")} sentences.`);
  }

  /** The scores as the command line prints them, for `pair`, and the worst sentences. */
  function show(pair, test, texts, { bleu, chrf }) {
    const { settings, reported } = test;
    const total = test.sources.length.toLocaleString("en");
    $("score-pair").textContent =
      `${name(pair)} (${pair}), the ${total} sentences of ${test.split},` +
      " beam search with the package's default beam and α:";
    $("score-lines").textContent =
      `sacreBLEU ${bleu.text.split(" ")[2]}  ${settings.bleu.signature}\n` +
      `          ${bleu.text}\n` +
      `chrF      ${chrf.text.split(" = ")[1]}  ${settings.chrf.signature}`;
    const ours = { bleu: bleu.text.split(" ")[2], chrf: chrf.text.split(" = ")[1] };
    const line = $("score-reported");
    if (reported) {
      const link = element("a", "", "the results chapter");
      link.href = `${reported.chapter}.html`;
      const same = ours.bleu === reported.bleu && ours.chrf === reported.chrf;
      line.replaceChildren(
        `With the package in Python, beam ${reported.beam_size} and α = ${reported.alpha}, `,
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
        const open = element("button", "translator-open", "Open it above");
        open.type = "button";
        open.title = `Translate sentence ${i + 1} in the translator above, step by step`;
        open.addEventListener("click", () => onOpen(pair, test.sources[i]));
        const sentences = element(
          "td",
          "",
          ...[
            [`${i + 1}.`, test.sources[i]],
            ["→", texts[i]],
            ["reference:", test.references[i]],
          ].map(([label, text]) => element("div", "", `${label} ${text}`)),
          open,
        );
        return element("tr", "", element("td", "", score.toFixed(1)), sentences);
      }),
    );
    $("score-result").hidden = false;
  }

  if ($("score")) {
    $("score-go").addEventListener("click", start);
    $("score-cancel").addEventListener("click", cancel);
  }
}
