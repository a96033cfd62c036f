"""The system-call filter of a bwrap sandbox, compiled with libseccomp and handed to `bwrap --seccomp FD`.

Modelled on the effect of Docker's default seccomp profile for a container without capabilities: the calls it
refuses there are refused here with EPERM — kernel modules, mounts and namespaces, keyrings, bpf, perf, clocks,
swap, reboot, io_uring, userfaultfd and the like — new namespaces cannot be made through clone (its namespace
flags) or unshare/setns, clone3 answers ENOSYS (so that libc falls back to clone, whose flags a filter can
see), and personality cannot switch on executable data or turn off address randomisation.

One difference, on purpose: Docker's profile is an allow-list (a system call it does not know is refused),
this filter is a deny-list (as Flatpak's is): whatever is not named here is allowed. The list stands beside the
sandbox's other walls — no capabilities, no_new_privs, user namespaces disabled inside (`--disable-userns`),
and its own user, pid, network, ipc, uts, mount and cgroup namespaces — rather than alone. System calls of
another architecture (i386 through int 0x80, x32) kill the process: libseccomp's filter only admits the
native one.

libseccomp's Python binding is the official one (`import seccomp`, Debian's python3-seccomp) where it is
importable, else `pyseccomp`, a ctypes binding to the same libseccomp with the same API (from PyPI).
"""

from __future__ import annotations

import errno
import tempfile

try:
    import seccomp  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - which binding is installed is the machine's business
    import pyseccomp as seccomp  # type: ignore[import-untyped,no-redef]

# Refused with EPERM whatever their arguments (the calls Docker's default profile refuses a container that has
# no capabilities). Names a kernel or architecture does not have are skipped.
DENIED = (
    # kernel modules, kexec, reboot, swap, accounting
    "init_module", "finit_module", "delete_module", "create_module", "query_module", "get_kernel_syms",
    "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    # mounts, root changes, namespaces
    "mount", "umount", "umount2", "pivot_root", "mount_setattr", "move_mount", "open_tree", "fsopen", "fsconfig",
    "fsmount", "fspick", "unshare", "setns",
    # keyrings
    "add_key", "request_key", "keyctl",
    # tracing, profiling and kernel introspection
    "bpf", "perf_event_open", "lookup_dcookie", "kcmp", "syslog",
    # clocks
    "settimeofday", "stime", "clock_settime", "clock_adjtime",
    # raw I/O, quotas, handles, old or obsolete interfaces
    "iopl", "ioperm", "quotactl", "quotactl_fd", "open_by_handle_at", "nfsservctl", "uselib", "ustat", "sysfs",
    "_sysctl", "vm86", "vm86old", "vhangup",
    # asynchronous interfaces with a record of kernel escapes
    "userfaultfd", "io_uring_setup", "io_uring_enter", "io_uring_register",
    # fanotify watches the whole mount (CAP_SYS_ADMIN under Docker)
    "fanotify_init",
)

# clone's flags that make namespaces (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME).
NAMESPACE_FLAGS = (0x00020000, 0x02000000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000,
                   0x00000080)
# personality bits that weaken memory protection: READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, ADDR_COMPAT_LAYOUT,
# MMAP_PAGE_ZERO.
PERSONALITY_BITS = (0x0400000, 0x0040000, 0x0200000, 0x0100000)
# ioctls that push input into a terminal or drive the console (TIOCSTI, TIOCLINUX).
TERMINAL_IOCTLS = (0x5412, 0x541C)
AF_VSOCK = 40  # vsock is not confined by network namespaces: it reaches the hypervisor


def _syscall_known(name: str) -> bool:
    try:
        return seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0
    except (ValueError, TypeError, OSError):
        return False


def build_filter() -> "seccomp.SyscallFilter":
    """The filter, as a libseccomp object (for tests that want to read it)."""
    f = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    eperm = seccomp.ERRNO(errno.EPERM)
    for name in DENIED:
        if _syscall_known(name):
            f.add_rule(eperm, name)
    for flag in NAMESPACE_FLAGS:
        f.add_rule(eperm, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    if _syscall_known("clone3"):
        f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for bit in PERSONALITY_BITS:
        f.add_rule(eperm, "personality", seccomp.Arg(0, seccomp.MASKED_EQ, bit, bit))
    for request in TERMINAL_IOCTLS:
        f.add_rule(eperm, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), "socket", seccomp.Arg(0, seccomp.EQ, AF_VSOCK))
    return f


def compile_program() -> bytes:
    """The filter as the BPF program bwrap reads from its --seccomp fd."""
    with tempfile.TemporaryFile() as out:
        build_filter().export_bpf(out)
        out.seek(0)
        return out.read()
