"use strict";
/* exported linear, layerNorm, add, relu, attend, sinusoidalEncoding */

// The operations of the Transformer's forward pass (model.js), each on rows of vectors:
// every tensor is a Float32Array in row-major order, so that each value is rounded to
// float32 as PyTorch's are; sums are taken in double precision (JavaScript's number),
// which PyTorch's float32 sums approach.

/** x[a .. a + n) · weight[w .. w + n): one output of a linear layer. */
function dot(x, a, weight, w, n) {
  let s = 0;
  for (let i = 0; i < n; i++) {
    s += x[a + i] * weight[w + i];
  }
  return s;
}

/**
 * x W^T + b, a linear layer: x (n, d_in) -> (n, d_out); W is (d_out, d_in), row-major.
 * Nearly all of the page's time is spent here, so it is written for speed rather than
 * brevity: it computes blocks of outputs at once (four rows of x by two rows of W, or one
 * row of x by four of W), so that every number read from memory serves several products,
 * in separate running sums, which the processor adds in parallel.
 */
function linear(x, n, { weight, bias, dIn, dOut }) {
  const y = new Float32Array(n * dOut);
  const b = (j) => (bias ? bias[j] : 0);
  let r = 0;
  for (; r + 4 <= n; r += 4) {
    const [x0, x1, x2, x3] = [r, r + 1, r + 2, r + 3].map((row) => row * dIn);
    const [y0, y1, y2, y3] = [r, r + 1, r + 2, r + 3].map((row) => row * dOut);
    let j = 0;
    for (; j + 2 <= dOut; j += 2) {
      const u = j * dIn; // rows j and j + 1 of W
      const v = u + dIn;
      // prettier-ignore
      let s00 = 0, s01 = 0, s10 = 0, s11 = 0, s20 = 0, s21 = 0, s30 = 0, s31 = 0;
      for (let i = 0; i < dIn; i++) {
        const wu = weight[u + i];
        const wv = weight[v + i];
        const a0 = x[x0 + i];
        const a1 = x[x1 + i];
        const a2 = x[x2 + i];
        const a3 = x[x3 + i];
        s00 += a0 * wu;
        s01 += a0 * wv;
        s10 += a1 * wu;
        s11 += a1 * wv;
        s20 += a2 * wu;
        s21 += a2 * wv;
        s30 += a3 * wu;
        s31 += a3 * wv;
      }
      [y[y0 + j], y[y0 + j + 1]] = [s00 + b(j), s01 + b(j + 1)];
      [y[y1 + j], y[y1 + j + 1]] = [s10 + b(j), s11 + b(j + 1)];
      [y[y2 + j], y[y2 + j + 1]] = [s20 + b(j), s21 + b(j + 1)];
      [y[y3 + j], y[y3 + j + 1]] = [s30 + b(j), s31 + b(j + 1)];
    }
    for (; j < dOut; j++) {
      for (const row of [r, r + 1, r + 2, r + 3]) {
        y[row * dOut + j] = dot(x, row * dIn, weight, j * dIn, dIn) + b(j);
      }
    }
  }
  for (; r < n; r++) {
    const xr = r * dIn;
    const yr = r * dOut;
    let j = 0;
    for (; j + 4 <= dOut; j += 4) {
      const [u0, u1, u2, u3] = [j, j + 1, j + 2, j + 3].map((row) => row * dIn);
      // prettier-ignore
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (let i = 0; i < dIn; i++) {
        const a = x[xr + i];
        s0 += a * weight[u0 + i];
        s1 += a * weight[u1 + i];
        s2 += a * weight[u2 + i];
        s3 += a * weight[u3 + i];
      }
      y[yr + j] = s0 + b(j);
      y[yr + j + 1] = s1 + b(j + 1);
      y[yr + j + 2] = s2 + b(j + 2);
      y[yr + j + 3] = s3 + b(j + 3);
    }
    for (; j < dOut; j++) {
      y[yr + j] = dot(x, xr, weight, j * dIn, dIn) + b(j);
    }
  }
  return y;
}

/** LayerNorm(x) = (x - mean) / √(var + ε) · γ + β over each row of d values. */
function layerNorm(x, n, { weight, bias, eps }, d) {
  const y = new Float32Array(n * d);
  for (let r = 0; r < n; r++) {
    const o = r * d;
    let mean = 0;
    for (let i = 0; i < d; i++) {
      mean += x[o + i];
    }
    mean /= d;
    let variance = 0;
    for (let i = 0; i < d; i++) {
      variance += (x[o + i] - mean) ** 2;
    }
    const scale = 1 / Math.sqrt(variance / d + eps);
    for (let i = 0; i < d; i++) {
      y[o + i] = (x[o + i] - mean) * scale * weight[i] + bias[i];
    }
  }
  return y;
}

function add(a, b) {
  const y = new Float32Array(a.length);
  for (let i = 0; i < a.length; i++) {
    y[i] = a[i] + b[i];
  }
  return y;
}

function relu(x) {
  return x.map((v) => (v > 0 ? v : 0));
}

/** Softmax of scores[0 .. n) in place. */
function softmax(scores, n) {
  let max = -Infinity;
  for (let i = 0; i < n; i++) {
    max = Math.max(max, scores[i]);
  }
  let sum = 0;
  for (let i = 0; i < n; i++) {
    scores[i] = Math.exp(scores[i] - max);
    sum += scores[i];
  }
  for (let i = 0; i < n; i++) {
    scores[i] /= sum;
  }
}

/**
 * Multi-head attention's core for one query row q (d_model = H · d_k): for each head h,
 * softmax(q_h K_h^T / √d_k) V_h over the L keys and values, equation (1). keys and values
 * are L vectors of d_model (or one Float32Array of L · d_model when flat). Writes the
 * heads side by side into out at offset o; the weights (H, L) into weights if given.
 */
function attend(q, qo, keys, values, L, H, dK, out, o, weights) {
  const scores = new Float64Array(L);
  const scale = Math.sqrt(dK);
  const flat = !Array.isArray(keys);
  for (let h = 0; h < H; h++) {
    const ho = h * dK;
    for (let l = 0; l < L; l++) {
      const k = flat ? keys : keys[l];
      const ko = flat ? l * H * dK + ho : ho;
      let s = 0;
      for (let i = 0; i < dK; i++) {
        s += q[qo + ho + i] * k[ko + i];
      }
      scores[l] = s / scale;
    }
    softmax(scores, L);
    for (let i = 0; i < dK; i++) {
      let s = 0;
      for (let l = 0; l < L; l++) {
        const v = flat ? values : values[l];
        s += scores[l] * v[(flat ? l * H * dK : 0) + ho + i];
      }
      out[o + ho + i] = s;
    }
    if (weights) {
      weights.set(scores, h * L);
    }
  }
}

/** The table of Section 3.5: PE(pos, 2i) = sin(pos·ω_i), PE(pos, 2i+1) = cos(pos·ω_i). */
function sinusoidalEncoding(maxLen, dModel) {
  const pe = new Float32Array(maxLen * dModel);
  for (let pos = 0; pos < maxLen; pos++) {
    for (let i = 0; i < dModel; i += 2) {
      const angle = pos * Math.exp((-Math.log(10000) * i) / dModel); // pos · ω_i
      pe[pos * dModel + i] = Math.sin(angle);
      pe[pos * dModel + i + 1] = Math.cos(angle);
    }
  }
  return pe;
}
