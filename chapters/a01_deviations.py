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
# # Deviations from the paper
#
# With its defaults, `TransformerConfig` is Table 3's base model {cite:p}`vaswani2017attention`
# but for the attention biases, and `translate` searches with the paper's beam. Every departure:
# **defaults** that differ, **options** off unless asked for, and **the recipe**
# (`multi30k_recipe`) of the shipped models. Where the paper is silent ("not stated"), the book
# follows the authors' tensor2tensor {cite:p}`vaswani2018tensor2tensor` unless the entry says
# otherwise.

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

# %% [markdown]
# ## The differences
#
# ### Defaults
#
# Attention biases
# : **Book:** a bias on each of $W^Q, W^K, W^V, W^O$; `MultiHeadAttention(bias=False)` is the paper's layer. **Paper:** none (Section 3.2.2, tensor2tensor). **Why:** as `nn.MultiheadAttention` and the Annotated Transformer; the shipped models have them. **Measured:** below; Derivations and counts (0.06% of the base model).
#
# Initialisation
# : **Book:** Glorot-uniform matrices, zero biases, embeddings $\mathcal{N}(0, d_\text{model}^{-1})$. **Paper:** not stated. **Why:** tensor2tensor's scales: unit-variance embeddings after the $\sqrt{d_\text{model}}$ factor, logits of variance about 1. **Measured:** Putting it together.
#
# LayerNorm $\epsilon$
# : **Book:** $10^{-6}$ (PyTorch's default is $10^{-5}$). **Paper:** not stated. **Why:** tensor2tensor's value. **Measured:** Feed-forward sublayers and residual connections.
#
# `max_len`
# : **Book:** 512 positions. **Paper:** none (sinusoids exist at every position). **Why:** the table is computed once; learned positions need a row count. **Measured:** Embeddings and positional encoding.
#
# Corpus and direction
# : **Book:** Multi30k, 29,000 caption pairs, German→English and French→English. **Paper:** WMT 2014, 4.5M English–German and 36M English–French pairs, into German and French. **Why:** a real model trains on one GPU in minutes. **Measured:** The data.
#
# Text before BPE
# : **Book:** Unicode NFC, whitespace runs to one space, then spaCy's words. **Paper:** "byte-pair encoding" (Section 5.1). **Why:** an exact text-to-ids round trip; merges never cross a word. **Measured:** The data.
#
# Vocabulary
# : **Book:** one joint BPE of 8,000 entries per pair, learned from `train` only. **Paper:** shared BPE of about 37,000 (English–German), word-pieces of 32,000 (English–French). **Why:** beyond 8,000 most new entries are rare. **Measured:** The data; Experiments.
#
# Batch size
# : **Book:** at most 8,000 padded tokens per side (`MAX_TOKENS`); the recipe 3,000, about 160 updates per Multi30k epoch. **Paper:** about 25,000 source and 25,000 target tokens over 8 GPUs. **Why:** enough updates per epoch on a small corpus. **Measured:** Experiments.
#
# Label smoothing
# : **Book:** $\epsilon_{ls}$ = 0.1 over all $V$ tokens, the right one included. **Paper:** 0.1; tensor2tensor spreads it over the $V - 1$ others. **Why:** as {cite:t}`szegedy2016rethinking` and `F.cross_entropy(label_smoothing=ε)` define it; the targets differ by about $\epsilon_{ls}/V$. **Measured:** Label smoothing.
#
# Ended beams
# : **Book:** an ended hypothesis keeps its slot among the $K$; the best ended one is also kept aside. **Paper:** beam 4, $\alpha$ = 0.6; tensor2tensor keeps $K$ open beams and the ended ones apart, exploring more. **Why:** beam 1 is then exactly greedy decoding, and a batch steps with $K$ candidates per sentence. **Measured:** not measured.
#
# When the search stops
# : **Book:** when no open beam can overtake the best ended one. **Paper:** "terminate early when possible" (Section 6.1). **Why:** the result is exactly that of searching to the length limit. **Measured:** Decoding.
#
# The score
# : **Book:** sacreBLEU, cased, on detokenised text, with its signature; lowercased tokenised BLEU beside it. **Paper:** BLEU on tokenised newstest2014. **Why:** a number others can reproduce. **Measured:** Results.
#
# ### Options, off by default
#
# `norm_first=True`
# : **Book:** pre-norm, $x + \mathrm{Dropout}(\mathrm{Sublayer}(\mathrm{LayerNorm}(x)))$. **Paper:** post-norm, $\mathrm{LayerNorm}(x + \mathrm{Sublayer}(x))$. **Why:** learns much faster at first, without a long warm-up; ends no better than the shipped runs. **Measured:** Feed-forward sublayers and residual connections; Experiments.
#
# `attention_dropout`, `ffn_dropout`
# : **Book:** dropout on the attention weights and after the feed-forward ReLU. **Paper:** on sublayer outputs and embedding sums only (Section 5.4). **Why:** tensor2tensor's later addition, for small data. **Measured:** Experiments (within chance).
#
# `positional="learned"`
# : **Book:** one learned vector per position. **Paper:** sinusoids; learned positions "nearly identical" (Table 3, row E). **Why:** the paper's own alternative. **Measured:** Embeddings and positional encoding.
#
# `share_embeddings=False`, `tgt_vocab_size`
# : **Book:** two vocabularies and two tables. **Paper:** one shared table, also the output layer (Section 3.4). **Why:** for languages without a shared vocabulary. **Measured:** Derivations and counts.
#
# `bpe_dropout`
# : **Book:** each training word segmented afresh, merges dropped at rate $p$. **Paper:** none. **Why:** aimed at rare words {cite:p}`provilkov2020bpe`. **Measured:** The data; Experiments (worse).
#
# ### The recipe of the shipped models
#
# Model size
# : **Book:** 3 + 3 layers, $d_\text{model}$ = 256, $d_{ff}$ = 512, 8 heads: 6.0M parameters (the `TrainConfig` default). **Paper:** base: 6 + 6, 512, 2,048, 8. **Why:** small data favours small models; the base model learned far more slowly. **Measured:** Experiments; Derivations and counts.
#
# Dropout
# : **Book:** 0.3 (`TransformerConfig` default: 0.1). **Paper:** 0.1 for the base model, 0.3 for the big English–German one. **Why:** with 0.1 the validation perplexity turns up after about 16 epochs. **Measured:** Experiments.
#
# Warm-up
# : **Book:** 800 updates, about five epochs (`TrainConfig` default: 4,000). **Paper:** 4,000. **Why:** 4,000 updates would be 25 Multi30k epochs. **Measured:** The training loop.
#
# Learning-rate factor
# : **Book:** 0.7 times equation (3) (default 1). **Paper:** equation (3). **Why:** a peak of $1.5 \times 10^{-3}$ for batches eight times smaller. **Measured:** The optimiser and its learning-rate schedule.
#
# Length of training
# : **Book:** 35 epochs, about 5,600 updates (`TrainConfig` default: 10 epochs). **Paper:** 100,000 updates (base), 300,000 (big). **Why:** at dropout 0.3 the validation perplexity still falls at epoch 35. **Measured:** Experiments.
#
# Checkpoint averaging
# : **Book:** the last 5 epochs. **Paper:** the last 5 checkpoints, 10 minutes apart. **Why:** the same idea, in epochs. **Measured:** Results (41.6 against 41.0 for the last epoch alone, German→English).
#
# Arithmetic
# : **Book:** float32 (`TrainConfig` default: bfloat16 autocast from compute capability 8.0, float16 with loss scaling on older GPUs, float32 on a CPU). **Paper:** not stated. **Why:** for the recipe's small model bfloat16 autocast is slower on an H100. **Measured:** Derivations and counts.
#
# ## The attention biases
#
# They add $4 d_\text{model}$ parameters per attention block and start at zero, so the first step
# computes the paper's layer. $W^K$'s bias $b_K$ does nothing: it adds $q \cdot b_K / \sqrt{d_k}$
# to every score of the query $q$, the same for every key, which the softmax removes, so its
# gradient is zero. The other three make the projections affine; no model was trained without
# them, so their effect is not measured. On a random layer:

