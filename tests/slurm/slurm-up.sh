#!/usr/bin/env bash
# slurm-up.sh (the project's test fixture, from ../shared/tools): idempotently install, configure and start a single-node SLURM
# cluster (munged + slurmctld + slurmd) on Debian 12 without systemd.
#
#   sudo ./slurm-up.sh            # install (if needed), configure, start, smoke-test
#
# Environment knobs (all optional):
#   SLURM_PKGS      packages to install      (default: minimal set, no recommends)
#   SLURM_FAKE_GPUS fake GPUs of each of two types, 'fakea' and 'fakeb' (default 4;
#                   0 disables GresTypes)
#   SLURM_CPUS      CPUs the node declares (default 8: more than these 2-core machines
#                   have, through SlurmdParameters=config_overrides, so that more than
#                   two pilots run at once)
#   SLURM_MEM_MB    RealMemory of the node   (default 90% of MemTotal)
#   SLURM_PREEMPT   1 = add real preemption: PreemptType=preempt/partition_prio,
#                   PreemptMode=CANCEL and a higher-tier partition 'urgent'; a job
#                   submitted with -p urgent cancels (SIGTERM, then SIGKILL after
#                   KillWait) jobs of the default 'debug' partition (default 0)
#   SLURM_SMOKE     1 = run `srun hostname` + a gres job at the end if the node is idle (default 1)
#   SLURM_KEEP_JOBS 1 = keep jobs recovered from StateSaveLocation when this script
#                   (re)starts slurmctld; default 0 cancels them, because jobs whose
#                   srun/slurmd died (e.g. after kill -9 of the daemons) stay RUNNING
#                   forever (InactiveLimit=0) and hold CPUs.
#
# Daemons write their own pid files: /run/munge/munged.pid, /run/slurmctld.pid,
# /run/slurmd.pid.  slurm-down.sh stops them by those PIDs.
# Re-running is safe: already-running daemons are left alone unless the
# generated config changed, in which case slurmctld/slurmd are restarted.
set -euo pipefail

