r"""Write the model card, checkpoints/<pair>/README.md, from the shipped files and the stored
evaluations of the shipped and last-epoch weights on test_2016_flickr, checkpoints/scores/
<pair>.json and <pair>.last.json (written by `python -m transformer evaluate --json`, with
evaluate's default search; each must name the weights of the folder by their SHA-256).

    python -m experiments.model_card de-en --command "python -m transformer train ..." \
        --hardware "2-core Intel Xeon CPU, ..."

Every number in the card is read from the folder (config.json, metrics.jsonl), from the stored
scores or measured here, and the names of the pair's comparison runs from experiments/runs/<pair>/
where there are any; the command and the hardware are the two facts the folder does not hold.
The folder and the scores are checked before the validation split is scored: a missing part, or
scores of other weights, is one line on standard error and exit status 2.
"""

import argparse
import json
from pathlib import Path

from experiments.words import word_level_evaluation
from transformer import layout
from transformer.atomic import atomic_write
from transformer.checked_data import load_pairs
from transformer.checkpoint import CheckpointError, load_model
from transformer.cli.evaluate import model_digest
from transformer.evaluate import STORED_SCORES, Scores, search_label
from transformer.multi30k import DataError
from transformer.records import read_jsonl
from transformer.train_config import multi30k_recipe
from transformer.translation import CHECKPOINTS_DIR

RUNS_DIR = Path(__file__).resolve().parent / "runs"  # <pair>/<run>: the comparison runs

NAMES = {"de-en": "German→English", "fr-en": "French→English"}


def comparison_runs(pair: str, runs: Path = RUNS_DIR) -> list[str]:
    """The names of the pair's comparison runs kept in runs/<pair>, none without that folder."""
    if not (runs / pair).is_dir():
        return []
    return sorted(p.name for p in (runs / pair).iterdir() if p.is_dir())


# The stored evaluation of each row of the card's test table: its name, and its weights.
STORED = {"averaged (shipped)": ("", ""), "last epoch (`last/`)": (".last", "last")}


def stored_scores(pair: str, folder: Path, scores: Path) -> dict[str, dict]:
    """The stored evaluation record of each row of the test table. CheckpointError for a
    missing one, or one whose model is not the folder's weights."""
    records = {}
    for row, (suffix, weights) in STORED.items():
        path = scores / f"{pair}{suffix}.json"
        if not path.is_file():
            raise CheckpointError(
                f"no {path}: write it with `python -m transformer evaluate --pair {pair}"
                f" --checkpoint {folder / weights} --json {path}`"
            )
        record = json.loads(path.read_text(encoding="utf-8"))
        if record["model_sha256"] != model_digest(folder / weights):
            raise CheckpointError(
                f"{path} scores other weights than {folder / weights}'s: evaluate them again"
            )
        records[row] = record
    first, *others = records.values()
    for record in others:  # one search and split for the whole table
        if (record["options"], record["split"]) != (first["options"], first["split"]):
            raise CheckpointError(
                f"the stored scores of {pair} come from different searches or splits"
            )
    return records


