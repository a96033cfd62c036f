"""The allow-list (syscalls.py) as a Docker seccomp profile, passed to every sandbox container as
`security_opt=["seccomp=<json>"]`, so that what a sandbox may call does not depend on which default profile the
daemon's version ships (Debian's docker.io 20.10 lets AF_VSOCK sockets and io_uring through).

The daemon hands the profile to the runtime: runc compiles it with libseccomp (names it does not know are
skipped); gVisor applies it inside its own kernel only where runsc runs with `--oci-seccomp`.
"""

from __future__ import annotations

import functools
import json
import platform
from typing import Any, Iterable

from . import syscalls

# Docker's names for the architectures tito's sandboxes run on. Only the native one is listed: calls of another
# architecture (i386 through int 0x80, x32) are refused, as in the bwrap filter.
_ARCHES = {"x86_64": "SCMP_ARCH_X86_64", "amd64": "SCMP_ARCH_X86_64", "aarch64": "SCMP_ARCH_AARCH64",
           "arm64": "SCMP_ARCH_AARCH64"}


def profile(machine: str | None = None, runtime: str = "runc") -> dict[str, Any]:
    """The profile as a dict (Docker's JSON seccomp format). Under gVisor (any runtime but runc) clone3 is allowed:
    Debian's runsc answers every refusal with EPERM whatever errno the profile names, and glibc falls back to
    clone only on ENOSYS (no thread would start); gVisor's own kernel does not implement clone3 and answers
    ENOSYS itself."""
    machine = machine or platform.machine()
    try:
        arch = _ARCHES[machine.lower()]
    except KeyError:
        raise RuntimeError(f"no seccomp profile for architecture {machine!r}: sandboxes run on "
                           f"{', '.join(sorted(set(_ARCHES)))}") from None
    always = [r.name for r in syscalls.RULES if not r.args]
    entries: list[dict[str, Any]] = [{"names": always, "action": "SCMP_ACT_ALLOW"}]
    for rule in syscalls.RULES:
        if rule.args:
            entries.append({"names": [rule.name], "action": "SCMP_ACT_ALLOW", "args": [
                # Docker's masked equality: value is the mask, valueTwo what the masked argument must equal.
                {"index": m.index, "value": m.mask, "valueTwo": m.value, "op": "SCMP_CMP_MASKED_EQ"}
                for m in rule.args]})
    for name, err in syscalls.ERRNO.items():
        if name == "clone3" and runtime != "runc":
            entries[0]["names"].append(name)
            continue
        entries.append({"names": [name], "action": "SCMP_ACT_ERRNO", "errnoRet": err})
    return {"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": syscalls.DEFAULT_ERRNO,
            "architectures": [arch], "syscalls": entries}


@functools.lru_cache(maxsize=4)
def profile_json(runtime: str = "runc") -> str:
    """The profile as compact JSON (it travels in every container's create request)."""
    return json.dumps(profile(runtime=runtime), separators=(",", ":"), sort_keys=True)


def security_opt(configured: Iterable[str], runtime: str = "runc") -> list[str]:
    """The container's security options: the configured ones, plus this profile unless one of them already names
    a seccomp profile (an operator's own choice, e.g. for debugging)."""
    opts = list(configured)
    if not any(o.split("=", 1)[0].split(":", 1)[0] == "seccomp" for o in opts):
        opts.append("seccomp=" + profile_json(runtime))
    return opts
