# Generated from chapters/a04_batches_and_cache.ipynb: edit it, not this file.
"""The encoded cache: every split of a pair as token ids on disk, written by
`prepare` and read by `load_encoded` without spaCy."""

# %% auto #0
__all__ = [
    "CACHE_FORMAT",
    "train_tokenizer",
    "cache_problems",
    "prepare",
    "load_encoded",
]

# %% ../chapters/a04_batches_and_cache.ipynb #19a986d4

import hashlib
import json
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from transformer.atomic import atomic_write
from transformer.checked_data import expected_checksums, load_pairs
from transformer.encoded_split import EncodedSplit
from transformer.multi30k import SPLITS, DataError, check_split, parse_pair
from transformer.paths import CACHE_DIR, DATA_DIR
from transformer.tokenizer import VOCAB_SIZE, Tokenizer, train_bpe
from transformer.vocabulary import TokenizerError
from transformer.words import fast_pretokenize, with_fast_words

from . import layout

CACHE_FORMAT = "transformer-book encoded multi30k 2"


def train_tokenizer(
    pairs: Sequence[tuple[str, str]],
    vocab_size: int = VOCAB_SIZE,
    *,
    languages: tuple[str, str],
) -> Tokenizer:
    """The joint BPE tokenizer of a language pair, learned from both sides of
    its (source, target) sentence pairs: give it the training split, and
    validation and test text never reach the vocabulary."""
    src_lang, tgt_lang = languages
    sentences = fast_pretokenize(
        [s for s, _ in pairs], src_lang
    ) + fast_pretokenize([t for _, t in pairs], tgt_lang)
    tokenizer = train_bpe(sentences, vocab_size, languages=languages)
    return with_fast_words(tokenizer)


def _data_files(pair: str) -> list[str]:
    return [
        f"{split}.{lang}.gz" for split in SPLITS for lang in parse_pair(pair)
    ]


def cache_problems(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int | None = None,
    data_dir: Path = DATA_DIR,
) -> list[str]:
    """What makes the cache of a pair unusable, [] if it is complete and
    current; with vocab_size, a cache built with another vocabulary size is
    stale too."""
    return _read_cache(
        pair, cache_dir, vocab_size=vocab_size, data_dir=data_dir
    )[0]


# %% ../chapters/a04_batches_and_cache.ipynb #95075ffc
def _read_cache(
    pair: str,
    cache_dir: Path,
    *,
    data_dir: Path,
    vocab_size: int | None = None,
) -> tuple[list[str], dict[str, bytes]]:
    """(cache_problems, the content of each file whose checksum matched). The
    files are read once: what is checked is what the caller uses, even if a
    rebuild replaces them."""
    parse_pair(pair)
    folder = Path(cache_dir) / pair
    try:
        manifest = json.loads(
            (folder / "manifest.json").read_text(encoding="utf-8")
        )
    except FileNotFoundError:
        return [
            "no manifest.json: never built, or its build did not finish"
        ], {}
    except (OSError, ValueError) as err:
        return [f"manifest.json is unreadable: {err}"], {}
    if (
        not isinstance(manifest, dict)
        or manifest.get("format") != CACHE_FORMAT
    ):
        return [f"manifest.json is not a {CACHE_FORMAT!r} manifest"], {}
    problems, built_for, built_size = (
        [],
        manifest.get("pair"),
        manifest.get("vocab_size"),
    )
    if built_for != pair:
        problems.append(f"manifest.json describes {built_for!r}, not {pair!r}")
    if vocab_size is not None and built_size != vocab_size:
        problems.append(
            f"built with vocab_size={built_size}, asked for {vocab_size}"
        )
    try:
        checksums = expected_checksums(data_dir)
    except DataError as err:
        problems.append(str(err))
    else:
        recorded = manifest.get("data")
        if not isinstance(recorded, dict):
            problems.append(
                "manifest.json holds no table of data checksums (field data)"
            )
        else:
            for name in _data_files(pair):
                if recorded.get(name) != checksums.get(name):
                    problems.append(
                        f"{name} has changed since the cache was built"
                    )
    try:
        files = {layout.TOKENIZER: manifest["tokenizer_sha256"]}
        splits = manifest["splits"]
        if set(splits) != set(SPLITS):
            problems.append(f"manifest.json lists the splits {sorted(splits)}")
        files |= {entry["file"]: entry["sha256"] for entry in splits.values()}
    except (KeyError, TypeError, AttributeError) as err:
        return [*problems, f"manifest.json is malformed ({err!r})"], {}
    contents = {}
    for name, digest in files.items():
        try:
            blob = (folder / name).read_bytes()
        except FileNotFoundError:
            problems.append(f"{name} is missing")
            continue
        except OSError as err:
            problems.append(f"{name} is unreadable: {err}")
            continue
        if hashlib.sha256(blob).hexdigest() != digest:
            problems.append(
                f"{name} is corrupt: its SHA-256 differs from manifest.json"
            )
        else:
            contents[name] = blob
    return problems, contents


