# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The command line
#
# Everything the book builds can be used without a notebook: `python -m transformer` has a
# command for each step of the data's one-way trip from text to scores, and one to deploy.
#
# | command | what it does | library function behind it |
# | --- | --- | --- |
# | `prepare` | tokenise Multi30k and cache every split as token ids | `transformer.encoded_cache.prepare` |
# | `train` | train a model, with checkpoints, metrics and `--resume` | `transformer.trainer.train` |
# | `translate` | translate sentences with a trained model | `transformer.translation.translate` |
# | `evaluate` | score a model on a split with sacreBLEU and chrF | `transformer.split_translation.translate_split` |
# | `ctranslate2` | write a model for the CTranslate2 engine | `transformer.ctranslate2.export_ctranslate2` |
#
# This appendix builds `transformer/cli/`, the only package that parses arguments: `base.py`
# holds the parser, the error convention and the shared options, each command is a module of
# its own, and `main.py` picks the command. The library takes Python values and raises
# exceptions; the command line turns text into those values and those exceptions into one
# line.

# %% tags=["colab-setup", "hide-input"]
# Colab set-up: clone and install the book's package when it is not installed.
# Elsewhere (a local clone after `make book`) this cell does nothing.
import importlib.util

if importlib.util.find_spec("transformer") is None:
    import subprocess
    import sys

    repo = "https://github.com/transformer-book/attention-is-all-you-need"
    where = "/content/transformer-book"
    subprocess.run(["git", "clone", "--depth", "1", repo, where], check=True)
    # [notebooks]: spaCy's tokenizers, Altair and pandas, as the book needs
    pip = [sys.executable, "-m", "pip", "install", "-q", "-e"]
    subprocess.run([*pip, where + "[notebooks]"], check=True)
    # An editable install is seen only after a restart.
    sys.path.insert(0, where)

# %% tags=["remove-cell"]
#| default_exp cli.base

# %% [markdown]
# ## One convention for errors
#
# A mistake the user can fix (an unknown pair, a missing model folder, a corrupt data file, no
# spaCy) prints **one line** on standard error, `python -m transformer COMMAND: error: ...`,
# and exits with status 2, argparse's status for bad usage; a traceback is kept for bugs.
# `Parser` is an `ArgumentParser` whose `error` raises `UsageError` instead of printing a usage
# block, and `run` is the one place that turns the exceptions a command declares into the line.

# %%
#| export
"""The command line's common ground: its parser, its one error convention, and
the options that several commands share."""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from transformer.decode_options import MAX_ALPHA, DecodeOptions, OptionError
from transformer.multi30k import PAIRS, DataError, parse_pair
from transformer.paper_search import PAPER_ALPHA, PAPER_BEAM_SIZE

PROG = "python -m transformer"


class UsageError(Exception):
    """A mistake on the command line: one line on standard error and exit
    status 2."""


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (`UsageError`), not a usage
    block."""

    def error(self, message: str) -> None:
        raise UsageError(message)


def first_line(err: BaseException) -> str:
    """The first line of an error's message, or its type's name when it has
    none."""
    return str(err).splitlines()[0] if str(err) else type(err).__name__


def run(
    command: str,
    body: Callable[[], None],
    errors: tuple[type[BaseException], ...] = (),
) -> int:
    """Run a command's body; return its exit status. `UsageError` and the
    `errors` the command declares print one line on standard error and return
    2; `--help` returns 0."""
    try:
        body()
    except SystemExit as stop:  # argparse's --help
        return int(stop.code or 0)
    except (UsageError, *errors) as err:
        print(f"{PROG} {command}: error: {first_line(err)}", file=sys.stderr)
        return 2
    return 0


def warning(command: str) -> Callable[[str], None]:
    """A function that prints a command's warnings, one line each, on standard
    error."""
    return lambda message: print(
        f"{PROG} {command}: warning: {message}", file=sys.stderr
    )


# %% [markdown]
# The rule in action: an argument `argparse` would reject, and a value only the command can
# judge, both end as one line and status 2.

# %%
from transformer.cli.base import PROG, Parser, UsageError, run


def demo() -> None:
    parser = Parser(prog=f"{PROG} demo")
    parser.add_argument("--beam", type=int)
    args = parser.parse_args(["--beam", "0"])
    if args.beam < 1:
        raise UsageError(f"--beam must be at least 1, got {args.beam}")


status = run("demo", demo)
assert status == 2
assert run("demo", lambda: Parser().parse_args(["--beam", "x"])) == 2
status

# %% [markdown]
# ## Options that several commands share
#
# A language pair is checked in one place, `parse_pair`: `language_pair` is the type of every
# `--pair`, and the parser offers the pairs as its choices. The decoding options, `--beam`,
# `--alpha` and `--batch-size`, become one `DecodeOptions` (appendix
# [Translating text](a08_translating.ipynb)), which checks them and gives their defaults, those
# of `paper_search`; the help calls a default the paper's only while it is the paper's value.
# Its error names the field, and `option_error` puts the option's name in its place.
# torch is imported only once the options are known to be good, so that `--help` and a usage
# error answer at once.


# %%
#| export
def language_pair(text: str) -> str:
    """The type of every --pair: a pair the book has, or parse_pair's error."""
    try:
        parse_pair(text)
    except DataError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


