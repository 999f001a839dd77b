"""Decoding speed of the package against CTranslate2 on the same weights, in one run.

    python -m experiments.decode_bench --profile --out experiments/benchmarks/decode-cpu.json

test_2016_flickr of one pair (German→English by default): the sources are tokenised once,
outside the clock, and both engines decode the same ids (the package's `greedy_decode` and
`beam_search`; CTranslate2's `translate_batch` on the model exported by
`transformer.export`, float32 and int8; and the package with PyTorch's dynamic int8
quantisation of its linear layers) in batches of 32 (all 1,000 sentences) and of 1 (the first
200: a user translating one sentence at a time), longest sources first, with the same number
of CPU threads. Each variant runs `--repeats` times (3) and reports the
median: sentences/s, target tokens/s (output tokens, <eos> excluded) and the sacreBLEU of its
translations. The JSON written to OUT (atomically) names the machine; the table printed gives
each variant's speed relative to CTranslate2 float32 with the same decoding and batch size.
With --profile, torch.profiler also splits the package's decoding time into groups of
operations (the output layer, the stacks' linear layers, attention, bookkeeping, Python).
"""

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch
from torch import nn

from transformer.data import load_pairs
from transformer.decode import (
    beam_search,
    greedy_decode,
    length_sorted_batches,
    load_pair_model,
)
from transformer.evaluate import write_lines
from transformer.export import CTranslate2Model, export_ctranslate2
from transformer.tokenizer import normalize

DECODINGS = {"greedy": 1, "beam 4": 4}
ALPHA = 0.6


def machine() -> str:
    """The CPU's model name and core count, or the GPU's name."""
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def package_decoder(model, tok):
    """decode(sources, beam) -> output ids, with the package's decoders."""
    special = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)

    def decode(sources: list[list[int]], beam: int) -> list[list[int]]:
        src = torch.full((len(sources), len(sources[0])), tok.pad_id)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        if beam == 1:
            found = greedy_decode(model, src, **special)
        else:
            found = beam_search(model, src, beam_size=beam, alpha=ALPHA, **special)
        return [h.tokens for h in found]

    return decode


def ctranslate2_decoder(engine: CTranslate2Model):
    def decode(sources: list[list[int]], beam: int) -> list[list[int]]:
        return engine.decode_batch(sources, beam_size=beam, alpha=ALPHA)

    return decode


def measure(decoders: dict, sources, batch_size: int, beam: int, repeats: int):
    """{engine: (seconds of each run, the output ids)} for decoding every source; the
    engines take turns, so that a machine's drift in speed falls on all of them alike."""
    batches = length_sorted_batches([len(s) for s in sources], batch_size)
    seconds = {engine: [] for engine in decoders}
    outputs = {engine: [None] * len(sources) for engine in decoders}
    for _ in range(repeats):
        for engine, decode in decoders.items():
            start = time.perf_counter()
            for batch in batches:
                found = decode([sources[j] for j in batch], beam)
                for j, ids in zip(batch, found, strict=True):
                    outputs[engine][j] = ids
            seconds[engine].append(time.perf_counter() - start)
    return {engine: (seconds[engine], outputs[engine]) for engine in decoders}


GROUPS = {
    "aten::mm": "output layer",  # the stacks' linear layers have biases: aten::addmm
    "aten::addmm": "linear layers of the stacks",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::_log_softmax": "log-softmax, top-k and max",
    "aten::topk": "log-softmax, top-k and max",
    "aten::max": "log-softmax, top-k and max",
}


