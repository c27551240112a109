#!/usr/bin/env bash
# A one-node Slurm cluster on this machine for the tests under tests/slurm (docs/launching.md,
# "Testing against a real Slurm"): munged, slurmctld and slurmd, this host's cores and memory,
# state under $LARGEDET_SLURM_DIR (default /tmp/largedet-slurm). Idempotent: a cluster that
# answers `sinfo` is left as it is. Needs root (installs Debian's slurm-wlm and munge where
# they are missing and apt-get works). Exits 0 with a line saying why where it cannot start
# one: the tests then skip, naming the reason.
set -u
DIR=${LARGEDET_SLURM_DIR:-/tmp/largedet-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# largedet one-node test cluster"

say() { echo "start_slurm: $*"; }
give_up() { say "no Slurm cluster: $*"; exit 0; }

cluster_up() { timeout 5 sinfo -h -o %T 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; }

if command -v sinfo >/dev/null && cluster_up; then
    say "a Slurm cluster answers: $(sinfo -h -o '%P %D %T' | head -1)"; exit 0
fi
[ "$(id -u)" = 0 ] || give_up "not root"
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    command -v apt-get >/dev/null || give_up "slurm-wlm and munge are not installed, and there is no apt-get"
    say "installing slurm-wlm and munge"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge) \
        >/dev/null 2>&1 || give_up "apt-get install slurm-wlm munge failed"
fi
if [ -e "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    give_up "$CONF exists and is not this script's: not touching it"
fi

mkdir -p "$DIR/state" "$DIR/spool" /run/munge /var/log/munge /var/lib/munge /etc/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null
if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    runuser -u munge -- /usr/sbin/munged || give_up "munged did not start"
fi

HOST=$(hostname -s)
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512 ))
cat > "$CONF.tmp" <<CONFEND
$MARK (tests/slurm/start_slurm.sh)
ClusterName=largedet
SlurmctldHost=$HOST
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmdLogFile=$DIR/slurmd.log
# track processes by their parents, no cgroups: slurmd confines and kills nothing but its jobs
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobRequeue=1
KillWait=30
MinJobAge=600
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
CONFEND
mv "$CONF.tmp" "$CONF"

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
pid_alive "$DIR/slurmctld.pid" || /usr/sbin/slurmctld || give_up "slurmctld did not start (see $DIR/slurmctld.log)"
pid_alive "$DIR/slurmd.pid" || /usr/sbin/slurmd || give_up "slurmd did not start (see $DIR/slurmd.log)"

deadline=$(( $(date +%s) + 30 ))
until cluster_up; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
        give_up "the node is not up after 30 s: $(sinfo -h -o '%T %E' 2>&1 | head -1)"
    fi
    scontrol update nodename="$HOST" state=resume >/dev/null 2>&1
    sleep 0.5
done
say "one-node cluster up: $(sinfo -h -o '%P %D %c CPUs %T' | head -1)"
