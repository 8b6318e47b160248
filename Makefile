# specstudy: two commands for a newcomer.
#   make study            run the embedded default study (GPU=cpu) and render its report
#   make test             pass the tests
# Both create .venv from the pins in pyproject.toml on first use (a stamp file: later calls
# install nothing).

SHELL  := /bin/bash
GPU    ?= cpu
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.specstudy-installed
OUT    := outputs/$(GPU)
JOBS   ?= 1
PYTEST_ARGS ?=

# Decoding on a shared CPU: spinning OpenMP threads cost 4x under load (measured, engine issue).
export OMP_WAIT_POLICY ?= PASSIVE
export PYTHONUNBUFFERED := 1
export HF_HUB_OFFLINE ?= 1
export TOKENIZERS_PARALLELISM := false

.PHONY: venv test test-fast test-slow test-engines study report clean-study lab install-vllm install-sglang help

help:
	@echo "make study [GPU=cpu|a100|h100|h200|rtx4090]   run the study matrix and render the report"
	@echo "make test                                     pass the test suite (fast + model tests)"
	@echo "make test-fast                                the fast subset (no model loading)"
	@echo "make test-engines                             real vLLM CPU / llama.cpp servers (slow)"
	@echo "make report GPU=...   make clean-study GPU=...   make lab"

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $@

venv: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow and not engines" $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

lab: $(STAMP)
	$(BIN)/jupyter lab notebooks/
