# Generated from chapters/a09_ctranslate2.ipynb: edit it, not this file.
"""Export a trained model to CTranslate2, the inference engine of production
translation systems, and translate with the exported model."""

# %% auto #0
__all__ = [
    "QUANTIZATIONS",
    "INSTALL",
    "EXPORT_RECORD",
    "require_ctranslate2",
    "check_convertible",
    "ctranslate2_spec",
    "export_ctranslate2",
    "CTranslate2Model",
]

# %% ../chapters/a09_ctranslate2.ipynb #4962f2a5

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from transformer.atomic import atomic_write
from transformer.checkpoint import CheckpointError
from transformer.decode import Hypothesis, output_limit
from transformer.decode_options import DecodeOptions, with_changes
from transformer.embedding import sinusoidal_encoding
from transformer.model import Transformer
from transformer.records import atomic_folder
from transformer.tokenizer import Tokenizer
from transformer.translation import translate_batches
from transformer.words import load_tokenizer

from . import layout

QUANTIZATIONS = ("float32", "int8")
INSTALL = (  # the package's [ctranslate2] extra
    "pip install 'ctranslate2>=4.5,<5'"
)
EXPORT_RECORD = "transformer.json"  # beside CTranslate2's own config.json


def require_ctranslate2():
    """The ctranslate2 module, or an ImportError saying how to install it."""
    try:
        import ctranslate2
    except ImportError as err:
        raise ImportError(
            f"the CTranslate2 export needs the ctranslate2 package: {INSTALL}"
        ) from err
    return ctranslate2


def check_convertible(model: Transformer) -> None:
    """Raise ValueError naming every part of the model that the export does not
    convert."""
    c = model.config
    problems = []
    if c.norm_first:
        problems.append("pre-norm layers (norm_first=True)")
    if c.positional != "sinusoidal":
        problems.append(f"{c.positional} positional encodings")
    if not c.share_embeddings:
        problems.append("separate source and target embeddings")
    if not c.tie_output:
        problems.append("an output layer not tied to the embeddings")
    norms = {m.eps for m in model.modules() if isinstance(m, nn.LayerNorm)}
    if norms - {c.layer_norm_eps}:
        problems.append(f"LayerNorm epsilon {sorted(norms)}")
    if problems:
        raise ValueError(
            "cannot export to CTranslate2 a model with "
            + ", ".join(problems)
            + ": the export converts the paper's post-norm model with"
            " sinusoids and one shared embedding"
        )


# %% ../chapters/a09_ctranslate2.ipynb #df959a55
def _array(t: Tensor) -> np.ndarray:
    """A copy: the engine's quantisation works in place, and must not touch the
    model."""
    return t.detach().to("cpu", torch.float32).numpy().copy()


def _linear(spec, *modules: nn.Linear) -> None:
    """One CTranslate2 linear layer from one or more torch ones, stacked along
    the outputs (the fused query/key/value projection). torch's (out, in)
    layout is CTranslate2's."""
    spec.weight = np.concatenate([_array(m.weight) for m in modules])
    if modules[0].bias is not None:
        spec.bias = np.concatenate([_array(m.bias) for m in modules])


def _norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _layers(spec, model: Transformer) -> None:
    """Each layer's weights: attention, feed-forward and the LayerNorm after
    each sublayer."""
    for s, layer in zip(spec.encoder.layer, model.encoder.layers, strict=True):
        a = layer.self_attn
        _linear(s.self_attention.linear[0], a.w_q, a.w_k, a.w_v)
        _linear(s.self_attention.linear[1], a.w_o)
        _norm(s.self_attention.layer_norm, layer.sublayers[0].norm)
        _linear(s.ffn.linear_0, layer.feed_forward.w_1)
        _linear(s.ffn.linear_1, layer.feed_forward.w_2)
        _norm(s.ffn.layer_norm, layer.sublayers[1].norm)
    for s, layer in zip(spec.decoder.layer, model.decoder.layers, strict=True):
        a, x = layer.self_attn, layer.cross_attn
        _linear(s.self_attention.linear[0], a.w_q, a.w_k, a.w_v)
        _linear(s.self_attention.linear[1], a.w_o)
        _norm(s.self_attention.layer_norm, layer.sublayers[0].norm)
        _linear(s.attention.linear[0], x.w_q)
        _linear(
            s.attention.linear[1], x.w_k, x.w_v
        )  # keys and values of the memory
        _linear(s.attention.linear[2], x.w_o)
        _norm(s.attention.layer_norm, layer.sublayers[1].norm)
        _linear(s.ffn.linear_0, layer.feed_forward.w_1)
        _linear(s.ffn.linear_1, layer.feed_forward.w_2)
        _norm(s.ffn.layer_norm, layer.sublayers[2].norm)


