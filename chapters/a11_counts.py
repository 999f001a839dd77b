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
# # Derivations and counts
#
# What the Transformer costs: the arithmetic of attention and of a training step, the share of a
# GPU's peak that training reaches, the parameters against Table 3
# {cite:p}`vaswani2017attention`, and where a CPU spends its time. A FLOP is one addition or one
# multiplication.

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

# %%
import json
import statistics

import pandas as pd
import torch
from IPython.display import display
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from transformer.attention_config import AttentionConfig
from transformer.config import TransformerConfig
from transformer.model import Transformer
from transformer.multihead import MultiHeadAttention
from transformer.paths import DATA_DIR

_ = torch.manual_seed(0)  # the random inputs of the FLOP table

# %% [markdown]
# ## The cost of multi-head attention
#
# "Due to the reduced dimension of each head, the total computational cost is similar to that of
# single-head attention with full dimensionality" (Section 3.2.2). For a self-attention layer over
# $T$ positions:
#
# - the projections $W^Q, W^K, W^V, W^O$ cost $4 \cdot 2 T d_\text{model}^2$ whatever $H$ is:
#   together the heads' projections are one $d_\text{model} \times d_\text{model}$ matrix;
# - the scores $QK^\top$, $H$ heads of $T \times T$ dot products of width $d_k$, cost $2 H T^2 d_k
#   = 2 T^2 d_\text{model}$, and so does the weighted sum of the values;
# - the softmax, one exponential per score, costs $H T^2$, the only term that grows with $H$.
#
# The table evaluates these for $d_\text{model}$ = 512 and $T$ = 32, in millions; the last column
# is PyTorch's `FlopCounterMode` count of the module's matrix products.


# %%
def attention_flops(T: int, d_model: int, n_heads: int) -> dict:
    d_k = d_model // n_heads
    return {
        "heads": n_heads,
        "d_k": d_k,
        "projections": 4 * 2 * T * d_model * d_model,
        "QKᵀ": n_heads * 2 * T * T * d_k,
        "weights·V": n_heads * 2 * T * T * d_k,
        "softmax": n_heads * T * T,
    }


T_cost, d_cost = 32, 512
rows = []
for n_heads in (1, 2, 4, 8, 16, 32):
    row = attention_flops(T_cost, d_cost, n_heads)
    layer = MultiHeadAttention(
        AttentionConfig(d_model=d_cost, n_heads=n_heads)
    )
    tokens = torch.randn(1, T_cost, d_cost)  # (B, T, d_model)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        layer(tokens, tokens, tokens, need_weights=True)
    row["matrix products, counted"] = counter.get_total_flops()
    rows.append(row)
flops = pd.DataFrame(rows).set_index("heads")
matmul = flops["projections"] + flops["QKᵀ"] + flops["weights·V"]
assert (
    flops["matrix products, counted"] == matmul
).all()  # the formulas are right
assert (matmul == matmul.iloc[0]).all()  # the same for every number of heads
flops.insert(5, "total", matmul + flops["softmax"])
assert (flops["softmax"] / flops["total"]).max() < 0.01
in_millions = (flops.drop(columns="d_k") / 1e6).round(3)
in_millions.insert(0, "d_k", flops["d_k"])
in_millions

# %% [markdown]
# The counter agrees: the matrix products cost the same for one head of width 512 as for 32 of
# width 16, and the softmax stays under 1%. What grows with $H$ is memory, wherever the $H$ weight
# matrices of $T \times T$ are stored.
#
# The two $T^2$ products, $4 T^2 d_\text{model}$, overtake the projections' $8 T d_\text{model}^2$
# only when $T > 2 d_\text{model}$: beyond 1,024 tokens for the base model. This is the paper's
# Table 1 with its constants: self-attention is cheaper than a recurrent layer while $n < d$
# (Section 4).

