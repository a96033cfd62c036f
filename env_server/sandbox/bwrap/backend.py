"""The bubblewrap backend: each sandbox a process tree in its own namespaces over a read-only root filesystem.

No daemon and no root: the server starts `bwrap` itself (command.py) with one end of a socket pair as the REPL's
stdin and stdout, which is the channel (calls and the dead-man switch at once: the REPL exits at its EOF), and
everything of the sandbox dies with its session and with the server (--die-with-parent, the pid namespace, and
the cgroup where there is one). Limits: cgroups where the server may write them (cgroups.py), rlimits set by the
REPL on itself (and for memory, where no cgroup holds it), the seccomp filter (sandbox/seccomp: the allow-list
both backends share). Root filesystems: rootfs.py.

    outer bwrap (host pid, the server's child)
     └─ bwrap as pid 1 of the sandbox (reaps orphans; ignores signals from inside)
         └─ python3 -I /opt/tito/repl_server.py (pid 2)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import weakref
from pathlib import Path

from ..backend import ExitInfo, SandboxBackend, StartedSandbox
from ..channel import ChannelClosed, ReplChannel
from ..config import SandboxConfig
from ..disk import guard_for
from ..errors import BackendUnavailable, SandboxError
from ..runtime import repl_protocol as protocol
from . import command, rootfs
from .cgroups import CgroupLimits, CgroupTree, SandboxCgroup

log = logging.getLogger(__name__)
_STDERR_KEEP = 8 * 1024
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; without root, unpack its .deb "
                "with dpkg -x and set sandbox.bwrap.bwrap_path), or run TITO_SANDBOX_BACKEND=bwrap scripts/setup.sh")


class StderrTail(asyncio.Protocol):
    """The sandbox's stderr (bwrap's own errors, the REPL's diagnostics): logged, and its start kept for the
    message of a failed start."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.kept = bytearray()
        self.closed = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        if len(self.kept) < _STDERR_KEEP:
            chunk = data[: _STDERR_KEEP - len(self.kept)]
            self.kept += chunk
            log.warning("sandbox %s stderr: %s", self.name, chunk.decode("utf-8", "replace").rstrip())

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def text(self) -> str:
        return self.kept.decode("utf-8", "replace").strip()


class BwrapSandbox:
    """One running bwrap sandbox: the backend's `SandboxHandle`. Its methods block (waits, /proc, cgroupfs)."""

    def __init__(self, name: str, process: subprocess.Popen[bytes], cgroup: SandboxCgroup | None) -> None:
        self.id = name
        self.process = process
        self.cgroup = cgroup
        self._init: _Process | None = None  # the sandbox's pid 1 (bwrap's init)
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


