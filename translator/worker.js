"use strict";
/* global Tokenizer, Transformer, SacreBleu, readSafetensors, translate, greedyDecode,
   beamSearch, prepareSources, sentencesNamed, finish, lengthPenalty, fromBase64,
   loadPairScripts, WARM_UP, parseKnockOut, knockOutText, knockedOut */
/* exported LanguagePair, serve, Cancelled */

// The page's computing side: one language pair's tokenizer and model, loaded from the
// build's scripts, translating a sentence with the record of its search, reading its
// attention, translating the test set and scoring it. It runs in Web Workers made from
// this code (see loader.js), so that the page stays responsive, or on the page itself
// where no worker starts.

class LanguagePair {
  /**
   * data: what the build wrote for one pair (_ext/translator.py): {pair, names, example,
   * config (the checkpoint's config.json), tokenizer (its tokenizer.json), spacy and
   * target_spacy (the source and target languages' rules), special_ids and decoding (the
   * package's defaults and extra output length)}; weights: the bytes of its safetensors
   * files.
   */
  constructor(data, weights) {
    this.pair = data.pair;
    this.decoding = data.decoding;
    this.about = { names: data.names, example: data.example };
    this.importance = data.importance ?? null; // the package's stored knockout table
    this.tokenizer = new Tokenizer({
      tokenizer: data.tokenizer,
      spacy: data.spacy,
      targetSpacy: data.target_spacy,
      specialIds: data.special_ids,
    });
    const tensors = new Map();
    for (const bytes of weights) {
      for (const [name, tensor] of readSafetensors(bytes)) {
        tensors.set(name, tensor);
      }
    }
    this.model = new Transformer(data.config.model, tensors);
    this.knocked = { text: "", model: this.model }; // the last model with parts off
  }

  /**
   * The model with the parts of `knockOut` (the package's spelling) switched off: the
   * model itself for none, else a copy with those weights zeroed (knockedOut), kept for
   * the next call that asks for the same.
   */
  modelFor(knockOut = "") {
    const text = knockOutText(parseKnockOut(knockOut ?? ""));
    if (text !== this.knocked.text) {
      this.knocked = { text, model: knockedOut(this.model, parseKnockOut(text)) };
    }
    return this.knocked.model;
  }

  /** What the page needs to know of the pair, once its model is loaded. */
  summary() {
    const { tokenizer, model } = this;
    return {
      pair: this.pair,
      ...this.about,
      pieces: tokenizer.pieces,
      specialIds: {
        pad: tokenizer.padId,
        unk: tokenizer.unkId,
        bos: tokenizer.bosId,
        eos: tokenizer.eosId,
      },
      layers: model.config.n_layers,
      heads: model.H,
      importance: this.importance,
    };
  }

  /**
   * The forced prefix as the text that `translate --prefix` takes, and whether that text
   * is cut into the same pieces (the package writes a prefix in the target language).
   */
  prefixText(prefix) {
    const text = this.tokenizer.decode(prefix);
    const pieces = this.tokenizer.encode(text, true);
    const exact = pieces.length === prefix.length && pieces.every((id, i) => id === prefix[i]);
    return { text, exact };
  }

  get ids() {
    const { bosId, eosId, padId } = this.tokenizer;
    return { bosId, eosId, padId };
  }

  /** The search's options: the package's defaults (DecodeOptions), with `changes`. */
  options({ beamSize, alpha, maxLen, prefix } = {}) {
    return {
      beamSize: beamSize ?? this.decoding.beam_size,
      alpha: alpha ?? this.decoding.alpha,
      extraLength: this.decoding.extra_length,
      maxLen: maxLen ?? null,
      prefix: prefix?.length ? prefix : null,
    };
  }

  /** The source ids of sentences, as the package makes them (see prepareSources). */
  sources(sentences, warn = null) {
    return prepareSources(this.model, this.tokenizer, sentences, warn);
  }

  /**
   * Sentences translated as `python -m transformer translate` translates them, with the
   * package's default search unless `changes` say otherwise: {texts, warnings}.
   */
  translateAll(sentences, changes = {}) {
    const warnings = [];
    const results = translate(this.modelFor(changes.knockOut), this.tokenizer, sentences, {
      ...this.options(changes),
      warn: (message) => warnings.push(message),
    });
    return { texts: results.map((r) => r.text), warnings };
  }