def card(
    pair: str,
    command: str,
    hardware: str,
    folder: Path | None = None,
    runs: Path = RUNS_DIR,
    scores: Path | None = None,
) -> str:
    """The card of the shipped folder (checkpoints/<pair> unless `folder` is given), with
    the test scores stored in `scores` (default: STORED_SCORES). CheckpointError for a
    folder without both models or an average in its metrics, or without both stored scores
    of its weights, raised before the validation split is scored, the slow part."""
    folder = CHECKPOINTS_DIR / pair if folder is None else Path(folder)
    model, tokenizer = load_model(folder)
    load_model(folder / "last")
    record = json.loads((folder / layout.CONFIG).read_text())
    metrics = read_jsonl(folder / layout.METRICS)
    epochs = [r for r in metrics if r["kind"] == "epoch"]
    averages = [r for r in metrics if r["kind"] == "average"]
    if not epochs or not averages:
        raise CheckpointError(
            f"{folder / layout.METRICS} holds no epoch or no average record"
        )
    average = averages[-1]
    records = stored_scores(pair, folder, STORED_SCORES if scores is None else scores)
    comparisons = comparison_runs(pair, runs)
    tc, mc = record["train"], record["model"]
    n_params = sum(p.numel() for p in model.parameters())
    results = {row: Scores(**r["scores"]) for row, r in records.items()}
    shipped = results["averaged (shipped)"]
    run = records["averaged (shipped)"]
    search, split = search_label(**run["options"]), run["split"]
    n_epochs = f"{len(epochs)} epoch" + ("s" if len(epochs) != 1 else "")
    hours = epochs[-1]["wall_time"] / 3600
    took = f"{hours:.2f} hours" if hours >= 1 else f"{60 * hours:.1f} minutes"
    tok_s = sorted(r["tokens_per_s"] for r in epochs)[len(epochs) // 2]
    on_gpu = all(r.get("mfu") is not None for r in epochs)
    mfu = sorted(r["mfu"] for r in epochs)[len(epochs) // 2] if on_gpu else None
    wl = word_level_evaluation(model, tokenizer, load_pairs("val", pair))
    files = sorted(p.name for p in folder.iterdir())
    cpu_note = (
        f" and a median MFU of {mfu:.2%} (the throughput table of the experiments appendix"
        " measures the GPU alone)"
        if on_gpu
        else " (a lower bound for this CPU; MFU is not reported for a CPU)"
    )
    tried = (
        ". The metrics and configurations of the other recipes tried ("
        + ", ".join(f"`{c}`" for c in comparisons)
        + f") are in the\nrepository's `experiments/runs/{pair}/`; the experiments appendix "
        "compares them"
        if comparisons
        else ""
    )
    recipe_model = multi30k_recipe(pair).model_config(mc["src_vocab_size"]).to_dict()
    changed = [f"`{k}={v}`" for k, v in mc.items() if recipe_model.get(k) != v]
    recipe = "The training chapter's `multi30k_recipe`" + (
        f", with the model changed to {', '.join(changed)}" if changed else ""
    )
    order = (
        "Pre-norm Transformer encoder–decoder (`norm_first=True`: a LayerNorm before each "
        "sublayer and a last one on each stack, where the paper normalises after each "
        'residual sum; the sublayers chapter) of "Attention Is All You Need"'
        if mc["norm_first"]
        else 'Post-norm Transformer encoder–decoder of "Attention Is All You Need"'
    )
    rows = "".join(
        f"| {name} | {s.bleu:.1f} | {s.chrf:.1f} | {s.bleu_lc_tok:.1f} |\n"
        for name, s in results.items()
    )
    return f"""# {NAMES[pair]} Transformer, Multi30k

**Status:** trained with the book's recipe on {"one GPU" if on_gpu else "a CPU"}, {n_epochs}
in {took}; {shipped.bleu:.1f} sacreBLEU on {split} ({search}).

## Model

{order} (this book's `transformer`
package): {mc["n_layers"]} + {mc["n_layers"]} layers, d_model {mc["d_model"]}, d_ff {mc["d_ff"]}, \
{mc["n_heads"]} heads, dropout {mc["dropout"]}, sinusoidal positions, one \
{mc["src_vocab_size"]:,}-entry joint BPE vocabulary whose embedding table is shared by encoder,
decoder and the pre-softmax projection: {n_params:,} parameters. Weights are float16
safetensors; `load_model` computes in float32.

## Data

Multi30k task 1 (`data/multi30k/`): trained on the 29,000 training pairs, {pair} direction;
validated on `val` (1,014 pairs) after every epoch; tested on `test_2016_flickr` (1,000 pairs).
spaCy's rule-based tokenizers, then the joint BPE vocabulary learned on the training split only
(the data chapter).

## Recipe

{recipe}: Adam (0.9, 0.98, 1e-9), the paper's warm-up and
inverse-square-root schedule with warm-up {tc["warmup"]} and factor {tc["lr_factor"]}, label
smoothing {tc["label_smoothing"]}, batches of at most {tc["max_tokens"]:,} padded tokens per side,
{tc["epochs"]} epochs, seed {tc["seed"]}, the average of the last {tc["average_last"]} epoch
checkpoints. The command that trained it:

```
{command}
```

## Hardware and time

{hardware}: {took} for {n_epochs} ({epochs[-1]["step"]:,} updates), a
median of {tok_s:,.0f} target tokens per second{cpu_note}.

## Results

Validation (`val`, the averaged model, measured by the training loop without dropout):
perplexity per word {average["val_ppl_word"]:.2f}, per token {average["val_ppl_token"]:.2f}, token
accuracy {average["val_accuracy"]:.1%}. Words are the whitespace-separated pieces of the
references, and `<eos>` counts in the loss but not as a word (the training chapter).
In the unit of word-level implementations, spaCy's tokens and `<eos>` ({wl.units:,} of them
against {wl.words:,} words; a token counts as right when all its BPE pieces are the most
probable ones, `word_level_evaluation`, measured here on the shipped weights): perplexity
{wl.ppl_unit:.2f}, accuracy {wl.unit_accuracy:.1%}.

Test (`{split}`, {search}, `python -m transformer evaluate --pair {pair}`):

| weights | sacreBLEU | chrF | BLEU lowercased, spaCy-tokenised* |
| --- | --- | --- | --- |
{rows}
sacreBLEU signature: `{shipped.bleu_signature}`; chrF: `{shipped.chrf_signature}`.
\\* only for comparison with published Multi30k numbers, which use lowercased tokens.

## Files

{", ".join(f"`{f}`" for f in files)}: `config.json` holds the model's and the training's
configuration and the vocabulary's fingerprint; `metrics.jsonl` the run's metrics; `last/` the
last epoch's weights without averaging (for the results chapter's ablation){tried}.
"""


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("pair", choices=sorted(NAMES))
    p.add_argument(
        "--command", required=True, help="the command that trained the model"
    )
    p.add_argument("--hardware", required=True, help="where and how it was trained")
    args = p.parse_args()
    folder = CHECKPOINTS_DIR / args.pair
    try:
        text = card(args.pair, args.command, args.hardware, folder)
    except (CheckpointError, DataError) as err:
        p.exit(2, f"{p.prog}: error: {err}\n")
    atomic_write(folder / "README.md", text.encode("utf-8"))
    print(text)


if __name__ == "__main__":
    main()
