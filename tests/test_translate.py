"""`translate` and `load_pair_model`, and `python -m transformer translate`: arguments and
standard input, the order of the output, empty, overlong and unknown input, beam 1 against
greedy decoding, and the errors for bad options and for missing, corrupt or mismatched model
folders. The command's tests go through the package's `main`, as a shell does."""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import GERMAN, MAX_LEN, ship, tiny_tokenizer

import transformer.encoded_cache as encoded_cache
import transformer.multi30k as multi30k
import transformer.paths as paths
import transformer.tokenizer as tokenizer_module
import transformer.translation as translation
from transformer.__main__ import main as package_main
from transformer.batched_search import batched_beam_search, batched_greedy_decode
from transformer.checkpoint import CheckpointError, load_model
from transformer.decode_options import DecodeOptions
from transformer.multi30k import PAIRS, DataError
from transformer.paper_search import ALPHA, BEAM_SIZE
from transformer.tokenizer import MARK, normalize, train_bpe
from transformer.translation import load_pair_model, translate

pytestmark = pytest.mark.usefixtures("one_thread")


def run(
    argv: list[str], capsys, monkeypatch, stdin: str | io.IOBase | None = None
) -> tuple[int, str, str]:
    """`python -m transformer translate ARGV` with `stdin` as standard input:
    (status, stdout, stderr)."""
    if stdin is not None:
        stream = io.StringIO(stdin) if isinstance(stdin, str) else stdin
        monkeypatch.setattr(sys, "stdin", stream)
    capsys.readouterr()  # drop what came before
    status = package_main(["translate", *argv])
    out, err = capsys.readouterr()
    return status, out, err


def translate_args(shipped: Path, *more: str) -> list[str]:
    return ["--pair", "de-en", "--checkpoint", str(shipped), "--device", "cpu", *more]


def default_checkpoints(monkeypatch, folder: Path) -> None:
    """Point the default model folder, CHECKPOINTS_DIR, at `folder`, wherever a module
    holds it."""
    for module in (translation,):
        if hasattr(module, "CHECKPOINTS_DIR"):
            monkeypatch.setattr(module, "CHECKPOINTS_DIR", folder)


# -- what it translates, and in which order ---------------------------------------------------


def test_arguments_and_stdin_give_the_same_lines(shipped, capsys, monkeypatch):
    status, by_args, err = run(translate_args(shipped, *GERMAN), capsys, monkeypatch)
    assert status == 0
    lines = by_args.split("\n")
    assert len(lines) == len(GERMAN) + 1 and lines[-1] == ""  # one line each
    stdin = "".join(f"{s}\n" for s in GERMAN)
    status, by_stdin, _ = run(translate_args(shipped), capsys, monkeypatch, stdin)
    assert status == 0 and by_stdin == by_args
    # The last line may lack its newline; options may follow the sentences.
    args = ["--pair", "de-en", *GERMAN, "--checkpoint", str(shipped), "--device", "cpu"]
    assert run(args, capsys, monkeypatch)[1] == by_args
    assert run(translate_args(shipped), capsys, monkeypatch, stdin[:-1])[1] == by_args
    # After "--", an argument that looks like an option is a sentence.
    dashed = run(translate_args(shipped, "--", "--beam", "-Hallo"), capsys, monkeypatch)
    assert dashed[0] == 0 and len(dashed[1].splitlines()) == 2


