"""The training loop: one update, validation metrics, the run's configuration, whole runs
that resume exactly, two processes against one, and `python -m transformer train`."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import importlib
import inspect
import io
import json
import math
import os
import shutil
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import safetensors.torch
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from transformer.__main__ import main
from transformer.bpe_dropout import BPEDropout
from transformer.checked_batches import checked_collate, checked_token_batches
from transformer.checkpoint import (
    CheckpointError,
    load_model,
    load_state,
)
from transformer.cli.train import config_from_args, train_parser
from transformer.config import TransformerConfig
from transformer.config_checks import config_from_dict
from transformer.distributed import seed_update
from transformer.encoded_split import EncodedSplit, iterate_batches
from transformer.epoch_data import TrainingData
from transformer.loss import LabelSmoothingLoss
from transformer.model import Transformer
from transformer.multi30k import PAIRS, DataError
from transformer.paths import CACHE_DIR, CHECKPOINTS_DIR, DATA_DIR
from transformer.precision import default_precision, precision_for
from transformer.records import read_jsonl
from transformer.schedule import make_optimizer, noam_lr
from transformer.tokenizer import MARK, train_bpe
from transformer.train_config import (
    BF16_FLAGS,
    RATE,
    RECIPES,
    RESUME_FIXED,
    TrainConfig,
    field_default,
    fixed_on_resume,
    multi30k_recipe,
    option,
    quick_config,
)
from transformer.trainer import Trainer, TrainResult, train
from transformer.trainer_step import trainer_step
from transformer.training_checkpoints import (
    average_checkpoints,
    check_recipe,
    latest_checkpoint,
)
from transformer.training_loop import batch_log_probs, train_loop, train_step
from transformer.validation import count_words, validate

# The module: `transformer.trainer` as an attribute of the package is the function train.
train_module = importlib.import_module("transformer.trainer")
TINY_MODEL = dict(n_layers=1, d_model=16, n_heads=2, d_ff=32, dropout=0.1)
# The command line's spelling of tiny_config below.
TINY_CLI = [
    *(f"--set={k}={v}" for k, v in TINY_MODEL.items()),
    *("--epochs", "2", "--max-tokens", "48", "--warmup", "5", "--device", "cpu"),
    *("--average-last", "2", "--log-every", "2"),
]


def tiny_data(
    seed: int = 0, n_train: int = 40, n_val: int = 12, *, worded: bool = False
) -> TrainingData:
    """A tokenizer learned on random words, and random id sequences: no spaCy, no cache.

    worded: sentences of those words instead, with their word starts (for BPE-dropout).
    """
    rng = np.random.default_rng(seed)
    letters = list("abcdefgh")
    words = [
        tuple(
            MARK + "".join(rng.choice(letters, size=rng.integers(1, 4)))
            for _ in range(5)
        )
        for _ in range(30)
    ]
    tokenizer = train_bpe(words, 40, languages=("de", "en"))
    first = 4  # the special tokens come first

    def split(n: int) -> EncodedSplit:
        if worded:
            pool = [w for sentence in words for w in sentence]

            def sentences() -> list[list[str]]:
                return [list(rng.choice(pool, rng.integers(1, 8))) for _ in range(n)]

            return EncodedSplit.from_words(tokenizer, sentences(), sentences())

        def sentence() -> list[int]:
            return rng.integers(
                first, tokenizer.vocab_size, rng.integers(1, 8)
            ).tolist()

        return EncodedSplit.from_lists(
            [sentence() for _ in range(n)], [sentence() for _ in range(n)]
        )

    return TrainingData(tokenizer, split(n_train), split(n_val))


def tiny_config(out: Path, **fields) -> TrainConfig:
    base = dict(
        pair="de-en",
        model_overrides=TINY_MODEL,
        epochs=2,
        max_tokens=48,
        warmup=5,
        average_last=2,
        device="cpu",
        log_every=2,
        out_dir=str(out),
    )
    return TrainConfig(**(base | fields))


def weights_of(folder: Path) -> dict[str, torch.Tensor]:
    return safetensors.torch.load_file(Path(folder) / "model.safetensors")


# -- one update --------------------------------------------------------------------------------


def copy_pairs(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)
    seqs = [
        torch.randint(3, 13, (int(k),), generator=g).tolist()
        for k in torch.randint(1, 9, (n,), generator=g)
    ]
    return [(s, s) for s in seqs]


def tiny_model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        TransformerConfig(
            src_vocab_size=13, d_model=16, n_heads=2, n_layers=1, d_ff=32, dropout=0.0
        )
    )


def one_update(batches, tokens: int, criterion=None) -> Transformer:
    """A tiny model (dropout 0) after one update over `batches` (default loss: the
    label-smoothed one, summed)."""
    model = tiny_model()
    optimizer, scheduler = make_optimizer(model, d_model=16, warmup=10)
    if criterion is None:
        criterion = LabelSmoothingLoss(pad_id=0, smoothing=0.1, reduction="sum")
    train_step(
        model,
        batches,
        criterion=criterion,
        optimizer=optimizer,
        scheduler=scheduler,
        tokens=tokens,
    )
    return model


def assert_same_update(
    a: Transformer, b: Transformer | dict, atol: float = 1e-6
) -> None:
    """Same gradients (to rounding), and weights within atol after the step, except where the
    gradient is zero up to rounding: Adam's first step moves a weight by about lr·sign(g), so
    rounding noise (e.g. the key biases, whose exact gradient is zero because the softmax
    ignores a shift shared by all keys) moves it by ±lr either way."""
    for name, p in a.named_parameters():
        if isinstance(b, dict):
            q, q_grad = b[name], b[name + ".grad"]
        else:
            q, q_grad = b.get_parameter(name).detach(), b.get_parameter(name).grad
        assert torch.allclose(p.grad, q_grad, rtol=1e-4, atol=1e-7), name
        signal = p.grad.abs() > 1e-6
        assert torch.allclose(p.detach()[signal], q[signal], rtol=0, atol=atol), name


def test_accumulated_micro_batches_make_the_update_of_one_batch():
    pairs = copy_pairs(10, seed=0)
    full = checked_collate(pairs, pad_id=0, bos_id=1, eos_id=2)
    parts = [
        checked_collate(pairs[:4], pad_id=0, bos_id=1, eos_id=2),
        checked_collate(pairs[4:], pad_id=0, bos_id=1, eos_id=2),
    ]
    a = one_update([full], full.n_tgt_tokens)
    b = one_update(parts, full.n_tgt_tokens)
    assert_same_update(a, b)
    # Normalising each micro-batch by its own count would be another update.
    c = one_update(parts, parts[0].n_tgt_tokens)
    w = "encoder.layers.0.feed_forward.w_1.weight"
    assert not torch.allclose(
        a.get_parameter(w).grad, c.get_parameter(w).grad, atol=1e-4
    )


def test_the_runs_step_makes_the_chapters_update():
    """In one process and in float32, trainer_step (the Trainer's update) is the training
    chapter's train_step: the same gradients and weights, bit for bit, update after update,
    micro-batches accumulated, and the same loss (which trainer_step sums in float32)."""
    pairs = copy_pairs(10, seed=3)
    parts = [
        checked_collate(pairs[:4], pad_id=0, bos_id=1, eos_id=2),
        checked_collate(pairs[4:], pad_id=0, bos_id=1, eos_id=2),
    ]
    tokens = sum(b.n_tgt_tokens for b in parts)
    criterion = LabelSmoothingLoss(pad_id=0, smoothing=0.1, reduction="sum")
    chapter, run = tiny_model(), tiny_model()
    steps = [
        (train_step, chapter, *make_optimizer(chapter, d_model=16, warmup=10)),
        (trainer_step, run, *make_optimizer(run, d_model=16, warmup=10)),
    ]
    for _ in range(4):
        ours, theirs = (
            step(
                model,
                parts,
                criterion=criterion,
                optimizer=optimizer,
                scheduler=scheduler,
                tokens=tokens,
            )
            for step, model, optimizer, scheduler in steps
        )
        assert ours == pytest.approx(theirs.item(), rel=1e-6)  # summed in float32
        for (name, p), q in zip(
            chapter.named_parameters(), run.parameters(), strict=True
        ):
            assert torch.equal(p.grad, q.grad), name
            assert torch.equal(p, q), name


def test_the_runs_step_wants_a_summed_loss_and_tokens():
    model = tiny_model()
    optimizer, scheduler = make_optimizer(model, d_model=16, warmup=10)
    batch = checked_collate(copy_pairs(2, seed=1), pad_id=0, bos_id=1, eos_id=2)
    kwargs = dict(optimizer=optimizer, scheduler=scheduler)
    with pytest.raises(ValueError, match="reduction"):
        trainer_step(
            model, [batch], criterion=LabelSmoothingLoss(pad_id=0), tokens=5, **kwargs
        )
    summed = LabelSmoothingLoss(pad_id=0, reduction="sum")
    with pytest.raises(ValueError, match="no batches or no tokens"):
        trainer_step(model, [], criterion=summed, tokens=5, **kwargs)
    with pytest.raises(ValueError, match="no batches or no tokens"):
        trainer_step(model, [batch], criterion=summed, tokens=0, **kwargs)


# -- validation --------------------------------------------------------------------------------


def test_word_perplexity_divides_the_total_nll_by_the_words():
    data = tiny_data()
    words = count_words(data.tokenizer, data.val)
    expected = sum(len(data.tokenizer.decode(t).split()) for _, t in data.val)
    assert words == expected > 0
    model = Transformer(
        TransformerConfig.small(data.tokenizer.vocab_size, **TINY_MODEL)
    )
    tok = data.tokenizer
    batch = checked_collate(
        [data.val[i] for i in range(len(data.val))],
        pad_id=tok.pad_id,
        bos_id=tok.bos_id,
        eos_id=tok.eos_id,
    )
    result = validate(model, [batch], pad_id=tok.pad_id, smoothing=0.1, words=words)
    assert result.stats.tokens == int((data.val.tgt_lengths + 1).sum())
    assert math.isclose(result.word_perplexity, math.exp(result.stats.nll_sum / words))
    metrics = result.metrics()
    assert metrics["val_ppl_token"] == pytest.approx(math.exp(metrics["val_nll"]))
    assert 0 <= metrics["val_accuracy"] <= 1
    assert model.training  # validate restores the mode it found


def test_the_validation_loss_is_label_smoothed_and_the_nll_is_not():
    """val_loss is the training criterion (label smoothing 0.1) per target token, in eval
    mode; val_nll is -log p of the references per token; they differ unless smoothing is 0."""
    data = tiny_data()
    tok = data.tokenizer
    torch.manual_seed(0)
    model = Transformer(TransformerConfig.small(tok.vocab_size, **TINY_MODEL))
    ids = dict(pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    batches = [
        checked_collate(
            [data.val[i] for i in range(k, min(k + 5, len(data.val)))], **ids
        )
        for k in range(0, len(data.val), 5)
    ]
    tokens = sum(b.n_tgt_tokens for b in batches)
    criterion = LabelSmoothingLoss(pad_id=tok.pad_id, smoothing=0.1, reduction="sum")
    smoothed = nll = 0.0
    model.eval()
    with torch.no_grad():
        for b in batches:
            log_probs = batch_log_probs(model, b, pad_id=tok.pad_id)
            smoothed += criterion(log_probs, b.tgt_out).item()
            picked = log_probs.gather(-1, b.tgt_out.unsqueeze(-1)).squeeze(-1)
            nll -= picked[b.tgt_out != tok.pad_id].sum().item()
    model.train()
    metrics = validate(model, batches, pad_id=tok.pad_id, smoothing=0.1).metrics()
    assert metrics["val_loss"] == pytest.approx(smoothed / tokens, rel=1e-5)
    assert metrics["val_nll"] == pytest.approx(nll / tokens, rel=1e-5)
    assert abs(metrics["val_loss"] - metrics["val_nll"]) > 0.05
    plain = validate(model, batches, pad_id=tok.pad_id, smoothing=0.0).metrics()
    assert plain["val_loss"] == pytest.approx(metrics["val_nll"], rel=1e-5)


# -- configuration --------------------------------------------------------------------------------


def test_train_config_round_trips_through_json():
    config = TrainConfig(
        pair="fr-en",
        preset="base",
        model_overrides={"dropout": 0.3},
        epochs=3,
        precision="fp32",
        time_limit=9.5,
        out_dir="runs/x",
    )
    assert TrainConfig.from_dict(json.loads(json.dumps(config.to_dict()))) == config
    assert (
        config.model_config(100).dropout == 0.3
        and config.model_config(100).d_model == 512
    )


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (dict(pair="en-de"), "pair"),
        (dict(preset="huge"), "preset"),
        (dict(model_overrides={"src_vocab_size": 9}), "model_overrides"),
        (dict(model_overrides={"d_model": 100}), "model_overrides"),
        (dict(epochs=0), "epochs"),
        (dict(max_tokens=-1), "max_tokens"),
        (dict(accumulation=1.5), "accumulation"),
        (dict(warmup=0), "warmup"),
        (dict(lr_factor=0), "lr_factor"),
        (dict(lr_factor=math.inf), "lr_factor must be a finite"),
        (dict(peak_flops=math.nan), "peak_flops"),
        (dict(device="foo"), "device must be a torch device"),
        (dict(label_smoothing=1.0), "label_smoothing"),
        (dict(bpe_dropout=1.0), "bpe_dropout"),
        (dict(bpe_dropout=True), "bpe_dropout"),
        (dict(bpe_dropout_sides="target"), "bpe_dropout_sides"),
        (dict(bpe_dropout_sides=["source"]), "bpe_dropout_sides"),
        (dict(seed=-1), "seed"),
        (dict(precision="fp64"), "precision must be one of bf16, fp16, fp32 or None"),
        (dict(time_limit=0), "time_limit"),
        (dict(time_limit=math.inf), "time_limit must be finite"),
        (dict(max_steps=0), "max_steps"),
        (dict(average_last=-1), "average_last"),
    ],
)
def test_train_config_errors_name_the_field(fields, named):
    with pytest.raises(ValueError, match=named):
        TrainConfig(**({"pair": "de-en"} | fields))
    with pytest.raises(ValueError, match="unknown TrainConfig field"):
        TrainConfig.from_dict({"pair": "de-en", "learning_rate": 1})


def test_a_field_brings_its_option_check_and_resume_rule(tmp_path: Path):
    """One field added to a copy of TrainConfig: the command line offers it, with its help,
    the config checks it, and a resumed run must keep it."""
    grad_clip = option(1.0, help="largest gradient norm", on_resume="fixed", check=RATE)
    Clipped = dataclasses.make_dataclass(
        "Clipped", [("grad_clip", float, grad_clip)], bases=(TrainConfig,), frozen=True
    )
    parser = train_parser(Clipped)
    assert "--grad-clip" in parser.format_help() and "largest gradient norm" in (
        parser.format_help()
    )
    args = parser.parse_args(["--pair", "de-en", "--grad-clip", "0.5"])
    config = config_from_args(args, Clipped)
    assert isinstance(config, Clipped) and config.grad_clip == 0.5
    assert Clipped.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match="grad_clip must be a finite positive number"):
        Clipped(pair="de-en", grad_clip=0.0)
    assert "grad_clip" in fixed_on_resume(Clipped)
    assert "grad_clip" not in RESUME_FIXED and "epochs" not in RESUME_FIXED
    folder = tmp_path / "epoch-001"
    folder.mkdir()
    record = {"model": config.model_config().to_dict(), "vocab": {}}
    record["train"] = config.to_dict() | {"epochs": 99}  # a free field may change
    (folder / "config.json").write_text(json.dumps(record))
    check_recipe(folder, config)
    with pytest.raises(
        CheckpointError, match="grad_clip=0.5, this run asks for grad_clip=1"
    ):
        check_recipe(folder, dataclasses.replace(config, grad_clip=1.0))


def stored_run(
    folder: Path, config: TrainConfig, *, without: tuple[str, ...] = ()
) -> Path:
    """A checkpoint's config.json of a run of `config` that does not record the fields
    `without`, as a run begun before they existed."""
    folder.mkdir(parents=True)
    train = {k: v for k, v in config.to_dict().items() if k not in without}
    record = {"model": config.model_config().to_dict(), "vocab": {}, "train": train}
    (folder / "config.json").write_text(json.dumps(record))
    return folder


def test_a_field_a_checkpoint_does_not_record_had_its_default(tmp_path: Path):
    """A run begun before a fixed field existed resumes at the field's default, and refuses
    another value in one line that names the field."""
    config = TrainConfig(pair="de-en")
    folder = stored_run(
        tmp_path / "epoch-001", config, without=("r_drop", "bpe_dropout_sides")
    )
    check_recipe(folder, config)
    for name, value in [("r_drop", 0.5), ("bpe_dropout_sides", "source")]:
        with pytest.raises(CheckpointError) as refused:
            check_recipe(folder, dataclasses.replace(config, **{name: value}))
        message = str(refused.value)
        assert "\n" not in message and str(folder) in message
        default = field_default(TrainConfig.__dataclass_fields__[name])
        assert f"{name}={default!r} (its default: not recorded)" in message
        assert f"this run asks for {name}={value!r}" in message
    # a new field of a copy of TrainConfig: the stored run knows nothing of it
    grad_clip = option(1.0, help="largest gradient norm", on_resume="fixed", check=RATE)
    Clipped = dataclasses.make_dataclass(
        "Clipped", [("grad_clip", float, grad_clip)], bases=(TrainConfig,), frozen=True
    )
    check_recipe(folder, Clipped(pair="de-en"))
    with pytest.raises(CheckpointError, match="grad_clip=1.0 .*asks for grad_clip=0.5"):
        check_recipe(folder, Clipped(pair="de-en", grad_clip=0.5))


def test_overrides_compare_as_the_model_they_make(tmp_path: Path):
    """An override equal to the preset's value is the same run as none: a run whose recipe
    wrote every size out resumes with one that states only what differs."""
    spelled_out = TrainConfig(
        pair="de-en", model_overrides=dict(n_layers=3, d_model=256, d_ff=512)
    )
    folder = stored_run(tmp_path / "epoch-001", spelled_out)
    check_recipe(folder, TrainConfig(pair="de-en", model_overrides=dict(d_ff=512)))
    with pytest.raises(
        CheckpointError,
        match="model_overrides.d_ff=512, this run asks for model_overrides.d_ff=1024",
    ):
        check_recipe(folder, TrainConfig(pair="de-en"))


@pytest.mark.parametrize("pair", list(PAIRS))
def test_the_recipe_is_the_shipped_runs(pair: str):
    """The recipe makes the shipped model and resumes the shipped run: its fixed fields are
    the run's, fields the run predates at their defaults."""
    recipe = multi30k_recipe(pair)
    record = json.loads((CHECKPOINTS_DIR / pair / "config.json").read_text())
    shipped = config_from_dict(record["model"])  # fields it predates: as it was built
    assert recipe.model_config(record["vocab"]["size"]) == shipped
    check_recipe(CHECKPOINTS_DIR / pair, recipe)


@pytest.mark.parametrize("name", list(RECIPES))
def test_a_recipe_states_only_what_differs(name: str):
    """A recipe names its pair and preset, and every other field it sets, and every override,
    differs from the default or the preset's value."""
    recipe = RECIPES[name]("de-en")
    defaults = TrainConfig(pair="de-en", preset=recipe.preset)
    preset = defaults.model_config().to_dict()
    assert all(preset[k] != v for k, v in recipe.model_overrides.items())
    source = ast.parse(textwrap.dedent(inspect.getsource(RECIPES[name])))
    fields = next(
        node.value
        for node in ast.walk(source)
        if isinstance(node, ast.Assign) and node.targets[0].id == "fields"
    )
    stated = {keyword.arg for keyword in fields.keywords}
    assert {"pair", "preset", "model_overrides"} <= stated
    for field in stated - {"pair", "preset", "model_overrides"}:
        assert getattr(recipe, field) != getattr(defaults, field), (name, field)


def test_folders_have_one_name_each(tmp_path: Path):
    """A folder field is the folder: its default filled in when the config is made, and
    stored as None, so that a run resumed on another machine finds that machine's."""
    config = TrainConfig(pair="fr-en")
    assert config.out_dir == Path("runs/fr-en")
    assert (config.cache_dir, config.data_dir) == (CACHE_DIR, DATA_DIR)
    stored = config.to_dict()
    assert stored["out_dir"] is stored["cache_dir"] is stored["data_dir"] is None
    assert TrainConfig.from_dict(stored) == config
    given = TrainConfig(pair="fr-en", out_dir=str(tmp_path), cache_dir="cache")
    assert given.out_dir == tmp_path and given.cache_dir == Path("cache")
    assert given.to_dict()["out_dir"] == str(tmp_path)
    assert TrainConfig.from_dict(json.loads(json.dumps(given.to_dict()))) == given
    with pytest.raises(ValueError, match="cache_dir must be a folder's path or None"):
        TrainConfig(pair="fr-en", cache_dir=3)


def test_the_preset_field_reads_its_earlier_name_model(tmp_path: Path):
    """A run stored with `model`, the preset field's earlier name, still loads and resumes,
    and `--model` still works, with a one-line notice."""
    config = TrainConfig(pair="de-en", preset="base")
    stored = config.to_dict()
    stored["model"] = stored.pop("preset")
    assert TrainConfig.from_dict(stored) == config
    folder = tmp_path / "epoch-001"
    folder.mkdir()
    record = {"model": config.model_config().to_dict(), "vocab": {}, "train": stored}
    (folder / "config.json").write_text(json.dumps(record))
    check_recipe(folder, config)
    with pytest.raises(
        CheckpointError, match="preset='base', this run asks for preset="
    ):
        check_recipe(folder, TrainConfig(pair="de-en"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        args = train_parser().parse_args(["--pair", "de-en", "--model", "big"])
    assert config_from_args(args).preset == "big"
    assert (
        err.getvalue()
        == "python -m transformer train: notice: --model is now --preset\n"
    )
    args = train_parser().parse_args(["--pair", "de-en", "--preset", "big"])
    assert config_from_args(args).preset == "big"


def parsed_with_notice(argv: list[str]) -> tuple[TrainConfig, str]:
    """The config that `train ARGV...` asks for, and what it says on standard error."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        config = config_from_args(train_parser().parse_args(["--pair", "de-en", *argv]))
    return config, err.getvalue()


def test_one_option_each_and_a_notice_for_an_earlier_spelling():
    """`--preset` picks the preset and `--config` a recipe; `--config PRESET` and `--quick`
    still work as before, each with a one-line notice, and the help names only the first."""
    help_text = train_parser().format_help()
    assert "--quick" not in help_text and "--preset" in help_text
    assert "a recipe (multi30k, quick) or a JSON file" in " ".join(help_text.split())
    quick, err = parsed_with_notice(["--quick"])
    assert quick == quick_config("de-en")
    assert err == "python -m transformer train: notice: --quick is now --config quick\n"
    assert parsed_with_notice(["--config", "quick"]) == (quick, "")
    base, err = parsed_with_notice(["--config", "base"])
    assert base == TrainConfig(pair="de-en", preset="base")
    assert err == (
        "python -m transformer train: notice: --config base is now --preset base\n"
    )
    assert parsed_with_notice(["--preset", "base"]) == (base, "")
    # an explicit --preset wins, whichever comes first; a quick run of the base preset
    for argv in (
        ["--config", "base", "--preset", "big"],
        ["--preset", "big", "--config", "base"],
    ):
        assert parsed_with_notice(argv)[0].preset == "big"
    assert parsed_with_notice(["--quick", "--config", "base"])[0] == quick_config(
        "de-en", preset="base"
    )
    status, err = run_main(["--pair", "de-en", "--config", "huge"])
    assert status == 2 and err.count("\n") == 1
    assert (
        "--config takes a recipe (multi30k, quick) or a .json file, got 'huge'" in err
    )


def test_the_bf16_options_still_work_with_a_notice(tmp_path: Path):
    """`--bf16` and `--no-bf16` ask for `--precision bf16` and `fp32`, each with a one-line
    notice, and a run stored with the bf16 flag resumes in the precision it named."""
    config, err = parsed_with_notice(["--bf16"])
    assert config.precision == "bf16"
    assert (
        err == "python -m transformer train: notice: --bf16 is now --precision bf16\n"
    )
    config, err = parsed_with_notice(["--no-bf16"])
    assert config.precision == "fp32"
    assert err == (
        "python -m transformer train: notice: --no-bf16 is now --precision fp32\n"
    )
    assert parsed_with_notice(["--precision", "fp16"])[0].precision == "fp16"
    assert parsed_with_notice([])[0].precision is None  # the device chooses
    out = tmp_path / "run"
    out.mkdir()
    stored = TrainConfig(pair="de-en").to_dict()
    del stored["precision"]
    (out / "train_config.json").write_text(json.dumps(stored | {"bf16": False}))
    args = ["--out", str(out), "--resume"]
    assert parsed_with_notice(args)[0].precision == "fp32"
    assert parsed_with_notice([*args, "--precision", "bf16"])[0].precision == "bf16"


def test_the_model_config_is_built_once():
    config = TrainConfig(pair="de-en", model_overrides={"d_model": 64, "n_heads": 4})
    assert config.model_config() is config.model_config(config.vocab_size)
    assert config.model_config().d_model == 64
    other = config.model_config(100)  # a tokenizer of another size: only that differs
    assert other == dataclasses.replace(config.model_config(), src_vocab_size=100)


# -- whole runs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def data() -> TrainingData:
    return tiny_data()


def test_a_run_writes_metrics_checkpoints_and_an_average(tmp_path: Path, data):
    result = train(tiny_config(tmp_path / "run", epochs=3), data=data, echo=False)
    run = tmp_path / "run"
    assert result.stopped == "completed"
    kinds = [r["kind"] for r in result.metrics]
    assert kinds == ["epoch", "epoch", "epoch", "average"]
    first = result.metrics[0]
    for key in (
        "epoch",
        "step",
        "train_loss",
        "val_loss",
        "val_nll",
        "val_ppl_token",
        "val_ppl_word",
        "val_accuracy",
        "tokens_per_s",
        "lr",
        "wall_time",
        "mfu",
    ):
        assert key in first, key
    assert first["mfu"] is None  # on a CPU
    assert first["train_tokens"] > 0 and first["tokens_per_s"] > 0
    assert result.metrics[-1]["averaged"] == ["epoch-002", "epoch-003"]
    # The last two epochs' weights are kept for the average; the optimiser state only in the
    # newest checkpoint.
    folders = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert folders == ["epoch-002", "epoch-003"]
    assert not (run / "checkpoints" / "epoch-002" / "trainer.safetensors").exists()
    assert (run / "checkpoints" / "epoch-003" / "trainer.safetensors").exists()
    mean = average_checkpoints([run / "checkpoints" / f for f in folders])
    for name, value in weights_of(run / "average").items():
        assert torch.equal(value, mean[name]), name
    assert (run / "train.log").read_text().count("epoch ") >= 3
    steps = read_jsonl(run / "steps.jsonl")
    assert [r["step"] for r in steps] == list(range(2, result.step + 1, 2))


def chapter_run(config: TrainConfig, data: TrainingData) -> tuple[list, float]:
    """The training chapter's `train_loop` on the Trainer's model, batches and dropout masks
    for `config`: its records, and the validation loss of the average it returns."""
    tok = data.tokenizer
    model_config = config.model_config(tok.vocab_size)
    torch.manual_seed(config.seed)  # the Trainer's initial weights
    model = Transformer(model_config)
    optimizer, scheduler = make_optimizer(
        model,
        d_model=model_config.d_model,
        warmup=config.warmup,
        factor=config.lr_factor,
    )
    criterion = LabelSmoothingLoss(
        pad_id=tok.pad_id, smoothing=config.label_smoothing, reduction="sum"
    )
    ids = dict(pad_id=tok.pad_id, bos_id=tok.bos_id, eos_id=tok.eos_id)
    updates = iter(range(10**6))

    def epoch_batches(epoch: int):
        lengths = (data.train.src_lengths + 1, data.train.tgt_lengths + 1)
        order = dict(max_tokens=config.max_tokens, seed=config.seed, epoch=epoch)
        for index in checked_token_batches(*lengths, **order):
            batch = checked_collate([data.train[i] for i in index], **ids, index=index)
            seed_update(config.seed, next(updates), 0)  # the Trainer's dropout masks
            yield batch

    val_batches = list(
        iterate_batches(
            data.val,
            tok,
            max_tokens=config.max_tokens,
            shuffle=False,
            max_len=model_config.max_len,
        )
    )
    history, _, average = train_loop(
        model,
        epoch_batches,
        val_batches,
        epochs=config.epochs,
        average_last=config.average_last,
        criterion=criterion,
        optimizer=optimizer,
        scheduler=scheduler,
    )
    model.load_state_dict(average)
    validation = validate(
        model, val_batches, pad_id=tok.pad_id, smoothing=config.label_smoothing
    )
    return history, validation.loss


def test_the_chapters_loop_makes_the_trainers_run(tmp_path: Path, data):
    """The training chapter's loop and the Trainer, on the same data and seed, in one
    process and in float32, without resuming (what the Trainer adds on purpose): the same
    training loss at every update and the same validation loss after every epoch, to the
    bit, and the same loss of the average of the last epochs (averaged in float64 by the
    Trainer, in float32 by the loop)."""
    config = tiny_config(tmp_path / "run", epochs=3, log_every=1, precision="fp32")
    result = train(config, data=data, echo=False)
    steps = read_jsonl(tmp_path / "run" / "steps.jsonl")
    epochs = [r for r in result.metrics if r["kind"] == "epoch"]
    history, averaged = chapter_run(config, data)
    assert len(history) == len(steps) == result.step > 3 * 3
    assert [r["train_loss"] for r in history] == [r["train_loss"] for r in steps]
    chapter_epochs = [r for r in history if "val_loss" in r]
    assert [r["step"] for r in chapter_epochs] == [r["step"] for r in epochs]
    assert [r["val_loss"] for r in chapter_epochs] == [r["val_loss"] for r in epochs]
    assert averaged == pytest.approx(result.metrics[-1]["val_loss"], rel=1e-6)
    # and the loop is not merely repeating itself: another seed trains otherwise
    other, _ = chapter_run(dataclasses.replace(config, seed=1), data)
    assert [r["train_loss"] for r in other] != [r["train_loss"] for r in history]


def test_the_trainer_holds_no_state_that_its_init_does_not_make(tmp_path: Path, data):
    """Every attribute of a Trainer exists once it is made: training adds none, so a
    reader finds the whole state in __init__."""
    trainer = Trainer(tiny_config(tmp_path / "run", epochs=1), data=data, echo=False)
    made = set(vars(trainer))
    trainer.run()
    assert set(vars(trainer)) == made


def test_every_update_uses_the_learning_rate_of_equation_3(
    tmp_path: Path, data, monkeypatch
):
    """Update n (from 1) runs with noam_lr(n): across an epoch's end, into the checkpoint (the
    scheduler's count of updates, the optimizer's next rate) and across a resume: Adam's step
    is watched. The lr in the logs is the rate the scheduler gave the update of that step.
    """
    rates = []
    adam_step = torch.optim.Adam.step

    def watched(self, *args, **kwargs):
        rates.append(self.param_groups[0]["lr"])
        return adam_step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", watched)
    epoch = len(
        checked_token_batches(
            data.train.src_lengths + 1, data.train.tgt_lengths + 1, max_tokens=48
        )
    )
    k = epoch + 1  # into the second epoch
    run = tmp_path / "run"
    train(tiny_config(run, max_steps=k, average_last=0), data=data, echo=False)
    state = load_state(latest_checkpoint(run), "trainer")
    assert state["scheduler"]["last_epoch"] == k
    lr = functools.partial(noam_lr, d_model=TINY_MODEL["d_model"], warmup=5)
    assert state["optimizer"]["param_groups"][0]["lr"] == lr(k + 1)
    result = train(tiny_config(run, average_last=0), resume=True, data=data, echo=False)
    assert result.step == 2 * epoch > k
    assert rates == [lr(n) for n in range(1, result.step + 1)]
    for name in ("steps.jsonl", "metrics.jsonl"):
        logged = [r for r in read_jsonl(run / name) if "lr" in r]
        assert logged and all(r["lr"] == lr(r["step"]) for r in logged)


def _comparable(records):
    drop = {"wall_time", "tokens_per_s", "mfu"}
    return [{k: v for k, v in r.items() if k not in drop} for r in records]


@pytest.mark.parametrize("bpe_dropout", [0.0, 0.3])
def test_resume_is_exact(tmp_path: Path, data, bpe_dropout):
    """Two epochs straight, and (stop within epoch 1, resume to its end, resume for epoch 2),
    end with bit-identical weights, averages and metrics; with BPE-dropout too, which spells
    the training words afresh each epoch."""
    if bpe_dropout:
        data = tiny_data(worded=True)

    config = functools.partial(tiny_config, bpe_dropout=bpe_dropout)
    straight = train(config(tmp_path / "a"), data=data, echo=False)
    tokens = [r["train_tokens"] for r in straight.metrics if r["kind"] == "epoch"]
    assert (tokens[0] != tokens[1]) == bool(bpe_dropout)
    if bpe_dropout:  # on the source side only, the target tokens stay as they are
        source = train(
            config(tmp_path / "source", bpe_dropout_sides="source", epochs=2),
            data=data,
            echo=False,
        )
        tokens = [r["train_tokens"] for r in source.metrics if r["kind"] == "epoch"]
        assert tokens == [int(data.train.tgt_lengths.sum() + len(data.train))] * 2
    b = tmp_path / "b"
    first = train(config(b, max_steps=2), data=data, echo=False)
    assert first.stopped == "max_steps" and latest_checkpoint(b).name == "step-0000002"
    train(config(b, epochs=1), resume=True, data=data, echo=False)
    assert latest_checkpoint(b).name == "epoch-001"
    resumed = train(config(b), resume=True, data=data, echo=False)
    assert resumed.step == straight.step
    for folder in ("checkpoints/epoch-002", "average"):
        a_weights, b_weights = (
            weights_of(tmp_path / "a" / folder),
            weights_of(b / folder),
        )
        assert a_weights.keys() == b_weights.keys()
        for name, value in a_weights.items():
            assert torch.equal(value, b_weights[name]), (folder, name)
    a_metrics = _comparable(straight.metrics)
    b_metrics = [r for r in _comparable(resumed.metrics) if r["kind"] != "partial"]
    assert a_metrics == b_metrics
    # A finished run resumed with nothing left to do changes nothing.
    again = train(config(b), resume=True, data=data, echo=False)
    assert again.metrics == resumed.metrics


def test_resume_drops_the_records_a_killed_run_wrote_after_its_checkpoint(
    tmp_path: Path, data
):
    """A run killed after its last checkpoint may have written newer records: an epoch's
    metrics (written before its checkpoint), progress lines, and half of one. The resumed run
    drops them all, so its logs are those of a run never stopped (besides the `partial`
    record of the stop itself), every line whole and every step once."""
    straight = train(tiny_config(tmp_path / "a"), data=data, echo=False)
    run = tmp_path / "b"
    train(tiny_config(run, max_steps=2), data=data, echo=False)
    metrics, steps = run / "metrics.jsonl", run / "steps.jsonl"
    [partial] = read_jsonl(metrics)
    [logged] = read_jsonl(steps)
    assert partial["kind"] == "partial" and partial["step"] == logged["step"] == 2
    with open(metrics, "a") as f:
        stale = partial | {"kind": "epoch", "epoch": 1.0, "step": 6, "val_loss": 9.0}
        f.write(json.dumps(stale) + "\n")
    with open(steps, "a") as f:
        f.write(json.dumps(logged | {"step": 4, "train_loss": 9.0}) + "\n")
        f.write(json.dumps(logged | {"step": 6})[:25])  # cut short: no newline
    resumed = train(tiny_config(run), resume=True, data=data, echo=False)
    kept = [r for r in _comparable(resumed.metrics) if r["kind"] != "partial"]
    assert kept == _comparable(straight.metrics)
    assert [r["kind"] for r in resumed.metrics] == [
        "partial",
        "epoch",
        "epoch",
        "average",
    ]
    records = [json.loads(line) for line in steps.read_text().splitlines()]
    timing = {"tokens_per_s", "wall_time"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in records] == [
        {k: v for k, v in r.items() if k not in timing}
        for r in read_jsonl(tmp_path / "a" / "steps.jsonl")
    ]
    assert [r["step"] for r in records] == list(range(2, straight.step + 1, 2))


def test_bpe_dropout_prefetched_in_a_second_process_trains_the_same(tmp_path: Path):
    """On a GPU the next epoch's segmentation comes from a worker process: same weights."""
    data = tiny_data(worded=True)
    config = functools.partial(tiny_config, bpe_dropout=0.3, average_last=0)
    here = train(config(tmp_path / "here"), data=data, echo=False)
    trainer = Trainer(config(tmp_path / "ahead"), data=data, echo=False)
    assert not trainer.epoch_splits.prefetch  # on a CPU
    trainer.epoch_splits.prefetch = True
    ahead = trainer.run()
    # used, and nothing left over
    assert trainer.epoch_splits.pool is not None and not trainer.epoch_splits.ahead
    assert _comparable(ahead.metrics) == _comparable(here.metrics)
    folder = "checkpoints/epoch-002"
    for name, value in weights_of(tmp_path / "here" / folder).items():
        assert torch.equal(value, weights_of(tmp_path / "ahead" / folder)[name]), name


def test_bpe_dropout_that_never_drops_trains_as_without_it(tmp_path: Path):
    """The whole path (resample each epoch, batch, collate) is a no-op when no merge is
    dropped: p = 1e-12 gives the weights of a run without BPE-dropout, bit for bit."""
    data = tiny_data(worded=True)
    config = functools.partial(tiny_config, average_last=0)
    off = train(config(tmp_path / "off"), data=data, echo=False)
    tiny = train(config(tmp_path / "tiny", bpe_dropout=1e-12), data=data, echo=False)
    assert _comparable(tiny.metrics) == _comparable(off.metrics)
    folder = "checkpoints/epoch-002"
    for name, value in weights_of(tmp_path / "off" / folder).items():
        assert torch.equal(value, weights_of(tmp_path / "tiny" / folder)[name]), name


def test_a_batch_budget_that_a_bpe_dropout_spelling_could_overflow_is_refused(
    tmp_path: Path,
):
    """BPE's own spelling fits, but a later epoch may spell a sentence in one token per
    character: refused before training, not when that epoch comes."""
    data = tiny_data(worded=True)
    spelled = BPEDropout(data.tokenizer, 0.1).longest_spelling(data.train) + 1
    longest = int(max(data.train.src_lengths.max(), data.train.tgt_lengths.max())) + 1
    assert spelled > longest
    config = functools.partial(tiny_config, bpe_dropout=0.1, max_tokens=spelled - 1)
    with pytest.raises(
        DataError, match=rf"BPE-dropout may spell.*\({spelled} tokens\)"
    ):
        train(config(tmp_path / "run"), data=data, echo=False)
    assert not (tmp_path / "run").exists()
    overrides = TINY_MODEL | {"max_len": spelled - 1}
    with pytest.raises(DataError, match=rf"max_len={spelled - 1} .*BPE-dropout"):
        train(
            config(tmp_path / "run", max_tokens=spelled, model_overrides=overrides),
            data=data,
            echo=False,
        )
    # Without BPE-dropout, the same budget holds every sentence as BPE spells it.
    train(config(tmp_path / "ok", bpe_dropout=0.0, epochs=1), data=data, echo=False)


def test_bpe_dropout_needs_the_word_starts(tmp_path: Path, data):
    with pytest.raises(DataError, match="word starts"):
        train(tiny_config(tmp_path / "run", bpe_dropout=0.1), data=data, echo=False)
    assert not (tmp_path / "run").exists()  # refused before anything is written


def test_time_limit_stops_the_run(tmp_path: Path, data):
    result = train(tiny_config(tmp_path / "t", time_limit=1e-6), data=data, echo=False)
    assert result.stopped == "time_limit"


def test_a_run_stopped_by_the_time_limit_saves_its_place_and_resumes_exactly(
    tmp_path: Path, data, monkeypatch
):
    """Time runs out in the third epoch, before its third update (the clock is asked before
    each update): the run validates, records a `partial` epoch and checkpoints where it
    stands, and does not average the two epochs it has; resumed, it ends with the weights and
    the average of a run that was never stopped."""
    config = functools.partial(tiny_config, epochs=3, time_limit=60.0)
    straight = train(config(tmp_path / "a"), data=data, echo=False)
    epoch = straight.metrics[0]["step"]  # updates per epoch
    asked = []

    def time_is_up(self) -> bool:  # asked once before each update
        asked.append(len(asked))
        return len(asked) > 2 * epoch + 2

    run = tmp_path / "b"
    with monkeypatch.context() as m:
        m.setattr(train_module._Clock, "time_is_up", time_is_up)
        stopped = train(config(run), data=data, echo=False)
    step = 2 * epoch + 2
    assert len(asked) == step + 1
    assert stopped.stopped == "time_limit" and stopped.step == step
    assert latest_checkpoint(run).name == f"step-{step:07d}"
    progress = json.loads((latest_checkpoint(run) / "progress.json").read_text())
    assert (progress["step"], progress["epoch"], progress["batch"]) == (step, 2, 2)
    kinds = [(r["kind"], r["step"]) for r in stopped.metrics]
    assert kinds == [("epoch", epoch), ("epoch", 2 * epoch), ("partial", step)]
    assert stopped.metrics[-1]["epoch"] == round(2 + 2 / epoch, 4)
    assert not (run / "average").exists()
    resumed = train(config(run), resume=True, data=data, echo=False)
    assert resumed.stopped == "completed" and resumed.step == straight.step
    for folder in ("checkpoints/epoch-003", "average"):
        a, b = weights_of(tmp_path / "a" / folder), weights_of(run / folder)
        assert a.keys() == b.keys()
        for name, value in a.items():
            assert torch.equal(value, b[name]), (folder, name)


def test_incompatible_checkpoints_are_refused(tmp_path: Path, data):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1), data=data, echo=False)
    with pytest.raises(CheckpointError, match="not empty: pass --resume"):
        train(tiny_config(run), data=data, echo=False)
    with pytest.raises(
        CheckpointError, match=r"epoch-001: .*model_overrides.d_model=16"
    ):
        train(
            tiny_config(run, model_overrides=TINY_MODEL | {"d_model": 32}),
            resume=True,
            data=data,
            echo=False,
        )
    with pytest.raises(
        CheckpointError, match=r"epoch-001: .*seed=0, this run asks for seed=1"
    ):
        train(tiny_config(run, seed=1), resume=True, data=data, echo=False)
    other = tiny_data(seed=1)
    with pytest.raises(CheckpointError, match=r"epoch-001: .*(vocab_size|tokenizer)"):
        train(tiny_config(run), resume=True, data=other, echo=False)
    # A run trained by two processes cannot be resumed by one: they decide the updates.
    progress = run / "checkpoints" / "epoch-001" / "progress.json"
    assert json.loads(progress.read_text())["processes"] == 1
    progress.write_text(json.dumps(json.loads(progress.read_text()) | {"processes": 2}))
    with pytest.raises(CheckpointError, match=r"epoch-001: .*by 2 process\(es\)"):
        train(tiny_config(run, epochs=2), resume=True, data=data, echo=False)
    # A config.json of a format this version does not know is named as such.
    config_json = run / "checkpoints" / "epoch-001" / "config.json"
    record = json.loads(config_json.read_text())
    config_json.write_text(
        json.dumps(record | {"format": "transformer-book checkpoint 9"})
    )
    with pytest.raises(CheckpointError, match="checkpoint 9.*cannot read"):
        load_model(run / "checkpoints" / "epoch-001")


