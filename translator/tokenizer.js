"use strict";
/* global SpacyTokenizer, compileRegExp */
/* exported Tokenizer */

// Text to token ids and back, as the package's transformer.tokenizer does it: normalise,
// cut into spaCy's words (marking with ▁ each word after a space), then BPE inside each
// word. The vocabulary and merges are the checkpoint's tokenizer.json.

const MARK = "\u2581"; // "▁": this word starts the sentence or follows a space
const MARK_STAND_IN = "\ufffd"; // a ▁ typed in the input: absent from training, <unk>

// Byte-pair encoding of one word, as the `tokenizers` library's BPE model: start from its
// characters (code points; an unknown one is <unk>), then merge adjacent pairs, the pair
// learnt first (lowest rank) first, the leftmost of equals first, until none applies.
class BPE {
  constructor({ vocab, merges, unk_token: unkToken }) {
    this.vocab = new Map(Object.entries(vocab)); // piece -> id
    this.unkId = this.vocab.get(unkToken);
    this.ranks = new Map(); // "id id" -> [rank, merged id]
    // Each merge is [a, b] (or "a b" in older tokenizer.json files).
    merges.forEach((merge, rank) => {
      const [a, b] = typeof merge === "string" ? merge.split(" ") : merge;
      const key = `${this.vocab.get(a)} ${this.vocab.get(b)}`;
      this.ranks.set(key, [rank, this.vocab.get(a + b)]);
    });
  }

  tokenize(word) {
    const ids = Array.from(word, (c) => this.vocab.get(c) ?? this.unkId);
    for (;;) {
      let best = null;
      let at = -1;
      for (let i = 0; i + 1 < ids.length; i++) {
        const merge = this.ranks.get(`${ids[i]} ${ids[i + 1]}`);
        if (merge && (best === null || merge[0] < best[0])) {
          best = merge;
          at = i;
        }
      }
      if (best === null) {
        return ids;
      }
      ids.splice(at, 2, best[1]);
    }
  }
}

class Tokenizer {
  /**
   * data: {tokenizer: the checkpoint's tokenizer.json, parsed; spacy: the rules of the
   * source language (see spacy.js), with Python's whitespace characters as a pattern;
   * targetSpacy (optional): the target language's; specialIds: {pad, unk, bos, eos}, the
   * package's tokenizer's ids}.
   */
  constructor(data) {
    const spec = data.tokenizer;
    this.languages = spec.languages;
    const model = spec.bpe.model;
    this.bpe = new BPE(model);
    this.pieces = [];
    for (const [piece, id] of Object.entries(model.vocab)) {
      this.pieces[id] = piece;
    }
    const { pad, unk, bos, eos } = data.specialIds;
    [this.padId, this.unkId, this.bosId, this.eosId] = [pad, unk, bos, eos];
    if (this.unkId !== this.bpe.unkId) {
      throw new Error(`the unknown piece's id is ${this.bpe.unkId} in the vocabulary, not ${unk}`);
    }
    this.spacy = new SpacyTokenizer(data.spacy);
    this.targetSpacy = data.targetSpacy ? new SpacyTokenizer(data.targetSpacy) : null;
    // Python's whitespace, which is not JavaScript's \s (U+001C-U+001F, U+0085, U+FEFF)
    const space = data.spacy.whitespace;
    this.whitespace = compileRegExp(space, "g");
    this.ends = new RegExp(`^(?:${space.source})|(?:${space.source})$`, space.flags + "g");
    this.segmentations = new Map(); // word -> ids: each distinct word is cut once
  }

  get vocabSize() {
    return this.pieces.length;
  }

  /** Unicode NFC, each run of whitespace (Python's str.split) to one space, ends stripped. */
  normalize(text) {
    return text.normalize("NFC").replace(this.whitespace, " ").replace(/^ | $/g, "");
  }

  /**
   * spaCy's words of one sentence, each after a space marked with ▁ (pretokenize), in the
   * source language or, given `target`, in the target's.
   */
  words(text, target = false) {
    const spacy = target ? this.targetSpacy : this.spacy;
    if (!spacy) {
      throw new Error("this tokenizer has no rules for the target language");
    }
    const clean = this.normalize(text).replaceAll(MARK, MARK_STAND_IN);
    const words = [];
    let afterSpace = true;
    for (const token of spacy.tokenize(clean)) {
      words.push(afterSpace ? MARK + token.text : token.text);
      afterSpace = token.space;
    }
    return words;
  }

  /** The ids of one marked word's BPE pieces. */
  segment(word) {
    let ids = this.segmentations.get(word);
    if (ids === undefined) {
      ids = this.bpe.tokenize(word);
      this.segmentations.set(word, ids);
    }
    return ids;
  }

  /** Token ids of one sentence, without special tokens (`target`: see words). */
  encode(text, target = false) {
    return this.words(text, target).flatMap((word) => this.segment(word));
  }

  /** Text of ids: stops at the first <eos>, skips <bos> and <pad>, ▁ becomes a space. */
  decode(ids) {
    const pieces = [];
    for (const id of ids) {
      if (id === this.eosId) {
        break;
      }
      if (id !== this.bosId && id !== this.padId) {
        pieces.push(this.pieces[id]);
      }
    }
    return pieces.join("").replaceAll(MARK, " ").replace(this.ends, ""); // Python's strip()
  }
}
