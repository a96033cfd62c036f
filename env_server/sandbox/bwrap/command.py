"""The command line that starts one bwrap sandbox, and the environment the REPL gets.

    [/bin/sh -c 'join cgroups' ...]      when the sandbox has a cgroup: the starter writes its own pid into
                                         each cgroup.procs, then execs the rest (so bwrap and everything it
                                         starts is inside from the first instruction)
    [setpriv --reuid U --regid G ...]    when the server is root: sandboxes run as an unprivileged host user, one
                                         of its own per live sandbox (uids.py)
    bwrap --unshare-all --as-pid-1 ... -- /bin/sh -c SH_INIT tito-init python3 -I /opt/tito/repl_server.py
                                         pid 1 is a shell as the sandbox's init (SH_INIT below), which holds no
                                         file of the server's and whose command line names no host path; in an
                                         image without /bin/sh the REPL is pid 1 and forks its own (repl_init.py)

docs/security.md sets each flag beside the Docker setting it stands for.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path

from ..config import SandboxConfig, parse_bytes
from ..runtime import repl_protocol as protocol
from .rootfs import RootfsImage

# Joins the cgroups named before "--", then runs what follows it.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# Docker's masked and read-only paths of /proc (runc's defaults, plus /proc/interrupts): masked ones are covered
# by /dev/null (files) or an empty read-only tmpfs (folders); read-only ones are bound read-only over themselves
# (what /proc/sys shows follows the reader's namespaces, not the mount's). /sys is not mounted at all.
MASKED_PROC = ("/proc/acpi", "/proc/asound", "/proc/interrupts", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
               "/proc/sched_debug", "/proc/scsi", "/proc/timer_list", "/proc/timer_stats")
READ_ONLY_PROC = ("/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger")


@functools.cache
def proc_walls() -> tuple[str, ...]:
    """bwrap's arguments that mask and write-protect /proc (after --proc), for the paths this kernel has: a
    path bwrap would have to create in procfs fails the start."""
    argv: list[str] = []
    for path in MASKED_PROC:
        if os.path.isdir(path):
            argv += ["--perms", "0555", "--size", "4096", "--tmpfs", path, "--remount-ro", path]
        elif os.path.lexists(path):
            argv += ["--ro-bind", "/dev/null", path]
    for path in READ_ONLY_PROC:
        if os.path.lexists(path):
            argv += ["--ro-bind", path, path]
    return tuple(argv)


def rlimits(config: SandboxConfig, *, memory_by_rlimit: bool) -> dict[str, int]:
    """The REPL's rlimits: processes, open files, file size (no file is larger than its tmpfs), no core files,
    and, where no memory cgroup can hold it, the address space of each process."""
    limits = {"nproc": config.pids_limit, "nofile": config.nofile_limit, "core": 0,
              "fsize": max(parse_bytes(config.workdir_size), parse_bytes(config.tmp_size),
                           parse_bytes(config.bwrap.shm_size))}
    if memory_by_rlimit:
        limits["as"] = config.mem_limit_bytes
    return limits


def sandbox_environment(config: SandboxConfig, image: RootfsImage, limits: dict[str, int]) -> dict[str, str]:
    """The REPL's environment: the image's, HOME at the working directory, the config's, the rlimits."""
    return {**image.env, "HOME": config.workdir, **config.environment,
            protocol.ENV_RLIMITS: protocol.encode_rlimits(limits)}