def test_a_model_too_short_for_the_data_is_refused_before_training(
    tmp_path: Path, data
):
    overrides = TINY_MODEL | {"max_len": 4}
    with pytest.raises(DataError, match=r"max_len=4 cannot place the longest train"):
        train(
            tiny_config(tmp_path / "run", model_overrides=overrides),
            data=data,
            echo=False,
        )


def test_a_batch_budget_below_the_longest_sentence_is_refused_before_training(
    tmp_path: Path, data, monkeypatch
):
    longest = int(max(data.train.src_lengths.max(), data.train.tgt_lengths.max())) + 1
    small = longest - 1
    message = (
        f"max_tokens={small} cannot hold the longest train sentence ({longest} tokens): "
        "raise --max-tokens"
    )
    with pytest.raises(DataError) as refused:
        train(tiny_config(tmp_path / "run", max_tokens=small), data=data, echo=False)
    assert str(refused.value) == message
    assert not (tmp_path / "run").exists()  # refused before anything is written
    # From the command line: one line on standard error, status 2.
    monkeypatch.setattr(train_module, "load_training_data", lambda config: data)
    out = tmp_path / "cli"
    status, err = run_main(
        ["--pair", "de-en", "--out", str(out), "--max-tokens", str(small)]
    )
    assert status == 2 and err == f"python -m transformer train: error: {message}\n"
    assert not out.exists()


