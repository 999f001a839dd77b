"use strict";
/* global compileRegExp */
/* exported SacreBleu, pythonFixed */

// sacreBLEU's corpus BLEU and chrF (Post, 2018; Popović, 2015), in JavaScript, as the
// Python package computes and prints them, for the page's score of the test set: BLEU with
// the 13a tokenizer, cased, exponential smoothing, no effective order; chrF of character
// n-grams without word n-grams. The settings and the signatures come from the Python
// package, which the build asks (_ext/translator.py); this code refuses any others.
// Strings are counted in code points and split at Python's whitespace, as Python does.

/** Python's f"{x:.{digits}f}": the exact binary value rounded, ties to even. */
function pythonFixed(x, digits) {
  if (!Number.isFinite(x)) {
    return Number.isNaN(x) ? "nan" : x > 0 ? "inf" : "-inf";
  }
  // toFixed(100) writes a double's exact decimal expansion for any value that matters here
  const [whole, fraction] = Math.abs(x).toFixed(100).split(".");
  const kept = whole + fraction.slice(0, digits);
  const rest = fraction.slice(digits);
  const half = "5".padEnd(rest.length, "0");
  const odd = Number(kept.at(-1)) % 2 === 1;
  const up = rest > half || (rest === half && odd);
  let digitsOut = kept;
  if (up) {
    digitsOut = (BigInt(kept) + 1n).toString().padStart(kept.length, "0");
  }
  const cut = digitsOut.length - digits;
  const text = digits > 0 ? `${digitsOut.slice(0, cut)}.${digitsOut.slice(cut)}` : digitsOut;
  return (x < 0 || Object.is(x, -0) ? "-" : "") + text;
}

/** Counts of the n-grams of `items` for n = 1 … order: a Map per order, keyed by text. */
function ngramCounts(items, order, joiner) {
  const counts = [];
  for (let n = 1; n <= order; n++) {
    const map = new Map();
    for (let i = 0; i + n <= items.length; i++) {
      const key = items.slice(i, i + n).join(joiner);
      map.set(key, (map.get(key) ?? 0) + 1);
    }
    counts.push(map);
  }
  return counts;
}

class SacreBleu {
  /**
   * settings, as the build writes them: {bleu: {tokenize, smooth_method, lowercase,
   * effective_order, max_ngram_order, signature}, chrf: {char_order, word_order, beta,
   * lowercase, whitespace, eps_smoothing, signature}, whitespace: Python's whitespace
   * as a pattern (js_regex)}.
   */
  constructor(settings) {
    const { bleu, chrf } = settings;
    const expected = [
      [bleu.tokenize, "13a", "BLEU's tokenizer"],
      [bleu.smooth_method, "exp", "BLEU's smoothing"],
      [bleu.lowercase, false, "BLEU's lowercase"],
      [bleu.effective_order, false, "BLEU's effective order"],
      [chrf.word_order, 0, "chrF's word order"],
      [chrf.lowercase, false, "chrF's lowercase"],
      [chrf.whitespace, false, "chrF's whitespace"],
      [chrf.eps_smoothing, false, "chrF's eps smoothing"],
    ];
    for (const [value, supported, name] of expected) {
      if (value !== supported) {
        throw new Error(`${name} is ${value}: this page computes ${supported} only`);
      }
    }
    this.settings = settings;
    this.whitespace = compileRegExp(settings.whitespace, "g");
    this.trailing = new RegExp(`(?:${settings.whitespace.source})$`, settings.whitespace.flags);
  }

  /** Python's str.split(): the runs between whitespace. */
  split(text) {
    return text.split(this.whitespace).filter(Boolean);
  }