class BwrapBackend(SandboxBackend):
    name = "bwrap"

    def __init__(self, config: SandboxConfig, *, server_name: str, instance_id: str) -> None:
        super().__init__(config, server_name=server_name, instance_id=instance_id)
        b = config.bwrap
        self.rootfs_dir = Path(b.rootfs_dir) if b.rootfs_dir else rootfs.default_rootfs_dir()
        # Nothing in a sandbox may be root on the host: a root server starts them as an unprivileged user.
        self.host_user = b.host_user if os.geteuid() == 0 else None
        self._bwrap: str | None = None
        self._setpriv: str | None = None
        self._seccomp: bytes | None = None
        self._cgroups: CgroupTree | None = None
        self._images: dict[str, rootfs.RootfsImage] = {}
        self._tried: set[str] = set()  # images a sandbox has started from (the probe's smoke test)
        self._live: weakref.WeakSet[BwrapSandbox] = weakref.WeakSet()

    # -- probe -------------------------------------------------------------------------------------

    def probe(self, image: str) -> None:
        b = self.config.bwrap
        if self._bwrap is None:
            found = shutil.which(b.bwrap_path)
            if found is None:
                raise BackendUnavailable(f"bwrap ({b.bwrap_path!r}) not found; {INSTALL_HINT}")
            if self.host_user is not None:
                self._setpriv = shutil.which("setpriv")
                if self._setpriv is None:
                    raise BackendUnavailable("the server runs as root and needs setpriv (util-linux) to start "
                                             "sandboxes as sandbox.bwrap.host_user; install util-linux")
            self._bwrap = found
        if b.seccomp and self._seccomp is None:
            from ..seccomp import bpf

            try:
                self._seccomp = bpf.compile_program()
            except Exception as exc:  # noqa: BLE001 - libseccomp missing or refusing: said, with what to do
                raise BackendUnavailable(
                    f"cannot compile the sandboxes' seccomp filter ({type(exc).__name__}: {exc}); install libseccomp "
                    "(apt-get install libseccomp2) and the project's Python dependencies (pyseccomp)") from None
        if self._cgroups is None:
            self._cgroups = CgroupTree(self.server_name, self.instance_id, parent=b.cgroup_parent,
                                       enabled=b.cgroups == "auto")
            note = self.limits_note
            if note:
                log.warning("bwrap sandboxes: %s", note)
        if self.disk is None:
            self.disk = guard_for(str(self.rootfs_dir), "the root filesystems", override=self.config.disk_path,
                                  min_free_mb=self.config.min_free_disk_mb)
        self._images[image] = rootfs.load(self.rootfs_dir, image)
        self.check_disk()
        if image not in self._tried:
            self._smoke_test(self._images[image])
            self._tried.add(image)

    def _smoke_test(self, image: rootfs.RootfsImage) -> None:
        """Runs `true` in a sandbox of the image once: the kernel, AppArmor or the host may refuse what bwrap
        needs (user namespaces above all), which is better said at start-up than at the first open."""
        argv = self._argv(self.config, image, {}, seccomp_fd=None)
        argv[argv.index("--") + 1:] = ["/bin/sh", "-c", "exit 0"]
        try:
            done = subprocess.run(command.starter_argv(argv, procs_files=(), setpriv=self._setpriv,
                                                       host_user=self.host_user),
                                  env=command.STARTER_ENVIRONMENT, capture_output=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendUnavailable(f"bwrap could not run ({exc}); {INSTALL_HINT}") from None
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip()[-500:]
            raise BackendUnavailable(
                f"bwrap cannot start a sandbox of {image.image!r} here (exit {done.returncode}: {said}); user "
                "namespaces may be disabled (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone, "
                "or an AppArmor rule for bwrap), or the root filesystem "
                f"{image.path} is not readable by uid {self.host_user or os.geteuid()}") from None

    @property
    def limits_note(self) -> str | None:
        if self._cgroups is None or not self._cgroups.missing:
            return None
        fallback = {"memory": "RLIMIT_AS per process", "pids": "RLIMIT_NPROC", "cpu": "nothing (no CPU quota)"}
        missing = self._cgroups.missing
        reasons = sorted(set(missing.values()))
        return ("no cgroup for " + ", ".join(f"{c} (falls back to {fallback[c]})" for c in missing)
                + f": {'; '.join(reasons)}")

    @property
    def unenforced_limits(self) -> tuple[str, ...]:
        return tuple(self._cgroups.missing) if self._cgroups is not None else ()

    def missing_task_image(self, quoted_image: str) -> str:
        return (f"the task image {quoted_image} has no root filesystem on this server (in {self.rootfs_dir}); "
                "build it with TITO_SANDBOX_BACKEND=bwrap scripts/build_task_images.sh TASK_DIR, which makes a task's "
                "root filesystem from the same recipe as its image (sandbox_images/task/Dockerfile)")

    # -- sandboxes -----------------------------------------------------------------------------------

    def _argv(self, config: SandboxConfig, image: rootfs.RootfsImage, environment: dict[str, str],
              seccomp_fd: int | None) -> list[str]:
        assert self._bwrap is not None
        return command.bwrap_argv(self._bwrap, config, image, environment, seccomp_fd)

    def _spawn(self, config: SandboxConfig, session_id: str) -> tuple[BwrapSandbox, socket.socket, int]:
        """Makes the cgroup and starts bwrap (blocking). Returns the sandbox, the host's end of its stdio, and
        the read end of its stderr pipe."""
        image = self._images.get(config.image)
        if image is None:
            raise SandboxError(f"no root filesystem loaded for {config.image!r} (the pool's probe loads it)")
        assert self._cgroups is not None
        limits = CgroupLimits(pids=config.pids_limit, memory_bytes=config.mem_limit_bytes,
                              cpu_quota_us=max(1000, config.nano_cpus // 10_000))
        cgroup = self._cgroups.create(session_id, limits)
        memory_by_rlimit = cgroup is None or "memory" not in cgroup.dirs
        rlimits = command.rlimits(config, memory_by_rlimit=memory_by_rlimit)
        environment = command.sandbox_environment(config, image, rlimits)
        host, child = socket.socketpair()
        err_r, err_w = os.pipe()
        seccomp_r = None
        try:
            if self._seccomp is not None and config.bwrap.seccomp:
                # A memfd, not a pipe: the program (~4 KiB) may not fit a pipe of a user whose pipe pages are
                # spent, and bwrap reads it only after it starts.
                seccomp_r = os.memfd_create("tito-seccomp", os.MFD_CLOEXEC)
                os.write(seccomp_r, self._seccomp)
                os.lseek(seccomp_r, 0, os.SEEK_SET)
            argv = command.starter_argv(self._argv(config, image, environment, seccomp_r),
                                        procs_files=cgroup.procs_files if cgroup else (),
                                        setpriv=self._setpriv, host_user=self.host_user)
            process = subprocess.Popen(argv, stdin=child, stdout=child, stderr=err_w,
                                       pass_fds=() if seccomp_r is None else (seccomp_r,),
                                       env=command.STARTER_ENVIRONMENT, start_new_session=True)
        except BaseException:
            host.close()
            os.close(err_r)
            if cgroup is not None:
                cgroup.remove()
            raise
        finally:
            child.close()
            os.close(err_w)
            if seccomp_r is not None:
                os.close(seccomp_r)
        sandbox = BwrapSandbox(session_id, process, cgroup)
        self._live.add(sandbox)
        return sandbox, host, err_r

    async def start(self, config: SandboxConfig, *, session_id: str, executor: concurrent.futures.Executor,
                    timeout_s: float) -> StartedSandbox:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        spawn = loop.run_in_executor(executor, self._spawn, config, session_id)
        try:
            # Shielded: a start cancelled while bwrap starts still gets the process, to remove it.
            sandbox, host, err_r = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            with contextlib.suppress(BaseException):
                sandbox, host, err_r = await spawn
                host.close()
                os.close(err_r)
                await loop.run_in_executor(executor, sandbox.remove)
            raise
        except OSError as exc:
            raise SandboxError(f"could not start bwrap: {exc}") from exc
        channel: ReplChannel | None = None
        stderr: StderrTail | None = None
        try:
            _, stderr = await loop.connect_read_pipe(lambda: StderrTail(session_id[:12]), os.fdopen(err_r, "rb", 0))
            channel = await ReplChannel.open(host, name=session_id[:12], max_line_bytes=config.max_reply_bytes,
                                             framed=False)
            left = deadline - loop.time()
            if left <= 0:
                raise asyncio.TimeoutError
            protocol.parse_ready(await asyncio.wait_for(channel.wait_ready(), left))
            await loop.run_in_executor(executor, sandbox.discover)
        except BaseException as exc:
            if channel is not None:
                await channel.close()
            else:
                host.close()
            await asyncio.shield(loop.run_in_executor(executor, sandbox.remove))
            if isinstance(exc, ChannelClosed) and stderr is not None:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(stderr.closed), 1.0)
                if stderr.text:
                    raise SandboxError(f"the sandbox did not start: {stderr.text[-1000:]}") from None
            raise
        return StartedSandbox(handle=sandbox, calls=channel, watch=channel)

    def stats(self) -> dict[str, float]:
        memory = [sb.memory_bytes() for sb in list(self._live) if not sb.removed]
        known = [m for m in memory if m is not None]
        return {"memory_bytes": float(sum(known))} if known else {}

    def sweep(self, *, keep_instance: str | None = None, only_instance: str | None = None) -> int:
        """Kills and removes the cgroups of this server name's other instances (or of `only_instance`). Their
        processes died with their server already (--die-with-parent); what a cgroup still holds is killed."""
        b = self.config.bwrap
        tree = self._cgroups or CgroupTree(self.server_name, self.instance_id, parent=b.cgroup_parent,
                                           enabled=b.cgroups == "auto")
        instances = [only_instance] if only_instance is not None else sorted(tree.instances() - {keep_instance})
        return sum(tree.remove_instance(i) for i in instances)