def test_resume_removes_what_a_killed_run_left(tmp_path: Path, data):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1), data=data, echo=False)
    left = [run / ".average.tmp-123", run / ".average.old-123"]
    for folder in left:
        folder.mkdir()
    (run / ".train_config.json.tmp").write_text("{")
    train(tiny_config(run, epochs=2), resume=True, data=data, echo=False)
    assert not [p.name for p in run.iterdir() if p.name.startswith(".")]


def test_an_epoch_too_short_for_one_update_is_refused_before_training(
    tmp_path: Path, data, monkeypatch
):
    """Six batches an epoch cannot make an update of 64: an error before anything is
    written, not a run that validates and checkpoints epochs of no update."""
    message = (
        "an epoch has 6 batches, too few for one update of accumulation 64 × 1 "
        "process(es) = 64 batches: lower --accumulation or --max-tokens"
    )
    with pytest.raises(DataError) as refused:
        train(tiny_config(tmp_path / "run", accumulation=64), data=data, echo=False)
    assert str(refused.value) == message
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(train_module, "load_training_data", lambda config: data)
    out = tmp_path / "cli"
    status, err = run_main(
        ["--pair", "de-en", "--out", str(out), *TINY_CLI, "--accumulation", "64"]
    )
    assert status == 2 and err == f"python -m transformer train: error: {message}\n"
    assert not out.exists()