# Each decoding option's name on the command line.
OPTION_NAMES = {
    "beam_size": "--beam",
    "alpha": "--alpha",
    "batch_size": "--batch-size",
}


def option_error(err: OptionError) -> UsageError:
    """A DecodeOptions error, said with the command line's option name."""
    name = OPTION_NAMES.get(err.field, err.field)
    return UsageError(f"{name} {err.problem}")


# %%
#| export
def add_model_options(p: argparse.ArgumentParser) -> None:
    """The options of every command that decodes with a trained model."""
    defaults = DecodeOptions()

    def whose(value, paper) -> str:  # a default says whether it is the paper's
        return ", the paper's" if value == paper else ""

    p.add_argument(
        "--pair", required=True, type=language_pair, choices=list(PAIRS)
    )
    p.add_argument(
        "--beam",
        type=int,
        default=defaults.beam_size,
        metavar="N",
        help=f"beam size; 1 is greedy decoding (default: {defaults.beam_size}"
        f"{whose(defaults.beam_size, PAPER_BEAM_SIZE)})",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=defaults.alpha,
        metavar="A",
        help=f"length penalty α of beam search, from 0 to {MAX_ALPHA:g}"
        f" (default: {defaults.alpha:g}{whose(defaults.alpha, PAPER_ALPHA)})",
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="a shipped model or a checkpoint folder (default:"
        " checkpoints/<pair>, see TRANSFORMER_HOME)",
    )
    p.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        help="default: cuda when available",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=defaults.batch_size,
        metavar="N",
        help=f"sentences decoded at once (default: {defaults.batch_size})",
    )


# %%
#| export
def check_model_options(
    args: argparse.Namespace,
) -> tuple[DecodeOptions, str]:
    """The decoding options and the device that `add_model_options`' options
    ask for, or a one-line UsageError."""
    try:
        options = DecodeOptions(
            beam_size=args.beam, alpha=args.alpha, batch_size=args.batch_size
        )
    except OptionError as err:
        raise option_error(err) from None
    import torch  # once the options are good: a usage error answers at once

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda, but no CUDA GPU is available")
    return options, device


def check_positions(options: DecodeOptions, positions: int) -> None:
    """A one-line UsageError if the length penalty would overflow within a
    model's positions."""
    try:
        options.check_alpha(positions)
    except OptionError as err:
        raise option_error(err) from None


def load_for_command(
    pair: str,
    checkpoint: Path | None,
    device: str,
    options: DecodeOptions | None = None,
):
    """The model and tokenizer to decode with (`load_pair_model`), or a
    one-line UsageError naming the folder; also one if `options`' length
    penalty would overflow within the model's positions."""
    from transformer.checkpoint import CheckpointError
    from transformer.translation import load_pair_model

    try:
        model, tokenizer = load_pair_model(pair, checkpoint, device=device)
    except CheckpointError as err:
        raise UsageError(str(err)) from err
    if options is not None:
        check_positions(options, model.config.max_len)
    return model, tokenizer


# %% [markdown]
# ## `prepare`
#
# `prepare` builds the encoded cache of the data chapter for each pair: spaCy words, the joint
# BPE vocabulary and every split as token ids, so that training needs neither spaCy nor the
# text. A cache that is current is checked and kept; `--rebuild` rebuilds it anyway. It prints
# the size of every split. Each command's module names the errors it reports in one line,
# `ERRORS`.

# %%
#| export cli.prepare
"""`python -m transformer prepare`: Multi30k tokenised and cached as token
ids."""

import os
from collections.abc import Sequence
from pathlib import Path

from transformer.cli.base import PROG, Parser, UsageError, language_pair
from transformer.multi30k import PAIRS, SPLITS, DataError
from transformer.paths import CACHE_DIR, DATA_DIR
from transformer.tokenizer import SPECIALS, VOCAB_SIZE

ERRORS = (DataError, ImportError, OSError)  # reported in one line


# %%
#| export cli.prepare
def prepare_command(argv: Sequence[str]) -> None:
    """`python -m transformer prepare`: build, or check and keep, the encoded
    caches."""
    parser = Parser(
        prog=f"{PROG} prepare",
        description=(
            "Tokenise Multi30k and cache every split as token ids (needs spaCy"
            " unless the cache is already current)."
        ),
    )
    parser.add_argument(
        "--pair",
        action="append",
        type=language_pair,
        choices=list(PAIRS),
        help="may be repeated (default: all)",
    )
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    parser.add_argument("--cache-dir", type=Path, default=CACHE_DIR)
    parser.add_argument("--data-dir", type=Path, default=DATA_DIR)
    parser.add_argument(
        "--rebuild", action="store_true", help="rebuild even a current cache"
    )
    args = parser.parse_args(argv)
    if args.vocab_size <= len(SPECIALS):
        raise UsageError(
            f"--vocab-size must exceed {len(SPECIALS)}, got {args.vocab_size}"
        )
    from transformer.encoded_cache import (  # torch, when needed
        load_encoded,
        prepare,
    )

    for k, pair in enumerate(args.pair or list(PAIRS)):
        tokenizer = prepare(
            pair,
            args.cache_dir,
            vocab_size=args.vocab_size,
            data_dir=args.data_dir,
            rebuild=args.rebuild,
        )
        splits = {
            split: load_encoded(
                pair, split, args.cache_dir, data_dir=args.data_dir
            )
            for split in SPLITS
        }
        if k == 0:  # once the first cache is whole: an error comes alone
            print(
                f"{'pair':<6} {'split':<17} {'sentences':>9}"
                f" {'src tokens':>10} {'tgt tokens':>10}"
            )
        for split, data in splits.items():
            print(
                f"{pair:<6} {split:<17} {len(data):>9,}"
                f" {len(data.src_ids):>10,} {len(data.tgt_ids):>10,}"
            )
        where = os.path.relpath(Path(args.cache_dir) / pair)
        print(f"{pair:<6} {tokenizer!r} in {where}")


