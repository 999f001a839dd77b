"use strict";
/* global $, element, pieceSpan, shownPiece */
/* exported createResultView */

// The translation: its text, the warnings and hints about the input, the forced start
// with the command line that gives the same, the link, and the table that sets greedy
// decoding beside beam search (and, with a forced start, the free translation beside the
// forced ones).

/**
 * The result view: onJump(step) shows a step of the search; onSwitch(pair) translates the
 * text with another pair.
 */
function createResultView({ onJump, onSwitch }) {
  /** The forced start's pieces (none: hidden), and the command line or why there is none. */
  function showForced(prefix, command = null) {
    $("forced").hidden = !prefix.length;
    $("prefix").replaceChildren(...prefix.map((piece) => pieceSpan(piece)));
    const line = $("command");
    line.hidden = !command;
    if (!command) {
      return;
    }
    if (command.line) {
      line.replaceChildren("The command line gives the same: ", element("code", "", command.line));
    } else {
      line.replaceChildren(
        "The command line takes a forced start as text, and cuts ",
        element("q", "", command.text),
        " into other pieces: no ",
        element("code", "", "translate --prefix"),
        " gives exactly this start.",
      );
    }
  }

  /** A table row: the search's name, its translation, log p and score (log p / lp). */
  function row(name, found, forced) {
    const cells = [name, found.text, found.logProb.toFixed(3), found.score.toFixed(3)];
    return element(
      "tr",
      forced ? "translator-forced-row" : "",
      ...cells.map((value) => element("td", "", value)),
    );
  }

  function showComparison(result, pieces, eos) {
    const { beam, greedy, options, free } = result;
    const forced = options.prefix.length > 0;
    const label = forced ? ", forced start" : "";
    const beamName =
      options.beamSize === 1 ? "beam width 1" : `beam search, ${options.beamSize} beams`;
    const search = `${beamName}, α = ${options.alpha.toFixed(1)}`;
    const rows = [
      row(`greedy decoding${label}`, { ...greedy, score: greedy.penalised }, forced),
      row(`${search}${label}`, { ...beam, text: result.text }, forced),
    ];
    if (free) {
      rows.push(row(`${search}, free`, free, false));
    }
    $("compare-rows").replaceChildren(...rows);
    const a = [...greedy.tokens, ...(greedy.ended ? [-1] : [])];
    const b = [...beam.tokens, ...(beam.ended ? [-1] : [])];
    let part = 0;
    while (part < a.length && part < b.length && a[part] === b[part]) {
      part += 1;
    }
    const note = $("part");
    const sentences = [];
    if (free) {
      const cost = free.score - beam.score;
      sentences.push(
        free.text === result.text
          ? "Without the forced start the search finds the same translation. "
          : "Without the forced start the search finds the free translation, whose score" +
              ` is ${Math.abs(cost).toFixed(3)} ${cost >= 0 ? "higher" : "lower"}. `,
      );
    }
    if (part === a.length && part === b.length) {
      sentences.push(
        "Both give the same output; the score divides log p by the length penalty " +
          "lp = ((5 + |Y|) / 6)^α.",
      );
    } else {
      const name = (tokens, t) => (t < tokens.length ? shownPiece(pieces[tokens[t]]) : pieces[eos]);
      sentences.push(
        `They part at step ${part + 1}: greedy decoding takes “${name(greedy.tokens, part)}”,` +
          ` beam search's output “${name(beam.tokens, part)}”. `,
      );
      if ($("search")) {
        const jump = element("button", "", `Show step ${part + 1}`);
        jump.type = "button";
        jump.addEventListener("click", () => onJump(part + 1));
        sentences.push(jump);
      }
    }
    note.replaceChildren(...sentences);
    $("compare").hidden = false;
  }

  /**
   * Show a translation: result (LanguagePair.inspect's), in the pair's `pieces` with
   * <eos> `eos`; warnings: lines for the reader; hint: {pair, name} of the pair the text
   * looks like, or null; forced: {prefix (pieces), command}, as showForced takes them;
   * link: the address of this translation; translation: the whole text's (by default the
   * result's own), where the text has several sentences and `result` is one of them.
   */
  function show({ result, pieces, eos, warnings, hint, forced, link, translation = null }) {
    document.getElementById("translation").textContent = translation ?? result.text;
    $("warnings").replaceChildren(
      ...warnings.map((message) => element("li", "", `warning: ${message}`)),
    );
    showHint(hint);
    showForced(forced.prefix, forced.command);
    $("link").href = link;
    $("link").parentElement.hidden = false;
    showComparison(result, pieces, eos);
  }

  /** The other pair that the text looks like, with a button that translates with it. */
  function showHint(hint) {
    $("hint").hidden = !hint;
    if (!hint) {
      return;
    }
    const button = element("button", "", `Translate it ${hint.name}`);
    button.type = "button";
    button.addEventListener("click", () => onSwitch(hint.pair));
    $("hint").replaceChildren(`This text looks like ${hint.language}. `, button);
  }

  /** No translation on display: a new one is under way, or none could be made. */
  function clear() {
    document.getElementById("translation").textContent = "";
    $("warnings").replaceChildren();
    showHint(null);
    $("compare").hidden = true;
    $("link").parentElement.hidden = true;
    $("command").hidden = true;
  }

  return { show, showForced, showHint, clear };
}
