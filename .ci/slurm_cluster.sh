#!/usr/bin/env bash
# A real one-node SLURM cluster on localhost for CI (Debian's slurmctld/slurmd/munge, root, no systemd),
# with one fake GPU (gres on /dev/null) so GPU rules run unmodified.
#   .ci/slurm_cluster.sh start   -> prints the state dir; writes /etc/slurm/slurm.conf
#   .ci/slurm_cluster.sh stop    -> stops every daemon it started (by PID file)
set -euo pipefail
STATE=/tmp/truthflow-slurm
case "${1:-}" in
start)
  # leftovers of an earlier cluster on this machine would make the daemons refuse to start
  for d in slurmd slurmctld munged; do pkill -x "$d" 2>/dev/null || true; done
  sleep 1
  rm -rf "$STATE"; mkdir -p "$STATE"; chmod 755 "$STATE"
  H=$(hostname -s)
  MEM=$(( $(awk '/MemTotal/{print int($2/1024)}' /proc/meminfo) * 85 / 100 ))
  if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      slurmctld slurmd slurm-client munge >/dev/null
  fi
  [ -s /etc/munge/munge.key ] || { mungekey --create; chown munge: /etc/munge/munge.key; }
  install -d -o munge -g munge -m 0755 /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- /usr/sbin/munged
  cp /run/munge/munged.pid "$STATE/munged.pid"
  mkdir -p /etc/slurm "$STATE/state" "$STATE/spool" "$STATE/log"
  cat > /etc/slurm/slurm.conf <<CONF
ClusterName=ci
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/state
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
MpiDefault=none
ReturnToService=2
MinJobAge=300
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
GresTypes=gpu
NodeName=$H NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$MEM Gres=gpu:1 State=UNKNOWN
PartitionName=main Nodes=$H Default=YES MaxTime=INFINITE State=UP
CONF
  echo "NodeName=$H Name=gpu File=/dev/null" > /etc/slurm/gres.conf
  slurmctld
  slurmd
  for _ in $(seq 120); do sinfo -h -o %T 2>/dev/null | grep -qx idle && break; sleep 0.5; done
  sinfo -h -o %T | grep -qx idle || { echo "slurm node did not become idle" >&2; cat "$STATE"/log/*.log >&2; exit 1; }
  timeout 60 srun -N1 hostname >/dev/null
  echo "$STATE"
  ;;
stop)
  for f in "$STATE/slurmd.pid" "$STATE/slurmctld.pid" "$STATE/munged.pid"; do
    [ -s "$f" ] && kill "$(cat "$f")" 2>/dev/null || true
  done
  sleep 1
  # a slurm.conf without its controller makes every later snakemake start probe port 6817 for ~10 s
  rm -f /etc/slurm/slurm.conf /etc/slurm/gres.conf
  ;;
*)
  echo "usage: $0 start|stop" >&2; exit 2;;
esac