# %% [markdown]
# ## `train`
#
# `train` turns its options into a `TrainConfig` (the appendix
# [Setting up a run](a05_run_setup.ipynb)) and trains it. The configuration starts from the
# stored run (with `--resume`), then the recipe or JSON file that `--config` names, then the
# defaults; each option given overrides its field, and `--set FIELD=VALUE` a field of the
# model's configuration. `TrainConfig` checks its fields, and its error becomes the one line.
# `train_parser` makes one option per field, with the field's help, type and choices, so a new
# field is a new option. Earlier spellings (`--model`, `--quick`, `--bf16`) still work, each
# with a one-line notice.

# %%
#| export cli.train
"""`python -m transformer train`: a TrainConfig from the options, trained."""

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import MISSING
from pathlib import Path
from typing import Any

from transformer import layout
from transformer.cli.base import PROG, Parser, UsageError
from transformer.multi30k import DataError

ERRORS = (DataError,)  # one line each, as is a CheckpointError (below)

# %%
#| export cli.train
from transformer.train_config import (
    MODEL_PRESETS,
    RECIPES,
    TrainConfig,
    default_folders,
    flag_of,
    value_type,
)


def _notice(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    """The one line that an earlier spelling of an option gets."""
    print(f"{parser.prog}: notice: {old} is now {new}", file=sys.stderr)


class _Renamed(argparse.Action):
    """An option's earlier spelling: it still works, with a one-line notice.
    With a `const`, it stands for `--dest const`."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        new = "--" + self.dest.replace("_", "-")
        _notice(parser, option_string, f"{new} {self.const or ''}".rstrip())
        setattr(namespace, self.dest, self.const or values)


class _Config(argparse.Action):
    """`--config`: a recipe or a JSON file. A preset's name, its earlier use,
    still sets the preset (unless --preset does), with a notice."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if values in MODEL_PRESETS:
            _notice(parser, f"{option_string} {values}", f"--preset {values}")
            namespace.preset = namespace.preset or values
        else:
            namespace.config = values


def train_parser(
    config: type[TrainConfig] = TrainConfig,
) -> argparse.ArgumentParser:
    """The options of `train`: one per field of `config` that has a flag, with
    the field's help, type and choices, then the command's own."""
    p = Parser(
        prog=f"{PROG} train",
        description="Train a translation model on Multi30k.",
    )
    for field in dataclasses.fields(config):
        if (flag := flag_of(field)) is None:
            continue
        if value_type(field) is bool:
            how = {"action": argparse.BooleanOptionalAction}
        else:
            how = {"type": value_type(field)}
            how["choices"] = field.metadata["choices"]
        # no default, nor a default's factory (which may load torch)
        required = field.default is field.default_factory is MISSING
        p.add_argument(
            flag,
            dest=field.name,
            default=None,
            required=required,
            help=field.metadata["help"],
            **how,
        )
    p.add_argument(
        "--model", dest="preset", action=_Renamed, help=argparse.SUPPRESS
    )
    p.add_argument(
        "--config",
        action=_Config,
        default=None,
        help=f"a recipe ({', '.join(RECIPES)}) or a JSON file of TrainConfig"
        " fields",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out (where there is none yet, start it)",
    )
    p.add_argument("--dropout", type=float, help="the model's dropout")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a field of the model config, e.g. --set d_model=128",
    )
    quick = dict(dest="config", const="quick", nargs=0, help=argparse.SUPPRESS)
    p.add_argument("--quick", action=_Renamed, **quick)  # --config quick
    bf16 = dict(dest="precision", nargs=0, help=argparse.SUPPRESS)
    p.add_argument("--bf16", action=_Renamed, const="bf16", **bf16)
    p.add_argument("--no-bf16", action=_Renamed, const="fp32", **bf16)
    p.add_argument(
        "--export",
        default=None,
        metavar="DIR",
        help=(
            "write the shipped model folder when training ends (a new or empty"
            " folder, or an earlier export)"
        ),
    )
    return p


