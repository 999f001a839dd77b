# Generated from chapters/14_decoding.ipynb: edit it, not this file.
"""The paper's search (Section 6.1): "beam search with a beam size of 4 and
length penalty α = 0.6", and "maximum output length ... input length + 50"."""

# %% auto #0
__all__ = ["BEAM_SIZE", "ALPHA", "EXTRA_LENGTH"]

# %% ../chapters/14_decoding.ipynb #7cbcfaac

BEAM_SIZE = 4
ALPHA = 0.6
EXTRA_LENGTH = 50
