"use strict";
/* exported splitSentences, SENTENCE_RULE */

// A text in sentences, by the package's rule (transformer.translation.split_sentences):
// a sentence ends after . ! ? or … (or a run of them) and any closing quotes or brackets
// right after, where a space and then an upper-case letter or an opening quote follow,
// except a single full stop after a number, a single letter or a title. The models
// learned single captions, so the page translates a text sentence by sentence. A test
// holds this split equal to the package's (tests/test_translator.py).

const SENTENCE_RULE = {
  ends: ".!?…",
  closing: "\"'”’“»«›‹)]",
  opening: "\"'“‘„‚«‹",
  titles: ["Dr", "Prof", "Hr", "Fr", "St", "Mr", "Mrs", "Ms", "Mme"],
};

// Python's str.split white space, which is not JavaScript's \s (U+001C-U+001F, U+0085
// are Python's; U+FEFF is not).
// eslint-disable-next-line no-control-regex -- Python's white space holds U+001C-U+001F
const PYTHON_SPACE = /[\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+/g;

const escaped = (chars) => chars.replace(/[\]\\^-]/g, "\\$&");
// The word before the stop (group 1: letters and digits), the run of ends (group 2), any
// closing quotes, and the space before the next sentence.
const SENTENCE_END = new RegExp(
  `([\\p{L}\\p{Nd}]*)([${escaped(SENTENCE_RULE.ends)}]+)[${escaped(SENTENCE_RULE.closing)}]* (?=\\S)`,
  "gu",
);
const TITLED = new Set(SENTENCE_RULE.titles);

/** Whether a match of SENTENCE_END ends a sentence (see the rule above). */
function endsSentence(text, match) {
  const after = String.fromCodePoint(text.codePointAt(match.index + match[0].length));
  if (!SENTENCE_RULE.opening.includes(after) && !/\p{Lu}/u.test(after)) {
    return false;
  }
  const [, word, stop] = match;
  const isNumber = /^\p{Nd}+$/u.test(word);
  return stop !== "." || !([...word].length === 1 || isNumber || TITLED.has(word));
}

/** The sentences of `text`, normalised as the tokenizer does: [] for white space only. */
function splitSentences(text) {
  const clean = text.normalize("NFC").replace(PYTHON_SPACE, " ").replace(/^ | $/g, "");
  const sentences = [];
  let start = 0;
  for (const match of clean.matchAll(SENTENCE_END)) {
    if (endsSentence(clean, match)) {
      const stop = match.index + match[0].length;
      sentences.push(clean.slice(start, stop - 1)); // without the space
      start = stop;
    }
  }
  if (start < clean.length) {
    sentences.push(clean.slice(start));
  }
  return sentences;
}
