# Generated from chapters/a08_translating.ipynb: edit it, not this file.
"""The options of a translation, with the package's defaults, checked once: the
search's beam size and length penalty α, the sentences decoded at once and the
longest output."""

# %% auto #0
__all__ = ["MAX_ALPHA", "OptionError", "DecodeOptions", "with_changes"]

# %% ../chapters/a08_translating.ipynb #b4353e5c

import dataclasses
import math
from dataclasses import dataclass

from transformer.paper_search import ALPHA, BEAM_SIZE

# The largest α accepted: far beyond any useful one, yet small enough that lp
# stays finite in float32 for outputs of 40,000 tokens.
MAX_ALPHA = 10.0
_FLOAT32_MAX = 3.4028234663852886e38  # the search computes lp in float32


class OptionError(ValueError):
    """A decoding option that cannot be used: one line that starts with the
    option's name, `field`."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field, self.problem = field, problem


# %% ../chapters/a08_translating.ipynb #db8ec932
@dataclass(frozen=True)
class DecodeOptions:
    """Beam search with beam_size and length penalty alpha (beam_size 1:
    greedy decoding), batch_size sentences at a time, outputs of at most
    max_len tokens with EOS (None: each source's length + 50)."""

    beam_size: int = BEAM_SIZE  # the package's defaults (paper_search)
    alpha: float = ALPHA
    batch_size: int = 32
    max_len: int | None = None

    def __post_init__(self) -> None:
        for name in ("beam_size", "batch_size", "max_len"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise OptionError(name, f"must be at least 1, got {value}")
        self.check_alpha()

    @property
    def greedy(self) -> bool:
        return self.beam_size == 1

    def check_alpha(self, positions: int | None = None) -> None:
        """α from 0 to MAX_ALPHA: lp grows with length and stays finite (an
        infinite lp makes scores NaN), up to a model's `positions` if given."""
        alpha = self.alpha
        if not 0 <= alpha <= MAX_ALPHA:  # also rejects NaN and infinity
            raise OptionError(
                "alpha", f"must be >= 0 and at most {MAX_ALPHA:g}, got {alpha}"
            )
        if positions is None:
            return
        # lp(positions) = ((5 + positions) / 6)^α must stay a float32
        if alpha * math.log((5 + positions) / 6) >= math.log(_FLOAT32_MAX):
            raise OptionError(
                "alpha",
                f"{alpha} makes the length penalty overflow at the model's"
                f" {positions} positions: choose a smaller one",
            )


def with_changes(
    options: DecodeOptions | None = None, **changes
) -> DecodeOptions:
    """`options` (default: DecodeOptions()) with `changes`, checked: how
    `translate` and its kin take both, e.g. `translate(..., beam_size=1)`."""
    if options is not None and not changes:
        return options  # checked when it was made
    return dataclasses.replace(options or DecodeOptions(), **changes)