def parse_value(text: str) -> Any:
    """A --set value: a JSON number, string or boolean; True and False also as
    in Python."""
    if text in ("True", "False"):
        return text == "True"
    try:
        return json.loads(text)
    except ValueError:
        return text


def _json_fields(path: Path, what: str) -> dict[str, Any]:
    """The JSON object of TrainConfig fields in `path`, or a ValueError naming
    it."""
    try:
        fields = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {what}: {err}") from err
    if not isinstance(fields, dict):
        raise ValueError(
            f"{what} must hold a JSON object of TrainConfig fields, not a "
            f"{type(fields).__name__}"
        )
    return fields


def _starting_fields(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """The fields a run starts from: the stored run's on resume, then the
    recipe or the JSON file that --config names."""
    stored = out / layout.RUN_CONFIG
    fields: dict[str, Any] = {}
    if args.resume and stored.is_file():
        fields = _json_fields(stored, str(stored))
    if args.config is None:
        return fields
    if args.config in RECIPES:  # on resume, the stored run must agree with it
        return fields | RECIPES[args.config](args.pair).to_dict()
    if args.config.endswith(".json"):
        return fields | _json_fields(
            Path(args.config), f"--config {args.config}"
        )
    raise ValueError(
        f"--config takes a recipe ({', '.join(RECIPES)}) or a .json file,"
        f" got {args.config!r}"
    )


def config_from_args(
    args: argparse.Namespace, config: type[TrainConfig] = TrainConfig
) -> TrainConfig:
    """The `config` that command-line arguments ask for (on resume, over the
    stored one)."""
    out = args.out_dir or default_folders(args.pair)["out_dir"]
    fields = _starting_fields(args, Path(out))
    fields |= {"pair": args.pair, "out_dir": out}
    for field in dataclasses.fields(config):
        given = getattr(args, field.name, None)
        if flag_of(field) is not None and given is not None:
            fields[field.name] = given
    overrides = fields.get("model_overrides", {})
    if not isinstance(overrides, dict):
        raise ValueError(
            "model_overrides must be a JSON object of TransformerConfig"
            f" fields, got {overrides!r}"
        )
    overrides = dict(overrides)
    if args.dropout is not None:
        overrides["dropout"] = args.dropout
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--set takes FIELD=VALUE, got {item!r}")
        overrides[key.strip()] = parse_value(value)
    fields["model_overrides"] = overrides
    return config.from_dict(fields)


def train_command(argv: Sequence[str]) -> None:
    """`python -m transformer train ...`: train, then print the epochs."""
    args = train_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except ValueError as err:  # a bad value for a TrainConfig field
        raise UsageError(str(err)) from err
    # imported once the options are good: the training's modules load torch
    from transformer import checkpoint
    from transformer.distributed import Distributed
    from transformer.logs import summary_table
    from transformer.trainer import train

    try:
        if args.export:  # before training, not after it
            checkpoint.check_export_destination(
                Path(args.export), config.out_dir
            )
        result = train(config, resume=args.resume)
    except checkpoint.CheckpointError as err:  # e.g. a stored run differs
        raise UsageError(str(err)) from err
    main_process = Distributed.from_environ().is_main
    if args.export and main_process:
        try:
            checkpoint.export_model(result.out_dir, args.export)
        except (ValueError, checkpoint.CheckpointError) as err:  # fp16's range
            raise UsageError(
                f"the run in {result.out_dir} is saved, but --export failed:"
                f" {err}"
            ) from err
    if main_process:
        print(summary_table(result.metrics))
        print(
            f"stopped: {result.stopped} after {result.step:,} updates; run in"
            f" {result.out_dir}"
        )
        if args.export:
            print(f"model exported to {args.export}")


# %% [markdown]
# `config_from_args` is where the command line meets the configuration. A recipe and two
# overrides, without training anything:

# %%
from transformer.cli.train import config_from_args, train_parser

args = train_parser().parse_args(
    [
        "--pair",
        "de-en",
        "--config",
        "multi30k",
        "--warmup",
        "2000",
        "--set",
        "n_layers=4",
    ]
)
config = config_from_args(args)
assert config.warmup == 2000 and config.model_overrides["n_layers"] == 4
config.warmup, config.model_overrides

# %% [markdown]
# ## `translate`
#
# `translate` and `evaluate` share their options (the pair, the search, the model folder, the
# device and the batch size), their checks and how they load a model: `--checkpoint DIR` names
# any trained folder, and without it the shipped model of the pair in `checkpoints/` is used.
# `translate` reads sentences from its arguments or, one per line, from standard input, and
# writes one translation per line in the same order.
#
# Standard input is read in two ways. From a pipe or a file (`< FILE`) every line is read
# first, and the sentences are decoded in batches of similar lengths, the fast way through many
# sentences. From a terminal, each line is translated as soon as it is entered, with the model
# loaded once, until Ctrl-D ends the input: the command becomes a small interactive translator.
# `--prefix TEXT` makes every translation start with `TEXT` and searches on from there: a way to
# ask what the model would say after words of your choosing. `--knock-out SPEC` translates with
# parts of the model switched off, `--knock-out dec-cross:L3h5,pe` say, in the spelling of
# `KnockOut` (the appendix "Engineering the model"): a way to ask what a part is for.

# %%
#| export cli.translate
"""`python -m transformer translate`: sentences from the arguments, a pipe or a
terminal, one translation per line."""

import argparse
import functools
import os
import shlex
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from transformer.cli.base import (
    PROG,
    Parser,
    UsageError,
    add_model_options,
    check_model_options,
    check_positions,
    load_for_command,
    warning,
)
from transformer.decode_options import DecodeOptions

ERRORS = (ImportError,)  # no spaCy, or no CTranslate2: reported in one line

TRANSLATE_EPILOG = """\
Input and output: the SENTENCEs given, or else standard input, one sentence per
line (UTF-8); one translation per line on standard output, in the same order.
From a terminal, each line is translated as it is entered, up to Ctrl-D.
An empty line gives an empty line. Characters that the vocabulary lacks become
<unk>. Put -- before sentences that begin with a dash. A SENTENCE that names an
existing file is translated as a sentence all the same, with a warning: a file
of sentences goes on standard input, < FILE.

A sentence longer than the model's positions (its config's max_len, <eos>
included) is cut to fit: its first max_len - 1 tokens are translated, and a
warning on standard error names it by its number (the line number, for standard
input). So is a translation that the length limit stopped before <eos>.

Errors (an unknown pair or option, a missing or unusable model folder, no
spaCy) print one line on standard error and exit with status 2."""


def read_lines(stream) -> list[str]:
    """The lines of a text stream, read as UTF-8 (undecodable bytes become
    U+FFFD)."""
    if hasattr(stream, "buffer"):
        text = stream.buffer.read().decode("utf-8", errors="replace")
    else:
        text = stream.read()
    # not splitlines(): U+2028 and friends are inside a line
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return [line.removesuffix("\r") for line in lines]


# %%
#| export cli.translate
def answer_lines(
    stream, translate_with: Callable[..., list[str]], warn: Callable
) -> None:
    """Each line of a terminal translated as soon as it is entered, until the
    end of input; a warning names the line by its number."""
    readline = getattr(stream, "buffer", stream).readline
    number = 0
    while line := readline():
        number += 1
        if isinstance(line, bytes):
            line = line.decode("utf-8", errors="replace")
        text = line.removesuffix("\n").removesuffix("\r")
        [translation] = translate_with(
            [text],
            warn=lambda message, n=number: warn(
                message.replace("sentence 1", f"sentence {n}", 1)
            ),
        )
        sys.stdout.write(f"{translation}\n")
        sys.stdout.flush()


# %%
#| export cli.translate
def load_translator(
    args: argparse.Namespace, options: DecodeOptions, device: str
) -> Callable[..., list[str]]:
    """The engine that `--engine` names, loaded once: a function of the
    sentences (and `warn`) that returns their translations."""
    if args.engine == "ctranslate2":
        import torch

        from transformer.cli.ctranslate2 import load_ctranslate2

        if args.prefix:
            raise UsageError("--prefix needs the package's engine")
        if args.by_sentence:
            raise UsageError("--by-sentence needs the package's engine")
        if args.knock_out:
            raise UsageError("--knock-out needs the package's engine")

        engine = load_ctranslate2(args, threads=torch.get_num_threads())
        check_positions(options, engine.max_len)
        return functools.partial(engine.translate, options=options)
    from transformer.knockout import KnockOut, check_knockout
    from transformer.translation import translate

    model, tokenizer = load_for_command(
        args.pair, args.checkpoint, device, options
    )
    try:
        knock_out = KnockOut.parse(args.knock_out)
        check_knockout(model, knock_out)
    except ValueError as err:
        raise UsageError(f"--knock-out {err}") from None
    return functools.partial(
        translate,
        model,
        tokenizer,
        options=options,
        prefix=args.prefix,
        by_sentence=args.by_sentence,
        knock_out=knock_out,
    )


def translate_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=f"{PROG} translate",
        description="Translate sentences with a trained model (Part III).",
        epilog=TRANSLATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "sentences",
        nargs="*",
        metavar="SENTENCE",
        help="a sentence to translate (default: read standard input)",
    )
    add_model_options(p)
    p.add_argument(
        "--engine",
        choices=["package", "ctranslate2"],
        default="package",
        help="ctranslate2: decode in CTranslate2 with a model folder written"
        f" by `{PROG} ctranslate2` (--model DIR)",
    )
    p.add_argument(
        "--model", type=Path, metavar="DIR", help="with --engine ctranslate2"
    )
    p.add_argument(
        "--prefix",
        default="",
        metavar="TEXT",
        help="start every translation with TEXT, in the target language, and"
        " search on from there (a forced prefix)",
    )
    p.add_argument(
        "--by-sentence",
        action="store_true",
        help="cut each line into sentences (transformer.translation."
        "split_sentences) and translate each, with the prefix if given; the"
        " line's translations are joined by a space. The models learned single"
        " captions: without it, a line of several sentences gets its first"
        " translated only",
    )
    p.add_argument(
        "--knock-out",
        default="",
        metavar="SPEC",
        help="translate with parts of the model switched off, such as"
        " enc-self:L1h3 (a head; layers and heads count from 1), dec-cross:L2"
        " (a whole sublayer; also dec-self, enc-ffn, dec-ffn) and pe (the"
        " positional encodings; enc-pe, dec-pe), separated by commas",
    )
    return p


