"use strict";
/* exported greedyDecode, beamSearch, translate, prepareSources, finish, sentencesNamed,
   lengthPenalty */

// Greedy decoding and beam search with the key/value cache (Section 6.1 of the paper, with
// the length penalty of Wu et al., 2016), and translating text: the package's searches
// (transformer.batched_search) step for step, for one sentence at a time, with its forced
// prefix. The search's own arithmetic (sums of log-probabilities, the length penalty, the
// scores) is rounded to float32 with Math.fround, as PyTorch computes it, so that near-ties
// go the same way.
//
// Each search is a generator that yields after every step, so that a worker can stop it
// between two (finish() runs one to its end). Given a `record` object, a search also keeps
// what the page draws of every step: the K hypotheses as the package's BeamStep holds them,
// each entering hypothesis's most probable next tokens and its candidates, the ones kept and
// the ones pruned, and where it looked in the source.
//
// The numbers that the package defines (the extra output length, the decoding defaults,
// the special ids) come from the data that the build writes: none is typed here.

const f32 = Math.fround;
// The fewest next tokens that a record keeps of each hypothesis (more when K is larger).
const RECORDED_TOKENS = 5;

/** Run a search (any generator) to its end: its return value. */
function finish(steps) {
  for (;;) {
    const { done, value } = steps.next();
    if (done) {
      return value;
    }
  }
}

/**
 * The most tokens a source of srcLength ids (with its <eos>) may output, <eos> included:
 * its length + extraLength (the package's EXTRA_LENGTH), or maxLen, within the model's
 * positions.
 */
