"""`transformer.spacy_french.french_tokenizer` cuts the same words as
`spacy.blank("fr")`, and builds without compiling spaCy's 1.45 MB
pattern."""

import gzip
import itertools
import json
import pickle
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import spacy
from spacy.tokenizer import Tokenizer
from spacy.vocab import Vocab

from transformer import spacy_french
from transformer.spacy_french import french_tokenizer, regroup
from transformer.tokenizer import normalize

ROOT = Path(__file__).resolve().parents[1]
MULTI30K = ROOT / "data" / "multi30k"
SPLITS = ("train", "val", "test_2016_flickr")


@pytest.fixture(scope="module")
def spacy_fr() -> Tokenizer:
    """The reference: spaCy's own, seconds to build."""
    return spacy.blank("fr").tokenizer


@pytest.fixture(scope="module")
def ours() -> Tokenizer:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no falling back to spaCy's
        return french_tokenizer()


def words(tokenizer: Tokenizer, text: str) -> list[tuple[str, str]]:
    """Each word with the space after it: what `pretokenize` reads."""
    return [(t.text, t.whitespace_) for t in tokenizer(text)]


def differences(
    ours: Tokenizer, spacy_fr: Tokenizer, texts: dict[str, str]
) -> list[str]:
    """One line for each named text whose words differ."""
    lines = []
    for name, text in texts.items():
        mine, theirs = words(ours, text), words(spacy_fr, text)
        if mine != theirs:
            lines.append(
                f"{name}: {text!r}\n  ours:  {[w for w, _ in mine]}"
                f"\n  spaCy: {[w for w, _ in theirs]}"
            )
    return lines


def test_same_rules_as_spacy(ours: Tokenizer, spacy_fr: Tokenizer) -> None:
    # all but token_match are spaCy's own, compared as data
    assert ours.rules == spacy_fr.rules
    for name in ("prefix_search", "suffix_search", "infix_finditer"):
        mine, theirs = getattr(ours, name), getattr(spacy_fr, name)
        assert mine.__self__.pattern == theirs.__self__.pattern, name
    assert ours.url_match == spacy_fr.url_match
    assert ours.faster_heuristics == spacy_fr.faster_heuristics


@pytest.mark.parametrize(
    "split",
    [pytest.param(s, marks=[pytest.mark.slow] * (s == "train")) for s in SPLITS],
)
def test_multi30k_same_words(split: str, ours: Tokenizer, spacy_fr: Tokenizer) -> None:
    path = MULTI30K / f"{split}.fr.gz"
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        sentences = [line.rstrip("\n") for line in lines]
    assert len(sentences) >= 1_000
    texts = {}
    for n, sentence in enumerate(sentences, 1):
        texts[f"{path.name} line {n}"] = sentence
        texts[f"{path.name} line {n}, normalised"] = normalize(sentence)
    wrong = differences(ours, spacy_fr, texts)
    assert not wrong, f"{len(wrong)} sentences differ:\n" + "\n".join(wrong[:20])