  /**
   * One text as the page shows it, a generator that yields after each step: the beam
   * search's translation ({beamSize, alpha, prefix} of the page; beamSize 1 is greedy
   * decoding) with the record of every step, greedy decoding's beside it, the warnings
   * of the command line, and the pieces of both sides. With a forced prefix, also the
   * free translation (the same search without it) and the prefix as text (prefixText).
   * An empty text gives {empty: true}. With parts switched off (changes.knockOut, the
   * package's spelling), the model runs without them, and `intact` is the same search's
   * translation with everything on, for comparison.
   */
  *inspect(text, changes = {}) {
    const { tokenizer, ids } = this;
    const model = this.modelFor(changes.knockOut);
    const options = this.options(changes);
    const warnings = [];
    const [source] = this.sources([text], (message) => warnings.push(message));
    if (!source) {
      return { empty: true, text: "", warnings };
    }
    const beamRecord = {};
    const beam = yield* beamSearch(model, source, ids, { ...options, record: beamRecord });
    // A beam of 1 is greedy decoding: the same pieces and log p, the score aside.
    const greedy =
      options.beamSize === 1
        ? { ...beam, score: beam.logProb }
        : yield* greedyDecode(model, source, ids, options);
    if (!beam.ended) {
      warnings.push(
        `${sentencesNamed([0])}: the translation stopped at the length limit, before <eos>`,
      );
    }
    // The decoder's input is <bos> and the output; each of its positions predicts the
    // next piece, so row t of a decoder heatmap is the step that wrote output piece t.
    const produced = beam.ended ? [...beam.tokens, tokenizer.eosId] : beam.tokens;
    const target = [tokenizer.bosId, ...produced.slice(0, -1)];
    const piece = (id) => tokenizer.pieces[id];
    // greedy decoding's log p over the length penalty: the score beam search ranks by
    const length = greedy.tokens.length + (greedy.ended ? 1 : 0);
    const penalised = Math.fround(greedy.logProb / lengthPenalty(length, options.alpha));
    let free = null;
    if (options.prefix) {
      const found = yield* beamSearch(model, source, ids, { ...options, prefix: null });
      free = { ...found, text: tokenizer.decode(found.tokens) }; // score: log p / lp
    }
    let intact = null;
    if (model !== this.model) {
      const found = yield* beamSearch(this.model, source, ids, options);
      intact = { ...found, text: tokenizer.decode(found.tokens) };
    }
    return {
      text: tokenizer.decode(beam.tokens),
      warnings,
      options: { beamSize: options.beamSize, alpha: options.alpha, prefix: options.prefix ?? [] },
      source,
      target,
      unknown: source.filter((id) => id === tokenizer.unkId).length,
      sourcePieces: source.map(piece),
      inputPieces: target.map(piece),
      outputPieces: produced.map(piece),
      beam: { ...beam, record: beamRecord },
      greedy: { ...greedy, text: tokenizer.decode(greedy.tokens), penalised },
      free,
      intact,
      knockOut: knockOutText(parseKnockOut(changes.knockOut ?? "")),
      prefix: options.prefix ? this.prefixText(options.prefix) : null,
    };
  }

  /**
   * Every attention weight of a translation (Transformer.attentionSteps), and H, with the
   * parts of `knockOut` switched off.
   */
  *attention(source, target, knockOut = "") {
    const weights = yield* this.modelFor(knockOut).attentionSteps(source, target);
    return { ...weights, heads: this.model.H };
  }
}

/** Scores of translations against their references, as sacreBLEU computes them. */
function scoreTranslations({ hypotheses, references, settings }) {
  const sacrebleu = new SacreBleu(settings);
  const bleu = sacrebleu.bleu(hypotheses, references);
  const chrf = sacrebleu.chrf(hypotheses, references);
  return { bleu, chrf };
}

/**
 * Decode with a small model of random weights, so that the JavaScript engine compiles the
 * forward pass and the searches to fast machine code while the page is still loading the
 * real weights: a cold first translation takes about twice as long as the next. The
 * vocabulary is large enough that the loops over V get compiled too. A generator: each
 * step is one decoding, so that a message from the page can stop it between two. Its
 * sizes and weights are those of no real model; the rest of its config (LayerNorm's ε
 * among them) and its search are the package's, which the build writes into WARM_UP.
 */
function* warmUp({ config, decoding } = WARM_UP) {
  let seed = 1;
  const random = () => (seed = (seed * 16807) % 2147483647) / 2147483647 - 0.5;
  const tensors = new Map();
  for (const [name, shape] of Transformer.tensorShapes(config)) {
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1)).map(random);
    tensors.set(name, { shape, data });
  }
  const model = new Transformer(config, tensors);
  const ids = { bosId: 2, eosId: 3, padId: 0 };
  const source = [4, 5, 6, 7, 8, 9, 10, 3];
  const options = {
    beamSize: decoding.beam_size,
    alpha: decoding.alpha,
    extraLength: decoding.extra_length,
  };
  for (let i = 0; i < 3; i++) {
    yield finish(greedyDecode(model, source, ids, { ...options, record: {} }));
    yield finish(beamSearch(model, source, ids, { ...options, record: {} }));
    yield model.attentionWeights(source, [2, 4, 5, 6]);
  }
}

/** A work that the page cancelled. */
class Cancelled extends Error {
  constructor() {
    super("cancelled");
    this.name = "Cancelled";
  }
}

/** A promise of the event loop's next turn, after the messages that have come in. */
const nextTurn = (() => {
  const { setImmediate } = globalThis; // Node's
  if (typeof setImmediate === "function") {
    return () => new Promise((resolve) => setImmediate(resolve));
  }
  // A message to itself is queued at once, where setTimeout waits at least 4 ms.
  const channel = new MessageChannel();
  const waiting = [];
  channel.port1.onmessage = () => waiting.shift()();
  return () =>
    new Promise((resolve) => {
      waiting.push(resolve);
      channel.port2.postMessage(null);
    });
})();

