r"""Decoding speed of the package against CTranslate2 on the same weights, in one run.

    python -m experiments.decode_bench --profile --out experiments/benchmarks/decode-cpu.json

test_2016_flickr of one pair (German→English by default): the sources are tokenised once,
outside the clock, and both engines decode the same ids (the package's `batched_greedy_decode`
and `batched_beam_search`; CTranslate2's `translate_batch` on the model exported by
`transformer.ctranslate2`, float32 and int8; and the package with PyTorch's dynamic int8
quantisation of its feed-forward layers) in batches of 32 (all 1,000 sentences) and of 1 (the first
200: a user translating one sentence at a time), longest sources first, with the same number
of CPU threads. Each variant runs `--repeats` times (3) and reports the
median: sentences/s, target tokens/s (output tokens, <eos> excluded) and the sacreBLEU of its
translations. The JSON written to OUT (atomically) names the machine; the table printed gives
each variant's speed relative to CTranslate2 float32 (--baseline) with the same decoding and
batch size.
With --profile, torch.profiler also splits the package's decoding time into groups of
operations (the output layer, the stacks' projections and feed-forward networks, attention,
the copies of keys and values, layer normalisation, log-softmax, top-k, other operations and
Python), stored with the unprofiled seconds of the same decoding. The appendix "Translating
text" compares it with experiments/benchmarks/decode-cpu-before.json, the same command run on
the searches before their faster decoding step.

On a GPU, the float engines can also run in half precision, each against the engine's own:

    python -m experiments.decode_bench --device cuda --baseline ct2-bfloat16 \
        --engines package,package-bfloat16,ct2-float32,ct2-bfloat16,ct2-int8 --out gpu.json

With --cache-dir, the sources' ids come from the encoded cache that `prepare` wrote (its
vocabulary must be the model's), so a machine without spaCy, such as a GPU machine, can run
it. An engine that cannot start on the device (CTranslate2 without the CUDA libraries it was
built for, say) is left out with its reason, under "unavailable" in the JSON; when that engine
is the baseline, the speeds are relative to the package's instead.
"""

import argparse
import copy
import hashlib
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

from transformer import layout
from transformer.batched_search import batched_beam_search, batched_greedy_decode
from transformer.checked_data import load_pairs
from transformer.checkpoint import tokenizer_digest
from transformer.ctranslate2 import CTranslate2Model, export_ctranslate2
from transformer.decode_options import DecodeOptions
from transformer.encoded_cache import load_encoded
from transformer.split_translation import write_lines
from transformer.tokenizer import normalize
from transformer.translation import length_sorted_batches, load_pair_model

DEFAULTS = DecodeOptions()  # the package's default beam and α
DECODINGS = {"greedy": 1, f"beam {DEFAULTS.beam_size}": DEFAULTS.beam_size}
ALPHA = DEFAULTS.alpha
# The engines by name: the package's weights in a dtype (int8: torch.ao's dynamic
# quantisation, CPU only), or CTranslate2's computation type on the exported model.
PACKAGE_DTYPES = {
    "package": torch.float32,
    "package-bfloat16": torch.bfloat16,
    "package-float16": torch.float16,
}
ENGINES = [*PACKAGE_DTYPES, "package-int8"]
ENGINES += ["ct2-float32", "ct2-bfloat16", "ct2-float16", "ct2-int8"]


def machine(device: str = "cpu") -> str:
    """The CPU's model name and core count, or the GPU's name."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(device)
    name = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{name}, {os.cpu_count()} cores"


def test_set(model, tok, pair: str, sentences: int | None, cache: Path | None = None):
    """The first `sentences` (default: all) of test_2016_flickr: the sources as ids with
    their <eos>, cut to the model's positions, tokenised once outside the clock (or read
    from the encoded `cache`), and the references."""
    pairs = load_pairs("test_2016_flickr", pair)[:sentences]
    if cache is None:
        encoded = tok.encode_batch([normalize(source) for source, _ in pairs])
    else:
        split = load_encoded(pair, "test_2016_flickr", cache)
        encoded = [[int(t) for t in split[i][0]] for i in range(len(pairs))]
    sources = [ids[: model.config.max_len - 1] + [tok.eos_id] for ids in encoded]
    return sources, [target for _, target in pairs]


def same_vocabulary(cache: Path, pair: str, tok) -> bool:
    """Whether the encoded cache was made with the model's tokenizer (its fingerprint, as
    a checkpoint's config.json holds it)."""
    path = cache / pair / layout.TOKENIZER
    theirs = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return theirs == tokenizer_digest(tok)


