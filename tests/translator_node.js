"use strict";
// Runs the page's translator in Node for tests/test_translator.py, on the files that the
// book's build writes (_ext/translator.py): core.js, page.js (its pure functions), and one
// pair's <pair>.js with its weights' chunks, read as a worker reads them.
//
//   node tests/translator_node.js FOLDER PAIR < request.json > answer.json
//
// The request is one JSON object; each key present asks for one thing (PAIR "-" for
// those that need no model):
//   regex: [{pattern, strings}]
//                            -> per pattern, per string: {search, match, finditer} spans
//   configKeys: true         -> configKeys: the keys model.js accepts
//   warmUp: true             -> warmUp: {data: core.js's WARM_UP, steps: how many steps the
//                               worker's warm-up ran}
//   score: {settings, references, hypotheses: [[hypothesis]]}
//                            -> scores: per set {bleu, chrf, sentences}, as printed
//   words: [sentence]        -> words: [[marked spaCy word]]  (pretokenize)
//   segment: [word]          -> ids: [[id]]                   (Tokenizer.segment)
//   config: {model config}   -> configError: model.js's message refusing it, or null
//   spellings: [text]        -> spellings: per text {text: the parts as knockout.js writes
//                               them} or {error: its message}
//   translate: [sentence], beamSize, alpha, maxLen, prefix (ids), knockOut (spelling)
//                            -> texts, warnings, hypotheses (tokens, logProb, score, ended)
//   translate: [sentence], prefixes: [[id]], beamSize
//                            -> texts: each sentence translated with its own prefix
//   steps: [sentence], searches: [{beamSize, alpha}], prefix (ids), knockOut (spelling)
//                            -> steps: per search, per sentence, the record of each step
//                               (tokens, parents, logProbs, scores, ended, lengths) and
//                               the result's tokens
//   inspect: [sentence], beamSize, alpha, prefix (or prefixes: [[id]], one a sentence),
//            knockOut (spelling)
//                            -> inspected: what the page shows of each (the worker's
//                               LanguagePair.inspect), without its records, and the
//                               summary of each step in words (page.js's stepSummary)
//   unreadable: [sentence]   -> unreadable: [{count, of}], page.js's unreadablePieces
//   hints: {languages: [{pair, language, words: [word]}], texts: [[text, pair]]}
//                            -> hints: page.js's languageHint of each, or null
//   commands: [{pair, text, beamSize, alpha, prefixText}], defaults
//                            -> commands: page.js's commandLine of each
//   split: [text]            -> split: the sentences of each (page.js's splitSentences),
//                               and sentenceRule: the rule's characters and titles
//   limits: {cases: [[length, positions, maxLen]], extraLength}
//                            -> limits: decode.js's outputLimit of each
//   bytes: the size of the pair's files
//                            -> progress: [[loaded, total]] as loadPairScripts tells it
//   serve: [[sentence]]      -> served: the translations of each chunk, as the page's
//                               score button asks its workers (serve's translate message)
//   attention: [sentence], beamSize, knockOut (spelling)
//                            -> per sentence {source, target, encoder, decoderSelf,
//                               decoderCross}, the weights as nested arrays

const fs = require("fs");
const path = require("path");
const vm = require("vm");

const url = require("url");

const [folder, pair] = process.argv.slice(2);
vm.runInThisContext(fs.readFileSync(path.join(folder, "core.js"), "utf8"));
vm.runInThisContext(fs.readFileSync(path.join(folder, "page.js"), "utf8"));
// eslint-disable-next-line no-undef
const core = translatorCore(null);
// eslint-disable-next-line no-undef
const page = translatorPage(null);
/** A worker's importScripts, in Node: run the script at a file:// URL. */
const importScripts = (address) =>
  vm.runInThisContext(fs.readFileSync(url.fileURLToPath(address.split("?")[0]), "utf8"));
const request = JSON.parse(fs.readFileSync(0, "utf8"));
const answer = {};
const started = process.hrtime.bigint();

main().catch((error) => {
  process.stderr.write(String(error?.stack ?? error));
  process.exitCode = 1;
});

async function main() {
  if (request.regex) {
    answer.regex = request.regex.map(({ pattern, strings }) => regexAnswers(pattern, strings));
  }
  if (request.configKeys) {
    answer.configKeys = core.CONFIG_KEYS;
  }
  if (request.warmUp) {
    answer.warmUp = { data: core.WARM_UP, steps: [...core.warmUp()].length };
  }
  if (request.config) {
    answer.configError = configError(request.config);
  }
  if (request.score) {
    const { settings, references, hypotheses } = request.score;
    const sacrebleu = new core.SacreBleu(settings);
    answer.scores = hypotheses.map((set) => {
      const chrf = sacrebleu.chrf(set, references);
      return {
        bleu: sacrebleu.bleu(set, references).text,
        chrf: chrf.text,
        sentences: chrf.sentences.map((score) => core.pythonFixed(score, 2)),
      };
    });
  }
  if (request.hints) {
    const languages = request.hints.languages.map((l) => ({ ...l, words: new Set(l.words) }));
    answer.hints = request.hints.texts.map(([text, current]) =>
      page.languageHint(text, current, languages),
    );
  }
  if (request.commands) {
    answer.commands = request.commands.map((c) => page.commandLine(c, request.defaults));
  }
  if (request.limits) {
    const { cases, extraLength } = request.limits;
    answer.limits = cases.map(([length, positions, maxLen]) =>
      core.outputLimit({ maxLen: positions }, length, { extraLength, maxLen }),
    );
  }
  if (request.spellings) {
    answer.spellings = request.spellings.map((text) => {
      try {
        return { text: core.knockOutText(core.parseKnockOut(text)) };
      } catch (error) {
        return { error: error.message };
      }
    });
  }
  if (request.split) {
    answer.split = request.split.map((text) => page.splitSentences(text));
    answer.sentenceRule = page.SENTENCE_RULE;
  }
  if (pair !== "-") {
    await answerPair();
  }
  finish();
}