def profile_shares(decode, sources: list[list[int]], beam: int) -> dict[str, float]:
    """The share of the time of decoding `sources` (batches of 32) spent in each group of
    operations, by torch.profiler. "Python" is what the operations leave of the time that the
    same decoding takes without the profiler; the many small operations ("other") carry most
    of PyTorch's cost per call."""
    from torch.profiler import ProfilerActivity, profile

    batches = [
        [sources[j] for j in batch]
        for batch in length_sorted_batches([len(s) for s in sources], 32)
    ]
    wall = []
    for _ in range(3):
        start = time.perf_counter()
        for batch in batches:
            decode(batch, beam)
        wall.append((time.perf_counter() - start) * 1e6)  # µs, as the profiler counts
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for batch in batches:
            decode(batch, beam)
    spent: dict[str, float] = {}
    for event in prof.key_averages():
        name = GROUPS.get(event.key, "other operations")
        spent[name] = spent.get(name, 0.0) + event.self_cpu_time_total
    total = max(min(wall), sum(spent.values()))
    spent["Python"] = total - sum(spent.values())
    return {name: time / total for name, time in spent.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pair", default="de-en")
    p.add_argument("--checkpoint", help="a model folder (default: the shipped model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sentences", type=int, help="only the first N test sentences")
    p.add_argument("--batch-sizes", default="32,1")
    p.add_argument(
        "--one-at-a-time",
        type=int,
        default=200,
        metavar="N",
        help="batch size 1 decodes the first N sentences only (default: 200)",
    )
    p.add_argument(
        "--engines",
        default="package,package-int8,ct2-float32,ct2-int8",
        help="comma-separated",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile the package's decoding of the first 96 sentences",
    )
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    model, tok = load_pair_model(args.pair, args.checkpoint)
    pairs = load_pairs("test_2016_flickr", args.pair)[: args.sentences]
    references = [target for _, target in pairs]
    encoded = tok.encode_batch([normalize(source) for source, _ in pairs])
    sources = [ids[: model.config.max_len - 1] + [tok.eos_id] for ids in encoded]
    decoders = {"package": package_decoder(model, tok)}
    if "package-int8" in args.engines.split(","):
        # PyTorch's dynamic int8 quantisation of every linear layer: other translations
        quantized = torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8
        )
        decoders["package-int8"] = package_decoder(quantized, tok)
    with tempfile.TemporaryDirectory() as tmp:
        for quantization in ("float32", "int8"):
            name = f"ct2-{quantization}"
            if name in args.engines.split(","):
                folder = Path(tmp) / quantization
                export_ctranslate2(model, tok, folder, quantization=quantization)
                engine = CTranslate2Model(folder, threads=args.threads)
                decoders[name] = ctranslate2_decoder(engine)
        decoders = {k: v for k, v in decoders.items() if k in args.engines.split(",")}
        rows = []
        for batch_size in map(int, args.batch_sizes.split(",")):
            for decoding, beam in DECODINGS.items():
                n = args.one_at_a_time if batch_size == 1 else len(sources)
                runs = measure(decoders, sources[:n], batch_size, beam, args.repeats)
                for engine, (seconds, outputs) in runs.items():
                    median = statistics.median(seconds)
                    texts = [tok.decode(ids) for ids in outputs]
                    bleu = sacrebleu.corpus_bleu(texts, [references[:n]]).score
                    rows.append(
                        {
                            "engine": engine,
                            "decoding": decoding,
                            "batch_size": batch_size,
                            "sentences": n,
                            "seconds": seconds,
                            "sentences_per_s": n / median,
                            "tokens_per_s": sum(map(len, outputs)) / median,
                            "bleu": bleu,
                            "outputs": outputs,
                        }
                    )
                    print(
                        f"{engine:<13} {decoding:<7} batch {batch_size:>2}: "
                        f"{rows[-1]['sentences_per_s']:7.1f} sentences/s",
                        file=sys.stderr,
                    )
    # Speed relative to CTranslate2 float32; outputs compared with the package's float32.
    for r in rows:
        key = (r["decoding"], r["batch_size"])
        for field, engine, value in (
            ("ratio", "ct2-float32", lambda a, b: a["sentences_per_s"] / b["sentences_per_s"]),
            ("same_as_package", "package", lambda a, b: sum(
                x == y for x, y in zip(a["outputs"], b["outputs"], strict=True)
            )),
        ):  # fmt: skip
            base = [
                b
                for b in rows
                if b["engine"] == engine and key == (b["decoding"], b["batch_size"])
            ]
            if base:
                r[field] = value(r, base[0])
    for r in rows:
        del r["outputs"]
    result = {
        "machine": machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "pair": args.pair,
        "sentences": len(sources),
        "repeats": args.repeats,
        "rows": rows,
    }
    if args.profile:
        decode = package_decoder(model, tok)
        result["profile"] = {
            decoding: profile_shares(decode, sources[:96], beam)
            for decoding, beam in DECODINGS.items()
        }
    publish(result, table(result), args.out)
    return 0


def publish(result: dict, text: str, out: Path | None) -> None:
    """Prints `text` (the table) and writes `result` as JSON to `out`, if given, atomically."""
    print(text)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_lines(out, [json.dumps(result, indent=1)])


def table(result: dict) -> str:
    """The results as a Markdown table."""
    lines = [
        f"{result['machine']}; {result['threads']} threads; {result['pair']}, "
        f"{result['sentences']} sentences; median of {result['repeats']}",
        "",
        "| engine | decoding | batch | sentences/s | tokens/s | × CT2 float32 "
        "| same as package | BLEU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['engine']} | {r['decoding']} | {r['batch_size']} "
            f"| {r['sentences_per_s']:.1f} | {r['tokens_per_s']:.0f} "
            f"| {r.get('ratio', float('nan')):.2f} | {r.get('same_as_package', '')} "
            f"| {r['bleu']:.2f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
