#!/usr/bin/env bash
# A one-node SLURM cluster on 127.0.0.1 for the SLURM tests (tests/test_slurm.py): Debian's slurm-wlm
# and munge, a minimal slurm.conf, slurmctld and slurmd. Idempotent: daemons already answering are kept.
# Needs root. Prints the slurm.conf path last; the tests find it at $SLURM_DIR/slurm.conf.
#   SLURM_DIR   where the config, state, spool and logs live (default /tmp/reprocube-slurm)
set -euo pipefail
SLURM_DIR=${SLURM_DIR:-/tmp/reprocube-slurm}
CONF=$SLURM_DIR/slurm.conf
export SLURM_CONF=$CONF

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  apt-get install -y -q slurm-wlm >/dev/null || { apt-get update -q && apt-get install -y -q slurm-wlm >/dev/null; }
fi

# munge: SLURM's authentication. Debian's package makes a key; make one if it is missing.
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- munged --force

if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
  echo "slurm: already running ($CONF)"; echo "$CONF"; exit 0
fi

mkdir -p "$SLURM_DIR"/{state,spool,log}
host=$(hostname -s)
memory_mib=$(awk '/MemTotal/ {print int($2 / 1024) - 1024}' /proc/meminfo)
cat > "$CONF" <<EOF
# Written by scripts/slurm-setup.sh: one node, this host, for tests.
ClusterName=reprocube
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
# A requeued job waits cred_expire + 1 seconds before it may start again (default 120).
AuthInfo=cred_expire=10
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
StateSaveLocation=$SLURM_DIR/state
SlurmdSpoolDir=$SLURM_DIR/spool
SlurmctldPidFile=$SLURM_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_DIR/log/slurmd.log
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# Short waits: a test cluster, not a production one.
KillWait=5
MinJobAge=600
SchedulerParameters=defer_batch=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$memory_mib State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

pkill -x slurmctld 2>/dev/null || true
pkill -x slurmd 2>/dev/null || true
sleep 1
slurmctld -f "$CONF"
slurmd -f "$CONF"
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    echo "slurm: up ($CONF)"; echo "$CONF"; exit 0
  fi
  sleep 1
done
echo "slurm-setup: the node did not come up; see $SLURM_DIR/log/" >&2
sinfo >&2 || true
exit 1
