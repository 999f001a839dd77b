"use strict";
/* exported greedyDecode, beamSearch, translate, EXTRA_LENGTH */

// Greedy decoding and beam search with the key/value cache (Section 6.1 of the paper, with
// the length penalty of Wu et al., 2016), and translating text: transformer.decode, step for
// step, for one sentence at a time. The search's own arithmetic (sums of log-probabilities,
// the length penalty, the scores) is rounded to float32 with Math.fround, as PyTorch
// computes it, so that near-ties go the same way.

const f32 = Math.fround;
const EXTRA_LENGTH = 50; // "maximum output length ... input length + 50" (Section 6.1)

/** The most tokens a source of srcLength ids (with its <eos>) may output, <eos> included. */
function outputLimit(model, srcLength, maxLen = null) {
  const limit = maxLen === null ? srcLength + EXTRA_LENGTH : maxLen;
  return Math.min(limit, model.maxLen);
}

/** lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the final <eos>, in float32. */
function lengthPenalty(length, alpha) {
  return f32(f32(f32(5 + length) / 6) ** f32(alpha));
}

/** Padding and <bos> (unless it doubles as <eos>) are never outputs. */
function forbidSpecials(logProbs, V, n, { bosId, eosId, padId }) {
  for (let r = 0; r < n; r++) {
    logProbs[r * V + padId] = -Infinity;
    if (bosId !== eosId) {
      logProbs[r * V + bosId] = -Infinity;
    }
  }
}

/** The output of a decoded row (without its <bos>): the tokens before <eos> or padding. */
function hypothesis(row, logProb, score, { eosId, padId }) {
  const ended = row.includes(eosId);
  let tokens = row;
  for (const stop of [eosId, padId]) {
    if (tokens.includes(stop)) {
      tokens = tokens.slice(0, tokens.indexOf(stop));
    }
  }
  return { tokens, logProb, score, ended };
}

/**
 * The most probable next token at each step. src: the source ids, with their <eos>.
 * ids: {bosId, eosId, padId}; onStep(t, limit), if given, sees each step.
 */
function greedyDecode(model, src, ids, { maxLen = null, onStep = null } = {}) {
  const memory = model.encode(src);
  const limit = outputLimit(model, src.length, maxLen);
  const cache = model.startDecoder(memory, src.length, 1);
  const row = [];
  let logProb = 0;
  let token = ids.bosId;
  for (let t = 0; t < limit; t++) {
    const step = model.decodeStep(cache, [token]); // (1, V)
    forbidSpecials(step, model.V, 1, ids);
    let best = 0;
    for (let v = 1; v < model.V; v++) {
      if (step[v] > step[best]) {
        best = v; // the first of equals, as torch.max
      }
    }
    token = best;
    row.push(token);
    logProb = f32(logProb + step[best]);
    if (onStep) {
      onStep(t, limit);
    }
    if (token === ids.eosId) {
      break;
    }
  }
  return hypothesis(row, logProb, logProb, ids);
}

/** The k largest of values[0 .. n), best first (the first of equals first): indices. */
function topK(values, n, k, offset = 0) {
  const order = [];
  for (let i = 0; i < n; i++) {
    const value = values[offset + i];
    let at = order.length;
    while (at > 0 && values[offset + order[at - 1]] < value) {
      at -= 1;
    }
    if (at < k) {
      order.splice(at, 0, i);
      if (order.length > k) {
        order.pop();
      }
    }
  }
  return order;
}

/**
 * Beam search with the length penalty lp(Y) = ((5 + |Y|) / 6)^α, as
 * transformer.decode.beam_search: each step extends the K beams by their K most probable
 * tokens each and keeps the K best of those K · K candidates by log p(Y | X) / lp(|Y|); a
 * beam that has ended stays a candidate as it is. The search stops when no open beam can
 * overtake the best ended one. onStep(t, limit), if given, sees each step.
 */
