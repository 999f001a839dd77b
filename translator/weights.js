"use strict";
/* exported readSafetensors, fromBase64, loadPairScripts */

// A pair's weights as the build writes them (_ext/translator.py): safetensors files, in
// base64, cut into chunks that are each one classic script, read by a Web Worker (or the
// page, or Node) one after another.

// A safetensors file is an 8-byte header length, a JSON header, then the data.

const HALF_TO_FLOAT = (() => {
  // float16 -> float32 for each of the 65,536 bit patterns
  const table = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1;
    const exponent = (h >> 10) & 0x1f;
    const fraction = h & 0x3ff;
    if (exponent === 0) {
      table[h] = sign * fraction * 2 ** -24; // subnormal
    } else if (exponent === 31) {
      table[h] = fraction ? NaN : sign * Infinity;
    } else {
      table[h] = sign * (1 + fraction / 1024) * 2 ** (exponent - 15);
    }
  }
  return table;
})();

const BITS = new Uint32Array(1);
const BITS_AS_FLOAT = new Float32Array(BITS.buffer);

/** The tensors of a safetensors file's bytes: Map name -> {shape, data: Float32Array}. */
function readSafetensors(bytes) {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = Number(view.getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLength)));
  const start = 8 + headerLength;
  const tensors = new Map();
  for (const [name, { dtype, shape, data_offsets: offsets }] of Object.entries(header)) {
    if (name === "__metadata__") {
      continue;
    }
    const at = start + offsets[0];
    const data = new Float32Array(shape.reduce((a, b) => a * b, 1));
    if (dtype === "F16") {
      for (let i = 0; i < data.length; i++) {
        data[i] = HALF_TO_FLOAT[view.getUint16(at + 2 * i, true)];
      }
    } else if (dtype === "BF16") {
      for (let i = 0; i < data.length; i++) {
        BITS[0] = view.getUint16(at + 2 * i, true) << 16; // the top half of a float32
        data[i] = BITS_AS_FLOAT[0];
      }
    } else if (dtype === "F32") {
      for (let i = 0; i < data.length; i++) {
        data[i] = view.getFloat32(at + 4 * i, true);
      }
    } else {
      throw new Error(`weight ${name} has dtype ${dtype}: F16, BF16 or F32 expected`);
    }
    tensors.set(name, { shape, data });
  }
  return tensors;
}

/** The bytes of a base64 text. */
function fromBase64(text) {
  if (Uint8Array.fromBase64) {
    return Uint8Array.fromBase64(text);
  }
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) {
    bytes[i] = binary.charCodeAt(i);
  }
  return bytes;
}

/**
 * A pair's data and weights from the build's scripts: `<pair>.js` at `url`, which calls
 * translatorData(data), then each chunk that data.weights lists, which calls
 * translatorWeights(pair, index, base64). `run(url)` runs one script (importScripts in a
 * worker); progress(loaded, total) is told after each, in bytes of the files, of `total`
 * (the size of them all, which the build gives the page). The result: {data, weights (a
 * Uint8Array per safetensors file)}.
 */
function loadPairScripts(url, run, total = 0, progress = null) {
  const scope = globalThis;
  let data = null;
  const chunks = [];
  scope.translatorData = (found) => {
    data = found;
  };
  scope.translatorWeights = (pair, index, text) => {
    chunks[index] = text;
  };
  try {
    run(url);
    if (!data) {
      throw new Error(`${url} holds no translator data`);
    }
    const listed = data.weights.chunks;
    let loaded = total - listed.reduce((sum, chunk) => sum + chunk.bytes, 0);
    progress?.(loaded, total);
    const bytes = new Uint8Array(data.weights.files.reduce((a, b) => a + b, 0));
    let at = 0;
    listed.forEach((chunk, index) => {
      run(new URL(chunk.src, url).href);
      if (chunks[index] === undefined) {
        throw new Error(`${chunk.src} holds no weights`);
      }
      const part = fromBase64(chunks[index]);
      chunks[index] = null; // the text is no longer needed
      bytes.set(part, at);
      at += part.length;
      loaded += chunk.bytes;
      progress?.(loaded, total);
    });
    return { data, weights: splitFiles(bytes, data.weights.files) };
  } finally {
    delete scope.translatorData;
    delete scope.translatorWeights;
  }
}

/** The bytes of each file, `sizes` long each, in `bytes` one after another. */
function splitFiles(bytes, sizes) {
  let at = 0;
  return sizes.map((size) => {
    at += size;
    return bytes.subarray(at - size, at);
  });
}
