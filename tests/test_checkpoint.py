"""Checkpoints and shipped models: atomic files and folders, state without pickle, tied
weights stored once, averaging, export, `load_model`, and the training chapter's
`load_trained` held equal to it."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch
from test_train import copy_pairs, tiny_config, tiny_data, tiny_model, weights_of

from transformer.atomic import atomic_write
from transformer.checked_batches import checked_collate
from transformer.checkpoint import (
    CheckpointError,
    export_model,
    load_model,
    load_state,
    load_weights,
    model_tensors,
    save_state,
    save_weights,
)
from transformer.config import TransformerConfig
from transformer.epoch_data import TrainingData
from transformer.loss import LabelSmoothingLoss
from transformer.masking import padding_mask, target_mask
from transformer.model import Transformer
from transformer.multi30k import PAIRS, load_pairs
from transformer.paths import CHECKPOINTS_DIR
from transformer.records import atomic_folder
from transformer.schedule import make_optimizer
from transformer.trainer import train
from transformer.training_checkpoints import average_checkpoints, latest_checkpoint
from transformer.training_loop import load_trained, train_step

# The module: `transformer.trainer` as an attribute of the package is the function train.
train_module = importlib.import_module("transformer.trainer")


@pytest.fixture(scope="module")
def data() -> TrainingData:
    return tiny_data()


# -- atomic writes ---------------------------------------------------------------------------


def test_atomic_write_leaves_the_old_file_or_the_new(tmp_path: Path, monkeypatch):
    """A write that fails leaves the old content and no temporary file; one that succeeds
    replaces the file whole, with the mode open() would give it."""
    path = tmp_path / "deep" / "record.json"
    atomic_write(path, b"old")
    fdopen = os.fdopen

    def failing(fd, *args, **kwargs):
        f = fdopen(fd, *args, **kwargs)
        f.write = lambda data: (_ for _ in ()).throw(OSError("disk full"))
        return f

    with monkeypatch.context() as m:
        m.setattr(os, "fdopen", failing)
        with pytest.raises(OSError, match="disk full"):
            atomic_write(path, b"new")
    assert path.read_bytes() == b"old"
    assert [p.name for p in path.parent.iterdir()] == ["record.json"]
    atomic_write(path, b"new")
    umask = os.umask(0)
    os.umask(umask)
    assert path.read_bytes() == b"new" and path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_atomic_folder_leaves_the_old_folder_or_the_new(tmp_path: Path):
    target = tmp_path / "ckpt"
    with atomic_folder(target) as tmp:
        (tmp / "a").write_text("old")
    with pytest.raises(RuntimeError), atomic_folder(target) as tmp:
        (tmp / "a").write_text("half")
        raise RuntimeError("killed")
    assert (target / "a").read_text() == "old"
    with atomic_folder(target) as tmp:
        (tmp / "a").write_text("new")
    assert (target / "a").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_atomic_folder_syncs_its_files_before_the_rename_and_the_rename_after(
    tmp_path: Path, monkeypatch
):
    """A rename can reach the disk before the data of the files renamed: after a power cut
    the folder would hold empty files. Every file of the temporary folder (save_state's
    too) and the folder itself are flushed (os.fsync) before the rename, and the parent
    folder after it. Files are told apart by their inode, which a rename keeps."""
    events = []
    fsync, replace = os.fsync, os.replace

    def watched_fsync(fd):
        st = os.fstat(fd)
        events.append(("fsync", (st.st_dev, st.st_ino)))
        fsync(fd)

    def watched_replace(src, dst):
        events.append(("replace", Path(dst).name))
        replace(src, dst)

    def inode(path: Path) -> tuple[int, int]:
        st = path.stat()
        return st.st_dev, st.st_ino

    monkeypatch.setattr(os, "fsync", watched_fsync)
    monkeypatch.setattr(os, "replace", watched_replace)
    target = tmp_path / "ckpt"
    for content in ("old", "new"):  # into a new folder, then over an old one
        events.clear()
        with atomic_folder(target) as tmp:
            (tmp / "progress.json").write_text(content)
            save_state(tmp, "trainer", {"x": torch.ones(2)})
        assert (target / "progress.json").read_text() == content
        renamed = events.index(("replace", "ckpt"))
        before = {x for kind, x in events[:renamed] if kind == "fsync"}
        after = {x for kind, x in events[renamed:] if kind == "fsync"}
        files = sorted(target.iterdir())
        assert [f.name for f in files] == [
            "progress.json",
            "trainer.json",
            "trainer.safetensors",
        ]
        for path in [*files, target]:
            assert inode(path) in before, path.name
        assert inode(tmp_path) in after


# -- checkpoint pieces -------------------------------------------------------------------------


def test_state_round_trip_is_exact(tmp_path: Path):
    model = tiny_model()
    optimizer, scheduler = make_optimizer(model, d_model=16, warmup=10)
    batch = checked_collate(copy_pairs(4, seed=2), pad_id=0, bos_id=1, eos_id=2)
    criterion = LabelSmoothingLoss(pad_id=0, reduction="sum")
    for _ in range(2):
        train_step(
            model,
            [batch],
            criterion=criterion,
            optimizer=optimizer,
            scheduler=scheduler,
            tokens=batch.n_tgt_tokens,
        )
    state = {
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "odd": {1: (0.1, None, float("inf")), "x": [True, "s"]},
    }
    save_state(tmp_path, "trainer", state)
    back = load_state(tmp_path, "trainer")
    assert back["scheduler"] == state["scheduler"]
    assert back["odd"] == state["odd"] and isinstance(back["odd"][1], tuple)
    assert back["optimizer"]["param_groups"] == state["optimizer"]["param_groups"]
    for i, entry in state["optimizer"]["state"].items():
        for key, value in entry.items():
            assert torch.equal(back["optimizer"]["state"][i][key], value)
    with pytest.raises(TypeError, match="without pickle"):
        save_state(tmp_path, "bad", {"a": object()})


def test_tied_weights_are_stored_once_and_tied_again(tmp_path: Path):
    model = tiny_model()
    stored = model_tensors(model)
    assert (
        "generator.proj.weight" not in stored
        and "tgt_embed.embedding.weight" not in stored
    )
    save_weights(model, tmp_path / "model.safetensors")
    assert set(weights_of(tmp_path)) == set(stored)
    other = Transformer(model.config)
    load_weights(other, tmp_path / "model.safetensors")
    assert other.generator.proj.weight is other.src_embed.embedding.weight
    for (name, a), b in zip(
        model.state_dict().items(), other.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    wider = Transformer(
        TransformerConfig(src_vocab_size=13, d_model=32, n_heads=2, n_layers=1, d_ff=32)
    )
    with pytest.raises(CheckpointError, match="model.safetensors: weight .* has shape"):
        load_weights(wider, tmp_path / "model.safetensors")


def test_average_of_known_tensors(tmp_path: Path):
    values = [([1.0, 2.0], [[0.0]]), ([3.0, 4.0], [[1.0]]), ([5.0, 9.0], [[2.0]])]
    for i, (w, b) in enumerate(values):
        (tmp_path / f"c{i}").mkdir()
        safetensors.torch.save_file(
            {"w": torch.tensor(w), "b": torch.tensor(b)},
            tmp_path / f"c{i}" / "model.safetensors",
        )
    mean = average_checkpoints([tmp_path / f"c{i}" for i in range(3)])
    assert torch.equal(mean["w"], torch.tensor([3.0, 5.0]))
    assert torch.equal(mean["b"], torch.tensor([[1.0]]))
    assert mean["w"].dtype == torch.float32
    safetensors.torch.save_file(
        {"w": torch.zeros(3), "b": torch.zeros(1, 1)}, tmp_path / "odd.safetensors"
    )
    with pytest.raises(CheckpointError, match="odd.safetensors: weight w has shape"):
        average_checkpoints([tmp_path / "c0", tmp_path / "odd.safetensors"])
    with pytest.raises(CheckpointError, match="no weights file"):
        average_checkpoints([tmp_path / "missing"])


# -- export and load_model ---------------------------------------------------------------------


def test_export_and_load_the_shipped_model(tmp_path: Path, data):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=2), data=data, echo=False)
    shipped = export_model(run, tmp_path / "shipped", max_file_bytes=70_000)
    files = sorted(p.name for p in shipped.glob("model-*.safetensors"))
    assert len(files) >= 2  # split to respect the (here tiny) size limit
    assert all((shipped / f).stat().st_size <= 70_000 for f in files)
    assert {"config.json", "tokenizer.json", "metrics.jsonl"} <= {
        p.name for p in shipped.iterdir()
    }
    stored = {
        name: t
        for f in files
        for name, t in safetensors.torch.load_file(shipped / f).items()
    }
    # The average's weights, each rounded once to float16 (not through a coarser type).
    average = weights_of(run / "average")
    assert stored.keys() == average.keys()
    for name, value in average.items():
        assert stored[name].dtype == torch.float16, name
        assert torch.equal(stored[name], value.to(torch.float16)), name
    model, tokenizer = load_model(shipped)
    reference, _ = load_model(run / "average")
    assert (
        not model.training
        and model.generator.proj.weight is model.src_embed.embedding.weight
    )
    src = torch.tensor([data.val[0][0].tolist() + [tokenizer.eos_id]])
    tgt = torch.tensor([[tokenizer.bos_id] + data.val[0][1].tolist()])
    masks = dict(
        src_mask=padding_mask(src, tokenizer.pad_id),
        tgt_mask=target_mask(tgt, tokenizer.pad_id),
    )
    with torch.no_grad():
        assert torch.allclose(
            model(src, tgt, **masks), reference(src, tgt, **masks), atol=1e-2
        )

    with pytest.raises(CheckpointError, match="no model folder"):
        load_model(tmp_path / "nowhere")
    broken = tmp_path / "broken"
    shutil.copytree(shipped, broken)
    (broken / files[-1]).unlink()
    with pytest.raises(CheckpointError, match=f"no weights file .*broken/{files[-1]}"):
        load_model(broken)
    (broken / files[-1]).write_bytes(b"not a safetensors file")
    with pytest.raises(
        CheckpointError, match=f"cannot read weights .*broken/{files[-1]}"
    ):
        load_model(broken)
    shutil.rmtree(broken)
    shutil.copytree(shipped, broken)
    tiny_data(seed=3).tokenizer.save(broken / "tokenizer.json")
    with pytest.raises(CheckpointError, match="broken: .*(vocab_size|tokenizer)"):
        load_model(broken)


def test_export_refuses_a_destination_it_would_wipe(tmp_path: Path, data):
    """An export replaces its destination as a whole: a folder that holds more than an
    earlier export's files (a model card, other runs) is refused, and so is the run
    itself or a folder holding it; an earlier export is replaced."""
    run = tmp_path / "runs" / "de-en"
    train(tiny_config(run, epochs=2), data=data, echo=False)
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    shipped = tmp_path / "checkpoints" / "de-en"  # as the repository ships a model
    (shipped / "last").mkdir(parents=True)
    (shipped / "comparison").mkdir()
    (shipped / "README.md").write_text("model card\n")
    with pytest.raises(
        CheckpointError,
        match=r"cannot export into .*de-en: it holds README.md, comparison, last,",
    ):
        export_model(run, shipped)
    assert (shipped / "README.md").read_text() == "model card\n"
    for dest in (run, tmp_path / "runs", tmp_path, run / "checkpoints" / "epoch-002"):
        source = run / "checkpoints" / "epoch-002" if dest.name == "epoch-002" else run
        with pytest.raises(CheckpointError, match="it holds the source"):
            export_model(source, dest)
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(CheckpointError, match="a-file: it is not a folder"):
        export_model(run, tmp_path / "a-file")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"format": "something else"}))
    with pytest.raises(CheckpointError, match="config.json that is not a shipped"):
        export_model(run, other)
    # An empty folder, and an earlier export, are written over.
    (tmp_path / "empty").mkdir()
    export_model(run, tmp_path / "empty")
    export_model(run, tmp_path / "empty", max_file_bytes=70_000)
    files = sorted(p.name for p in (tmp_path / "empty").iterdir())
    assert files[:3] == ["config.json", "metrics.jsonl", "model-00001.safetensors"]
    assert len(files) > 4 and files[-1] == "tokenizer.json"


def test_the_export_takes_the_average_only_while_it_is_current(
    tmp_path: Path, data, monkeypatch
):
    """A finished run continued for more epochs without averaging them has trained past
    its average: the export takes the newest checkpoint. Continued with averaging, it has
    two `average` records, the earlier end's (kept by the resume: it was written at the
    step of the checkpoint resumed from) and the new end's, which the export takes. A
    run closed at its last whole epoch after a time limit stopped it within the next
    exports its average, which leaves the `partial` epoch out."""

    def source(run: Path) -> str:
        shipped = export_model(run, tmp_path / f"{run.name}-shipped")
        return json.loads((shipped / "config.json").read_text())["source"]

    run = tmp_path / "run"
    train(tiny_config(run, epochs=2), data=data, echo=False)
    assert source(run) == "average"
    train(
        tiny_config(run, epochs=3, average_last=0), resume=True, data=data, echo=False
    )
    assert source(run) == "epoch-003"
    again = train(tiny_config(run, epochs=4), resume=True, data=data, echo=False)
    kinds = [r["kind"] for r in again.metrics]
    assert kinds == ["epoch", "epoch", "average", "epoch", "epoch", "average"]
    assert again.metrics[2]["step"] == again.metrics[1]["step"]
    assert again.metrics[-1]["averaged"] == ["epoch-003", "epoch-004"]
    assert source(run) == "average"

    closed = tmp_path / "closed"
    asked = []

    def time_is_up(self) -> bool:  # in the third epoch, after two updates
        asked.append(len(asked))
        return len(asked) > 2 * again.metrics[0]["step"] + 2

    with monkeypatch.context() as m:
        m.setattr(train_module._Clock, "time_is_up", time_is_up)
        stopped = train(tiny_config(closed, epochs=3), data=data, echo=False)
    assert stopped.stopped == "time_limit"
    assert latest_checkpoint(closed).name.startswith("step-")
    train(tiny_config(closed, epochs=2), resume=True, data=data, echo=False)
    assert source(closed) == "average"


# -- the training chapter's loader ----------------------------------------------------------


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_chapters_load_trained_reads_a_shipped_model_as_load_model(pair: str):
    """The training chapter's short `load_trained` and the package's `load_model` give the
    same model (float32 weights, the shared matrix tied again, eval mode) and the same
    tokenizer, on both shipped models."""
    folder = CHECKPOINTS_DIR / pair
    ours, our_tokenizer = load_trained(folder)
    theirs, their_tokenizer = load_model(folder)
    a, b = ours.state_dict(), theirs.state_dict()
    assert a.keys() == b.keys()
    for name, value in a.items():
        assert value.dtype == b[name].dtype and torch.equal(value, b[name]), name
    assert ours.generator.proj.weight is ours.src_embed.embedding.weight
    assert not ours.training
    assert our_tokenizer.to_json() == their_tokenizer.to_json()
    columns = zip(*load_pairs("val", pair)[:200], strict=True)
    for language, sentences in zip(PAIRS[pair], columns, strict=True):
        assert our_tokenizer.encode_batch(sentences, language) == (
            their_tokenizer.encode_batch(sentences, language)
        )


def test_load_trained_refuses_weights_that_do_not_fit(tmp_path: Path):
    folder = tmp_path / "de-en"
    shutil.copytree(CHECKPOINTS_DIR / "de-en", folder)
    safetensors.torch.save_file(
        {"extra.weight": torch.zeros(2)}, folder / "model-00002.safetensors"
    )
    config = json.loads((folder / "config.json").read_text())
    config["weight_map"]["extra.weight"] = "model-00002.safetensors"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="do not fit the model"):
        load_trained(folder)