def test_a_grouping_that_drops_many_batches_is_logged(tmp_path: Path, data):
    """Updates of 4 batches leave 2 of an epoch's 6 out: a warning in the log; updates
    of 2 batches leave none out, and no warning."""
    run = train(
        tiny_config(tmp_path / "four", accumulation=4, epochs=1, average_last=0),
        data=data,
        echo=False,
    )
    assert run.step == 1
    log = (tmp_path / "four" / "train.log").read_text()
    assert "warning: an epoch leaves out 2 of its 6 batches (33%)" in log
    train(
        tiny_config(tmp_path / "two", accumulation=2, epochs=1, average_last=0),
        data=data,
        echo=False,
    )
    assert "warning" not in (tmp_path / "two" / "train.log").read_text()


def test_the_time_limit_reserves_the_longest_stretch_between_two_checks(
    tmp_path: Path, monkeypatch
):
    """With several processes the clock is asked every 10 updates (here in one process,
    by setting check_every). On a fake clock where an update takes 1 s and validating
    and saving take none, a one-minute limit is kept: the run stops at a check no later
    than the limit less the 10 s seen between two checks, not at the first check past
    the limit (66 s)."""
    data = tiny_data(n_train=200)  # 28 batches an epoch
    clock = [0.0]
    step = train_module.trainer_step

    def timed_step(*args, **kwargs):
        clock[0] += 1.0
        return step(*args, **kwargs)

    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(train_module, "trainer_step", timed_step)
    config = tiny_config(tmp_path / "run", epochs=10, time_limit=1.0, average_last=0)
    trainer = Trainer(config, data=data, echo=False)
    trainer.clock.check_every = 10
    result = trainer.run()
    assert result.stopped == "time_limit"
    assert trainer.clock.gap == 10.0
    assert result.metrics and all(r["wall_time"] <= 60 for r in result.metrics)
    assert clock[0] <= 60


