"""Sandboxes: one hardened sandbox per session (a Docker container, or a bubblewrap process tree), a warm
pool, a persistent channel to the REPL inside. backend.py is the interface between the two.

The names below load on first use (PEP 562), so that the standard-library parts (the REPL runtime, the root
filesystem builder) run with a bare ``python3`` before the project's dependencies are installed: setup builds
the base image beside ``pip install``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ExitInfo": "backend", "SandboxBackend": "backend", "StartedSandbox": "backend", "exit_reason": "backend",
    "make_sandbox_backend": "backends",
    "ChannelClosed": "channel", "ReplChannel": "channel",
    "DEFAULT_IMAGE": "config", "BwrapConfig": "config", "PoolConfig": "config", "SandboxConfig": "config",
    "BackendUnavailable": "errors", "SandboxError": "errors", "SandboxUnavailable": "errors",
    "PoolState": "pool", "SandboxPool": "pool",
    "ExecResult": "result",
    "Sandbox": "sandbox",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .backend import ExitInfo, SandboxBackend, StartedSandbox, exit_reason
    from .backends import make_sandbox_backend
    from .channel import ChannelClosed, ReplChannel
    from .config import DEFAULT_IMAGE, BwrapConfig, PoolConfig, SandboxConfig
    from .errors import BackendUnavailable, SandboxError, SandboxUnavailable
    from .pool import PoolState, SandboxPool
    from .result import ExecResult
    from .sandbox import Sandbox


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