T_START=$(date +%s%N)
el() { local ms=$(( ($(date +%s%N) - T_START) / 1000000 )); printf '%3d.%02ds' $((ms / 1000)) $((ms % 1000 / 10)); }
log() { echo "[slurm-up $(el)] $*"; }
die() { echo "[slurm-up $(el)] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"

SLURM_PKGS=${SLURM_PKGS:-"slurmctld slurmd slurm-client munge"}
SLURM_FAKE_GPUS=${SLURM_FAKE_GPUS:-4}
SLURM_SMOKE=${SLURM_SMOKE:-1}
SLURM_PREEMPT=${SLURM_PREEMPT:-1}
SLURM_CPUS=${SLURM_CPUS:-8}
SLURM_KEEP_JOBS=${SLURM_KEEP_JOBS:-0}
CONF_DIR=/etc/slurm
STATE_DIR=/var/spool/slurmctld
SPOOL_DIR=/var/spool/slurmd
LOG_DIR=/var/log/slurm
FAKEGPU_DIR=/run/fakegpu

# pid_alive PIDFILE COMM -> prints pid and returns 0 if the pid file points to a
# live process whose /proc/PID/comm equals COMM.
pid_alive() {
  local f=$1 comm=$2 pid
  [ -s "$f" ] || return 1
  pid=$( { tr -dc '0-9' < "$f"; } 2>/dev/null )
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
  # a killed daemon can linger as a zombie until PID 1 reaps it: treat Z/X as dead
  case "$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" in Z|X|"") return 1;; esac
  echo "$pid"
}
wait_pid() {  # wait_pid PIDFILE COMM -> pid of the freshly started daemon
  local pid
  for _ in $(seq 1 100); do pid=$(pid_alive "$1" "$2") && { echo "$pid"; return 0; }; sleep 0.05; done
  return 1
}
stop_pid() {  # stop_pid PIDFILE COMM
  local pid
  pid=$(pid_alive "$1" "$2") || return 0
  kill -TERM "$pid"
  for _ in $(seq 1 100); do pid_alive "$1" "$2" >/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------------- 1. install
need_install=0
for b in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/bin/sbatch /usr/sbin/munged; do
  [ -x "$b" ] || need_install=1
done
if [ $need_install = 1 ]; then
  log "installing: $SLURM_PKGS"
  APT_LOG=$(mktemp -t slurm-up-apt.XXXXXX)
  export DEBIAN_FRONTEND=noninteractive
  # postinst scripts try to start services; policy-rc.d (exit 101) usually blocks
  # that in containers; without systemd they fail harmlessly anyway.
  if ! apt-get install -y --no-install-recommends $SLURM_PKGS >"$APT_LOG" 2>&1; then
    log "apt-get install failed; running apt-get update and retrying"
    apt-get update >>"$APT_LOG" 2>&1
    apt-get install -y --no-install-recommends $SLURM_PKGS >>"$APT_LOG" 2>&1 \
      || die "apt-get install failed, see $APT_LOG"
  fi
  log "install done"
else
  log "packages already installed ($(slurmd -V))"
fi

# ---------------------------------------------------------------- 2. munge
if [ ! -s /etc/munge/munge.key ]; then
  log "creating munge key"
  mkdir -p /etc/munge
  mungekey --create --keyfile=/etc/munge/munge.key --force
fi
chown munge:munge /etc/munge /etc/munge/munge.key; chmod 700 /etc/munge; chmod 600 /etc/munge/munge.key
install -d -o munge -g munge -m 755 /run/munge
install -d -o munge -g munge -m 700 /var/lib/munge /var/log/munge
if pid=$(pid_alive /run/munge/munged.pid munged); then
  log "munged already running (pid $pid)"
else
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2 /run/munge/munge.socket.2.lock
  runuser -u munge -- /usr/sbin/munged
  for _ in $(seq 1 50); do munge -n </dev/null >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null | unmunge >/dev/null || die "munge self-test failed"
  pid=$(wait_pid /run/munge/munged.pid munged) || die "munged not running"
  log "munged started (pid $pid)"
fi

# ---------------------------------------------------------------- 3. config
H=$(hostname -s)
# topology line from slurmd itself (e.g. "CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1")
# the node declares SLURM_CPUS cores on one socket; slurmd accepts more than it finds
# only with SlurmdParameters=config_overrides
TOPO="CPUs=$SLURM_CPUS Boards=1 SocketsPerBoard=1 CoresPerSocket=$SLURM_CPUS ThreadsPerCore=1 "
MEM_TOTAL_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 ))
SLURM_MEM_MB=${SLURM_MEM_MB:-$(( MEM_TOTAL_MB * 90 / 100 ))}
GRES_NODE=""; GRES_TYPES=""
if [ "$SLURM_FAKE_GPUS" -gt 0 ]; then
  # gres/gpu needs one File= per GPU, and it must be a char/block device:
  # symlinks to /dev/null satisfy that (a GPU without File= is silently dropped,
  # and the node then goes INVAL: "gres/gpu count reported lower than configured").
  mkdir -p "$FAKEGPU_DIR"
  for i in $(seq 0 $((2 * SLURM_FAKE_GPUS - 1))); do ln -sfn /dev/null "$FAKEGPU_DIR/gpu$i"; done
  GRES_NODE="Gres=gpu:fakea:$SLURM_FAKE_GPUS,gpu:fakeb:$SLURM_FAKE_GPUS"; GRES_TYPES="GresTypes=gpu"
fi
mkdir -p "$CONF_DIR" "$STATE_DIR" "$SPOOL_DIR" "$LOG_DIR"
TMP_CONF=$(mktemp); TMP_GRES=$(mktemp)
cat > "$TMP_CONF" <<EOF
# generated by slurm-up.sh — single-node test cluster, no cgroups, no slurmdbd
ClusterName=localcluster
SlurmctldHost=$H(127.0.0.1)
SlurmUser=root
SlurmdParameters=config_overrides
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# without a default, a job that does not ask for --mem gets the whole node's memory
DefMemPerCPU=1000
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# finished-job records for 'sacct -c' (there is no slurmdbd, so plain sacct does not work)
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
ReturnToService=2
# scancel: SIGTERM, then SIGKILL after KillWait seconds (default 30)
KillWait=5
StateSaveLocation=$STATE_DIR
SlurmdSpoolDir=$SPOOL_DIR
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
$GRES_TYPES
NodeName=$H NodeAddr=127.0.0.1 ${TOPO}RealMemory=$SLURM_MEM_MB $GRES_NODE State=UNKNOWN
EOF
if [ "$SLURM_PREEMPT" = 1 ]; then cat >> "$TMP_CONF" <<EOF
PreemptType=preempt/partition_prio
PreemptMode=CANCEL
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=urgent Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=2
EOF
else echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$TMP_CONF"; fi
{ echo "AutoDetect=off"
  if [ "$SLURM_FAKE_GPUS" -gt 0 ]; then
    echo "NodeName=$H Name=gpu Type=fakea File=$FAKEGPU_DIR/gpu[0-$((SLURM_FAKE_GPUS - 1))]"
    echo "NodeName=$H Name=gpu Type=fakeb File=$FAKEGPU_DIR/gpu[$SLURM_FAKE_GPUS-$((2 * SLURM_FAKE_GPUS - 1))]"
  fi
  true; } > "$TMP_GRES"
