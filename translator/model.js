"use strict";
/* global finish, linear, layerNorm, add, relu, attend, sinusoidalEncoding */
/* exported Transformer, CONFIG_KEYS */

// The Transformer's forward pass (Vaswani et al., 2017, Figure 1) for one sentence, on the
// shipped weights: the arithmetic of Part I, in JavaScript. Every tensor is a Float32Array
// in row-major order, so that each value is rounded to float32 as PyTorch's are; sums are
// taken in double precision (JavaScript's number), which PyTorch's float32 sums approach.
//
// Shapes use the book's letters: S source positions, T target positions, H heads,
// d_model = H · d_k, d_ff, V the vocabulary. The source is one sentence (B = 1); the
// decoder runs N rows at once: N = 1 for greedy decoding, K beams for beam search, all
// reading the same memory.

// The keys of a model's configuration (config.json's "model", every field as the package
// reads it) that this code knows: the fields of the package's TransformerConfig, which a
// test holds equal to this list. The dropout rates do nothing at inference.
const CONFIG_KEYS = [
  "src_vocab_size",
  "tgt_vocab_size",
  "d_model",
  "n_heads",
  "n_layers",
  "d_ff",
  "dropout",
  "attention_dropout",
  "ffn_dropout",
  "max_len",
  "norm_first",
  "layer_norm_eps",
  "positional",
  "share_embeddings",
  "tie_output",
];

/** Refuse a configuration with a key this code does not know, or a value it cannot run. */
function checkConfig(config) {
  const unknown = Object.keys(config).filter((key) => !CONFIG_KEYS.includes(key));
  if (unknown.length) {
    throw new Error(
      `the model's configuration has ${unknown.length === 1 ? "a key" : "keys"} that this` +
        ` page does not know: ${unknown.join(", ")} (it knows ${CONFIG_KEYS.join(", ")})`,
    );
  }
  const missing = CONFIG_KEYS.filter((key) => !(key in config));
  if (missing.length) {
    throw new Error(`the model's configuration lacks ${missing.join(", ")}`);
  }
  if (!["sinusoidal", "learned"].includes(config.positional)) {
    throw new Error(`positional is ${config.positional}: sinusoidal or learned expected`);
  }
  if (!(config.layer_norm_eps > 0 && Number.isFinite(config.layer_norm_eps))) {
    throw new Error(`layer_norm_eps must be a positive number, got ${config.layer_norm_eps}`);
  }
}

class Transformer {
  /**
   * The name and shape of every weight of a model of this config, as the package's
   * state_dict names them (the tied ones once).
   */
  static tensorShapes(config) {
    const { d_model: d, d_ff: dFF, n_layers: layers, max_len: maxLen } = config;
    const V = config.src_vocab_size;
    const targetV = config.tgt_vocab_size ?? V;
    const shapes = new Map([["src_embed.embedding.weight", [V, d]]]);
    const linear = (name, dOut, dIn) => {
      shapes.set(`${name}.weight`, [dOut, dIn]);
      shapes.set(`${name}.bias`, [dOut]);
    };
    const norm = (name) => {
      shapes.set(`${name}.weight`, [d]);
      shapes.set(`${name}.bias`, [d]);
    };
    if (!config.share_embeddings) {
      shapes.set("tgt_embed.embedding.weight", [targetV, d]);
    }
    if (config.positional === "learned") {
      shapes.set("src_pos.embedding.weight", [maxLen, d]);
      shapes.set("tgt_pos.embedding.weight", [maxLen, d]);
    }
    for (const stack of ["encoder", "decoder"]) {
      for (let i = 0; i < layers; i++) {
        const layer = `${stack}.layers.${i}`;
        const attentions = stack === "encoder" ? ["self_attn"] : ["self_attn", "cross_attn"];
        for (const attention of attentions) {
          for (const w of ["w_q", "w_k", "w_v", "w_o"]) {
            linear(`${layer}.${attention}.${w}`, d, d);
          }
        }
        linear(`${layer}.feed_forward.w_1`, dFF, d);
        linear(`${layer}.feed_forward.w_2`, d, dFF);
        for (let j = 0; j <= attentions.length; j++) {
          norm(`${layer}.sublayers.${j}.norm`);
        }
      }
      if (config.norm_first) {
        norm(`${stack}.final_norm`);
      }
    }
    if (!config.tie_output) {
      shapes.set("generator.proj.weight", [targetV, d]);
    }
    return shapes;
  }

