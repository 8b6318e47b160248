#!/usr/bin/env bash
# make test-cluster (issue 24): a one-node Slurm on this machine (controller and node daemon on
# localhost, 2 CPUs, one partition), the cluster tests against it (pytest -m cluster), then the
# daemons stopped (arguments: a command to run instead of the tests).  Needs root (apt-get, munged, slurmd); installs Debian's slurm-wlm and munge.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
if [ "$(id -u)" != 0 ]; then echo "test-cluster: needs root (it installs slurm-wlm and starts its daemons)"; exit 2; fi
start=$(date +%s)
echo "test-cluster: start $(date -u +%FT%TZ), load average $(cut -d' ' -f1-3 /proc/loadavg)"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q slurm-wlm munge
fi
WORK=${SPECSTUDY_SLURM_DIR:-/tmp/specstudy-slurm}
rm -rf "$WORK"; mkdir -p "$WORK"/{state,spool,log,munge}
CPUS=2
export SLURM_CONF=$WORK/slurm.conf
cat > "$SLURM_CONF" <<CONF
ClusterName=specstudy-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
SlurmctldPort=6917
SlurmdPort=6918
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
KillWait=5
NodeName=localhost CPUs=$CPUS RealMemory=4000 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=60 State=UP
CONF
MUNGE_SOCK=$WORK/munge/munge.socket
cleanup() {
  for pidf in "$WORK/slurmd.pid" "$WORK/slurmctld.pid" "$WORK/munged.pid"; do
    [ -f "$pidf" ] && kill "$(cat "$pidf")" 2>/dev/null || true
  done
  sleep 1
  # a job step of a cancelled job can outlive slurmd (slurmstepd waits for it): this cluster's own
  # processes only, found by their working folder or command line under $WORK
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    [ "$pid" = $$ ] && continue
    if [[ "$(readlink "$p/cwd" 2>/dev/null)" == "$WORK"* ]] || { tr '\0' ' ' < "$p/cmdline"; } 2>/dev/null | grep -qF "$WORK/"; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
  echo "test-cluster: daemons stopped; $(( $(date +%s) - start )) s wall, load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
trap cleanup EXIT
munged --socket="$MUNGE_SOCK" --pid-file="$WORK/munged.pid" --log-file="$WORK/log/munged.log" --seed-file="$WORK/munge/seed" -f
# Slurm's munge plugin reads the socket from AuthInfo
sed -i "s|^AuthType=auth/munge|AuthType=auth/munge\nAuthInfo=socket=$MUNGE_SOCK|" "$SLURM_CONF"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 60); do
  sinfo -h -o %T 2>/dev/null | grep -q idle && break
  scontrol update NodeName=localhost State=RESUME >/dev/null 2>&1 || true
  sleep 1
done
sinfo
sinfo -h -o %T | grep -q idle || { echo "test-cluster: the node never became idle"; tail -20 "$WORK"/log/*.log; exit 1; }
echo "test-cluster: one-node Slurm up after $(( $(date +%s) - start )) s"
# arguments: another command to run against this cluster instead of the tests (e.g. bash)
if [ $# -gt 0 ]; then "$@"; exit $?; fi
# its own basetemp: /tmp/pytest-of-<user> is shared with, and pruned by, other pytest runs
SPECSTUDY_SLURM=1 "$BIN/python" -m pytest -q -rs -m cluster --basetemp="$WORK/pytest" tests/run/test_cluster.py ${PYTEST_ARGS:-}