HARD_CASES = [
    # elisions
    "l'homme",
    "L'homme qu'il a vu jusqu'à aujourd'hui",
    "presqu'île",
    "d'accord, s'il te plaît, n'importe qu'elle",
    "l’homme qu’il aujourd’hui",  # typographic apostrophe
    "entr'ouvert, prud'homme, grand'mère, ch'tiis",
    "L'HOMME QU'IL A VU AUJOURD'HUI",
    "Aujourd'hui, AUJOURD'HUI, aujourd'Hui, Aujourd’hui",
    # hyphenated compounds
    "peut-être, c'est-à-dire, grand-mère, Saint-Étienne",
    "a-t-il, va-t-on, A-t-elle, est-ce, Est-ce, qu'est-ce, N'est-ce",
    "s'est-il, S'EST-IL, est-il, EST-IL, sera-t-il, y a-t-il",
    "Qu'est-ce que c'est ?",
    "après-midi, l'après-midi, au-delà, celui-ci, elle-même, rendez-vous",
    "anti-inflammatoire, Anti-Inflammatoire, ANTI-INFLAMMATOIRE",
    "saut-de-ski, pet-en-l'air, arc-en-ciel, Hôtel-Dieu, vis-à-vis",
    "New-York, États-Unis, etats-unis, hip-hop, week-end, porte-avions",
    "Jean-Pierre, Marie-Claire, ex-mari, non-fumeur, demi-heure",
    "auto–école, anti—bruit, grand‐mère, Saint‑Denis",  # other hyphens
    "(anti-bruit) «grand-mère» « Saint-Étienne »",
    "-t-il -il - -- ---",
    # numbers
    "1,5 ; 10.000 ; 3-4 ; 1 500 ; 12h30 ; 3,5% ; 20°C. ; 2e ; 1er ; +33",
    "10km, 5 €, 5€, €5, 1/2, 3x4, 2.5.1, 1-2-3, n°5, N°5",
    # URLs and e-mail addresses
    "https://www.exemple.fr/chemin?x=1&y=2#haut",
    "Voir www.exemple.com, ou exemple.fr. Écrire à jean.dupont@exemple.fr.",
    "http://127.0.0.1:8080/, ftp://fichiers.exemple.org/a-b/c'd",
    # abbreviations
    "M. Dupont, Mme Martin, Mme. Durand, Mlle. Petit, Dr. Roux, MM.",
    "etc. av. J.-C. apr. J.-C. cf. pp. No. Vol. St. Ste. janv. déc.",
    "Il est né en 52 av. J.-C., etc.",
    # spaces and other characters
    "deux  espaces\tune tabulation\nune ligne\u00a0insécable ",
    " ",
    "",
    "...",
    "Bon-jour!! Quoi?! «Oui»… — non.",
    "Ça va ? L'Œuvre, l'Ère, L’ÎLE, à-côté, À-CÔTÉ",
]


def test_hard_cases(ours: Tokenizer, spacy_fr: Tokenizer) -> None:
    texts = {f"hard case {i}": t for i, t in enumerate(HARD_CASES)}
    texts.update(
        (f"hard case {i}, normalised", normalize(t)) for i, t in enumerate(HARD_CASES)
    )
    wrong = differences(ours, spacy_fr, texts)
    assert not wrong, "\n".join(wrong)


def test_hard_cases_words(ours: Tokenizer) -> None:
    # a few words spelt out, so that agreeing with spaCy is not all
    def cut(text: str) -> list[str]:
        return [w for w, _ in words(ours, text)]

    assert cut("l'homme") == ["l'", "homme"]
    assert cut("aujourd'hui") == ["aujourd'hui"]
    # spaCy's special cases are case-sensitive ("aujourd'hui" and
    # "Aujourd'hui" only), its token_match is not
    assert cut("AUJOURD'HUI") == ["AUJOURD'", "HUI"]
    assert cut("a-t-il") == ["a", "-t", "-il"]
    assert cut("anti-inflammatoire") == ["anti-inflammatoire"]
    assert cut("ANTI-INFLAMMATOIRE") == ["ANTI-INFLAMMATOIRE"]
    assert cut("av. J.-C.") == ["av.", "J.", "-C."]


def _samples(pattern: str, count: int, rng: random.Random) -> list[str]:
    """Random strings that the regular expression `pattern` is likely to
    match (assertions are not honoured)."""
    # re's parser is private; it spares this test a parser of its own
    from re import _constants as c
    from re import _parser

    def one_of(items: list) -> str:
        kind, value = rng.choice(items)
        if kind is c.LITERAL:
            return chr(value)
        if kind is c.RANGE:
            return chr(rng.randint(*value))
        if kind is c.NEGATE:
            return ""
        return rng.choice("aZé9-'_")  # a category such as \w or \d

    def emit(parsed) -> str:
        out = []
        for op, av in parsed:
            if op is c.LITERAL:
                out.append(chr(av))
            elif op is c.NOT_LITERAL or op is c.ANY:
                out.append(rng.choice("xÉ-'."))
            elif op is c.IN:
                out.append(one_of(av))
            elif op is c.BRANCH:
                out.append(emit(rng.choice(av[1])))
            elif op is c.SUBPATTERN:
                out.append(emit(av[3]))
            elif op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
                low, high, item = av
                times = rng.randint(low, min(high, low + 4))
                out.extend(emit(item) for _ in range(times))
        return "".join(out)

    parsed = _parser.parse(pattern)
    return [emit(parsed) for _ in range(count)]


