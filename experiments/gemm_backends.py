"""How much of CTranslate2's lead on the CPU is its library of matrix products.

    python -m experiments.gemm_backends --out experiments/benchmarks/gemm-cpu.json

PyTorch multiplies float32 matrices on the CPU with Intel MKL. CTranslate2 picks its SGEMM
library by the CPU: MKL on Intel CPUs, oneDNN on the others. Two measurements, with the same
number of threads:

1. CTranslate2's greedy and beam-4 decoding of test_2016_flickr (German→English by default,
   batches of 32, the model exported from the package's) with the library it picks and with
   MKL forced (CT2_USE_MKL=1). The engine reads that variable once, so each measurement is a
   fresh process; the two take turns for --rounds rounds, and the library each used is read
   from the engine's log.
2. The products of one decoding step, at the model's shapes and batches of 1, 4 and 32 rows:
   PyTorch's F.linear (MKL) against oneDNN with the weight packed in advance
   (torch.ops.mkldnn._linear_pointwise, what torch.compile uses with freezing), in
   microseconds per product, the median of --rounds rounds of --repeats calls.
3. The package's own decoding of the same sentences, as it is and with its output layer, the
   largest product, through oneDNN (a private PyTorch operation, so not the package's default):
   seconds, in turns, and how many translations are the same.

The JSON written to OUT (atomically) names the machine; a table is printed.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor

from experiments.decode_bench import (
    DECODINGS,
    ctranslate2_decoder,
    machine,
    measure,
    package_decoder,
    publish,
    test_set,
)
from transformer import batched_search
from transformer.batched_step import BatchCache
from transformer.ctranslate2 import CTranslate2Model, export_ctranslate2
from transformer.translation import load_pair_model

ROWS = (1, 4, 32)


class OneDNNOutputCache(BatchCache):
    """The package's decoding step with its output layer's product in oneDNN, on the
    weight packed once per model."""

    packed: dict[int, Tensor] = {}

    def _logits(self, x: Tensor) -> Tensor:
        weight = self.model.generator.proj.weight
        if id(weight) not in self.packed:
            self.packed[id(weight)] = torch.ops.mkldnn._reorder_linear_weight(
                weight.detach()
            )
        return torch.ops.mkldnn._linear_pointwise(
            x, self.packed[id(weight)], None, "none", [-1], ""
        )


def with_onednn_output(decode):
    """decode, run with the output layer's product in oneDNN."""

    def run(sources: list[list[int]], beam: int) -> list[list[int]]:
        with mock.patch.object(batched_search, "BatchCache", OneDNNOutputCache):
            return decode(sources, beam)

    return run


def package_runs(pair: str, sentences: int, rounds: int) -> list[dict]:
    """The package's decoding in batches of 32 with its output layer in MKL and in oneDNN."""
    model, tok = load_pair_model(pair)
    sources, _ = test_set(model, tok, pair, sentences)
    decoders = {
        "mkl": package_decoder(model, tok),
        "onednn": with_onednn_output(package_decoder(model, tok)),
    }
    rows = []
    for decoding, beam in DECODINGS.items():
        runs = measure(decoders, sources, 32, beam, rounds)
        (mkl_seconds, mkl_out), (onednn_seconds, onednn_out) = runs.values()
        same = sum(a == b for a, b in zip(mkl_out, onednn_out, strict=True))
        rows.append(
            {
                "decoding": decoding,
                "mkl": mkl_seconds,
                "onednn": onednn_seconds,
                "same": same,
            }
        )
    return rows


def engine_seconds(pair: str, sentences: int, threads: int) -> dict[str, float]:
    """{decoding: seconds} of CTranslate2 float32 decoding `sentences` test sentences in
    batches of 32, in this process (with whatever library the environment makes it use)."""
    model, tok = load_pair_model(pair)
    sources, _ = test_set(model, tok, pair, sentences)
    with tempfile.TemporaryDirectory() as tmp:
        export_ctranslate2(model, tok, Path(tmp), quantization="float32")
        engine = {
            "ct2": ctranslate2_decoder(CTranslate2Model(Path(tmp), threads=threads))
        }
        seconds = {}
        for decoding, beam in DECODINGS.items():
            (run_seconds, _outputs) = measure(engine, sources, 32, beam, 1)["ct2"]
            seconds[decoding] = run_seconds[0]  # one run: the rounds are processes
        return seconds