  /** config: config.json's "model", every field; tensors: readSafetensors' Map. */
  constructor(config, tensors) {
    checkConfig(config);
    // The weights must be those of this config, as the package checks them.
    for (const [name, shape] of Transformer.tensorShapes(config)) {
      if (!tensors.has(name)) {
        throw new Error(`the weights lack ${name}`);
      }
      if (tensors.get(name).shape.join() !== shape.join()) {
        throw new Error(
          `weight ${name} has shape [${tensors.get(name).shape}], the model expects [${shape}]`,
        );
      }
    }
    this.config = config;
    const { d_model: dModel, n_heads: H } = config;
    Object.assign(this, { dModel, H, dK: dModel / H, maxLen: config.max_len });
    this.V = config.tgt_vocab_size ?? config.src_vocab_size;
    const get = (name) => tensors.get(name).data;
    const linearLayer = (name, bias = true) => {
      const [dOut, dIn] = tensors.get(`${name}.weight`).shape;
      return { weight: get(`${name}.weight`), bias: bias ? get(`${name}.bias`) : null, dOut, dIn };
    };
    const norm = (name) => ({
      weight: get(`${name}.weight`),
      bias: get(`${name}.bias`),
      eps: config.layer_norm_eps,
    });
    const attention = (name) => ({
      q: linearLayer(`${name}.w_q`),
      k: linearLayer(`${name}.w_k`),
      v: linearLayer(`${name}.w_v`),
      o: linearLayer(`${name}.w_o`),
    });
    const feedForward = (name) => ({
      w1: linearLayer(`${name}.w_1`),
      w2: linearLayer(`${name}.w_2`),
    });
    const range = (n) => Array.from({ length: n }, (_, i) => i);
    this.encoderLayers = range(config.n_layers).map((i) => ({
      selfAttn: attention(`encoder.layers.${i}.self_attn`),
      feedForward: feedForward(`encoder.layers.${i}.feed_forward`),
      norms: [0, 1].map((j) => norm(`encoder.layers.${i}.sublayers.${j}.norm`)),
    }));
    this.decoderLayers = range(config.n_layers).map((i) => ({
      selfAttn: attention(`decoder.layers.${i}.self_attn`),
      crossAttn: attention(`decoder.layers.${i}.cross_attn`),
      feedForward: feedForward(`decoder.layers.${i}.feed_forward`),
      norms: [0, 1, 2].map((j) => norm(`decoder.layers.${i}.sublayers.${j}.norm`)),
    }));
    // Post-norm layers end normalised; a pre-norm stack ends with one more LayerNorm.
    this.normFirst = config.norm_first;
    if (this.normFirst) {
      this.encoderNorm = norm("encoder.final_norm");
      this.decoderNorm = norm("decoder.final_norm");
    }
    // One embedding table for both languages when they share a vocabulary, and the output
    // layer's weight tied to it (Section 3.4).
    this.srcEmbed = get("src_embed.embedding.weight");
    this.tgtEmbed = config.share_embeddings ? this.srcEmbed : get("tgt_embed.embedding.weight");
    this.output = config.tie_output
      ? { weight: this.tgtEmbed, bias: null, dIn: dModel, dOut: this.V }
      : linearLayer("generator.proj", false);
    if (config.positional === "sinusoidal") {
      this.srcPos = this.tgtPos = sinusoidalEncoding(config.max_len, dModel);
    } else {
      this.srcPos = get("src_pos.embedding.weight");
      this.tgtPos = get("tgt_pos.embedding.weight");
    }
    // √d_model in float32, as PyTorch multiplies a float32 tensor by a Python number
    this.embedScale = Math.fround(Math.sqrt(dModel));
  }

  /** Token ids at their positions -> (n, d_model): E[id] · √d_model + PE[position]. */
  embed(ids, positions, table, encoding) {
    const d = this.dModel;
    const x = new Float32Array(ids.length * d);
    ids.forEach((id, r) => {
      const pos = positions[r];
      if (pos >= this.maxLen) {
        throw new Error(`position ${pos} exceeds max_len=${this.maxLen}`);
      }
      for (let i = 0; i < d; i++) {
        x[r * d + i] = Math.fround(table[id * d + i] * this.embedScale) + encoding[pos * d + i];
      }
    });
    return x;
  }