def _mutations(text: str, rng: random.Random) -> list[str]:
    """`text`, its case variants and near misses."""
    hyphens, elisions = "-–—‐‑", "'’"
    swapped = "".join(
        rng.choice(hyphens)
        if ch in hyphens
        else rng.choice(elisions)
        if ch in elisions
        else ch
        for ch in text
    )
    cut = rng.randrange(len(text) + 1)
    return [
        text,
        text.upper(),
        text.title(),
        text.swapcase(),
        swapped,
        text[:cut],
        text[cut:],
        text + rng.choice(["-", "'", ".", "s", "É", "9", "-t-il", "\n"]),
        rng.choice(["-", "'", "l'", "(", "«", "anti-"]) + text,
    ]


def _spacy_french_patterns() -> list[str]:
    """The alternatives of spaCy's `token_match` (imported by the
    reference fixture already)."""
    from spacy.lang.fr import tokenizer_exceptions

    return list(tokenizer_exceptions._regular_exp)


def test_token_match_agrees(ours: Tokenizer, spacy_fr: Tokenizer) -> None:
    rng = random.Random(40)
    strings = set()
    for pattern in _spacy_french_patterns():
        for sample in _samples(pattern, 8, rng):
            strings.update(_mutations(sample, rng))
    strings.update(_mutations(rule, rng)[0] for rule in spacy_fr.rules)
    matched = 0
    for string in sorted(strings):
        theirs = bool(spacy_fr.token_match(string))
        assert bool(ours.token_match(string)) == theirs, repr(string)
        matched += theirs
    # the samples reach both answers often
    print(f"{len(strings)} strings, {matched} matched")
    assert matched > 2_000 and len(strings) - matched > 2_000


def test_fuzz_sentences(ours: Tokenizer, spacy_fr: Tokenizer) -> None:
    # sentences of French special cases, strings the token_match patterns
    # accept, Multi30k words, numbers, URLs, glued with punctuation
    rng = random.Random(4040)
    with gzip.open(MULTI30K / "val.fr.gz", "rt", encoding="utf-8") as f:
        corpus = f.read().split()
    pieces = list(spacy_fr.rules) + corpus
    for pattern in _spacy_french_patterns():
        pieces += _samples(pattern, 3, rng)
    pieces += ["1,5", "10.000", "3-4", "www.a-b.fr", "x@y.fr", "J.-C."]
    glue = [" ", " ", " ", "", "-", "'", "’", ",", ".", "...", "(", ")"]
    glue += ["«", "»", '"', "!", "?", ";", ":", "/", "–", "—", "\u00a0"]
    texts = {}
    for n in range(5_000):
        parts = []
        for _ in range(rng.randint(1, 8)):
            piece = rng.choice(pieces)
            piece = rng.choice(
                [piece, piece, piece.upper(), piece.title(), piece.lower()]
            )
            parts += [piece, rng.choice(glue)]
        texts[f"fuzz sentence {n} (seed 4040)"] = "".join(parts)
    wrong = differences(ours, spacy_fr, texts)
    assert not wrong, "\n".join(wrong[:20])


@pytest.mark.slow  # a fresh process imports spaCy
def test_build_skips_the_slow_compile(tmp_path: Path) -> None:
    # In a fresh process: which patterns building compiles, and whether
    # spacy.lang.fr (whose import compiles the 1.45 MB one) was imported.
    script = """
import json, re, sys, warnings
compiled = []
compile = re.compile
def spy(pattern, flags=0):
    compiled.append(len(pattern))
    return compile(pattern, flags)
re.compile = spy
warnings.simplefilter("error")
from transformer import spacy_french
tokenizer = spacy_french.french_tokenizer()
print(json.dumps({
    "largest": max(compiled),
    "token_match": len(tokenizer.token_match.__self__.pattern),
    "imported": sorted(m for m in sys.modules if m.startswith("spacy.lang.")),
}))
"""
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(done.stdout.splitlines()[-1])
    assert not any(m.startswith("spacy.lang.fr") for m in report["imported"])
    assert report["largest"] < 100_000, report
    assert report["token_match"] < 100_000, report


def test_regrouped_pattern_is_small() -> None:
    from spacy.lang.fr.tokenizer_exceptions import TOKEN_MATCH

    pattern = TOKEN_MATCH.__self__.pattern
    shorter = regroup(pattern)
    assert len(pattern) > 1_000_000
    assert len(shorter) < 25_000
    big = re.compile(rf"\[[^\]]{{{spacy_french.BIG_CLASS},}}\]")
    assert len(big.findall(pattern)) > 400
    assert len(big.findall(shorter)) <= 8