# %%
crossover = 2 * d_cost
for T in (crossover // 2, 2 * crossover):
    row = attention_flops(T, d_cost, 8)
    square = row["QKᵀ"] + row["weights·V"]
    assert (square > row["projections"]) == (T > crossover)

# %% [markdown]
# ## A training step
#
# A forward and backward pass costs about 6 FLOPs per parameter and per token it is applied to: 2
# for the forward product, 4 for the two backward ones. The attention products, quadratic in the
# lengths, come on top. For a pair of $S$ source and $T$ target tokens, padding excluded:
#
# $$
# \begin{aligned}
# \mathrm{FLOPs} = {} & 6\left((N_{enc} + N_{kv}) S + (N_{dec} - N_{kv} + d_{model} V) T\right) \\
# & + 12\, d_{model} \left(L_e S^2 + L_d T^2 + L_d S T\right)
# \end{aligned}
# $$
#
# where $N_{enc}$ and $N_{dec}$ are the stacks' parameters without the embeddings and $L_e = L_d$ =
# `n_layers`. The cross-attention's key and value projections, $N_{kv}$, belong to the decoder but
# apply to the encoder's $S$ positions. The output layer, $d_{model} V$, is tied to the embedding
# table but still multiplies at every target position. Each attention term (encoder, decoder,
# cross) takes $2 \cdot 2\, d_{model} S^2$ forward per layer, three times that with the backward
# pass; softmaxes, normalisations and masks are left out. For the base model, $V$ = 37,000 and a
# pair of 25 source and 27 target tokens:

# %%
from transformer.flops import (
    cross_attention_kv_parameters,
    non_embedding_parameters,
    training_flops,
)

# On the meta device the layers have shapes but no memory, and draw no random
# numbers.
with torch.device("meta"):
    base = Transformer(TransformerConfig.base(37_000))
n_enc, n_dec = non_embedding_parameters(base)
n_kv = cross_attention_kv_parameters(base)
assert n_kv == 6 * 2 * (
    512 * 512 + 512
)  # six layers, W_K and W_V with their biases
flops = training_flops(base, src_lengths=[25], tgt_lengths=[27])[0]
attention = 12 * 512 * 6 * (25**2 + 27**2 + 25 * 27)
output_layer = 6 * 512 * 37_000 * 27
linear = 6 * ((n_enc + n_kv) * 25 + (n_dec - n_kv + 512 * 37_000) * 27)
assert flops == linear + attention
assert (
    9e9 < flops < 11e9
    and attention / flops < 0.01
    and 0.3 < output_layer / flops < 0.34
)
print(f"N_enc {n_enc:,}, N_dec {n_dec:,}, of which N_kv {n_kv:,}")
print(
    f"FLOPs {flops / 1e9:.2f} G, of which attention {attention / flops:.1%} "
    f"and the output layer {output_layer / flops:.1%}"
)
# A batch is the sum of its pairs: padding costs nothing in the count.
two = training_flops(base, src_lengths=[25, 10], tgt_lengths=[27, 12])
assert (
    two.sum()
    == flops + training_flops(base, src_lengths=[10], tgt_lengths=[12])[0]
)

# %% [markdown]
# About 10 GFLOPs: attention under 1% of them, the output layer almost a third. A large vocabulary
# is expensive even when shared.
#
# ## Model FLOPs utilisation
#
# Training reports **tokens per second** (real target tokens) and **model FLOPs utilisation**
# (MFU): the count above, summed over an update, over the update's time and the hardware's peak
# rate. For an NVIDIA H100 or H200 that rate is the measured one of their bfloat16 matrix products,
# about $790 \times 10^{12}$ FLOP/s (`TrainConfig.peak_flops`), for float32 runs too.
#
# `checkpoints/throughput-h100.json` times the training loop alone on one H100, over the second of
# two epochs of German→English: the recipe's model (batches of 3,000 tokens, dropout 0.2 here) and
# the paper's base model on batches of 25,000 tokens, each in float32 and under bfloat16 autocast.
# The repeated row shows the noise.

# %%
bench = pd.DataFrame(
    json.loads(
        (
            DATA_DIR.parents[1] / "checkpoints" / "throughput-h100.json"
        ).read_text()
    )
)
assert (bench["device"] == "NVIDIA H100 80GB HBM3").all()
speed = bench.set_index("variant")["tokens_per_s"]
mfu = bench.set_index("variant")["mfu"]
assert (
    min(speed["recipe fp32"], speed["recipe fp32 (repeated)"])
    > speed["recipe bf16"]
)
assert speed["base-25k bf16"] > 2 * speed["base-25k fp32"]
assert mfu.max() == mfu["base-25k bf16"] < 0.1
pd.DataFrame(
    {
        "tokens/s": bench["tokens_per_s"].round(-2).astype(int),
        "MFU (%)": (100 * bench["mfu"]).round(2),
        "updates per epoch": bench["updates_per_epoch"],
    }
).set_axis(bench["variant"])

# %% [markdown]
# For the recipe's model bfloat16 is *slower* than float32, and the MFU about half a percent: the
# model is small for this card, each update launches many small kernels, and autocast adds a
# conversion before most products. So the recipe trains in float32. The base model gives bfloat16
# enough work to run more than twice as fast, yet uses under a tenth of the card: MFU does not
# count softmax, normalisation, dropout or the optimiser. The stored MFUs charge $N_{kv}$ to the
# target positions, not the source: a fraction of a percent when the lengths are similar:

# %%
moved = 6 * n_kv * (25 - 27)
print(
    "the cross-attention's W_K and W_V charged to T instead of S:"
    f" {-moved / flops:+.2%}"
)
assert abs(moved / flops) < 0.01

# %% [markdown]
# ## Parameters against Table 3
#
# Table 3 gives 65 million parameters for the base model and 213 million for the big one, with a
# shared vocabulary of "about 37000 tokens" (Section 5.1). Both presets at $V = 37{,}000$, each
# tensor counted once:


# %%
def parameter_breakdown(model: Transformer) -> dict[str, int]:
    """Parameters of each part, each tensor counted once (tied tensors where
    first seen)."""
    seen: set[int] = set()

    def count(*modules: nn.Module) -> int:
        total = 0
        for module in modules:
            for p in module.parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    total += p.numel()
        return total

    parts = {
        "embeddings": count(
            model.src_embed, model.tgt_embed, model.src_pos, model.tgt_pos
        ),
        "encoder": count(model.encoder),
        "decoder": count(model.decoder),
        "output layer": count(model.generator),
    }
    parts["total"] = sum(parts.values())
    assert parts["total"] == sum(p.numel() for p in model.parameters())
    assert (parts["encoder"], parts["decoder"]) == non_embedding_parameters(
        model
    )
    return parts


VOCAB = 37_000
paper_millions = {"base": 65, "big": 213}
with torch.device("meta"):
    built = {
        "base": Transformer(TransformerConfig.base(VOCAB)),
        "big": Transformer(TransformerConfig.big(VOCAB)),
    }
counts = pd.DataFrame(
    {name: parameter_breakdown(m) for name, m in built.items()}
).T
counts["paper (Table 3)"] = [
    paper_millions[name] * 10**6 for name in counts.index
]
counts["difference"] = (counts["total"] / counts["paper (Table 3)"] - 1).map(
    "{:+.1%}".format
)
counts.drop(columns="difference").map("{:,}".format).assign(
    difference=counts["difference"]
)

# %% [markdown]
# Each part follows from the layers' formulas (checked below); the attention biases, absent from
# the paper, are 0.06% of the base model:


# %%
def formula(config: TransformerConfig) -> dict[str, int]:
    d, d_ff, n = config.d_model, config.d_ff, config.n_layers
    attention = 4 * d * d + 4 * d  # W^Q, W^K, W^V, W^O and their biases
    ffn, norm = 2 * d * d_ff + d_ff + d, 2 * d
    return {
        "embeddings": config.src_vocab_size * d,
        "encoder": n * (attention + ffn + 2 * norm),
        "decoder": n * (2 * attention + ffn + 3 * norm),
    }


for name, m in built.items():
    for part, n in formula(m.config).items():
        assert counts.loc[name, part] == n, (name, part)
    assert counts.loc[name, "output layer"] == 0

base_total, big_total = (int(counts.loc[k, "total"]) for k in ("base", "big"))
assert base_total == 63_082_496
assert (
    abs(big_total / 213e6 - 1) < 0.01
    and -0.035 < base_total / 65e6 - 1 < -0.025
)
attention_biases = sum(
    p.numel()
    for name, p in built["base"].named_parameters()
    if "attn.w_" in name and name.endswith(".bias")
)
assert attention_biases == 18 * 4 * 512 == 36_864
print(
    f"base: {base_total:,} parameters, {base_total / 65e6 - 1:+.2%} from 65M"
)
print(
    f"big:  {big_total:,} parameters, {big_total / 213e6 - 1:+.2%} from 213M"
)
print(
    f"base, attention biases: {attention_biases:,},"
    f" {attention_biases / base_total:.2%}"
)

# %% [markdown]
# The big model is within 1% of the paper's count; the base model has about 3% fewer. Sharing is
# not the gap: without it the base model would have far more:

# %%
variants = {
    "as in the paper (shared and tied)": {},
    "output layer not tied": {"tie_output": False},
    "two vocabularies, nothing shared": {
        "tgt_vocab_size": VOCAB,
        "share_embeddings": False,
        "tie_output": False,
    },
}
with torch.device("meta"):
    sharing = pd.Series(
        {
            what: sum(
                p.numel()
                for p in Transformer(
                    TransformerConfig.base(VOCAB, **kw)
                ).parameters()
            )
            for what, kw in variants.items()
        },
        name="base model parameters",
    )
assert sharing.iloc[1] > 80e6 and sharing.iloc[2] > 100e6
assert (
    sharing.iloc[1] - sharing.iloc[0] == VOCAB * 512
)  # the tied output layer
sharing.map("{:,}".format)

# %% [markdown]
# **The embeddings are.** Between Table 3's base-model variants (rows C) of one $d_\text{model}$,
# our differences match the paper's to its rounding; what remains scales with $d_\text{model}$, as
# a larger embedding table would. Each row solved for the vocabulary that would make our count the
# paper's:

# %%
# Table 3, quoted: (N, d_model, d_ff, h, parameters in millions).
table3_rows = {
    "base": (6, 512, 2048, 8, 65),
    "C: N = 2": (2, 512, 2048, 8, 36),
    "C: N = 4": (4, 512, 2048, 8, 50),
    "C: N = 8": (8, 512, 2048, 8, 80),
    "C: d_model = 256": (6, 256, 2048, 8, 28),
    "C: d_model = 1024": (6, 1024, 2048, 8, 168),
    "C: d_ff = 1024": (6, 512, 1024, 8, 53),
    "C: d_ff = 4096": (6, 512, 4096, 8, 90),
    "big": (6, 1024, 4096, 16, 213),
}
rows = []
for name, (n, d_model, d_ff, h, paper) in table3_rows.items():
    c = TransformerConfig(
        VOCAB, n_layers=n, d_model=d_model, d_ff=d_ff, n_heads=h
    )
    parts = formula(c)
    ours = sum(parts.values())
    layers = parts["encoder"] + parts["decoder"]
    rows.append(
        {
            "row": name,
            "paper (M)": paper,
            "ours, V = 37,000 (M)": round(ours / 1e6, 2),
            "V that would match": int(
                round((paper * 1e6 - layers) / d_model, -2)
            ),
            "± (rounding)": int(round(0.5e6 / d_model, -1)),
        }
    )
implied = pd.DataFrame(rows).set_index("row")
assert (
    implied.drop(index="big")["V that would match"]
    .between(40_000, 42_000)
    .all()
)
assert (
    implied.loc["big", "V that would match"] < 37_000
)  # the big row does not fit
# Between rows of one d_model the differences match the paper's, to its
# rounding (±1M).
for chain in (
    ["C: N = 2", "C: N = 4", "base", "C: N = 8"],
    ["C: d_ff = 1024", "base", "C: d_ff = 4096"],
):
    steps = (
        implied.loc[chain, ["paper (M)", "ours, V = 37,000 (M)"]]
        .diff()
        .dropna()
    )
    assert (
        steps["paper (M)"] - steps["ours, V = 37,000 (M)"]
    ).abs().max() <= 1, chain
implied

# %% [markdown]
# Every base-model row fits a table of about 41,000 rows, some 4,000 more than Section 5.1 says;
# the big row would need about 35,800. The paper does not say how it counted. The recipe's model,
# with 8,000 entries, is far smaller:

# %%
with torch.device("meta"):
    recipe = Transformer(
        TransformerConfig(8_000, n_layers=3, d_model=256, n_heads=8, d_ff=512)
    )
recipe_parts = parameter_breakdown(recipe)
assert recipe_parts["total"] == 6_001_664
assert recipe_parts["embeddings"] == 8_000 * 256
print(
    f"{recipe_parts['total']:,} parameters,"
    f" {recipe_parts['embeddings'] / recipe_parts['total']:.0%} of them the"
    " shared table"
)

# %% [markdown]
# ## Where decoding time goes
#
# On a CPU the package's beam search trails CTranslate2 on the same weights (the speed section
# of [Deploying with CTranslate2](a09_ctranslate2.ipynb)). `python -m experiments.decode_bench
# --profile` profiles the package decoding 96 test sentences, 32 at a time, and sorts the time into
# groups, in percent:

# %%
decode_bench = json.loads(
    (
        DATA_DIR.parents[1] / "experiments/benchmarks/decode-cpu.json"
    ).read_text()
)
profile_shares = (100 * pd.DataFrame(decode_bench["profile"])).round(1)
assert abs(profile_shares.sum() - 100).max() < 0.5
linear = profile_shares.loc["projections and feed-forward"]
assert linear.between(20, 35).all()
assert profile_shares.loc["output layer"].between(12, 20).all()
# "Python": what the operations leave of the time the same decoding takes
# unprofiled.
profile_shares.sort_values("greedy", ascending=False)

# %% [markdown]
# The matrix products lead: the stacks' linear layers take a quarter to a third of the time,
# the output layer (a $d_\text{model} \times 8{,}000$ product at every step) under a fifth. On this AMD
# CPU, CTranslate2 multiplies float32 matrices with oneDNN, PyTorch with Intel MKL; `python -m
# experiments.gemm_backends` compares them. MKL's time over oneDNN's:

# %%
gemm = json.loads(
    (DATA_DIR.parents[1] / "experiments/benchmarks/gemm-cpu.json").read_text()
)
print(
    f"{gemm['machine']}, {gemm['threads']} threads, {gemm['sentences']}"
    " sentences"
)
engine_runs = pd.DataFrame(gemm["engine"])
engine_runs["seconds"] = engine_runs.seconds.map(statistics.median)
engine_runs = engine_runs.pivot(
    index="decoding", columns="sgemm", values="seconds"
)
package_runs = pd.DataFrame(gemm["package"]).set_index("decoding")
whole = pd.DataFrame(
    {
        "CTranslate2 (all products)": (
            engine_runs["MKL forced"] / engine_runs["own choice"]
        ),
        "package (output layer)": (
            package_runs.mkl.map(statistics.median)
            / package_runs.onednn.map(statistics.median)
        ),
        "same translations": package_runs.same,
    }
)
products = pd.DataFrame(gemm["products"])
products["MKL / oneDNN"] = products.mkl / products.onednn
output_layer = products[products["product"] == "output layer"].set_index(
    "rows"
)
small = products[
    (products["product"] != "output layer") & (products.rows == 32)
]
assert whole["CTranslate2 (all products)"].between(1.15, 1.5).all()
assert (whole["same translations"] == 1000).all()
assert whole.loc["beam 4", "package (output layer)"] > 1.05
assert (output_layer.loc[[4, 32], "MKL / oneDNN"] > 1.5).all()
assert (small["MKL / oneDNN"] < 1.1).all()
display(whole.round(2))
products.pivot(index="product", columns="rows", values="MKL / oneDNN").round(2)

# %% [markdown]
# Forced onto MKL, the engine decodes about 1.3× slower: a good part of its lead. MKL keeps up on
# the stacks' small products but is far slower on the output layer's 8,000 columns at a decoding
# step's few rows. Through oneDNN the package's output layer gives the same 1,000 translations and
# beam search gains about 15%, but that operation is private to PyTorch. The rest of the gap is
# attention and a step's many small operations, each a PyTorch call from Python where the engine
# runs fused C++ kernels.
#
# ## Training speed against `nn.Transformer`
#
# `python -m experiments.train_bench` trains PyTorch's `nn.Transformer` and the package's model
# side by side, with the same dimensions, embeddings, output layer, batches, loss and optimiser.
# Target tokens per second:

# %%
train_bench = json.loads(
    (DATA_DIR.parents[1] / "experiments/benchmarks/train-cpu.json").read_text()
)
print(f"{train_bench['machine']}, {train_bench['threads']} threads")
pd.DataFrame(train_bench["tokens_per_s"]).median().astype(int).rename(
    "target tokens/s"
)

# %% [markdown]
# The package trains at least as fast as the library, within the few percent by which repeated runs
# differ on a shared machine.
