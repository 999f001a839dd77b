r"""Does a compiled decoding step pay back its compile time within one `evaluate`?

    python -m experiments.compiled_step --out experiments/benchmarks/compiled-step-cpu.json

`torch.compile` makes one program per input shape. The package's step changes shape at every
position (its keys and values grow) and whenever a sentence ends (it leaves the batch), so this
experiment writes the step the way a compiler wants it: one shape per batch. Every row runs to
the batch's longest output limit, the keys and values are written at position t of a buffer of
full length, and attention looks at all of it, with -inf added past position t. The weights are
the package's (`step_weights`), and greedy decoding must give the package's tokens.

It decodes the 1,000 sources of de-en test_2016_flickr in batches of 32, longest first, and
times, on the same batches in turns: the package's `batched_greedy_decode`, the fixed-shape step
eager, and the fixed-shape step compiled (its first run per shape includes the compiling, which
is timed apart). The JSON (written atomically) names the machine and the seconds; the verdict is
whether compiling plus decoding takes less than the package's decoding.
"""

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
from torch import Tensor

from experiments.decode_bench import machine, test_set
from transformer.atomic import atomic_write
from transformer.batched_search import batched_greedy_decode
from transformer.batched_step import BatchCache, attend_rows, linear, step_weights
from transformer.decode import forbid_specials
from transformer.masking import padding_mask
from transformer.search_setup import sentence_output_limits
from transformer.translation import length_sorted_batches, load_pair_model


def fixed_step(model, weights, token: Tensor, t: Tensor, state) -> Tensor:
    """log p(next token) of N rows, given their newest token (N,) at position t (a
    0-dimensional tensor): the package's step (BatchCache.step, post-norm) with every
    shape fixed. state: each layer's keys and values (N·H, L, d_k), written at t, the
    memory's keys and values per layer, and the memory's bias."""
    kv, memory_kv, memory_bias = state
    N, H = token.size(0), kv[0][0].size(0) // token.size(0)
    L = kv[0][0].size(1)
    x = model.tgt_embed(token) + model.tgt_pos.pe.index_select(0, t.view(1))
    # 0 up to position t, -inf after: the positions not yet written.
    future = torch.arange(L, device=t.device) > t
    bias = torch.zeros(L, device=t.device).masked_fill(future, -torch.inf)
    for i, w in enumerate(weights.layers):
        qkv = linear(x, w.qkv).unflatten(1, (3, H, -1))  # (N, 3, H, d_k)
        q = qkv[:, 0].reshape(N * H, 1, -1)
        keys, values = kv[i]
        at = (slice(None), t.view(1))  # position t, written in place
        keys[at] = qkv[:, 1].reshape(N * H, 1, -1)
        values[at] = qkv[:, 2].reshape(N * H, 1, -1)
        out = attend_rows(q, keys, values, bias).view(N, -1)
        x = _norm(x + linear(out, w.self_out), w.norms[0])
        q = linear(x, w.cross_q).view(N * H, 1, -1)
        k, v = memory_kv[i]
        out = attend_rows(q, k, v, memory_bias).view(N, -1)
        x = _norm(x + linear(out, w.cross_out), w.norms[1])
        ff = linear(linear(x, w.ff_1).relu(), w.ff_2)
        x = _norm(x + ff, w.norms[2])
    x = model.decoder.final_norm(x)
    return torch.log_softmax(x @ weights.output, dim=-1)


def _norm(x: Tensor, norm) -> Tensor:
    return torch.nn.functional.layer_norm(
        x, norm.normalized_shape, norm.weight, norm.bias, norm.eps
    )


