"""How many sessions this machine holds: `max_sessions: auto` sized from memory, file descriptors, process ids and
the sandbox backend, so that far more opens than fit are answered RESOURCE_EXHAUSTED naming the limit, never a
hang, an OOM-killed daemon or lost container shims.

Per session (measured in docs/scaling.md: 15.4 MiB per typical Docker session, sandbox + shim + server share;
under gVisor about twice that, the sentry and gofer holding the sandbox's memory: 35 MiB against runc's 16.6 in the
same run), budgeted with room to work: `session_memory_mb` (by default 32 MiB, 72 under runsc) of 80 % of the
memory this server may use (its cgroup's memory.max, else MemTotal); 16 file descriptors of the server's RLIMIT_NOFILE (channel, attach stream, pidfds,
with room) after 1,024 kept for gRPC; 16 process ids of what the kernel and the server's cgroup allow; and with
Docker at most `docker_max_containers` (400: dockerd lost shims at ~450 containers on a 2-core, 24 GiB machine).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
MEMORY_SHARE = 0.8
FDS_PER_SESSION = 16
FDS_RESERVED = 1024
PIDS_PER_SESSION = 16
# session_memory_mb's default by isolation: about twice an idle Python session's measured share.
SESSION_MEMORY_MB = {"runc": 32, "bwrap": 32, "runsc": 72}


def default_session_memory_mb(backend: str, runtime: str) -> int:
    """What `session_memory_mb` is when the config leaves it unset: by the bwrap backend, or Docker's OCI runtime
    (another runtime than runsc is budgeted as runc)."""
    return SESSION_MEMORY_MB["bwrap" if backend == "bwrap" else runtime if runtime in SESSION_MEMORY_MB else "runc"]


@dataclass(frozen=True)
class Capacity:
    limit: int  # sessions admitted at once
    why: str  # what sets it, for the log and the RESOURCE_EXHAUSTED message
    bounds: dict[str, int]  # each resource's own bound ("memory", "fds", "pids", "docker")


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _own_cgroup_file(name: str) -> int | None:
    """A limit of this process's cgroup (v2), e.g. memory.max; None when unset ("max") or not v2."""
    try:
        line = next(l for l in Path("/proc/self/cgroup").read_text().splitlines() if l.startswith("0::"))
    except (OSError, StopIteration):
        return None
    return _read_int(f"/sys/fs/cgroup{line[3:]}/{name}")


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def machine_capacity(backend: str, *, session_memory_mb: int, docker_max_containers: int) -> Capacity:
    memory = _mem_total()
    cgroup_memory = _own_cgroup_file("memory.max")
    if cgroup_memory:
        memory = min(memory, cgroup_memory)
    fds = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    pid_max = _read_int("/proc/sys/kernel/pid_max") or 32768
    cgroup_pids = _own_cgroup_file("pids.max")
    pids = min(pid_max, cgroup_pids) if cgroup_pids else pid_max
    bounds = {
        "memory": int(memory * MEMORY_SHARE) // (session_memory_mb * MIB),
        "fds": max(0, (fds if fds != resource.RLIM_INFINITY else 1 << 20) - FDS_RESERVED) // FDS_PER_SESSION,
        "pids": pids // PIDS_PER_SESSION,
    }
    explain = {
        "memory": f"{MEMORY_SHARE:.0%} of {memory / (1 << 30):.1f} GiB at {session_memory_mb} MiB a session "
                  "(session_memory_mb)",
        "fds": f"RLIMIT_NOFILE {fds} at {FDS_PER_SESSION} a session",
        "pids": f"{pids} process ids at {PIDS_PER_SESSION} a session",
    }
    if backend == "docker":
        bounds["docker"] = docker_max_containers
        explain["docker"] = f"dockerd's practical container count (docker_max_containers={docker_max_containers})"
    binding = min(bounds, key=lambda k: bounds[k])
    limit = max(1, bounds[binding])
    return Capacity(limit, f"auto: {explain[binding]}", bounds)


def session_capacity(max_sessions: int | str, backend: str, *, session_memory_mb: int,
                     docker_max_containers: int) -> Capacity:
    """`max_sessions` as configured ("auto", or a number, which is kept as given)."""
    auto = machine_capacity(backend, session_memory_mb=session_memory_mb, docker_max_containers=docker_max_containers)
    if max_sessions == "auto":
        return auto
    n = int(max_sessions)
    return Capacity(n, f"max_sessions={n}" + (f"; auto would admit {auto.limit} ({auto.why})" if n > auto.limit else ""),
                    auto.bounds)