// How long a work runs before it lets the messages in (a cancel, a ping).
const SLICE_MS = 30;

/**
 * Run a generator to its end in slices of SLICE_MS, letting the messages in between two:
 * progress(value) is told of the last value of each slice; cancelled() is asked after
 * each, and if true the work stops with Cancelled.
 */
async function drive(steps, cancelled, progress = null) {
  let since = Date.now();
  for (;;) {
    const { done, value } = steps.next();
    if (done) {
      return value;
    }
    if (Date.now() - since >= SLICE_MS) {
      progress?.(value);
      await nextTurn();
      if (cancelled()) {
        steps.return();
        throw new Cancelled();
      }
      since = Date.now();
    }
  }
}

/** The buffers of a result's typed arrays, to transfer them rather than copy them. */
function buffersOf(value, found = new Set()) {
  if (ArrayBuffer.isView(value)) {
    found.add(value.buffer);
  } else if (Array.isArray(value)) {
    value.forEach((item) => buffersOf(item, found));
  } else if (value && typeof value === "object") {
    Object.values(value).forEach((item) => buffersOf(item, found));
  }
  return [...found];
}

/**
 * A pair's model from a load message: {load: pair, url, bytes}, the build's scripts at
 * `url`, run by the scope's importScripts (progress(loaded, total) after each), or {load:
 * pair, data, chunks}, the scripts' data and base64 chunks as the page read them itself.
 */
function loadPair(scope, message, progress) {
  if (message.url) {
    const run = (url) => scope.importScripts(url);
    const { data, weights } = loadPairScripts(message.url, run, message.bytes, progress);
    return new LanguagePair(data, weights);
  }
  const { data, chunks } = message;
  const bytes = new Uint8Array(data.weights.files.reduce((a, b) => a + b, 0));
  let at = 0;
  for (const chunk of chunks) {
    const part = fromBase64(chunk);
    bytes.set(part, at);
    at += part.length;
  }
  at = 0;
  const weights = data.weights.files.map((size) => bytes.subarray(at, (at += size)));
  return new LanguagePair(data, weights);
}

/**
 * Answer the page's messages in a worker: {ping}, {load: pair, …} (see loadPair),
 * {cancel: id}, and for a pair, {pair, inspect: text, options}, {pair, attention: {source,
 * target}} and {pair, translate: [sentence]}, and {score: {hypotheses, references,
 * settings}}. A work posts {id, step} as it goes and {id, result}, {id, ready}, {id,
 * error} or {id, cancelled} at its end. Until the first message that is not a ping, it
 * warms up, one step at a time, and goes on between the files of a pair it loads.
 */
function serve(scope) {
  const translators = new Map(); // pair -> LanguagePair
  const cancelled = new Set(); // the ids of the works to stop
  const warming = warmUp();
  let idle = true;
  const warmer = () => {
    if (idle && !warming.next().done) {
      setTimeout(warmer, 0); // after the messages that have come in
    }
  };
  setTimeout(warmer, 0);
  const translator = (pair) => {
    const found = translators.get(pair);
    if (!found) {
      throw new Error(`no ${pair} model is loaded`);
    }
    return found;
  };
  scope.onmessage = async ({ data: message }) => {
    const { id } = message;
    idle &&= Boolean(message.ping);
    const post = (answer) => scope.postMessage({ id, ...answer }, buffersOf(answer));
    const stopped = () => cancelled.has(id);
    const progress = (step) => scope.postMessage({ id, step });
    try {
      if (message.ping) {
        post({ ready: true });
      } else if (message.cancel !== undefined) {
        cancelled.add(message.cancel);
      } else if (message.load) {
        // the warm-up goes on between the files, while the page waits for them anyway
        const loaded = loadPair(scope, message, (loaded, total) => {
          progress({ loaded, total });
          warming.next();
        });
        translators.set(loaded.pair, loaded);
        post({ ready: loaded.summary() });
      } else if (message.inspect !== undefined) {
        const work = translator(message.pair).inspect(message.inspect, message.options);
        post({ result: await drive(work, stopped, progress) });
      } else if (message.attention) {
        const { source, target, knockOut } = message.attention;
        const work = translator(message.pair).attention(source, target, knockOut);
        post({ result: await drive(work, stopped) });
      } else if (message.translate) {
        const changes = { knockOut: message.knockOut, beamSize: message.beamSize };
        post({ result: translator(message.pair).translateAll(message.translate, changes) });
      } else if (message.score) {
        post({ result: scoreTranslations(message.score) });
      }
    } catch (error) {
      if (error instanceof Cancelled) {
        post({ cancelled: true });
      } else {
        post({ error: String(error?.stack ?? error) });
      }
    } finally {
      cancelled.delete(id);
    }
  };
}
