#!/bin/bash
# The one device call of issue 47: `make gpu-check` on a lent GPU (bare: its python3 has CUDA torch, not
# grow's other dependencies), everything into $OUT: gpu_check.json, gpu_check.profile.txt,
# gpu_check.trace.json.gz, env.log, gpu_check.log. Commit them under docs/bench/<device>-<date>/.
# Before the call, on the development machine (untracked, travels with the working tree, ~13 MB):
#   pip install --target .dev/site --no-deps liger-kernel hydra-core==1.3.8 omegaconf==2.3.1 antlr4-python3-runtime==4.9.3
# The call: run(command="bash docs/bench/gpu_check_run.sh", timeout_s=600). SMOKE=1 runs it on the CPU at toy size;
# CHECKS=a,b runs only those checks (what a window has time for).
export PYTHONPATH=$PWD:$PWD/.dev/site PYTHONUNBUFFERED=1 WANDB_MODE=disabled GROW_CACHE_DIR=/tmp/growcache
P=${P:-python3}
OUT=${OUT:-/tmp/gpu-check-out}; mkdir -p "$OUT"
ARGS=(--steps 8)
[ "$SMOKE" = 1 ] && ARGS=(--allow-cpu --model tiny --llama-model llama-tiny --steps 3 device=cpu)
[ -n "$CHECKS" ] && ARGS=(--checks "$CHECKS" "${ARGS[@]}")   # CHECKS=training,optimizer: only those (a window's rest)
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc
  $P -c "import torch, hydra, grow; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
  $P -c "import triton, liger_kernel; print('triton', triton.__version__, 'liger_kernel', getattr(liger_kernel, '__version__', '?'))" 2>&1 | tail -1
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
timeout -s TERM 560 $P scripts/gpu_check.py --out "$OUT/gpu_check.json" "${ARGS[@]}" > "$OUT/gpu_check.log" 2>&1
echo "gpu_check exit $?"
tail -40 "$OUT/gpu_check.log"