def ctranslate2_spec(model: Transformer, tokenizer: Tokenizer):
    """A ctranslate2.specs.TransformerSpec holding the model's weights and
    vocabulary."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    check_convertible(model)
    c = model.config
    if tokenizer.vocab_size != c.src_vocab_size:
        raise ValueError(
            f"the tokenizer has {tokenizer.vocab_size} tokens, the model "
            f"{c.src_vocab_size}"
        )
    spec = transformer_spec.TransformerSpec.from_config(
        (c.n_layers, c.n_layers),
        c.n_heads,
        pre_norm=False,  # LayerNorm(x + Sublayer(x)), and no final LayerNorm
        activation=common_spec.Activation.RELU,
    )
    # The engine's own table puts all the sines before all the cosines; the
    # package interleaves them (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos): give
    # it the package's.
    table = _array(
        sinusoidal_encoding(c.max_len, c.d_model)
    )  # (max_len, d_model)
    embedding = _array(
        model.src_embed.embedding.weight
    )  # (V, d_model), shared
    for side in (spec.encoder, spec.decoder):
        side.scale_embeddings = True  # × √d_model, as TokenEmbedding does
        side.position_encodings.encodings = table
    spec.encoder.embeddings[0].weight = embedding
    spec.decoder.embeddings.weight = embedding
    # the tied output layer, without bias
    spec.decoder.projection.weight = embedding
    _layers(spec, model)
    pieces = tokenizer.pieces(
        range(tokenizer.vocab_size)
    )  # in id order: id i is piece i
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(
        pieces
    )  # the same list: saved as one shared file
    config = spec.config
    config.layer_norm_epsilon = c.layer_norm_eps
    config.unk_token = pieces[tokenizer.unk_id]
    config.bos_token = config.decoder_start_token = pieces[tokenizer.bos_id]
    config.eos_token = pieces[tokenizer.eos_id]
    config.add_source_bos, config.add_source_eos = (
        False,
        True,
    )  # a source is ids + <eos>
    return spec


# %% ../chapters/a09_ctranslate2.ipynb #95a27bf5
def export_ctranslate2(
    model: Transformer,
    tokenizer: Tokenizer,
    out: str | Path,
    *,
    quantization: str = "float32",
) -> Path:
    """Write `model` as a CTranslate2 model folder `out` (float32 or int8
    weights), with the package's tokenizer beside it; the folder appears whole
    or not at all."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(
            f"quantization must be one of {', '.join(QUANTIZATIONS)}, got"
            f" {quantization!r}"
        )
    spec = ctranslate2_spec(model, tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    out = Path(out)
    with atomic_folder(out) as tmp:
        spec.save(str(tmp))
        tokenizer.save(tmp / layout.TOKENIZER)
        record = {
            "pair": tokenizer.pair,
            "max_len": model.config.max_len,
            "quantization": quantization,
        }
        atomic_write(
            tmp / EXPORT_RECORD, json.dumps(record, indent=1).encode()
        )
    return out


# %% ../chapters/a09_ctranslate2.ipynb #a2fdea52
class CTranslate2Model:
    """An exported folder, loaded: the engine's translator and the package's
    tokenizer."""

    def __init__(
        self,
        folder: str | Path,
        *,
        threads: int = 0,
        device: str = "cpu",
        compute_type: str = "default",
    ) -> None:
        """threads: the CPU threads (0: the engine's choice); device "cpu" or
        "cuda"; compute_type: the engine's, e.g. "float16" on a GPU ("default":
        as exported)."""
        ctranslate2 = require_ctranslate2()
        folder = Path(folder)
        record_path = folder / EXPORT_RECORD
        if not record_path.is_file():
            raise CheckpointError(
                f"{folder} is not a model written by `python -m transformer"
                f" ctranslate2`: no {EXPORT_RECORD}"
            )
        try:
            self.max_len = int(json.loads(record_path.read_text())["max_len"])
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(
                f"{record_path}: no max_len ({err})"
            ) from err
        self.folder = folder
        self.tokenizer = load_tokenizer(folder / layout.TOKENIZER)
        self.translator = ctranslate2.Translator(
            str(folder),
            device=device,
            compute_type=compute_type,
            inter_threads=1,
            intra_threads=threads,
        )
        self._pieces = self.tokenizer.pieces(range(self.tokenizer.vocab_size))
        self._ids = {piece: i for i, piece in enumerate(self._pieces)}

    def decode_batch(
        self,
        sources: Sequence[list[int]],
        options: DecodeOptions | None = None,
    ) -> list[list[int]]:
        """The output ids of sources given as ids with their final <eos>, as
        the package's decoders take them: one batch, searched as `options` say
        (default: the defaults). Each sentence keeps its own length limit, as
        in the package: the engine takes one limit a call, so the sentences of
        one limit are searched together."""
        options = options or DecodeOptions()
        limits = self.limits(sources, options)
        outputs: list[list[int]] = [[] for _ in sources]
        for limit in sorted(set(limits)):
            rows = [i for i, n in enumerate(limits) if n == limit]
            found = self._search([sources[i] for i in rows], options, limit)
            for i, ids in zip(rows, found, strict=True):
                outputs[i] = ids
        return outputs

    def _search(
        self, sources: list[list[int]], options: DecodeOptions, limit: int
    ) -> list[list[int]]:
        """One call of the engine, every output of at most `limit` tokens."""
        tok = self.tokenizer
        results = self.translator.translate_batch(
            [
                self.tokenizer.pieces(s[:-1]) for s in sources
            ],  # the engine adds <eos>
            beam_size=options.beam_size,
            # the engine divides by |Y|^α, where GNMT's lp is ((5 + |Y|)/6)^α
            length_penalty=1.0 if options.greedy else options.alpha,
            max_decoding_length=limit,
            min_decoding_length=0,  # <eos> may come first, as in the package
            suppress_sequences=[
                [self._pieces[tok.pad_id]],
                [self._pieces[tok.bos_id]],
            ],
        )
        return [[self._ids[p] for p in r.hypotheses[0]] for r in results]

    def limits(
        self, sources: Sequence[list[int]], options: DecodeOptions
    ) -> list[int]:
        """The most tokens, <eos> included, that each output may have: the
        decoding chapter's output_limit."""
        return [
            output_limit(len(s), self.max_len, options.max_len)
            for s in sources
        ]

    def translate(
        self,
        sentences: Sequence[str],
        options: DecodeOptions | None = None,
        *,
        warn: Callable[[str], None] | None = None,
        **changes,
    ) -> list[str]:
        """Translations of `sentences`, in their order, as
        `translation.translate` makes them with the same `options` (and
        `changes`), with the same warnings."""
        options = with_changes(options, **changes)

        def decode_batch(sources: list[list[int]]) -> list[Hypothesis]:
            found = self.decode_batch(sources, options)
            limits = self.limits(sources, options)
            return [  # the engine's scores are not the package's: not kept
                Hypothesis(
                    ids,
                    log_prob=math.nan,
                    score=math.nan,
                    ended=len(ids) < limit,
                )
                for ids, limit in zip(found, limits, strict=True)
            ]

        return translate_batches(
            decode_batch,
            self.tokenizer,
            sentences,
            max_len=self.max_len,
            batch_size=options.batch_size,
            warn=warn,
        )
