"use strict";
/* global MARK */
/* exported languageHint, unreadablePieces */

// Input that the models cannot read: text in the other pair's language, or in characters
// that the vocabulary lacks. Pure functions of their arguments.

// How many of a language's telling words a text must hold before the page offers its pair.
const HINT_MIN_WORDS = 2;

/**
 * The pair whose source language `text` looks like, where it is not `current`: languages
 * are [{pair, language, words (a Set of the most frequent words of the pair's source that
 * the other languages lack, lowercased, as the build lists them)}]. A text looks like the
 * language whose words it holds most, at least HINT_MIN_WORDS of them. Returns {pair,
 * language, found (how many)}, or null.
 */
function languageHint(text, current, languages) {
  const words =
    text
      .normalize("NFC")
      .toLowerCase()
      .match(/\p{L}+/gu) ?? [];
  let best = null;
  for (const { pair, language, words: known } of languages) {
    const found = words.filter((word) => known.has(word)).length;
    if (found >= HINT_MIN_WORDS && (!best || found > best.found)) {
      best = { pair, language, found };
    }
  }
  return best && best.pair !== current ? best : null;
}

/**
 * The pieces of a source that carry nothing the model can read: <unk>, a character the
 * vocabulary lacks, and a bare word marker ▁, which is all that is left of a word made of
 * such characters (an emoji is "▁", "<unk>"). source: its ids; ids: {unk, eos}, the
 * special ids; pieces: the vocabulary's pieces by id. {count, of}, <eos> left out.
 */
function unreadablePieces(source, ids, pieces) {
  const read = source.filter((id) => id !== ids.eos);
  const count = read.filter((id) => id === ids.unk || pieces[id] === MARK).length;
  return { count, of: read.length };
}
