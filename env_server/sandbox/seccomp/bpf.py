"""The allow-list (syscalls.py) compiled with libseccomp into the BPF program bwrap reads from `--seccomp FD`.

Only the native architecture is admitted: a system call of another one (i386 through int 0x80, x32) kills the
process. A call numbered above every call the list names (one newer than the list, which this kernel may not
have) answers ENOSYS rather than EPERM, so that a libc falls back as it does on an older kernel: the stub runc
puts before a Docker profile, put here before libseccomp's program.

libseccomp's Python binding is the official one (`import seccomp`, Debian's python3-seccomp) where it is
importable, else `pyseccomp`, a ctypes binding to the same libseccomp with the same API (from PyPI).
"""

from __future__ import annotations

import errno
import functools
import struct
import tempfile

try:
    import seccomp  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - which binding is installed is the machine's business
    import pyseccomp as seccomp  # type: ignore[import-untyped,no-redef]

from . import syscalls


def known(name: str) -> bool:
    """Whether libseccomp knows `name` as a call of the native architecture."""
    try:
        return seccomp.resolve_syscall(seccomp.Arch.NATIVE, name) >= 0
    except (ValueError, TypeError, OSError):
        return False


def build_filter() -> "seccomp.SyscallFilter":
    """The filter, as a libseccomp object (for tests that want to read it)."""
    f = seccomp.SyscallFilter(defaction=seccomp.ERRNO(syscalls.DEFAULT_ERRNO))
    try:  # a binary tree of call numbers instead of a linear chain: fewer instructions per call
        f.set_attr(seccomp.Attr.CTL_OPTIMIZE, 2)
    except (AttributeError, OSError, ValueError):  # pragma: no cover - libseccomp < 2.5
        pass
    for rule in syscalls.RULES:
        if known(rule.name):
            f.add_rule(seccomp.ALLOW, rule.name,
                       *(seccomp.Arg(m.index, seccomp.MASKED_EQ, m.mask, m.value) for m in rule.args))
    for name, err in syscalls.ERRNO.items():
        if known(name):
            f.add_rule(seccomp.ERRNO(err), name)
    return f


def newest_listed() -> int:
    """The highest native call number the list names."""
    names = [r.name for r in syscalls.RULES] + list(syscalls.ERRNO)
    return max(seccomp.resolve_syscall(seccomp.Arch.NATIVE, n) for n in names if known(n))


# Classic BPF (struct sock_filter: code, jt, jf, k) over struct seccomp_data (nr at 0, arch at 4).
_LD_ABS, _JEQ, _JGE, _JGT, _RET = 0x20, 0x15, 0x35, 0x25, 0x06
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000  # x32 calls carry it under the x86_64 arch; libseccomp's program kills them


def _enosys_stub() -> bytes:
    insns = [
        (_LD_ABS, 0, 0, 4),                       # 0: arch
        (_JEQ, 0, 4, seccomp.system_arch()),      # 1: not native -> 6 (libseccomp kills it)
        (_LD_ABS, 0, 0, 0),                       # 2: nr
        (_JGE, 2, 0, _X32_BIT),                   # 3: x32 -> 6
        (_JGT, 0, 1, newest_listed()),            # 4: newer than the list -> 5, else 6
        (_RET, 0, 0, _RET_ERRNO | errno.ENOSYS),  # 5
    ]                                             # 6: libseccomp's program (it loads what it needs)
    return b"".join(struct.pack("=HBBI", *i) for i in insns)


@functools.lru_cache(maxsize=1)
def compile_program() -> bytes:
    """The filter as the BPF program bwrap reads from its --seccomp fd."""
    with tempfile.TemporaryFile() as out:
        build_filter().export_bpf(out)
        out.seek(0)
        return _enosys_stub() + out.read()