def fixed_greedy(model, step, src: Tensor, L: int, specials: dict) -> list[list[int]]:
    """Greedy decoding with `step` (fixed_step, eager or compiled): every row runs until
    all have output <eos> or reached their limits, with keys and values for L positions;
    a row's output is cut at its <eos> or its own limit."""
    weights = step_weights(model)
    with torch.inference_mode():
        src_mask = padding_mask(src, specials["pad_id"])
        memory = model.encode(src, src_mask)
        limits = sentence_output_limits(
            model, src, pad_id=specials["pad_id"], max_len=None
        )
        N = src.size(0)
        state = _state(model, memory, src_mask, L)
        token = torch.full((N,), specials["bos_id"])
        ended = torch.zeros(N, dtype=torch.bool)
        found = []
        for t in range(L):
            logp = forbid_specials(
                step(model, weights, token, torch.tensor(t), state), **specials
            )
            token = logp.argmax(dim=-1)
            found.append(token)
            ended |= (token == specials["eos_id"]) | (t + 1 >= limits)
            if ended.all():
                break
    outputs = []
    for row, ids in enumerate(torch.stack(found, 1).tolist()):
        ids = ids[: int(limits[row])]
        eos = specials["eos_id"]
        outputs.append(ids[: ids.index(eos)] if eos in ids else ids)
    return outputs


def _state(model, memory, src_mask, L: int):
    """The keys and values of L positions per layer, and the memory's keys, values and
    bias as the package's BatchCache projects them."""
    n, _, d_model = memory.shape
    H = model.decoder.layers[0].self_attn.n_heads
    shape = (n * H, L, d_model // H)
    kv = [
        (memory.new_zeros(shape), memory.new_zeros(shape)) for _ in model.decoder.layers
    ]
    cache = BatchCache(model, memory, src_mask, beams=1, length=1)
    return kv, cache.memory_kv, cache.memory_bias


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--pair", default="de-en")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sentences", type=int)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    # Every compile from scratch: a cached one would time the cache.
    torch._inductor.config.force_disable_caches = True
    model, tok = load_pair_model(args.pair)
    sources, _ = test_set(model, tok, args.pair, args.sentences)
    specials = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, pad_id=tok.pad_id)
    # One shape per batch size for the compiled step: the sources are padded to the
    # longest,
    S = max(len(s) for s in sources)
    src = torch.full((len(sources), S), tok.pad_id)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids)
    # and the keys and values have room for the longest output limit of all.
    L = int(sentence_output_limits(model, src, pad_id=tok.pad_id).max())
    batches = length_sorted_batches([len(s) for s in sources], 32)
    compiled = torch.compile(fixed_step, dynamic=False)

    runs = {
        "package": lambda b: [
            h.tokens for h in batched_greedy_decode(model, src[b], **specials)
        ],
        "fixed shape, eager": lambda b: fixed_greedy(
            model, fixed_step, src[b], L, specials
        ),
        "fixed shape, compiled": lambda b: fixed_greedy(
            model, compiled, src[b], L, specials
        ),
    }
    start = time.perf_counter()  # compile once per batch shape: 32 rows and the last
    for shape in {len(b): b for b in batches}.values():
        runs["fixed shape, compiled"](shape)
    compile_seconds = time.perf_counter() - start
    seconds = {name: [] for name in runs}
    outputs = {}
    for _ in range(3):
        for name, run in runs.items():
            begin = time.perf_counter()
            outputs[name] = [ids for b in batches for ids in run(b)]
            seconds[name].append(time.perf_counter() - begin)
    same = {
        name: sum(a == b for a, b in zip(found, outputs["package"], strict=True))
        for name, found in outputs.items()
    }
    median = {name: statistics.median(s) for name, s in seconds.items()}
    result = {
        "machine": machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "pair": args.pair,
        "sentences": len(sources),
        "decoding": "greedy, batches of 32",
        "compile_seconds": compile_seconds,
        "seconds": seconds,
        "median_seconds": median,
        "same_as_package": same,
        "pays_back": compile_seconds + median["fixed shape, compiled"]
        < median["package"],
    }
    for name in runs:
        print(f"{name:22} {median[name]:7.2f} s  same as the package: {same[name]}")
    print(f"compiling: {compile_seconds:.1f} s; pays back: {result['pays_back']}")
    if args.out:
        atomic_write(args.out, (json.dumps(result, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
