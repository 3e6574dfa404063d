# grow: make help lists the targets. `make train` and `make test` set up .venv on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= auto             # the torch .venv gets: auto (nvidia-smi lists a GPU: PyPI's torch, with CUDA; else the CPU build
                           # from TORCH_CPU_INDEX, ~200 MB instead of ~20 CUDA wheels) | a pip requirement (TORCH=torch==2.13.0)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu   # PyTorch's CPU-only wheels (PyPI stays the index of the rest)
JOBS   ?= auto             # pytest-xdist workers of make test / test-crash / test-full (auto: one per core; 0: no workers)
ARGS   ?=                  # extra Hydra overrides: make train ARGS="model=tiny trainer.max_tokens=2e5"
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.grow-installed
SEEDS          ?= 0,1,2                         # the seeds of make sweep-strategies, sweep-results(-4x, -llama) and sweep-warmstart
SWEEPS         ?= outputs/sweeps                # where the sweep-results*, sweep-warmstart and sweep-one-growth* targets write
STRATEGIES     ?= all                            # arms of make compare / sweep-strategies (plus the baseline); all: every registered strategy, GROW_PLUGINS' included
COMPARE_ARGS   ?=                               # extra overrides of make compare / sweep-strategies (every strategy runs the default schedule as it is)
SWEEP_STRATEGY ?= svd                           # the strategy of make sweep-rates / sweep-dims
WIDTH_RATES    ?= 0.25,0.5,1.0                  # p_c (schedule.width_rate) grid of make sweep-rates (2.0 reaches the final size in 3 of exp's 4 stages: a growth that grows nothing, refused)
LENGTH_RATES   ?= 0.25,0.5,1.0                  # p_t (schedule.length_rate) grid of make sweep-rates
GROW_DIMS      ?= [d_model,d_ff],[d_qk,d_v],[n_heads],[n_layers],[d_model,d_ff,n_heads,d_qk,d_v,n_layers]  # in 3 stages: 4 heads or layers double twice from 1
RESULTS_STRATEGIES ?= zero,vt,svd,random,net2net,stack,hyperclone,msg   # the strategies of make sweep-results(-4x, -llama): the eight docs/results.md published (strategy=all now adds ligo, shrink_perturb, llama_pro, dus, ...)
RESULTS_MODEL  ?= small                         # the final model of make sweep-results(-4x)
RESULTS_LLAMA_MODEL ?= llama-small              # the final model of make sweep-results-llama
# The published sweeps (docs/results.md) started the schedule at 2 heads (vt then refused an odd number of
# new heads): sweep-results(-4x) keep +schedule.start.n_heads=2 so that they reproduce those runs.
RESULTS_ARGS   ?= seed=$(strip $(SEEDS)) compare.equal_flops=true compare.equal_flops_sizes=stages +schedule.start.n_heads=2
RESULTS_ARGS_4X ?= seed=$(strip $(SEEDS)) compare.equal_flops=true compare.equal_flops_sizes=final +schedule.start.n_heads=2   # make sweep-results-4x (with every stage size: compare.equal_flops_sizes=stages, ~10 h more)
WARM_FACTORS   ?= 1.5,2,4,8                     # make sweep-warmstart: growth factors (final / start parameters)
WARM_RATIOS    ?= 2,5,10,20,40                  # ... training tokens per final parameter
WARM_STRATEGY  ?= zero                          # ... the strategy of the one growth
WARM_ARGS      ?= model=tiny data.vocab_size=512 trainer.eval_every=0 trainer.progress=false   # ... overrides of every cell (a 512-token BPE: 50k parameters)
ONE_GROWTH_STRATEGIES ?= msg,vt,zero,stack      # make sweep-one-growth: the strategies of the one growth
ONE_GROWTH_SEEDS ?= 0,1,2,3,4                   # ... and of make sweep-one-growth-lr: the seeds of every arm
ONE_GROWTH_EXPERIMENT ?= one-growth             # ... and of make sweep-one-growth-lr: one-growth (GPT-style) | one-growth-llama (the Llama family)
TOKENS_one-growth_45 = 7190306                  # ... one-growth's token budget with the growth after 45% of the tokens (the small-1m grown arms' FLOPs)
TOKENS_one-growth_60 = 8180663                  # ... after 60% (likewise; tests/test_results.py checks every budget with the plan)
TOKENS_one-growth-llama_45 = 7008255            # ... one-growth-llama's, after 45% (the llama-small-1m grown arms' FLOPs)
TOKENS_one-growth-llama_60 = 7966719            # ... after 60%
ONE_GROWTH_LRS ?= 1e-3,1e-2,3e-2                # make sweep-one-growth-lr: the other peak learning rates (3e-3, the sweeps' own, comes from make sweep-one-growth)
ONE_GROWTH_LR_STRATEGIES ?= msg,vt,zero,stack   # ... the grown arms it tunes
ONE_GROWTH_LR_AT ?= 45                          # ... their growth point: 45 or 60 (% of the tokens)
SWEEP_JOBS     ?= 1                             # make sweep-one-growth(-lr): copies of each grow compare at once, sharing its sweep directory (scripts/jobs.sh; 14 filled one H100); above 1, the reports are rebuilt after the copies finish
CHECK_ONE_GROWTH_EXPERIMENT = @case "$(strip $(ONE_GROWTH_EXPERIMENT))" in one-growth|one-growth-llama) ;; *) echo "error: ONE_GROWTH_EXPERIMENT='$(strip $(ONE_GROWTH_EXPERIMENT))': allowed one-growth or one-growth-llama (configs/experiment/)"; exit 2;; esac   # the first recipe line of both one-growth targets
SWEEP_GPU_SPEC ?= configs/sweep/gpu-depth.yaml   # make sweep-gpu: the arms (scripts/sweep_gpu.py)
SWEEP_GPU_OUT  ?= $(if $(OUT),$(OUT),outputs/sweeps)   # ... where the runs go: the device machine's $$OUT (returned), else outputs/sweeps
SWEEP_GPU_PY   ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)   # ... the venv's python, or a bare machine's own
GROW           ?= $(BIN)/grow                   # the grow command the recipes run (tests/growd.py in the tests: a warm fork)
SWEEP          ?=                               # make publish-results: the finished sweep directory ...
NAME           ?=                               # ... and its name under docs/results/
RESULTS_ROOT   ?= .                             # make publish-results / results: the checkout whose docs/ they write
# the suite's own plugin set (the caller's other pytest plugins neither load nor rewrite modules' assertions on import):
# xdist's workers, taking the files in tests/conftest.py's order (LONGEST_FIRST), and pytest-cov
PYTEST_OPTS := --disable-plugin-autoload -p xdist.plugin -p xdist.looponfail -p pytest_cov.plugin --no-loadscope-reorder
export WANDB_MODE ?= offline

