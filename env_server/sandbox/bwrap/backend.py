"""The bubblewrap backend: each sandbox a process tree in its own namespaces over a read-only root filesystem.

No daemon and no root: the server starts `bwrap` itself (command.py) with one end of a socket pair as the REPL's
stdin and stdout, which is the channel (calls and the dead-man switch at once: the REPL exits at its EOF), and
everything of the sandbox dies with its session and with the server (--die-with-parent, the pid namespace, and
the cgroup where there is one). Limits: cgroups where the server may write them (cgroups.py), rlimits set by the
REPL on itself (and for memory, where no cgroup holds it), the seccomp filter (sandbox/seccomp: the allow-list
both backends share). Root filesystems: rootfs.py.

    outer bwrap (host pid, the server's child; as a host uid of the sandbox's own under a root server, uids.py)
     └─ /bin/sh -c SH_INIT as pid 1 of the sandbox: its init (command.py: holds only /dev/null, reaps orphans,
        ignores signals from inside; in an image without /bin/sh, the REPL's own fork, runtime/repl_init.py)
         └─ python3 -I /opt/tito/repl_server.py, the REPL (pid 2)

The sandbox's stderr (bwrap's errors, the REPL's before it captures its own) is logged line by line, escaped:
nothing a sandbox writes can start a line of the server's log.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import shutil
import socket
import subprocess
import weakref
from pathlib import Path

from ..backend import SandboxBackend, StartedSandbox
from ..channel import ChannelClosed, ReplChannel
from ..config import SandboxConfig
from ..disk import guard_for
from ..errors import BackendUnavailable, SandboxError
from ..runtime import repl_protocol as protocol
from . import command, rootfs
from .cgroups import CgroupLimits, CgroupTree
from .handle import BwrapSandbox, StderrTail
from .uids import UidPool

log = logging.getLogger(__name__)
# What sessions share where they all run as one host uid (an unprivileged server, or uid_range_size 0).
SHARED_QUOTAS = ("sessions share one host uid's per-user kernel quotas (inotify instances and watches, POSIX "
                 "message queue bytes, pipe buffer pages, RLIMIT_NPROC): one session can use them up for all")
MEMORY_UNBOUNDED = ("memory is NOT bounded: RLIMIT_AS does not count memfd or shared memory pages, so a sandbox can "
                    "hold more than sandbox.mem_limit")
INSTALL_HINT = ("install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; without root, unpack its .deb "
                "with dpkg -x and set sandbox.bwrap.bwrap_path), or run TITO_SANDBOX_BACKEND=bwrap scripts/setup.sh")


class BwrapBackend(SandboxBackend):
    name = "bwrap"

    def __init__(self, config: SandboxConfig, *, server_name: str, instance_id: str) -> None:
        super().__init__(config, server_name=server_name, instance_id=instance_id)
        b = config.bwrap
        self.rootfs_dir = Path(b.rootfs_dir) if b.rootfs_dir else rootfs.default_rootfs_dir()
        # Nothing in a sandbox may be root on the host: a root server starts them as an unprivileged user.
        self.host_user = b.host_user if os.geteuid() == 0 else None
        # ... and, where a range is configured, each as a host uid of its own (per-user kernel quotas per sandbox).
        self._uids = (UidPool(b.uid_range_start, b.uid_range_size)
                      if self.host_user is not None and b.uid_range_size > 0 else None)
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
            elif self._uids is not None:
                log.info("bwrap sandboxes: each runs as a host uid of its own from %d (%d uids)",
                         self.config.bwrap.uid_range_start, self.config.bwrap.uid_range_size)
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
        if self._cgroups is None:
            return None
        notes = []
        missing = self._cgroups.missing
        if missing:
            fallback = {"memory": "RLIMIT_AS per process", "pids": "RLIMIT_NPROC", "cpu": "nothing (no CPU quota)"}
            reasons = sorted(set(missing.values()))
            notes.append("no cgroup for " + ", ".join(f"{c} (falls back to {fallback[c]})" for c in missing)
                         + f": {'; '.join(reasons)}")
        if "memory" in missing:
            notes.append(MEMORY_UNBOUNDED)
        if self._uids is None:
            notes.append(SHARED_QUOTAS)
        return "; ".join(notes) or None

    @property
    def unenforced_limits(self) -> tuple[str, ...]:
        """The missing cgroups' limits, and, said plainly: `memory_unbounded` where no cgroup holds memory,
        `per_user_quotas_shared` where sandboxes share one host uid."""
        if self._cgroups is None:
            return ()
        missing = tuple(self._cgroups.missing)
        return (missing + (("memory_unbounded",) if "memory" in missing else ())
                + (("per_user_quotas_shared",) if self._uids is None else ()))

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
        uid = self._uids.take() if self._uids is not None else None
        try:
            cgroup = self._cgroups.create(session_id, limits)
        except BaseException:
            if uid is not None:
                uid.release()
            raise
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
                                        setpriv=self._setpriv, host_user=uid.user if uid else self.host_user)
            process = subprocess.Popen(argv, stdin=child, stdout=child, stderr=err_w,
                                       pass_fds=() if seccomp_r is None else (seccomp_r,),
                                       env=command.STARTER_ENVIRONMENT, start_new_session=True)
        except BaseException:
            host.close()
            os.close(err_r)
            if cgroup is not None:
                cgroup.remove()
            if uid is not None:
                uid.release()
            raise
        finally:
            child.close()
            os.close(err_w)
            if seccomp_r is not None:
                os.close(seccomp_r)
        sandbox = BwrapSandbox(session_id, process, cgroup, uid)
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