def test_the_output_keeps_the_input_order(shipped, loaded, capsys, monkeypatch):
    # Batches of 2 out of 6 sentences of different lengths: sorted, decoded, put back.
    _, together, _ = run(
        translate_args(shipped, "--batch-size", "2", *GERMAN), capsys, monkeypatch
    )
    one_by_one = [
        run(translate_args(shipped, sentence), capsys, monkeypatch)[1]
        for sentence in GERMAN
    ]
    assert together == "".join(one_by_one)
    # Outputs that differ, so that putting one back in the wrong place shows (the tiny model
    # gives two sentences the same output: a swap of those two would change nothing).
    assert len(set(together.splitlines())) >= len(GERMAN) - 1
    _, backwards, _ = run(
        translate_args(shipped, "--batch-size", "2", *GERMAN[::-1]), capsys, monkeypatch
    )
    assert backwards.splitlines() == together.splitlines()[::-1]
    # The same as the decoding functions' output for each sentence, with <eos> appended.
    model, tokenizer = loaded
    expected = []
    for sentence in GERMAN:
        src = torch.tensor([tokenizer.encode(sentence) + [tokenizer.eos_id]])
        [best] = batched_beam_search(
            model,
            src,
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
        )
        expected.append(tokenizer.decode(best.tokens))
    assert together.splitlines() == expected


def test_empty_lines_give_empty_lines(shipped, capsys, monkeypatch):
    stdin = f"{GERMAN[0]}\n\n   \t\n{GERMAN[1]}\n\n"
    status, out, _ = run(translate_args(shipped), capsys, monkeypatch, stdin)
    _, alone, _ = run(
        translate_args(shipped, GERMAN[0], GERMAN[1]), capsys, monkeypatch
    )
    first, second = alone.splitlines()
    assert status == 0 and out == f"{first}\n\n\n{second}\n\n"
    # Only empty lines: no model call, no spaCy needed; nothing in, nothing out.
    assert run(translate_args(shipped), capsys, monkeypatch, "\n \n")[1] == "\n\n"
    assert run(translate_args(shipped), capsys, monkeypatch, "")[:2] == (0, "")


def test_crlf_and_undecodable_bytes(shipped, capsys, monkeypatch):
    # The command drops the \r of each line and turns the undecodable byte into U+FFFD.
    raw = f"{GERMAN[0]}\r\n".encode() + b"Ein \xff Hund.\r\n"
    lines = [GERMAN[0], "Ein \ufffd Hund."]
    stdin = io.TextIOWrapper(io.BytesIO(raw), encoding="utf-8")
    status, out, _ = run(translate_args(shipped), capsys, monkeypatch, stdin)
    _, alone, _ = run(translate_args(shipped, *lines), capsys, monkeypatch)
    assert status == 0 and out == alone and len(out.splitlines()) == 2


def test_unknown_characters_do_not_crash(shipped, loaded, capsys, monkeypatch):
    _, tokenizer = loaded
    strange = ["Ein 🐕 läuft über 草地.", "🙂🙂🙂", "Ωμέγα ▁ \u2028 x", "ß\u0301"]
    for sentence in strange[:2]:
        assert tokenizer.unk_id in tokenizer.encode(sentence)
    status, out, err = run(translate_args(shipped, *strange), capsys, monkeypatch)
    assert status == 0 and len(out.split("\n")) == len(strange) + 1
    assert "Traceback" not in err


def test_a_prefix_starts_every_translation(shipped, loaded, capsys, monkeypatch):
    """`translate --prefix TEXT`: the forced prefix of the batched search, TEXT cut into
    target tokens as a sentence would be."""
    model, tokenizer = loaded
    status, out, _ = run(
        translate_args(shipped, "--prefix", "Two cats", *GERMAN[:2]),
        capsys,
        monkeypatch,
    )
    assert status == 0
    lines = out.splitlines()
    assert all(line.startswith("Two cats") for line in lines)
    assert lines == translate(model, tokenizer, GERMAN[:2], prefix="Two cats")
    forced = tokenizer.encode("Two cats", "en")
    src = torch.tensor([tokenizer.encode(GERMAN[0]) + [tokenizer.eos_id]])
    special = dict(
        bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id
    )
    [best] = batched_beam_search(model, src, prefix=torch.tensor([forced]), **special)
    assert best.tokens[: len(forced)] == forced
    assert lines[0] == tokenizer.decode(best.tokens)
    status, _, err = run(
        translate_args(shipped, "--prefix", "Two", "--engine", "ctranslate2", "x"),
        capsys,
        monkeypatch,
    )
    assert status == 2 and "--prefix needs the package's engine" in err


