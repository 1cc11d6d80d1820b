#!/usr/bin/env bash
# sge-up.sh (the project's test fixture): idempotently install, configure and start a
# single-node Grid Engine (Debian's Son of Grid Engine 8.1.9: sge_qmaster + sge_execd)
# on Debian 12 without systemd, as root.
#
#   sudo ./sge-up.sh            # install (if needed), configure, start, smoke-test
#
# Environment knobs (all optional):
#   SGE_GPUS     the host's consumable `gpu` complex (default 4)
#   SGE_SLOTS    slots the host and the queue declare (default 8: more than these
#                2-core machines have, so that several pilots run at once)
#   SGE_QUEUE    the queue's name (default gpu.q)
#   SGE_PROJECT  a project jobs may name with -P (default ctxproj)
#   SGE_SMOKE    1 = submit one job with -l gpu=1 at the end and wait for its accounting
#                record (default 1)
#
# Daemons write their own pid files: /var/spool/gridengine/qmaster/qmaster.pid and
# /run/gridengine/execd.pid (through SGE_EXECD_PIDFILE). sge-down.sh stops them by
# those PIDs. Re-running is safe: running daemons are left alone, the configuration is
# applied again (qconf -M* of the same values changes nothing).
#
# Grid Engine facts this script relies on (measured on these machines):
# - qmaster and every client compare the name a connection's IP resolves to with the
#   name the client sends; where the host's name resolves to 127.0.0.1 whose first
#   name is "localhost", every qconf fails with "access denied (client IP resolved to
#   host name "localhost". This is not identical to clients host name ...)". The
#   cell's host_aliases file maps that name to the host's own (no /etc/hosts change).
# - The default global configuration refuses jobs of users below uid 1000 (min_uid):
#   the tests submit as root.
# - The queue template's load_thresholds (np_load_avg=1.75) put a queue of a loaded
#   2-core machine in alarm state, and the scheduler's job_load_adjustments add load
#   for every job it starts: both off, or pilots stay pending.
# - The scheduler runs every 15 s by default: every second here, and at once after a
#   submission or a job's end (flush_submit_sec, flush_finish_sec).
# - Accounting is on in Debian's default configuration but flushed every 15 s: flushed
#   at once here, so that qacct knows a job as soon as it has ended.
set -euo pipefail

T_START=$(date +%s%N)
el() { local ms=$(( ($(date +%s%N) - T_START) / 1000000 )); printf '%3d.%02ds' $((ms / 1000)) $((ms % 1000 / 10)); }
log() { echo "[sge-up $(el)] $*"; }
die() { echo "[sge-up $(el)] ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"

SGE_GPUS=${SGE_GPUS:-4}
SGE_SLOTS=${SGE_SLOTS:-8}
SGE_QUEUE=${SGE_QUEUE:-gpu.q}
SGE_PROJECT=${SGE_PROJECT:-ctxproj}
SGE_SMOKE=${SGE_SMOKE:-1}
export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
COMMON=$SGE_ROOT/$SGE_CELL/common
SPOOL=/var/spool/gridengine
QMASTER_PID=$SPOOL/qmaster/qmaster.pid
RUN_DIR=/run/gridengine
export SGE_EXECD_PIDFILE=$RUN_DIR/execd.pid
UTILBIN=/usr/lib/gridengine

# q ARGS: qconf, its chatter ("root@vm modified ...", on stderr) kept unless it fails.
q() { local out; out=$(qconf "$@" 2>&1) || die "qconf $*: $out"; }

# pid_alive PIDFILE COMM -> prints pid and returns 0 if the pid file points to a
# live process whose /proc/PID/comm equals COMM.
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
  pid=$(pid_alive "$1" "$2") || return 0
  kill -TERM "$pid"
  for _ in $(seq 1 300); do pid_alive "$1" "$2" >/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}