# %%
#| export cli.translate
def translate_command(argv: Sequence[str]) -> None:
    """`python -m transformer translate ...`: one translation per line on
    standard output."""
    argv = list(argv)
    # After "--" every argument is a sentence (parse_intermixed_args
    # mishandles "--").
    cut = argv.index("--") if "--" in argv else len(argv)
    args = translate_parser().parse_intermixed_args(argv[:cut])
    args.sentences += argv[cut + 1 :]
    options, device = check_model_options(args)
    translate_with = load_translator(args, options, device)
    warn = warning("translate")
    if args.sentences:
        sentences = args.sentences
        # isfile, not Path.is_file: a sentence too long for a file name is no
        # error
        for name in filter(os.path.isfile, sentences):
            # still a sentence, as the usage says; but a file was likely meant
            warn(
                f"SENTENCE {name!r} names a file, translated here as a"
                " sentence: to translate the file's lines, give it as"
                f" standard input, < {shlex.quote(name)}"
            )
    elif sys.stdin.isatty():
        print("one sentence per line; end with Ctrl-D", file=sys.stderr)
        answer_lines(sys.stdin, translate_with, warn)
        return
    else:
        sentences = read_lines(sys.stdin)
    translations = translate_with(sentences, warn=warn)
    sys.stdout.write("".join(f"{t}\n" for t in translations))
    sys.stdout.flush()