/** Loads the pair's data and answers the requests that need a model. */
async function answerPair() {
  const address = url.pathToFileURL(path.resolve(folder, `${pair}.js`)).href;
  const progress = [];
  const { data, weights } = core.loadPairScripts(
    address,
    importScripts,
    request.bytes ?? 0,
    (...p) => progress.push(p),
  );
  if (request.bytes) {
    answer.progress = progress;
  }
  const translator = new core.LanguagePair(data, weights);
  const { tokenizer } = translator;
  // the model with the request's parts switched off (none: the model itself)
  const model = translator.modelFor(request.knockOut ?? "");

  if (request.words) {
    answer.words = request.words.map((sentence) => tokenizer.words(sentence));
  }
  if (request.segment) {
    answer.ids = request.segment.map((word) => tokenizer.segment(word));
  }
  if (request.translate && request.prefixes) {
    answer.texts = request.translate.map((sentence, i) => {
      const options = translator.options({ ...request, prefix: request.prefixes[i] });
      return core.translate(model, tokenizer, [sentence], options)[0].text;
    });
  } else if (request.translate) {
    const warnings = [];
    const results = core.translate(model, tokenizer, request.translate, {
      ...translator.options(request),
      warn: (message) => warnings.push(message),
    });
    answer.texts = results.map((r) => r.text);
    answer.hypotheses = results.map((r) => r.hypothesis);
    answer.warnings = warnings;
  }
  if (request.steps) {
    answer.steps = request.searches.map((search) => {
      const options = translator.options({ ...search, prefix: request.prefix });
      return request.steps.map((sentence) => {
        const [source] = translator.sources([sentence]);
        const record = {};
        const found = core.finish(
          core.beamSearch(model, source, translator.ids, { ...options, record }),
        );
        const steps = record.steps.map(({ tokens, parents, logProbs, scores, ended, lengths }) => ({
          tokens,
          parents,
          logProbs,
          scores,
          ended,
          lengths,
        }));
        return { steps, tokens: found.tokens };
      });
    });
  }
  if (request.inspect) {
    const options = {
      beamSize: request.beamSize,
      alpha: request.alpha,
      prefix: request.prefix,
      knockOut: request.knockOut,
    };
    const piece = (id) => tokenizer.pieces[id];
    answer.inspected = request.inspect.map((sentence, i) => {
      const prefix = request.prefixes ? request.prefixes[i] : options.prefix;
      const result = core.finish(translator.inspect(sentence, { ...options, prefix }));
      if (result.beam) {
        const { record } = result.beam;
        result.summaries = record.steps.map((_, t) =>
          page.stepSummary(record, t, () => "…", piece),
        );
        result.beam.steps = record.steps.length;
        delete result.beam.record;
      }
      return result;
    });
  }
  if (request.unreadable) {
    const ids = { unk: tokenizer.unkId, eos: tokenizer.eosId };
    answer.unreadable = request.unreadable.map((sentence) => {
      const [source] = translator.sources([sentence]);
      return page.unreadablePieces(source ?? [], ids, tokenizer.pieces);
    });
  }
  if (request.serve) {
    answer.served = await serveChunks(address, request.serve);
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
      const { beamSize, knockOut } = request;
      const result = core.finish(translator.inspect(sentence, { beamSize, knockOut }));
      const { source, target } = result;
      const [S, T, H] = [source.length, target.length, model.H];
      const { encoder, decoderSelf, decoderCross } = core.finish(
        translator.attention(source, target, knockOut),
      );
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

/** The message with which model.js refuses `config` (zero weights of its shapes), or null. */
function configError(config) {
  try {
    const tensors = new Map();
    for (const [name, shape] of core.Transformer.tensorShapes(config)) {
      tensors.set(name, { shape, data: new Float32Array(shape.reduce((a, b) => a * b, 1)) });
    }
    new core.Transformer(config, tensors);
    return null;
  } catch (error) {
    return error.message;
  }
}

/**
 * The worker's side of the score button: serve() on a scope of its own, which loads the
 * pair from its scripts, then one translate message per chunk, as the page sends them:
 * each chunk's texts.
 */
function serveChunks(address, chunks) {
  const waiting = new Map();
  const scope = {
    importScripts,
    postMessage(message) {
      const call = waiting.get(message.id);
      if (message.step !== undefined || !call) {
        return;
      }
      waiting.delete(message.id);
      if (message.error) {
        call.reject(new Error(message.error));
      } else {
        call.resolve(message.result ?? message.ready);
      }
    },
  };
  core.serve(scope);
  let calls = 0;
  const ask = (message) =>
    new Promise((resolve, reject) => {
      const id = ++calls;
      waiting.set(id, { resolve, reject });
      scope.onmessage({ data: { ...message, id } });
    });
  return ask({ load: pair, url: address, bytes: 0 }).then(async () => {
    const texts = [];
    for (const chunk of chunks) {
      texts.push((await ask({ pair, translate: chunk })).texts);
    }
    return texts;
  });
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
