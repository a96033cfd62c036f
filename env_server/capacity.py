"""How many sessions this machine holds: `max_sessions: auto` sized from memory, file descriptors, process ids and
the sandbox backend, so that far more opens than fit are answered RESOURCE_EXHAUSTED naming the limit, never a
hang, an OOM-killed daemon or lost container shims.

Per session (measured in docs/scaling.md: 15.4 MiB per typical Docker session, sandbox + shim + server share;
under gVisor about twice that, the sentry and gofer holding the sandbox's memory: 35 MiB against runc's 16.6 in the
same run), budgeted with room to work: `session_memory_mb` (by default 32 MiB, 72 under runsc) of 80 % of the
memory this server may use (the least of MemTotal, its cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) and,
in a Slurm job, the job's memory: SLURM_MEM_PER_NODE, or SLURM_MEM_PER_CPU times SLURM_CPUS_ON_NODE, which binds
even where no cgroup enforces it); 16 file descriptors of the server's RLIMIT_NOFILE (channel, attach stream, pidfds,
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


def _own_cgroup_v1_file(controller: str, name: str) -> int | None:
    """A limit of this process's cgroup v1 `controller`, e.g. memory.limit_in_bytes (unlimited reads as a huge
    number, which MemTotal then bounds)."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if controller in controllers.split(","):
            return _read_int(f"/sys/fs/cgroup/{controller}{path}/{name}")
    return None


def slurm_job_memory(env: dict[str, str] | None = None) -> tuple[int, str] | None:
    """The memory a Slurm job gave this node (bytes) and the variable that said so; None outside a job or where the
    job asked for all of the node (--mem=0)."""
    env = os.environ if env is None else env
    per_node = env.get("SLURM_MEM_PER_NODE", "")
    if per_node.isdigit() and int(per_node) > 0:
        return int(per_node) * MIB, "SLURM_MEM_PER_NODE"
    per_cpu, cpus = env.get("SLURM_MEM_PER_CPU", ""), env.get("SLURM_CPUS_ON_NODE", "")
    if per_cpu.isdigit() and cpus.isdigit() and int(per_cpu) > 0 and int(cpus) > 0:
        return int(per_cpu) * int(cpus) * MIB, "SLURM_MEM_PER_CPU x SLURM_CPUS_ON_NODE"
    return None


def usable_memory(env: dict[str, str] | None = None) -> tuple[int, str]:
    """The memory this server may use (bytes) and, where it is not the machine's, what set it."""
    memory, source = _mem_total(), ""
    for limit, why in ((_own_cgroup_file("memory.max"), "cgroup memory.max"),
                       (_own_cgroup_v1_file("memory", "memory.limit_in_bytes"), "cgroup memory.limit_in_bytes")):
        if limit and limit < memory:
            memory, source = limit, why
    job = slurm_job_memory(env)
    if job and job[0] < memory:
        memory, source = job[0], f"the Slurm job's memory, {job[1]}"
    return memory, source


def _mem_total() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")


def machine_capacity(backend: str, *, session_memory_mb: int, docker_max_containers: int) -> Capacity:
    memory, memory_source = usable_memory()
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
        "memory": f"{MEMORY_SHARE:.0%} of {memory / (1 << 30):.1f} GiB "
                  f"{f'({memory_source}) ' if memory_source else ''}at {session_memory_mb} MiB a session "
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
