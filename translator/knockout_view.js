"use strict";
/* global $, element, Problem, Cancelled, parseKnockOut, knockOutText, partText, checkKnockOut,
   testSetAndTeam, translateInTeam, duration */
/* exported createKnockOutView */

// Parts of the model switched off by the reader: heads clicked in the grid, whole sublayers
// and the positional encodings by their buttons, the set shown in the package's spelling
// (which the link carries), the grid coloured by the stored importance of each head, the
// translation with everything on beside the one without the parts, and a sample of the
// test set scored both ways.

// The grid's kinds of attention (attention_view.js) in the package's spelling.
const GRID_KINDS = { encoder: "enc-self", decoderSelf: "dec-self", cross: "dec-cross" };
// Each sublayer kind with its name, in the package's order.
const SUBLAYER_NAMES = [
  ["enc-self", "encoder self-attention"],
  ["enc-ffn", "encoder feed-forward"],
  ["dec-self", "decoder self-attention"],
  ["dec-cross", "encoder–decoder attention"],
  ["dec-ffn", "decoder feed-forward"],
];
// The sample that "score with these parts off" translates: the first sentences of the
// test split, with greedy decoding (beam width 1), with the parts off and with none.
const SAMPLE_SIZE = 200;

/**
 * The knockout view: onChange() is told when the reader changes the set; loader, pair()
 * and name(pair) as for the score view (createScoreView).
 */
