# Every target bootstraps .venv on a fresh machine from constraints.txt, the pinned set
# `make lock` writes: `make demo` installs what the demo needs, `make test` the rest.
# A target re-installs when pyproject.toml or constraints.txt changes.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# PIP_CONSTRAINT, not -c alone: pip passes it on to the isolated environment that builds
# fedcore's editable install, so setuptools is pinned there too.
PIP    := PIP_CONSTRAINT=$(CURDIR)/constraints.txt $(BIN)/python -m pip install --quiet
DEMO_STAMP := $(VENV)/.demo-stamp
STAMP      := $(VENV)/.installed-stamp
# The extras make test installs, and so the ones constraints.txt pins.
TEST_EXTRAS := dev,examples,plots,ray
LOCK_VENV   := .venv-lock
# Flower's own environment for `make bench-flower`, apart from fedcore's: the apps it
# runs import the real flwr there (in fedcore's, `import flwr` in an app is fedcore).
FLOWER_VENV  := .venv-flower
FLOWER_STAMP := $(FLOWER_VENV)/.installed-stamp
FLOWER_CONSTRAINTS := benchmarks/flower-constraints.txt
# The Flower release of tests/flower-wheel.txt, whose wheel the names test reads.
FLOWER_RELEASE := $(shell sed -n 's/^flwr==\([^ ]*\) .*/\1/p' tests/flower-wheel.txt)
FLOWER_WHEEL   := $(VENV)/flower-wheel/flwr-$(FLOWER_RELEASE)-py3-none-any.whl
BENCH_ARGS   ?=

.PHONY: demo test test-fast test-all lint lock bench bench-flower proto clean

$(DEMO_STAMP): pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "fedcore needs Python >= 3.11, found " + sys.version.split()[0]'
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e '.[examples,plots]'
	@touch $@

$(STAMP): $(DEMO_STAMP)
	$(PIP) -e '.[$(TEST_EXTRAS)]'
	@touch $@

demo: $(DEMO_STAMP)  ## 100 simulated nodes learn to read digits: 30 rounds, 10 nodes per round; results/ keeps the record and its picture
	$(BIN)/fedcore simulate examples/quickstart-numpy --nodes 100 --seed 0

test: lint $(FLOWER_WHEEL)  ## lint, type-check and the test suite (what CI runs)
	FEDCORE_FLOWER_WHEEL=$(CURDIR)/$(FLOWER_WHEEL) $(BIN)/python -m pytest -m "not slow" -q

# The inner loop: make test's unit tests and inline simulations, without lint and without
# what starts processes of fedcore's own (deployments, CLI runs, the process and ray
# backends, scripts, the examples' trainings, protoc).
FAST_SKIP := $(addprefix --ignore=tests/,deployment cli examples test_readme.py \
	wire/test_proto_current.py simulation/test_interrupts.py \
	results/test_resume_rounds.py results/test_results_directory.py \
	$(addprefix legacy/test_,simulate_flower_e2e.py flower_baselines.py legacy_scripts.py))
test-fast: $(STAMP)  ## unit tests and inline simulations, under 3 minutes: make test less tests/{deployment,cli,examples}, the README's commands, the CLI-run (results, resume, interrupts), Flower-e2e, script and protoc tests, and -k 'process' or 'on_a_link'
	$(BIN)/python -m pytest -m "not slow and not ray" -k "not process and not on_a_link" $(FAST_SKIP) -q

test-all: lint $(FLOWER_WHEEL)  ## everything, soaks and large scales included
	FEDCORE_FLOWER_WHEEL=$(CURDIR)/$(FLOWER_WHEEL) $(BIN)/python -m pytest -q

$(FLOWER_WHEEL): tests/flower-wheel.txt $(DEMO_STAMP)
	$(BIN)/python -m pip download --quiet --no-deps --require-hashes -r $< -d $(@D)

lint: $(STAMP)
	$(BIN)/ruff check fedcore tests benchmarks examples
	$(BIN)/ruff format --check fedcore tests benchmarks examples
	$(BIN)/mypy

# $(call lock_into,PIP-INSTALL-ARGUMENTS,SOURCE,FILE): resolve in a new venv, pin what was
# installed (pip freeze: the exact builds, the local CPU torch included) in FILE.
define lock_into
rm -rf $(LOCK_VENV)
$(PYTHON) -m venv $(LOCK_VENV)
$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
$(LOCK_VENV)/bin/python -m pip install --quiet $(1)
{ echo "# Written by \`make lock\` from $(2), on Python $$($(LOCK_VENV)/bin/python -c 'import platform; print(platform.python_version(), platform.machine())')."; \
  echo "# Edit that, not this file; an upgrade is a commit of what make lock wrote."; \
  $(LOCK_VENV)/bin/python -m pip freeze --all --exclude-editable | grep -v '^fedcore[ =]'; } > $(3)
rm -rf $(LOCK_VENV)
endef
LOCK_SOURCE        := pyproject.toml's ranges with the extras [$(TEST_EXTRAS)] (what make demo, make test and CI install)
FLOWER_LOCK_SOURCE := flwr[simulation]==$(FLOWER_RELEASE) and scikit-learn (make bench-flower's .venv-flower)

lock:  ## re-resolve pyproject.toml's ranges (and bench-flower's Flower) in a new venv and pin the result: constraints.txt, benchmarks/flower-constraints.txt (an upgrade: commit them)
	$(call lock_into,'.[$(TEST_EXTRAS)]',$(LOCK_SOURCE),constraints.txt)
	$(call lock_into,'flwr[simulation]==$(FLOWER_RELEASE)' scikit-learn,$(FLOWER_LOCK_SOURCE),$(FLOWER_CONSTRAINTS))

bench: $(STAMP)  ## the workloads of docs/benchmarks.md; figures to benchmarks/results.json
	$(BIN)/python -m benchmarks

$(FLOWER_STAMP): $(FLOWER_CONSTRAINTS)
	$(PYTHON) -m venv $(FLOWER_VENV)
	PIP_CONSTRAINT=$(CURDIR)/$< $(FLOWER_VENV)/bin/python -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT=$(CURDIR)/$< $(FLOWER_VENV)/bin/python -m pip install --quiet 'flwr[simulation]==$(FLOWER_RELEASE)' scikit-learn
	@touch $@

bench-flower: $(STAMP) $(FLOWER_STAMP)  ## W2, W3, W4 as Flower apps: Flower 1.42's simulation (default resources, num_cpus=1) against fedcore process and ray, alternating (BENCH_ARGS="--repeat 2" or "W2 --quick")
	$(BIN)/python -m benchmarks.versus_flower --flower-python $(FLOWER_VENV)/bin/python $(BENCH_ARGS)

proto: $(STAMP)  ## regenerate fedcore/wire/_pb from protos/ (commit the result; a test checks it)
	$(BIN)/python -m fedcore.wire.protogen

clean:
	rm -rf $(VENV) $(FLOWER_VENV) $(LOCK_VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
