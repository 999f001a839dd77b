# Generated from chapters/a02_model_engineering.ipynb: edit it, not this file.
"""Parts of a trained model switched off (Michel et al., 2019): heads,
sublayers and the positional encodings, by zeroing the weights that carry
them, and restoring those weights afterwards."""

# %% auto #0
__all__ = [
    "SUBLAYERS",
    "ATTENTIONS",
    "POSITIONS",
    "KINDS",
    "SPELLING",
    "PART",
    "Part",
    "parse_part",
    "KnockOut",
    "check_knockout",
    "zeroed",
    "knocked_out",
]

# %% ../chapters/a02_model_engineering.ipynb #115badd0

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor

from transformer.embedding import PositionalEncoding
from transformer.model import Transformer

# Each sublayer kind, in the model's order: its stack, its module in a layer,
# and that module's last linear map, whose output is the residual branch.
SUBLAYERS = {
    "enc-self": ("encoder", "self_attn", "w_o"),
    "enc-ffn": ("encoder", "feed_forward", "w_2"),
    "dec-self": ("decoder", "self_attn", "w_o"),
    "dec-cross": ("decoder", "cross_attn", "w_o"),
    "dec-ffn": ("decoder", "feed_forward", "w_2"),
}
ATTENTIONS = ("enc-self", "dec-self", "dec-cross")
POSITIONS = {"enc-pe": "src_pos", "dec-pe": "tgt_pos"}
KINDS = (*SUBLAYERS, *POSITIONS)
SPELLING = (
    "kind:L<layer>h<head> for a head (kinds enc-self, dec-self, dec-cross),"
    " kind:L<layer> for a whole sublayer (those and enc-ffn, dec-ffn), pe,"
    " enc-pe or dec-pe for the positional encodings; layers and heads count"
    " from 1, parts are separated by commas"
)
PART = re.compile(r"([a-z-]+):L([1-9][0-9]*)(?:h([1-9][0-9]*))?")


@dataclass(frozen=True)
class Part:
    """One part: a head (kind, layer, head), a whole sublayer (kind, layer) or
    a positional encoding (kind alone); layers and heads counted from 1."""

    kind: str
    layer: int | None = None
    head: int | None = None

    def __str__(self) -> str:
        if self.layer is None:
            return self.kind
        head = "" if self.head is None else f"h{self.head}"
        return f"{self.kind}:L{self.layer}{head}"

    def key(self) -> tuple[int, int, int]:
        """The order of printing: by kind, layer, then head."""
        return (KINDS.index(self.kind), self.layer or 0, self.head or 0)


def parse_part(item: str) -> list[Part]:
    """The parts that one comma-separated item names ("pe" names two)."""
    if item == "pe":
        return [Part(kind) for kind in POSITIONS]
    if item in POSITIONS:
        return [Part(item)]
    match = PART.fullmatch(item)
    if match is None or match[1] not in SUBLAYERS:
        raise ValueError(f"cannot read {item!r}: write {SPELLING}")
    kind, layer, head = match[1], int(match[2]), match[3]
    if head is not None and kind not in ATTENTIONS:
        raise ValueError(f"{item!r}: {kind} has no heads; write {kind}:L<n>")
    return [Part(kind, layer, None if head is None else int(head))]


@dataclass(frozen=True)
class KnockOut:
    """The parts of a model to switch off; `KnockOut.parse` reads the
    spelling that str() writes, "enc-self:L1h3,dec-cross:L2,pe"."""

    parts: frozenset[Part] = frozenset()

    @classmethod
    def parse(cls, text: str) -> "KnockOut":
        """The parts named in `text`; "" or spaces name none."""
        if not text.strip():
            return cls()
        items = [item.strip() for item in text.split(",")]
        return cls(frozenset(p for item in items for p in parse_part(item)))

    def __str__(self) -> str:
        parts = sorted(self.parts, key=Part.key)
        if {Part(kind) for kind in POSITIONS} <= self.parts:  # both: "pe"
            parts = [p for p in parts if p.kind not in POSITIONS] + ["pe"]
        return ",".join(map(str, parts))

    def __bool__(self) -> bool:
        return bool(self.parts)


# %% ../chapters/a02_model_engineering.ipynb #bca83934
def check_knockout(model: Transformer, spec: KnockOut) -> None:
    """A one-line ValueError for a part that `model` does not have."""
    n_layers, n_heads = model.config.n_layers, model.config.n_heads
    for part in sorted(spec.parts, key=Part.key):
        if part.layer is not None and part.layer > n_layers:
            raise ValueError(f"{part}: the model has {n_layers} layers")
        if part.head is not None and part.head > n_heads:
            raise ValueError(f"{part}: the model has {n_heads} heads")


def zeroed(model: Transformer, part: Part) -> list[tuple[Tensor, tuple]]:
    """The tensors, and the index in each, whose zeros switch `part` off."""
    everything = (...,)
    if part.kind in POSITIONS:
        encoding = getattr(model, POSITIONS[part.kind])
        if isinstance(encoding, PositionalEncoding):
            return [(encoding.pe, everything)]  # (max_len, d_model)
        return [(encoding.embedding.weight, everything)]  # learned
    stack, module, last = SUBLAYERS[part.kind]
    sublayer = getattr(getattr(model, stack).layers[part.layer - 1], module)
    linear = getattr(sublayer, last)
    if part.head is None:  # the whole branch: weight and bias
        return [
            (t, everything)
            for t in (linear.weight, linear.bias)
            if t is not None
        ]
    d_k, h = sublayer.d_k, part.head - 1
    # (d_model, H·d_k): head h's slice of the concatenation meets these columns
    return [(linear.weight, (slice(None), slice(h * d_k, (h + 1) * d_k)))]


@contextmanager
def knocked_out(
    model: Transformer, spec: KnockOut | str | None
) -> Iterator[Transformer]:
    """`model` with the parts of `spec` (a KnockOut or its spelling) switched
    off, in place; every weight is restored exactly on exit."""
    if isinstance(spec, str):
        spec = KnockOut.parse(spec)
    spec = spec or KnockOut()
    check_knockout(model, spec)
    with torch.no_grad():
        saved = [
            (tensor, index, tensor[index].clone())
            for part in spec.parts
            for tensor, index in zeroed(model, part)
        ]
    try:
        with torch.no_grad():
            for tensor, index, _ in saved:
                tensor[index] = 0.0
        yield model
    finally:
        with torch.no_grad():
            for tensor, index, value in saved:
                tensor[index] = value
