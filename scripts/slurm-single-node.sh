#!/usr/bin/env bash
# Single-node Slurm on localhost (Debian 12 packages, Slurm 22.05), as root, without systemd or cgroups.
# Used by .ci/run and by tests/clusters to run Snakemake's Slurm executor against a real scheduler.
#
# Usage:  bash scripts/slurm-single-node.sh            # munge + slurmctld + slurmd, no accounting
#         WITH_DBD=1 bash scripts/slurm-single-node.sh # + MariaDB + slurmdbd, so sacct/sacctmgr work
#         SITE=1 bash scripts/slurm-single-node.sh     # + the site shape below (implies WITH_DBD=1)
#         bash scripts/slurm-single-node.sh stop       # stop the daemons this script started
# Env:    FAKE_GPUS=1 (default) declares one fake GPU (gres gpu:1 backed by /dev/null) so GPU requests schedule;
#         MEM_MB (default: 8000, capped by `slurmd -C`) is the node's schedulable memory;
#         SKIP_INSTALL=1 skips apt-get (the default when the daemons are already installed).
# The accounting account is `ciacct`; jobs submitted by root charge it by default.
#
# SITE=1 shapes the cluster like a university GPU cluster, for the preflight's questions to Slurm
# (tests/clusters/test_site_slurm.py): accounts, limits and QoS enforced (AccountingStorageEnforce); account
# `grail-lab` beside `ciacct` for root; QoS `grail-gpu` (MaxWall 24 h, at most 8 GPUs a user, over-limit jobs refused:
# DenyOnLimit); partitions `gpu` (MaxTime 24 h) and `cpu` (MaxTime 3 days) beside the default `debug`; the node
# declared as a GPU node (64 CPUs, 512 GB, GRES gpu:a100:4 on dummy device files, features a100,gpu80gb), more than
# the machine has (SlurmdParameters=config_overrides: nothing runs on what is not there, sbatch --test-only asks);
# reservation `grail-resv` of 8 cores for root (FLEX: its jobs start now and may use the rest); a job above its partition's
# limits is refused at submission (EnforcePartLimits=ALL). Jobs that name none of these run as before.
set -euo pipefail
SITE=${SITE:-0}
WITH_DBD=${WITH_DBD:-0}
[ "$SITE" = 1 ] && WITH_DBD=1
FAKE_GPUS=${FAKE_GPUS:-1}

if [ "${1:-}" = stop ]; then
  for pidfile in /run/slurmd.pid /run/slurmctld.pid /run/slurmdbd.pid; do
    if [ -f "$pidfile" ]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
  exit 0
fi

