"use strict";
/* exported SpacyTokenizer, compileRegExp */

// spaCy's rule-based tokenizer, `spacy.blank(language).tokenizer`, ported from its source
// (spacy/tokenizer.pyx) so that the page cuts a sentence into the words the model was
// trained on. The rules are spaCy's own, exported when the book is built
// (_ext/translator.py): the special cases ("z.B.", "aujourd'hui"), the prefix, suffix and
// infix patterns, the token and URL matchers, all converted from Python's regular
// expressions by _ext/js_regex.py.

/** A RegExp from the {source, flags} that _ext/js_regex.py wrote, or null for none. */
function compileRegExp(pattern, extraFlags = "") {
  return pattern ? new RegExp(pattern.source, pattern.flags + extraFlags) : null;
}

// A key that no token text can be: marks the end of a phrase in the matcher's trie.
const PHRASE_END = Symbol("end of phrase");

class SpacyTokenizer {
  /**
   * rules: {specials: {text: [token texts]}, patterns: [[token texts]], prefix, suffix,
   * infix (with non_empty), token_match, url_match, whitespace}, each pattern a
   * {source, flags} or null.
   */
  constructor(rules) {
    this.specials = new Map(Object.entries(rules.specials));
    this.prefix = compileRegExp(rules.prefix); // Python's prefix_search: re.search
    this.suffix = compileRegExp(rules.suffix); // suffix_search: re.search
    // infix_finditer: re.finditer, emulated in findInfixes with "g" and "y" (sticky)
    this.infix = compileRegExp(rules.infix, "g");
    this.infixNonEmpty = rules.infix
      ? new RegExp(rules.infix.non_empty, rules.infix.flags + "y")
      : null;
    // token_match and url_match: re.match, anchored at the start ("y")
    this.tokenMatch = compileRegExp(rules.token_match, "y");
    this.urlMatch = compileRegExp(rules.url_match, "y");
    this.space = new RegExp(`^(?:${rules.whitespace.source})$`, rules.whitespace.flags);
    // The special cases that contain an affix, as the token texts that the affix rules
    // alone give them (spaCy's _special_matcher, a PhraseMatcher): a trie of Maps.
    this.phrases = new Map();
    for (const pattern of rules.patterns) {
      let node = this.phrases;
      for (const text of pattern) {
        if (!node.has(text)) {
          node.set(text, new Map());
        }
        node = node.get(text);
      }
      node.set(PHRASE_END, true);
    }
  }

  /** The tokens of `text`: [{text, space}], space true if a space follows the token. */
  tokenize(text) {
    const tokens = this.tokenizeAffixes(text);
    return this.applySpecialCases(text, tokens);
  }

  // Tokenizer._tokenize_affixes: split at whitespace, each run of non-space characters
  // (and each run of spaces, less the single space that separates two words) through
  // the affix rules. `text` is scanned by UTF-16 unit: no whitespace character is astral.
  tokenizeAffixes(text) {
    const tokens = [];
    if (!text) {
      return tokens;
    }
    let start = 0;
    let inSpace = this.space.test(text[0]);
    for (let i = 0; i < text.length; i++) {
      const c = text[i];
      if (this.space.test(c) !== inSpace) {
        if (start < i) {
          this.tokenizeSpan(text.slice(start, i), tokens);
        }
        if (c === " ") {
          tokens[tokens.length - 1].space = true;
          start = i + 1;
        } else {
          start = i;
        }
        inSpace = !inSpace;
      }
    }
    if (start < text.length) {
      this.tokenizeSpan(text.slice(start), tokens);
      tokens[tokens.length - 1].space = text[text.length - 1] === " " && !inSpace;
    }
    return tokens;
  }

  pushSpecial(text, tokens) {
    for (const piece of this.specials.get(text)) {
      tokens.push({ text: piece, space: false });
    }
  }

  // Tokenizer._tokenize: a special case as a whole, or prefixes, a middle and suffixes.
  // (spaCy also caches each span's tokens; the cache never changes them.)
  tokenizeSpan(span, tokens) {
    if (this.specials.has(span)) {
      this.pushSpecial(span, tokens);
      return;
    }
    const prefixes = [];
    const suffixes = [];
    const middle = this.splitAffixes(span, prefixes, suffixes);
    this.attachTokens(middle, prefixes, suffixes, tokens);
  }

  findPrefix(string) {
    const match = this.prefix && this.prefix.exec(string);
    return match ? match[0].length : 0;
  }

  findSuffix(string) {
    const match = this.suffix && this.suffix.exec(string);
    return match ? match[0].length : 0;
  }

  matches(regex, string) {
    if (!regex) {
      return false;
    }
    regex.lastIndex = 0;
    return regex.test(string); // a match, even an empty one, counts (as in Python)
  }

