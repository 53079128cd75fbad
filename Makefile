# One entry point for newcomers and CI. `make setup` is idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.installed-vllm

.PHONY: setup test bench plugins lint clean

# Every local distribution (kvtiers-core, kvtiers-fs, ...) is installed editable, and
# so are the example plugins whose tests live under tests/ (tests/redis).
DISTS := $(wildcard kvtiers-*/pyproject.toml)
EXAMPLE_DISTS := examples/kvtiers-redis/pyproject.toml

$(STAMP): requirements-dev.txt $(DISTS) $(EXAMPLE_DISTS)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and pinned: an unpinned resolve pulls a multi-GB CUDA build. The
	# distributions do not depend on it (kvtiers-core[torch] is an extra); dev and CI
	# install it for the worker-side and bench tests.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q $(foreach d,$(DISTS) $(EXAMPLE_DISTS),-e $(dir $(d)))
	touch $(STAMP)

# vLLM for tests/vllm (the test command only; the bench does not need it), without
# its dependencies (they pull CUDA builds): the pinned set its scheduler and
# offloading code import. A few minutes, ~2 GB.
$(VLLM_STAMP): $(STAMP) requirements-vllm.txt
	$(BIN)/pip install -q --no-deps -r requirements-vllm.txt
	touch $(VLLM_STAMP)

setup: $(STAMP)

# The test command: lint (ruff, mypy strict), then the whole suite.
test: setup $(VLLM_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy $(TYPED_PATHS)
	$(BIN)/python -m pytest -q tests

bench: setup
	$(BIN)/kvtiers bench

# ruff with the rules of pyproject.toml, mypy strict on the distributions' sources
# and on the example tiers docs/plugins.md shows (what authors copy must type-check).
LINT_PATHS := $(dir $(DISTS)) tests bench examples
TYPED_PATHS := $(addsuffix src,$(dir $(DISTS))) tests/vllm tests/p2p \
	examples/kvtiers-scratch/src examples/kvtiers-scratch/tests examples/kvtiers-sqlite/src \
	examples/embedding examples/kvtiers-redis/src tests/redis

lint: setup $(VLLM_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy $(TYPED_PATHS)

clean:
	rm -rf $(VENV)
