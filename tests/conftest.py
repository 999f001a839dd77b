"""Fixtures shared by the test files."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from browser import CHROMIUM, ROOT
from helpers import ship, tiny_tokenizer


@pytest.fixture(scope="session")
def book(tmp_path_factory) -> Path:
    """The book, built once per test session into a scratch folder: its
    `_build/html`. Skips (fails on CI) without Chromium to read it."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail(
                "Chromium is missing: .ci/run installs Debian's chromium package"
            )
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    out = tmp_path_factory.mktemp("book")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    build = subprocess.run(
        [
            str(jupyter_book),
            "build",
            "--warningiserror",
            "--path-output",
            str(out),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, (
        f"jupyter-book build failed:\n{build.stdout[-3000:]}{build.stderr[-3000:]}"
    )
    return out / "_build" / "html"


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: models this small decode faster on
    one, and much faster on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shipped(tmp_path_factory) -> Path:
    """A tiny untrained de-en model folder, as the package ships one."""
    return ship(tmp_path_factory.mktemp("models") / "de-en", tiny_tokenizer())


@pytest.fixture(scope="module")
def loaded(shipped):
    """(model, tokenizer) of `shipped`."""
    from transformer.checkpoint import load_model

    return load_model(shipped)
