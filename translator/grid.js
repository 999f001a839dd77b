"use strict";
/* global nextTurn */
/* exported createGrid */

// Every layer and head of one kind of attention at once: one small heatmap per head, and
// per layer the heads' mean, the top layer first. A click on one shows it large.

// The longest side of a thumbnail's picture, in pixels; the page scales it to the
// thumbnail, its cells kept sharp (image-rendering: pixelated).
const THUMB_PIXELS = 96;

/**
 * The grid in `element`: onChoose(layer, head) is told of a click (head -1: the heads'
 * mean). decorate(button, {kind, layer, head}), if given, adds to each thumbnail what
 * another part of the page shows of that head, such as whether it is switched off.
 */
function createGrid(element, { onChoose, decorate = null }) {
  let drawing = 0; // bumped for each new grid: an older one stops drawing

  /** Mark the thumbnail of (layer, head) as the one shown large. */
  function press(layer, head) {
    for (const button of element.querySelectorAll("button")) {
      button.setAttribute("aria-pressed", String(button.dataset.view === `${layer} ${head}`));
    }
  }

  /**
   * Draw the grid of `kind` for `layers` layers of `heads` heads, one thumbnail per turn,
   * until a newer grid starts or `stopped()` is true: picture(layer, head) gives
   * {image (one pixel per cell), rows, cols}; `chosen` {layer, head} is the one shown
   * large.
   */
  async function draw({ kind, layers, heads, chosen, picture, stopped = () => false }) {
    const generation = ++drawing;
    element.style.setProperty("--heads", String(heads + 1));
    const cells = [];
    const row = document.createElement("div");
    row.className = "translator-grid-row";
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
        button.addEventListener("click", () => onChoose(layer, head));
        decorate?.(button, { kind, layer, head });
        cells.push({ canvas, layer, head });
        row.append(button);
      }
    }
    element.replaceChildren(row);
    press(chosen.layer, chosen.head);
    for (const { canvas, layer, head } of cells) {
      if (generation !== drawing || stopped()) {
        return; // a newer grid is being drawn, or the reader cancelled
      }
      const { image, rows, cols } = picture(layer, head);
      const scale = THUMB_PIXELS / Math.max(rows, cols);
      canvas.width = Math.max(1, Math.round(cols * Math.max(1, scale)));
      canvas.height = Math.max(1, Math.round(rows * Math.max(1, scale)));
      const context = canvas.getContext("2d");
      context.imageSmoothingEnabled = scale < 1;
      context.drawImage(image, 0, 0, canvas.width, canvas.height);
      await nextTurn();
    }
  }

  /** Stop the grid being drawn, and empty it. */
  function clear() {
    drawing += 1;
    element.replaceChildren();
  }

  return { draw, press, clear };
}
