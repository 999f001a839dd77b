# Generated from chapters/08_model.ipynb: edit it, not this file.
"""The model's hyperparameters: a frozen, validated dataclass (Table 3)."""

# %% auto #0
__all__ = ["POSITIONAL_KINDS", "TransformerConfig"]

# %% ../chapters/08_model.ipynb #388ebca3

import dataclasses
from dataclasses import dataclass
from typing import Any

POSITIONAL_KINDS = ("sinusoidal", "learned")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of the encoder-decoder Transformer; the defaults are the
    paper's base model.

    `tgt_vocab_size=None` means one vocabulary shared by source and target.
    """

    src_vocab_size: int
    tgt_vocab_size: int | None = None
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    ffn_dropout: float = 0.0
    max_len: int = 512
    norm_first: bool = False
    positional: str = "sinusoidal"
    share_embeddings: bool = True
    tie_output: bool = True

    def __post_init__(self) -> None:
        sizes = [
            "src_vocab_size",
            "d_model",
            "n_heads",
            "n_layers",
            "d_ff",
            "max_len",
        ]
        if self.tgt_vocab_size is not None:
            sizes.append("tgt_vocab_size")
        for name in sizes:
            value = getattr(self, name)
            # bool is a subclass of int: True is not a size.
            if (
                isinstance(value, bool)
                or not isinstance(value, int)
                or value <= 0
            ):
                raise ValueError(
                    f"{name} must be a positive integer, got {value!r}"
                )
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads"
                f" ({self.n_heads}): each head works in d_model / n_heads"
                " dimensions"
            )
        for name in ("dropout", "attention_dropout", "ffn_dropout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(
                    f"{name} must be a number in [0, 1), got {value!r}"
                )
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("norm_first", "share_embeddings", "tie_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"{name} must be True or False, got"
                    f" {getattr(self, name)!r}"
                )
        if self.positional not in POSITIONAL_KINDS:
            raise ValueError(
                "positional must be one of"
                f" {', '.join(map(repr, POSITIONAL_KINDS))}, got"
                f" {self.positional!r}"
            )
        if self.positional == "sinusoidal" and self.d_model % 2 != 0:
            # The sinusoids come in sine/cosine pairs, one pair per two
            # dimensions (3.5).
            raise ValueError(
                f"d_model ({self.d_model}) must be even with"
                " positional='sinusoidal': the encoding pairs a sine and a"
                " cosine per frequency; use an even width or"
                " positional='learned'"
            )
        if self.share_embeddings and self.tgt_vocab_size is not None:
            raise ValueError(
                "share_embeddings=True needs one vocabulary shared by source"
                " and target (tgt_vocab_size=None), got"
                f" tgt_vocab_size={self.tgt_vocab_size}: set"
                " share_embeddings=False for two vocabularies"
            )

    @property
    def target_vocab_size(self) -> int:
        """V of the output layer: the target vocabulary, or the shared one."""
        if self.tgt_vocab_size is None:
            return self.src_vocab_size
        return self.tgt_vocab_size

    @property
    def d_k(self) -> int:
        """Width of one head's queries, keys and values."""
        return self.d_model // self.n_heads

    @classmethod
    def base(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's base model (Table 3): N=6, d_model=512, d_ff=2048, h=8,
        P_drop=0.1."""
        return cls(src_vocab_size=vocab_size, **overrides)

    @classmethod
    def big(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """The paper's big model (Table 3): d_model=1024, d_ff=4096, h=16,
        P_drop=0.3."""
        fields = dict(d_model=1024, n_heads=16, d_ff=4096, dropout=0.3)
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    @classmethod
    def small(cls, vocab_size: int, **overrides: Any) -> "TransformerConfig":
        """A starting point for Multi30k: 3 layers of width 256 (the training
        part tunes it)."""
        fields = dict(
            n_layers=3, d_model=256, n_heads=8, d_ff=1024, dropout=0.1
        )
        return cls(src_vocab_size=vocab_size, **(fields | overrides))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-able dictionary (for checkpoints)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TransformerConfig":
        """Rebuild a config from `to_dict()`'s output; unknown or missing keys
        are errors.

        Every field is required, those with a default too: to_dict writes them
        all, and a missing `norm_first` silently read as its default would
        rebuild another model.
        """
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(
                f"unknown TransformerConfig field(s) {', '.join(unknown)}; "
                f"known fields: {', '.join(sorted(known))}"
            )
        missing = sorted(known - set(d))
        if missing:
            raise ValueError(
                f"missing TransformerConfig field(s) {', '.join(missing)}: "
                "a saved config lists every field"
            )
        return cls(**d)