def package_decoder(model, tok):
    """decode(sources, beam) -> output ids, with the package's decoders."""
    special = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)

    device = next(model.parameters()).device

    def decode(sources: list[list[int]], beam: int) -> list[list[int]]:
        src = torch.full((len(sources), len(sources[0])), tok.pad_id)
        for row, ids in enumerate(sources):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(device)
        if beam == 1:
            found = batched_greedy_decode(model, src, **special)
        else:
            found = batched_beam_search(
                model, src, DecodeOptions(beam_size=beam, alpha=ALPHA), **special
            )
        return [h.tokens for h in found]

    return decode


def ctranslate2_decoder(engine: CTranslate2Model):
    def decode(sources: list[list[int]], beam: int) -> list[list[int]]:
        # One call of the engine per batch, as it is run: the batch's longest length
        # limit for all, which no test output comes near ("same" counts the outputs
        # that are the package's), not a call per limit.
        longest = max(engine.limits(sources, DecodeOptions()))
        options = DecodeOptions(beam_size=beam, alpha=ALPHA, max_len=longest)
        return engine.decode_batch(sources, options)

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


# Where a decoding step's time goes, by the operations that torch.profiler records
# (their own time, without the operations they call); anything else is "other operations".
GROUPS = {
    # the output layer has no bias: a plain product; the stacks' layers have biases
    "aten::mm": "output layer",
    "aten::addmm": "projections and feed-forward",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention",
    "aten::bmm": "attention",
    "aten::baddbmm": "attention",
    "aten::_softmax": "attention",
    # the keys and values copied: concatenated to the cache, reordered, gathered
    "aten::cat": "cache: concatenation and reordering",
    "aten::index": "cache: concatenation and reordering",
    "aten::index_select": "cache: concatenation and reordering",
    "aten::copy_": "cache: concatenation and reordering",
    "aten::native_layer_norm": "layer normalisation",
    "aten::_log_softmax": "log-softmax",
    "aten::topk": "top-k and max",
    "aten::max": "top-k and max",
}


def profile_shares(
    decode, sources: list[list[int]], beam: int
) -> tuple[dict[str, float], float]:
    """The share of the time of decoding `sources` (batches of 32) spent in each group of
    operations, by torch.profiler, and the seconds that decoding takes unprofiled (the
    fastest of 3). "Python" is what the operations leave of the profiled time: the
    interpreter and PyTorch's dispatch between operations; the many small operations
    ("other operations") carry the rest of PyTorch's cost per call."""
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
        wall.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for batch in batches:
            decode(batch, beam)
        profiled = (time.perf_counter() - start) * 1e6  # µs, as the profiler counts
    spent: dict[str, float] = {}
    for event in prof.key_averages():
        name = GROUPS.get(event.key, "other operations")
        spent[name] = spent.get(name, 0.0) + event.self_cpu_time_total
    total = max(profiled, sum(spent.values()))
    spent["Python"] = total - sum(spent.values())
    return {name: time / total for name, time in spent.items()}, min(wall)


def engine_decoders(
    engines: list[str], model, tok, tmp: Path, args, unavailable: dict[str, str]
) -> dict:
    """{name: decode(sources, beam)} for each engine, the exported models kept in tmp; an
    engine that fails to translate a first sentence goes into `unavailable` with its
    reason."""
    decoders = {}
    for name in engines:
        if name in PACKAGE_DTYPES:
            typed = model if name == "package" else copy.deepcopy(model)
            decoders[name] = package_decoder(typed.to(PACKAGE_DTYPES[name]), tok)
        elif name == "package-int8":
            # PyTorch's dynamic int8 quantisation of the feed-forward networks' linear
            # layers: other translations. The attention's projections stay float32: the
            # multi-head layer multiplies by their weights stacked, which a quantised layer
            # does not hold.
            feed_forward = {
                name
                for name, module in model.named_modules()
                if isinstance(module, nn.Linear) and ".feed_forward." in name
            }
            quantized = torch.ao.quantization.quantize_dynamic(
                copy.deepcopy(model), feed_forward, dtype=torch.qint8
            )
            decoders[name] = package_decoder(quantized, tok)
        else:
            compute_type = name.removeprefix("ct2-")
            quantization = "int8" if compute_type == "int8" else "float32"
            folder = tmp / quantization
            try:
                if not folder.exists():
                    export_ctranslate2(model, tok, folder, quantization=quantization)
                engine = CTranslate2Model(
                    folder,
                    threads=args.threads,
                    device=args.device,
                    compute_type=compute_type,
                )
                decoders[name] = ctranslate2_decoder(engine)
                decoders[name]([[tok.eos_id]], 1)  # loads what it needs, or fails
            except Exception as err:  # whatever keeps the engine from starting here
                decoders.pop(name, None)
                unavailable[name] = f"{type(err).__name__}: {err}".splitlines()[0]
                print(f"{name}: unavailable: {unavailable[name]}", file=sys.stderr)
    return decoders


