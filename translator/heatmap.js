"use strict";
/* global shownPiece, cellImage, inks, onThemeChange */
/* exported Heatmap */

// One attention heatmap, drawn on a canvas in the page's colours.

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
    this.view = null; // what is drawn: the view asked for, with its layout
    this.asked = null;
    this.hover = null;
    this.pinned = null;
    this.frame = 0;
    this.scroller.addEventListener("scroll", () => this.schedule());
    new ResizeObserver(() => this.schedule()).observe(this.scroller);
    onThemeChange(() => this.asked && this.show(this.asked, true));
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

  /**
   * view: {rows, cols (labels), values, titles, cell (px), top (the scale's top)};
   * `keep`: the same view again (in the colours of another theme), its focus kept.
   */
  show(view, keep = false) {
    this.asked = view;
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
    if (!keep) {
      this.hover = this.pinned = null;
    }
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
    const ink = inks();
    if (cell >= 8) {
      context.strokeStyle = ink.background; // a thin line between cells
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
      context.globalAlpha = 0.65;
      context.fillStyle = ink.background;
      context.fillRect(left, top, width, y - top);
      context.fillRect(left, y + cell, width, height);
      context.globalAlpha = 1;
      context.strokeStyle = ink.focus;
      context.lineWidth = 2;
      context.strokeRect(left + focus.j * cell - sx, y, cell, cell);
    }
    context.restore();
    if (!labels) {
      return;
    }
    context.font = `${font}px monospace`;
    // the labels' strips, in the page's colours
    context.fillStyle = ink.background;
    context.fillRect(0, 0, width, top);
    context.fillRect(0, 0, left, height);
    context.fillStyle = ink.text;
    context.textBaseline = "middle";
    context.textAlign = "right";
    context.save();
    context.beginPath();
    context.rect(0, top, left, height - top);
    context.clip();
    for (let i = i0; i < i1; i++) {
      context.fillStyle = focus?.i === i ? ink.focus : ink.text;
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
      context.fillStyle = focus?.j === j ? ink.focus : ink.text;
      context.fillText(shownPiece(cols[j]), 0, 0, top - 6);
      context.restore();
    }
    context.restore();
  }
}