function beamSearch(
  model,
  src,
  ids,
  { beamSize = 4, alpha = 0.6, maxLen = null, onStep = null } = {},
) {
  const K = beamSize;
  const { V } = model;
  const C = Math.min(K, V);
  const memory = model.encode(src);
  const limit = outputLimit(model, src.length, maxLen);
  const cache = model.startDecoder(memory, src.length, K);
  // At the start the K beams would be K copies of <bos>: keep one, the others at -inf.
  let rows = Array.from({ length: K }, () => [ids.bosId]);
  let logProb = Array.from({ length: K }, (_, k) => (k === 0 ? 0 : -Infinity));
  let length = new Array(K).fill(0);
  let ended = new Array(K).fill(false);
  // The best ended hypothesis so far: a beam pushed out of the K by open ones must not be
  // lost with it.
  let keptScore = -Infinity;
  let keptLogProb = -Infinity;
  let keptRow = null;
  const lpLimit = lengthPenalty(limit, alpha);
  for (let t = 0; t < limit; t++) {
    // Only the beams that can still grow: an ended beam's one continuation is padding, and
    // a beam at -inf has none.
    const active = [];
    for (let k = 0; k < K; k++) {
      if (!ended[k] && logProb[k] > -Infinity) {
        active.push(k);
      }
    }
    const last = rows.map((row) => row[row.length - 1]);
    const step = model.decodeStep(cache, last, active); // (active, V)
    forbidSpecials(step, V, active.length, ids);
    // The K · C candidates: each open beam's C most probable tokens; an ended beam's
    // padding, which leaves its log-probability alone; -inf for the rest.
    const candidateLogProb = new Float64Array(K * C).fill(-Infinity);
    const candidateToken = new Array(K * C).fill(ids.padId);
    const candidateScore = new Float64Array(K * C).fill(-Infinity);
    for (let k = 0; k < K; k++) {
      const lp = lengthPenalty(ended[k] ? length[k] : t + 1, alpha);
      if (ended[k]) {
        candidateLogProb[k * C] = logProb[k];
      }
      const n = active.indexOf(k);
      if (n >= 0) {
        for (const [c, v] of topK(step, V, C, n * V).entries()) {
          candidateLogProb[k * C + c] = f32(logProb[k] + step[n * V + v]);
          candidateToken[k * C + c] = v;
        }
      }
      for (let c = 0; c < C; c++) {
        candidateScore[k * C + c] = f32(candidateLogProb[k * C + c] / lp);
      }
    }
    const best = topK(candidateScore, K * C, K);
    const parents = best.map((i) => Math.floor(i / C));
    const tokens = best.map((i) => candidateToken[i]);
    const scores = best.map((i) => candidateScore[i]);
    logProb = best.map((i) => candidateLogProb[i]);
    length = parents.map((p) => (ended[p] ? length[p] : t + 1));
    ended = parents.map((p, k) => ended[p] || tokens[k] === ids.eosId || t + 1 >= limit);
    // Every beam continues the row of its parent.
    rows = parents.map((p, k) => [...rows[p], tokens[k]]);
    model.reorder(cache, parents);
    // Keep the best ended beam if it beats the one kept so far.
    let endedBeam = -1;
    for (let k = 0; k < K; k++) {
      if (ended[k] && (endedBeam < 0 || scores[k] > scores[endedBeam])) {
        endedBeam = k;
      }
    }
    if (endedBeam >= 0 && scores[endedBeam] > keptScore) {
      keptScore = scores[endedBeam];
      keptLogProb = logProb[endedBeam];
      keptRow = rows[endedBeam];
    }
    if (onStep) {
      onStep(t, limit);
    }
    // Finished when no open beam can overtake the kept one: its log-probability can only
    // fall as it grows, and lp only rise, up to lp(limit).
    let bestOpen = -Infinity;
    for (let k = 0; k < K; k++) {
      if (!ended[k]) {
        bestOpen = Math.max(bestOpen, logProb[k]);
      }
    }
    if (keptScore >= f32(bestOpen / lpLimit) || bestOpen === -Infinity) {
      break;
    }
  }
  return hypothesis(keptRow.slice(1), keptLogProb, keptScore, ids);
}

/** 'a', 'a and b', 'a, b and c', '… and 3 more' (decode._listed). */
function listed(items, most = 10) {
  if (items.length > most) {
    return `${items.slice(0, most).join(", ")} and ${items.length - most} more`;
  }
  return items.length === 1 ? items[0] : `${items.slice(0, -1).join(", ")} and ${items.at(-1)}`;
}

/** 'sentence 3' or 'sentences 3, 8 and 12' for indices 2, 7, 11 (decode._sentences). */
function sentencesNamed(indices) {
  const noun = indices.length === 1 ? "sentence" : "sentences";
  return `${noun} ${listed(indices.map((i) => String(i + 1)))}`;
}

/**
 * Translations of `sentences`, in their order, as transformer.decode.translate: beam
 * search (beamSize 1: greedy decoding), an empty sentence translating to "". A source
 * longer than the model's positions is cut to its first max_len - 1 tokens, then <eos>;
 * warn(message), if given, is told about those and about translations that the length
 * limit stopped before <eos>, in the package's words. Also returns, for each sentence, its
 * source ids and hypothesis (null for an empty one).
 * options: {beamSize, alpha, warn, onStep(sentence, t, limit), maxLen (a test's output
 * limit, as decoding's max_len)}.
 */
function translate(model, tokenizer, sentences, options = {}) {
  const { beamSize = 4, alpha = 0.6, warn = null, onStep = null, maxLen = null } = options;
  const ids = { bosId: tokenizer.bosId, eosId: tokenizer.eosId, padId: tokenizer.padId };
  const texts = sentences.map((s) => tokenizer.normalize(s));
  const room = model.maxLen - 1; // source tokens that fit with their <eos>
  const encoded = texts.map((text) => (text ? tokenizer.encode(text) : null));
  const tooLong = [];
  encoded.forEach((e, i) => {
    if (e && e.length + 1 > model.maxLen) {
      tooLong.push(i);
    }
  });
  if (tooLong.length && warn) {
    const sizes = listed(tooLong.map((i) => String(encoded[i].length + 1)));
    warn(
      `${sentencesNamed(tooLong)}: ${sizes} tokens with <eos>, more than the model's` +
        ` ${model.maxLen} positions: translating the first ${room}`,
    );
  }
  const results = [];
  const cutOff = [];
  encoded.forEach((e, i) => {
    if (!e) {
      results.push({ text: "", source: null, hypothesis: null });
      return;
    }
    const source = [...e.slice(0, room), ids.eosId];
    const search = { maxLen, onStep: onStep && ((t, limit) => onStep(i, t, limit)) };
    const found =
      beamSize === 1
        ? greedyDecode(model, source, ids, search)
        : beamSearch(model, source, ids, { ...search, beamSize, alpha });
    if (!found.ended) {
      cutOff.push(i);
    }
    results.push({ text: tokenizer.decode(found.tokens), source, hypothesis: found });
  });
  if (cutOff.length && warn) {
    warn(`${sentencesNamed(cutOff)}: the translation stopped at the length limit, before <eos>`);
  }
  return results;
}
