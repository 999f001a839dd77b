"use strict";
/* global $, element, pieceSpan, textOf, shownPiece, fixed, count, shadePiece, nextTurn,
   Cancelled, onThemeChange */
/* exported createSearchView, stepSummary */

// The beam search as it ran, one step at a time: the K hypotheses after the step, what the
// step did, and for one hypothesis entering it, its most probable next pieces (each of
// which the reader may force) and where it looked in the source.

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

/**
 * What step t of a search's record did, in words: its candidates kept and pruned (or the
 * piece the forced start sets), the best ended hypothesis so far, and why the search
 * stops. words(t, k): the words of hypothesis k after step t; piece(id): a piece as the
 * page writes it.
 */
function stepSummary(record, t, words, piece) {
  const step = record.steps[t];
  const live = step.entering.filter(Boolean);
  const open = live.filter((e) => e.top.length);
  const candidates = live.reduce((n, e) => n + e.candidates.length, 0);
  const kept = live.reduce((n, e) => n + e.candidates.filter((c) => c[3] >= 0).length, 0);
  const K = record.beamSize;
  const forced = open.find((e) => e.forced !== null && e.forced !== undefined)?.forced;
  const parts = [];
  if (forced !== undefined) {
    const who = open.length === 1 ? "the one open hypothesis takes" : "every open hypothesis takes";
    parts.push(
      `Step ${t + 1} is forced: ${who} “${piece(forced)}”, the piece the forced start sets,` +
        " whatever its probability.",
    );
  } else if (K === 1) {
    parts.push(`Step ${t + 1}: the one hypothesis takes its most probable piece.`);
  } else {
    parts.push(
      `Step ${t + 1}: ${count(open.length, "open hypothesis", "open hypotheses")} offered` +
        ` ${open.length === 1 ? "its" : "their"} ${K} most probable pieces` +
        (live.length > open.length
          ? `, and ${count(live.length - open.length, "ended one stays", "ended ones stay")}` +
            " a candidate as it is"
          : "") +
        `: of ${count(candidates, "candidate", "candidates")} the ${kept} best` +
        ` ${kept === 1 ? "score was" : "scores were"} kept,` +
        ` ${candidates > kept ? candidates - kept : "none"} pruned.`,
    );
  }
  let keptAt = -1;
  for (let s = 0; s <= t; s++) {
    if (record.steps[s].kept >= 0) {
      keptAt = s;
    }
  }
  if (keptAt >= 0) {
    const best = record.steps[keptAt];
    const k = best.kept;
    parts.push(
      `The best ended hypothesis so far: “${words(keptAt, k)}”, score ${fixed(best.scores[k])}` +
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
  return parts.join(" ");
}

/** The search view; onForce(pieces) asks for the output forced to start with pieces. */
function createSearchView({ onForce }) {
  let view = null; // {result, pieces, ids, rows, path, selected}: the search on display

  /** The words of a row after <bos>, up to its <eos> (what the tokenizer decodes). */
  function wordsOf(row) {
    const { eos, pad } = view.ids;
    const ids = row.slice(1).filter((id) => id !== pad);
    const end = ids.indexOf(eos);
    return textOf((end < 0 ? ids : ids.slice(0, end)).map((id) => view.pieces[id]));
  }

  /** A row of a step: its words, then its last piece apart (highlighted if new). */
  function hypothesisCell(row, written) {
    const ids = row.slice(1).filter((id) => id !== view.ids.pad);
    if (!ids.length) {
      return element("td", "", view.pieces[row[0]]);
    }
    const className = `translator-piece${written ? " translator-new" : ""}`;
    const before = textOf(ids.slice(0, -1).map((id) => view.pieces[id]));
    return element("td", "", `${before} `, pieceSpan(view.pieces[ids.at(-1)], className));
  }

  /** The K hypotheses after step t. */
  function beamRows(step, t) {
    const { eos, pad } = view.ids;
    return step.tokens.flatMap((token, k) => {
      if (step.logProbs[k] === null || step.logProbs[k] === -Infinity) {
        return [];
      }
      const endedNow = step.ended[k] && token === eos;
      const state = !step.ended[k]
        ? "open"
        : token !== eos && token !== pad
          ? "stopped by the length limit"
          : endedNow
            ? "ended here"
            : `ended at step ${step.lengths[k]}`;
      const tr = element(
        "tr",
        view.path.path[t] === k ? "translator-path" : "",
        element("td", "", `${k + 1}`),
        hypothesisCell(view.rows[t][k], !step.ended[k] || endedNow),
        element("td", "", fixed(step.logProbs[k])),
        element("td", "", fixed(step.scores[k])),
        element("td", "", state),
      );
      return [tr];
    });
  }

  function draw() {
    if (!view) {
      return;
    }
    const { record } = view.result.beam;
    const t = Number($("step").value) - 1;
    const step = record.steps[t];
    $("step-value").textContent = `step ${t + 1} of ${record.steps.length}`;
    $("previous").disabled = t === 0;
    $("next").disabled = t === record.steps.length - 1;
    $("beams").replaceChildren(...beamRows(step, t));
    const words = (s, k) => wordsOf(view.rows[s][k]);
    let summary = stepSummary(record, t, words, (id) => shownPiece(view.pieces[id]));
    if (view.path.ended >= 0 && t === view.path.ended) {
      summary += " The output is the hypothesis marked in bold.";
    }
    $("step-summary").textContent = summary;
    // The hypotheses entering the step, one of them chosen.
    const entering = step.entering
      .map((e, k) => (e && e.top.length ? k : -1))
      .filter((k) => k >= 0);
    const enteringRows = t === 0 ? [[view.ids.bos]] : view.rows[t - 1];
    const onPath = t === 0 ? 0 : view.path.path[t - 1];
    if (!entering.includes(view.selected?.k) || view.selected?.t !== t) {
      view.selected = { t, k: entering.includes(onPath) ? onPath : entering[0] };
    }
    $("entering").replaceChildren(
      ...entering.map((k) => {
        const button = element(
          "button",
          "",
          `#${k + 1} ${wordsOf(enteringRows[k]) || view.pieces[view.ids.bos]}`,
        );
        button.type = "button";
        button.setAttribute("role", "tab");
        button.setAttribute("aria-selected", String(k === view.selected.k));
        button.addEventListener("click", () => {
          view.selected = { t, k };
          draw();
        });
        return button;
      }),
    );
    drawNextPieces(step, enteringRows, t);
  }

  /** The chosen entering hypothesis: its next pieces, their fate, and where it looked. */
  function drawNextPieces(step, enteringRows, t) {
    const { k } = view.selected;
    const entry = step.entering[k];
    const ids = view.ids;
    const fate = new Map(
      entry.candidates.map(([token, , score, rank]) => [token, { score, rank }]),
    );
    const row = enteringRows[k];
    const forced = entry.forced !== null && entry.forced !== undefined;
    $("next-tokens").replaceChildren(
      ...entry.top.map(([token, logProb]) => {
        const probability = Math.exp(logProb);
        const button = element("button", "translator-token", pieceSpan(view.pieces[token]));
        button.type = "button";
        if (token === ids.eos) {
          button.disabled = true;
          button.title = "The search adds <eos> itself: it cannot be forced.";
        } else {
          button.title = "Force this piece here and decode the rest again";
          button.addEventListener("click", () =>
            onForce([...row.slice(1), token].map((id) => view.pieces[id])),
          );
        }
        const bar = element("span", "translator-bar", element("span"));
        bar.firstChild.style.width = `${Math.max(1, Math.round(probability * 100))}%`;
        const found = fate.get(token);
        const about =
          `p = ${probability.toFixed(3)}` +
          (forced && token === entry.forced ? ", forced by the prefix" : "") +
          (found
            ? found.rank >= 0
              ? `, score ${fixed(found.score)}: kept as #${found.rank + 1}`
              : `, score ${fixed(found.score)}: pruned`
            : forced
              ? ""
              : ", not among its candidates");
        return element("li", "", button, bar, element("span", "", about));
      }),
    );
    // Where it looked: its encoder-decoder attention at this step, the top layer's heads
    // averaged, over the source pieces.
    const S = view.result.source.length;
    const weights = step.attention.subarray(k * S, (k + 1) * S);
    const top = Math.max(...weights);
    $("looked-note").textContent =
      `Where “${wordsOf(row) || view.pieces[ids.bos]}”` +
      ` looked before step ${t + 1} (encoder–decoder attention, top layer, heads averaged):`;
    $("looked").replaceChildren(
      ...view.result.sourcePieces.map((piece, s) => {
        const span = pieceSpan(piece);
        shadePiece(span, weights[s] / (top || 1));
        span.title = `${weights[s].toFixed(3)}`;
        return span;
      }),
    );
  }

  /** The first step where greedy decoding and beam search part (0 if they do not). */
  function firstDifference() {
    const a = view.result.greedy.tokens;
    const b = view.result.beam.tokens;
    let t = 0;
    while (t < a.length && t < b.length && a[t] === b[t]) {
      t += 1;
    }
    return t < a.length || t < b.length ? t : 0;
  }

  /**
   * Show the search of `result` (LanguagePair.inspect's) in the pair's `pieces` with its
   * special `ids`: at the first step after a forced start, else where greedy decoding and
   * beam search part, else the last.
   */
  async function show(run, result, { pieces, ids }) {
    if (!$("search")) {
      return;
    }
    const { record } = result.beam;
    view = {
      result,
      pieces,
      ids,
      rows: searchRows(record, ids.bos),
      path: resultPath(record),
      selected: null,
    };
    const steps = record.steps.length;
    const forced = result.options.prefix.length;
    $("step").max = String(steps);
    $("step").value = String(Math.min(steps, forced ? forced + 1 : firstDifference() + 1));
    $("search").hidden = false;
    await nextTurn();
    if (run.cancelled) {
      throw new Cancelled();
    }
    draw();
  }

  function clear() {
    view = null;
    if ($("search")) {
      $("search").hidden = true;
    }
  }

  /** Show step `step` (from 1). */
  function goTo(step) {
    $("step").value = String(step);
    draw();
  }

  if ($("search")) {
    $("step").addEventListener("input", draw);
    $("previous").addEventListener("click", () => {
      $("step").stepDown();
      draw();
    });
    $("next").addEventListener("click", () => {
      $("step").stepUp();
      draw();
    });
    onThemeChange(draw);
  }
  return { show, clear, goTo, present: () => Boolean($("search")) };
}