function createKnockOutView({ onChange, loader, pair: chosenPair, name }) {
  let parts = []; // the parts switched off: written here only
  let model = null; // {layers, heads, importance} of the pair last translated
  let scoring = null; // the sample's run under way: {team, cancelled}
  const intactScores = new Map(); // pair -> the sample's scores with everything on

  const text = () => knockOutText(parts);
  const isOff = (spelling) =>
    spelling === "pe"
      ? isOff("enc-pe") && isOff("dec-pe")
      : parts.some((part) => partText(part) === spelling);

  /** The set in the panel: its spelling, the pressed buttons, the marked heads. */
  function showSet() {
    if (!$("knock")) {
      return;
    }
    const spelling = text();
    $("knock-set").textContent = spelling || "nothing";
    $("knock-reset").disabled = !spelling;
    $("knock-score").disabled = !spelling || scoring !== null;
    for (const button of document.querySelectorAll(".translator [data-part]")) {
      const off = isOff(button.dataset.part);
      if (button.classList.contains("translator-thumb")) {
        button.classList.toggle("translator-off", off);
      } else {
        button.setAttribute("aria-pressed", String(off));
      }
    }
  }

  function change(next) {
    parts = parseKnockOut(knockOutText(next));
    showSet();
    onChange();
  }

  function toggle(part) {
    const spelling = partText(part);
    change(isOff(spelling) ? parts.filter((p) => partText(p) !== spelling) : [...parts, part]);
  }

  /** The set that a link carries (its spelling): an Error with a one-line message if bad. */
  function set(spelling) {
    parts = parseKnockOut(spelling);
    showSet();
  }

  /** The buttons of each layer's sublayers and of the positional encodings. */
  function drawButtons() {
    const button = (part, label, title) => {
      const made = element("button", "translator-knock-part", label);
      made.type = "button";
      made.dataset.part = partText(part);
      made.title = `${title}: switch it off or on`;
      made.setAttribute("aria-label", title);
      made.addEventListener("click", () => toggle(part));
      return made;
    };
    // each column's sublayer: its name, or on a phone its spelling (translator.css)
    const heading = ([kind, title]) =>
      element(
        "span",
        "translator-note",
        element("span", "translator-wide", title),
        element("span", "translator-narrow", kind),
      );
    const rows = [element("span", "", ""), ...SUBLAYER_NAMES.map(heading)];
    for (let layer = model.layers; layer >= 1; layer--) {
      rows.push(element("span", "translator-note", `layer ${layer}`));
      for (const [kind, title] of SUBLAYER_NAMES) {
        const part = { kind, layer, head: null };
        rows.push(button(part, `L${layer}`, `layer ${layer}'s ${title} (${partText(part)})`));
      }
    }
    $("knock-layers").replaceChildren(...rows);
    const pe = { kind: "enc-pe", layer: null, head: null };
    // "pe" is two parts, the encoder's and the decoder's: switched together
    const positions = element("button", "translator-knock-part", "positional encodings (pe)");
    positions.type = "button";
    positions.dataset.part = "pe";
    positions.title = "the positional encodings of both sides: switch them off or on";
    positions.addEventListener("click", () => {
      const on = !isOff("pe");
      const others = parts.filter((p) => p.layer !== null);
      change(on ? [...others, pe, { kind: "dec-pe", layer: null, head: null }] : others);
    });
    $("knock-pe").replaceChildren(positions);
    showSet();
  }

  /** The pair's model ({layers, heads, importance}, its summary): the parts it has. */
  function setModel(summary) {
    const changed = !model || model.layers !== summary.layers;
    model = summary;
    try {
      checkKnockOut(parts, summary.layers, summary.heads);
    } catch (error) {
      throw new Problem(`The parts to switch off do not fit this model: ${error.message}.`);
    }
    if ($("knock") && changed) {
      drawButtons();
    }
    if ($("knock")) {
      showLegend();
    }
  }

  /** The importance of each head as a colour: red, BLEU falls without it; blue, it rises. */
  function importanceColour(change, largest) {
    const strength = Math.min(1, Math.abs(change) / largest);
    const rgb = change < 0 ? "214, 39, 40" : "33, 113, 181";
    return `rgba(${rgb}, ${(0.15 + 0.85 * strength).toFixed(3)})`;
  }

  const largestChange = () =>
    Math.max(...Object.values(model?.importance?.changes ?? { none: 0 }).map(Math.abs)) || 1;

  function showLegend() {
    const table = model?.importance;
    const legend = $("knock-legend");
    if (!table) {
      legend.textContent = "No stored importance for this pair's heads: the grid is not coloured.";
      return;
    }
    const values = Object.values(table.changes);
    const [low, high] = [Math.min(...values), Math.max(...values)];
    const signed = (x) => (x > 0 ? `+${x.toFixed(2)}` : x.toFixed(2).replace("-", "−"));
    legend.textContent =
      `The bar above each head: how much validation BLEU changes when that head alone is` +
      ` switched off (${table.sentences} sentences of ${table.split}, ${table.decoding};` +
      ` ${table.baseline_bleu.toFixed(2)} with everything on): red, it falls (down to` +
      ` ${signed(low)}); blue, it rises (up to ${signed(high)}); the stronger, the more.`;
  }

  /** For the grid (createGrid's decorate): each head's importance, and whether it is off. */
  function decorate(button, { kind, layer, head }) {
    const spelling =
      head < 0
        ? partText({ kind: GRID_KINDS[kind], layer: layer + 1, head: null })
        : partText({ kind: GRID_KINDS[kind], layer: layer + 1, head: head + 1 });
    button.dataset.part = spelling;
    button.classList.toggle("translator-off", isOff(spelling));
    const change = model?.importance?.changes[spelling];
    if (change !== undefined) {
      button.style.setProperty("--importance", importanceColour(change, largestChange()));
      button.classList.add("translator-rated");
      button.title += `; alone off, BLEU ${change > 0 ? "+" : ""}${change.toFixed(2)}`;
    }
  }

  /** A click on the grid's head (-1: the layer's mean): true if it switched it off or on. */
  function clickHead(kind, layer, head) {
    if ($("knock-mode")?.getAttribute("aria-pressed") !== "true") {
      return false;
    }
    toggle({ kind: GRID_KINDS[kind], layer: layer + 1, head: head < 0 ? null : head + 1 });
    return true;
  }

  /** The translation with everything on, beside the one with the parts off (found: each
   * sentence's inspect), or hidden when nothing is off. */
  function showIntact(found) {
    const line = $("intact");
    if (!line) {
      return;
    }
    const off = found.some((one) => one.intact);
    line.hidden = !off;
    if (off) {
      const intact = found.map((one) => (one.intact ?? one).text).join(" ");
      const same = intact === found.map((one) => one.text).join(" ");
      line.replaceChildren(
        element("strong", "", "With everything on: "),
        element("span", "", intact),
        same ? " (the same: the parts switched off change nothing here)" : "",
      );
      line.lang = "en";
    }
  }

  function setScoreState(state, status) {
    $("knock-score-status").textContent = status;
    $("knock-score-cancel").disabled = state !== "running";
    $("knock-score-progress").hidden = state !== "running";
    showSet();
  }

  /** The sample scored with the parts off and with everything on, side by side. */
  async function scoreSample() {
    const pair = chosenPair();
    const spelling = text();
    const run = { team: null, cancelled: false };
    scoring = run;
    $("knock-score-result").hidden = true;
    setScoreState("running", `Loading the ${name(pair)} model and the test set…`);
    try {
      const [test, team] = await testSetAndTeam(loader, pair);
      run.team = team;
      const sources = test.sources.slice(0, SAMPLE_SIZE);
      const references = test.references.slice(0, SAMPLE_SIZE);
      const started = performance.now();
      const sets = [
        [spelling, null],
        ["", intactScores.get(pair)],
      ];
      const total = sets.filter(([, known]) => !known).length * sources.length;
      const progress = $("knock-score-progress");
      progress.max = total;
      let before = 0;
      const scores = [];
      for (const [knockOut, known] of sets) {
        if (known) {
          scores.push(known);
          continue;
        }
        const texts = await translateInTeam(run, pair, sources, {
          extra: { knockOut, beamSize: 1 },
          progress: (done) => {
            progress.value = before + done;
            $("knock-score-status").textContent = `${before + done} of ${total} translations…`;
          },
        });
        if (run.cancelled) {
          return;
        }
        before += sources.length;
        const { settings } = test;
        const found = await team.ask(0, { score: { hypotheses: texts, references, settings } });
        scores.push(found);
      }
      intactScores.set(pair, scores[1]);
      const seconds = (performance.now() - started) / 1000;
      performance.mark("translator: sample scored", { detail: { ms: seconds * 1000 } });
      showScores(pair, test, spelling, scores);
      const where = `${team.size} ${team.size === 1 ? "worker" : "workers"}`;
      setScoreState("done", `Translated and scored in ${duration(seconds)}, in ${where}.`);
    } catch (error) {
      if (!run.cancelled && !(error instanceof Cancelled)) {
        setScoreState("error", `Something went wrong: ${error.message.split("\n")[0]}`);
        console.warn(error);
      }
    } finally {
      run.team?.close();
      if (scoring === run) {
        scoring = null;
        showSet();
      }
    }
  }

  function showScores(pair, test, spelling, [off, on]) {
    const score = (found) => [found.bleu.text.split(" ")[2], found.chrf.text.split(" = ")[1]];
    $("knock-score-pair").textContent =
      `${name(pair)} (${pair}), the first ${SAMPLE_SIZE} sentences of ${test.split},` +
      " greedy decoding (beam width 1), sacreBLEU's BLEU and chrF:";
    const row = (label, found) =>
      element("tr", "", ...[label, ...score(found)].map((cell) => element("td", "", cell)));
    $("knock-score-rows").replaceChildren(
      row(`switched off: ${spelling}`, off),
      row("everything on", on),
    );
    $("knock-score-result").hidden = false;
  }

  function cancelScore() {
    if (scoring) {
      scoring.cancelled = true;
      scoring.team?.close();
      scoring = null;
      setScoreState("cancelled", "Cancelled.");
    }
  }

  if ($("knock")) {
    $("knock-sample").textContent =
      `The score translates the first ${SAMPLE_SIZE} sentences of the test split with` +
      " greedy decoding (beam width 1), in the page's workers, with these parts off and with" +
      " everything on, and scores both with sacreBLEU.";
    $("knock-reset").addEventListener("click", () => change([]));
    $("knock-mode").addEventListener("click", () => {
      const pressed = $("knock-mode").getAttribute("aria-pressed") !== "true";
      $("knock-mode").setAttribute("aria-pressed", String(pressed));
    });
    $("knock-score").addEventListener("click", scoreSample);
    $("knock-score-cancel").addEventListener("click", cancelScore);
    showSet();
  }
  return { text, set, setModel, decorate, clickHead, showIntact };
}
