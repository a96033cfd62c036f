"""The one system-call allow-list of every sandbox, both backends (bpf.py compiles it for bwrap,
docker_profile.py writes it as a Docker seccomp profile).

Its effect is that of Docker's default profile for a container without capabilities: a call not named here is
refused (EPERM), calls Docker gates behind a capability are not named (a sandbox has none), and the calls Docker
filters by argument are filtered the same way. Stricter than Docker, on purpose (docs/security.md):
io_uring (Docker 25+ refuses it too; the 20.10 daemon setup installs does not), ptrace and process_vm_*,
socket families other than unix, inet, inet6 and netlink, ping sockets, and the TIOCSTI/TIOCLINUX ioctls.

Argument rules are only masked equalities, each mask at most 32 bits wide: every filtered argument here is an
`int` to the kernel (socket's family, type and protocol, ioctl's request, personality's persona; clone's flags,
whose low 32 bits are all the kernel keeps), and a 64-bit comparison would let high bits the kernel ignores slip a
refused value past it (`socket(40 | 1 << 32, ...)` was AF_VSOCK). A rule is allowed when all its arguments match;
a call is allowed when any of its rules does. "Not equal" is written as the union of masked equalities that
cover every other 32-bit value (`complement`), so the filter needs no rule that refuses what another allows.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass
from typing import Iterable, Mapping

WIDTH_MASK = 0xFFFFFFFF  # the kernel reads these arguments as 32-bit ints


@dataclass(frozen=True)
class Masked:
    """Argument `index` matches when `(arg & mask) == value`."""

    index: int
    mask: int
    value: int

    def __post_init__(self) -> None:
        if not 0 <= self.mask <= WIDTH_MASK or self.value & ~self.mask:
            raise ValueError(f"bad argument rule {self}: mask must fit 32 bits and cover the value")

    def matches(self, args: tuple[int, ...]) -> bool:
        return (args[self.index] & self.mask) == self.value


@dataclass(frozen=True)
class Rule:
    """`name` is allowed when every argument rule matches (none: always)."""

    name: str
    args: tuple[Masked, ...] = ()


def equals(index: int, value: int) -> Masked:
    """The argument, read as a 32-bit int, equals `value`."""
    return Masked(index, WIDTH_MASK, value & WIDTH_MASK)


def complement(index: int, refused: Iterable[int]) -> list[Masked]:
    """Masked equalities whose union is every 32-bit value of the argument except `refused`."""
    out: list[Masked] = []

    def split(bit: int, mask: int, value: int, left: frozenset[int]) -> None:
        if not left:
            out.append(Masked(index, mask, value))
            return
        if bit < 0:
            return  # a refused value itself
        for b in (0, 1):
            split(bit - 1, mask | 1 << bit, value | b << bit, frozenset(v for v in left if (v >> bit) & 1 == b))

    split(31, 0, 0, frozenset(v & WIDTH_MASK for v in refused))
    return out


# --- Allowed whatever their arguments, grouped by what they are for. Names a kernel or architecture lacks are
# skipped by the compilers. Together: Docker's unconditional list (less io_uring, see the module docstring).

# Files, directories, links, attributes, and file-descriptor plumbing.
FILES = (
    "access", "faccessat", "faccessat2", "chdir", "fchdir", "getcwd", "chmod", "fchmod", "fchmodat", "fchmodat2",
    "chown", "fchown", "fchownat", "lchown", "creat", "open", "openat", "openat2", "close", "close_range", "dup",
    "dup2", "dup3", "fcntl", "flock", "read", "readv", "pread64", "preadv", "preadv2", "write", "writev",
    "pwrite64", "pwritev", "pwritev2", "lseek", "readahead", "sendfile", "splice", "tee", "vmsplice",
    "copy_file_range", "fadvise64", "fallocate", "ftruncate", "truncate", "fsync", "fdatasync", "sync",
    "syncfs", "sync_file_range", "stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs",
    "getdents", "getdents64", "mkdir", "mkdirat", "rmdir", "rename", "renameat", "renameat2", "link", "linkat",
    "symlink", "symlinkat", "unlink", "unlinkat", "readlink", "readlinkat", "umask", "utime", "utimes",
    "utimensat", "futimesat", "getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr",
    "listxattr", "llistxattr", "flistxattr", "removexattr", "lremovexattr", "fremovexattr",
    "name_to_handle_at", "cachestat", "pipe", "pipe2",
    # Change notification on what the sandbox can already read (fanotify_init needs CAP_SYS_ADMIN).
    "inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch", "fanotify_mark",
    # Linux AIO (io_setup & co.) is the old, self-contained interface; io_uring is not here.
    "io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents",
)

# Memory of the process itself (not of others: process_madvise, mbind/set_mempolicy/move_pages are refused).
MEMORY = (
    "brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mincore", "msync", "remap_file_pages", "mlock",
    "mlock2", "mlockall", "munlock", "munlockall", "membarrier", "memfd_create", "memfd_secret", "pkey_alloc",
    "pkey_free", "pkey_mprotect", "process_mrelease", "map_shadow_stack",
)

# Processes, threads, signals, identity and limits inside the sandbox's own namespaces. clone is filtered below;
# setuid & co. cannot gain anything without capabilities.
PROCESSES = (
    "execve", "execveat", "exit", "exit_group", "fork", "vfork", "wait4", "waitid", "kill", "tkill", "tgkill",
    "pidfd_open", "pidfd_send_signal", "getpid", "getppid", "gettid", "getpgid", "setpgid", "getpgrp", "getsid",
    "setsid", "getuid", "geteuid", "getgid", "getegid", "getresuid", "getresgid", "getgroups", "setuid", "setgid",
    "setreuid", "setregid", "setresuid", "setresgid", "setfsuid", "setfsgid", "setgroups", "capget", "capset",
    "prctl", "arch_prctl", "modify_ldt", "get_thread_area", "set_thread_area", "set_tid_address",
    "set_robust_list", "get_robust_list", "rseq", "seccomp", "landlock_create_ruleset", "landlock_add_rule",
    "landlock_restrict_self", "getrlimit", "setrlimit", "prlimit64", "getrusage", "getpriority", "setpriority",
    "ioprio_get", "ioprio_set", "sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getattr",
    "sched_setattr", "sched_getparam", "sched_setparam", "sched_getscheduler", "sched_setscheduler",
    "sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval", "getcpu", "uname", "sysinfo",
    "times", "restart_syscall", "rt_sigaction", "rt_sigprocmask", "rt_sigpending", "rt_sigqueueinfo",
    "rt_tgsigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait", "sigaltstack", "signalfd",
    "signalfd4", "pause",
)

# Waiting, time and timers (setting a clock needs CAP_SYS_TIME; adjtimex/clock_adjtime only read without it).
WAITING_AND_TIME = (
    "futex", "futex_waitv", "futex_wait", "futex_wake", "futex_requeue", "poll", "ppoll", "select", "pselect6",
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "epoll_ctl_old",
    "epoll_wait_old", "eventfd", "eventfd2", "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres",
    "gettimeofday", "time", "adjtimex", "clock_adjtime", "alarm", "getitimer", "setitimer", "timer_create",
    "timer_delete", "timer_gettime", "timer_settime", "timer_getoverrun", "timerfd_create", "timerfd_gettime",
    "timerfd_settime", "getrandom",
)

# Sockets once made (making one is filtered below) and System V / POSIX IPC inside the sandbox's ipc namespace.
SOCKETS_AND_IPC = (
    "socketpair", "bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername", "getsockopt",
    "setsockopt", "sendto", "sendmsg", "sendmmsg", "recvfrom", "recvmsg", "recvmmsg", "shutdown", "msgget",
    "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl", "shmget", "shmat", "shmdt", "shmctl",
    "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
)

# The same calls under their names on other architectures (aarch64; x86_64 has none of these).
OTHER_ARCHES = ("sync_file_range2", "arm_fadvise64_64", "arm_sync_file_range", "set_tls", "cacheflush",
                "breakpoint")

ALWAYS = FILES + MEMORY + PROCESSES + WAITING_AND_TIME + SOCKETS_AND_IPC + OTHER_ARCHES

# --- Allowed by argument.
AF_UNIX, AF_INET, AF_INET6, AF_NETLINK, AF_VSOCK = 1, 2, 10, 16, 40
SOCK_STREAM, SOCK_DGRAM, SOCK_TYPE_MASK = 1, 2, 0xF  # the type's low bits; the rest are SOCK_NONBLOCK/CLOEXEC
IPPROTO_UDP, IPPROTO_UDPLITE = 17, 136
# Ping sockets (AF_INET/SOCK_DGRAM/IPPROTO_ICMP, and ICMPv6) are left out: Docker allows them, nothing here
# needs them, and they reach kernel code a sandbox without a network has no use for.
DGRAM_PROTOCOLS = (0, IPPROTO_UDP, IPPROTO_UDPLITE)

# Namespace flags of clone (NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET): Docker's mask.
CLONE_NAMESPACES = 0x7E020000
# Personalities that change nothing that matters (Linux, PER_LINUX32, UNAME26, both) and the query 0xffffffff;
# READ_IMPLIES_EXEC or ADDR_NO_RANDOMIZE would weaken memory protection.
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
# ioctls that push input into a terminal (TIOCSTI: whoever reads the terminal next runs it) or drive the console.
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
REFUSED_IOCTLS = (TIOCSTI, TIOCLINUX)
# mknod's file types: regular files (0 or S_IFREG), fifos and sockets; never a character or block device. A device
# node needs CAP_MKNOD, but gVisor (Debian's runsc 20221219) does not check it and its tmpfs ignores nodev: a
# sandbox there made a working /dev/fuse in /tmp. The type sits in the mode argument's S_IFMT bits.
S_IFMT, S_IFREG, S_IFIFO, S_IFSOCK = 0o170000, 0o100000, 0o010000, 0o140000
MKNOD_TYPES = (0, S_IFREG, S_IFIFO, S_IFSOCK)


def _socket_rules() -> list[Rule]:
    # Only these families, and inet/inet6 only as TCP-like streams or UDP datagrams. Refused: vsock (network
    # namespaces do not confine it: it reaches the hypervisor), the rarely used families Docker leaves open
    # (module autoloading, a record of kernel bugs), ping, SCTP, and raw sockets (which need CAP_NET_RAW anyway).
    rules = [Rule("socket", (equals(0, AF_UNIX),)), Rule("socket", (equals(0, AF_NETLINK),))]
    for family in (AF_INET, AF_INET6):
        rules.append(Rule("socket", (equals(0, family), Masked(1, SOCK_TYPE_MASK, SOCK_STREAM))))
        rules += [Rule("socket", (equals(0, family), Masked(1, SOCK_TYPE_MASK, SOCK_DGRAM), equals(2, proto)))
                  for proto in DGRAM_PROTOCOLS]
    return rules


ARGUMENT_RULES: tuple[Rule, ...] = (
    *_socket_rules(),
    # mknod(path, mode, dev) and mknodat(dirfd, path, mode, dev): the mode's file type, not a device.
    *(Rule("mknod", (Masked(1, S_IFMT, t),)) for t in MKNOD_TYPES),
    *(Rule("mknodat", (Masked(2, S_IFMT, t),)) for t in MKNOD_TYPES),
    # clone without namespace flags (unshare and setns are not allowed at all).
    Rule("clone", (Masked(0, CLONE_NAMESPACES, 0),)),
    *(Rule("personality", (equals(0, p),)) for p in PERSONALITIES),
    *(Rule("ioctl", (m,)) for m in complement(1, REFUSED_IOCTLS)),
)

RULES: tuple[Rule, ...] = tuple(Rule(name) for name in ALWAYS) + ARGUMENT_RULES

# Refused with another errno than the default: clone3's flags live in memory a filter cannot read, so it answers
# ENOSYS and libc falls back to clone, whose flags the rule above sees (as Docker does).
ERRNO: Mapping[str, int] = {"clone3": errno.ENOSYS}

DEFAULT_ERRNO = errno.EPERM


def decide(name: str, *args: int) -> int | None:
    """What the list does with a call: None (allowed) or the errno it is refused with. For tests and docs; the
    compilers implement the same rules."""
    padded = tuple(args) + (0,) * (6 - len(args))
    if name in ERRNO:
        return ERRNO[name]
    for rule in RULES:
        if rule.name == name and all(m.matches(padded) for m in rule.args):
            return None
    return DEFAULT_ERRNO


def allowed_names() -> set[str]:
    """Every call some rule allows (with or without arguments)."""
    return {r.name for r in RULES}
