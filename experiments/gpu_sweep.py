r"""Train several Multi30k runs side by side on one GPU, score them on the validation split and
export the best run of each pair: the script behind the book's GPU-trained models.

    python -m experiments.gpu_sweep PHASE --cache-dir cache --runs runs --out runs/packed \
        --minutes M

Every run is `python -m transformer train --config multi30k ...` with its own options (below),
in its own process; they share the GPU. A run stops after its epochs or, at the latest, after M
minutes (`--time-limit`); a run that the time limit stopped is then closed with `--resume
--epochs <its last whole epoch>`, which averages its last five epoch checkpoints, as a run that
ends normally does. Each run's average is then scored on the validation split (sacreBLEU, the
default search; the sources come from the encoded cache, so no spaCy is needed on the GPU machine).

The run of each pair with the lowest averaged validation perplexity per word (or, with
`--choose-by bleu`, the highest validation BLEU), among those marked as candidates (the sizes
that can be shipped), is exported in the shipped format with its last epoch in last/
(`export_model`), and packed into OUT as <pair>.tar (split into pieces of 15 MiB when larger,
`cat` joins them). With `--shipped DIR` it is exported only if its validation BLEU beats that
of the model in DIR/<pair>, scored the same way, by at least `--margin` (0.5); summary.json
says which way each pair went. OUT also gets summary.json and runs.tar.gz (every run's
metrics, config and log). Choosing on the validation split keeps the test split for the book's
results.

A sweep starts afresh: it refuses to launch anything while a folder of one of its runs is in
RUNS already (from an earlier sweep; `train` would refuse it, and the old run would be scored
and exported as new). Every file it writes into OUT is whole or absent, never half-written.
"""

import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from transformer import layout
from transformer.atomic import atomic_write
from transformer.config import TransformerConfig
from transformer.multi30k import PAIRS
from transformer.records import read_jsonl
from transformer.split_translation import write_lines

RECIPE = ["--config", "multi30k"]
PAPER_BASE = TransformerConfig.base(vocab_size=1)  # only its sizes are read
BASE = [
    a
    for f in ("n_layers", "d_model", "d_ff")
    for a in ("--set", f"{f}={getattr(PAPER_BASE, f)}")
]
# name: (pair, options after the recipe, a candidate for shipping)
FF1024 = ["--set", "d_ff=1024", "--precision", "fp32"]
LR045 = ["--lr-factor", "0.45"]  # the paper's peak learning rate for d_model 512
# other vocabularies read their own caches, cache-v4000 and cache-v12000 (see cache_dir)
V4K = ["--vocab-size", "4000"]
V12K = ["--vocab-size", "12000"]
PRENORM = ["--set", "norm_first=true"]  # the pre-norm order of the sublayers chapter
L4 = ["--set", "n_layers=4"]
SEED1 = ["--seed", "1"]  # every run is seed 0 unless it says otherwise
AVG10 = ["--average-last", "10"]
T6K = ["--max-tokens", "6000", "--warmup", "400"]
# 4 + 4 layers, d_model 128, d_ff 256, 4 heads; factor 1.13 puts the peak of equation 3
# with 400 warm-up updates at 5e-3
D128 = ["--set", "n_layers=4", "--set", "d_model=128", "--set", "d_ff=256"]
D128 += ["--set", "n_heads=4", "--lr-factor", "1.13"]


def both(name: str, options: list[str], candidate: bool = True) -> dict:
    """The same run for each pair, named <pair>-<name>."""
    return {f"{pair}-{name}": (pair, options, candidate) for pair in PAIRS}


