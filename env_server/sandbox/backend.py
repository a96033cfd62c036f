"""Where sandboxes run: the one small interface every sandbox backend implements.

A backend creates, reaches and removes sandboxes. It knows nothing of sessions, tools or rendering: what runs
inside is always the REPL runtime (`runtime/`), spoken to over a `ReplChannel` with the same protocol whichever
backend started it. Everything above (`Sandbox`, the pools, the environments) is written against this module.

    probe(image)          is the backend usable, and is the image (its root filesystem) there?   [blocking]
    start(config, ...)    one sandbox, started, its REPL ready: a `StartedSandbox`              [async]
    sweep(...)            remove what earlier instances of this server name left behind          [blocking]
    remove_stopped()      remove this instance's stopped sandboxes a failed removal left          [blocking]
    limits_note           which configured limits this backend cannot enforce here, or None
    disk                  the disk it writes per sandbox (disk.py), checked before every start
    stats()               figures for /metrics                                                  [blocking]
    close()

Built in: `docker` (docker/backend.py: one container per sandbox, through dockerd) and `bwrap`
(bwrap/backend.py: one bubblewrap process tree per sandbox over a read-only root filesystem; no daemon, no
root). A third (apptainer, Kubernetes pods) implements the same methods and is named in backends.py.
"""

from __future__ import annotations

import abc
import concurrent.futures
import signal
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from .disk import DiskGuard
from .runtime import repl_protocol as protocol

if TYPE_CHECKING:
    from .channel import ReplChannel
    from .config import SandboxConfig


@dataclass(frozen=True)
class ExitInfo:
    """How a sandbox's REPL ended, as its backend saw it."""

    running: bool  # still running (the REPL closed its channel but lives): the backend kills it
    exit_code: int | None  # None: unknown; 128+N: killed by signal N
    oom_killed: bool = False  # its memory limit's OOM killer ended it


class SandboxHandle(Protocol):
    """One started sandbox, as its backend controls it. Every method blocks: call them in an executor."""

    @property
    def id(self) -> str: ...  # the container id, or the bwrap sandbox's name

    def signal(self, sig: str) -> None:
        """Sends a signal ('SIGINT', 'SIGKILL') to the REPL (SIGKILL: to every process of the sandbox)."""

    def exit_info(self, wait_s: float) -> ExitInfo:
        """Waits up to `wait_s` for the sandbox to end, then says how it ended (killing it if it still runs)."""

    def remove(self) -> bool:
        """Kills every process of the sandbox and removes what it used; False if it was gone already."""


@dataclass
class StartedSandbox:
    handle: SandboxHandle
    calls: ReplChannel  # where requests go
    # The REPL's stdio: it carried the ready line and is the dead-man switch (the REPL exits at its EOF).
    # The same object as `calls` where requests flow over stdio.
    watch: ReplChannel


class SandboxBackend(abc.ABC):
    """The backend of one server instance: its sandboxes carry `server_name` and `instance_id` (labels, cgroup
    names), which is how sweeps tell this instance's from those an earlier instance left."""

    name: ClassVar[str]

    def __init__(self, config: SandboxConfig, *, server_name: str, instance_id: str) -> None:
        self.config = config
        self.server_name = server_name
        self.instance_id = instance_id
        # Set by the first probe, once the backend knows where it writes (its path None where the server cannot see
        # it); until then nothing is checked.
        self.disk: DiskGuard | None = None

    @abc.abstractmethod
    def probe(self, image: str) -> None:
        """Raises BackendUnavailable saying what is missing and how to get it (missing_image=True when only the
        image is)."""

    @abc.abstractmethod
    async def start(self, config: SandboxConfig, *, session_id: str, executor: concurrent.futures.Executor,
                    timeout_s: float) -> StartedSandbox:
        """Starts one sandbox of `config` (its image, limits, timeouts) and waits for its REPL's ready line; a
        failed or cancelled start leaves nothing behind. Raises SandboxError (why), ChannelClosed (the REPL
        died), asyncio.TimeoutError."""

    @abc.abstractmethod
    def sweep(self, *, keep_instance: str | None = None, only_instance: str | None = None) -> int:
        """Removes sandboxes of this server name: all but `keep_instance`'s (start-up), or only `only_instance`'s
        (shutdown). Returns how many it removed."""

    @abc.abstractmethod
    def missing_task_image(self, quoted_image: str) -> str:
        """What to tell a session that asked for a task image (its name, quoted for the message) this backend
        does not have: where it was looked for and how to build it."""

    @property
    def limits_note(self) -> str | None:
        """Which configured limits this backend cannot enforce on this machine and what stands in for them."""
        return None

    @property
    def unenforced_limits(self) -> tuple[str, ...]:
        """The limits (memory, pids, cpu) `limits_note` speaks of."""
        return ()

    def stats(self) -> dict[str, float]:
        """Figures for /metrics, read when scraped: `memory_bytes`, the memory charged to this instance's live
        sandboxes, where the backend can read it cheaply."""
        return {}

    def remove_stopped(self) -> int:
        """Removes this instance's sandboxes that stopped and are still there: removals that failed while the
        backend was unreachable (dockerd restarting). The pool calls it when it recovers; returns how many."""
        return 0

    def check_disk(self) -> None:
        """Raises BackendUnavailable when the backend's disk is nearly full (cheap: one statvfs)."""
        if self.disk is not None:
            self.disk.check()

    def close(self) -> None:
        """Releases the backend's own resources (clients, files); sandboxes are removed by the pool."""


def exit_reason(info: ExitInfo, mem_limit_bytes: int) -> str:
    """A dead REPL's reason, for people, from how its backend saw it end."""
    if info.oom_killed:
        return f"out of memory (limit {mem_limit_bytes / (1 << 20):.0f} MiB)"
    code = info.exit_code
    if info.running:
        return "REPL channel closed while the sandbox was still running"
    if code is None:
        return "sandbox exited (exit status unknown)"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        if name == "SIGSEGV":
            return f"segmentation fault (SIGSEGV, exit code {code})"
        if name == "SIGKILL":
            return f"killed by SIGKILL (exit code {code})"
        return f"killed by {name} (exit code {code})"
    if code == protocol.EXIT_CHANNEL_BROKEN:
        return f"REPL exited with code {code} (its protocol channel was broken by the code)"
    return f"REPL exited with code {code}"