  // Tokenizer._split_affixes: peel prefixes and suffixes off, one of each per round,
  // until none is left or what is left is a special case or a token_match.
  splitAffixes(string, prefixes, suffixes) {
    let lastSize = 0;
    while (string && string.length !== lastSize) {
      if (this.matches(this.tokenMatch, string) || this.specials.has(string)) {
        break;
      }
      lastSize = string.length;
      const preLen = this.findPrefix(string);
      let prefix = "";
      let minusPre = "";
      if (preLen !== 0) {
        prefix = string.slice(0, preLen);
        minusPre = string.slice(preLen);
        if (minusPre && this.specials.has(minusPre)) {
          prefixes.push(prefix);
          return minusPre;
        }
      }
      const sufLen = this.findSuffix(string.slice(preLen));
      let suffix = "";
      let minusSuf = "";
      if (sufLen !== 0) {
        suffix = string.slice(string.length - sufLen);
        minusSuf = string.slice(0, string.length - sufLen);
        if (minusSuf && this.specials.has(minusSuf)) {
          suffixes.push(suffix);
          return minusSuf;
        }
      }
      if (preLen && sufLen && preLen + sufLen <= string.length) {
        string = string.slice(preLen, string.length - sufLen);
        prefixes.push(prefix);
        suffixes.push(suffix);
      } else if (preLen) {
        string = minusPre;
        prefixes.push(prefix);
      } else if (sufLen) {
        string = minusSuf;
        suffixes.push(suffix);
      }
    }
    return string;
  }

  // Python's finditer: after an empty match, a non-empty one may still start at the same
  // position; JavaScript's matchAll would move on a character. [[start, end]] in units.
  findInfixes(string) {
    const found = [];
    if (!this.infix) {
      return found;
    }
    let position = 0;
    let afterEmpty = false;
    while (position <= string.length) {
      let match = null;
      if (afterEmpty) {
        this.infixNonEmpty.lastIndex = position;
        match = this.infixNonEmpty.exec(string);
        if (!match) {
          // on to the next code point
          position += string.codePointAt(position) > 0xffff ? 2 : 1;
          afterEmpty = false;
          if (position > string.length) {
            break;
          }
        }
      }
      if (!match) {
        this.infix.lastIndex = position;
        match = this.infix.exec(string);
        if (!match) {
          break;
        }
      }
      const start = match.index;
      const end = start + match[0].length;
      found.push([start, end]);
      afterEmpty = start === end;
      position = end;
    }
    return found;
  }

  // Tokenizer._attach_tokens: the prefixes, the middle (a special case, a token or URL
  // match, or cut at its infixes), then the suffixes in the reverse order of their removal.
  attachTokens(string, prefixes, suffixes, tokens) {
    const push = (text) => tokens.push({ text, space: false });
    prefixes.forEach(push);
    if (string) {
      if (this.specials.has(string)) {
        this.pushSpecial(string, tokens);
      } else if (this.matches(this.tokenMatch, string) || this.matches(this.urlMatch, string)) {
        push(string);
      } else {
        const infixes = this.findInfixes(string);
        if (!infixes.length) {
          push(string);
        } else {
          let start = 0;
          for (const [infixStart, infixEnd] of infixes) {
            if (infixStart === 0) {
              continue; // an infix at the very start splits nothing off
            }
            if (infixStart !== start) {
              push(string.slice(start, infixStart));
            }
            if (infixStart !== infixEnd) {
              push(string.slice(infixStart, infixEnd));
            }
            start = infixEnd;
          }
          if (start < string.length) {
            push(string.slice(start));
          }
        }
      }
    }
    suffixes.reverse().forEach(push);
  }

  // Tokenizer._apply_special_cases: special cases that the affix rules had cut apart
  // ("z.B." read as "z.B" + "."), found by their pieces and put back together. Where
  // matches overlap, the longest wins, then the first.
  applySpecialCases(text, tokens) {
    const spans = [];
    for (let start = 0; start < tokens.length; start++) {
      let node = this.phrases.get(tokens[start].text);
      let end = start + 1;
      while (node) {
        if (node.has(PHRASE_END)) {
          spans.push([start, end]);
        }
        if (end >= tokens.length) {
          break;
        }
        node = node.get(tokens[end].text);
        end += 1;
      }
    }
    if (!spans.length) {
      return tokens;
    }
    spans.sort((a, b) => b[1] - b[0] - (a[1] - a[0]) || a[0] - b[0]);
    const seen = new Set();
    const kept = new Map(); // start -> end
    for (const [start, end] of spans) {
      if (!seen.has(start) && !seen.has(end - 1)) {
        kept.set(start, end);
      }
      for (let i = start; i < end; i++) {
        seen.add(i);
      }
    }
    const out = [];
    for (let i = 0; i < tokens.length;) {
      const end = kept.get(i);
      if (end === undefined) {
        out.push(tokens[i]);
        i += 1;
        continue;
      }
      // The span's text, with the spaces between its tokens: a match across a space is
      // no special case.
      let spanText = "";
      for (let j = i; j < end; j++) {
        spanText += tokens[j].text + (tokens[j].space && j < end - 1 ? " " : "");
      }
      if (this.specials.has(spanText)) {
        const pieces = this.specials.get(spanText);
        pieces.forEach((piece, k) =>
          out.push({ text: piece, space: k === pieces.length - 1 ? tokens[end - 1].space : false }),
        );
      } else {
        out.push(...tokens.slice(i, end));
      }
      i = end;
    }
    return out;
  }
}