wait_pid() {  # wait_pid PIDFILE COMM -> pid of the freshly started daemon
  local pid
  for _ in $(seq 1 100); do pid=$(pid_alive "$1" "$2") && { echo "$pid"; return 0; }; sleep 0.1; done
  return 1
}

# ---------------------------------------------------------------- 1. install
H=$(hostname)
need_install=0
for b in /usr/lib/gridengine/sge_qmaster /usr/lib/gridengine/sge_execd /usr/lib/gridengine/qsub; do
  [ -x "$b" ] || need_install=1
done
if [ $need_install = 1 ]; then
  log "installing gridengine-master gridengine-exec gridengine-client (master $H)"
  APT_LOG=$(mktemp -t sge-up-apt.XXXXXX)
  # The packages ask (debconf) whether to configure the cell automatically, its name
  # and the master host: answered here. The master's postinst then creates the cell
  # (spool database, global configuration, complexes) as sgeadmin.
  for p in gridengine-common gridengine-master gridengine-exec gridengine-client; do
    printf '%s shared/gridengineconfig boolean true\n' "$p"
    printf '%s shared/gridenginecell string %s\n' "$p" "$SGE_CELL"
    printf '%s shared/gridenginemaster string %s\n' "$p" "$H"
  done | debconf-set-selections
  export DEBIAN_FRONTEND=noninteractive
  # gridengine-common depends on mailx: mailutils provides it without a mail daemon
  # (bsd-mailx, apt's first choice, pulls in exim4). postinst scripts try to start the
  # daemons; policy-rc.d blocks that in containers, and this script starts them.
  PKGS="mailutils gridengine-master gridengine-exec gridengine-client"
  # Wait for dpkg's lock rather than fail where another installation runs.
  APT="apt-get -o DPkg::Lock::Timeout=300"
  if ! $APT install -y --no-install-recommends $PKGS >"$APT_LOG" 2>&1; then
    log "apt-get install failed; running apt-get update and retrying"
    $APT update >>"$APT_LOG" 2>&1
    $APT install -y --no-install-recommends $PKGS >>"$APT_LOG" 2>&1 \
      || die "apt-get install failed, see $APT_LOG"
  fi
  log "install done"
else
  log "packages already installed"
fi

# ---------------------------------------------------------------- 2. the cell
if [ ! -e $SPOOL/spooldb/sge ]; then
  # A purged cell (sge-down.sh --purge): create it again as the package did.
  log "creating the cell's spool database"
  install -d -o sgeadmin -g sgeadmin -m 755 $SPOOL $SPOOL/qmaster $SPOOL/qmaster/job_scripts \
    $SPOOL/spooldb $SPOOL/execd $SGE_ROOT $SGE_ROOT/$SGE_CELL $COMMON
  [ -e $COMMON/bootstrap ] || install -m0644 -o sgeadmin -g sgeadmin /usr/share/gridengine/default-bootstrap $COMMON/bootstrap
  runuser -u sgeadmin -- /usr/share/gridengine/scripts/init_cluster $SGE_ROOT $SGE_CELL $SPOOL/spooldb sgeadmin >/dev/null \
    || die "init_cluster failed"
fi
echo "$H" > $COMMON/act_qmaster
chown sgeadmin:sgeadmin $COMMON/act_qmaster
# Host names: see the header. The address the host's name resolves to must resolve
# back to the same name, or to an alias of it.
addr=$(getent ahostsv4 "$H" | awk 'NR == 1 {print $1}')
[ -n "$addr" ] || die "the host name $H does not resolve (add it to /etc/hosts)"
back=$(getent hosts "$addr" | awk 'NR == 1 {print $2}')
if [ -n "$back" ] && [ "$back" != "$H" ]; then
  want="$H $back"
  log "host names: $H resolves to $addr, which resolves back to $back: host_aliases '$want'"
else
  want=""
