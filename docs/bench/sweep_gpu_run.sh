#!/bin/bash
# `make sweep EXP=$SPEC` in one lent GPU window (a bare machine: its python3 has CUDA torch, not hydra): the arms of
# configs/sweep/$SPEC.yaml (gpu-depth unless SPEC names another) not yet committed under docs/runs/$SPEC/, JOBS at
# once, whole seeds first, the window planned to DEADLINE s by the spec's estimate and cut order, no run started
# unless its estimate ends before it, those still running then stopped; the runs (no checkpoints) come back as
# $OUT/$SPEC.tar.gz with the corpus's manifest, beside sweep.log, progress.log and env.log.
# issue 60's window: SPEC=gpu-settle DEADLINE=540 JOBS=4 bash docs/bench/sweep_gpu_run.sh
# Before the call, on the development machine (untracked, travels with the working tree, ~4 MB):
#   cp -r <venv site-packages>/{hydra,omegaconf,antlr4} .dev/site/
# The call: run(command="bash docs/bench/sweep_gpu_run.sh", timeout_s=600). SMOKE=1 runs it on the CPU at toy size
# (SMOKE_ARMS: its arms; SMOKE_BYTES: the corpus read; SMOKE_SET: more --set, e.g. "--set data.val_every=3" where 20 MB hold too few validation
# packages for gpu-settle's data.val_max_share).
export PYTHONPATH=$PWD:$PWD/.dev/site PYTHONUNBUFFERED=1 WANDB_MODE=disabled OMP_NUM_THREADS=1 GROW_CACHE_DIR=/tmp/growcache
P=${P:-python3}; JOBS=${JOBS:-16}; DEADLINE=${DEADLINE:-560}; SPEC=${SPEC:-gpu-depth}
OUT=${OUT:-/tmp/sweep-gpu-out}; S=/tmp/sw; rm -rf "$S"; mkdir -p "$OUT" "$S"
ARGS=($EXTRA)   # EXTRA: more driver arguments (--arms a,b --seeds 1)
[ "$SMOKE" = 1 ] && ARGS=(--seeds 0 --arms "${SMOKE_ARMS:-stack-2to4-25,fixed-L2-w256-b1}" --set trainer.batch_size=8 --set data.max_bytes=${SMOKE_BYTES:-20000000} --set trainer.max_tokens=65536 --set device=cpu ${SMOKE_SET})
{ date -u; git rev-parse HEAD 2>/dev/null; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc --all  # (plain nproc honours OMP_NUM_THREADS=1 above)
  $P -c "import torch, hydra, grow; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"
$P -c "import hydra, grow" || exit 3   # a broken setup ends here, in seconds, not at the deadline
T0=$(date +%s)
( while sleep 15; do
    n=$(grep -l '"complete": true' $S/$SPEC/*/summary.json 2>/dev/null | wc -l)
    echo "$(( $(date +%s) - T0 ))s finished:$n $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)"
  done ) > "$OUT/progress.log" 2>&1 &
PROGRESS=$!
$P scripts/sweep.py "$SPEC" "$S" --jobs "$JOBS" --deadline "$DEADLINE" --no-report "${ARGS[@]}" \
  > "$OUT/sweep.log" 2>&1
echo "sweep exit $? after $(( $(date +%s) - T0 ))s" | tee -a "$OUT/sweep.log"
kill $PROGRESS
mkdir -p $S/corpus && cp $GROW_CACHE_DIR/pysrc-*/*.json $S/corpus/ 2>/dev/null
tar czf "$OUT/$SPEC.tar.gz" --exclude=checkpoints --exclude=tokenizer.json -C "$S" .
tail -30 "$OUT/sweep.log"
