# The book's two set-up commands are `make book` and `make test`; the rest serve authors.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# On a machine without an NVIDIA driver, install torch first so that the project's `torch>=2.5`
# is already satisfied. The default is the CPU build that CI machines hold on disk; from PyPI
# that pin is the CUDA build, so elsewhere pass pip arguments for a CPU build (README.md).
TORCH_CPU ?= torch==2.13.0
# Part I to III are chapters/NN_*, the appendices chapters/aNN_*: sorted, the book's order.
CHAPTERS := intro.ipynb $(sort $(wildcard chapters/[0-9][0-9]_*.ipynb chapters/a[0-9][0-9]_*.ipynb))

.PHONY: help book test test-other-cpu check export sync execute chapter venv clean

help:
	@echo "make book     build the HTML book into _build/html (creates .venv first)"
	@echo "make test     pytest over tests/ and nbval over every chapter"
	@echo "make test-other-cpu  nbval again with other CPU kernels (CI runs it too)"
	@echo "make check    fast static checks: ruff, export in sync, notebooks clean, and"
	@echo "              prettier and eslint over the page translator's JavaScript (npm ci)"
	@echo "make export   regenerate transformer/ from the chapters' #| export cells"
	@echo "make sync     sync each chapter's .ipynb with its py:percent twin (jupytext)"
	@echo "make execute  re-run chapters in place (NB=chapters/01_attention.ipynb for one)"
	@echo "make chapter  after editing one chapter (NB=chapters/14_decoding.py): sync, format,"
	@echo "              export its modules, lint by the twin's lines, check; EXECUTE=1 runs it"

$(BIN)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@if ! command -v nvidia-smi >/dev/null 2>&1; then \
	  echo "no NVIDIA driver found: installing $(TORCH_CPU) first"; \
	  $(BIN)/python -m pip install -q $(TORCH_CPU); fi
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[dev]"
	touch $@

venv: $(BIN)/.installed

# The JavaScript's formatter and linter (package.json), for `make check`; the book and the
# tests need Node itself only.
node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	touch $@

book: $(BIN)/.installed
	$(BIN)/jupyter-book build --warningiserror --keep-going --path-output . .
	@echo "The book is at file://$(CURDIR)/_build/html/index.html"

NBVAL := $(BIN)/python -m pytest -q --nbval --nbval-sanitize-with tests/sanitize.cfg \
  --nbval-current-env -p no:cacheprovider
# Other CPU kernels than the machine's best: ATen without vectorisation, MKL at SSE4.2, oneDNN at
# SSE4.1. Models trained in a chapter take other weights on another CPU, so a stored output or an
# assert that holds for one trajectory only fails here, as it would on another CI machine.
OTHER_CPU := ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 DNNL_MAX_CPU_ISA=SSE41

test: $(BIN)/.installed
	$(BIN)/python -m pytest -q tests experiments/tests
	$(NBVAL) $(CHAPTERS)

test-other-cpu: $(BIN)/.installed
	$(OTHER_CPU) $(NBVAL) $(CHAPTERS)

check: $(BIN)/.installed node_modules/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/nb.py check
	npm run --silent check

export: $(BIN)/.installed
	$(BIN)/python tools/nb.py export

sync: $(BIN)/.installed
	$(BIN)/jupytext --sync intro.ipynb intro.py $(CHAPTERS:intro.ipynb=) $(patsubst %.ipynb,%.py,$(CHAPTERS:intro.ipynb=))

execute: $(BIN)/.installed
	$(BIN)/python tools/nb.py execute $(or $(NB),$(CHAPTERS))

# The edit loop of one chapter, named by its twin or its notebook (tools/nb.py edit).
chapter: $(BIN)/.installed
	$(BIN)/python tools/nb.py edit $(if $(filter-out 0,$(EXECUTE)),--execute) $(NB)

clean:
	rm -rf _build