def bwrap_argv(bwrap: str, config: SandboxConfig, image: RootfsImage, environment: dict[str, str],
               seccomp_fd: int | None) -> list[str]:
    uid, _, gid = config.user.partition(":")
    argv = [
        bwrap,
        # New user, pid, network (loopback only), ipc, uts, mount and cgroup namespaces; no nested user
        # namespaces; everything dies with the server (and with bwrap); a session of its own (no TIOCSTI); the
        # command is pid 1 (no bwrap inside, which would hold the sandbox's stderr and the rootfs' host path).
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session", "--as-pid-1",
        "--uid", uid, "--gid", gid or uid, "--hostname", "sandbox", "--cap-drop", "ALL",
        "--ro-bind", str(image.path), "/",
        "--proc", "/proc", *proc_walls(), "--dev", "/dev",
        "--perms", "1777", "--size", str(parse_bytes(config.tmp_size)), "--tmpfs", "/tmp",
        "--perms", "1777", "--size", str(parse_bytes(config.bwrap.shm_size)), "--tmpfs", "/dev/shm",
        # /dev itself (bwrap's tmpfs of device nodes) read-only: no unbounded tmpfs to fill.
        "--remount-ro", "/dev",
        "--perms", "0700", "--size", str(parse_bytes(config.workdir_size)), "--tmpfs", config.workdir,
        "--chdir", config.workdir, "--clearenv",
    ]
    for key, value in environment.items():
        argv += ["--setenv", key, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    command: Sequence[str] = config.command or image.cmd or ("python3", "-I", "/opt/tito/repl_server.py")
    return argv + ["--", *with_init(image.path, command)]


# The sandbox's pid 1 where the image has a /bin/sh: the shell keeps the REPL's stdin, stdout and stderr (the
# server's socket and pipe) only long enough to start it in the background, then closes its own copies and
# waits. It holds /dev/null alone, names no host path, reaps orphans while it waits (a shell's wait reaps any
# child), ignores signals sent from inside (pid 1 without a handler; SIGINT trapped to nothing: the REPL sets its
# own handler, and SIGQUIT back to the default, runtime/repl_server.py) and exits with the REPL's status, ending the
# pid namespace. A shell costs about a millisecond; the REPL's own Python init (runtime/repl_init.py, used where
# there is no shell) forks a whole interpreter, which cost a sandbox a fifth more CPU and ~2 MiB.
SH_INIT = ("trap '' INT; "  # a non-interactive shell catches SIGINT, and pid 1 with a handler can be signalled
           'exec 3<&0 4>&1 5>&2 </dev/null >/dev/null 2>/dev/null; '
           '"$@" <&3 >&4 2>&5 3<&- 4>&- 5>&- & exec 3<&- 4>&- 5>&-; wait $!')


def with_init(tree: Path, command: Sequence[str]) -> tuple[str, ...]:
    """`command` under the shell init where the image has /bin/sh; else as it is (pid 1 itself)."""
    return ("/bin/sh", "-c", SH_INIT, "tito-init", *command) if _has_shell(str(tree)) else tuple(command)


@functools.cache
def _has_shell(tree: str) -> bool:
    # Resolved inside the tree: an absolute link (bin/sh -> /bin/dash) names the sandbox's path, not the host's.
    target = os.path.join(tree, "bin", "sh")
    for _ in range(8):
        if not os.path.islink(target):
            return os.path.isfile(target) and os.access(target, os.X_OK)
        link = os.readlink(target)
        target = os.path.join(tree, link.lstrip("/")) if link.startswith("/") else \
            os.path.join(os.path.dirname(target), link)
    return False


def starter_argv(argv: list[str], *, procs_files: Sequence[str], setpriv: str | None, host_user: str | None
                 ) -> list[str]:
    """What the server runs: `argv` (bwrap) inside the sandbox's cgroups, as `host_user` (through `setpriv`)
    when given."""
    if host_user:
        uid, _, gid = host_user.partition(":")
        argv = [setpriv or "setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]
    if procs_files:
        argv = ["/bin/sh", "-c", _JOIN_CGROUPS, "tito-sandbox", *procs_files, "--", *argv]
    return argv


# bwrap's own environment: PATH alone. The sandbox's init inherits it and the sandbox can read it
# (/proc/1/environ), so nothing of the server's environment (its tokens) may be in it.
STARTER_ENVIRONMENT = {"PATH": HOST_PATH}
