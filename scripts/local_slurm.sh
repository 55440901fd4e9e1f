#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, for gwdet's cluster tests and for trying
# `--launcher slurm` without a real cluster.
#
#   scripts/local_slurm.sh start DIR    start munged, slurmctld and slurmd with everything under DIR
#                                       (config, keys, state, spool, pid files, logs); prints the line
#                                       to run: export SLURM_CONF=DIR/slurm.conf
#   scripts/local_slurm.sh stop DIR     cancel the cluster's jobs, then stop exactly the daemons
#                                       `start DIR` started (by the pid files under DIR)
#   scripts/local_slurm.sh status DIR   say whether the cluster in DIR answers (exit status 0 if so)
#
# `start` is idempotent: with the cluster already up it only prints the export line. SLURM's and
# MUNGE's programs come from the Debian/Ubuntu packages slurm-wlm and munge; when they are missing,
# `start` installs them with apt-get if it runs as root, and otherwise stops with a message saying
# what to install (exit status 3, nothing started). The daemons run as root (SlurmUser=root), without
# systemd, accounting or cgroups. Environment:
#   GWDET_SLURM_PORT   slurmctld's port (default 16817; slurmd uses the next one). Change it to run
#                      two local clusters side by side.
#
# Exit status: 0 done, 1 a daemon did not start (its log is shown), 2 bad usage,
# 3 SLURM/MUNGE not installed and not installable here.
set -euo pipefail

usage() { echo "usage: $0 start|stop|status DIR" >&2; exit 2; }
log() { printf '[local_slurm] %s\n' "$*" >&2; }
die() { printf '[local_slurm] error: %s\n' "$1" >&2; exit "${2:-1}"; }

