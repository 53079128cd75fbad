# One entry point for newcomers and CI. `make setup` is idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
VLLM_STAMP := $(VENV)/.installed-vllm
SGLANG_STAMP := $(VENV)/.installed-sglang
MOONCAKE_STAMP := $(VENV)/.installed-mooncake

.PHONY: setup test bench plugins lint clean rdma-libs

# Every local distribution (kvtiers-core, kvtiers-fs, ...) is installed editable, and
# so are the example plugins whose tests live under tests/ (tests/redis).
DISTS := $(wildcard kvtiers-*/pyproject.toml)
EXAMPLE_DISTS := examples/kvtiers-redis/pyproject.toml
# the optional C helpers, built in place by the editable installs: a change rebuilds
NATIVE := $(wildcard kvtiers-*/setup.py kvtiers-*/src/*/*.c kvtiers-*/src/*/*/*.c \
                     kvtiers-*/src/*/*/*.h)

# Which torch the set-up installs: on a machine without an NVIDIA driver (no
# `nvidia-smi`) the CPU build, 2.13.0+cpu (about 200 MB): a wheel pip finds locally
# (find-links), else from PyTorch's CPU index; then its dependencies from PyPI. With
# one, torch 2.13.0 from PyPI, the CUDA build. To choose yourself:
# `make TORCH=torch==2.13.0 TORCH_FROM= setup`.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
HAVE_GPU := $(shell command -v nvidia-smi 2>/dev/null)
TORCH ?= $(if $(HAVE_GPU),torch==2.13.0,torch==2.13.0+cpu)
TORCH_FROM ?= $(if $(HAVE_GPU),,--extra-index-url $(TORCH_CPU_INDEX))

$(STAMP): requirements-dev.txt $(DISTS) $(EXAMPLE_DISTS) $(NATIVE)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch first and pinned: an unpinned resolve pulls a multi-GB CUDA build. The
	# distributions do not depend on it (kvtiers-core[torch] is an extra); dev and CI
	# install it for the worker-side and bench tests. TORCH (above) says which build.
	$(BIN)/pip install -q --no-deps --no-index $(TORCH) 2>/dev/null || \
		$(BIN)/pip install -q --no-deps $(TORCH_FROM) $(TORCH)
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -r requirements-dev.txt
	$(BIN)/pip install -q $(foreach d,$(DISTS) $(EXAMPLE_DISTS),-e $(dir $(d)))
	touch $(STAMP)

# vLLM for tests/vllm (the test command only; the bench does not need it), without
# its dependencies (they pull CUDA builds): the pinned set its scheduler and
# offloading code import. A few minutes, ~2 GB.
$(VLLM_STAMP): $(STAMP) requirements-vllm.txt
	$(BIN)/pip install -q --no-deps -r requirements-vllm.txt
	touch $(VLLM_STAMP)

# vLLM 0.34 for the same suite on the other supported minor: vLLM 0.34.0 alone
# (--no-deps, ~550 MB) in a folder of .venv, put first on PYTHONPATH over .venv's
# packages (the same pinned set serves both; it runs over torch 2.13.0+cpu).
VLLM_NEXT := $(VENV)/vllm-0.34
VLLM_NEXT_STAMP := $(VENV)/.installed-vllm-0.34
$(VLLM_NEXT_STAMP): $(VLLM_STAMP)
	rm -rf $(VLLM_NEXT)
	$(BIN)/pip install -q --no-deps --target $(VLLM_NEXT) vllm==0.34.0
	touch $(VLLM_NEXT_STAMP)

# SGLang for tests/sglang (kvtiers-sglang against SGLang's real storage classes on
# CPU), without its dependencies (they pull CUDA builds): SGLang itself and the few
# packages its storage modules import (about 230 MB installed).
$(SGLANG_STAMP): $(STAMP) requirements-sglang.txt
	$(BIN)/pip install -q --no-deps -r requirements-sglang.txt
	touch $(SGLANG_STAMP)

# Mooncake for tests/mooncake (the wheel, with its few dependencies).
$(MOONCAKE_STAMP): $(STAMP) requirements-mooncake.txt
	$(BIN)/pip install -q -r requirements-mooncake.txt
	touch $(MOONCAKE_STAMP)

# Mooncake (kvtiers-mooncake) loads libibverbs.so.1 even over TCP: Debian's libibverbs1.
# The test command installs it when missing and run as root with apt-get; otherwise a
# note says what to run, and tests/mooncake are skipped with the reason.
rdma-libs:
	@if ! ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	            --no-install-recommends libibverbs1 ibverbs-providers; \
	    else \
	        echo "note: libibverbs.so.1 is missing: run 'sudo apt-get install libibverbs1'" \
	             "(kvtiers-mooncake needs it; tests/mooncake are skipped without it)" >&2; \
	    fi; \
	fi

setup: $(STAMP)

# The test command: lint (ruff, mypy strict), tests/vllm on vLLM 0.34, then the whole
# suite (tests/vllm on vLLM 0.33 with it).
test: setup rdma-libs $(VLLM_STAMP) $(VLLM_NEXT_STAMP) $(SGLANG_STAMP) $(MOONCAKE_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy $(TYPED_PATHS)
	PYTHONPATH=$(VLLM_NEXT) $(BIN)/python -m pytest -q tests/vllm
	$(BIN)/python -m pytest -q tests

bench: setup
	$(BIN)/kvtiers bench

# ruff with the rules of pyproject.toml, mypy strict on the distributions' sources
# and on the example tiers docs/plugins.md shows (what authors copy must type-check).
LINT_PATHS := $(dir $(DISTS)) tests bench examples
TYPED_PATHS := $(addsuffix src,$(dir $(DISTS))) tests/vllm tests/p2p tests/sglang \
	tests/mooncake \
	examples/kvtiers-scratch/src examples/kvtiers-scratch/tests examples/kvtiers-sqlite/src \
	examples/embedding examples/kvtiers-redis/src tests/redis

lint: setup $(VLLM_STAMP) $(SGLANG_STAMP) $(MOONCAKE_STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy $(TYPED_PATHS)

clean:
	rm -rf $(VENV)