  /** A sublayer with its residual connection: LayerNorm(x + f(x)), or x + f(LayerNorm(x)). */
  sublayer(x, n, norm, f) {
    if (this.normFirst) {
      return add(x, f(layerNorm(x, n, norm, this.dModel)));
    }
    return layerNorm(add(x, f(x)), n, norm, this.dModel);
  }

  feedForward(x, n, { w1, w2 }) {
    return linear(relu(linear(x, n, w1)), n, w2); // FFN(x) = max(0, x W1 + b1) W2 + b2
  }

  /**
   * The encoder over one source sentence: ids (S) -> memory (S, d_model). With
   * weights = [], pushes each layer's self-attention weights, (H, S, S) as H · S · S.
   */
  encode(ids, weights = null) {
    const S = ids.length;
    const { dModel: d, H, dK } = this;
    let x = this.embed(
      ids,
      ids.map((_, s) => s),
      this.srcEmbed,
      this.srcPos,
    ); // (S, d_model)
    for (const layer of this.encoderLayers) {
      const layerWeights = weights ? new Float32Array(H * S * S) : null;
      x = this.sublayer(x, S, layer.norms[0], (h) => {
        const { q, k, v, o } = layer.selfAttn;
        const [Q, K, Vs] = [q, k, v].map((p) => linear(h, S, p)); // (S, d_model) each
        const heads = new Float32Array(S * d);
        const rowWeights = layerWeights ? new Float32Array(H * S) : null;
        for (let s = 0; s < S; s++) {
          attend(Q, s * d, K, Vs, S, H, dK, heads, s * d, rowWeights);
          if (rowWeights) {
            for (let hh = 0; hh < H; hh++) {
              layerWeights.set(rowWeights.subarray(hh * S, hh * S + S), (hh * S + s) * S);
            }
          }
        }
        return linear(heads, S, o); // Concat(head_1, ..., head_H) W^O
      });
      x = this.sublayer(x, S, layer.norms[1], (h) => this.feedForward(h, S, layer.feedForward));
      if (weights) {
        weights.push(layerWeights);
      }
    }
    return this.normFirst ? layerNorm(x, S, this.encoderNorm, d) : x;
  }

  /**
   * A decoder ready to run on `memory` (S, d_model): each layer's keys and values of the
   * memory, projected once (the static cache of encoder-decoder attention), and an empty
   * cache of its own keys and values for `rows` rows.
   */
  startDecoder(memory, S, rows) {
    return {
      S,
      length: 0, // the target positions decoded so far
      cross: this.decoderLayers.map(({ crossAttn }) => ({
        keys: linear(memory, S, crossAttn.k), // (S, d_model)
        values: linear(memory, S, crossAttn.v),
      })),
      // self[layer].keys[row]: one d_model vector per position decoded
      self: this.decoderLayers.map(() => ({
        keys: Array.from({ length: rows }, () => []),
        values: Array.from({ length: rows }, () => []),
      })),
    };
  }

  /** Keep rows `index` of the cache, in that order: beam search following its beams. */
  reorder(cache, index) {
    for (const layer of cache.self) {
      layer.keys = index.map((r) => layer.keys[r].slice());
      layer.values = index.map((r) => layer.values[r].slice());
    }
  }