def test_beam_1_is_greedy_decoding(shipped, loaded, capsys, monkeypatch):
    model, tokenizer = loaded
    sources = [tokenizer.encode(s) + [tokenizer.eos_id] for s in GERMAN]
    expected = []
    for ids in sources:
        [h] = batched_greedy_decode(
            model,
            torch.tensor([ids]),
            bos_id=tokenizer.bos_id,
            eos_id=tokenizer.eos_id,
            pad_id=tokenizer.pad_id,
        )
        expected.append(tokenizer.decode(h.tokens))
    status, out, _ = run(
        translate_args(shipped, "--beam", "1", *GERMAN), capsys, monkeypatch
    )
    assert status == 0 and out.splitlines() == expected
    # ... and the default is the package's default search.
    default = run(translate_args(shipped, *GERMAN), capsys, monkeypatch)[1]
    assert default.splitlines() == translate(model, tokenizer, GERMAN)
    defaults = ["--beam", str(BEAM_SIZE), "--alpha", str(ALPHA)]
    explicit = run(translate_args(shipped, *defaults, *GERMAN), capsys, monkeypatch)[1]
    assert default == explicit


def test_alpha_reaches_the_search(shipped, loaded, capsys, monkeypatch):
    model, tokenizer = loaded
    # For the tiny model the length penalty changes some translations: α = 2 is no default.
    longer = translate(model, tokenizer, GERMAN, alpha=2.0)
    assert longer != translate(model, tokenizer, GERMAN)
    status, out, _ = run(
        translate_args(shipped, "--alpha", "2", *GERMAN), capsys, monkeypatch
    )
    assert status == 0 and out.splitlines() == longer


def test_an_overlong_sentence_is_cut_with_a_warning(
    shipped, loaded, capsys, monkeypatch
):
    model, tokenizer = loaded
    long = " ".join(GERMAN)  # far more than MAX_LEN tokens
    ids = tokenizer.encode(long)
    assert len(ids) + 1 > MAX_LEN
    status, out, err = run(
        translate_args(shipped, GERMAN[0], long, GERMAN[1]), capsys, monkeypatch
    )
    assert status == 0 and len(out.splitlines()) == 3
    [warning] = [line for line in err.splitlines() if "positions" in line]
    assert warning == (
        f"python -m transformer translate: warning: sentence 2: {len(ids) + 1} tokens "
        f"with <eos>, more than the model's {MAX_LEN} positions: translating the first "
        f"{MAX_LEN - 1}"
    )
    # The translation is that of its first MAX_LEN - 1 tokens and <eos>.
    src = torch.tensor([ids[: MAX_LEN - 1] + [tokenizer.eos_id]])
    [best] = batched_beam_search(
        model,
        src,
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
    )
    assert out.splitlines()[1] == tokenizer.decode(best.tokens)
    # Documented in --help.
    _, help_text, _ = run(["--help"], capsys, monkeypatch)
    assert "max_len - 1 tokens are translated" in " ".join(help_text.split())


def test_translate_reports_translations_cut_by_the_length_limit(loaded):
    model, tokenizer = loaded
    sentences = ["", *GERMAN[:4]]
    warnings: list[str] = []
    results = translate(model, tokenizer, sentences, beam_size=1, warn=warnings.append)
    assert results[0] == "" and len(results) == len(sentences)
    found = batched_greedy_decode(
        model,
        torch.nn.utils.rnn.pad_sequence(
            [
                torch.tensor(tokenizer.encode(s) + [tokenizer.eos_id])
                for s in GERMAN[:4]
            ],
            batch_first=True,
            padding_value=tokenizer.pad_id,
        ),
        bos_id=tokenizer.bos_id,
        eos_id=tokenizer.eos_id,
        pad_id=tokenizer.pad_id,
    )
    cut = [str(i + 2) for i, h in enumerate(found) if not h.ended]
    assert len(cut) >= 2  # a random model rarely outputs <eos>
    listed = f"{', '.join(cut[:-1])} and {cut[-1]}"
    assert warnings == [
        f"sentences {listed}: the translation stopped at the length limit, before <eos>"
    ]
    with pytest.raises(TypeError, match="not one string"):
        translate(model, tokenizer, "Ein Hund.")


