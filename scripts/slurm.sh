#!/usr/bin/env bash
# A one-node SLURM on this machine, for the tests (`make test-slurm`) and for trying the launcher by hand.
#
#   scripts/slurm.sh up      install Debian's slurm-wlm and munge if missing (root, apt-get), write the
#                            configs under $GROW_SLURM_DIR and start munged, slurmctld and slurmd;
#                            idempotent: daemons already up are left as they are; a controller it starts
#                            starts clean (slurmctld -c, empty state and spool): a job left by a killed
#                            run (holding the node's CPUs, its step unable to finish) is never recovered
#   scripts/slurm.sh env     the lines to source to use it: eval "$(scripts/slurm.sh env)"
#   scripts/slurm.sh down    stop the daemons by their pid files
#   scripts/slurm.sh status  the daemons' pids, `sinfo` and `squeue`
#   scripts/slurm.sh diagnose  the queue, the jobs' states and reasons, the daemons' last log lines
#
# Everything lives under one directory, $GROW_SLURM_DIR (default /tmp/grow-slurm): configs, the munge
# key, socket and pid file, slurm's state, spool, logs and pid files. No systemd and no cgroups: the
# process tracking is /proc (proctrack/linuxproc), no task binding, no accounting. One node named after
# this host at 127.0.0.1 with this machine's cores and memory, one partition `debug` (the default), no
# GPUs. Nothing listens beyond the loopback's ports $GROW_SLURM_PORT and $GROW_SLURM_PORT+1.
set -euo pipefail

DIR=${GROW_SLURM_DIR:-/tmp/grow-slurm}
PORT=${GROW_SLURM_PORT:-6817}
NODE=$(hostname -s)
CONF=$DIR/etc/slurm.conf
SOCKET=$DIR/munge/munge.socket

die() { echo "error: slurm: $*" >&2; exit 1; }

alive() { [ -f "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

install_packages() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null && return 0
  [ "$(id -u)" = 0 ] || die "slurm-wlm and munge are not installed and this is not root: apt-get install slurm-wlm munge"
  command -v apt-get >/dev/null || die "slurm-wlm and munge are not installed and there is no apt-get"
  echo "slurm: installing slurm-wlm and munge (apt-get)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1 \
    || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq slurm-wlm munge >/dev/null 2>&1; } \
    || die "apt-get install slurm-wlm munge failed"
}

write_configs() {
  mkdir -p "$DIR"/{etc,munge,state,spool,log}
  # munged refuses a socket directory that is not world-executable, and a key not its own with mode 0400
  chmod 0755 "$DIR" "$DIR/munge"
  chown munge:munge "$DIR/munge"
  if [ ! -s "$DIR/munge/munge.key" ]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chown munge:munge "$DIR/munge/munge.key"
  chmod 0400 "$DIR/munge/munge.key"
  local cpus mem
  cpus=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)  # nproc alone obeys OMP_NUM_THREADS (the tests set 1)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 * 9 / 10 ))  # MB, 10% kept for the OS
  cat > "$CONF" <<EOF
# written by scripts/slurm.sh: one node, no systemd, no cgroups
ClusterName=grow
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCKET
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
KillWait=5
InactiveLimit=0
MinJobAge=300
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$NODE Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  # srun, sbatch and slurmd read the same file; slurmd also looks for cgroup.conf beside it only with cgroups
}

start_munge() {
  alive "$DIR/munge/munged.pid" && return 0
  rm -f "$SOCKET" "$SOCKET.lock"
  runuser -u munge -- munged --key-file="$DIR/munge/munge.key" --socket="$SOCKET" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed" \
    --force || die "munged did not start: $(tail -n 3 "$DIR/munge/munged.log" 2>/dev/null)"
}

start_slurm() {
  if ! alive "$DIR/slurmctld.pid"; then
    alive "$DIR/slurmd.pid" && stop_pid "$DIR/slurmd.pid"   # a node daemon from the old state goes with it
    rm -rf "$DIR/state" "$DIR/spool" && mkdir -p "$DIR/state" "$DIR/spool"
    SLURM_CONF=$CONF slurmctld -c -i -f "$CONF" || die "slurmctld did not start: $(tail -n 3 "$DIR/log/slurmctld.log")"
  fi
  if ! alive "$DIR/slurmd.pid"; then
    SLURM_CONF=$CONF slurmd -c -f "$CONF" -N "$NODE" || die "slurmd did not start: $(tail -n 3 "$DIR/log/slurmd.log")"
  fi
  local i state
  for i in $(seq 1 60); do
    state=$(SLURM_CONF=$CONF sinfo -h -N -o %T 2>/dev/null | head -n 1 || true)
    case "$state" in idle*|mixed*|allocated*) return 0 ;; down*|drain*)
      SLURM_CONF=$CONF scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true ;; esac
    sleep 0.5
  done
  die "the node did not come up (state '${state:-none}'): $(tail -n 3 "$DIR/log/slurmd.log")"
}

stop_pid() {
  local f=$1 i
  alive "$f" || { rm -f "$f"; return 0; }
  kill "$(cat "$f" 2>/dev/null)" 2>/dev/null || true
  for i in $(seq 1 40); do alive "$f" || break; sleep 0.25; done
  alive "$f" && kill -9 "$(cat "$f" 2>/dev/null)" 2>/dev/null || true
  rm -f "$f"
}

case "${1:-}" in
  up)
    install_packages
    write_configs
    start_munge
    start_slurm
    echo "slurm: up (node $NODE, partition debug; configs in $DIR)" >&2
    ;;
  env)
    echo "export SLURM_CONF=$CONF"
    ;;
  down)
    stop_pid "$DIR/slurmd.pid"
    stop_pid "$DIR/slurmctld.pid"
    stop_pid "$DIR/munge/munged.pid"
    echo "slurm: down" >&2
    ;;
  status)
    for f in "$DIR/munge/munged.pid" "$DIR/slurmctld.pid" "$DIR/slurmd.pid"; do
      if alive "$f"; then echo "$(basename "$f" .pid): $(cat "$f")"; else echo "$(basename "$f" .pid): not running"; fi
    done
    SLURM_CONF=$CONF sinfo 2>/dev/null || true
    SLURM_CONF=$CONF squeue 2>/dev/null || true
    ;;
  diagnose)
    # what a test prints when a job did not finish: the queue, the jobs and the daemons' last lines
    SLURM_CONF=$CONF squeue -o "%i %T %r %C %N" 2>&1 || true
    SLURM_CONF=$CONF scontrol show job 2>&1 | grep -E "JobId|JobState|Reason|NumCPUs" || true
    for f in "$DIR/log/slurmctld.log" "$DIR/log/slurmd.log" "$DIR/munge/munged.log"; do
      echo "--- $f"; tail -n 15 "$f" 2>/dev/null || true
    done
    ;;
  *)
    echo "usage: scripts/slurm.sh up|env|down|status|diagnose" >&2
    exit 2
    ;;
esac
