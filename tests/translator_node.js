"use strict";
// Runs the page's translator in Node for tests/test_translator.py, on the files that the
// book's build writes (_ext/translator.py): core.js and one pair's <pair>.js.
//
//   node tests/translator_node.js FOLDER PAIR < request.json > answer.json
//
// The request is one JSON object; each key present asks for one thing (PAIR "-" for
// regex alone):
//   regex: [{pattern, strings}]
//                            -> per pattern, per string: {search, match, finditer} spans
//   words: [sentence]        -> words: [[marked spaCy word]]  (pretokenize)
//   segment: [word]          -> ids: [[id]]                   (Tokenizer.segment)
//   translate: [sentence], beamSize, maxLen
//                            -> texts, warnings, hypotheses (tokens, logProb, score, ended)
//   attention: [sentence], beamSize
//                            -> per sentence {source, target, encoder, decoderSelf,
//                               decoderCross}, the weights as nested arrays

const fs = require("fs");
const path = require("path");
const vm = require("vm");

const [folder, pair] = process.argv.slice(2);
vm.runInThisContext(fs.readFileSync(path.join(folder, "core.js"), "utf8"));
// eslint-disable-next-line no-undef
const core = translatorCore(null);
const request = JSON.parse(fs.readFileSync(0, "utf8"));
const answer = {};
const started = process.hrtime.bigint();

if (request.regex) {
  answer.regex = request.regex.map(({ pattern, strings }) => regexAnswers(pattern, strings));
}
if (pair !== "-") {
  answerPair();
}
finish();

/** Loads the pair's data and answers the requests that need a model. */
function answerPair() {
  let loaded = null;
  globalThis.translatorData = (data, weights) => {
    loaded = { data, weights };
  };
  vm.runInThisContext(fs.readFileSync(path.join(folder, `${pair}.js`), "utf8"));
  const weights = loaded.weights.map((text) => new Uint8Array(Buffer.from(text, "base64")));
  const translator = new core.LanguagePair(loaded.data, weights);
  const { tokenizer, model } = translator;

  if (request.words) {
    answer.words = request.words.map((sentence) => tokenizer.words(sentence));
  }
  if (request.segment) {
    answer.ids = request.segment.map((word) => tokenizer.segment(word));
  }
  if (request.translate) {
    const warnings = [];
    const results = core.translate(model, tokenizer, request.translate, {
      beamSize: request.beamSize ?? 4,
      maxLen: request.maxLen ?? null,
      warn: (message) => warnings.push(message),
    });
    answer.texts = results.map((r) => r.text);
    answer.hypotheses = results.map((r) => r.hypothesis);
    answer.warnings = warnings;
  }
  if (request.attention) {
    const nested = (flat, ...shape) => {
      const build = (offset, dims) =>
        dims.length === 1
          ? Array.from(flat.subarray(offset, offset + dims[0]))
          : Array.from({ length: dims[0] }, (_, i) =>
              build(offset + i * dims.slice(1).reduce((a, b) => a * b, 1), dims.slice(1)),
            );
      return build(0, shape);
    };
    answer.attention = request.attention.map((sentence) => {
      const result = translator.translate(sentence, { beamSize: request.beamSize ?? 4 });
      const { source, target } = result;
      const [S, T, H] = [source.length, target.length, model.H];
      const { encoder, decoderSelf, decoderCross } = translator.attention(source, target);
      return {
        source,
        target,
        encoder: encoder.map((w) => nested(w, H, S, S)),
        decoderSelf: decoderSelf.map((w) => nested(w, H, T, T)),
        decoderCross: decoderCross.map((w) => nested(w, H, T, S)),
      };
    });
  }
}

/**
 * A pattern converted by _ext/js_regex.py, used as spacy.js uses the tokenizer's: for each
 * string, the span of re.search, of re.match, and those of re.finditer ([start, end] in
 * code points, as Python counts; null for no match).
 */
function regexAnswers(pattern, strings) {
  const search = core.compileRegExp(pattern);
  const match = core.compileRegExp(pattern, "y");
  const finder = {
    infix: core.compileRegExp(pattern, "g"),
    infixNonEmpty: new RegExp(pattern.non_empty, pattern.flags + "y"),
  };
  const points = (string, unit) => [...string.slice(0, unit)].length;
  const span = (string, m) => m && [points(string, m.index), points(string, m.index + m[0].length)];
  return strings.map((string) => {
    match.lastIndex = 0;
    return {
      search: span(string, search.exec(string)),
      match: span(string, match.exec(string)),
      finditer: core.SpacyTokenizer.prototype.findInfixes
        .call(finder, string)
        .map(([a, b]) => [points(string, a), points(string, b)]),
    };
  });
}

function finish() {
  answer.seconds = Number(process.hrtime.bigint() - started) / 1e9;
  // Node exits once the answer is written: stdout to a pipe is asynchronous, and
  // process.exit straight after the write would cut a long answer short.
  process.stdout.write(JSON.stringify(answer));
}