SMALL = [
    # (alternatives, whether regroup writes "[xyz]" once only)
    (["^ab[xyz]+$", "^cd[xyz]+$", "^e?[xyz]+$"], True),
    (["(?:^ab[xyz]+$)", "^c(?:d[xyz]*)", "^[xyz]+c$"], False),
    (["^a(b)[xyz]\\1$", "^c[xyz]b$"], False),  # a group by number
    (["^(c)[xyz]a", "^(c)[xyz]\\2"], False),  # merged, \2 would be lost
    (["^a[xyz]+?b$", "^c[xyz]+?b$", "^[xyz]{2}a$", "^[xyz]{2}b|c$"], False),
    (["^[xyz][^a]a$", "^[xyz][^a]b$", "^[xyz][]a]$", "^[xyz][\\]]$"], True),
    (["(?=a)a[xyz]", "(?!a)c[xyz]", "(?<!c)b[xyz]"], True),
    (["(?:[xyz]a)+$", "(?:[xyz]b)+$"], False),  # under a quantifier
    (["(?:[xyz]a[xyz])+$", "(?:[xyz]b[xyz])+$"], False),  # "xaxxbx"
    (["^c|d[xyz]*", "^b|d[xyz]*", "^a[xyz]*"], False),  # a "|" of its own
    (["^c|d[xyz]a", "^c|d[xyz]b"], True),  # distributes over that "|"
    (["^c|d[xyz]a", "^c|d[xyz]b|e"], False),
]


@pytest.mark.parametrize("alternatives, merged", SMALL)
def test_regroup_same_language(
    alternatives: list[str],
    merged: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # "[xyz]" counts as big here; the patterns are compared on every
    # string of up to 5 characters (and 6 of a, b, x), alone and as spaCy
    # writes them
    monkeypatch.setattr(spacy_french, "BIG_CLASS", 5)
    strings = {
        "".join(letters)
        for alphabet, longest in (("abcxA]\n", 5), ("abx", 6))
        for length in range(longest + 1)
        for letters in itertools.product(alphabet, repeat=length)
    }
    for flags in ("", "(?iu)"):
        spacy_like = flags + "|".join(f"(?:{a})" for a in alternatives)
        shorter = regroup(spacy_like)
        assert (shorter.count("[xyz]") == 1) == merged, shorter
        for pattern in (spacy_like, flags + "|".join(alternatives)):
            original = re.compile(pattern)
            regrouped = re.compile(regroup(pattern))
            for s in strings:
                assert bool(original.match(s)) == bool(regrouped.match(s)), (
                    pattern,
                    regroup(pattern),
                    s,
                )


def test_serialised_tokenizer_loads_fast(ours: Tokenizer, spacy_fr: Tokenizer) -> None:
    # to_bytes saves the regrouped pattern: loading it compiles 19 kB
    loaded = Tokenizer(Vocab()).from_bytes(ours.to_bytes())
    assert len(loaded.token_match.__self__.pattern) < 100_000
    text = "L'homme a-t-il vu l'anti-inflammatoire d'aujourd'hui ?"
    assert words(loaded, text) == words(spacy_fr, text)
    # and it pickles, as spaCy's does (for nlp.pipe(n_process=...))
    assert words(pickle.loads(pickle.dumps(ours)), text) == words(ours, text)


def test_falls_back_to_spacy_when_its_files_change(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spacy_fr: Tokenizer,
) -> None:
    spacy_files = Path(spacy.lang.__path__[0]) / "fr"
    for name in ("punctuation.py", "tokenizer_exceptions.py"):
        source = (spacy_files / name).read_text(encoding="utf-8")
        # as if spaCy built TOKEN_MATCH some other way
        source = source.replace(
            "TOKEN_MATCH = re.compile(",
            "TOKEN_MATCH = (lambda p: re.compile('a^'))(",
        )
        (tmp_path / name).write_text(source, encoding="utf-8")
    monkeypatch.setattr(spacy_french, "_FRENCH", tmp_path)
    spacy_french._french_settings.cache_clear()
    try:
        with pytest.warns(UserWarning, match="cannot read spaCy's rules"):
            fallback = french_tokenizer()
    finally:
        spacy_french._french_settings.cache_clear()
    text = "Qu'est-ce que l'anti-inflammatoire ?"
    assert words(fallback, text) == words(spacy_fr, text)