function outputLimit(model, srcLength, { extraLength, maxLen = null }) {
  if (!Number.isInteger(extraLength)) {
    throw new Error(`extraLength must be an integer, got ${extraLength}`);
  }
  const limit = maxLen === null ? srcLength + extraLength : maxLen;
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

/**
 * At step t, only the prefix's token, where it has one (padding: the search chooses), in
 * each of n rows of V log-probabilities (batched_search.force_prefix).
 */
function forcePrefix(logProbs, V, n, prefix, t, padId) {
  if (!prefix || t >= prefix.length || prefix[t] === padId) {
    return null;
  }
  const forced = prefix[t];
  for (let r = 0; r < n; r++) {
    for (let v = 0; v < V; v++) {
      if (v !== forced) {
        logProbs[r * V + v] = -Infinity;
      }
    }
  }
  return forced;
}

/** A prefix the package accepts: token ids of the vocabulary, without <bos> or <eos>. */
function checkPrefix(prefix, V, { bosId, eosId }) {
  for (const id of prefix ?? []) {
    if (!Number.isInteger(id) || id < 0 || id >= V) {
      throw new Error(`the prefix holds ${id}, not a token id of the model's ${V}`);
    }
    if (id === bosId || id === eosId) {
      throw new Error("the prefix must not hold <bos> or <eos>: the search adds them");
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

/** The k largest of values[offset .. offset + n), best first (the first of equals first). */
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
 * What a record keeps of the rows `active` (the hypotheses that a step extends) before the
 * prefix forces a token: each row's `m` most probable next tokens, [token, log p], and the
 * encoder-decoder attention of its newest position in the top layer, the heads averaged,
 * as row k of a (K, S) array.
 */
function lookedAt(model, step, active, m, weights, K, S) {
  const { V, H } = model;
  const top = active.map((_, n) => topK(step, V, m, n * V).map((v) => [v, step[n * V + v]]));
  const attention = new Float32Array(K * S);
  const cross = weights.cross.at(-1); // (N, H, S)
  active.forEach((k, n) => {
    for (let h = 0; h < H; h++) {
      for (let s = 0; s < S; s++) {
        attention[k * S + s] += cross[(n * H + h) * S + s] / H;
      }
    }
  });
  return { top, attention };
}

/**
 * The most probable next token at each step, for one source (its ids, with their <eos>).
 * ids: {bosId, eosId, padId}; options: {extraLength, maxLen, prefix (token ids the output
 * starts with), record}. Returns the hypothesis; its score is its log p.
 */
function* greedyDecode(model, src, ids, options) {
  const { prefix = null, record = null } = options;
  checkPrefix(prefix, model.V, ids);
  const { V } = model;
  const S = src.length;
  const memory = model.encode(src);
  const limit = outputLimit(model, S, options);
  const cache = model.startDecoder(memory, S, 1);
  if (record) {
    Object.assign(record, { beamSize: 1, alpha: null, limit, steps: [] });
  }
  const row = [];
  let logProb = 0;
  let token = ids.bosId;
  for (let t = 0; t < limit; t++) {
    const weights = record ? {} : null;
    const step = model.decodeStep(cache, [token], null, weights); // (1, V)
    forbidSpecials(step, V, 1, ids);
    const seen = record && lookedAt(model, step, [0], RECORDED_TOKENS, weights, 1, S);
    const forced = forcePrefix(step, V, 1, prefix, t, ids.padId);
    let best = 0;
    for (let v = 1; v < V; v++) {
      if (step[v] > step[best]) {
        best = v; // the first of equals, as torch.max
      }
    }
    token = best;
    row.push(token);
    logProb = f32(logProb + step[best]);
    const ended = token === ids.eosId;
    if (record) {
      record.steps.push({
        tokens: [token],
        parents: [0],
        logProbs: [logProb],
        scores: [logProb],
        ended: [ended],
        lengths: [t + 1],
        entering: [{ top: seen.top[0], forced, candidates: [[token, logProb, logProb, 0]] }],
        attention: seen.attention,
        kept: ended ? 0 : -1,
        stop: ended || t + 1 >= limit,
      });
    }
    yield t;
    if (ended) {
      break;
    }
  }
  return hypothesis(row, logProb, logProb, ids);
}

/**
 * Beam search with the length penalty lp(Y) = ((5 + |Y|) / 6)^α, as the package's
 * batched_beam_search for one sentence: each step extends the K beams by their K most
 * probable tokens each and keeps the K best of those K · K candidates by
 * log p(Y | X) / lp(|Y|); a beam that has ended stays a candidate as it is, and the best
 * ended hypothesis is kept aside. The search stops when no open beam can overtake it.
 * options: {beamSize, alpha, extraLength, maxLen, prefix, record}.
 */
function* beamSearch(model, src, ids, options) {
  const { beamSize: K, alpha, prefix = null, record = null } = options;
  if (!Number.isInteger(K) || K < 1) {
    throw new Error(`beamSize must be an integer of at least 1, got ${K}`);
  }
  if (!(alpha >= 0)) {
    throw new Error(`alpha must be a number >= 0, got ${alpha}`);
  }
  checkPrefix(prefix, model.V, ids);
  const { V } = model;
  const C = Math.min(K, V);
  const S = src.length;
  const memory = model.encode(src);
  const limit = outputLimit(model, S, options);
  const cache = model.startDecoder(memory, S, K);
  const lpLimit = lengthPenalty(limit, alpha);
  if (record) {
    Object.assign(record, { beamSize: K, alpha, limit, lpLimit, steps: [] });
  }
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
    const weights = record ? {} : null;
    const step = model.decodeStep(cache, last, active, weights); // (active, V)
    forbidSpecials(step, V, active.length, ids);
    const m = Math.min(V, Math.max(C, RECORDED_TOKENS));
    const seen = record && lookedAt(model, step, active, m, weights, K, S);
    const forced = forcePrefix(step, V, active.length, prefix, t, ids.padId);
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
    const enteredEnded = ended;
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
    const improved = endedBeam >= 0 && scores[endedBeam] > keptScore;
    if (improved) {
      keptScore = scores[endedBeam];
      keptLogProb = logProb[endedBeam];
      keptRow = rows[endedBeam];
    }
    // Finished when no open beam can overtake the kept one: its log-probability can only
    // fall as it grows, and lp only rise, up to lp(limit).
    let bestOpen = -Infinity;
    for (let k = 0; k < K; k++) {
      if (!ended[k]) {
        bestOpen = Math.max(bestOpen, logProb[k]);
      }
    }
    const stop = keptScore >= f32(bestOpen / lpLimit) || bestOpen === -Infinity;
    if (record) {
      // each entering beam's candidates: [token, log p, score, its rank among the K kept
      // (-1: pruned)]; null for a beam at -inf
      const rank = new Map(best.map((i, r) => [i, r]));
      const entering = Array.from({ length: K }, (_, k) => {
        const n = active.indexOf(k);
        if (n < 0 && !enteredEnded[k]) {
          return null;
        }
        const candidates = [];
        for (let c = 0; c < (enteredEnded[k] ? 1 : C); c++) {
          const i = k * C + c;
          if (candidateLogProb[i] > -Infinity) {
            candidates.push([
              candidateToken[i],
              candidateLogProb[i],
              candidateScore[i],
              rank.get(i) ?? -1,
            ]);
          }
        }
        return { top: n >= 0 ? seen.top[n] : [], forced: n >= 0 ? forced : null, candidates };
      });
      record.steps.push({
        tokens,
        parents,
        logProbs: logProb,
        scores,
        ended,
        lengths: length,
        entering,
        attention: seen.attention,
        kept: improved ? endedBeam : -1,
        bestOpen,
        stop,
      });
    }
    yield t;
    if (stop) {
      break;
    }
  }
  return hypothesis(keptRow.slice(1), keptLogProb, keptScore, ids);
}

/** 'a', 'a and b', 'a, b and c', '… and 3 more' (translation._listed). */
function listed(items, most = 10) {
  if (items.length > most) {
    return `${items.slice(0, most).join(", ")} and ${items.length - most} more`;
  }
  return items.length === 1 ? items[0] : `${items.slice(0, -1).join(", ")} and ${items.at(-1)}`;
}

/** 'sentence 3' or 'sentences 3, 8 and 12' for indices 2, 7, 11 (translation._sentences). */
function sentencesNamed(indices) {
  const noun = indices.length === 1 ? "sentence" : "sentences";
  return `${noun} ${listed(indices.map((i) => String(i + 1)))}`;
}

/**
 * The source ids of `sentences`, as the package's translate_batches makes them: each
 * normalised and encoded, cut to the model's max_len - 1 tokens if longer, then <eos>;
 * null for an empty one. warn(message), if given, is told about the cut ones, in the
 * package's words.
 */
function prepareSources(model, tokenizer, sentences, warn = null) {
  const room = model.maxLen - 1; // source tokens that fit with their <eos>
  const encoded = sentences
    .map((s) => tokenizer.normalize(s))
    .map((text) => (text ? tokenizer.encode(text) : null));
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
  return encoded.map((e) => e && [...e.slice(0, room), tokenizer.eosId]);
}

/**
 * Translations of `sentences`, in their order, as the package's translate: beam search
 * (beamSize 1: greedy decoding), an empty sentence translating to "". warn(message), if
 * given, is told about sources cut to the model's positions and about translations that
 * the length limit stopped before <eos>, in the package's words. Also returns, for each
 * sentence, its source ids and hypothesis (null for an empty one).
 * options: {beamSize, alpha, extraLength, warn, onStep(sentence, t), maxLen (a test's
 * output limit, as decoding's max_len), prefix (token ids every output starts with)}.
 */
function translate(model, tokenizer, sentences, options) {
  const { beamSize, warn = null, onStep = null } = options;
  const ids = { bosId: tokenizer.bosId, eosId: tokenizer.eosId, padId: tokenizer.padId };
  const sources = prepareSources(model, tokenizer, sentences, warn);
  const results = [];
  const cutOff = [];
  sources.forEach((source, i) => {
    if (!source) {
      results.push({ text: "", source: null, hypothesis: null });
      return;
    }
    const steps =
      beamSize === 1
        ? greedyDecode(model, source, ids, options)
        : beamSearch(model, source, ids, options);
    let found;
    for (;;) {
      const { done, value } = steps.next();
      if (done) {
        found = value;
        break;
      }
      onStep?.(i, value);
    }
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
