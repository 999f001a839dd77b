# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Deploying with CTranslate2
#
# The book's models are standard Transformers, so a production inference engine can run them.
# [CTranslate2](https://github.com/OpenNMT/CTranslate2) {cite:p}`klein2020efficient`, the C++
# engine behind OpenNMT and many deployed translation systems, reads a Transformer's weights from
# one folder and decodes greedily or by beam search, on a CPU or a GPU, in float32 or with 8-bit
# integer weights. This appendix writes a trained model into that folder and translates with it;
# the exported model gives the package's own greedy translations, token for token, and the
# section "Speed" compares the engines.

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)

# %% tags=["remove-cell"]
#| default_exp ctranslate2

# %% [markdown]
# ## What the engine needs to know
#
# CTranslate2 describes a model as a *specification*: named arrays for every weight, and a few
# settings. Most of the package maps onto it one to one. Where a wrong guess gives a model that
# runs but translates badly, the export sets the point explicitly:
#
# - **Post-norm.** Each sublayer is $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$, as in the
#   paper, with the package's $\epsilon = 10^{-6}$, and no final LayerNorm after the stacks.
# - **Embeddings.** One table serves the source, the target and the output layer (Section 3.4),
#   scaled by $\sqrt{d_\text{model}}$ on the way in.
# - **Positions.** The engine's built-in sinusoids put all the sines before all the cosines; the
#   package interleaves them, $PE_{(pos, 2i)} = \sin$ and $PE_{(pos, 2i+1)} = \cos$ (Section 3.5).
#   The export writes the package's own table into the model.
# - **Vocabulary.** One list of pieces in id order, so id $i$ is the same piece on both sides; the
#   decoder starts from `<bos>`, and the engine appends `<eos>` to each source, as the package's
#   data pipeline does.
#
# The export refuses the rest, naming it: a pre-norm model, learned positions or separate
# embeddings would otherwise load into the engine and translate wrongly.

# %%
#| export
"""Export a trained model to CTranslate2, the inference engine of production
translation systems, and translate with the exported model."""

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from transformer import layout
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


# %% [markdown]
# Attention is where the layouts differ most. The package keeps $W^Q$, $W^K$ and $W^V$ as three
# $d_\text{model} \times d_\text{model}$ layers; the engine multiplies once by the three stacked
# along the output dimension, and in encoder-decoder attention once by $W^K$ and $W^V$ stacked,
# since both read the encoder's memory. PyTorch stores a linear layer's weight as (out, in), as the
# engine does, so the arrays go across untransposed.


# %%
#| export
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


# %% [markdown]
# The folder is written whole or not at all (`records.atomic_folder`), with the package's tokenizer
# beside the engine's files: one folder is all a deployment needs. `quantization="int8"` stores
# 8-bit integer weights with a scale per row, which change the translations slightly (the results
# chapter measures how much).


# %%
#| export
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


# %% [markdown]
# ## Translating with the engine
#
# `CTranslate2Model` loads an exported folder and translates as `translation.translate` does: the
# same normalisation and tokenizer, sources longest first in batches of 32, outputs of at most the
# source length + 50 tokens (per batch here, per sentence in the package), never padding or
# `<bos>`.


# %%
#| export
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


# %% [markdown]
# Export the shipped German→English model and translate three sentences with both engines:

# %%
import tempfile
from pathlib import Path

from transformer.translation import load_pair_model, translate

model, tokenizer = load_pair_model("de-en")
scratch = Path(tempfile.mkdtemp())
exported = export_ctranslate2(model, tokenizer, scratch / "de-en-ct2")
engine = CTranslate2Model(exported)
sorted(p.name for p in exported.iterdir())

# %% tags=["nbval-ignore-output"]
sentences = [
    "Ein Mann fährt mit dem Fahrrad einen Berg hinunter.",
    "Zwei Kinder spielen im Sand am Strand.",
    "Eine Frau in einem roten Kleid singt auf einer Bühne.",
]
for package, ct2 in zip(
    translate(model, tokenizer, sentences),
    engine.translate(sentences),
    strict=True,
):
    print(f"package:     {package}\nCTranslate2: {ct2}\n")

# %% [markdown]
# ## The same translations
#
# On the whole test set, greedy decoding gives the same output in both engines, sentence for
# sentence. Beam search does not quite: the engine divides a hypothesis's log-probability by
# $|Y|^\alpha$ where the paper's $lp$ is $((5 + |Y|)/6)^\alpha$ (the [decoding
# chapter](14_decoding.ipynb)), and stops a search by another rule, so a few sentences end with
# another candidate. The BLEU scores differ by less than 0.3.

# %% tags=["nbval-ignore-output"]
import sacrebleu

from transformer.multi30k import load_pairs