changed=0
if ! cmp -s "$TMP_CONF" "$CONF_DIR/slurm.conf"; then mv "$TMP_CONF" "$CONF_DIR/slurm.conf"; changed=1; else rm -f "$TMP_CONF"; fi
if ! cmp -s "$TMP_GRES" "$CONF_DIR/gres.conf"; then mv "$TMP_GRES" "$CONF_DIR/gres.conf"; changed=1; else rm -f "$TMP_GRES"; fi
chmod 644 "$CONF_DIR/slurm.conf" "$CONF_DIR/gres.conf"
log "config $( [ $changed = 1 ] && echo written || echo unchanged ): node $H ${TOPO}RealMemory=$SLURM_MEM_MB $GRES_NODE"

# ---------------------------------------------------------------- 4. daemons
if [ $changed = 1 ]; then
  stop_pid /run/slurmd.pid slurmd
  stop_pid /run/slurmctld.pid slurmctld
fi
ctld_started=0
if pid=$(pid_alive /run/slurmctld.pid slurmctld); then
  log "slurmctld already running (pid $pid)"
else
  ctld_started=1
  /usr/sbin/slurmctld || die "slurmctld failed to start, see $LOG_DIR/slurmctld.log"
  pid=$(wait_pid /run/slurmctld.pid slurmctld) || die "slurmctld exited, see $LOG_DIR/slurmctld.log"
  log "slurmctld started (pid $pid)"
fi
for _ in $(seq 1 100); do scontrol ping 2>/dev/null | grep -q 'is UP' && break; sleep 0.1; done
scontrol ping | grep -q 'is UP' || die "slurmctld not answering, see $LOG_DIR/slurmctld.log"
if [ $ctld_started = 1 ] && [ "$SLURM_KEEP_JOBS" != 1 ]; then
  stale=$(squeue -h -t pending,running,suspended,completing -o %i | tr '\n' ' ')
  if [ -n "${stale// /}" ]; then log "cancelling jobs recovered from saved state: $stale"; scancel $stale; else stale=""; fi
fi
if pid=$(pid_alive /run/slurmd.pid slurmd); then
  log "slurmd already running (pid $pid)"
else
  /usr/sbin/slurmd || die "slurmd failed to start, see $LOG_DIR/slurmd.log"
  pid=$(wait_pid /run/slurmd.pid slurmd) || die "slurmd exited, see $LOG_DIR/slurmd.log"
  log "slurmd started (pid $pid)"
fi

# ---------------------------------------------------------------- 5. wait for node
if [ -n "${stale:-}" ]; then   # let the cancelled stale jobs finish (KillWait=5)
  for _ in $(seq 1 150); do [ -z "$(squeue -h -j "${stale// /,}" -t running,completing -o %i 2>/dev/null)" ] && break; sleep 0.1; done
fi
state=""
for i in $(seq 1 150); do
  # (not `sinfo -n $H`: after cancelling recovered jobs it kept reporting 'mixed' for 15 s+ on an idle node)
  state=$(scontrol -o show node "$H" 2>/dev/null | grep -o ' State=[^ ]*' | cut -d= -f2 | tr 'A-Z' 'a-z')
  case "$state" in
    idle) break ;;
    mixed|allocated)  # busy with real jobs -> fine; no jobs -> resources of cancelled jobs still being released
      [ -n "$(squeue -h -t running,completing -o %i 2>/dev/null)" ] && break ;;
    *drain*|*down*|*inval*|*fail*)
      # stale DOWN/DRAIN from an earlier run: resume it (once a second)
      [ $((i % 10)) = 1 ] && scontrol update nodename="$H" state=resume 2>/dev/null || true ;;
  esac
  sleep 0.1
done
case "$state" in idle|mixed|allocated) ;; *)
  sinfo -N -o '%N %T %E' >&2; die "node $H not usable (state '$state'), see $LOG_DIR/slurmctld.log";; esac
log "node $H is $state"

# ---------------------------------------------------------------- 6. smoke test
if [ "$SLURM_SMOKE" = 1 ] && [ "$state" != idle ]; then
  log "smoke test skipped: node is $state (jobs running)"
elif [ "$SLURM_SMOKE" = 1 ]; then
  out=$(timeout 30 srun -t 1 -n1 hostname) || die "srun smoke test failed"
  log "smoke: srun hostname -> $out"
  if [ "$SLURM_FAKE_GPUS" -gt 0 ]; then
    out=$(timeout 30 srun -t 1 -n1 --gres=gpu:1 printenv CUDA_VISIBLE_DEVICES) || die "gres smoke test failed"
    log "smoke: srun --gres=gpu:1 -> CUDA_VISIBLE_DEVICES=$out"
  fi
fi
log "SLURM is up: $(sinfo -h -o '%P %a %D %T %N %G' | head -1)"