# -- two processes against one ------------------------------------------------------------------


def _ddp_worker(rank: int, world: int, folder: str) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    # The processes meet through a file, not a port: a free port picked here could be
    # taken by another program before the group binds it.
    store = Path(folder) / "rendezvous"
    dist.init_process_group(
        "gloo", init_method=store.as_uri(), rank=rank, world_size=world
    )
    try:
        # One update: each process takes half of the batch.
        pairs = copy_pairs(10, seed=0)
        full = checked_collate(pairs, pad_id=0, bos_id=1, eos_id=2)
        half = checked_collate(pairs[rank::world], pad_id=0, bos_id=1, eos_id=2)
        model = tiny_model()
        ddp = DistributedDataParallel(model)
        optimizer, scheduler = make_optimizer(ddp, d_model=16, warmup=10)
        criterion = LabelSmoothingLoss(pad_id=0, smoothing=0.1, reduction="sum")
        trainer_step(
            ddp,
            [half],
            criterion=criterion,
            optimizer=optimizer,
            scheduler=scheduler,
            tokens=full.n_tgt_tokens,
        )
        if rank == 0:
            tensors = {n: p.detach() for n, p in model.named_parameters()}
            tensors |= {n + ".grad": p.grad for n, p in model.named_parameters()}
            safetensors.torch.save_file(tensors, Path(folder) / "step.safetensors")
        # A whole run, the same code path as under torchrun.
        config = tiny_config(
            Path(folder) / "ddp", model_overrides=TINY_MODEL | {"dropout": 0.0}
        )
        train(config, data=tiny_data(), echo=False)
    finally:
        dist.destroy_process_group()