t0=$(date +%s)
packages="slurmctld slurmd slurm-client munge"
[ "$WITH_DBD" = 1 ] && packages="$packages slurmdbd mariadb-server"
missing=""
for package in $packages; do dpkg -s "$package" >/dev/null 2>&1 || missing="$missing $package"; done
if [ -n "$missing" ] && [ "${SKIP_INSTALL:-0}" != 1 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086  # a list of package names
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi

# --- munge ---------------------------------------------------------------
if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create --keyfile=/etc/munge/munge.key
  chown munge:munge /etc/munge/munge.key
  chmod 600 /etc/munge/munge.key
fi
install -d -o munge -g munge -m 0755 /run/munge
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
munge -n | unmunge >/dev/null

# --- slurm.conf ----------------------------------------------------------
real_mem=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
MEM_MB=${MEM_MB:-8000}
[ "$MEM_MB" -gt "$real_mem" ] && MEM_MB=$real_mem  # a node declaring more than it has goes INVALID
install -d /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
if [ "$WITH_DBD" = 1 ]; then
  accounting="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
AccountingStorageTRES=gres/gpu
$([ "$SITE" = 1 ] && echo "AccountingStorageEnforce=associations,limits,qos")
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
else
  accounting="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi
gres_node=""
gres_types=""
if [ "$SITE" = 1 ]; then
  for index in 0 1 2 3; do  # a device file per GPU: the character device of /dev/null under another name
    [ -e "/dev/grail-fake-gpu$index" ] || mknod -m 666 "/dev/grail-fake-gpu$index" c 1 3
  done
  gres_node="Gres=gpu:a100:4 Features=a100,gpu80gb"
  gres_types="GresTypes=gpu"
  echo 'NodeName=localhost Name=gpu Type=a100 File=/dev/grail-fake-gpu[0-3]' >/etc/slurm/gres.conf
elif [ "$FAKE_GPUS" = 1 ]; then
  gres_node="Gres=gpu:1"
  gres_types="GresTypes=gpu"
  echo 'NodeName=localhost Name=gpu File=/dev/null' >/etc/slurm/gres.conf
fi
node="CPUs=$(nproc) RealMemory=$MEM_MB"
site_partitions=""
if [ "$SITE" = 1 ]; then
  node="CPUs=64 Sockets=2 CoresPerSocket=32 ThreadsPerCore=1 RealMemory=512000"
  site_partitions="SlurmdParameters=config_overrides
EnforcePartLimits=ALL
PartitionName=gpu Nodes=localhost MaxTime=1-00:00:00 State=UP
PartitionName=cpu Nodes=localhost MaxTime=3-00:00:00 State=UP"
fi
cat >/etc/slurm/slurm.conf <<EOF
ClusterName=ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
$accounting
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
$gres_types
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
# at least 3x Snakemake's --slurm-init-seconds-before-status-checks, so squeue still knows finished jobs
MinJobAge=300
KillWait=5
Waittime=0
NodeName=localhost NodeHostname=localhost $node $gres_node State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
$site_partitions
EOF

# --- optional accounting -------------------------------------------------
if [ "$WITH_DBD" = 1 ]; then
  pgrep -x mariadbd >/dev/null || service mariadb start >/dev/null
  mariadb -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db;
    CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurmpw';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
  cat >/etc/slurm/slurmdbd.conf <<'EOF'
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
LogFile=/var/log/slurm/slurmdbd.log
PidFile=/run/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
EOF
  chmod 600 /etc/slurm/slurmdbd.conf
  pgrep -x slurmdbd >/dev/null || /usr/sbin/slurmdbd
  # the first start creates the tables (about 15 s)
  for _ in $(seq 60); do sacctmgr -n list cluster >/dev/null 2>&1 && break; sleep 0.5; done
  sacctmgr -i add cluster ci >/dev/null || true
  sacctmgr -i add account ciacct Description=ci Organization=ci >/dev/null || true
  sacctmgr -i add user root DefaultAccount=ciacct >/dev/null || true
fi

# --- daemons -------------------------------------------------------------
pgrep -x slurmctld >/dev/null || /usr/sbin/slurmctld
for _ in $(seq 40); do scontrol ping >/dev/null 2>&1 && break; sleep 0.5; done

if [ "$SITE" = 1 ] && ! sacctmgr -n -P list qos format=name 2>/dev/null | grep -qx grail-gpu; then
  # The QOS limits gres/gpu, a TRES the database knows only once slurmctld has registered its
  # AccountingStorageTRES: on a fresh database, adding it before that fails ("no TRES known by type gres/gpu").
  for _ in $(seq 60); do sacctmgr -n -P list tres 2>/dev/null | grep -q '^gres|gpu|' && break; sleep 0.5; done
  sacctmgr -i add qos grail-gpu MaxWall=1-00:00:00 MaxTRESPerUser=gres/gpu=8 Flags=DenyOnLimit >/dev/null
  sacctmgr -i add account grail-lab Description=site Organization=site >/dev/null || true
  sacctmgr -i add user root Account=grail-lab >/dev/null || true
  sacctmgr -i modify user root set QOS=normal,grail-gpu DefaultQOS=normal >/dev/null
fi

pgrep -x slurmd >/dev/null || /usr/sbin/slurmd -N localhost
for _ in $(seq 60); do [ "$(sinfo -h -n localhost -o %T 2>/dev/null)" = idle ] && break; sleep 0.5; done
if [ "$SITE" = 1 ] && ! scontrol show reservation grail-resv >/dev/null 2>&1; then
  # it starts in a year, so the node stays idle for the jobs that name no reservation; FLEX lets its jobs start now
  scontrol create reservation ReservationName=grail-resv Users=root StartTime=now+365days Duration=1-00:00:00 \
    Nodes=localhost CoreCnt=8 Flags=FLEX >/dev/null
fi
sinfo
[ "$(sinfo -h -n localhost -o %T)" = idle ] || { echo "slurm node not idle" >&2; exit 1; }
echo "slurm ready in $(($(date +%s) - t0)) s"
