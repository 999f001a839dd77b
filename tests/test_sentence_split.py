"""A text in sentences: `split_sentences`'s rule on tricky texts (abbreviations, ordinals,
decimals, quotes, ellipses, no final stop, white space), `translate(by_sentence=True)`
against the sentences translated one by one, its warnings, and `translate --by-sentence`.
The translator page's split is held equal to this one in tests/test_translator.py, on
SPLIT_CASES."""

from __future__ import annotations

import io
import sys

import pytest
from helpers import GERMAN, MAX_LEN

from transformer.__main__ import main as package_main
from transformer.translation import TITLES, split_sentences, translate

pytestmark = pytest.mark.usefixtures("one_thread")

# (text, its sentences): the rule's cases, and the texts it must leave whole.
SPLIT_CASES: list[tuple[str, list[str]]] = [
    ("", []),
    (" \t\n ", []),
    ("Ein Hund rennt.", ["Ein Hund rennt."]),
    ("Ein Hund rennt", ["Ein Hund rennt"]),  # no final stop
    ("Ein Hund rennt. Eine Katze schläft!", ["Ein Hund rennt.", "Eine Katze schläft!"]),
    ("Wer rennt? Der Hund.", ["Wer rennt?", "Der Hund."]),
    ("Wow!! Ja?! Nein… Doch.", ["Wow!!", "Ja?!", "Nein…", "Doch."]),
    ("Il attend... Puis il part.", ["Il attend...", "Puis il part."]),
    ("Er wartet … Dann", ["Er wartet …", "Dann"]),  # a lone … after a space ends one
    # a lower-case word after the stop: one sentence
    ("Er rennt. und dann? nichts.", ["Er rennt. und dann? nichts."]),
    ("Es kostet 3.5 Euro. Das ist viel.", ["Es kostet 3.5 Euro.", "Das ist viel."]),
    ("Am 3. Mai regnet es.", ["Am 3. Mai regnet es."]),  # an ordinal
    ("Er ist 30. Sie ist 25.", ["Er ist 30. Sie ist 25."]),  # so is any number
    ("Das ist z. B. Käse. Der ist gut.", ["Das ist z. B. Käse.", "Der ist gut."]),
    ("J. K. Rowling schreibt.", ["J. K. Rowling schreibt."]),
    ("Dr. Müller und Mme. Dupont lachen.", ["Dr. Müller und Mme. Dupont lachen."]),
    ("Das ist gut usw. Dann gehen wir.", ["Das ist gut usw.", "Dann gehen wir."]),
    ("Er ruft: „Komm!“ Dann geht er.", ["Er ruft: „Komm!“", "Dann geht er."]),
    ('Was? "Nein." Gut.', ["Was?", '"Nein."', "Gut."]),
    ("Il dit : « Non. » Puis il part.", ["Il dit : « Non. » Puis il part."]),
    ("Quoi ? Non !", ["Quoi ?", "Non !"]),
    ("(Er lacht.) Sie auch.", ["(Er lacht.)", "Sie auch."]),
    ("Ende. 3 Hunde rennen.", ["Ende. 3 Hunde rennen."]),  # no capital after it
    ("Ende. Édith rennt.", ["Ende.", "Édith rennt."]),
    ("Ende. ǅemal rennt.", ["Ende. ǅemal rennt."]),  # title case is not upper case
    ("Hund.\u00a0\u2003Katze.\x85Maus\u3000.", ["Hund.", "Katze.", "Maus ."]),
    ("Hund.\ufeffKatze", ["Hund.\ufeffKatze"]),  # U+FEFF is no white space in Python
    ("A. B. C. Der Hund.", ["A. B. C. Der Hund."]),
    ("Café. Ölfass. Ürün.", ["Café.", "Ölfass.", "Ürün."]),
    ("Hund 𝐀. 𝐁ar rennt.", ["Hund 𝐀. 𝐁ar rennt."]),  # 𝐀 is one letter; 𝐁 not Lu
    ("Hund! 🐕 Katze.", ["Hund! 🐕 Katze."]),
    ("Der Hund.Die Katze.", ["Der Hund.Die Katze."]),  # no space after it
    ("St. Pauli spielt.", ["St. Pauli spielt."]),
]


@pytest.mark.parametrize(("text", "sentences"), SPLIT_CASES)
def test_split_sentences_follows_its_rule(text: str, sentences: list[str]):
    assert split_sentences(text) == sentences


def test_every_title_keeps_its_name():
    for title in TITLES:
        assert split_sentences(f"{title}. Müller rennt. Er lacht.") == [
            f"{title}. Müller rennt.",
            "Er lacht.",
        ]


def test_by_sentence_translates_each_sentence_and_joins_them(loaded):
    model, tokenizer = loaded
    texts = [f"{GERMAN[0]} {GERMAN[1]}", "", GERMAN[2], f"{GERMAN[3]} Am 3. Mai."]
    found = translate(model, tokenizer, texts, beam_size=1, by_sentence=True)
    for text, got in zip(texts, found, strict=True):
        parts = translate(model, tokenizer, split_sentences(text), beam_size=1)
        assert got == " ".join(parts)
    assert found[1] == ""
    assert len(split_sentences(texts[0])) == 2
    # Off by default: a text of two sentences is one source, as before.
    [whole] = translate(model, tokenizer, texts[:1], beam_size=1)
    [source] = translate(
        model, tokenizer, [" ".join(split_sentences(texts[0]))], beam_size=1
    )
    assert whole == source


def test_by_sentence_warnings_name_the_text(loaded):
    model, tokenizer = loaded
    long = " ".join(GERMAN).replace(".", ",")  # one sentence, over MAX_LEN tokens
    assert len(tokenizer.encode(long)) + 1 > MAX_LEN
    warnings: list[str] = []
    translate(
        model,
        tokenizer,
        [GERMAN[0], f"Kurz. {long} Auch kurz."],
        beam_size=1,
        by_sentence=True,
        warn=warnings.append,
    )
    [positions] = [w for w in warnings if "positions" in w]
    assert positions.startswith("sentence 2: ")


def run(argv: list[str], capsys, monkeypatch, stdin: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    capsys.readouterr()
    status = package_main(["translate", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_command_line_translates_by_sentence(shipped, loaded, capsys, monkeypatch):
    model, tokenizer = loaded
    args = [
        "--pair",
        "de-en",
        "--checkpoint",
        str(shipped),
        "--device",
        "cpu",
        "--beam",
        "1",
    ]
    lines = [f"{GERMAN[0]} {GERMAN[1]}", "", GERMAN[2]]
    stdin = "".join(f"{line}\n" for line in lines)
    status, out, _ = run([*args, "--by-sentence"], capsys, monkeypatch, stdin)
    expected = translate(model, tokenizer, lines, beam_size=1, by_sentence=True)
    assert status == 0 and out == "".join(f"{t}\n" for t in expected)
    status, out, _ = run(args, capsys, monkeypatch, stdin)  # off by default
    assert out == "".join(
        f"{t}\n" for t in translate(model, tokenizer, lines, beam_size=1)
    )
    status, _, err = run(
        [*args, "--by-sentence", "--engine", "ctranslate2", "--model", str(shipped)],
        capsys,
        monkeypatch,
        stdin,
    )
    assert status == 2 and "--by-sentence needs the package's engine" in err
