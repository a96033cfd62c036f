"""Sandbox and pool settings. Hardened by default; every limit can be changed, none is off.

`sandbox.backend` picks where sandboxes run: `docker` (a container each, through dockerd) or `bwrap` (a
bubblewrap process tree each, no daemon, no root; its own settings under `sandbox.bwrap`). The limits, the
working directory and the call timeouts are common to both; the settings marked "Docker" only apply there.
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# The image tags scripts/build_images.sh builds; the same variables move both, so several checkouts
# can share one Docker daemon with images of their own.
DEFAULT_IMAGE = os.environ.get("TITO_SANDBOX_IMAGE") or "tito-sandbox-python:latest"
SCIENTIFIC_IMAGE = os.environ.get("TITO_SCIENTIFIC_IMAGE") or "tito-sandbox-scientific:latest"
RUNSC_HOST_PIDS_LIMIT = 4096

BUILD_HINT = (
    "build it with: scripts/build_images.sh sandbox (tito-sandbox-python; or: docker build -f "
    "sandbox_images/python/Dockerfile -t tito-sandbox-python:latest . ; offline: add --build-arg "
    "BASE_IMAGE=<local image with python3>), or scripts/build_images.sh scientific (tito-sandbox-scientific)"
)


def parse_bytes(value: str | int) -> int:
    """'512m' -> 536870912 (docker's units: b, k, m, g; binary multiples)."""
    if isinstance(value, int):
        return value
    s = value.strip().lower().removesuffix("b").removesuffix("i")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], 1)
    num = s[:-1] if s[-1:] in ("k", "m", "g") else s
    return int(float(num) * mult)


class BwrapConfig(BaseModel):
    """The bubblewrap backend's own settings (docs/security.md says what each isolates)."""

    model_config = ConfigDict(extra="forbid")

    bwrap_path: str = "bwrap"  # a name on PATH, or a path
    # Where each image's read-only root filesystem lives (<rootfs_dir>/<image name>, built by
    # scripts/build_rootfs.sh). None: $TITO_ROOTFS_DIR, else /var/lib/tito/rootfs as root,
    # else ~/.cache/tito/rootfs.
    rootfs_dir: str | None = None
    # A server running as root starts sandboxes as this unprivileged host user ("uid:gid"), so that nothing in a
    # sandbox is root on the host; an unprivileged server runs them as itself.
    host_user: str = Field("65534:65534", pattern=r"^\d+:\d+$")
    # ...and, unless uid_range_size is 0, each sandbox as a host uid of its own from [uid_range_start,
    # uid_range_start + uid_range_size) (its gid the same number), given back when it is gone: per-user kernel
    # quotas (inotify, POSIX message queues, pipe pages, RLIMIT_NPROC) are then per sandbox (bwrap/uids.py). The
    # default sits above systemd's container range and below 2^31; it must not overlap /etc/subuid's ranges.
    uid_range_start: int = Field(1_900_000_000, gt=0, lt=1 << 32)
    uid_range_size: int = Field(65536, ge=0, lt=1 << 31)
    # Per-sandbox cgroups (pids, memory without swap, CPU) where the server may write them; "off" leaves the
    # limits to rlimits (named in the health detail and /metrics). cgroup_parent: a cgroup the server may write
    # (a v2 path under /sys/fs/cgroup, or a v1 path in each controller's hierarchy); None: found by itself.
    cgroups: Literal["auto", "off"] = "auto"
    cgroup_parent: str | None = None
    seccomp: bool = True  # the system-call filter (sandbox/seccomp); off only to debug
    shm_size: str = "16m"  # /dev/shm, a tmpfs like /tmp

    @field_validator("shm_size")
    @classmethod
    def _valid_size(cls, v: str) -> str:
        if parse_bytes(v) <= 0:
            raise ValueError(f"size must be positive: {v!r}")
        return v