# %%
import torch

from transformer.attention_config import AttentionConfig
from transformer.multihead import MultiHeadAttention

torch.manual_seed(0)
attention = MultiHeadAttention(
    AttentionConfig(d_model=16, n_heads=4), bias=True
)
# Biases away from zero, so that no gradient vanishes by accident.
for bias in (attention.w_q.bias, attention.w_k.bias, attention.w_v.bias):
    torch.nn.init.normal_(bias)
x = torch.randn(2, 5, 16)
output, _ = attention(x, x, x)
output.square().sum().backward()
names = ("w_q", "w_k", "w_v", "w_o")
largest = {
    name: getattr(attention, name).bias.grad.abs().max().item()
    for name in names
}
assert (
    largest["w_k"] < 1e-6 < min(largest["w_q"], largest["w_v"], largest["w_o"])
)
{
    name: "zero" if value < 1e-6 else "nonzero"
    for name, value in largest.items()
}

# %% [markdown]
# ## The recipe
#
# The recipe resizes what the paper sized for 4.5 million pairs (model, batches, warm-up, length of
# training), scales the learning rate by 0.7 and takes the big model's dropout; the rest is the
# paper's. The shipped models are the post-norm runs with the lowest averaged validation
# perplexity; on this corpus and budget no departure from the paper beat them by more than a
# second seed moves a run.