[ $# -eq 2 ] || usage
action="$1"
mkdir -p "$2" 2>/dev/null || die "cannot create $2" 2
dir="$(cd "$2" && pwd)"
conf="$dir/slurm.conf"
socket="$dir/munge/munge.socket"
port="${GWDET_SLURM_PORT:-16817}"
programs=(munged mungekey slurmctld slurmd sbatch srun squeue scontrol sinfo scancel)

# The pid in a pid file, if that process is alive and runs the named program (a pid reused by an
# unrelated process after a reboot does not count).
running_pid() {
    local file="$1" program="$2" pid
    [ -s "$file" ] || return 1
    pid="$(tr -dc 0-9 < "$file")"
    [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
    tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q "$program" || return 1
    echo "$pid"
}

answers() { [ -f "$conf" ] && SLURM_CONF="$conf" timeout 10 scontrol ping >/dev/null 2>&1; }

missing_programs() {
    local name missing=()
    for name in "${programs[@]}"; do command -v "$name" >/dev/null 2>&1 || missing+=("$name"); done
    echo "${missing[@]:-}"
}

install_packages() {
    local missing
    missing="$(missing_programs)"
    [ -z "$missing" ] && return 0
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        die "SLURM or MUNGE is not installed (missing: $missing). Install the packages slurm-wlm and munge (Debian/Ubuntu, as root: apt-get install -y slurm-wlm munge) and run this again." 3
    fi
    log "installing slurm-wlm and munge with apt-get (missing: $missing)"
    export DEBIAN_FRONTEND=noninteractive
    # The packages' own services are not wanted (no systemd here, and they would use /etc):
    # policy-rc.d exit status 101 tells invoke-rc.d not to start them.
    local policy=/usr/sbin/policy-rc.d made_policy=""
    if [ ! -e "$policy" ]; then printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; made_policy=1; fi
    # Bounded: an unreachable package index fails within minutes instead of hanging CI.
    local apt=(timeout 600 apt-get -o Acquire::Retries=1 -o Acquire::http::Timeout=30 -o Acquire::https::Timeout=30)
    if ! "${apt[@]}" install -y -qq slurm-wlm munge >/dev/null 2>&1; then
        "${apt[@]}" update -qq >/dev/null 2>&1 || true
        "${apt[@]}" install -y -qq slurm-wlm munge >/dev/null 2>&1 || {
            [ -n "$made_policy" ] && rm -f "$policy"
            die "apt-get could not install slurm-wlm and munge (no package index reachable?). Install them by hand and run this again." 3
        }
    fi
    [ -n "$made_policy" ] && rm -f "$policy"
    missing="$(missing_programs)"
    [ -z "$missing" ] || die "after installing slurm-wlm and munge, still missing: $missing" 3
}

write_config() {
    local cpus memory
    cpus="$(nproc)"
    memory="$(free -m | awk '/^Mem:/ {print int($2 * 0.9)}')"
    cat > "$conf" <<EOF
# Written by scripts/local_slurm.sh: a one-node cluster on this machine, state and logs in $dir.
ClusterName=gwdet-local
SlurmctldHost=localhost
SlurmctldPort=$port
SlurmdPort=$((port + 1))
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket,cred_expire=5
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
MailProg=/bin/true
SchedulerParameters=sched_interval=1,bf_interval=1
KillWait=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

# Wait until $1 (a command) succeeds, up to $2 seconds.
wait_for() {
    local deadline=$((SECONDS + $2))
    until eval "$1" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

show_log() { [ -f "$1" ] && tail -n 15 "$1" | sed 's/^/    /' >&2 || true; }

start() {
    if running_pid "$dir/run/slurmctld.pid" slurmctld >/dev/null && answers; then
        log "already running in $dir"
        echo "export SLURM_CONF=$conf"
        return
    fi
    install_packages
    stop_daemons  # whatever is left of an earlier start in DIR (stale pid files, a half-started cluster)
    [ ${#socket} -lt 100 ] || die "DIR is too long for MUNGE's socket path ($socket): choose a shorter DIR" 2
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/run" "$dir/log"
    chmod 755 "$dir/munge"  # MUNGE's clients must reach its socket
    if [ ! -s "$dir/munge/munge.key" ]; then
        mungekey --create --keyfile "$dir/munge/munge.key" >/dev/null
        chmod 600 "$dir/munge/munge.key"
    fi
    write_config

    munged --socket "$socket" --key-file "$dir/munge/munge.key" --pid-file "$dir/run/munged.pid" \
        --log-file "$dir/log/munged.log" --seed-file "$dir/munge/munged.seed" --force \
        || { show_log "$dir/log/munged.log"; die "munged did not start (its log above: $dir/log/munged.log)"; }
    wait_for "[ -S '$socket' ]" 10 || { show_log "$dir/log/munged.log"; die "munged made no socket at $socket"; }

    SLURM_CONF="$conf" slurmctld -f "$conf" \
        || { show_log "$dir/log/slurmctld.log"; die "slurmctld did not start (its log above)"; }
    SLURM_CONF="$conf" slurmd -f "$conf" -N localhost \
        || { show_log "$dir/log/slurmd.log"; die "slurmd did not start (its log above)"; }
    if ! wait_for "SLURM_CONF='$conf' sinfo -h -o %T | grep -qE '^(idle|mixed|allocated)'" 30; then
        show_log "$dir/log/slurmctld.log"
        show_log "$dir/log/slurmd.log"
        die "the node did not become idle within 30 s (logs above, in $dir/log)"
    fi
    log "started in $dir: munged, slurmctld and slurmd ($(SLURM_CONF="$conf" sinfo -h -o '%P %D node(s), %c CPUs, %T'))"
    echo "export SLURM_CONF=$conf"
}

# Stop the daemons by their pid files: SIGTERM to all three at once, then SIGKILL to any still
# running after 10 s. A pid file whose process is gone (or is now another program) is just removed.
stop_daemons() {
    local name pid pids=() names=()
    for name in slurmd slurmctld munged; do
        if pid="$(running_pid "$dir/run/$name.pid" "$name")"; then
            kill -TERM "$pid" 2>/dev/null || true
            pids+=("$pid"); names+=("$name")
        fi
    done
    local i
    for i in "${!pids[@]}"; do
        wait_for "! kill -0 ${pids[$i]}" 10 || { log "${names[$i]} (${pids[$i]}) ignored SIGTERM: killing it"; kill -KILL "${pids[$i]}" 2>/dev/null || true; }
    done
    rm -f "$dir/run/slurmd.pid" "$dir/run/slurmctld.pid" "$dir/run/munged.pid"
}

stop() {
    if answers; then  # jobs first, so no job step outlives the daemons that manage it
        local jobs
        jobs="$(SLURM_CONF="$conf" squeue -h -o %i 2>/dev/null | tr '\n' ' ')"
        if [ -n "${jobs// /}" ]; then
            log "cancelling the cluster's jobs: $jobs"
            # shellcheck disable=SC2086  # one argument per job id
            SLURM_CONF="$conf" scancel $jobs 2>/dev/null || true
            wait_for "[ -z \"\$(SLURM_CONF='$conf' squeue -h -o %i)\" ]" 30 || log "jobs still ending: $(SLURM_CONF="$conf" squeue -h -o '%i %T' | tr '\n' ' ')"
        fi
    fi
    stop_daemons
    log "stopped the cluster in $dir"
}

case "$action" in
    start) start ;;
    stop) stop ;;
    status)
        if answers; then log "running: $(SLURM_CONF="$conf" sinfo -h -o '%P %D node(s) %T')"; echo "export SLURM_CONF=$conf"
        else log "not running in $dir"; exit 1; fi ;;
    *) usage ;;
esac
