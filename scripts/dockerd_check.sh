#!/usr/bin/env bash
# Between the test runs (scripts/test.sh): say what state the parallel run left the machine in, and make sure the
# Docker daemon answers before the exclusive tests, which need it (the 128-open storm, the dockerd restarts).
#
# Why: a CI run's parallel half once ran 2.5 times its usual time and left a dockerd that answered nothing, not
# even /_ping, for minutes; every exclusive test then failed on it, and the log said nothing of why. So this prints
# the machine's load, memory pressure, busiest processes and what the parallel run left behind (servers, engines,
# sandboxes, containers), and where dockerd does not answer within DOCKERD_ANSWER_S, the tail of its log; then it
# stops that dockerd (TERM, then KILL) and starts it again through scripts/setup.sh's own step, so the exclusive
# tests meet a daemon as setup leaves one. Exit status 1 only when no answering daemon could be had.
set -uo pipefail
cd "$(dirname "$0")/.."

ANSWER_S=${DOCKERD_ANSWER_S:-30}
LOG=/var/log/tito-dockerd.log
say() { printf '[dockerd-check] %s\n' "$*"; }

answers() { timeout "$ANSWER_S" docker info >/dev/null 2>&1; }

leftovers() {
    # Processes a finished test run should not have left: env servers, vLLM engines, bwrap sandboxes, trainers.
    ps -eo pid,ppid,etimes,pcpu,rss,args --no-headers 2>/dev/null \
        | grep -E 'env_server|EngineCore|vllm|bwrap|python -m trainer' | grep -v -E 'grep|dockerd_check' | cut -c1-200
}

report() {
    say "load: $(cut -d' ' -f1-3 /proc/loadavg); memory available: $(awk '/MemAvailable/ {printf "%.1f GiB", $2/1048576}' /proc/meminfo)"
    # A full disk stalls dockerd's own writes: the data root's free space (default place; `docker info` may hang).
    say "free disk: $(df -h --output=avail,pcent,target / /var/lib/docker 2>/dev/null | tail -n +2 | awk '{printf "%s (%s used) on %s; ", $1, $2, $3}')"
    for p in cpu memory io; do
        [ -r "/proc/pressure/$p" ] && say "pressure $p: $(head -n1 "/proc/pressure/$p")"
    done
    # top's second sample: CPU over the last second (ps's %CPU is the average over a process's whole life).
    say "busiest processes now:"
    top -b -n 2 -d 1 -w 160 -o %CPU 2>/dev/null | awk '/^top -/ {n++} n == 2' | sed -n '7,12p' \
        | sed 's/^/[dockerd-check]   /'
    local left
    left=$(leftovers)
    if [ -n "$left" ]; then
        say "left running by the parallel run (pid ppid age_s %cpu rss_kib command):"
        printf '%s\n' "$left" | sed 's/^/[dockerd-check]   /'
    fi
}

report
T0=$SECONDS
if answers; then
    n=$(timeout "$ANSWER_S" docker ps -aq --filter label=tito.managed=1 2>/dev/null | wc -l)
    say "dockerd answers ($((SECONDS - T0)) s); tito containers left: $n"
    exit 0
fi

say "WARNING: dockerd does not answer 'docker info' within ${ANSWER_S} s; the exclusive tests need it"
say "containerd shims: $(pgrep -c -f containerd-shim 2>/dev/null || true), runsc processes: $(pgrep -c -x runsc 2>/dev/null || true)"
if [ -r "$LOG" ]; then
    say "the last lines of $LOG:"
    tail -n 30 "$LOG" | cut -c1-240 | sed 's/^/[dockerd-check]   /'
fi
# The machine's own OOM kills and hung tasks (a sandbox's memory-cgroup OOM is a test's business, not listed).
(dmesg 2>/dev/null | grep -E 'Out of memory: Killed|blocked for more than' | tail -n 10 | sed 's/^/[dockerd-check]   dmesg: /') || true

[ "$(id -u)" = 0 ] || { say "ERROR: only root can restart dockerd here"; exit 1; }
pid=$(cat /var/run/docker.pid 2>/dev/null || pgrep -xo dockerd || true)
if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet docker 2>/dev/null; then
    say "restarting dockerd through systemd"
    systemctl restart docker || { say "ERROR: systemctl restart docker failed"; exit 1; }
elif [ -z "$pid" ]; then
    say "ERROR: no dockerd process to restart (no /var/run/docker.pid, no dockerd running); see $LOG"
    exit 1
else
    say "stopping dockerd (pid $pid): TERM, then KILL after 60 s"
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && { say "dockerd ignored TERM; KILL"; kill -KILL "$pid"; sleep 2; }
    rm -f /var/run/docker.pid
    # setup.sh is idempotent: with everything built it checks each step in seconds, starts the daemon and checks
    # runsc's registration with it, as it did before the tests (test.sh's exported switches reach it).
    bash scripts/setup.sh >/tmp/tito-dockerd-restart.log 2>&1 || { tail -n 20 /tmp/tito-dockerd-restart.log; say "ERROR: setup could not start dockerd"; exit 1; }
fi
if answers; then
    say "dockerd answers again ($((SECONDS - T0)) s after the check began)"
    exit 0
fi
say "ERROR: dockerd still does not answer after its restart"
exit 1
