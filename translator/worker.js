"use strict";
/* global Tokenizer, Transformer, readSafetensors, translate */
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
 * Answer the page's messages in a worker: {ping}, {load: data, weights}, and for a pair,
 * {pair, translate: text, beamSize} and {pair, attention: {source, target}}.
 */
function serve(scope) {
  const translators = new Map(); // pair -> LanguagePair
  scope.onmessage = ({ data: message }) => {
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