def test_two_processes_make_the_update_of_one(tmp_path: Path, data):
    mp.spawn(_ddp_worker, args=(2, str(tmp_path)), nprocs=2, join=True)

    pairs = copy_pairs(10, seed=0)
    full = checked_collate(pairs, pad_id=0, bos_id=1, eos_id=2)
    one = one_update([full], full.n_tgt_tokens)
    assert_same_update(one, safetensors.torch.load_file(tmp_path / "step.safetensors"))

    # One process accumulating two batches per update sees the batches of the two processes.
    config = tiny_config(
        tmp_path / "single",
        accumulation=2,
        model_overrides=TINY_MODEL | {"dropout": 0.0},
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in each of the two processes: the same rounding
    try:
        single = train(config, data=data, echo=False)
    finally:
        torch.set_num_threads(threads)
    ddp_metrics = read_jsonl(tmp_path / "ddp" / "metrics.jsonl")
    assert [r["step"] for r in ddp_metrics] == [r["step"] for r in single.metrics]
    assert ddp_metrics[-1]["val_loss"] == pytest.approx(
        single.metrics[-1]["val_loss"], rel=1e-5
    )
    for folder in ("checkpoints/epoch-002", "average"):
        a, b = (
            weights_of(tmp_path / "ddp" / folder),
            weights_of(tmp_path / "single" / folder),
        )
        for name, value in a.items():
            assert torch.allclose(value, b[name], rtol=0, atol=1e-6), (folder, name)


# -- the command line --------------------------------------------------------------------------


def run_main(argv: list[str]) -> tuple[int, str]:
    """`python -m transformer train ARGV...`: its exit status and standard error."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        status = main(["train", *argv])
    return status, err.getvalue()


def test_the_multi30k_recipe_by_name_on_the_command_line(tmp_path: Path, monkeypatch):
    recipe = multi30k_recipe("fr-en")
    model = recipe.model_config(8000)
    assert (model.n_layers, model.d_model, model.n_heads, model.d_ff) == (
        3,
        256,
        8,
        512,
    )
    assert model.dropout == 0.3 and not model.norm_first and model.share_embeddings
    assert (recipe.max_tokens, recipe.warmup, recipe.lr_factor) == (3000, 800, 0.7)
    assert (recipe.label_smoothing, recipe.average_last, recipe.epochs) == (0.1, 5, 35)
    assert recipe.precision == "fp32"
    out = str(tmp_path / "run")
    asked = []

    class Asked:  # the trainer the command builds, without training
        def __init__(self, config: TrainConfig, **kwargs) -> None:
            asked.append(config)

        def run(self) -> TrainResult:
            return TrainResult(asked[-1].out_dir, "completed", 0, [])

    monkeypatch.setattr(train_module, "Trainer", Asked)

    def parsed(*options: str) -> TrainConfig:
        args = ["--pair", "fr-en", "--out", out, "--config", "multi30k", *options]
        status, err = run_main(args)
        assert status == 0, err
        return asked[-1]

    assert parsed() == multi30k_recipe("fr-en", out_dir=out)
    # options given beside the recipe win over it
    changed = parsed("--epochs", "3", "--set", "d_model=64", "--dropout", "0.2")
    assert changed.epochs == 3 and changed.warmup == 800
    assert changed.model_overrides == dict(d_ff=512, d_model=64, dropout=0.2)
    model = changed.model_config()
    assert (model.n_layers, model.d_model, model.n_heads, model.d_ff) == (3, 64, 8, 512)
    # booleans in JSON's spelling or Python's
    for spelling in ("true", "True"):
        assert parsed("--set", f"norm_first={spelling}").model_overrides["norm_first"]


def test_cli_unknown_pair():
    status, err = run_main(["--pair", "en-de"])
    assert status == 2 and err.count("\n") == 1
    assert "argument --pair: invalid choice: 'en-de'" in err
    assert "'de-en', 'fr-en'" in err and "Traceback" not in err


def test_cli_bad_option_and_bad_value():
    status, err = run_main(["--pair", "de-en", "--epochs", "many"])
    assert status == 2 and err.count("\n") == 1 and "--epochs" in err
    status, err = run_main(["--pair", "de-en", "--warmup", "0"])
    assert status == 2 and err.count("\n") == 1 and "warmup" in err


def test_cli_missing_data_file(tmp_path: Path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    shutil.copy(DATA_DIR / "SHA256SUMS", data_dir / "SHA256SUMS")
    status, err = run_main(
        [
            "--pair",
            "de-en",
            "--data-dir",
            str(data_dir),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    assert status == 2 and err.count("\n") == 1
    assert "missing data file" in err and "train.de.gz" in err


def test_cli_refuses_a_full_folder_and_an_incompatible_checkpoint(tmp_path: Path, data):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1), data=data, echo=False)
    status, err = run_main(["--pair", "de-en", "--out", str(run)])
    assert status == 2 and err.count("\n") == 1 and "not empty" in err
    status, err = run_main(
        ["--pair", "de-en", "--out", str(run), "--resume", "--set", "d_model=32"]
    )
    assert status == 2 and err.count("\n") == 1
    assert "epoch-001" in err and "d_model=16" in err and "d_model=32" in err
    status, err = run_main(["--pair", "fr-en", "--out", str(run), "--resume"])
    assert status == 2 and "pair='de-en'" in err


def test_resume_where_there_is_no_run_starts_one_and_says_so(tmp_path: Path, data):
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1, max_steps=2), resume=True, data=data, echo=False)
    first = (run / "train.log").read_text().splitlines()[0]
    assert f"nothing to resume in {run}: starting a new run" in first
    train(tiny_config(run, epochs=1, max_steps=4), resume=True, data=data, echo=False)
    assert "resuming from" in (run / "train.log").read_text()


def test_cli_names_a_corrupt_stored_config(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_config.json").write_text("{not json")
    status, err = run_main(["--pair", "de-en", "--out", str(run), "--resume"])
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"cannot read {run / 'train_config.json'}" in err


def test_cli_unknown_device(tmp_path: Path):
    out = tmp_path / "run"
    status, err = run_main(["--pair", "de-en", "--out", str(out), "--device", "foo"])
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert "device must be a torch device" in err and "'foo'" in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[1, 2]", "must hold a JSON object of TrainConfig fields, not a list"),
        ('{"model_overrides": 5}', "model_overrides must be a JSON object"),
        ('{"model_overrides": null}', "model_overrides must be a JSON object"),
        ('{"model_overrides": [1, 2]}', "model_overrides must be a JSON object"),
        ('{"model_overrides": "abc"}', "model_overrides must be a JSON object"),
        ('{"bpe_dropout_sides": ["source"]}', "bpe_dropout_sides must be one of"),
    ],
)
def test_cli_config_file_of_the_wrong_shape(tmp_path: Path, text, named):
    path = tmp_path / "config.json"
    path.write_text(text)
    out = tmp_path / "run"
    status, err = run_main(
        ["--pair", "de-en", "--config", str(path), "--out", str(out)]
    )
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert named in err
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "value"),
    [("--lr-factor", "inf"), ("--lr-factor", "nan"), ("--time-limit", "inf")],
)
def test_cli_numbers_must_be_finite(tmp_path: Path, data, monkeypatch, option, value):
    monkeypatch.setattr(train_module, "load_training_data", lambda config: data)
    out = tmp_path / "run"
    status, err = run_main(
        ["--pair", "de-en", "--out", str(out), *TINY_CLI, option, value]
    )
    assert status == 2 and err.count("\n") == 1
    assert "must be finite" in err or "must be a finite" in err
    assert not out.exists()


def test_cli_export_refuses_a_full_folder_before_training(
    tmp_path: Path, data, monkeypatch
):
    monkeypatch.setattr(train_module, "load_training_data", lambda config: data)
    dest = tmp_path / "checkpoints" / "de-en"
    dest.mkdir(parents=True)
    (dest / "README.md").write_text("model card\n")
    out = tmp_path / "run"
    argv = ["--pair", "de-en", "--out", str(out), *TINY_CLI, "--export", str(dest)]
    status, err = run_main(argv)
    assert status == 2 and err.count("\n") == 1
    assert "cannot export into" in err and "README.md" in err
    assert not out.exists()  # refused before training
    assert (dest / "README.md").read_text() == "model card\n"


def test_cli_export_of_weights_too_large_for_float16(tmp_path: Path, data, monkeypatch):
    """A weight beyond float16's range: one line, status 2, and the run is kept."""
    run = tmp_path / "run"
    train(tiny_config(run, epochs=1, average_last=0), data=data, echo=False)
    file = latest_checkpoint(run) / "model.safetensors"
    weights = safetensors.torch.load_file(file)
    name = sorted(weights)[0]
    weights[name] = torch.full_like(weights[name], 1e6)
    safetensors.torch.save_file(weights, file)
    monkeypatch.setattr(train_module, "load_training_data", lambda config: data)
    dest = tmp_path / "shipped"
    argv = ["--pair", "de-en", "--out", str(run), "--resume", "--export", str(dest)]
    status, err = run_main(argv)
    assert status == 2 and err.count("\n") == 1 and "Traceback" not in err
    assert f"the run in {run} is saved, but --export failed: weight {name}" in err
    assert "does not fit in float16" in err
    assert not dest.exists() and latest_checkpoint(run).name == "epoch-001"


# -- precision --------------------------------------------------------------------------------


def a_gpu(monkeypatch, capability: tuple[int, int]) -> None:
    """CUDA as PyTorch sees a GPU of compute capability `capability`, on a machine without
    one: is_bf16_supported runs as written, over the stubbed device properties, and answers
    yes with emulation allowed, as on a real T4."""
    properties = SimpleNamespace(major=capability[0], minor=capability[1])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device=None: properties
    )
    monkeypatch.setattr(
        torch.cuda, "_check_bf16_tensor_supported", lambda device: True, raising=False
    )


