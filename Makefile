# Every target bootstraps .venv on a fresh machine; re-installs when pyproject.toml changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# Flower's own environment for `make bench-flower`, apart from fedcore's: the apps it
# runs import the real flwr there (in fedcore's, `import flwr` in an app is fedcore).
FLOWER_VENV  := .venv-flower
FLOWER_STAMP := $(FLOWER_VENV)/.installed-stamp
FLOWER_PINS  := 'flwr[simulation]==1.42.0' scikit-learn
BENCH_ARGS   ?=

.PHONY: demo test test-all lint bench bench-flower proto clean

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

$(FLOWER_STAMP): Makefile
	$(PYTHON) -m venv $(FLOWER_VENV)
	$(FLOWER_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(FLOWER_VENV)/bin/python -m pip install --quiet $(FLOWER_PINS)
	@touch $@

bench-flower: $(STAMP) $(FLOWER_STAMP)  ## W2, W3, W4 as Flower apps: Flower 1.42's simulation (default resources, num_cpus=1) against fedcore process and ray, alternating (BENCH_ARGS="--repeat 2" or "W2 --quick")
	$(BIN)/python -m benchmarks.versus_flower --flower-python $(FLOWER_VENV)/bin/python $(BENCH_ARGS)

proto: $(STAMP)  ## regenerate fedcore/wire/_pb from protos/ (commit the result; a test checks it)
	$(BIN)/python -m fedcore.wire.protogen

clean:
	rm -rf $(VENV) $(FLOWER_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
