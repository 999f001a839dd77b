"""The shipped models translate test_2016_flickr exactly as they did when they were exported:
beam 4, α = 0.6, every sentence. The references in tests/reference/ were written by
`python -m transformer translate --pair PAIR < test_2016_flickr.SRC` on the CPU; a change to
the model, the tokenizer, the search or the loading that moves one translation fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from transformer.checkpoint import load_model
from transformer.multi30k import PAIRS, load_pairs
from transformer.translation import translate

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "reference"


@pytest.mark.slow
@pytest.mark.parametrize("pair", list(PAIRS))
def test_shipped_beam4_translations_are_unchanged(pair: str):
    expected = (
        (REFERENCE / f"test_2016_flickr.{pair}.beam4.txt").read_text().splitlines()
    )
    sources = [src for src, _ in load_pairs("test_2016_flickr", pair)]
    assert len(sources) == len(expected) == 1000
    model, tokenizer = load_model(ROOT / "checkpoints" / pair)
    got = translate(model, tokenizer, sources, beam_size=4, alpha=0.6)
    changed = [k for k, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert not changed, (
        f"{len(changed)} of 1,000 translations changed, the first: sentence {changed[0] + 1}: "
        f"{got[changed[0]]!r} instead of {expected[changed[0]]!r}"
    )
