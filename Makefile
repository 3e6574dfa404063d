# grow: make help lists the targets. `make train` and `make test` set up .venv on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= auto             # the torch .venv gets: auto (nvidia-smi lists a GPU: PyPI's torch, with CUDA; else the CPU build
                           # from TORCH_CPU_INDEX, ~200 MB instead of ~20 CUDA wheels) | a pip requirement (TORCH=torch==2.13.0)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu   # PyTorch's CPU-only wheels (PyPI stays the index of the rest)
JOBS   ?= auto             # pytest-xdist workers of make test / test-crash / test-full (auto: one per core; 0: no workers);
                           # make sweep: its processes at once (auto: 1)
ARGS   ?=                  # extra Hydra overrides: make train ARGS="model=tiny trainer.max_tokens=2e5"
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.grow-installed
EXP            ?=                               # make sweep: the sweep, configs/sweep/<EXP>.yaml (scripts/sweep.py; docs/usage.md, "Sweeps")
SEEDS          ?=                               # ... its seeds instead of the spec's (0,1,2)
SWEEPS         ?= $(if $(OUT),$(OUT),outputs/sweeps)   # ... where its folder goes: a device machine's $$OUT (returned), else outputs/sweeps
GROW           ?= $(BIN)/grow                   # the grow command the recipes run (tests/growd.py in the tests: a warm fork)
SWEEP          ?=                               # make publish-results: the finished sweep directory ...
NAME           ?=                               # ... and its name under docs/results/
RESULTS_ROOT   ?= .                             # make publish-results / results: the checkout whose docs/ they write
# the suite's own plugin set (the caller's other pytest plugins neither load nor rewrite modules' assertions on import):
# xdist's workers, taking the files in tests/conftest.py's order (LONGEST_FIRST), pytest-cov, and pytest-timeout:
# a test past 300 s fails with its stack (the slowest takes ~15 s), so a hang ends the suite, not CI's limit
PYTEST_OPTS := --disable-plugin-autoload -p xdist.plugin -p xdist.looponfail -p pytest_cov.plugin --no-loadscope-reorder \
               -p pytest_timeout -o timeout=300
export WANDB_MODE ?= offline

.DEFAULT_GOAL := help
.PHONY: help install train sweep publish-results results bench gpu-check test test-fsdp test-crash test-slurm test-full lint clean

help: ## list the targets
	@if [ -t 1 ]; then c="$$(printf '\033[36m')"; r="$$(printf '\033[0m')"; fi; \
	grep -E '^[a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -v c="$$c" -v r="$$r" 'BEGIN {FS = ":.*## "}; {printf "  %s%-18s%s %s\n", c, $$1, r, $$2}'

# TORCH=auto: a GPU is one that `nvidia-smi -L` lists (read when the stamp rule runs, and by make -n)
HAS_GPU = $(shell nvidia-smi -L 2>/dev/null | grep -q '^GPU' && echo yes)
TORCH_PIP = $(if $(filter auto,$(strip $(TORCH))),$(if $(HAS_GPU),torch,--index-url $(strip $(TORCH_CPU_INDEX)) --extra-index-url https://pypi.org/simple torch),"$(strip $(TORCH))")
TORCH_SAYS = $(if $(filter auto,$(strip $(TORCH))),$(if $(HAS_GPU),torch with CUDA (nvidia-smi lists a GPU),torch's CPU build (no GPU: nvidia-smi lists none)),$(strip $(TORCH)))

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@echo "install 1/2: $(TORCH_SAYS) into $(VENV) (TORCH= picks another; a few minutes, pip's lines follow)"
	$(BIN)/python -m pip install --progress-bar on $(TORCH_PIP)
	@echo "install 2/2: grow, its dev tools, the hf extra (transformers, safetensors, lm-eval) and the report extra (scipy, statsmodels, matplotlib) into $(VENV)"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev,hf,report]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install grow with its dev tools and the hf and report extras (TORCH=... picks the torch build)

train: $(STAMP) ## grow the default model through the exponential schedule on the stdlib corpus
	$(strip $(GROW)) train +schedule=exp $(ARGS)

sweep: $(STAMP) ## run configs/sweep/EXP.yaml (SEEDS=0,1 JOBS=4 ARGS="model=tiny --dry-run") -> SWEEPS/EXP/; a rerun resumes
	GROW="$(strip $(GROW))" PYTHONPATH=$(CURDIR) $(BIN)/python scripts/sweep.py "$(strip $(EXP))" $(strip $(SWEEPS)) --jobs $(strip $(JOBS)) $(if $(strip $(SEEDS)),--seeds $(strip $(SEEDS))) $(ARGS)

publish-results: $(STAMP) ## copy a finished sweep into docs/results/NAME/, render docs/results.md (SWEEP=outputs/sweeps/small-1m NAME=small-1m)
	@test -n "$(strip $(SWEEP))" -a -n "$(strip $(NAME))" || { echo "usage: make publish-results SWEEP=<sweep dir> NAME=<name>"; exit 2; }
	$(BIN)/python scripts/results.py --root $(strip $(RESULTS_ROOT)) publish $(strip $(SWEEP)) $(strip $(NAME))

results: $(STAMP) ## re-render docs/results.md's tables from the committed docs/results/*/summary.json
	$(BIN)/python scripts/results.py --root $(strip $(RESULTS_ROOT)) render

bench: $(STAMP) ## runner vs plain PyTorch on this device: bench.json + table (ARGS="--model tiny", --strict; CPU ~2 min)
	$(BIN)/python scripts/bench.py $(ARGS)

gpu-check: $(STAMP) ## the GPU path on gpt124m-exp and llama-124m (docs/bench.md) -> gpu_check.json + trace (one H100/H200: <= 6 min)
	$(BIN)/python scripts/gpu_check.py $(ARGS)

test: $(STAMP) ## the fast test suite (no network, no GPU; ~4 min on 2 idle cores, ~1,940 tests; each file on one of JOBS workers)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -n $(strip $(JOBS)) --dist loadfile -m "not slow and not gpu and not slurm and not crash and not fsdp" $(ARGS)

test-fsdp: $(STAMP) ## every strategy grown under FSDP2 on 2 gloo ranks against one process (float64, 1e-10; ~2 min)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -m "fsdp and not gpu" $(ARGS)

test-crash: $(STAMP) ## the SIGKILL-and-rerun matrices: runs killed at kill points, reruns equal to runs never stopped (~1 min)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -n $(strip $(JOBS)) --dist loadfile -m "crash and not gpu" $(ARGS)

test-slurm: $(STAMP) ## grow compare and a 2-task DDP job through a one-node SLURM of the tests' own (scripts/slurm.sh: root; ~2 min)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -m slurm tests/test_slurm.py $(ARGS)

test-full: $(STAMP) ## every test, slow ones included (gpu tests skip without CUDA; the SLURM ones: make test-slurm)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -n $(strip $(JOBS)) --dist loadfile -m "not slurm" $(ARGS)

lint: $(STAMP) ## ruff
	$(BIN)/ruff check grow tests scripts

clean: ## remove the virtualenv, caches and run outputs
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info bench.json gpu_check.json
	find outputs -mindepth 1 ! -name .gitignore -exec rm -rf {} +
