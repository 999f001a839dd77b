"use strict";
/* global Tokenizer, Transformer, readSafetensors, translate, greedyDecode, beamSearch */
/* exported LanguagePair, serve */

// The page's computing side: one language pair's tokenizer and model, translating a
// sentence and reading its attention. It runs in a Web Worker made from this code (see
// page.js), so that the page stays responsive, or on the page itself where no worker
// starts.

class LanguagePair {
  /**
   * data: what the build wrote for one pair (_ext/translator.py): {pair, config (the
   * checkpoint's config.json), tokenizer (its tokenizer.json), spacy (the source
   * language's rules)}; weights: the bytes of its safetensors files.
   */
  constructor(data, weights) {
    this.pair = data.pair;
    this.tokenizer = new Tokenizer({ tokenizer: data.tokenizer, spacy: data.spacy });
    const tensors = new Map();
    for (const bytes of weights) {
      for (const [name, tensor] of readSafetensors(bytes)) {
        tensors.set(name, tensor);
      }
    }
    this.model = new Transformer(data.config.model, tensors);
  }

  /**
   * One text, translated as `python -m transformer translate` translates one SENTENCE:
   * {text, warnings, source and target ids and pieces} (no ids for empty text). beamSize
   * 1 is greedy decoding; onStep(t, limit) sees each decoding step.
   */
  translate(text, { beamSize = 4, alpha = 0.6, onStep = null } = {}) {
    const warnings = [];
    const [result] = translate(this.model, this.tokenizer, [text], {
      beamSize,
      alpha,
      warn: (message) => warnings.push(message),
      onStep: onStep && ((_, t, limit) => onStep(t, limit)),
    });
    const out = { text: result.text, warnings, beamSize };
    if (result.hypothesis) {
      const { source, hypothesis } = result;
      const { tokens, ended } = hypothesis;
      const tokenizer = this.tokenizer;
      // The decoder's input is <bos> and the output; each of its positions predicts the
      // next piece, so row t of a decoder heatmap is the step that wrote output piece t.
      const produced = ended ? [...tokens, tokenizer.eosId] : tokens;
      const target = [tokenizer.bosId, ...produced.slice(0, -1)];
      Object.assign(out, {
        source,
        target,
        sourcePieces: source.map((id) => tokenizer.pieces[id]),
        inputPieces: target.map((id) => tokenizer.pieces[id]),
        outputPieces: produced.map((id) => tokenizer.pieces[id]),
      });
    }
    return out;
  }

  /** Every attention weight of a translation (Transformer.attentionWeights), and H. */
  attention(source, target) {
    return { ...this.model.attentionWeights(source, target), heads: this.model.H };
  }
}

/**
 * Decode with a small model of random weights, so that the JavaScript engine compiles the
 * forward pass and the searches to fast machine code while the page is still loading the
 * real weights: a cold first translation takes about twice as long as the next. The
 * vocabulary is large enough that the loops over V get compiled too. A generator: each
 * step is one decoding, so that a message from the page can stop it between two.
 */
function* warmUp() {
  const config = {
    src_vocab_size: 1000,
    tgt_vocab_size: null,
    d_model: 32,
    n_heads: 2,
    n_layers: 2,
    d_ff: 64,
    max_len: 32,
    norm_first: false,
    positional: "sinusoidal",
    share_embeddings: true,
    tie_output: true,
  };
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
  for (let i = 0; i < 3; i++) {
    yield greedyDecode(model, source, ids, { maxLen: 24 });
    yield beamSearch(model, source, ids, { maxLen: 24 });
    yield model.attentionWeights(source, [2, 4, 5, 6]);
  }
}

/**
 * Answer the page's messages in a worker: {ping}, {load: data, weights}, and for a pair,
 * {pair, translate: text, beamSize} and {pair, attention: {source, target}}. Until the
 * first message that is not a ping, it warms up, one step at a time.
 */
function serve(scope) {
  const translators = new Map(); // pair -> LanguagePair
  const warming = warmUp();
  let idle = true;
  const warmer = () => {
    if (idle && !warming.next().done) {
      setTimeout(warmer, 0); // after the messages that have come in
    }
  };
  setTimeout(warmer, 0);
  scope.onmessage = ({ data: message }) => {
    idle &&= Boolean(message.ping);
    try {
      if (message.ping) {
        scope.postMessage({ id: message.id, ready: true });
      } else if (message.load) {
        const translator = new LanguagePair(message.load, message.weights);
        translators.set(translator.pair, translator);
        scope.postMessage({ id: message.id, ready: translator.pair });
      } else if (message.attention) {
        const { source, target } = message.attention;
        const result = translators.get(message.pair).attention(source, target);
        scope.postMessage({ id: message.id, result });
      } else if (message.translate !== undefined) {
        const result = translators.get(message.pair).translate(message.translate, {
          beamSize: message.beamSize,
          onStep: (t, limit) => scope.postMessage({ id: message.id, step: t, limit }),
        });
        scope.postMessage({ id: message.id, result });
      }
    } catch (error) {
      scope.postMessage({ id: message.id, error: String(error?.stack ?? error) });
    }
  };
}