  /** sacreBLEU's 13a tokenizer (mteval-v13a), after rstrip(), as a list of tokens. */
  tokens13a(line) {
    let text = line.replace(this.trailing, "");
    text = text.replaceAll("<skipped>", "").replaceAll("-\n", "").replaceAll("\n", " ");
    if (text.includes("&")) {
      text = text
        .replaceAll("&quot;", '"')
        .replaceAll("&amp;", "&")
        .replaceAll("&lt;", "<")
        .replaceAll("&gt;", ">");
    }
    text = ` ${text} `
      .replace(/([{-~[-` -&(-+:-@/])/g, " $1 ")
      .replace(/([^0-9])([.,])/g, "$1 $2 ")
      .replace(/([.,])([^0-9])/g, " $1 $2")
      .replace(/([0-9])(-)/g, "$1 $2 ");
    return this.split(text);
  }

  /** Corpus BLEU of hypotheses against one reference each, as sacreBLEU's BLEU(). */
  bleu(hypotheses, references) {
    const order = this.settings.bleu.max_ngram_order;
    const correct = new Array(order).fill(0);
    const total = new Array(order).fill(0);
    let sysLen = 0;
    let refLen = 0;
    hypotheses.forEach((hypothesis, i) => {
      const ref = this.tokens13a(references[i]);
      const hyp = this.tokens13a(hypothesis);
      const refCounts = ngramCounts(ref, order, " ");
      const hypCounts = ngramCounts(hyp, order, " ");
      sysLen += hyp.length;
      refLen += ref.length;
      hypCounts.forEach((counts, n) => {
        for (const [ngram, count] of counts) {
          total[n] += count;
          correct[n] += Math.min(count, refCounts[n].get(ngram) ?? 0);
        }
      });
    });
    let bp = 1.0;
    if (sysLen < refLen) {
      bp = sysLen > 0 ? Math.exp(1 - refLen / sysLen) : 0.0;
    }
    const precisions = new Array(order).fill(0.0);
    let score = 0.0;
    if (correct.some(Boolean)) {
      let smooth = 1.0;
      for (let n = 1; n <= order; n++) {
        if (total[n - 1] === 0) {
          break;
        }
        if (correct[n - 1] === 0) {
          smooth *= 2; // exponential smoothing, as mteval-v13a
          precisions[n - 1] = 100 / (smooth * total[n - 1]);
        } else {
          precisions[n - 1] = (100 * correct[n - 1]) / total[n - 1];
        }
      }
      let logs = 0; // summed left to right, as Python's sum()
      for (const p of precisions) {
        logs += p === 0 ? -9999999999 : Math.log(p);
      }
      score = bp * Math.exp(logs / order);
    }
    const ratio = refLen ? sysLen / refLen : 0;
    const text =
      `BLEU = ${pythonFixed(score, 2)} ${precisions.map((p) => pythonFixed(p, 1)).join("/")}` +
      ` (BP = ${pythonFixed(bp, 3)} ratio = ${pythonFixed(ratio, 3)} hyp_len = ${sysLen}` +
      ` ref_len = ${refLen})`;
    return { score, precisions, bp, ratio, sysLen, refLen, text };
  }

  /** chrF's statistics of one hypothesis: [hyp, ref, match] counts per n-gram order. */
  chrfStatistics(hypothesis, reference) {
    const order = this.settings.chrf.char_order;
    const characters = (text) => Array.from(this.split(text).join(""));
    const hyp = ngramCounts(characters(hypothesis), order, "");
    const ref = ngramCounts(characters(reference), order, "");
    const statistics = [];
    for (let n = 0; n < order; n++) {
      let hypCount = 0;
      let matches = 0;
      for (const [ngram, count] of hyp[n]) {
        hypCount += count;
        matches += Math.min(count, ref[n].get(ngram) ?? 0);
      }
      let refCount = 0;
      for (const count of ref[n].values()) {
        refCount += count;
      }
      statistics.push(ref[n].size ? hypCount : 0, refCount, matches);
    }
    return statistics;
  }

  /** chrF's F-score of summed statistics (sacreBLEU's _compute_f_score, eps_smoothing off). */
  chrfScore(statistics) {
    const { beta, char_order: order } = this.settings.chrf;
    const factor = beta ** 2;
    let effectiveOrder = 0;
    let precision = 0.0;
    let recall = 0.0;
    for (let i = 0; i < order; i++) {
      const [nHyp, nRef, nMatch] = statistics.slice(3 * i, 3 * i + 3);
      const p = nHyp > 0 ? nMatch / nHyp : 1e-16;
      const r = nRef > 0 ? nMatch / nRef : 1e-16;
      if (nHyp > 0 && nRef > 0) {
        precision += p;
        recall += r;
        effectiveOrder += 1;
      }
    }
    if (effectiveOrder === 0) {
      precision = recall = 0.0;
    } else {
      precision /= effectiveOrder;
      recall /= effectiveOrder;
    }
    if (precision + recall) {
      let score = (1 + factor) * precision * recall;
      score /= factor * precision + recall;
      return 100 * score;
    }
    return 0.0;
  }

  /** Corpus chrF, and each sentence's own, as sacreBLEU's CHRF(). */
  chrf(hypotheses, references) {
    const sentences = hypotheses.map((h, i) => this.chrfStatistics(h, references[i]));
    const summed = sentences.reduce((a, b) => a.map((x, i) => x + b[i]));
    const score = this.chrfScore(summed);
    const name = `chrF${this.settings.chrf.beta}`;
    return {
      score,
      text: `${name} = ${pythonFixed(score, 2)}`,
      sentences: sentences.map((s) => this.chrfScore(s)),
    };
  }
}
