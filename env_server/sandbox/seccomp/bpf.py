"""The allow-list (syscalls.py) compiled with libseccomp into the BPF program bwrap reads from `--seccomp FD`.

Only the native architecture is admitted: a system call of another one (i386 through int 0x80, x32) kills the
process. libseccomp's Python binding is the official one (`import seccomp`, Debian's python3-seccomp) where it is
importable, else `pyseccomp`, a ctypes binding to the same libseccomp with the same API (from PyPI).
"""

from __future__ import annotations

import functools
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


@functools.lru_cache(maxsize=1)
def compile_program() -> bytes:
    """The filter as the BPF program bwrap reads from its --seccomp fd."""
    with tempfile.TemporaryFile() as out:
        build_filter().export_bpf(out)
        out.seek(0)
        return out.read()
