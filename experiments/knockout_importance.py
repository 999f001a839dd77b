"""What each head of the shipped models is for: validation BLEU with each
attention head switched off alone, then with heads switched off one group
after another, least important first (Michel et al., 2019, Figure 3).

    python -m experiments.knockout_importance

For each pair, the shipped model translates the first `--sentences` of the
validation split greedily (the batched search, `batch_size` 32), with nothing
switched off, then with each head of the three kinds of attention switched off
alone (`transformer.knockout`), scored by sacreBLEU's BLEU as `evaluate`
computes it. The heads are then ranked by the BLEU left without them, highest
first (the least important), and switched off cumulatively, `--step` at a
time, down to none. The record (the machine, the subset, the decoding, the
baseline, each head's BLEU, the curve, the seconds) is written atomically after
each pair, by default to experiments/results/knockout-importance.json, which
the appendix "What the heads do" reads. The sources are tokenised once; the
baseline is checked equal to `translate`'s. About 3 minutes a pair on 2 idle
cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU

from transformer.atomic import atomic_write
from transformer.batched_search import batched_greedy_decode
from transformer.checked_data import load_pairs
from transformer.decode_options import DecodeOptions
from transformer.knockout import ATTENTIONS, KnockOut, Part, knocked_out
from transformer.multi30k import PAIRS
from transformer.tokenizer import normalize
from transformer.translation import (
    length_sorted_batches,
    load_pair_model,
    translate,
)

from .decode_bench import machine

RESULT = Path(__file__).resolve().parent / "results" / "knockout-importance.json"
SPLIT = "val"
OPTIONS = DecodeOptions(beam_size=1)  # greedy, the package's batch size


def heads(config) -> list[Part]:
    """Every head of the three kinds of attention, in the model's order."""
    return [
        Part(kind, layer, head)
        for kind in ATTENTIONS
        for layer in range(1, config.n_layers + 1)
        for head in range(1, config.n_heads + 1)
    ]


class Scorer:
    """Validation BLEU of one model with parts switched off: the sources
    tokenised once, in the batches that `translate` makes."""

    def __init__(self, model, tokenizer, pairs: list[tuple[str, str]]):
        self.model, self.tokenizer = model, tokenizer
        self.references = [reference for _, reference in pairs]
        encoded = tokenizer.encode_batch([normalize(s) for s, _ in pairs])
        room = model.config.max_len - 1
        self.sources = [ids[:room] + [tokenizer.eos_id] for ids in encoded]
        self.metric = BLEU()
        self.batches = length_sorted_batches(
            [len(s) for s in self.sources], OPTIONS.batch_size
        )

    def translations(self, spec: KnockOut) -> list[str]:
        tok, results = self.tokenizer, [""] * len(self.sources)
        special = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
        with knocked_out(self.model, spec):
            for batch in self.batches:
                rows = [self.sources[i] for i in batch]
                src = torch.full((len(rows), len(rows[0])), tok.pad_id)
                for r, ids in enumerate(rows):
                    src[r, : len(ids)] = torch.tensor(ids)
                found = batched_greedy_decode(self.model, src, OPTIONS, **special)
                for i, best in zip(batch, found, strict=True):
                    results[i] = tok.decode(best.tokens)
        return results

    def bleu(self, spec: KnockOut) -> float:
        found = self.metric.corpus_score(self.translations(spec), [self.references])
        return round(found.score, 2)


def measure(pair: str, sentences: int, step: int, say) -> dict:
    """One pair's record: the baseline, each head alone, and the curve."""
    started = time.perf_counter()
    model, tokenizer = load_pair_model(pair)
    pairs = load_pairs(SPLIT, pair)[:sentences]
    scorer = Scorer(model, tokenizer, pairs)
    baseline = scorer.translations(KnockOut())
    sources = [source for source, _ in pairs]
    if baseline != translate(model, tokenizer, sources, OPTIONS):
        raise AssertionError("the scorer's translations are not translate's")
    base = scorer.bleu(KnockOut())
    single = []
    for part in heads(model.config):
        single.append(
            {"part": str(part), "bleu": scorer.bleu(KnockOut(frozenset([part])))}
        )
        say(f"{pair} {part}: {single[-1]['bleu']:.2f} (all on {base:.2f})")
    # Least important first: the highest BLEU without the head; ties in order.
    ranked = sorted(range(len(single)), key=lambda i: -single[i]["bleu"])
    order = [single[i]["part"] for i in ranked]
    curve = [{"heads_left": len(order), "bleu": base}]
    for off in range(step, len(order) + 1, step):
        spec = KnockOut.parse(",".join(order[:off]))
        curve.append({"heads_left": len(order) - off, "bleu": scorer.bleu(spec)})
        say(f"{pair} {len(order) - off} heads left: {curve[-1]['bleu']:.2f}")
    return {
        "baseline_bleu": base,
        "bleu_signature": str(scorer.metric.get_signature()),
        "heads": single,
        "pruning_order": order,
        "pruning": curve,
        "seconds": round(time.perf_counter() - started, 1),
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", type=Path, default=RESULT, metavar="FILE")
    p.add_argument("--pairs", nargs="+", choices=list(PAIRS), default=list(PAIRS))
    p.add_argument("--sentences", type=int, default=300, metavar="N")
    p.add_argument("--step", type=int, default=6, metavar="N")
    p.add_argument("--threads", type=int, default=2, metavar="N")
    args = p.parse_args()
    for name in ("sentences", "step", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not args.out.parent.is_dir():
        p.error(f"cannot write {args.out}: no folder {args.out.parent}")
    torch.set_num_threads(args.threads)
    record = {
        "what": "validation BLEU with attention heads switched off",
        "machine": machine(),
        "threads": args.threads,
        "torch": torch.__version__,
        "split": SPLIT,
        "sentences": args.sentences,
        "decoding": f"greedy, batched, batch_size {OPTIONS.batch_size}",
        "step": args.step,
        "pairs": {},
    }
    for pair in args.pairs:
        say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
        record["pairs"][pair] = measure(pair, args.sentences, args.step, say)
        text = json.dumps(record, indent=1, ensure_ascii=False) + "\n"
        atomic_write(args.out, text.encode("utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