TINY = [
    "--set",
    "n_layers=1",
    "--set",
    "d_model=64",
    "--set",
    "n_heads=4",
    "--set",
    "d_ff=128",
]
PHASES: dict[str, dict[str, tuple[str, list[str], bool]]] = {
    "smoke": {  # the script itself, on a CPU: --epochs 2
        "de-en-tiny": ("de-en", TINY, True),
        "de-en-tiny-ls0": ("de-en", TINY + ["--label-smoothing", "0"], False),
    },
    "explore": {
        **both("d2", []),
        **both("d3", ["--dropout", "0.3"]),
        **both("d3-4l", ["--dropout", "0.3", "--set", "n_layers=4"]),
        "de-en-ls0": ("de-en", ["--label-smoothing", "0"], False),
        "de-en-base": ("de-en", BASE + ["--dropout", "0.1"], False),
        "de-en-base-d3": ("de-en", BASE + ["--dropout", "0.3"], False),
    },
    "long": {
        **both("d3", ["--dropout", "0.3", "--precision", "fp32"]),
        **both("d3-ff1024", ["--dropout", "0.3"] + FF1024),
        **both("d25-ff1024", ["--dropout", "0.25"] + FF1024),
        "de-en-base-lr": ("de-en", BASE + ["--dropout", "0.1"] + LR045, False),
        "de-en-base-lr-d3": ("de-en", BASE + ["--dropout", "0.3"] + LR045, False),
    },
    "final": both("d3-long", ["--dropout", "0.3", "--precision", "fp32"]),
    # Not yet run on the GPU (the experiments appendix gives the CPU runs behind each phase).
    # The recipe's own seed-1 twin is the yardstick for chance; four pre-norm layers, which on
    # the CPU ended closest to the shipped German→English run, are tried for French→English.
    # Every candidate has a seed-1 twin. Each phase fits one command of at most 10 minutes with
    # --minutes 7.
    "targets": {
        **both("recipe-s1", SEED1, candidate=False),
        "fr-en-prenorm-4l": ("fr-en", PRENORM + L4, True),
        "fr-en-prenorm-4l-s1": ("fr-en", PRENORM + L4 + SEED1, True),
    },
    # French→English's vocabulary (4,000 or 12,000 entries, each with its own cache: cache_dir)
    # and an average of the last ten epochs.
    "targets-fr": {
        "fr-en-v4k": ("fr-en", V4K, True),
        "fr-en-v4k-s1": ("fr-en", V4K + SEED1, True),
        "fr-en-v12k": ("fr-en", V12K, True),
        "fr-en-v12k-s1": ("fr-en", V12K + SEED1, True),
        "fr-en-avg10": ("fr-en", ["--average-last", "10"], True),
        "fr-en-avg10-s1": ("fr-en", ["--average-last", "10"] + SEED1, True),
    },
    # The recipe for up to 60 epochs with a ten-epoch average: on the CPU, the German→English
    # seed-1 run continued from 35 to 60 epochs averaged 2.8% lower
    # (experiments/runs/de-en/recipe-seed-1-cpu-60-epochs). Keeping ten epochs, each run also
    # gets averages.json (every window of five of them; windows_of). A run that the time limit
    # stops short of 60 epochs is closed at its last whole one; the summary shows how many.
    "targets-long": {
        **both("recipe-60", ["--epochs", "60", "--average-last", "10"]),
        **both("recipe-60-s1", ["--epochs", "60", "--average-last", "10"] + SEED1),
    },
    # Batches of at most 1,500 padded tokens per side, twice the updates, the warm-up kept at
    # about five epochs (1,600 updates): on the CPU this learned faster and ended within chance
    # of the shipped run (experiments/runs/de-en/tokens-1500-cpu); two seeds per pair say
    # whether a small gain is real.
    "targets-batch": {
        **both("tokens-1500", ["--max-tokens", "1500", "--warmup", "1600"]),
        **both("tokens-1500-s1", ["--max-tokens", "1500", "--warmup", "1600"] + SEED1),
    },
    # The quality sweep of the one prepared GPU call (experiments/gpu_call.py), five runs
    # a pair, chosen by validation BLEU. Every run stops at the time limit, so the recipe
    # gets as many epochs as fit, with a ten-epoch average. Small models leave the GPU
    # waiting on each update's launches, so batches twice as large train about twice as
    # many tokens a second: they carry the other candidates, with half the warm-up, which
    # raises the peak rate by √2 (equation 3). R-Drop (--r-drop α), six layers of width
    # 256, and Wu et al. (2021)'s 4 + 4 layers of width 128 with its peak rate of 5e-3.
    "quality": {
        **both("recipe-avg10", AVG10),
        **both("tokens-6k", T6K),
        **both("tokens-6k-rdrop", T6K + ["--r-drop", "1"]),
        **both("tokens-6k-6l", T6K + ["--set", "n_layers=6"]),
        **both("tokens-6k-d128", T6K + D128),
    },
}
PIECE = 15 * 2**20