def engine_run(args, force_mkl: bool) -> tuple[str, dict[str, float]]:
    """(the SGEMM library the engine used, {decoding: seconds}), from a fresh process."""
    env = dict(os.environ, CT2_VERBOSE="1")
    env.pop("CT2_USE_MKL", None)  # without it, the engine's own choice
    if force_mkl:
        env["CT2_USE_MKL"] = "1"
    command = [sys.executable, "-m", "experiments.gemm_backends", "--worker"]
    command += ["--pair", args.pair, "--sentences", str(args.sentences)]
    command += ["--threads", str(args.threads)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    library = re.search(r"SGEMM backend: (\S+)", done.stderr)
    return (library.group(1) if library else "unknown"), json.loads(done.stdout)


def product_shapes(config) -> dict[str, tuple[int, int]]:
    """(out, in) of each linear layer a decoding step applies, by its job."""
    d, d_ff, V = config.d_model, config.d_ff, config.target_vocab_size
    return {
        "self-attention Q, K, V": (3 * d, d),
        "attention outputs, encoder-decoder Q": (d, d),
        "feed-forward, first": (d_ff, d),
        "feed-forward, second": (d, d_ff),
        "output layer": (V, d),
    }


def product_microseconds(config, repeats: int, rounds: int) -> list[dict]:
    """One row per shape and batch: MKL's and oneDNN's microseconds per product."""
    rows = []
    for job, (n_out, n_in) in product_shapes(config).items():
        weight = torch.randn(n_out, n_in)
        bias = None if job == "output layer" else torch.randn(n_out)  # as in the model
        packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        for m in ROWS:
            x = torch.randn(m, n_in)
            libraries = {
                "mkl": partial(F.linear, x, weight, bias),
                "onednn": partial(
                    torch.ops.mkldnn._linear_pointwise,
                    x,
                    packed,
                    bias,
                    "none",
                    [-1],
                    "",
                ),
            }
            times = {name: [] for name in libraries}
            with torch.inference_mode():
                torch.testing.assert_close(
                    libraries["mkl"](), libraries["onednn"](), rtol=1e-4, atol=1e-4
                )  # the same products, summed in another order
                for _ in range(rounds):  # the libraries take turns
                    for name, product in libraries.items():
                        product()
                        start = time.perf_counter()
                        for _ in range(repeats):
                            product()
                        times[name].append((time.perf_counter() - start) / repeats)
            row = {"product": job, "shape": [n_out, n_in], "rows": m}
            row |= {name: 1e6 * statistics.median(t) for name, t in times.items()}
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pair", default="de-en")
    p.add_argument("--sentences", type=int, default=1000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=200, help="products timed per round")
    p.add_argument("--out", type=Path)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.worker:  # one engine measurement, for engine_run
        print(json.dumps(engine_seconds(args.pair, args.sentences, args.threads)))
        return 0
    runs = {"own choice": [], "MKL forced": []}
    libraries = {}
    for _ in range(args.rounds):
        for name in runs:
            libraries[name], seconds = engine_run(args, force_mkl=name == "MKL forced")
            runs[name].append(seconds)
    model, _ = load_pair_model(args.pair)
    result = {
        "machine": machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "pair": args.pair,
        "sentences": args.sentences,
        "engine": [
            {
                "sgemm": name,
                "library": libraries[name],
                "decoding": decoding,
                "seconds": [run[decoding] for run in runs[name]],
            }
            for name in runs
            for decoding in DECODINGS
        ],
        "products": product_microseconds(model.config, args.repeats, args.rounds),
        "package": package_runs(args.pair, args.sentences, args.rounds),
    }
    publish(result, table(result), args.out)
    return 0


def table(result: dict) -> str:
    """The results as two Markdown tables."""
    lines = [
        f"{result['machine']}; {result['threads']} threads; {result['pair']}, "
        f"{result['sentences']} sentences, batches of 32",
        "",
        "| CTranslate2 SGEMM | library | decoding | seconds (median) |",
        "| --- | --- | --- | ---: |",
    ]
    for r in result["engine"]:
        lines.append(
            f"| {r['sgemm']} | {r['library']} | {r['decoding']} "
            f"| {statistics.median(r['seconds']):.2f} |"
        )
    lines += [
        "",
        "| product | rows | MKL µs | oneDNN µs | MKL / oneDNN |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in result["products"]:
        lines.append(
            f"| {r['product']} {r['shape'][0]}×{r['shape'][1]} | {r['rows']} "
            f"| {r['mkl']:.0f} | {r['onednn']:.0f} | {r['mkl'] / r['onednn']:.2f} |"
        )
    lines += [
        "",
        "| package decoding | output layer in MKL, s | in oneDNN, s | MKL / oneDNN | same |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for r in result["package"]:
        mkl, onednn = statistics.median(r["mkl"]), statistics.median(r["onednn"])
        lines.append(
            f"| {r['decoding']} | {mkl:.2f} | {onednn:.2f} | {mkl / onednn:.2f} "
            f"| {r['same']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
