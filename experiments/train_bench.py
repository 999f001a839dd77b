"""Training speed of the package's Transformer against PyTorch's own `nn.Transformer`, side by
side in one run.

    python -m experiments.train_bench --out experiments/benchmarks/train-cpu.json

Both models have the recipe's dimensions (3 + 3 post-norm layers, d_model 256, 8 heads, d_ff
512, dropout 0.1 on the residuals, the attention weights and the feed-forward layer, as
`nn.Transformer` applies it) and the same embedding, sinusoids and tied output layer around the
stacks, so only the stacks differ. They train on the same token-budget batches of Multi30k
German→English (`--max-tokens`, 3,000 as in the recipe) with the label-smoothed loss and Adam:
forward, backward and optimiser step. The two models take turns, one block of `--steps`
batches each, `--repeats` times, and the median of each one's target tokens per second is
reported (padding excluded), with the ratio package / nn.Transformer.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import Tensor, nn

from transformer.config import TransformerConfig
from transformer.embedding import PositionalEncoding, TokenEmbedding
from transformer.encoded_cache import load_encoded, prepare
from transformer.encoded_split import iterate_batches
from transformer.loss import LabelSmoothingLoss
from transformer.masking import padding_mask, target_mask
from transformer.model import Generator, Transformer
from transformer.schedule import make_optimizer
from transformer.split_translation import write_lines

from .decode_bench import machine

DIMENSIONS = dict(d_model=256, n_heads=8, n_layers=3, d_ff=512)
# The paper's dropout and positions, which nn.Transformer applies on the attention weights and
# in the feed-forward layer too.
PAPER = TransformerConfig(src_vocab_size=1)
DROPOUT, MAX_LEN = PAPER.dropout, PAPER.max_len


class LibraryTransformer(nn.Module):
    """`nn.Transformer` between the package's embedding, sinusoids and tied output layer."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        d = DIMENSIONS["d_model"]
        self.embed = TokenEmbedding(vocab_size, d)
        self.src_pos = PositionalEncoding(d, MAX_LEN, DROPOUT)
        self.tgt_pos = PositionalEncoding(d, MAX_LEN, DROPOUT)
        self.stacks = nn.Transformer(
            d_model=d,
            nhead=DIMENSIONS["n_heads"],
            num_encoder_layers=DIMENSIONS["n_layers"],
            num_decoder_layers=DIMENSIONS["n_layers"],
            dim_feedforward=DIMENSIONS["d_ff"],
            dropout=DROPOUT,
            layer_norm_eps=PAPER.layer_norm_eps,
            batch_first=True,
            norm_first=False,
        )
        self.generator = Generator(d, vocab_size)
        self.generator.proj.weight = self.embed.embedding.weight

    def forward(self, src: Tensor, tgt: Tensor, pad_id: int) -> Tensor:
        T = tgt.size(1)
        causal = torch.ones(T, T, dtype=torch.bool).triu(1)  # True: may not attend
        out = self.stacks(
            self.src_pos(self.embed(src)),
            self.tgt_pos(self.embed(tgt)),
            tgt_mask=causal,
            src_key_padding_mask=src == pad_id,
            tgt_key_padding_mask=tgt == pad_id,
            memory_key_padding_mask=src == pad_id,
            tgt_is_causal=True,
        )
        return self.generator(out)


def package_model(vocab_size: int) -> Transformer:
    config = TransformerConfig(
        src_vocab_size=vocab_size,
        **DIMENSIONS,
        dropout=DROPOUT,
        attention_dropout=DROPOUT,
        ffn_dropout=DROPOUT,
    )
    return Transformer(config)


def train_block(model, forward, batches, optimizer, loss_fn) -> tuple[float, int]:
    """Seconds and target tokens of training on `batches`."""
    tokens = 0
    start = time.perf_counter()
    for batch in batches:
        loss = loss_fn(forward(model, batch), batch.tgt_out)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        tokens += batch.n_tgt_tokens
    return time.perf_counter() - start, tokens


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=3000)
    p.add_argument("--steps", type=int, default=20, help="batches per block")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokenizer = prepare("de-en")
    data = load_encoded("de-en", "train")
    batches = list(iterate_batches(data, tokenizer, max_tokens=args.max_tokens))
    batches = batches[: args.steps]
    pad = tokenizer.pad_id
    loss_fn = LabelSmoothingLoss(pad_id=pad)  # the paper's ε_ls

    def ours(model, b):
        src_mask, tgt_mask = padding_mask(b.src, pad), target_mask(b.tgt_in, pad)
        return model(b.src, b.tgt_in, src_mask=src_mask, tgt_mask=tgt_mask)

    def theirs(model, b):
        return model(b.src, b.tgt_in, pad)

    runs = {}
    for name, model, forward in (
        ("package", package_model(tokenizer.vocab_size), ours),
        ("nn.Transformer", LibraryTransformer(tokenizer.vocab_size), theirs),
    ):
        model.train()
        optimizer, _ = make_optimizer(model, d_model=DIMENSIONS["d_model"])
        train_block(model, forward, batches[:3], optimizer, loss_fn)  # warm-up
        runs[name] = (model, forward, optimizer, [])
    for _ in range(args.repeats):
        for name, (model, forward, optimizer, rates) in runs.items():
            seconds, tokens = train_block(model, forward, batches, optimizer, loss_fn)
            rates.append(tokens / seconds)
            print(
                f"{name:<15} {tokens / seconds:8.0f} target tokens/s", file=sys.stderr
            )
    result = {
        "machine": machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "max_tokens": args.max_tokens,
        "steps": args.steps,
        "repeats": args.repeats,
        "parameters": {
            name: sum(p.numel() for p in model.parameters())
            for name, (model, *_) in runs.items()
        },
        "tokens_per_s": {name: rates for name, (*_, rates) in runs.items()},
    }
    median = {k: statistics.median(v) for k, v in result["tokens_per_s"].items()}
    result["ratio"] = median["package"] / median["nn.Transformer"]
    print(
        f"package {median['package']:.0f}, nn.Transformer {median['nn.Transformer']:.0f} "
        f"target tokens/s: {result['ratio']:.2f}x ({result['machine']}, "
        f"{args.threads} threads)"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        write_lines(args.out, [json.dumps(result, indent=1)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
