# Generated from chapters/14_decoding.ipynb: edit it, not this file.
"""The paper's search (Section 6.1): "beam search with a beam size of 4 and
length penalty α = 0.6", and "maximum output length ... input length + 50";
and the package's default search, set from it."""

# %% auto #0
__all__ = [
    "PAPER_BEAM_SIZE",
    "PAPER_ALPHA",
    "EXTRA_LENGTH",
    "BEAM_SIZE",
    "ALPHA",
]

# %% ../chapters/14_decoding.ipynb #7cbcfaac

PAPER_BEAM_SIZE = 4
PAPER_ALPHA = 0.6
EXTRA_LENGTH = 50
BEAM_SIZE = PAPER_BEAM_SIZE  # the package's defaults
ALPHA = PAPER_ALPHA