# %% [markdown]
# ## `evaluate`
#
# `evaluate` translates a split with the same options and prints sacreBLEU and chrF with their
# signatures, as the results chapter reports them. With `--json FILE` it also writes them as
# data, the results chapter's `scores_record`: the options that made the translations and the
# model's `model_digest`, the SHA-256 of the files that `load_model` reads, so that a stored
# score names the weights it belongs to.

# %%
#| export cli.evaluate
"""`python -m transformer evaluate`: a model's translations of a Multi30k
split, scored."""

import argparse
import dataclasses
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

from transformer import layout
from transformer.atomic import atomic_write
from transformer.checked_data import load_pairs
from transformer.cli.base import (
    PROG,
    Parser,
    UsageError,
    add_model_options,
    check_model_options,
    load_for_command,
    warning,
)
from transformer.multi30k import SPLITS, DataError, parse_pair
from transformer.paths import CHECKPOINTS_DIR, DATA_DIR

ERRORS = (DataError, ImportError)  # reported in one line

EVALUATE_EPILOG = """\
Prints sacreBLEU (cased, its 13a tokenizer on the detokenised translations
against the raw references) and chrF, each with its signature; BLEU on
lowercased spaCy-tokenised text, only to compare with published Multi30k
results; and the time that the translation took. --json writes the scores with
the decoding options and the SHA-256 of the model's files.

Errors (an unknown pair, split or option, a missing or unusable model folder, a
missing or corrupt data file, an output file that cannot be written, no spaCy)
print one line on standard error and exit with status 2."""


# %%
#| export cli.evaluate
def evaluate_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=f"{PROG} evaluate",
        description=(
            "Score a trained model on a Multi30k split with sacreBLEU and chrF"
            " (Part III)."
        ),
        epilog=EVALUATE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_options(p)
    p.add_argument(
        "--split",
        default="test_2016_flickr",
        metavar="NAME",
        help=f"{', '.join(SPLITS)} (default: test_2016_flickr)",
    )
    p.add_argument(
        "--data-dir",
        type=Path,
        default=DATA_DIR,
        metavar="DIR",
        help="the Multi30k files and their SHA256SUMS (default: data/multi30k,"
        " see TRANSFORMER_HOME)",
    )
    p.add_argument(
        "--limit",
        type=int,
        metavar="N",
        help="translate only the split's first N sentences (default: all)",
    )
    p.add_argument(
        "--output",
        type=Path,
        metavar="FILE",
        help="also write the translations to FILE, one per line",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="also write the scores, the decoding options and the model's"
        " SHA-256 to FILE, as JSON",
    )
    return p


def check_evaluate_options(args: argparse.Namespace) -> None:
    """A one-line UsageError for a bad split, limit or output file."""
    if args.split not in SPLITS:
        raise UsageError(
            f"unknown split {args.split!r}: choose one of {', '.join(SPLITS)}"
        )
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit must be at least 1, got {args.limit}")
    for path in (args.output, args.json):
        if path is not None and not path.parent.is_dir():
            raise UsageError(f"cannot write {path}: no folder {path.parent}")
        if path is not None and path.is_dir():
            raise UsageError(f"cannot write {path}: it is a folder")


