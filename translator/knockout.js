"use strict";
/* exported KNOCK_ATTENTIONS, KNOCK_SUBLAYERS, parseKnockOut, knockOutText, partText,
   checkKnockOut, knockedOut */

// Parts of a trained model switched off (Michel et al., 2019), as the package's
// transformer/knockout.py does it: a head contributes zeros to the concatenation before
// W^O (its columns of W^O are zero), a whole sublayer's residual branch is zero (its last
// linear map, weight and bias), and a positional encoding is a table of zeros. A set of
// parts is written as the package writes it, "enc-self:L1h3,dec-cross:L2,pe": layers and
// heads count from 1. A model with parts off is a copy that shares every weight but the
// zeroed ones, which are zeroed copies: the model itself is never changed, and nothing
// off is the model itself, at no cost.

// Each sublayer kind, in the package's order: its stack, its module in a layer (as
// model.js names them), and that module's last linear map.
const KNOCK_SUBLAYERS = {
  "enc-self": ["encoderLayers", "selfAttn", "o"],
  "enc-ffn": ["encoderLayers", "feedForward", "w2"],
  "dec-self": ["decoderLayers", "selfAttn", "o"],
  "dec-cross": ["decoderLayers", "crossAttn", "o"],
  "dec-ffn": ["decoderLayers", "feedForward", "w2"],
};
const KNOCK_ATTENTIONS = ["enc-self", "dec-self", "dec-cross"];
const KNOCK_POSITIONS = { "enc-pe": "srcPos", "dec-pe": "tgtPos" };
const KNOCK_KINDS = [...Object.keys(KNOCK_SUBLAYERS), ...Object.keys(KNOCK_POSITIONS)];
const KNOCK_SPELLING =
  "kind:L<layer>h<head> for a head (kinds enc-self, dec-self, dec-cross)," +
  " kind:L<layer> for a whole sublayer (those and enc-ffn, dec-ffn), pe," +
  " enc-pe or dec-pe for the positional encodings; layers and heads count" +
  " from 1, parts are separated by commas";
const KNOCK_PART = /^([a-z-]+):L([1-9][0-9]*)(?:h([1-9][0-9]*))?$/;

/** One part as the package writes it: "dec-cross:L2h4", "enc-ffn:L1" or "enc-pe". */
function partText({ kind, layer, head }) {
  if (layer === null) {
    return kind;
  }
  return `${kind}:L${layer}${head === null ? "" : `h${head}`}`;
}

/** The parts that one comma-separated item names ("pe" names two), as parse_part. */
function parseItem(item) {
  if (item === "pe") {
    return Object.keys(KNOCK_POSITIONS).map((kind) => ({ kind, layer: null, head: null }));
  }
  if (item in KNOCK_POSITIONS) {
    return [{ kind: item, layer: null, head: null }];
  }
  const match = KNOCK_PART.exec(item);
  if (match === null || !(match[1] in KNOCK_SUBLAYERS)) {
    throw new Error(`cannot read “${item}”: write ${KNOCK_SPELLING}`);
  }
  const [, kind, layer, head] = match;
  if (head !== undefined && !KNOCK_ATTENTIONS.includes(kind)) {
    throw new Error(`“${item}”: ${kind} has no heads; write ${kind}:L<n>`);
  }
  return [{ kind, layer: Number(layer), head: head === undefined ? null : Number(head) }];
}

/** The order in which the parts are written: by kind, layer, then head. */
const partKey = ({ kind, layer, head }) => [KNOCK_KINDS.indexOf(kind), layer ?? 0, head ?? 0];

function byKey(a, b) {
  const [x, y] = [partKey(a), partKey(b)];
  return x[0] - y[0] || x[1] - y[1] || x[2] - y[2];
}

/**
 * The parts named in `text` (KnockOut.parse): each once, in the order they are written;
 * "" or spaces name none. Throws an Error with a one-line message for a bad spelling.
 */
function parseKnockOut(text) {
  if (!text.trim()) {
    return [];
  }
  const found = new Map();
  for (const item of text.split(",")) {
    for (const part of parseItem(item.trim())) {
      found.set(partText(part), part);
    }
  }
  return [...found.values()].sort(byKey);
}

/** The parts as the package writes them (str(KnockOut)): both encodings as "pe". */
function knockOutText(parts) {
  const unique = new Map(parts.map((part) => [partText(part), part]));
  const sorted = [...unique.values()].sort(byKey);
  const positions = Object.keys(KNOCK_POSITIONS);
  if (positions.every((kind) => unique.has(kind))) {
    const rest = sorted.filter((part) => !(part.kind in KNOCK_POSITIONS)).map(partText);
    return [...rest, "pe"].join(",");
  }
  return sorted.map(partText).join(",");
}

/** A one-line Error for a part that a model of `layers` layers and `heads` heads lacks. */
function checkKnockOut(parts, layers, heads) {
  for (const part of [...parts].sort(byKey)) {
    if (part.layer !== null && part.layer > layers) {
      throw new Error(`${partText(part)}: the model has ${layers} layers`);
    }
    if (part.head !== null && part.head > heads) {
      throw new Error(`${partText(part)}: the model has ${heads} heads`);
    }
  }
}

/**
 * `model` (a Transformer of model.js) with `parts` switched off: a copy sharing all of its
 * weights but those that switch the parts off, which are zeroed copies. No parts: the
 * model itself.
 */
function knockedOut(model, parts) {
  if (!parts.length) {
    return model;
  }
  checkKnockOut(parts, model.encoderLayers.length, model.H);
  const copy = Object.assign(Object.create(Object.getPrototypeOf(model)), model);
  copy.encoderLayers = model.encoderLayers.map((layer) => ({ ...layer }));
  copy.decoderLayers = model.decoderLayers.map((layer) => ({ ...layer }));
  const dK = model.dK;
  for (const { kind, layer, head } of parts) {
    if (kind in KNOCK_POSITIONS) {
      const name = KNOCK_POSITIONS[kind];
      copy[name] = new Float32Array(model[name].length); // (max_len, d_model) of zeros
      continue;
    }
    const [stack, module, last] = KNOCK_SUBLAYERS[kind];
    const found = copy[stack][layer - 1];
    found[module] = { ...found[module] };
    const linear = { ...found[module][last] };
    found[module][last] = linear;
    if (head === null) {
      // the whole residual branch: weight and bias
      linear.weight = new Float32Array(linear.weight.length);
      linear.bias = linear.bias && new Float32Array(linear.bias.length);
    } else {
      // (d_out, H · d_k), row-major: head h's slice of the concatenation meets these columns
      const weight = Float32Array.from(linear.weight);
      const from = (head - 1) * dK;
      for (let row = 0; row < linear.dOut; row++) {
        weight.fill(0, row * linear.dIn + from, row * linear.dIn + from + dK);
      }
      linear.weight = weight;
    }
  }
  return copy;
}