fi
if [ "$(cat $COMMON/host_aliases 2>/dev/null)" != "$want" ]; then
  if [ -n "$want" ]; then echo "$want" > $COMMON/host_aliases; else rm -f $COMMON/host_aliases; fi
  # Daemons read the aliases when they start (a package's init script may have
  # started them before): restart them.
  stop_pid "$SGE_EXECD_PIDFILE" sge_execd
  stop_pid $QMASTER_PID sge_qmaster
fi
[ "$($UTILBIN/gethostbyaddr -aname "$addr" 2>/dev/null)" = "$H" ] \
  || die "Grid Engine resolves $addr to '$($UTILBIN/gethostbyaddr -aname "$addr" 2>&1)', not $H"

# ---------------------------------------------------------------- 3. qmaster
qmaster_started=0
if pid=$(pid_alive $QMASTER_PID sge_qmaster); then
  log "sge_qmaster already running (pid $pid)"
else
  qmaster_started=1
  /usr/sbin/sge_qmaster || die "sge_qmaster failed to start, see $SPOOL/qmaster/messages"
  pid=$(wait_pid $QMASTER_PID sge_qmaster) || die "sge_qmaster exited, see $SPOOL/qmaster/messages"
  log "sge_qmaster started (pid $pid)"
fi
for _ in $(seq 1 100); do qconf -sh >/dev/null 2>&1 && break; sleep 0.1; done
qconf -sh >/dev/null || die "qmaster not answering: $(qconf -sh 2>&1 | head -1)"

# ---------------------------------------------------------------- 4. configuration
CONF=$(mktemp -d -t sge-up-conf.XXXXXX)
trap 'rm -rf "$CONF"' EXIT
# Global configuration: Debian's default, with the changes the header explains.
grep -v -e '^#' -e '^conf_version' /usr/share/gridengine/default-configuration | sed \
  -e 's/^min_uid .*/min_uid 0/' -e 's/^min_gid .*/min_gid 0/' \
  -e 's/^load_report_time .*/load_report_time 00:00:05/' \
  -e 's/^reporting_params .*/reporting_params accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00 accounting_flush_time=00:00:00/' \
  > "$CONF/global"
q -Mconf "$CONF/global"
qconf -ssconf | sed \
  -e 's/^schedule_interval .*/schedule_interval 0:0:1/' \
  -e 's/^flush_submit_sec .*/flush_submit_sec 1/' \
  -e 's/^flush_finish_sec .*/flush_finish_sec 1/' \
  -e 's/^job_load_adjustments .*/job_load_adjustments NONE/' \
  -e 's/^load_adjustment_decay_time .*/load_adjustment_decay_time 0:0:0/' > "$CONF/sched"
q -Msconf "$CONF/sched"
# The consumable: a job's -l gpu=N is booked against the host's complex_values.
if ! qconf -sc | grep -q '^gpu '; then
  { qconf -sc | grep -v '^#'; echo "gpu gpu INT <= YES YES 0 0"; } > "$CONF/complex"
  q -Mc "$CONF/complex"
fi
cat > "$CONF/pe" <<'EOF'
pe_name            smp
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $pe_slots
control_slaves     FALSE
job_is_first_task  TRUE
urgency_slots      min
accounting_summary FALSE
qsort_args         NONE
EOF
if qconf -spl 2>/dev/null | grep -qx smp; then q -Mp "$CONF/pe"; else q -Ap "$CONF/pe"; fi
if ! qconf -sprjl 2>/dev/null | grep -qx "$SGE_PROJECT"; then
  printf 'name %s\noticket 0\nfshare 0\nacl NONE\nxacl NONE\n' "$SGE_PROJECT" > "$CONF/project"
  q -Aprj "$CONF/project"