def model_digest(folder: Path) -> str:
    """The SHA-256 of a model folder's model: of its config.json,
    tokenizer.json and weight files, the files that `load_model` reads."""
    config = json.loads((folder / layout.CONFIG).read_text(encoding="utf-8"))
    digest = hashlib.sha256()
    for path in (
        folder / layout.CONFIG,
        folder / layout.TOKENIZER,
        *layout.weight_files(folder, config),
    ):
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def write_scores(args: argparse.Namespace, scores, options) -> None:
    """The scores of the run that `args` and `options` asked for, as JSON in
    args.json (the results chapter's scores_record), written atomically, or a
    one-line UsageError."""
    from transformer.evaluate import scores_record

    record = scores_record(
        scores,
        pair=args.pair,
        split=args.split,
        options=dataclasses.asdict(options),
        model=model_digest(args.checkpoint or CHECKPOINTS_DIR / args.pair),
    )
    text = json.dumps(record, ensure_ascii=False, indent=2) + "\n"
    path = args.json
    try:
        atomic_write(path, text.encode("utf-8"))
    except OSError as err:
        raise UsageError(f"cannot write {path}: {err.strerror}") from err


# %%
#| export cli.evaluate
def evaluate_command(argv: Sequence[str]) -> None:
    """`python -m transformer evaluate ...`: translate a split, print its
    scores."""
    args = evaluate_parser().parse_args(argv)
    options, device = check_model_options(args)
    check_evaluate_options(args)
    # a data error before the model's
    load_pairs(args.split, args.pair, args.data_dir)
    import torch

    from transformer.evaluate import score, search_label
    from transformer.split_translation import translate_split, write_lines

    model, tokenizer = load_for_command(
        args.pair, args.checkpoint, device, options
    )
    result = translate_split(
        model,
        tokenizer,
        args.pair,
        args.split,
        options,
        data_dir=args.data_dir,
        limit=args.limit,
        warn=warning("evaluate"),
    )
    scores = score(
        result.hypotheses, result.references, language=parse_pair(args.pair)[1]
    )
    if args.output is not None:
        try:
            write_lines(args.output, result.hypotheses)
        except OSError as err:
            raise UsageError(
                f"cannot write {args.output}: {err.strerror}"
            ) from err
    if args.json is not None:
        write_scores(args, scores, options)
    folder = args.checkpoint or f"the shipped model, checkpoints/{args.pair}"
    search = search_label(options.beam_size, options.alpha)
    print(
        f"{args.pair} {args.split}: {scores.sentences:,} sentences, {search},"
        f" model {folder}"
    )
    print(scores.report())
    threads = torch.get_num_threads()
    print(
        f"translated in {result.seconds:.1f} s"
        f" ({result.sentences_per_second:.1f} sentences/s on {device},"
        f" {threads} CPU thread{'s' if threads > 1 else ''})"
    )
    if args.output is not None:
        print(f"translations written to {args.output}")
    if args.json is not None:
        print(f"scores written to {args.json}")


# %% [markdown]
# ## `ctranslate2`
#
# `python -m transformer ctranslate2` writes a model for the CTranslate2 engine (the appendix
# [Deploying with CTranslate2](a09_ctranslate2.ipynb)); `export --format ctranslate2`, its old
# name, still works. `translate --engine ctranslate2 --model DIR` then translates with it, with
# the same options and the same tokenizer as the package's engine:

# %%
#| export cli.ctranslate2
"""`python -m transformer ctranslate2`, and `translate --engine ctranslate2`:
the command line's face of `transformer.ctranslate2`."""

import argparse
from collections.abc import Sequence
from pathlib import Path

from transformer.cli.base import (
    PROG,
    Parser,
    UsageError,
    language_pair,
    load_for_command,
)
from transformer.multi30k import PAIRS

ERRORS = (ImportError, OSError)  # reported in one line
# The weights' types that export_ctranslate2 takes, its QUANTIZATIONS (a test
# holds the two equal), named here: that module loads torch, `--help` does not.
QUANTIZATIONS = ("float32", "int8")


def ctranslate2_command(argv: Sequence[str]) -> None:
    """`python -m transformer ctranslate2 --pair P OUT`."""
    p = Parser(
        prog=f"{PROG} ctranslate2",
        description=(
            "Write a trained model as a CTranslate2 model folder, the"
            " package's tokenizer beside it, for `translate --engine"
            " ctranslate2 --model OUT`."
        ),
    )
    p.add_argument("out", type=Path, metavar="OUT", help="the folder to write")
    # `export --format ctranslate2`, the command's old name, still works
    p.add_argument("--format", choices=["ctranslate2"], help=argparse.SUPPRESS)
    p.add_argument(
        "--pair", required=True, type=language_pair, choices=list(PAIRS)
    )
    p.add_argument(
        "--checkpoint",
        type=Path,
        metavar="DIR",
        help="a shipped model or a checkpoint folder (default:"
        " checkpoints/<pair>, see TRANSFORMER_HOME)",
    )
    p.add_argument(
        "--quantize",
        choices=QUANTIZATIONS,
        default="float32",
        help="the weights' type in the engine (default: float32, as trained)",
    )
    args = p.parse_args(argv)
    from transformer.ctranslate2 import export_ctranslate2

    model, tokenizer = load_for_command(args.pair, args.checkpoint, "cpu")
    try:
        export_ctranslate2(
            model, tokenizer, args.out, quantization=args.quantize
        )
    except ValueError as err:  # a model the export does not convert
        raise UsageError(str(err)) from None
    print(
        f"{args.pair} model written to {args.out} for CTranslate2"
        f" ({args.quantize})"
    )


