#!/bin/bash
# The one device call of issue 61: `make gpu-check`'s script on a lent GPU (bare: its python3 has CUDA torch and
# Triton, not grow's other dependencies), at most 6 minutes of the device: the GPU tests first, then the optimizer,
# the kernel choices, training (gpt and llama plans, every stage), the profiler trace, liger, svd on llama-124m.
# Everything lands in $OUT: gpu_check.json (a pass flag per target), gpu_check.profile.txt, gpu_check.trace.json.gz
# (<= 16 MiB), env.log, gpu_check.log. Commit them under docs/bench/<device>-<date>/ with this command.
# Before the call, on the development machine (untracked, travels with the working tree, ~10 MB):
#   pip install --target .dev/site --no-deps liger-kernel==0.8.5 hydra-core==1.3.8 omegaconf==2.3.1 \
#       antlr4-python3-runtime==4.9.3 pytest iniconfig pluggy packaging exceptiongroup tomli
# The call: run(command="bash docs/bench/gpu_check_run.sh", timeout_s=420) (.dev/ is untracked, not ignored: it travels).
# SMOKE=1 runs it on the CPU at toy size; CHECKS=a,b runs only those, in that order (a window's rest);
# LIMIT=s caps the script (default 345 s; `timeout -k` kills it 10 s after a TERM it ignores; no check starts after LIMIT-40 s).
export PYTHONPATH=$PWD:$PWD/.dev/site PYTHONUNBUFFERED=1 WANDB_MODE=disabled GROW_CACHE_DIR=/tmp/growcache
P=${P:-python3}; LIMIT=${LIMIT:-345}
OUT=${OUT:-/tmp/gpu-check-out}; mkdir -p "$OUT"
ARGS=(--steps 8)
[ "$SMOKE" = 1 ] && ARGS=(--allow-cpu --model tiny --llama-model llama-tiny --steps 3 --opt-steps 3 device=cpu)
[ -n "$CHECKS" ] && ARGS=(--checks "$CHECKS" "${ARGS[@]}")
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc
  $P -c "import torch, hydra, grow; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
  $P -c "import triton, liger_kernel, pytest; print('triton', triton.__version__, 'liger_kernel ok, pytest', pytest.__version__)" 2>&1 | tail -1
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
$P -c "import hydra, grow, pytest" || exit 3   # a broken setup ends here, in seconds
timeout -k 10 "$LIMIT" $P scripts/gpu_check.py --out "$OUT/gpu_check.json" --deadline $((LIMIT - 40)) "${ARGS[@]}" \
  > "$OUT/gpu_check.log" 2>&1   # no check starts in the last 40 s; the JSON's pass flags are written after every check
echo "gpu_check exit $?"
tail -40 "$OUT/gpu_check.log"
