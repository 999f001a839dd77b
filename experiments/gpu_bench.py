"""Training throughput and MFU on one GPU, measured by the training loop itself.

    python -m experiments.gpu_bench --cache-dir cache --out bench.json

Each variant trains alone on the GPU for two epochs of real Multi30k batches (German→English)
with `transformer.trainer.train`; the numbers are those of the second epoch (the first holds
CUDA's start-up and, with `--compile`, the compilation): target tokens per second (padding
excluded) and MFU, the model FLOPs of `transformer.flops.training_flops` (the appendix
"Derivations and counts") over the epoch's time and the H100's measured bf16 matrix-multiply
rate (PEAK_BF16_FLOPS). Variants: the book's Multi30k
recipe (3,000-token batches) and the paper's base model on the paper's 25,000-token batches,
each in float32, float16 autocast with loss scaling, bf16 autocast, and bf16 with
torch.compile, and the recipe's model on the base model's 25,000-token batches (`--only`
names some of them). Every variant runs on any CUDA GPU: bf16 on one without bf16 hardware
(a T4) is emulated, and measured as such.

OUT holds the card, its compute capability, the precision a run gets there by default,
torch's and CUDA's versions, the fp16 and bf16 matrix-multiply rates measured on this card
(`measured_peak`: products of 8,192 × 8,192 matrices) beside the rate that MFU divides by,
and a row per variant (or the error that stopped it, and the next one starts). It is
rewritten after each variant, atomically: it always holds whole JSON.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from transformer.precision import default_precision
from transformer.split_translation import write_lines
from transformer.train_config import PEAK_BF16_FLOPS, TrainConfig, multi30k_recipe
from transformer.trainer import train

BASE = dict(preset="base", max_tokens=25_000)  # and the paper's warm-up
RECIPE_25K = dict(max_tokens=25_000, warmup=100)  # the recipe's 800 in tokens seen
VARIANTS = {
    "recipe fp32": dict(precision="fp32"),
    "recipe fp16": dict(precision="fp16"),
    "recipe bf16": dict(precision="bf16"),
    "recipe bf16 compile": dict(precision="bf16", compile=True),
    "recipe-25k bf16": RECIPE_25K | dict(precision="bf16"),
    "base-25k fp32": BASE | dict(precision="fp32"),
    "base-25k fp16": BASE | dict(precision="fp16"),
    "base-25k bf16": BASE | dict(precision="bf16"),
    # compiles last
    "base-25k bf16 compile": BASE | dict(precision="bf16", compile=True),
}


def measured_peak(
    dtype: torch.dtype = torch.bfloat16, n: int = 8192, repeats: int = 20
) -> float:
    """The card's matrix-multiply rate in `dtype`, in FLOP/s: the median of `repeats`
    products of two n × n matrices, timed with CUDA events after a warm-up."""
    a, b = (torch.randn(n, n, device="cuda", dtype=dtype) for _ in range(2))
    for _ in range(3):
        a @ b
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(True)
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return 2 * n**3 / sorted(times)[len(times) // 2]


def measure(name: str, fields: dict, cache_dir: str, pair: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        overrides = dict(epochs=2, average_last=0, cache_dir=cache_dir, out_dir=tmp)
        if fields.get("preset") == "base":  # the paper's base model, not the recipe's
            config = TrainConfig(pair=pair, **(overrides | fields))
        else:
            config = multi30k_recipe(pair, **(overrides | fields))
        started = time.perf_counter()
        result = train(config, echo=False)
        seconds = time.perf_counter() - started
    second = [r for r in result.metrics if r["kind"] == "epoch"][-1]
    return {
        "variant": name,
        "tokens_per_s": second["tokens_per_s"],
        "mfu": second["mfu"],
        "updates_per_epoch": result.step // 2,
        "run_seconds": seconds,
        "config": config.to_dict(),
    }


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--cache-dir", default="cache")
    p.add_argument("--pair", default="de-en")
    p.add_argument("--out", default="bench.json")
    p.add_argument(
        "--only",
        nargs="*",
        choices=list(VARIANTS),  # a misspelt name is an error, not a run of nothing
        metavar="VARIANT",
        help=f"variants to run, each quoted (default: all): {', '.join(VARIANTS)}",
    )
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gpu_bench: no CUDA GPU", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    major, minor = torch.cuda.get_device_capability()
    result = {
        "device": device,
        "capability": f"{major}.{minor}",
        "default_precision": default_precision(torch.device("cuda")),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "measured_fp16_flops": measured_peak(torch.float16),
        "measured_bf16_flops": measured_peak(torch.bfloat16),
        "mfu_peak_flops": PEAK_BF16_FLOPS,
        "rows": [],
    }
    rows = result["rows"]
    for name, fields in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        try:
            row = measure(name, fields, args.cache_dir, args.pair)
        except Exception as err:  # torch.compile without a C compiler, say
            why = f"{type(err).__name__}: {err}".splitlines()[0]
            rows.append({"variant": name, "error": why})
            print(f"{name:<24} failed: {why}", flush=True)
        else:
            row["device"] = device
            rows.append(row)
            print(
                f"{name:<24} {row['tokens_per_s']:>12,.0f} tok/s  MFU {row['mfu']:6.2%}"
                f"  ({row['updates_per_epoch']} updates/epoch, "
                f"{row['run_seconds']:.0f} s)",
                flush=True,
            )
        write_lines(Path(args.out), [json.dumps(result, indent=2)])
    print(
        f"device: {device} (compute capability {major}.{minor}, precision by default "
        f"{result['default_precision']}), torch {torch.__version__}, measured fp16 and "
        f"bf16 rates {result['measured_fp16_flops'] / 1e12:.0f} and "
        f"{result['measured_bf16_flops'] / 1e12:.0f} TFLOP/s (MFU divides by "
        f"{PEAK_BF16_FLOPS / 1e12:.0f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
