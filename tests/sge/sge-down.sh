#!/usr/bin/env bash
# sge-down.sh: stop the single-node Grid Engine started by sge-up.sh.
#   ./sge-down.sh           delete all jobs, stop sge_execd and sge_qmaster (by PID)
#   ./sge-down.sh --purge   ...and delete the cell's spool database, spool directories,
#                           accounting file and host aliases (sge-up.sh creates them again)
# Daemons are found through the pid files they write; a PID is only signalled if
# /proc/PID/comm matches the expected daemon name. No pkill/killall.
set -uo pipefail
PURGE=0; [ "${1:-}" = "--purge" ] && PURGE=1
log() { echo "[sge-down] $*"; }
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
SPOOL=/var/spool/gridengine
QMASTER_PID=$SPOOL/qmaster/qmaster.pid
EXECD_PID=/run/gridengine/execd.pid

pid_alive() {
  local f=$1 comm=$2 pid
  [ -s "$f" ] || return 1
  pid=$( { tr -dc '0-9' < "$f"; } 2>/dev/null )
  [ -n "$pid" ] && [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
  case "$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)" in Z|X|"") return 1;; esac
  echo "$pid"
}
stop_pid() {  # stop_pid PIDFILE COMM
  local pid
  if ! pid=$(pid_alive "$1" "$2"); then log "$2: not running"; return 0; fi
  kill -TERM "$pid"
  for _ in $(seq 1 300); do
    if ! pid_alive "$1" "$2" >/dev/null; then log "$2 (pid $pid) stopped"; return 0; fi
    sleep 0.1
  done
  log "$2 (pid $pid) did not exit after 30 s, sending SIGKILL"; kill -KILL "$pid" 2>/dev/null || true
}
shepherds() {  # live sge_shepherd processes (the parents of running jobs)
  local d left=""
  for d in /proc/[0-9]*; do
    [ "$(cat "$d/comm" 2>/dev/null)" = sge_shepherd ] || continue
    case "$(sed 's/^.*) //' "$d/stat" 2>/dev/null | cut -c1)" in Z|X|"") continue;; esac
    left="$left ${d#/proc/}"
  done
  echo "$left"
}

# 1. delete jobs while qmaster and execd are up, so that their shepherds end them
if pid_alive $QMASTER_PID sge_qmaster >/dev/null && qstat >/dev/null 2>&1; then
  jobs=$(qstat -u '*' 2>/dev/null | awk 'NR > 2 {print $1}' | tr '\n' ' ')
  if [ -n "${jobs// /}" ]; then
    log "deleting jobs: $jobs"; qdel $jobs >/dev/null 2>&1
    for _ in $(seq 1 150); do
      [ -z "$(qstat -u '*' 2>/dev/null)" ] && [ -z "$(shepherds)" ] && break; sleep 0.1
    done
    [ -n "$(qstat -u '*' 2>/dev/null)" ] && qdel -f $jobs >/dev/null 2>&1
  fi
fi
# 2. daemons, the execution daemon first
stop_pid $EXECD_PID sge_execd
stop_pid $QMASTER_PID sge_qmaster
left=$(shepherds)
[ -n "$left" ] && log "WARNING: sge_shepherd processes still alive (PIDs:$left)"

if [ $PURGE = 1 ]; then
  rm -rf $SPOOL/spooldb $SPOOL/qmaster $SPOOL/execd \
         $SGE_ROOT/$SGE_CELL/common/accounting $SGE_ROOT/$SGE_CELL/common/host_aliases
  log "purged the spool database, spool directories, accounting and host aliases"
fi
exit 0