@pytest.mark.parametrize(
    ("capability", "expected"),
    [((6, 1), "fp32"), ((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"),
     ((8, 9), "bf16"), ((9, 0), "bf16")],
)  # fmt: skip
def test_the_default_precision_follows_the_gpus_hardware(
    monkeypatch, capability, expected
):
    """bf16 where the GPU has bfloat16 hardware (compute capability 8.0 and up), float16 with
    loss scaling on 7.x (V100, T4), where bf16 would be emulated although
    is_bf16_supported() answers yes, and float32 on older GPUs."""
    a_gpu(monkeypatch, capability)
    assert torch.cuda.is_bf16_supported()  # emulation counts here, not in the choice
    assert default_precision(torch.device("cuda", 0)) == expected
    assert precision_for(capability) == expected


def test_the_default_precision_on_a_cpu_is_float32():
    assert default_precision(torch.device("cpu")) == precision_for(None) == "fp32"


def test_a_run_records_and_prints_its_precision(tmp_path: Path, data, monkeypatch):
    """The precision a run gets is written in its config and named, with the reason, on its
    log's first line: the device's default, or the one asked for."""
    result = train(tiny_config(tmp_path / "cpu", epochs=1), data=data, echo=False)
    stored = json.loads((result.out_dir / "train_config.json").read_text())
    assert stored["precision"] == "fp32"
    record = json.loads((latest_checkpoint(result.out_dir) / "config.json").read_text())
    assert record["train"]["precision"] == "fp32"
    first = (result.out_dir / "train.log").read_text().splitlines()[0]
    assert "precision fp32 (the default on a CPU)" in first
    asked = train(
        tiny_config(tmp_path / "fp16", epochs=1, precision="fp16"),
        data=data,
        echo=False,
    )
    first = (asked.out_dir / "train.log").read_text().splitlines()[0]
    assert "precision fp16 (asked)" in first


def test_a_float16_step_scales_its_loss_and_skips_an_overflow():
    """Under float16 autocast (on the CPU too) trainer_step scales the loss: an update whose
    scaled gradients overflow is skipped and the scale halved; a taken one gets gradients
    scaled back, those of float32 up to float16's rounding."""
    pairs = copy_pairs(10, seed=3)
    batch = checked_collate(pairs, pad_id=0, bos_id=1, eos_id=2)
    criterion = LabelSmoothingLoss(pad_id=0, smoothing=0.1, reduction="sum")

    def stepped(**arithmetic) -> Transformer:
        model = tiny_model()
        optimizer, scheduler = make_optimizer(model, d_model=16, warmup=10)
        trainer_step(
            model,
            [batch],
            criterion=criterion,
            optimizer=optimizer,
            scheduler=scheduler,
            tokens=batch.n_tgt_tokens,
            **arithmetic,
        )
        return model

    start = tiny_model()
    huge = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    skipped = stepped(autocast=torch.float16, scaler=huge)
    for p, q in zip(start.parameters(), skipped.parameters(), strict=True):
        assert torch.equal(p, q)  # the update was skipped
    assert huge.get_scale() == 2.0**39
    scaler = torch.amp.GradScaler("cpu")
    fp16, fp32 = stepped(autocast=torch.float16, scaler=scaler), stepped()
    assert scaler.get_scale() == 2.0**16  # nothing overflowed
    for (name, p), q in zip(fp16.named_parameters(), fp32.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, rtol=0.05, atol=2e-3), name
    assert not all(
        torch.equal(p.grad, q.grad)
        for p, q in zip(fp16.parameters(), fp32.parameters(), strict=True)
    )  # float16 arithmetic did run


def test_resume_is_exact_in_float16(tmp_path: Path, data, monkeypatch):
    """A float16 run stopped and resumed ends as one that ran straight, bit for bit: its
    checkpoint holds the loss scale and the count of updates since it last changed. Here the
    scale starts high enough to overflow and grows every two updates, so that both have moved
    by the stop."""
    start = dict(init_scale=2.0**20, growth_interval=2)
    scaler = functools.partial(torch.amp.GradScaler, **start)
    monkeypatch.setattr(torch.amp, "GradScaler", scaler)
    config = functools.partial(tiny_config, precision="fp16")
    straight = train(config(tmp_path / "a"), data=data, echo=False)
    b = tmp_path / "b"
    train(config(b, max_steps=3), data=data, echo=False)
    state = load_state(latest_checkpoint(b), "trainer")["scaler"]
    assert state["scale"] != start["init_scale"]
    resumed = train(config(b), resume=True, data=data, echo=False)
    assert resumed.step == straight.step
    for folder in ("checkpoints/epoch-002", "average"):
        a_weights, b_weights = (
            weights_of(tmp_path / "a" / folder),
            weights_of(b / folder),
        )
        for name, value in a_weights.items():
            assert torch.equal(value, b_weights[name]), (folder, name)
    a_metrics = _comparable(straight.metrics)
    assert a_metrics == [
        r for r in _comparable(resumed.metrics) if r["kind"] != "partial"
    ]


def test_resume_keeps_the_runs_precision_and_refuses_another(tmp_path: Path, data):
    """Unset, a resumed run's precision is its own, whatever the device's default; another
    one is refused in one line that names the field."""
    run = tmp_path / "run"
    train(tiny_config(run, max_steps=2, precision="fp16"), data=data, echo=False)
    resumed = train(tiny_config(run, epochs=1), resume=True, data=data, echo=False)
    lines = (run / "train.log").read_text().splitlines()
    resuming = [line for line in lines if "resuming from" in line]
    assert "precision fp16 (the run's own)" in resuming[0]
    assert json.loads((run / "train_config.json").read_text())["precision"] == "fp16"
    assert resumed.stopped == "completed"
    with pytest.raises(CheckpointError) as refused:
        train(tiny_config(run, precision="bf16"), resume=True, data=data, echo=False)
    message = str(refused.value)
    assert "\n" not in message
    assert "precision='fp16', this run asks for precision='bf16'" in message


@pytest.mark.parametrize(
    ("flag", "device", "trained"),
    [(None, "cpu", "fp32"), (None, "cuda", "bf16"), (True, "cpu", "bf16"),
     (False, "cuda", "fp32")],
)  # fmt: skip
def test_a_run_stored_before_precision_reads_as_it_trained(
    tmp_path: Path, flag, device, trained
):
    """A run stored with a bf16 flag and no precision trained in what the flag said, or
    unset, in bf16 with CUDA and fp32 on a CPU: it resumes in that precision and refuses
    another."""
    config = TrainConfig(pair="de-en", device=device)
    stored = stored_run(tmp_path / "epoch-001", config, without=("precision",))
    record = json.loads((stored / "config.json").read_text())
    record["train"]["bf16"] = flag
    (stored / "config.json").write_text(json.dumps(record))
    check_recipe(stored, config)  # unset: the run's own
    check_recipe(stored, dataclasses.replace(config, precision=trained))
    other = "fp16"
    with pytest.raises(CheckpointError, match=f"precision={trained!r}.*{other!r}"):
        check_recipe(stored, dataclasses.replace(config, precision=other))
    assert TrainConfig.from_dict(record["train"]).precision == BF16_FLAGS[flag]
