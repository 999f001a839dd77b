"""The page "The whole model on one page" shows chapters/whole_model.py, a condensed Transformer
that a reader can copy and run. It is the package's model: the same parameters under the same
names, the same weights from the same seed, and with each shipped model's weights the same
log-probabilities and the same greedy translations."""

from __future__ import annotations

import ast
import copy
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer.checkpoint import load_model
from transformer.config import TransformerConfig
from transformer.decode import Hypothesis
from transformer.masking import padding_mask, target_mask
from transformer.model import Transformer
from transformer.multi30k import PAIRS, load_pairs, parse_pair
from transformer.translation import translate, translate_batches

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "chapters" / "09_whole_model.md"
LISTING = ROOT / "chapters" / "whole_model.py"
SENTENCES = 100  # of test_2016_flickr, per pair


def load_listing():
    spec = importlib.util.spec_from_file_location("whole_model", LISTING)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


listing = load_listing()


def test_the_page_shows_the_whole_file_in_one_listing():
    includes = re.findall(
        r"```\{literalinclude\} (\S+)\n((?::\w+:.*\n)*)```", PAGE.read_text()
    )
    assert len(includes) == 1, includes
    path, options = includes[0]
    assert (PAGE.parent / path).resolve() == LISTING
    assert not re.search(r":(lines|pyobject|start-\w+|end-\w+):", options), options
    assert "```python" not in PAGE.read_text()  # no other code on the page


def test_the_listing_is_about_150_lines_that_fit_the_column_and_imports_only_torch():
    lines = LISTING.read_text().splitlines()
    assert len([line for line in lines if line.strip()]) <= 155
    assert max(map(len, lines)) <= 79  # the book's code column
    imported = set()
    for node in ast.walk(ast.parse(LISTING.read_text())):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add(node.module.split(".")[0])
    assert imported == {"math", "torch"}


def test_the_page_links_every_part_of_the_listing_to_its_chapter():
    """The page's list names each function and class of the listing, and only those, beside
    a link to a chapter."""
    defined = {
        node.name
        for node in ast.parse(LISTING.read_text()).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
    }
    items = re.findall(r"^- (.*(?:\n  .*)*)", PAGE.read_text(), flags=re.MULTILINE)
    named = set()
    for item in items:
        for part in item.split(";"):
            assert re.search(r"\]\(0[1-8]_\w+\.ipynb\)", part), part
            named |= set(re.findall(r"`([A-Za-z_]\w*)`", part))
    assert named == defined


@pytest.mark.slow  # builds the base model: 63 million parameters
def test_a_copy_of_the_listing_runs_on_its_own(tmp_path):
    copy = tmp_path / "transformer_model.py"
    shutil.copy(LISTING, copy)
    # -I: isolated, so that neither the repository nor the package is on the path
    run = subprocess.run(
        [sys.executable, "-I", str(copy)], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout == "63,082,496 parameters; log-probabilities [2, 7, 37000]\n"


def tiny() -> TransformerConfig:
    return TransformerConfig(
        src_vocab_size=50, n_layers=2, d_model=32, n_heads=4, d_ff=64
    )


def twins(seed: int = 0) -> tuple[Transformer, torch.nn.Module]:
    """The package's model and the listing's, each built from the same seed."""
    c = tiny()
    torch.manual_seed(seed)
    ours = Transformer(c)
    torch.manual_seed(seed)
    theirs = listing.Transformer(
        c.src_vocab_size, c.n_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.max_len
    )
    return ours, theirs


def test_the_package_takes_the_papers_options_by_default():
    """The listing has the paper's options only: so does a default TransformerConfig."""
    c = tiny()
    assert (c.norm_first, c.positional, c.attention_dropout, c.ffn_dropout) == (
        False,
        "sinusoidal",
        0.0,
        0.0,
    )
    assert c.share_embeddings and c.tie_output and c.tgt_vocab_size is None
    # and LayerNorm's ε, which the listing types: tensor2tensor's
    assert c.layer_norm_eps == listing.SublayerConnection(8, 0.1).norm.eps


def test_the_same_seed_builds_the_same_weights_under_the_same_names():
    ours, theirs = twins()
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) and sorted(a) == sorted(b)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert theirs.generator.proj.weight is theirs.tgt_embed.embedding.weight
    assert torch.allclose(theirs.pe, ours.src_pos.pe, atol=1e-7, rtol=0)


def toy_batch() -> tuple[torch.Tensor, ...]:
    pad = 0
    src = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 2, pad, pad]])
    tgt = torch.tensor([[1, 11, 12, 13], [1, 14, pad, pad]])
    return src, tgt, padding_mask(src, pad), target_mask(tgt, pad)