.DEFAULT_GOAL := help
.PHONY: help install train compare sweep-gpu sweep-strategies sweep-rates sweep-dims sweep-results sweep-results-4x sweep-warmstart sweep-one-growth publish-results results bench gpu-check test test-fsdp test-crash test-slurm test-full lint clean

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
	@echo "install 2/2: grow, its dev tools and the hf extra (transformers, safetensors, lm-eval) into $(VENV)"
	$(BIN)/python -m pip install --progress-bar on -e ".[dev,hf]"
	touch $(STAMP)

install: $(STAMP) ## create .venv and install grow with its dev tools and the hf extra (TORCH=... picks the torch build)

train: $(STAMP) ## grow the default model through the exponential schedule on the stdlib corpus
	$(strip $(GROW)) train +schedule=exp $(ARGS)

compare: $(STAMP) ## STRATEGIES vs the fixed-size baseline, seed 0 -> outputs/compare/<time>/ (2-core CPU est. ~30 min idle, ~1 h loaded; 1 GPU est. ~3 min)
	$(strip $(GROW)) compare strategy=$(strip $(STRATEGIES)) $(strip $(COMPARE_ARGS)) $(ARGS)

sweep-strategies: $(STAMP) ## the same with SEEDS (0,1,2): mean ± std per arm (2-core CPU est. ~1.5 h idle, ~3 h loaded; 1 GPU est. ~10 min)
	$(strip $(GROW)) compare strategy=$(strip $(STRATEGIES)) seed=$(strip $(SEEDS)) $(strip $(COMPARE_ARGS)) $(ARGS)

