"""The command line that starts one bwrap sandbox, and the environment the REPL gets.

    [/bin/sh -c 'join cgroups' ...]      when the sandbox has a cgroup: the starter writes its own pid into
                                         each cgroup.procs, then execs the rest (so bwrap and everything it
                                         starts is inside from the first instruction)
    [setpriv --reuid U --regid G ...]    when the server is root: sandboxes run as an unprivileged host user
    bwrap --unshare-all ... -- python3 -I /opt/tito/repl_server.py

docs/security.md sets each flag beside the Docker setting it stands for.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import SandboxConfig, parse_bytes
from ..runtime import repl_protocol as protocol
from .rootfs import RootfsImage

# Joins the cgroups named before "--", then runs what follows it.
_JOIN_CGROUPS = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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
        # namespaces; everything dies with the server (and with bwrap); a session of its own (no TIOCSTI).
        "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
        "--uid", uid, "--gid", gid or uid, "--hostname", "sandbox", "--cap-drop", "ALL",
        "--ro-bind", str(image.path), "/",
        "--proc", "/proc", "--dev", "/dev",
        "--perms", "1777", "--size", str(parse_bytes(config.tmp_size)), "--tmpfs", "/tmp",
        "--perms", "1777", "--size", str(parse_bytes(config.bwrap.shm_size)), "--tmpfs", "/dev/shm",
        "--perms", "0700", "--size", str(parse_bytes(config.workdir_size)), "--tmpfs", config.workdir,
        "--chdir", config.workdir, "--clearenv",
    ]
    for key, value in environment.items():
        argv += ["--setenv", key, value]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    command: Sequence[str] = config.command or image.cmd or ("python3", "-I", "/opt/tito/repl_server.py")
    return argv + ["--", *command]


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