def test_the_same_seed_trains_the_same_way():
    """In training mode too, dropout and all: the same loss and the same gradients."""
    ours, theirs = twins()
    src, tgt, src_mask, tgt_mask = toy_batch()
    torch.manual_seed(1)
    a = ours(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
    torch.manual_seed(1)
    b = theirs(src, tgt, src_mask, tgt_mask)
    assert (a - b).abs().max() < 1e-5
    a.sum().backward()
    b.sum().backward()
    grads = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        assert torch.allclose(p.grad, grads[name].grad, atol=1e-4, rtol=1e-4), name


def listing_greedy(model, sources: list[list[int]], tokenizer) -> list[Hypothesis]:
    """Greedy decoding with the listing, as the package decodes: the most probable token at
    each step, never <pad> nor <bos>, up to the source's length + 50 tokens. Without a cache:
    the whole output so far goes through the decoder at each step."""
    pad, bos, eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    src = torch.full((len(sources), max(map(len, sources))), pad)
    for row, ids in enumerate(sources):
        src[row, : len(ids)] = torch.tensor(ids)
    src_mask = listing.padding_mask(src, pad)
    limit = (src != pad).sum(dim=1) + 50
    outputs = [[bos] for _ in sources]
    going = torch.arange(len(sources))  # the sentences without <eos> yet
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        for t in range(int(limit.max())):
            ys = torch.tensor([outputs[b] for b in going.tolist()])  # (n, t + 1)
            tgt_mask = listing.target_mask(ys, pad)
            x = model.embed(ys)
            out = model.decoder(x, memory[going], src_mask[going], tgt_mask)
            log_p = model.generator(out[:, -1])  # (n, V)
            log_p[:, [pad, bos]] = float("-inf")
            token = log_p.argmax(dim=-1)
            for b, i in zip(going.tolist(), token.tolist(), strict=True):
                outputs[b].append(i)
            going = going[(token != eos) & (t + 1 < limit[going])]
            if going.numel() == 0:
                break
    found = []
    for row in outputs:
        ended = eos in row
        tokens = row[1 : row.index(eos)] if ended else row[1:]
        found.append(Hypothesis(tokens, 0.0, 0.0, ended))
    return found


@pytest.fixture(scope="module", params=list(PAIRS))
def shipped(request):
    """(pair, the package's model, the listing holding its weights, tokenizer)."""
    model, tokenizer = load_model(ROOT / "checkpoints" / request.param)
    c = model.config
    theirs = listing.Transformer(
        c.src_vocab_size, c.n_layers, c.d_model, c.n_heads, c.d_ff, c.dropout, c.max_len
    )
    theirs.load_state_dict(model.state_dict(), strict=True)  # every name, the same
    return request.param, model, theirs.eval(), tokenizer


@pytest.mark.slow
def test_a_shipped_model_gives_the_same_log_probabilities(shipped):
    """Teacher-forced on the references, in float64: in float32 the rounding alone moves the
    package's own log-probabilities by up to 2e-5 between its attention kernel and equation (1)
    written out, so float32 would measure the kernels, not the models."""
    pair, ours, theirs, tokenizer = shipped
    ours, theirs = copy.deepcopy(ours).double(), copy.deepcopy(theirs).double()
    pairs = load_pairs("test_2016_flickr", pair)[:SENTENCES]
    pad, bos, eos = tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id
    sources = tokenizer.encode_batch([s for s, _ in pairs])
    targets = tokenizer.encode_batch([t for _, t in pairs], parse_pair(pair)[1])

    def padded(rows: list[list[int]]) -> torch.Tensor:
        out = torch.full((len(rows), max(map(len, rows))), pad)
        for i, row in enumerate(rows):
            out[i, : len(row)] = torch.tensor(row)
        return out

    src = padded([ids + [eos] for ids in sources])
    tgt = padded([[bos] + ids for ids in targets])  # the decoder's input
    src_mask, tgt_mask = padding_mask(src, pad), target_mask(tgt, pad)
    with torch.no_grad():
        a = ours(src, tgt, src_mask=src_mask, tgt_mask=tgt_mask)
        b = theirs(src, tgt, src_mask, tgt_mask)
    assert a.shape == b.shape == (SENTENCES, tgt.size(1), ours.config.src_vocab_size)
    assert (a - b).abs().max() < 1e-10


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_a_shipped_model_gives_the_same_greedy_translations(shipped):
    pair, ours, theirs, tokenizer = shipped
    sources = [s for s, _ in load_pairs("test_2016_flickr", pair)[:SENTENCES]]
    expected = translate(ours, tokenizer, sources, beam_size=1)
    got = translate_batches(
        lambda batch: listing_greedy(theirs, batch, tokenizer),
        tokenizer,
        sources,
        max_len=theirs.pe.size(0),
        batch_size=SENTENCES,
    )
    assert len(set(got)) > SENTENCES // 2  # translations, not one string repeated
    changed = [k for k, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
    assert not changed, (
        f"{len(changed)} of {SENTENCES} differ, the first: sentence {changed[0] + 1}: "
        f"{got[changed[0]]!r} instead of {expected[changed[0]]!r}"
    )