sweep-rates: $(STAMP) ## SWEEP_STRATEGY over the p_c x p_t grid WIDTH_RATES x LENGTH_RATES (2-core CPU ~45 min, 1 GPU est. ~4 min)
	$(strip $(GROW)) compare strategy=$(strip $(SWEEP_STRATEGY)) schedule.width_rate=$(strip $(WIDTH_RATES)) schedule.length_rate=$(strip $(LENGTH_RATES)) $(ARGS)

sweep-dims: $(STAMP) ## SWEEP_STRATEGY growing each set of GROW_DIMS, the others at full size (2-core CPU ~30 min, 1 GPU est. ~3 min)
	$(strip $(GROW)) compare strategy=$(strip $(SWEEP_STRATEGY)) 'schedule.grow=$(strip $(GROW_DIMS))' schedule.stages=3 $(ARGS)

sweep-results: $(STAMP) ## docs/results.md's sweep: RESULTS_STRATEGIES, SEEDS, baseline, matched baselines, equal-FLOPs stage sizes; small, 1M tokens -> outputs/sweeps/small-1m (rerun resumes; run it in two shells at once to share the arms; 2-core CPU est. ~3 h)
	$(strip $(GROW)) compare strategy=$(strip $(RESULTS_STRATEGIES)) $(strip $(RESULTS_ARGS)) model=$(strip $(RESULTS_MODEL)) hydra.sweep.dir=$(strip $(SWEEPS))/small-1m $(ARGS)

sweep-results-4x: $(STAMP) ## the same strategies on 4M tokens, the final size at equal FLOPs, SEEDS (RESULTS_ARGS_4X) -> outputs/sweeps/small-4m (2-core CPU, two shells: ~2.5 h)
	$(strip $(GROW)) compare strategy=$(strip $(RESULTS_STRATEGIES)) $(strip $(RESULTS_ARGS_4X)) model=$(strip $(RESULTS_MODEL)) trainer.max_tokens=4000000 hydra.sweep.dir=$(strip $(SWEEPS))/small-4m $(ARGS)

sweep-results-llama: $(STAMP) ## the small-1m sweep on the Llama family (model=llama-small: rotary, SwiGLU, grouped-query): RESULTS_STRATEGIES, SEEDS, baseline, matched baselines, equal-FLOPs stage sizes -> outputs/sweeps/llama-small-1m (2-core CPU, two shells: ~5 h; measured 9.7 process-hours at load 0.3-6)
	$(strip $(GROW)) compare strategy=$(strip $(RESULTS_STRATEGIES)) $(strip $(RESULTS_ARGS)) model=$(strip $(RESULTS_LLAMA_MODEL)) hydra.sweep.dir=$(strip $(SWEEPS))/llama-small-1m $(ARGS)

sweep-warmstart: $(STAMP) ## how much to grow: one growth by WARM_FACTORS x tokens per parameter WARM_RATIOS vs the final model from scratch at equal FLOPs, SEEDS -> outputs/sweeps/warmstart/warmstart.md + .png (heat map; 2-core CPU est. ~1.5 h on the tiny model)
	$(BIN)/python scripts/warmstart.py run $(strip $(SWEEPS))/warmstart --factors $(strip $(WARM_FACTORS)) --ratios $(strip $(WARM_RATIOS)) --seeds $(strip $(SEEDS)) --strategy $(strip $(WARM_STRATEGY)) -- $(strip $(WARM_ARGS)) $(ARGS)