test = load_pairs("test_2016_flickr", "de-en")
sources = [source for source, _ in test]
references = [[target for _, target in test]]
same = {}
for beam in (1, 4):
    ours = translate(model, tokenizer, sources, beam_size=beam)
    theirs = engine.translate(sources, beam_size=beam)
    same[beam] = sum(a == b for a, b in zip(ours, theirs, strict=True))
    bleu = [sacrebleu.corpus_bleu(t, references).score for t in (ours, theirs)]
    print(
        f"beam {beam}: {same[beam]} of {len(sources)} translations identical; "
        f"BLEU {bleu[0]:.2f} (package), {bleu[1]:.2f} (CTranslate2)"
    )
    assert abs(bleu[0] - bleu[1]) < 0.3
assert same[1] >= 0.99 * len(sources)

# %% [markdown]
# ## The command line
#
# `python -m transformer ctranslate2 --pair de-en OUT` writes the folder, in float32 or, with
# `--quantize int8`, with 8-bit weights; `translate --engine ctranslate2 --model OUT` translates
# with it, with the package engine's options and tokenizer. The appendix [The command
# line](a10_cli.ipynb) builds both.
#
# A model the export does not convert is refused before anything is written:

# %%
from transformer.config import TransformerConfig
from transformer.model import Transformer

pre_norm = Transformer(
    TransformerConfig(
        src_vocab_size=tokenizer.vocab_size, norm_first=True, n_layers=1
    )
)
try:
    export_ctranslate2(pre_norm, tokenizer, scratch / "pre-norm")
except ValueError as err:
    print(err)
assert not (scratch / "pre-norm").exists()

# %% [markdown]
# ## Speed
#
# CTranslate2 runs the same weights as fused C++ kernels; the package runs the batched searches of
# [Translating text](a08_translating.ipynb) in PyTorch. `python -m experiments.decode_bench` times
# both on one machine with the same two threads, side by side in one run, decoding tokenised test
# sentences 32 at a time or one at a time, as a user translating a sentence would, and the engine
# with 8-bit weights too. The table and chart read its stored results ("same": translations
# identical to the package's; "× CT2 before": the same run on the searches before their faster
# decoding step, `decode-cpu-before.json`).

# %% tags=["hide-input"]
import altair as alt
import pandas as pd

from transformer.paths import HOME
from transformer.plots import use_book_renderer

use_book_renderer()
benchmarks = HOME / "experiments" / "benchmarks"
bench = json.loads((benchmarks / "decode-cpu.json").read_text())
before = json.loads((benchmarks / "decode-cpu-before.json").read_text())
assert before["machine"] == bench["machine"]
key = ["decoding", "batch", "engine"]
speed, earlier = (
    pd.DataFrame(
        [r for r in run["rows"] if r["engine"] != "package-int8"]
    ).rename(
        columns={
            "batch_size": "batch",
            "sentences_per_s": "sentences/s",
            "ratio": "× CT2",
            "same_as_package": "same",
            "bleu": "BLEU",
        }
    )  # fmt: skip
    for run in (bench, before)
)
speed = speed.merge(
    earlier[[*key, "× CT2"]].rename(columns={"× CT2": "× CT2 before"}), on=key
)
print(
    f"{bench['machine']}, {bench['threads']} threads, torch {bench['torch']}"
)
package = speed[speed.engine == "package"].set_index(["batch", "decoding"])
for (batch, decoding), row in package.iterrows():
    print(
        f"batch {batch}, {decoding}: package at {row['× CT2']:.2f}× the"
        f" engine's speed, {row['× CT2 before']:.2f}× before"
    )
ratio = package["× CT2"]  # what the prose below says of them
assert (ratio.xs("greedy", level="decoding") >= 0.95).all()
assert 0.6 <= ratio[32, "beam 4"] <= 0.7 and 0.75 <= ratio[1, "beam 4"] <= 0.85
int8 = speed[speed.engine == "ct2-int8"]["× CT2"]
print(f"ct2-int8: {int8.min():.2f}× to {int8.max():.2f}× float32's speed")
assert round(int8.max(), 2) == 1.27
speed.set_index(key)[
    ["sentences/s", "× CT2", "× CT2 before", "same", "BLEU"]
].round({"sentences/s": 1, "× CT2": 2, "× CT2 before": 2, "BLEU": 2})

# %% [markdown]
# What to see: greedy decoding in the package keeps up with the engine, 32 sentences at a time or
# one; beam 4 runs at two thirds of the engine's speed with 32, four fifths with one, as the
# package pays for each of a step's many small operations. Greedy translations are identical.
# Int8 weights make the engine at most 27% faster and change a few translations (the BLEU column). [Derivations and counts](a11_counts.ipynb)
# profiles a decoding step and says where the engine's lead comes from.

# %% tags=["hide-input"]
alt.Chart(speed[speed.engine != "ct2-float32"]).mark_bar().encode(
    x=alt.X("× CT2:Q", title="× CTranslate2 float32"),
    y=alt.Y("engine:N", title=None),
    color=alt.Color("engine:N", legend=None),
    row=alt.Row("decoding:N", title=None),
    column=alt.Column("batch:O", title="sentences per batch"),
    tooltip=["engine", "decoding", "batch", "sentences/s", "× CT2", "BLEU"],
).properties(width=200, height=90, title="Decoding speed on the CPU")

# %% tags=["remove-cell"]
import shutil

shutil.rmtree(scratch)