def train_command(pair: str) -> list[str]:
    return [sys.executable, "-m", "transformer", "train", "--pair", pair]


def cache_dir(options: list[str], args: argparse.Namespace) -> str:
    """The encoded cache of a run: CACHE_DIR, or CACHE_DIR-v<size> for `--vocab-size size`
    (build it where spaCy is installed: `python -m transformer prepare --vocab-size size
    --cache-dir CACHE_DIR-v<size>`)."""
    if "--vocab-size" in options:
        return f"{args.cache_dir}-v{options[options.index('--vocab-size') + 1]}"
    return args.cache_dir


def problems(runs: dict, args: argparse.Namespace) -> list[str]:
    """What keeps the sweep from starting, one line each, checked before anything runs."""
    found = []
    missing = sorted(
        {cache_dir(o, args) for _, o, _ in runs.values()} - {args.cache_dir}
    )
    missing = [m for m in missing if not Path(m).is_dir()]
    if missing:  # no spaCy on a GPU machine: the caches must travel with the tree
        found.append(f"no encoded cache {', '.join(missing)}: build it first")
    # `train` refuses a folder that is not empty and exits, but the sweep would go on to
    # close, score and export what an earlier sweep left there as if it were new.
    taken = [str(Path(args.runs) / n) for n in runs if (Path(args.runs) / n).exists()]
    if taken:
        found.append(
            f"{', '.join(taken)} already exist (an earlier sweep's runs?): move them "
            "aside or choose another --runs"
        )
    if args.shipped is not None:
        pairs = sorted({pair for pair, _, _ in runs.values()})
        absent = [p for p in pairs if not (Path(args.shipped) / p).is_dir()]
        if absent:
            found.append(f"no shipped model {Path(args.shipped) / absent[0]}")
    return found