fi
qconf -ss 2>/dev/null | grep -qx "$H" || q -as "$H"
cat > "$CONF/host" <<EOF
hostname              $H
load_scaling          NONE
complex_values        gpu=$SGE_GPUS,slots=$SGE_SLOTS
user_lists            NONE
xuser_lists           NONE
projects              NONE
xprojects             NONE
usage_scaling         NONE
report_variables      NONE
EOF
if qconf -sel 2>/dev/null | grep -qx "$H"; then q -Me "$CONF/host"; else q -Ae "$CONF/host"; fi
# The queue: the template's values but for these (the shell stays the template's
# /bin/sh in posix_compliant mode, as on many sites: a job's #! line is ignored).
# (qconf -aq exits 1 once the editor leaves the template unchanged)
{ EDITOR=cat qconf -aq 2>/dev/null || true; } | sed \
  -e "s/^qname .*/qname $SGE_QUEUE/" -e "s/^hostlist .*/hostlist $H/" \
  -e 's/^load_thresholds .*/load_thresholds NONE/' -e 's/^pe_list .*/pe_list smp/' \
  -e "s/^slots .*/slots $SGE_SLOTS/" > "$CONF/queue"
grep -q "^qname $SGE_QUEUE" "$CONF/queue" || die "no queue template from qconf -aq"
if qconf -sql 2>/dev/null | grep -qx "$SGE_QUEUE"; then q -Mq "$CONF/queue"; else q -Aq "$CONF/queue"; fi
log "configured: queue $SGE_QUEUE on $H, $SGE_SLOTS slots, consumable gpu=$SGE_GPUS, PE smp, project $SGE_PROJECT, accounting"

if [ $qmaster_started = 1 ]; then
  # Jobs the spool recovered from an earlier run hold slots and GPUs: delete them.
  stale=$(qstat -u '*' 2>/dev/null | awk 'NR > 2 {print $1}' | tr '\n' ' ')
  if [ -n "${stale// /}" ]; then log "deleting jobs recovered from the spool: $stale"; qdel -f $stale >/dev/null 2>&1 || true; fi
fi

# ---------------------------------------------------------------- 5. execd
install -d -o sgeadmin -g sgeadmin -m 755 $RUN_DIR
if pid=$(pid_alive $SGE_EXECD_PIDFILE sge_execd); then
  log "sge_execd already running (pid $pid)"
else
  /usr/sbin/sge_execd || die "sge_execd failed to start, see $SPOOL/execd/*/messages"
  pid=$(wait_pid $SGE_EXECD_PIDFILE sge_execd) || die "sge_execd exited, see $SPOOL/execd/*/messages"
  log "sge_execd started (pid $pid)"
fi
# The queue instance is usable once the execd has reported its load.
state=""
for _ in $(seq 1 300); do
  state=$(qstat -f -q "$SGE_QUEUE@$H" 2>/dev/null | awk -v q="$SGE_QUEUE@$H" '$1 == q {print ($6 == "" ? "ok" : $6)}')
  [ "$state" = ok ] && break
  sleep 0.1
done
[ "$state" = ok ] || { qstat -f >&2; die "queue $SGE_QUEUE@$H not usable (state '$state'), see $SPOOL/execd/*/messages"; }
log "queue $SGE_QUEUE@$H is up"

# ---------------------------------------------------------------- 6. smoke test
if [ "$SGE_SMOKE" = 1 ]; then
  job=$(cd /tmp && echo 'echo "$JOB_ID"' | timeout 60 qsub -terse -sync y -o /dev/null -j y -S /bin/sh \
        -N sge-up-smoke -l gpu=1,h_rt=60 -q "$SGE_QUEUE" -P "$SGE_PROJECT") \
    || die "smoke job failed: $job"
  job=$(echo "$job" | head -1)
  for _ in $(seq 1 50); do qacct -j "$job" >/dev/null 2>&1 && break; sleep 0.1; done
  qacct -j "$job" >/dev/null 2>&1 || die "smoke job $job ran but qacct does not know it"
  log "smoke: job $job (-l gpu=1 -P $SGE_PROJECT) ran and is in qacct"
fi
log "Grid Engine is up: $(qhost -F gpu -h "$H" | grep -o 'gpu=[0-9]*') on $H, queue $SGE_QUEUE"
