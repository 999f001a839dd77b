"use strict";
/* global parseKnockOut, knockOutText */
/* exported readLink, linkTo, commandLine */

// The search's settings as a link carries them, and the command line that gives the same
// translation. Pure functions of their arguments: the page's controls are read and set by
// page.js.

/**
 * What a link's query (URLSearchParams) asks for: {pair (or null), beamSize, alpha (null:
 * not given), prefix (pieces), text (or null), knockOut (the parts switched off, in the
 * package's spelling: "" for none), sentence (the one of the text shown, from 0)}, or
 * {problem}: the one-line problem with
 * it. pairs: the shipped pairs; choices: their names, for the message; limits: {beam:
 * [min, max], alpha: [min, max]}, the range of the page's sliders.
 */
function readLink(params, { pairs, choices, limits }) {
  const pair = params.get("pair");
  if (pair !== null && !pairs.includes(pair)) {
    return {
      problem: `This link asks for the language pair “${pair}”, which this page does not have: choose ${choices}.`,
    };
  }
  const found = { pair, beamSize: null, alpha: null, text: params.get("text") };
  const beam = params.get("beam");
  const [beamMin, beamMax] = limits.beam;
  if (beam !== null) {
    const k = Number(beam);
    if (!Number.isInteger(k) || k < beamMin || k > beamMax) {
      return {
        problem: `This link asks for a beam width of “${beam}”: the page searches with ${beamMin} to ${beamMax} beams.`,
      };
    }
    found.beamSize = k;
  }
  const alpha = params.get("alpha");
  const [alphaMin, alphaMax] = limits.alpha;
  if (alpha !== null) {
    const a = Number(alpha);
    if (alpha.trim() === "" || !(a >= alphaMin && a <= alphaMax)) {
      return {
        problem: `This link asks for α = “${alpha}”: the page takes α from ${alphaMin} to ${alphaMax}.`,
      };
    }
    found.alpha = a;
  }
  found.prefix = (params.get("prefix") ?? "").split(" ").filter(Boolean);
  const sentence = params.get("sentence");
  found.sentence = 0;
  if (sentence !== null) {
    const n = Number(sentence);
    if (!/^[1-9][0-9]*$/.test(sentence) || !Number.isSafeInteger(n)) {
      return {
        problem: `This link asks for sentence “${sentence}” of its text: a number from 1 is expected.`,
      };
    }
    found.sentence = n - 1;
  }
  const knock = params.get("knock") ?? "";
  try {
    found.knockOut = knockOutText(parseKnockOut(knock));
  } catch (error) {
    return {
      problem: `This link asks to switch off “${knock}”, which the page cannot read: ${error.message}.`,
    };
  }
  return found;
}

/**
 * The link that opens the page at `base` with this translation: its pair and text, the
 * settings that differ from `defaults` ({beamSize, alpha}), the forced prefix, the parts
 * switched off (knockOut, the package's spelling) and the sentence of the text shown
 * (from 0; the first is not written).
 */
function linkTo(
  base,
  { pair, text, beamSize, alpha, prefix, knockOut = "", sentence = 0 },
  defaults,
) {
  const url = new URL(base);
  url.search = "";
  url.hash = "";
  url.searchParams.set("pair", pair);
  url.searchParams.set("text", text);
  if (beamSize !== defaults.beamSize) {
    url.searchParams.set("beam", String(beamSize));
  }
  if (alpha !== defaults.alpha) {
    url.searchParams.set("alpha", String(alpha));
  }
  if (prefix.length) {
    url.searchParams.set("prefix", prefix.join(" "));
  }
  if (knockOut) {
    url.searchParams.set("knock", knockOut);
  }
  if (sentence > 0) {
    url.searchParams.set("sentence", String(sentence + 1));
  }
  return url.href;
}

/** One word of a POSIX shell: in double quotes where it needs no escape, else single. */
function quote(text) {
  if (/^[\w.,:/=+@%-]+$/u.test(text) && !text.startsWith("-")) {
    return text;
  }
  return /["\\$`!]/.test(text) ? `'${text.replaceAll("'", `'\\''`)}'` : `"${text}"`;
}

/**
 * `python -m transformer translate …`: the command that translates `text` as the page
 * did, with the settings that differ from `defaults`, the prefix given as text and the
 * parts switched off.
 */
function commandLine({ pair, text, beamSize, alpha, prefixText, knockOut = "" }, defaults) {
  const words = ["python -m transformer translate", "--pair", pair];
  if (beamSize !== defaults.beamSize) {
    words.push("--beam", String(beamSize));
  }
  if (alpha !== defaults.alpha) {
    words.push("--alpha", String(alpha));
  }
  if (knockOut) {
    words.push("--knock-out", quote(knockOut));
  }
  if (prefixText) {
    // a prefix that starts with "-" would read as an option
    words.push(prefixText.startsWith("-") ? `--prefix=${quote(prefixText)}` : "--prefix");
    if (!prefixText.startsWith("-")) {
      words.push(quote(prefixText));
    }
  }
  // one line: the package reads any run of whitespace as one space
  const sentence = text.trim().replace(/\s+/g, " ");
  // a sentence that starts with "-" follows "--", after which nothing is an option
  words.push(...(sentence.startsWith("-") ? ["--"] : []), quote(sentence));
  return words.join(" ");
}
