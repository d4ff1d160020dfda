#!/usr/bin/env bash
# A one-node SLURM cluster on 127.0.0.1 for the SLURM tests (tests/test_slurm.py): Debian's slurm-wlm,
# munge, slurmdbd on MariaDB (job accounting: submitit asks sacct whether a job failed), a minimal
# slurm.conf, slurmctld and slurmd. Idempotent: a cluster already answering is kept.
# Needs root. Prints the slurm.conf path last; the tests find it at $SLURM_DIR/slurm.conf.
#   SLURM_DIR   where the configs, state, spool and logs live (default /tmp/reprocube-slurm)
set -euo pipefail
SLURM_DIR=${SLURM_DIR:-/tmp/reprocube-slurm}
CONF=$SLURM_DIR/slurm.conf
export SLURM_CONF=$CONF

packages=(slurm-wlm slurmdbd mariadb-server)
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${packages[@]}" >/dev/null || { apt-get update -q && apt-get install -y -q "${packages[@]}" >/dev/null; }
fi

# munge: SLURM's authentication. Debian's package makes a key; make one if it is missing.
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge && chown munge:munge /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- munged --force

if [ -f "$CONF" ] && sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)' && sacct -n -X -j 1 >/dev/null 2>&1; then
  echo "slurm: already running ($CONF)"; echo "$CONF"; exit 0
fi

mkdir -p "$SLURM_DIR"/{state,spool,log}

# MariaDB for slurmdbd, on its Unix socket only.
if ! mariadb-admin ping >/dev/null 2>&1; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  setsid nohup mariadbd --user=mysql --skip-networking > "$SLURM_DIR/log/mariadb.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do mariadb-admin ping >/dev/null 2>&1 && break; sleep 0.5; done
fi
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

# slurmdbd reads slurmdbd.conf beside $SLURM_CONF; it must be private to SlurmUser.
cat > "$SLURM_DIR/slurmdbd.conf" <<END
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
PidFile=$SLURM_DIR/slurmdbd.pid
LogFile=$SLURM_DIR/log/slurmdbd.log
END
chmod 600 "$SLURM_DIR/slurmdbd.conf"

host=$(hostname -s)
memory_mib=$(awk '/MemTotal/ {print int($2 / 1024) - 1024}' /proc/meminfo)
cat > "$CONF" <<END
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
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
# Short waits: a test cluster, not a production one.
KillWait=5
MinJobAge=600
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$memory_mib State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
END

pkill -x slurmctld 2>/dev/null || true
pkill -x slurmd 2>/dev/null || true
pkill -x slurmdbd 2>/dev/null || true
sleep 1
slurmdbd
for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
sacctmgr -n list cluster format=cluster | grep -qw reprocube || sacctmgr -i add cluster reprocube >/dev/null
slurmctld -f "$CONF"
slurmd -f "$CONF"
for _ in $(seq 60); do
  if sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
    sacct -n -X -j 1 >/dev/null || { echo "slurm-setup: sacct does not answer; see $SLURM_DIR/log/slurmdbd.log" >&2; exit 1; }
    echo "slurm: up ($CONF)"; echo "$CONF"; exit 0
  fi
  sleep 1
done
echo "slurm-setup: the node did not come up; see $SLURM_DIR/log/" >&2
sinfo >&2 || true
exit 1