sweep-one-growth: $(STAMP) ## one growth under WSD (+experiment=ONE_GROWTH_EXPERIMENT: one-growth, or one-growth-llama on the Llama family): ONE_GROWTH_STRATEGIES, ONE_GROWTH_SEEDS, the growth after 45% and after 60% of the tokens, each at the small-1m grown arms' FLOPs, with both sizes at equal FLOPs -> outputs/sweeps/<experiment>-45, -60 (40 runs each; one core of the 2-core CPU: 650-1,800 s a run; one H100 running 14 copies at once (OMP_NUM_THREADS=1): both sweeps' 48 runs of seeds 0-2 with 36 of the learning-rate check in 330 s)
	$(CHECK_ONE_GROWTH_EXPERIMENT)
	scripts/jobs.sh $(strip $(SWEEP_JOBS)) $(strip $(GROW)) compare +experiment=$(strip $(ONE_GROWTH_EXPERIMENT)) strategy=$(strip $(ONE_GROWTH_STRATEGIES)) seed=$(strip $(ONE_GROWTH_SEEDS)) schedule.first_stage=0.45 trainer.max_tokens=$(strip $(TOKENS_$(strip $(ONE_GROWTH_EXPERIMENT))_45)) compare.equal_flops=true compare.equal_flops_sizes=stages hydra.sweep.dir=$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-45 $(ARGS)
	scripts/jobs.sh $(strip $(SWEEP_JOBS)) $(strip $(GROW)) compare +experiment=$(strip $(ONE_GROWTH_EXPERIMENT)) strategy=$(strip $(ONE_GROWTH_STRATEGIES)) seed=$(strip $(ONE_GROWTH_SEEDS)) schedule.first_stage=0.60 trainer.max_tokens=$(strip $(TOKENS_$(strip $(ONE_GROWTH_EXPERIMENT))_60)) compare.equal_flops=true compare.equal_flops_sizes=stages hydra.sweep.dir=$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-60 $(ARGS)
	$(if $(filter-out 1,$(strip $(SWEEP_JOBS))),$(strip $(GROW)) compare report=$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-45 > /dev/null)
	$(if $(filter-out 1,$(strip $(SWEEP_JOBS))),$(strip $(GROW)) compare report=$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-60)

sweep-gpu: ## one GPU window: the arms of SWEEP_GPU_SPEC not yet finished (here or committed under docs/runs/<name>/), SWEEP_JOBS at once, on data=pysrc built there, FLOPs estimated first -> SWEEP_GPU_OUT/<name>/ (runs without checkpoints, and report/)
	PYTHONPATH=$(CURDIR) $(strip $(SWEEP_GPU_PY)) scripts/sweep_gpu.py $(strip $(SWEEP_GPU_SPEC)) $(strip $(SWEEP_GPU_OUT)) --jobs $(strip $(SWEEP_JOBS)) $(ARGS)

sweep-one-growth-lr: $(STAMP) ## the learning-rate check: ONE_GROWTH_LRS on the grown arms ONE_GROWTH_LR_STRATEGIES (growth after ONE_GROWTH_LR_AT% of the tokens) and on both sizes at equal FLOPs, ONE_GROWTH_SEEDS, no baseline -> outputs/sweeps/<experiment>-lr; with make sweep-one-growth's own rate -> outputs/sweeps/<experiment>-lr-report (90 runs: ~1 day on the 2-core CPU; one H100, 14 copies at once: ~4 min)
	$(CHECK_ONE_GROWTH_EXPERIMENT)
	@case "$(strip $(ONE_GROWTH_LR_AT))" in 45|60) ;; *) echo "error: ONE_GROWTH_LR_AT='$(strip $(ONE_GROWTH_LR_AT))': allowed 45 or 60 (the growth points of make sweep-one-growth)"; exit 2;; esac
	scripts/jobs.sh $(strip $(SWEEP_JOBS)) $(strip $(GROW)) compare +experiment=$(strip $(ONE_GROWTH_EXPERIMENT)) strategy=$(strip $(ONE_GROWTH_LR_STRATEGIES)) optim.lr=$(strip $(ONE_GROWTH_LRS)) seed=$(strip $(ONE_GROWTH_SEEDS)) schedule.first_stage=0.$(strip $(ONE_GROWTH_LR_AT)) trainer.max_tokens=$(strip $(TOKENS_$(strip $(ONE_GROWTH_EXPERIMENT))_$(strip $(ONE_GROWTH_LR_AT)))) compare.baseline=false compare.matched_baseline=false compare.equal_flops=true compare.equal_flops_sizes=stages hydra.sweep.dir=$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-lr $(ARGS)
	$(strip $(GROW)) report runs=[$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-$(strip $(ONE_GROWTH_LR_AT)),$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-lr] out=$(strip $(SWEEPS))/$(strip $(ONE_GROWTH_EXPERIMENT))-lr-report

