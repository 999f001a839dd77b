# Generated from chapters/a10_cli.ipynb: edit it, not this file.
"""`python -m transformer translate`: sentences from the arguments, a pipe or a
terminal, one translation per line."""

# %% auto #0
__all__ = [
    "ERRORS",
    "TRANSLATE_EPILOG",
    "read_lines",
    "answer_lines",
    "load_translator",
    "translate_parser",
    "translate_command",
]

# %% ../../chapters/a10_cli.ipynb #100c706b

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


# %% ../../chapters/a10_cli.ipynb #f77a0938
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


# %% ../../chapters/a10_cli.ipynb #37ce2b89
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


# %% ../../chapters/a10_cli.ipynb #18bb8ca9
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