# %%
#| export cli.ctranslate2
def load_ctranslate2(args: argparse.Namespace, threads: int):
    """`translate --engine ctranslate2`: the exported folder args.model,
    loaded (a `CTranslate2Model`), or a one-line UsageError."""
    from transformer.checkpoint import CheckpointError
    from transformer.ctranslate2 import CTranslate2Model
    from transformer.tokenizer import TokenizerError

    if args.model is None:
        raise UsageError(
            "--engine ctranslate2 needs --model DIR, a folder written by "
            f"`{PROG} ctranslate2`"
        )
    try:
        engine = CTranslate2Model(args.model, threads=threads)
    except (CheckpointError, TokenizerError, OSError, RuntimeError) as err:
        raise UsageError(f"cannot load {args.model}: {err}") from err
    if engine.tokenizer.pair != args.pair:
        raise UsageError(
            f"{args.model} holds a {engine.tokenizer.pair} model, not a"
            f" {args.pair} one"
        )
    return engine


# %% tags=["nbval-ignore-output"]
import contextlib
import io
import shutil
import tempfile
from pathlib import Path

from transformer.cli.main import main

scratch = Path(tempfile.mkdtemp())
out = io.StringIO()
with contextlib.redirect_stdout(out):
    main(["ctranslate2", "--pair", "de-en", str(scratch / "cli")])
    main(["translate", "--pair", "de-en", "--engine", "ctranslate2",
          "--model", str(scratch / "cli"),
          "Ein Hund rennt über eine Wiese."])  # fmt: skip
print(out.getvalue())
shutil.rmtree(scratch)

# %% [markdown]
# ## Dispatching
#
# `python -m transformer COMMAND` runs `main`, which imports the command's module (only then:
# `--help` loads neither torch nor spaCy) and hands its `<name>_command` to `run` with the
# errors that module reports in one line. `export`, the old name of `ctranslate2`, still works
# with a note. Ctrl-C (status 130: every file is written atomically, and `train --resume`
# continues from the last checkpoint) and a reader that stopped reading, as in `... | head`,
# get one line too.

# %%
#| export cli.main
"""`python -m transformer COMMAND ...`: the command picked, and its module
imported only when it runs."""

import importlib
import os
import sys
from collections.abc import Sequence

from transformer.cli.base import PROG, run

# Each command, and what it does; its module transformer.cli.<command> holds
# <command>_command(argv) and the ERRORS it reports in one line.
COMMANDS = {
    "prepare": "tokenise Multi30k and cache every split as token ids",
    "train": "train a translation model (Part II)",
    "translate": "translate sentences with a trained model (Part III)",
    "evaluate": "score a trained model with sacreBLEU and chrF (Part III)",
    "ctranslate2": "write a model for CTranslate2, the inference engine",
}
RENAMED = {"export": "ctranslate2"}  # an old name, and the command's today


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m transformer COMMAND ...`; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in {"-h", "--help"}:
        # Asked for, the help goes to standard output; without a command it is
        # an error, so the usage goes to standard error with status 2.
        out = sys.stdout if argv else sys.stderr
        print(f"usage: {PROG} COMMAND [options]\n\ncommands:", file=out)
        for name, summary in COMMANDS.items():
            print(f"  {name:<12} {summary}", file=out)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command in RENAMED:
        print(
            f"{PROG}: note: `{command}` is now `{RENAMED[command]}`",
            file=sys.stderr,
        )
        command = RENAMED[command]
    if command not in COMMANDS:
        print(
            f"{PROG}: error: unknown command {command!r}: choose one of "
            f"{', '.join(COMMANDS)}",
            file=sys.stderr,
        )
        return 2
    try:
        module = importlib.import_module(f"transformer.cli.{command}")
        body = getattr(module, f"{command}_command")
        return run(command, lambda: body(rest), module.ERRORS)
    except KeyboardInterrupt:
        print(f"{PROG} {command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Keep Python from failing again when it flushes standard output at
        # exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


# %% [markdown]
# The commands, then a translation with the shipped German→English model, as a user types it
# (`python -m transformer translate --pair de-en "..."`), and a mistake:

# %%
from transformer.cli.main import main

assert main(["--help"]) == 0
assert (
    main(["translate", "--pair", "de-en", "Zwei Hunde spielen im Schnee."])
    == 0
)
assert main(["translate", "--pair", "xx-en", "Hallo."]) == 2

# %% [markdown]
# ## Summary
#
# - `transformer/cli/` is the only package that parses arguments, one module per command; the
#   library below it takes Python values and raises exceptions.
# - Every command fails the same way: one line on standard error and status 2.
# - `prepare`, `train`, `translate` and `evaluate` follow the data from text to scores; each
#   command's `--help` lists its options, and answers without loading torch.
# - On a terminal, `translate` answers line by line; `TRANSFORMER_HOME` says where the data and
#   the models are when the package is not run from its clone.
