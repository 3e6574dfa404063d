#!/bin/bash
# Issue 33's sweeps on one GPU: make sweep-one-growth (both growth points) and the learning-rate check (every
# strategy, growth after 45%), float32, on the same tokens as the CPU sweeps (data=bin over the stdlib cache's
# train.bin/val.bin/tokenizer.json). Several invocations of one command line share each sweep directory
# (grow.compare.claim). Everything comes back as $OUT/sweeps.tar.gz (no checkpoints).
# env: DEADLINE (s the workers may run), SMOKE=1 (tiny budgets, for a local check)
export PYTHONPATH=$PWD:$PWD/.dev/site PYTHONUNBUFFERED=1 WANDB_MODE=disabled OMP_NUM_THREADS=1 GROW_CACHE_DIR=/tmp/growcache
P=${P:-python3}
DEADLINE=${DEADLINE:-470}
T45=7190306; T60=8180663; STRATS=msg,vt,zero,stack; SEEDS=0,1,2; N=${N:-5}; NLR=${NLR:-4}
[ "$SMOKE" = 1 ] && { T45=24576; T60=28672; STRATS=msg,zero; SEEDS=0; N=2; NLR=1; }
S=/tmp/sw; rm -rf $S; mkdir -p $S/logs
D="data=bin data.train=[$PWD/.dev/data/train.bin] data.val=[$PWD/.dev/data/val.bin] data.tokenizer=$PWD/.dev/data/tokenizer.json"
COMMON="+experiment=one-growth precision=float32 trainer.progress=false $D"
EF="compare.equal_flops=true compare.equal_flops_sizes=stages"
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1; nproc
  $P -c "import torch, hydra, omegaconf, grow; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"; } > $S/env.log 2>&1
T0=$(date +%s)
launch() {  # name, copies, overrides...
  local name=$1 n=$2; shift 2
  for i in $(seq $n); do
    timeout -s TERM $((DEADLINE - ($(date +%s) - T0))) $P -m grow compare $COMMON "$@" hydra.sweep.dir=$S/$name > $S/logs/$name-$i.log 2>&1 &
    sleep 1
  done
}
done_count() { ls $1/*/summary.json 2>/dev/null | xargs -r grep -l '"complete": true' 2>/dev/null | wc -l; }
launch one-growth-45 $N strategy=$STRATS seed=$SEEDS schedule.first_stage=0.45 trainer.max_tokens=$T45 $EF
launch one-growth-60 $N strategy=$STRATS seed=$SEEDS schedule.first_stage=0.60 trainer.max_tokens=$T60 $EF
launch one-growth-lr $NLR strategy=$STRATS optim.lr=1e-3,1e-2 seed=$SEEDS schedule.first_stage=0.45 trainer.max_tokens=$T45 \
  compare.baseline=false compare.matched_baseline=false $EF
while [ -n "$(jobs -rp)" ]; do
  echo "$(( $(date +%s) - T0 ))s 45:$(done_count $S/one-growth-45) 60:$(done_count $S/one-growth-60) lr:$(done_count $S/one-growth-lr) $(nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader 2>/dev/null)" | tee -a $S/progress.log
  sleep 15
done
echo "all done $(( $(date +%s) - T0 ))s" | tee -a $S/progress.log
tar czf $OUT/sweeps.tar.gz --exclude=checkpoints --exclude=wandb -C /tmp sw
cp $S/progress.log $S/env.log $OUT/