def compare(rows: list[dict], baseline: str) -> None:
    """Adds to each row its speed relative to the baseline engine's and the number of its
    outputs identical to the package's (float32), for the same decoding and batch size."""
    for r in rows:
        key = (r["decoding"], r["batch_size"])
        for field, engine, value in (
            ("ratio", baseline, lambda a, b: a["sentences_per_s"] / b["sentences_per_s"]),
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
        help=f"comma-separated, of: {', '.join(ENGINES)}",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument(
        "--baseline",
        default="ct2-float32",
        help="the engine the speeds are relative to (default: ct2-float32)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile the package's decoding of the first 96 sentences",
    )
    p.add_argument(
        "--cache-dir",
        type=Path,
        help="read the sources' ids from this encoded cache (needs no spaCy)",
    )
    p.add_argument("--out", type=Path, help="write the results as JSON")
    args = p.parse_args(argv)
    engines = args.engines.split(",")

    def refuse(message: str) -> None:
        """One line on standard error and status 2, as the package's commands."""
        p.exit(2, f"{p.prog}: error: {message}\n")

    unknown = [name for name in engines if name not in ENGINES]
    if unknown:
        refuse(f"unknown engine {unknown[0]!r}: choose from {', '.join(ENGINES)}")
    if args.device not in ("cpu", "cuda"):
        refuse(f"--device must be cpu or cuda, got {args.device!r}")
    if args.baseline not in engines:
        refuse(f"--baseline {args.baseline} is not among the --engines")
    if args.device == "cuda" and not torch.cuda.is_available():
        refuse("--device cuda: PyTorch sees no GPU here")
    if args.device == "cuda" and (args.profile or "package-int8" in engines):
        refuse(
            "--profile and package-int8 run on the CPU only: leave them out with cuda"
        )

    torch.set_num_threads(args.threads)
    model, tok = load_pair_model(args.pair, args.checkpoint, device=args.device)
    if args.cache_dir and not same_vocabulary(args.cache_dir, args.pair, tok):
        refuse(
            f"the encoded cache {args.cache_dir / args.pair} was not made with the "
            "model's tokenizer.json"
        )
    sources, references = test_set(
        model, tok, args.pair, args.sentences, args.cache_dir
    )
    unavailable: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        decoders = engine_decoders(engines, model, tok, Path(tmp), args, unavailable)
        if not decoders:
            refuse("no engine could run here")
        if args.baseline in unavailable:
            args.baseline = "package" if "package" in decoders else next(iter(decoders))
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
    compare(rows, args.baseline)
    result = {
        "machine": machine(args.device),
        "device": args.device,
        "baseline": args.baseline,
        "unavailable": unavailable,
        "torch": torch.__version__,
        "threads": args.threads,
        "pair": args.pair,
        "sentences": len(sources),
        "repeats": args.repeats,
        "rows": rows,
    }
    if args.profile:
        decode = package_decoder(model, tok)
        shares = {
            decoding: profile_shares(decode, sources[:96], beam)
            for decoding, beam in DECODINGS.items()
        }
        result["profile"] = {d: share for d, (share, _) in shares.items()}
        result["profile_seconds"] = {d: s for d, (_, s) in shares.items()}
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
        *(f"{name}: unavailable: {why}" for name, why in result["unavailable"].items()),
        "",
        f"| engine | decoding | batch | sentences/s | tokens/s | × {result['baseline']} "
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