# -- load_pair_model -------------------------------------------------------------------------


def test_load_pair_model_loads_a_model_of_the_pair(
    shipped, loaded, tmp_path, monkeypatch
):
    model, tokenizer = load_pair_model("de-en", shipped)
    expected, _ = loaded
    assert tokenizer.pair == "de-en" and not model.training
    assert model.state_dict().keys() == expected.state_dict().keys()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected.state_dict()[name]), name
    # By default, the shipped model CHECKPOINTS_DIR / pair.
    shutil.copytree(shipped, tmp_path / "de-en")
    monkeypatch.setattr(translation, "CHECKPOINTS_DIR", tmp_path)
    _, by_default = load_pair_model("de-en")
    assert by_default.pair == "de-en"


def test_load_pair_model_names_what_is_wrong_in_one_line(
    shipped, tmp_path, monkeypatch
):
    with pytest.raises(DataError, match="unknown language pair 'en-de'"):
        load_pair_model("en-de", shipped)
    nowhere = tmp_path / "nowhere"
    with pytest.raises(
        CheckpointError, match=f"^no model folder {re.escape(str(nowhere))}$"
    ):
        load_pair_model("de-en", nowhere)
    monkeypatch.setattr(translation, "CHECKPOINTS_DIR", tmp_path)
    with pytest.raises(
        CheckpointError,
        match="set TRANSFORMER_HOME to the folder that holds checkpoints/fr-en",
    ) as err:
        load_pair_model("fr-en")
    assert "python -m transformer train --pair fr-en" in str(err.value)
    with pytest.raises(CheckpointError, match="holds a de-en model, not a fr-en one"):
        load_pair_model("fr-en", shipped)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="^cannot load the model: ") as err:
        load_pair_model("de-en", empty)
    assert str(empty) in str(err.value) and "\n" not in str(err.value)


# -- errors --------------------------------------------------------------------------------------