publish-results: $(STAMP) ## copy a finished sweep's summary.json, report.md and plots into docs/results/NAME/ and render docs/results.md (SWEEP=outputs/sweeps/small-1m NAME=small-1m)
	@test -n "$(strip $(SWEEP))" -a -n "$(strip $(NAME))" || { echo "usage: make publish-results SWEEP=<sweep dir> NAME=<name>"; exit 2; }
	$(BIN)/python scripts/results.py --root $(strip $(RESULTS_ROOT)) publish $(strip $(SWEEP)) $(strip $(NAME))

results: $(STAMP) ## re-render docs/results.md's tables from the committed docs/results/*/summary.json
	$(BIN)/python scripts/results.py --root $(strip $(RESULTS_ROOT)) render

bench: $(STAMP) ## runner vs plain PyTorch on this device: bench.json + table (ARGS="--model tiny", --strict; CPU ~2 min)
	$(BIN)/python scripts/bench.py $(ARGS)

gpu-check: $(STAMP) ## the GPU path on gpt124m-exp and llama-124m: the GPU tests, optimizer after growths vs fused AdamW, loss/attention kernels measured, MFU, memory plan vs peak, growth shares, profiler trace, liger-kernel (pip install -e .[gpu]), svd phases -> gpu_check.json + trace (one H100/H200: <= 6 min; docs/bench/gpu_check_run.sh)
	$(BIN)/python scripts/gpu_check.py $(ARGS)

test: $(STAMP) ## the fast test suite (no network, no GPU; ~2.5 min on 2 idle cores (2:25-2:45, Intel Xeon, ~1,450 tests), each test file on one of JOBS workers)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -n $(strip $(JOBS)) --dist loadfile -m "not slow and not gpu and not slurm and not crash and not fsdp" $(ARGS)

test-fsdp: $(STAMP) ## every strategy grown under FSDP2 on 2 gloo ranks against one process (float64, 1e-10; ~2 min)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -m "fsdp and not gpu" $(ARGS)

test-crash: $(STAMP) ## the SIGKILL-and-rerun matrices: runs killed at kill points, reruns equal to runs never stopped (~1 min)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -n $(strip $(JOBS)) --dist loadfile -m "crash and not gpu" $(ARGS)

test-slurm: $(STAMP) ## grow compare and a 2-task DDP job through a real one-node SLURM of the tests' own (scripts/slurm.sh: root, apt-get; ~2 min)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -m slurm tests/test_slurm.py $(ARGS)

test-full: $(STAMP) ## every test, slow ones included (gpu tests skip without CUDA; the SLURM ones: make test-slurm)
	$(BIN)/python -m pytest $(PYTEST_OPTS) -q -n $(strip $(JOBS)) --dist loadfile -m "not slurm" $(ARGS)

lint: $(STAMP) ## ruff
	$(BIN)/ruff check grow tests scripts

clean: ## remove the virtualenv, caches and run outputs
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info bench.json gpu_check.json
	find outputs -mindepth 1 ! -name .gitignore -exec rm -rf {} +
