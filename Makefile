# grow: make help lists the targets. `make train` and `make test` set up .venv on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch            # e.g. TORCH=torch==2.13.0 for a CPU-only machine (plain torch may pull CUDA wheels)
ARGS   ?=                  # extra Hydra overrides: make train ARGS="model=tiny trainer.max_tokens=2e5"
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.grow-installed
export WANDB_MODE ?= offline

.DEFAULT_GOAL := help
.PHONY: help install train bench test test-full lint clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q "$(strip $(TORCH))"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install grow with its dev tools (TORCH=... picks the torch build)

train: $(STAMP) ## grow the default model through the exponential schedule on the stdlib corpus
	$(BIN)/grow train +schedule=exp $(ARGS)

bench: $(STAMP) ## runner vs plain PyTorch on this device: bench.json + table (ARGS="--model tiny", --strict; CPU ~2 min)
	$(BIN)/python scripts/bench.py $(ARGS)

test: $(STAMP) ## the fast test suite (no network, no GPU; a few minutes on 2 cores)
	$(BIN)/python -m pytest -q -m "not slow and not gpu" $(ARGS)

test-full: $(STAMP) ## every test, slow ones included (gpu tests skip without CUDA)
	$(BIN)/python -m pytest -q $(ARGS)

lint: $(STAMP) ## ruff
	$(BIN)/ruff check grow tests scripts

clean: ## remove the virtualenv, caches and run outputs
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info bench.json
	find outputs -mindepth 1 ! -name .gitignore -exec rm -rf {} +
