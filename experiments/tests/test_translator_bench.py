"""experiments/translator_bench refuses a bad input with one line and status 2 before it
opens a browser, and finds the sentence it times."""

import sys
from pathlib import Path

import pytest

from experiments import translator_bench
from transformer.multi30k import PAIRS


def never(*args, **kwargs):
    raise AssertionError("reached past the checks of the input")


def run(argv: list[str], monkeypatch, capsys) -> tuple[int, str]:
    monkeypatch.setattr(translator_bench, "measure", never)
    monkeypatch.setattr(sys, "argv", ["translator_bench.py", *argv])
    try:
        status = translator_bench.main()
    except SystemExit as stop:
        status = stop.code
    return status, capsys.readouterr().err


@pytest.fixture
def book(tmp_path: Path) -> Path:
    """A folder with the page, as a built book has it."""
    page = tmp_path / translator_bench.PAGE
    page.parent.mkdir(parents=True)
    page.write_text("<html></html>")
    return tmp_path


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["--book", "{missing}"], "build the book first"),
        (["--book", "{book}", "--repeats", "0"], "--repeats must be at least 1"),
        (["--book", "{book}", "--words", "400"], "no test sentence of 400 words"),
        (["--book", "{book}", "--pair", "en-de"], "invalid choice: 'en-de'"),
    ],
)
def test_a_bad_input_is_one_line_and_status_2(
    argv: list[str], named: str, book: Path, tmp_path: Path, monkeypatch, capsys
):
    argv = [a.format(book=book, missing=tmp_path / "nothing") for a in argv]
    status, err = run(argv, monkeypatch, capsys)
    assert status == 2 and "Traceback" not in err and named in err, err
    assert err.strip().splitlines()[-1].startswith("translator_bench.py: error: ")


def test_the_sentence_has_the_words_asked_for():
    for pair in PAIRS:
        assert len(translator_bench.sentence_of(pair, 15).split()) == 15