def launch(runs: dict, args: argparse.Namespace) -> dict[str, int]:
    """Start every run, wait for them all (to the time limit and two minutes more), and
    return each run's exit status."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    procs = {}
    for name, (pair, options, _) in runs.items():
        out = Path(args.runs) / name
        # the sweep's epochs and time limit first: a phase's own options override them
        command = train_command(pair) + RECIPE
        command += ["--epochs", str(args.epochs), "--time-limit", str(args.minutes)]
        command += options + [
            "--cache-dir",
            cache_dir(options, args),
            "--out",
            str(out),
        ]
        log = open(Path(args.runs) / f"{name}.stdout", "w")
        procs[name] = (subprocess.Popen(command, env=env, stdout=log, stderr=log), log)
        print(" ".join(command[1:]), flush=True)
    deadline = time.time() + 60 * args.minutes + 120
    for name, (proc, log) in procs.items():
        try:
            proc.wait(timeout=max(deadline - time.time(), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()  # its exit status, for the summary
            print(f"{name}: killed at the deadline", flush=True)
        log.close()
        print(f"{name}: exit {proc.returncode}", flush=True)
    return {name: proc.returncode for name, (proc, _) in procs.items()}


def close(runs: dict, args: argparse.Namespace) -> None:
    """Average the runs that the time limit stopped (their last five whole epochs)."""
    procs = []
    for name, (pair, _, _) in runs.items():
        out = Path(args.runs) / name
        metrics = read_jsonl(out / layout.METRICS)
        if any(r["kind"] == "average" for r in metrics):
            continue
        epochs = [r for r in metrics if r["kind"] == "epoch"]
        if len(epochs) < 2:
            print(f"{name}: fewer than two epochs, not averaged", flush=True)
            continue
        last = str(int(epochs[-1]["epoch"]))
        command = train_command(pair) + [
            "--out",
            str(out),
            "--resume",
            "--epochs",
            last,
        ]
        log = open(Path(args.runs) / f"{name}.close.stdout", "w")
        procs.append((name, subprocess.Popen(command, stdout=log, stderr=log), log))
    for name, proc, log in procs:
        proc.wait()
        log.close()
        print(f"{name}: closed, exit {proc.returncode}", flush=True)


def val_bleu(folder: Path, pair: str, cache_dir: str) -> float:
    """sacreBLEU of the averaged model on the validation split, with the default
    search (DecodeOptions())."""
    import torch
    from sacrebleu.metrics import BLEU

    from transformer.checked_data import load_pairs
    from transformer.checkpoint import load_model
    from transformer.encoded_cache import load_encoded
    from transformer.translation import translate

    model, tokenizer = load_model(
        folder, device="cuda" if torch.cuda.is_available() else "cpu"
    )
    val = load_encoded(pair, "val", Path(cache_dir))
    pairs = load_pairs("val", pair)
    ids = [[int(t) for t in val[i][0]] for i in range(len(val))]

    def cached(texts, language=None):  # the sources' ids, without spaCy
        if len(texts) != len(ids):
            raise ValueError("a validation source is empty")
        return ids

    tokenizer.encode_batch = cached
    hypotheses = translate(model, tokenizer, [s for s, _ in pairs])
    return BLEU().corpus_score(hypotheses, [[r for _, r in pairs]]).score


def windows_of(out: Path, cache: str) -> dict:
    """A run that kept more than five epochs (--average-last above 5): the validation metrics
    of the averages of its windows (experiments/average_windows.py) into out/averages.json, and
    the best five-epoch window for the summary."""
    import torch

    from experiments.average_windows import report
    from transformer.split_translation import write_lines

    if len(list((out / layout.CHECKPOINTS).glob(f"{layout.EPOCH}*"))) <= 5:
        return {}
    try:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        found = report(out / layout.CHECKPOINTS, 5, Path(cache), device=device)
    except Exception as err:  # windows are not worth losing the run for
        return {"windows_error": repr(err)}
    write_lines(out / "averages.json", [json.dumps(found, indent=1)])
    fives = [w for w in found["windows"] if w["last"] - w["first"] == 4]
    best = min(fives, key=lambda w: w["val_ppl_word"])  # report makes at least one
    return {
        "best_five": [best["first"], best["last"]],
        "best_five_ppl_word": best["val_ppl_word"],
    }


def summarise(runs: dict, args: argparse.Namespace) -> list[dict]:
    rows = []
    for name, (pair, options, candidate) in runs.items():
        out = Path(args.runs) / name
        metrics = read_jsonl(out / layout.METRICS)
        epochs = [r for r in metrics if r["kind"] == "epoch"]
        averages = [r for r in metrics if r["kind"] == "average"]
        if not epochs:
            rows.append({"name": name, "pair": pair, "failed": True})
            continue
        best = min(epochs, key=lambda r: r["val_ppl_word"])
        tok_s = sorted(r["tokens_per_s"] for r in epochs)
        row = {
            "name": name,
            "pair": pair,
            "options": options,
            "candidate": candidate,
            "epochs": int(epochs[-1]["epoch"]),
            "hours": epochs[-1]["wall_time"] / 3600,
            "tokens_per_s": tok_s[len(tok_s) // 2],
            "best_epoch": int(best["epoch"]),
            "best_ppl_word": best["val_ppl_word"],
            "last_ppl_word": epochs[-1]["val_ppl_word"],
            "last_accuracy": epochs[-1]["val_accuracy"],
        }
        row |= windows_of(out, cache_dir(options, args))
        if averages:
            row["avg_ppl_word"] = averages[-1]["val_ppl_word"]
            row["avg_accuracy"] = averages[-1]["val_accuracy"]
            try:
                row["avg_val_bleu"] = val_bleu(
                    out / layout.AVERAGE, pair, cache_dir(options, args)
                )
            except Exception as err:  # a score is not worth losing the run for
                row["bleu_error"] = repr(err)
        rows.append(row)
    return rows


def letters(i: int) -> str:
    """The suffix of the i-th piece as `split` names them (aa, ab, ...): `cat` joins them in
    order."""
    return chr(ord("a") + i // 26) + chr(ord("a") + i % 26)


def write_tar(path: Path, data: bytes) -> None:
    """`path`, or pieces of at most PIECE bytes path.aa, path.ab, ... when larger, each written
    atomically. Whatever an earlier export left under that name goes first: a stale piece
    beside a new tar would make `cat path.*` a corrupt file."""
    for old in [path, *path.parent.glob(f"{path.name}.*")]:
        old.unlink(missing_ok=True)
    if len(data) <= PIECE:
        atomic_write(path, data)
        return
    for i, start in enumerate(range(0, len(data), PIECE)):
        atomic_write(Path(f"{path}.{letters(i)}"), data[start : start + PIECE])


def tar_bytes(members: list[tuple[Path, str]], mode: str = "w") -> bytes:
    """A tar archive of (path, name in the archive) pairs, built in memory (an export and the
    runs' logs are tens of megabytes) so that it can be written atomically."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode=mode) as t:
        for path, arcname in members:
            t.add(path, arcname=arcname)
    return buffer.getvalue()


def best_run(rows: list[dict], pair: str, by: str) -> dict | None:
    """The candidate of `pair` with the lowest averaged validation perplexity per word
    (by="ppl") or the highest validation BLEU (by="bleu"), if any was scored."""
    key = {"ppl": "avg_ppl_word", "bleu": "avg_val_bleu"}[by]
    mine = [r for r in rows if r["pair"] == pair and r.get("candidate") and key in r]
    if not mine:
        return None
    return min(mine, key=lambda r: r[key] if by == "ppl" else -r[key])


def shipping(best: dict, pair: str, args: argparse.Namespace) -> dict:
    """Whether `best` replaces the model in args.shipped/<pair>: its validation BLEU must
    beat that model's, scored the same way, by args.margin."""
    if args.shipped is None:
        return {"ship": True}
    shipped = val_bleu(Path(args.shipped) / pair, pair, args.cache_dir)
    bleu = best.get("avg_val_bleu", float("-inf"))
    return {
        "ship": bleu >= shipped + args.margin,
        "shipped_val_bleu": shipped,
        "best_val_bleu": bleu,
        "margin": args.margin,
    }


def export_best(rows: list[dict], args: argparse.Namespace) -> dict[str, dict]:
    """Exports the best run of each pair that `shipping` lets through; returns each pair's
    choice and decision."""
    from transformer.checkpoint import export_model

    decisions = {}
    for pair in sorted({r["pair"] for r in rows}):
        best = best_run(rows, pair, args.choose_by)
        if best is None:
            continue
        decisions[pair] = {"best": best["name"]} | shipping(best, pair, args)
        if not decisions[pair]["ship"]:
            print(f"{pair}: {best['name']} does not beat the shipped model", flush=True)
            continue
        run = Path(args.runs) / best["name"]
        dest = Path(args.runs) / "export" / pair
        # This script's own folder, from an earlier sweep: export_model refuses to replace
        # a folder that holds more than an export (here last/ and RUN).
        shutil.rmtree(dest, ignore_errors=True)
        export_model(run, dest)
        best_epoch = layout.epoch_folder(best["epochs"])
        export_model(run / layout.CHECKPOINTS / best_epoch, dest / "last")
        write_lines(dest / "RUN", [best["name"]])
        write_tar(Path(args.out) / f"{pair}.tar", tar_bytes([(dest, pair)]))
        print(f"{pair}: exported {best['name']}", flush=True)
    return decisions


def run_files(runs: dict, args: argparse.Namespace) -> list[tuple[Path, str]]:
    """What runs.tar.gz keeps of each run, as (path, name in the archive): its own logs
    (`<name>.stdout`, `<name>.close.stdout`; not another run's whose name starts with it,
    de-en-d3-ff1024's beside de-en-d3's) and its metrics, config and log."""
    kept = []
    for name in runs:
        for log in (f"{name}.stdout", f"{name}.close.stdout"):
            if (Path(args.runs) / log).is_file():
                kept.append((Path(args.runs) / log, log))
        for file in (
            layout.METRICS,
            layout.STEPS,
            layout.RUN_CONFIG,
            layout.LOG,
            "averages.json",
        ):
            path = Path(args.runs) / name / file
            if path.is_file():
                kept.append((path, f"{name}/{file}"))
    return kept


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("phase", choices=sorted(PHASES))
    p.add_argument("--cache-dir", default="cache")
    p.add_argument("--runs", default="runs")
    p.add_argument("--out", default="runs/packed", help="where the packed results go")
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--epochs", type=int, default=400)
    p.add_argument(
        "--choose-by",
        choices=("ppl", "bleu"),
        default="ppl",
        help="the validation measure that picks each pair's run (default: ppl)",
    )
    p.add_argument(
        "--shipped",
        help="export a pair's best run only if it beats the model in SHIPPED/<pair>",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.5,
        help="the validation BLEU by which it must beat it (default: 0.5)",
    )
    args = p.parse_args()
    runs = PHASES[args.phase]
    found = problems(runs, args)
    for problem in found:
        print(f"{p.prog}: error: {problem}", file=sys.stderr)
    if found:
        return 2
    Path(args.runs).mkdir(parents=True, exist_ok=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    exits = launch(runs, args)
    close(runs, args)
    rows = summarise(runs, args)
    for row in rows:  # a run that crashed may still have epochs to average and score
        row["exit"] = exits[row["name"]]
    packed = tar_bytes(run_files(runs, args), "w:gz")
    atomic_write(Path(args.out) / "runs.tar.gz", packed)
    summary = {"runs": rows, "choose_by": args.choose_by}
    # written before the export too: the scores survive an export that fails
    write_lines(Path(args.out) / "summary.json", [json.dumps(summary, indent=2)])
    summary["decisions"] = export_best(rows, args)
    write_lines(Path(args.out) / "summary.json", [json.dumps(summary, indent=2)])
    head = f"{'run':<20}{'ep':>4}{'best':>5}{'ppl best':>9}{'ppl avg':>8}{'acc avg':>8}"
    print(head + f"{'BLEU':>6}{'tok/s':>9}")
    for r in rows:
        if r.get("failed"):
            print(f"{r['name']:<20} failed, exit {r['exit']}")
            continue
        print(
            f"{r['name']:<20}{r['epochs']:>4}{r['best_epoch']:>5}{r['best_ppl_word']:>9.2f}"
            f"{r.get('avg_ppl_word', float('nan')):>8.2f}"
            f"{r.get('avg_accuracy', float('nan')):>8.1%}"
            f"{r.get('avg_val_bleu', float('nan')):>6.1f}{r['tokens_per_s']:>9,.0f}"
            + (f"  exit {r['exit']}" if r["exit"] else "")  # killed, or it crashed
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
