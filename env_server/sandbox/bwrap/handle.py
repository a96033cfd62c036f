"""One running bwrap sandbox as the backend holds it: its process tree (held by pidfds), its cgroup and host uid,
and its stderr, logged escaped."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import threading
from pathlib import Path

from ..backend import ExitInfo
from ..errors import SandboxError
from ..logtext import log_safe
from .cgroups import SandboxCgroup
from .uids import UidLease

log = logging.getLogger("env_server.sandbox.bwrap.backend")
_STDERR_KEEP = 8 * 1024


class StderrTail(asyncio.Protocol):
    """The sandbox's stderr (bwrap's own errors, the REPL's diagnostics): logged a line at a time, escaped (a
    sandbox can write there, and must never start a line of the server's log), and its start kept for the
    message of a failed start."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kept = bytearray()
        self._line = bytearray()
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if len(self.kept) >= _STDERR_KEEP:
            return
        chunk = data[: _STDERR_KEEP - len(self.kept)]
        self.kept += chunk
        self._line += chunk
        *lines, rest = self._line.split(b"\n")
        self._line = bytearray(rest)
        for line in lines:
            self._log(line)
        if len(self.kept) >= _STDERR_KEEP:
            self._flush()

    def _log(self, line: bytes) -> None:
        if line.strip():
            log.warning("sandbox %s stderr: %s", self.name, log_safe(line))

    def _flush(self) -> None:
        line, self._line = bytes(self._line), bytearray()
        self._log(line)

    def connection_lost(self, exc: Exception | None) -> None:
        self._flush()
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def text(self) -> str:
        return self.kept.decode("utf-8", "replace").strip()


class BwrapSandbox:
    """One running bwrap sandbox: the backend's `SandboxHandle`. Its methods block (waits, /proc, cgroupfs)."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], cgroup: SandboxCgroup | None,
                 uid: UidLease | None = None) -> None:
        self.id = name
        self.process = process
        self.cgroup = cgroup
        self.uid = uid  # its own host uid (root server), given back once nothing of the sandbox runs
        self._init: _Process | None = None  # the sandbox's pid 1 (the REPL's own init, runtime/repl_init.py)
        self._repl: _Process | None = None
        self._lock = threading.Lock()
        self.removed = False

    def discover(self) -> None:
        """Finds the sandbox's init (the outer bwrap's child) and REPL (the init's first child) once the REPL is
        ready, and holds them by pidfd: a signal can then never reach a process that took a recycled pid."""
        init = _children(self.process.pid)
        self._init = _Process.open(init[0]) if init else None
        repl = _children(init[0]) if init else []
        self._repl = _Process.open(repl[0]) if repl else None

    @property
    def repl_pid(self) -> int | None:
        return self._repl.pid if self._repl is not None else None

    def signal(self, sig: str) -> None:
        if sig == "SIGKILL":
            self._kill_all()
            return
        if self._repl is None or self.process.poll() is not None or not self._repl.send(getattr(signal, sig)):
            raise SandboxError("the sandbox's REPL is not running")

    def _kill_all(self) -> None:
        # The sandbox's pid 1 dies, and with it its whole pid namespace; the outer bwrap then reaps it and exits
        # (so no orphan is left for whoever is pid 1 here to reap). Without the init, the outer bwrap is killed
        # instead: its parent-death signal takes the rest. The cgroup catches anything caught mid-fork.
        if self._init is None or not self._init.send(signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
        if self.cgroup is not None:
            self.cgroup.kill()

    def exit_info(self, wait_s: float) -> ExitInfo:
        try:
            code = self.process.wait(wait_s)
            running = False
        except subprocess.TimeoutExpired:
            running = True
            self._kill_all()
            code = self.process.wait()
        if code < 0:  # the outer bwrap itself was killed by a signal: the shell's convention
            code = 128 - code
        oom = self.cgroup is not None and self.cgroup.oom_kills() > 0
        return ExitInfo(running=running, exit_code=code, oom_killed=oom and code == 128 + signal.SIGKILL)

    def remove(self) -> bool:
        with self._lock:
            if self.removed:
                return False
            self.removed = True
        existed = self.process.poll() is None
        self._kill_all()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:  # the init did not take the outer bwrap with it: kill that too
            self.process.kill()
            self.process.wait()
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.uid is not None:
            self.uid.release()
        for process in (self._init, self._repl):
            if process is not None:
                process.close()
        return existed

    def memory_bytes(self) -> int | None:
        return self.cgroup.memory_bytes() if self.cgroup is not None else None


class _Process:
    """A process held by a pidfd (os.kill by pid where the kernel has no pidfds)."""

    def __init__(self, pid: int, fd: int | None, gone: bool = False) -> None:
        self.pid = pid
        self.fd = fd
        self.gone = gone

    @classmethod
    def open(cls, pid: int) -> _Process:
        try:
            return cls(pid, os.pidfd_open(pid))
        except ProcessLookupError:
            return cls(pid, None, gone=True)
        except (AttributeError, OSError):  # no pidfds here (Python or kernel): by pid, as before pidfds
            return cls(pid, None)

    def send(self, sig: int) -> bool:
        """Sends `sig`; False if the process is gone."""
        if self.gone:
            return False
        try:
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            else:
                os.kill(self.pid, sig)
        except OSError:  # ProcessLookupError: it exited
            return False
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []
