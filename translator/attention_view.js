"use strict";
/* global $, pieceSpan, shadePiece, cellImage, gradient, nextTurn, Cancelled, Heatmap,
   createGrid, onThemeChange */
/* exported createAttentionView */

// Where the model looked: both sentences' pieces (pointing at an output piece shades the
// source by its attention), one heatmap of a kind of attention, a layer and a head, and
// the grid of every layer and head.

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
    "What to look for: every cell above the diagonal has a weight of 0, the causal mask: " +
    "each step sees only the pieces before it. Many heads look at the previous piece, or " +
    "at <bos>.",
};

/**
 * The attention view; `decorate` goes to the grid (see createGrid); clickHead(kind,
 * layer, head), if given, is asked first of a click on the grid's head, and a true answer
 * means it took the click.
 */
function createAttentionView({ decorate = null, clickHead = null } = {}) {
  let shown = null; // {result, attention (with heads and layers)}: the view's data
  let stretched = false; // the colours stretched to the largest weight in view
  let heatmap = null;
  let grid = null;

  /**
   * The weights of one view: the chosen attention of layer `layer`, head `head` (-1: the
   * heads' mean), with its row and column labels. rows x cols, row-major.
   */
  function matrix(kind, layer, head) {
    const { sourcePieces, inputPieces, outputPieces } = shown.result;
    const { attention } = shown;
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

  const chosen = () => ({
    kind: $("kind").value,
    layer: Number($("layer").value),
    head: Number($("head").value) - 1,
  });

  /** Cells as large as the book's heatmaps (28 px), as small as 12 px to fit the column. */
  function autoCell() {
    const { kind } = chosen();
    const { inputPieces, sourcePieces } = shown.result;
    const cols = (kind === "decoderSelf" ? inputPieces : sourcePieces).length;
    const room = $("heatmap").clientWidth - 100;
    return Math.max(12, Math.min(28, Math.floor(room / cols)));
  }

  function drawHeatmap() {
    const { kind, layer, head } = chosen();
    const view = matrix(kind, layer, head);
    const largest = Math.max(...view.values);
    const top = stretched ? largest || 1 : 1;
    $("top").textContent = stretched ? `${largest.toFixed(3)}, the largest here` : "1";
    $("gradient").style.backgroundImage = gradient();
    $("axes").textContent = `Rows: ${view.titles[0]}. Columns: ${view.titles[1]}.`;
    heatmap.show({ ...view, cell: Number($("zoom").value), top });
    $("heatmap").dataset.drawn = `${kind} ${layer} ${head}`;
    grid.press(layer, head);
  }

  /** The grid of the chosen kind, one head per turn, until `run` (if any) is cancelled. */
  function drawGrid(run = null) {
    const { kind, layer, head } = chosen();
    $("grid-note").textContent = WHAT_TO_SEE[kind];
    return grid.draw({
      kind,
      layers: shown.attention.layers,
      heads: shown.attention.heads,
      chosen: { layer, head },
      stopped: () => Boolean(run?.cancelled),
      picture: (l, h) => {
        const view = matrix(kind, l, h);
        const top = stretched ? Math.max(...view.values) || 1 : 1;
        const [rows, cols] = [view.rows.length, view.cols.length];
        return { image: cellImage(view.values, rows, cols, top), rows, cols };
      },
    });
  }

  function drawPieces() {
    const { sourcePieces, outputPieces } = shown.result;
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
      source.forEach((s, j) => shadePiece(s, row[j] / top));
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

  function fillOptions(select, n, label, selected) {
    const keep = select.options.length === n ? select.selectedIndex : selected;
    select.replaceChildren(
      ...Array.from({ length: n }, (_, i) => {
        const option = document.createElement("option");
        option.value = String(i);
        option.textContent = label(i);
        return option;
      }),
    );
    select.selectedIndex = keep;
  }

  /**
   * Show the attention of `result` (LanguagePair.inspect's): `attention` as
   * LanguagePair.attention gives it, of a model of `layers` layers.
   */
  async function show(run, result, attention, layers) {
    if (!$("inside")) {
      return;
    }
    shown = { result, attention: { ...attention, layers } };
    $("inside").hidden = false;
    fillOptions($("layer"), layers, (i) => `${i + 1}`, layers - 1);
    fillOptions($("head"), attention.heads + 1, (i) => (i === 0 ? "all, averaged" : `${i}`), 0);
    drawPieces();
    $("zoom").value = String(autoCell());
    for (const wait of [drawHeatmap, drawGrid]) {
      await nextTurn();
      if (run.cancelled) {
        throw new Cancelled();
      }
      await wait(run);
    }
  }

  function clear() {
    shown = null;
    if ($("inside")) {
      $("inside").hidden = true;
      grid.clear();
    }
  }

  if ($("inside")) {
    heatmap = new Heatmap($("heatmap"), $("cell"));
    grid = createGrid($("grid"), {
      decorate,
      onChoose: (layer, head) => {
        if (clickHead?.($("kind").value, layer, head)) {
          return;
        }
        $("layer").value = String(layer);
        $("head").value = String(head + 1);
        drawHeatmap();
        $("heatmap").scrollIntoView({ block: "nearest" });
      },
    });
    $("kind").addEventListener("change", () => {
      if (shown) {
        $("zoom").value = String(autoCell());
        drawHeatmap();
        drawGrid();
      }
    });
    for (const name of ["layer", "head", "zoom"]) {
      $(name).addEventListener(name === "zoom" ? "input" : "change", () => shown && drawHeatmap());
    }
    $("stretch").addEventListener("click", () => {
      stretched = !stretched;
      $("stretch").setAttribute("aria-pressed", String(stretched));
      if (shown) {
        drawHeatmap();
        drawGrid();
      }
    });
    $("grid-large").addEventListener("click", () => {
      const large = $("grid").classList.toggle("translator-grid-large");
      $("grid-large").setAttribute("aria-pressed", String(large));
    });
    onThemeChange(() => {
      $("gradient").style.backgroundImage = gradient();
      if (shown) {
        drawGrid();
      }
    });
  }
  return { show, clear };
}