def assert_error(status: int, err: str, *needles: str) -> None:
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("python -m transformer translate: error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


def test_a_missing_folder_is_named(tmp_path, capsys, monkeypatch):
    nowhere = tmp_path / "nowhere"
    status, out, err = run(translate_args(nowhere, "Ein Hund."), capsys, monkeypatch)
    assert out == ""
    assert_error(status, err, f"no model folder {nowhere}")


def test_no_shipped_model_says_how_to_train_one(tmp_path, capsys, monkeypatch):
    default_checkpoints(monkeypatch, tmp_path / "checkpoints")
    status, _, err = run(["--pair", "fr-en", "Un chien."], capsys, monkeypatch)
    assert_error(
        status,
        err,
        str(tmp_path / "checkpoints" / "fr-en"),
        "python -m transformer train --pair fr-en",
    )


def test_the_default_folder_is_checkpoints_pair_in_the_repository(
    shipped, tmp_path, capsys, monkeypatch
):
    assert translation.CHECKPOINTS_DIR == paths.DATA_DIR.parents[1] / "checkpoints"
    shutil.copytree(shipped, tmp_path / "checkpoints" / "de-en")
    default_checkpoints(monkeypatch, tmp_path / "checkpoints")
    by_default = run(
        ["--pair", "de-en", "--device", "cpu", *GERMAN[:2]], capsys, monkeypatch
    )
    assert by_default == run(translate_args(shipped, *GERMAN[:2]), capsys, monkeypatch)


def broken_copy(shipped: Path, tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(shipped, folder)
    return folder


@pytest.mark.parametrize(
    "damage",
    ["config", "vocabulary", "corrupt weights", "missing weights", "not json", "empty"],
)
def test_an_unusable_folder_is_named(shipped, tmp_path, capsys, monkeypatch, damage):
    folder = broken_copy(shipped, tmp_path, "broken")
    weights = sorted(folder.glob("model-*.safetensors"))
    if damage == "config":  # weights of another shape than the config says
        record = json.loads((folder / "config.json").read_text())
        record["model"]["d_model"] = 32
        record["model"]["d_ff"] = 64
        (folder / "config.json").write_text(json.dumps(record))
    elif damage == "vocabulary":  # another tokenizer than the model was trained with
        tiny_tokenizer(GERMAN[:3]).save(folder / "tokenizer.json")
    elif damage == "corrupt weights":
        weights[0].write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not a header")
    elif damage == "missing weights":
        weights[0].unlink()
    elif damage == "not json":
        (folder / "config.json").write_text("{")
    else:
        for path in folder.iterdir():
            path.unlink()
    status, out, err = run(translate_args(folder, "Ein Hund."), capsys, monkeypatch)
    assert out == ""
    assert_error(status, err, "cannot load the model", str(folder))


def test_a_model_of_the_other_pair(tmp_path, capsys, monkeypatch):
    words = [(MARK + "Un", MARK + "chien", MARK + "court", ".")]
    french = ship(tmp_path / "fr-en", train_bpe(words, 30, languages=("fr", "en")))
    status, _, err = run(translate_args(french, "Ein Hund."), capsys, monkeypatch)
    assert_error(status, err, f"{french} holds a fr-en model, not a de-en one")


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--pair", "en-de", "Ein Hund."], "unknown language pair 'en-de'"),
        (["Ein Hund."], "--pair"),
        (["--pair", "de-en", "--beam", "0"], "--beam must be at least 1"),
        (["--pair", "de-en", "--beam", "four"], "--beam"),
        (["--pair", "de-en", "--alpha", "-1"], "--alpha must be >= 0 and at most 10"),
        (["--pair", "de-en", "--alpha", "inf"], "at most 10, got inf"),
        (["--pair", "de-en", "--alpha", "1e308"], "at most 10, got 1e+308"),
        (["--pair", "de-en", "--alpha", "nan"], "at most 10, got nan"),
        (["--pair", "de-en", "--alpha", "10.5"], "at most 10, got 10.5"),
        (["--pair", "de-en", "--batch-size", "0"], "--batch-size must be at least 1"),
        (["--pair", "de-en", "--device", "tpu"], "--device"),
        (["--pair", "de-en", "--no-such-option"], "--no-such-option"),
    ],
)
def test_bad_options(argv, needle, capsys, monkeypatch):
    status, out, err = run(argv, capsys, monkeypatch)
    assert out == ""
    assert_error(status, err, needle)


def test_a_non_finite_alpha_is_an_error_before_any_translation(
    shipped, loaded, capsys, monkeypatch
):
    for alpha in ("inf", "1e308"):
        argv = translate_args(shipped, "--alpha", alpha, "Hallo")
        status, out, err = run(argv, capsys, monkeypatch)
        assert out == ""
        got = f"got {float(alpha)}"  # inf, 1e+308
        assert_error(status, err, f"--alpha must be >= 0 and at most 10, {got}")
    with pytest.raises(ValueError, match="alpha must be >= 0 and at most 10"):
        translate(*loaded, ["Hallo"], alpha=float("inf"))
    # The bound itself is allowed.
    status, out, _ = run(
        translate_args(shipped, "--alpha", "10", "Hallo"), capsys, monkeypatch
    )
    assert status == 0 and len(out.splitlines()) == 1


def test_an_alpha_whose_penalty_overflows_within_the_models_positions_is_one_line(
    tmp_path, capsys, monkeypatch
):
    # ((5 + 50,000) / 6) ** 10 is beyond float32: one line, not a traceback.
    long = ship(tmp_path / "de-en", tiny_tokenizer(), max_len=50_000)
    status, out, err = run(
        translate_args(long, "--alpha", "10", "Hallo"), capsys, monkeypatch
    )
    assert out == ""
    assert_error(
        status,
        err,
        "--alpha 10.0 makes the length penalty overflow at the model's 50000 positions",
    )
    status, out, _ = run(
        translate_args(long, "--alpha", "1", "Hallo"), capsys, monkeypatch
    )
    assert status == 0 and len(out.splitlines()) == 1


