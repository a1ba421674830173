# Every target bootstraps .venv on a fresh machine; re-installs when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: demo test test-all lint bench proto clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fedcore needs Python >= 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,examples,plots,ray]'
	@touch $@

demo: $(STAMP)  ## 100 simulated nodes learn to read digits: 30 rounds, 10 nodes per round; results/ keeps the record and its picture
	$(BIN)/fedcore simulate examples/quickstart-numpy --nodes 100 --seed 0

test: lint  ## lint, type-check and the test suite (what CI runs)
	$(BIN)/python -m pytest -m "not slow" -q

test-all: lint  ## everything, soaks and large scales included
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check fedcore tests benchmarks examples
	$(BIN)/ruff format --check fedcore tests benchmarks examples
	$(BIN)/mypy

bench: $(STAMP)  ## the workloads of docs/benchmarks.md; figures to benchmarks/results.json
	$(BIN)/python -m benchmarks

proto: $(STAMP)  ## regenerate fedcore/wire/_pb from protos/ (commit the result; a test checks it)
	$(BIN)/python -m fedcore.wire.protogen

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
