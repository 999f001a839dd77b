"use strict";
/* exported $, MARK, shownPiece, textOf, pieceSpan, element, fixed, count, nextTurn,
   Cancelled, Problem, darkTheme, onThemeChange, inks, shade, shadePiece, cellImage,
   gradient */

// What every part of the page draws with: the model's pieces (␣ for its word marker),
// numbers as the page prints them, and the colours of attention, which follow the book's
// light or dark theme. Functions only: no part's state lives here.

const $ = (id) => document.getElementById(`translator-${id}`);
const MARK = "\u2581"; // the tokenizer's word marker, ▁
const SHOWN_MARK = "\u2423"; // how the page shows it, ␣: a space before this piece

/** The piece as the page writes it: ␣ for the word marker. */
const shownPiece = (piece) => piece.replaceAll(MARK, SHOWN_MARK);

/** The text of pieces, as the tokenizer decodes them (▁ a space). */
const textOf = (pieces) => pieces.join("").replaceAll(MARK, " ").trim();

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

/** An element with a class and children (text stays text). */
function element(tag, className = "", ...children) {
  const made = document.createElement(tag);
  if (className) {
    made.className = className;
  }
  made.append(...children);
  return made;
}

const fixed = (x, digits = 3) =>
  x === null || x === undefined || x === -Infinity ? "−∞" : x.toFixed(digits);

/** "1 candidate", "4 candidates" (small counts: no thousands separator). */
const count = (n, one, many) => `${n} ${n === 1 ? one : many}`;

/** A promise of the event loop's next turn: the page answers the reader in between. */
const nextTurn = () =>
  globalThis.scheduler?.yield
    ? globalThis.scheduler.yield()
    : new Promise((resolve) => setTimeout(resolve, 0));

/** A work that the reader cancelled. */
class Cancelled extends Error {
  constructor() {
    super("cancelled");
    this.name = "Cancelled";
  }
}

/** Input that the page cannot translate: its message is for the reader, as it is. */
class Problem extends Error {}

// ---- The theme: the book's switch sets data-theme on <html> to "light" or "dark".

const darkTheme = () => document.documentElement.dataset.theme === "dark";

/** Call `redraw` whenever the reader switches the theme. */
function onThemeChange(redraw) {
  new MutationObserver(redraw).observe(document.documentElement, {
    attributes: true,
    attributeFilter: ["data-theme"],
  });
}

const INKS = new Map(); // theme -> its inks: read once per theme

/** The colours a canvas draws its labels with: the page's own. */
function inks() {
  const theme = document.documentElement.dataset.theme ?? "";
  if (!INKS.has(theme)) {
    const style = getComputedStyle(document.documentElement);
    const read = (name, fallback) => style.getPropertyValue(name).trim() || fallback;
    const dark = darkTheme();
    INKS.set(theme, {
      background: read("--pst-color-background", dark ? "#121212" : "#ffffff"),
      text: read("--pst-color-text-base", dark ? "#ced6dd" : "#222222"),
      focus: dark ? "#ff7f7f" : "#d62728",
    });
  }
  return INKS.get(theme);
}

// The colours of a weight from 0 to the top of the scale: from the page's background (white,
// or near black) through blues to dark blue in the light theme, to pale blue in the dark:
// a weight of 0 sinks into the page either way, and a large one stands out.
const STOPS = {
  light: ["#deebf7", "#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b"],
  dark: ["#10294a", "#0e3c6e", "#13568f", "#2171b5", "#4292c6", "#6baed6", "#9ecae1", "#deebf7"],
};

/** The red, green and blue of a CSS colour. */
function rgbOf(css) {
  const context = document.createElement("canvas").getContext("2d");
  context.fillStyle = css;
  context.fillRect(0, 0, 1, 1);
  return [...context.getImageData(0, 0, 1, 1).data.slice(0, 3)];
}

/** The scale's stops in the current theme, from the page's background. */
const stops = () => [inks().background, ...STOPS[darkTheme() ? "dark" : "light"]];

/** 256 RGB colours between the stops. */
function paletteOf(colours) {
  const rgb = colours.map(rgbOf);
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
}
const PALETTES = new Map(); // the stops, joined -> their palette: each made once
function palette() {
  const key = stops().join();
  if (!PALETTES.has(key)) {
    PALETTES.set(key, paletteOf(stops()));
  }
  return PALETTES.get(key);
}

/** The palette's index of x in [0, 1], times 3. */
const indexOf = (x) => Math.max(0, Math.min(255, Math.round(x * 255))) * 3;

/** The palette's colour of x in [0, 1], as CSS. */
function shade(x) {
  const table = palette();
  const i = indexOf(x);
  return `rgb(${table[i]}, ${table[i + 1]}, ${table[i + 2]})`;
}

/**
 * Shade a piece's background by x in [0, 1] (null: clear), with ink that reads on it:
 * dark on a light colour, light on a dark one, whatever the theme.
 */
function shadePiece(span, x) {
  span.style.backgroundColor = x === null ? "" : shade(x);
  const table = palette();
  const i = indexOf(x ?? 0);
  const light = 0.2126 * table[i] + 0.7152 * table[i + 1] + 0.0722 * table[i + 2] > 140;
  span.classList.toggle("translator-ink-light", x !== null && !light);
  span.classList.toggle("translator-ink-dark", x !== null && light);
}

/** One pixel per cell, coloured: a canvas to draw from, scaled. */
function cellImage(values, rows, cols, top) {
  const table = palette();
  const canvas = document.createElement("canvas");
  canvas.width = Math.max(1, cols);
  canvas.height = Math.max(1, rows);
  const context = canvas.getContext("2d");
  const image = context.createImageData(canvas.width, canvas.height);
  for (let i = 0; i < rows * cols; i++) {
    const c = indexOf(values[i] / top);
    image.data.set([table[c], table[c + 1], table[c + 2], 255], i * 4);
  }
  context.putImageData(image, 0, 0);
  return canvas;
}

/** The scale as a CSS gradient, for its legend. */
const gradient = () => `linear-gradient(to right, ${stops().join(", ")})`;