# %% ../chapters/a04_batches_and_cache.ipynb #03365d04
def _build_cache(
    pair: str, folder: Path, *, vocab_size: int, data_dir: Path
) -> None:
    src_lang, tgt_lang = parse_pair(pair)
    # Everything that can fail for want of data or of spaCy (training the
    # tokenizer needs it) fails before the old cache is touched: a wrong
    # --data-dir must not cost a good cache.
    texts = {split: load_pairs(split, pair, data_dir) for split in SPLITS}
    checksums = expected_checksums(data_dir)
    tokenizer = train_tokenizer(
        texts["train"], vocab_size, languages=(src_lang, tgt_lang)
    )
    folder.mkdir(parents=True, exist_ok=True)
    # No valid cache until the build ends.
    (folder / "manifest.json").unlink(missing_ok=True)
    tokenizer.save(folder / layout.TOKENIZER)
    tokenizer_json = (folder / layout.TOKENIZER).read_bytes()  # as written
    splits = {}
    for split, pairs in texts.items():
        data = EncodedSplit.from_words(
            tokenizer,
            fast_pretokenize([s for s, _ in pairs], src_lang),
            fast_pretokenize([t for _, t in pairs], tgt_lang),
        )
        blob = data.to_bytes()
        atomic_write(folder / f"{split}.safetensors", blob)
        splits[split] = {
            "file": f"{split}.safetensors",
            "sha256": hashlib.sha256(blob).hexdigest(),
            "sentences": len(data),
            "src_tokens": len(data.src_ids),
            "tgt_tokens": len(data.tgt_ids),
        }
    manifest = {
        "format": CACHE_FORMAT,
        "pair": pair,
        "vocab_size": vocab_size,
        "data": {name: checksums[name] for name in _data_files(pair)},
        "tokenizer_sha256": hashlib.sha256(tokenizer_json).hexdigest(),
        "splits": splits,
        "built_with": {
            name: metadata.version(name) for name in ("spacy", "tokenizers")
        },
    }
    atomic_write(
        folder / "manifest.json",
        (json.dumps(manifest, indent=2) + "\n").encode(),
    )


# %% ../chapters/a04_batches_and_cache.ipynb #fd251bdd
def prepare(
    pair: str,
    cache_dir: Path = CACHE_DIR,
    *,
    vocab_size: int = VOCAB_SIZE,
    data_dir: Path = DATA_DIR,
    rebuild: bool = False,
) -> Tokenizer:
    """The tokenizer of a pair, with every split encoded in cache_dir/pair: a
    complete, current cache is loaded and needs no spaCy; a missing, stale or
    corrupt one (see cache_problems) is rebuilt from the text, as is any cache
    with rebuild=True."""
    folder = Path(cache_dir) / pair
    options = dict(vocab_size=vocab_size, data_dir=data_dir)
    problems, contents = [], {}
    if not rebuild:  # a rebuild need not read and hash the old files first
        problems, contents = _read_cache(pair, cache_dir, **options)
    if rebuild or problems:
        _build_cache(pair, folder, **options)
        problems, contents = _read_cache(pair, cache_dir, **options)
        if problems:  # only if something rewrote the files while we built them
            raise DataError(
                f"the cache just built in {folder} is unusable: {problems}"
            )
    # Its checksum matched, but it may be a tokenizer that this version cannot
    # read.
    try:
        tokenizer = Tokenizer.from_json(
            contents[layout.TOKENIZER].decode("utf-8"),
            source=folder / layout.TOKENIZER,
        )
    except TokenizerError as err:
        raise DataError(str(err)) from err
    return with_fast_words(tokenizer)


def load_encoded(
    pair: str,
    split: str,
    cache_dir: Path = CACHE_DIR,
    *,
    data_dir: Path = DATA_DIR,
) -> EncodedSplit:
    """One split of a pair as token ids, from the cache that `prepare` wrote;
    needs no spaCy. A missing, stale or corrupt cache raises DataError: it is
    never used."""
    check_split(split, "load_encoded(pair, split)")
    folder = Path(cache_dir) / pair
    problems, contents = _read_cache(pair, cache_dir, data_dir=data_dir)
    if problems:
        raise DataError(
            f"cannot use the encoded cache {folder}: {'; '.join(problems)}."
            " Rebuild it on a machine with spaCy: `python -m transformer"
            f" prepare --pair {pair}`"
        )
    return EncodedSplit.from_bytes(contents[f"{split}.safetensors"])