class SandboxConfig(BaseModel):
    """How one sandbox is created and how calls into it are run."""

    model_config = ConfigDict(extra="forbid")

    # Where sandboxes run: "docker" (a container each) or "bwrap" (a bubblewrap process tree each; no daemon,
    # no root; TITO_SANDBOX__BACKEND=bwrap).
    backend: Literal["docker", "bwrap"] = "docker"
    bwrap: BwrapConfig = Field(default_factory=BwrapConfig)

    image: str = DEFAULT_IMAGE
    # None: the image's CMD (python3 -I /opt/tito/repl_server.py).
    command: list[str] | None = None

    # Isolation (network_mode, cap_drop, security_opt, init, runtime: Docker; bwrap always isolates as the
    # defaults do, and refuses settings that would loosen them).
    network_mode: str = "none"
    read_only: bool = True
    # bwrap: the uid:gid inside the sandbox. Docker: every container's uid:gid, but only where uid_range_size is 0.
    user: str = "1000:1000"
    # Docker: each live sandbox container runs as a host uid:gid of its own from [uid_range_start,
    # uid_range_start + uid_range_size), so per-user kernel quotas (inotify, POSIX message queue bytes, pipe
    # pages, RLIMIT_NPROC) are per session (docker/uids.py). 0: all run as `user`, sharing those quotas.
    uid_range_start: int = Field(300_000, ge=1, le=2_000_000_000)
    uid_range_size: int = Field(65_536, ge=0, le=1_000_000)
    cap_drop: list[str] = Field(default_factory=lambda: ["ALL"])
    security_opt: list[str] = Field(default_factory=lambda: ["no-new-privileges"])
    init: bool = True  # docker-init as PID 1: reaps zombies, forwards signals to the REPL
    # The OCI runtime: runc (Docker's default), or runsc to run every sandbox under gVisor's user-space
    # kernel (install: TITO_SANDBOX_RUNTIME=runsc scripts/setup.sh; docs/security.md).
    runtime: str = Field("runc", pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")

    # Resource limits.
    pids_limit: int = Field(64, gt=0)
    mem_limit: str = "512m"
    # Equal to mem_limit: no swap on top of the memory limit.
    memswap_limit: str | None = None
    nano_cpus: int = Field(1_000_000_000, gt=0)  # 1 CPU
    nofile_limit: int = Field(1024, gt=0)

    @property
    def host_pids_limit(self) -> int:
        """The pids limit Docker sets. Under gVisor it counts the user-space kernel's own threads, not the
        sandbox's processes (runsc dies at 64), so there it only bounds the runtime; the sandbox's processes
        are then bounded by mem_limit (a fork bomb is OOM-killed: the session is lost, nothing else)."""
        return self.pids_limit if self.runtime == "runc" else max(self.pids_limit, RUNSC_HOST_PIDS_LIMIT)

    # Filesystem: the only writable places are these tmpfs mounts.
    workdir: str = "/workspace"
    workdir_size: str = "64m"
    tmp_size: str = "16m"
    tmpfs_options: str = "rw,nosuid,nodev"

    # Channel for calls: "socket" (a unix socket in socket_dir, bind-mounted read-only into the
    # sandbox; dockerd is not on the path) or "attach" (the container's stdio through dockerd). A
    # sandbox that cannot reach its socket (server in a container without socket_dir mounted at the
    # same path) falls back to attach by itself. The attach stream always stays open: it carries the
    # ready line and is the dead-man switch.
    channel: Literal["socket", "attach"] = "socket"
    socket_dir: str = "/run/tito"

    # Calls.
    exec_timeout_s: float = Field(30.0, gt=0)
    interrupt_grace_s: float = Field(1.0, gt=0)  # after the REPL's own timeout, before SIGINT
    kill_grace_s: float = Field(2.0, gt=0)  # after SIGINT, before the container is killed
    output_cap_bytes: int = Field(64 * 1024, gt=0)  # per stream, enforced while produced
    value_cap_chars: int = Field(16 * 1024, gt=0)  # repr of the last expression / traceback
    max_code_bytes: int = Field(1024 * 1024, gt=0)

    # Disk (disk.py): no sandbox starts while the backend's disk (Docker's data root; bwrap: the root filesystems')
    # has less free; 0 turns the check off. disk_path: watch this path instead (the data root as this server sees it).
    min_free_disk_mb: int = Field(256, ge=0)
    disk_path: str | None = None

    labels: dict[str, str] = Field(default_factory=dict)  # extra labels on every container
    environment: dict[str, str] = Field(default_factory=dict)

    @field_validator("mem_limit", "workdir_size", "tmp_size")
    @classmethod
    def _valid_size(cls, v: str) -> str:
        if parse_bytes(v) <= 0:
            raise ValueError(f"size must be positive: {v!r}")
        return v

    @model_validator(mode="after")
    def _bwrap_isolates_fully(self) -> "SandboxConfig":
        """The Docker-only settings the bwrap backend cannot honour are refused, not silently ignored."""
        if self.backend != "bwrap":
            return self
        loosened = []
        if self.network_mode != "none":
            loosened.append(f"network_mode={self.network_mode!r} (bwrap sandboxes have loopback only: 'none')")
        if not self.read_only:
            loosened.append("read_only=false (bwrap mounts the root filesystem read-only)")
        if [c.upper() for c in self.cap_drop] != ["ALL"]:
            loosened.append(f"cap_drop={self.cap_drop} (bwrap drops every capability: ['ALL'])")
        if self.runtime != "runc":
            loosened.append(f"runtime={self.runtime!r} (an OCI runtime is a Docker setting)")
        if loosened:
            raise ValueError("sandbox.backend=bwrap cannot apply " + "; ".join(loosened)
                             + ": remove these settings, or use sandbox.backend=docker")
        return self

    @property
    def mem_limit_bytes(self) -> int:
        return parse_bytes(self.mem_limit)

    @property
    def max_reply_bytes(self) -> int:
        """The longest line a sandbox may send: a call's reply (worst-case JSON escaping of its capped outputs),
        or a file operation's (files in base64 within max_code_bytes, the editor's text, a tree's digests: ~100
        bytes a file, 40,000 files in the default 4 MiB)."""
        return max(6 * (2 * self.output_cap_bytes + 2 * self.value_cap_chars), 4 * self.max_code_bytes) + (1 << 16)

    @property
    def effective_memswap_limit(self) -> str:
        return self.memswap_limit or self.mem_limit


class PoolConfig(BaseModel):
    """Warm pool of started containers, each with a ready REPL."""

    model_config = ConfigDict(extra="forbid")

    target_size: int = Field(4, ge=0)  # the floor: warm sandboxes kept however quiet it is
    # The target follows demand: the largest burst of opens (opens within burst_window_s of each other)
    # seen in the last demand_memory_s, up to max_target_size and to half the free memory at
    # mem_per_sandbox_mib each (demand.py). learn_demand=false keeps target_size fixed.
    learn_demand: bool = True
    max_target_size: int = Field(128, ge=0)
    burst_window_s: float = Field(10.0, gt=0)
    demand_memory_s: float = Field(600.0, gt=0)
    mem_per_sandbox_mib: float = Field(16.0, gt=0)
    # Creates in flight for the refill; None: the machine's CPU count (at least 2). Bursts beyond what
    # dockerd can start only queue inside it.
    max_concurrent_creates: int | None = Field(None, gt=0)
    # Opens that find the pool empty start their own sandbox, at most this many at once; the rest queue
    # (first come, first served) for up to admission_timeout_s, then get UNAVAILABLE saying to retry.
    max_concurrent_starts: int = Field(6, gt=0)
    admission_timeout_s: float = Field(120.0, gt=0)
    create_timeout_s: float = Field(30.0, gt=0)  # create+start+ready of one sandbox, queue time excluded
    retry_backoff_s: float = Field(1.0, gt=0)  # after a failed create, doubling up to 30 s
    probe_interval_s: float = Field(5.0, gt=0)  # while not ready: re-check daemon and image
    # Threads for the backend's blocking calls (the Docker SDK; bwrap's spawns and removals).
    docker_threads: int = Field(12, gt=0)
    # Environments on another image than sandbox.image (python_scientific) get a pool of their own this size.
    other_images_target_size: int = Field(1, ge=0)
    # Task images (a session's env_args `image`, allowed by the server's task_images) get a pool at their first
    # open with this floor: cold until demand is learned, then as warm as the largest recent burst.
    task_images_target_size: int = Field(0, ge=0)
