#!/usr/bin/env bash
# Run N copies of one `grow compare` command line at once, then wait for all of them.
#
#   scripts/jobs.sh N grow compare ... hydra.sweep.dir=DIR
#
# The copies share the sweep directory: each arm is trained by the first copy that claims it (grow.compare.claim,
# a flock on <arm dir>/.lock), the others skip it, so N copies train the sweep's arms N at a time. That is how a
# sweep of small models fills one GPU (each copy alone keeps a GPU waiting on its Python between kernels) or a
# many-core CPU (with OMP_NUM_THREADS set so that the copies do not oversubscribe it). Copy i's console goes to
# DIR/jobs/<i>.log; the exit status is the first non-zero one among the copies (0 when all finished). N=1 runs
# the command in the foreground, console and all. The caller rebuilds the report afterwards (`grow compare
# report=DIR`): each copy writes one when it finishes, and the last to finish may not be the last to write.
# JOBS_STAGGER (default 1): seconds between the copies' starts, so that their first claims rarely contend.
set -u
n=${1:-}
shift || true
stagger=${JOBS_STAGGER:-1}
case "$stagger" in ''|.|*[!0-9.]*|*.*.*) echo "error: JOBS_STAGGER='$stagger': allowed a number of seconds >= 0 (between the copies' starts)" >&2; exit 2;; esac
case "$n" in ''|*[!0-9]*|0) echo "error: SWEEP_JOBS='$n': allowed a whole number of at least 1 (copies of the command at once)" >&2; exit 2;; esac
[ $# -gt 0 ] || { echo "usage: scripts/jobs.sh N command ..." >&2; exit 2; }
[ "$n" = 1 ] && exec "$@"
dir=
for a in "$@"; do case "$a" in hydra.sweep.dir=*) dir=${a#hydra.sweep.dir=};; esac; done
[ -n "$dir" ] || { echo "error: scripts/jobs.sh with SWEEP_JOBS=$n needs hydra.sweep.dir=DIR (the directory the copies share)" >&2; exit 2; }
mkdir -p "$dir/jobs"
pids=()
for i in $(seq "$n"); do
  "$@" > "$dir/jobs/$i.log" 2>&1 &
  pids+=($!)
  sleep "$stagger"
done
echo "jobs: $n copies of the command (logs: $dir/jobs/1..$n.log)"
rc=0
for p in "${pids[@]}"; do
  wait "$p"; s=$?
  [ "$rc" = 0 ] && rc=$s
done
exit "$rc"