def test_a_sentence_that_names_a_file_is_translated_with_a_warning(
    shipped, tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    name = "sätze.txt"
    status, as_sentence, quiet = run(translate_args(shipped, name), capsys, monkeypatch)
    assert status == 0 and "names a file" not in quiet
    (tmp_path / name).write_text("".join(f"{s}\n" for s in GERMAN))
    status, out, err = run(translate_args(shipped, name), capsys, monkeypatch)
    # Still the translation of the sentence "sätze.txt", not of the file's lines ...
    assert status == 0 and out == as_sentence
    # ... with one more line on standard error, which suggests standard input.
    assert err.splitlines() == [
        "python -m transformer translate: warning: SENTENCE 'sätze.txt' names a file, "
        "translated here as a sentence: to translate the file's lines, give it as "
        "standard input, < 'sätze.txt'",
        *quiet.splitlines(),
    ]
    # A path to a file elsewhere is named the same way; a folder, a sentence, and a
    # sentence too long to be a file name are not.
    path = str(tmp_path / name)
    _, _, err = run(translate_args(shipped, path), capsys, monkeypatch)
    assert f"SENTENCE {path!r} names a file" in err and f"< {shlex.quote(path)}" in err
    too_long = " ".join(["Hund"] * 100)  # 499 bytes: too long for a file name
    sentences = [str(tmp_path), GERMAN[0], too_long]
    status, out, err = run(translate_args(shipped, *sentences), capsys, monkeypatch)
    assert status == 0 and len(out.splitlines()) == 3 and "names a file" not in err


def test_without_spacy_a_clear_error(shipped, capsys, monkeypatch):
    def no_spacy(language: str):
        raise ImportError(
            "tokenising text needs spaCy: pip install 'transformer[data]' (...)"
        )

    monkeypatch.setattr(tokenizer_module, "spacy_tokenizer", no_spacy)
    status, _, err = run(translate_args(shipped, "Ein Neuwort."), capsys, monkeypatch)
    assert_error(status, err, "needs spaCy")


def test_help_from_the_package_command():
    done = subprocess.run(
        [sys.executable, "-m", "transformer", "translate", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    text = " ".join(done.stdout.split())
    assert text.startswith("usage: python -m transformer translate")
    for documented in (
        "--pair",
        "--beam N",
        f"1 is greedy decoding (default: {BEAM_SIZE}",
        "--alpha A",
        f"from 0 to 10 (default: {ALPHA:g}",
        "A SENTENCE that names an existing file is translated as a sentence all the same",
        "--checkpoint DIR",
        "checkpoints/<pair>",
        "--device {cpu,cuda}",
        "--batch-size N",
        "An empty line gives an empty line",
        "become <unk>",
        "its first max_len - 1 tokens are translated",
        "exit with status 2",
    ):
        assert documented in text, documented


def test_an_unknown_command_is_one_line_in_the_commands_format(capsys):
    capsys.readouterr()
    status = package_main(["bogus", "--pair", "de-en"])
    out, err = capsys.readouterr()
    assert status == 2 and out == ""
    assert err == (
        "python -m transformer: error: unknown command 'bogus': choose one of "
        "prepare, train, translate, evaluate, ctranslate2\n"
    )


class InterruptedInput(io.StringIO):
    """Standard input on which the user presses Ctrl-C."""

    def read(self, *args):
        raise KeyboardInterrupt


def test_ctrl_c_is_one_line_with_status_130(shipped, capsys, monkeypatch):
    status, out, err = run(
        translate_args(shipped), capsys, monkeypatch, InterruptedInput()
    )
    assert status == 130
    assert out == "" and err == "python -m transformer translate: interrupted\n"


def test_a_closed_output_pipe_is_not_a_traceback(shipped):
    # `python -m transformer translate ... | head -0`: the reader is gone before the output
    # is written
    process = subprocess.Popen(
        [sys.executable, "-m", "transformer", "translate"]
        + translate_args(shipped, "Ein Hund läuft.", "Zwei Kinder spielen."),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    # (the tiny random model's warning about the length limit may come first)
    assert "Traceback" not in err and "BrokenPipeError" not in err


def test_no_command_is_an_error_on_stderr_and_help_is_not(capsys):
    capsys.readouterr()
    assert package_main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: python -m transformer COMMAND")
    assert package_main(["--help"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and out.startswith("usage: python -m transformer COMMAND")
    assert all(name in out for name in ("prepare", "train", "translate", "evaluate"))


# -- the same translations on a GPU -----------------------------------------------------------

SHIPPED = Path(__file__).resolve().parents[1] / "checkpoints"


def val_sources(pair: str, tokenizer, n: int = 100) -> list[list[int]]:
    """The first n sources of the validation split as ids with their <eos>: from the
    encoded cache when there is one made with the shipped vocabulary (a GPU machine has
    no spaCy), else tokenised here."""
    cache = SHIPPED.parent / "cache"
    ours = (SHIPPED / pair / "tokenizer.json").read_bytes()
    if (cache / pair / "tokenizer.json").is_file():
        if (cache / pair / "tokenizer.json").read_bytes() == ours:
            split = encoded_cache.load_encoded(pair, "val", cache)
            return [
                [int(t) for t in split[i][0]] + [tokenizer.eos_id] for i in range(n)
            ]
    if importlib.util.find_spec("spacy") is None:
        pytest.skip("needs spaCy or the encoded cache (python -m transformer prepare)")
    sources = [source for source, _ in multi30k.load_pairs("val", pair)][:n]
    encoded = tokenizer.encode_batch([normalize(source) for source in sources])
    return [ids + [tokenizer.eos_id] for ids in encoded]


def decoded(model, tokenizer, sources: list[list[int]], beam_size: int) -> list:
    """The output ids of each source, in batches of 25, on the model's device."""
    device, found = next(model.parameters()).device, []
    special = dict(
        bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id
    )
    for start in range(0, len(sources), 25):
        chunk = sources[start : start + 25]
        src = torch.full((len(chunk), max(map(len, chunk))), tokenizer.pad_id)
        for row, ids in enumerate(chunk):
            src[row, : len(ids)] = torch.tensor(ids)
        src = src.to(device)
        if beam_size == 1:
            found += batched_greedy_decode(model, src, **special)
        else:
            found += batched_beam_search(
                model, src, DecodeOptions(beam_size=beam_size), **special
            )
    return [h.tokens for h in found]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("beam_size", [1, 4])
def test_a_shipped_model_translates_alike_on_cuda_and_on_the_cpu(pair, beam_size):
    """Float32 on both devices (no TF32): their kernels round differently in the last bits,
    which may flip a near-tie between two words in a rare sentence of 100, not more."""
    model, tokenizer = load_model(SHIPPED / pair)
    sources = val_sources(pair, tokenizer)
    on_cpu = decoded(model, tokenizer, sources, beam_size)
    model, _ = load_model(SHIPPED / pair, device="cuda")
    assert next(model.parameters()).is_cuda
    assert not torch.backends.cuda.matmul.allow_tf32
    on_gpu = decoded(model, tokenizer, sources, beam_size)
    differ = [i for i, (a, b) in enumerate(zip(on_cpu, on_gpu, strict=True)) if a != b]
    assert len(differ) <= 3, [
        (tokenizer.decode(on_cpu[i]), tokenizer.decode(on_gpu[i])) for i in differ
    ]
    assert sum(map(len, on_gpu)) > 10 * len(sources)  # real sentences, not empty lines