  /**
   * One decoding step: the newest token of each of N rows -> log p(next token), (N, V).
   * Only the new position is computed; the cache holds the keys and values of the others,
   * which it may all see (no mask). `active`, if given, lists the rows to compute (the
   * others keep their cache and get no log-probabilities). With weights = {}, also sets
   * weights.self[layer] (N, H, L) and weights.cross[layer] (N, H, S) for this position.
   */
  decodeStep(cache, tokens, active = null, weights = null) {
    const rows = active ?? tokens.map((_, r) => r);
    const N = rows.length;
    const { dModel: d, H, dK } = this;
    const S = cache.S;
    const L = cache.length + 1;
    // each row's newest token, all at the position after the L - 1 cached ones
    const position = rows.map(() => cache.length);
    let x = this.embed(
      rows.map((r) => tokens[r]),
      position,
      this.tgtEmbed,
      this.tgtPos,
    ); // (N, d_model)
    if (weights) {
      weights.self = [];
      weights.cross = [];
    }
    this.decoderLayers.forEach((layer, i) => {
      const selfCache = cache.self[i];
      const selfWeights = weights ? new Float32Array(N * H * L) : null;
      x = this.sublayer(x, N, layer.norms[0], (h) => {
        const { q, k, v, o } = layer.selfAttn;
        const [Q, K, Vs] = [q, k, v].map((p) => linear(h, N, p)); // (N, d_model) each
        const heads = new Float32Array(N * d);
        rows.forEach((r, n) => {
          selfCache.keys[r].push(K.subarray(n * d, n * d + d));
          selfCache.values[r].push(Vs.subarray(n * d, n * d + d));
          const w = selfWeights ? selfWeights.subarray(n * H * L, (n + 1) * H * L) : null;
          attend(Q, n * d, selfCache.keys[r], selfCache.values[r], L, H, dK, heads, n * d, w);
        });
        return linear(heads, N, o);
      });
      const crossWeights = weights ? new Float32Array(N * H * S) : null;
      x = this.sublayer(x, N, layer.norms[1], (h) => {
        // Queries from the decoder, keys and values from the encoder's memory (3.2.3).
        const { q, o } = layer.crossAttn;
        const Q = linear(h, N, q);
        const heads = new Float32Array(N * d);
        const { keys, values } = cache.cross[i];
        for (let n = 0; n < N; n++) {
          const w = crossWeights ? crossWeights.subarray(n * H * S, (n + 1) * H * S) : null;
          attend(Q, n * d, keys, values, S, H, dK, heads, n * d, w);
        }
        return linear(heads, N, o);
      });
      x = this.sublayer(x, N, layer.norms[2], (h) => this.feedForward(h, N, layer.feedForward));
      if (weights) {
        weights.self.push(selfWeights);
        weights.cross.push(crossWeights);
      }
    });
    cache.length += 1;
    if (this.normFirst) {
      x = layerNorm(x, N, this.decoderNorm, d);
    }
    return this.logSoftmax(linear(x, N, this.output), N);
  }

  /** The output layer's log-softmax over each of n rows of V logits, in place. */
  logSoftmax(logits, n) {
    const V = this.V;
    for (let r = 0; r < n; r++) {
      const row = logits.subarray(r * V, (r + 1) * V);
      let max = -Infinity;
      for (let i = 0; i < V; i++) {
        max = Math.max(max, row[i]);
      }
      let sum = 0;
      for (let i = 0; i < V; i++) {
        sum += Math.exp(row[i] - max);
      }
      const logSum = max + Math.log(sum);
      for (let i = 0; i < V; i++) {
        row[i] -= logSum;
      }
    }
    return logits;
  }

  /**
   * Every attention weight of one translation, as the package's attention_weights gives
   * them for src and tgt = <bos> + the output: per layer, encoder (H, S, S),
   * decoderSelf (H, T, T) and decoderCross (H, T, S), each a Float32Array.
   */
  attentionWeights(src, tgt) {
    return finish(this.attentionSteps(src, tgt));
  }

  /** attentionWeights as a generator that yields after each target position. */
  *attentionSteps(src, tgt) {
    const S = src.length;
    const T = tgt.length;
    const { H } = this;
    const encoder = [];
    const memory = this.encode(src, encoder);
    const cache = this.startDecoder(memory, S, 1);
    const nLayers = this.decoderLayers.length;
    const decoderSelf = Array.from({ length: nLayers }, () => new Float32Array(H * T * T));
    const decoderCross = Array.from({ length: nLayers }, () => new Float32Array(H * T * S));
    // Position by position through the cache: query t sees keys 0 ... t, as the causal
    // mask lets it; the weights on later keys stay 0.
    for (let t = 0; t < T; t++) {
      const step = {};
      this.decodeStep(cache, [tgt[t]], null, step);
      for (let i = 0; i < nLayers; i++) {
        for (let h = 0; h < H; h++) {
          decoderSelf[i].set(
            step.self[i].subarray(h * (t + 1), (h + 1) * (t + 1)),
            (h * T + t) * T,
          );
          decoderCross[i].set(step.cross[i].subarray(h * S, (h + 1) * S), (h * T + t) * S);
        }
      }
      yield t;
    }
    return { encoder, decoderSelf, decoderCross };
  }
}
