"""Sandboxes: one hardened sandbox per session (a Docker container, or a bubblewrap process tree), a warm
pool, a persistent channel to the REPL inside. backend.py is the interface between the two."""

from .backend import ExitInfo, SandboxBackend, StartedSandbox, exit_reason
from .backends import make_sandbox_backend
from .channel import ChannelClosed, ReplChannel
from .config import DEFAULT_IMAGE, BwrapConfig, PoolConfig, SandboxConfig
from .errors import BackendUnavailable, SandboxError, SandboxUnavailable
from .pool import PoolState, SandboxPool
from .result import ExecResult
from .sandbox import Sandbox

__all__ = [
    "DEFAULT_IMAGE", "BackendUnavailable", "BwrapConfig", "ChannelClosed", "ExecResult", "ExitInfo", "PoolConfig",
    "PoolState", "ReplChannel", "Sandbox", "SandboxBackend", "SandboxConfig", "SandboxError", "SandboxPool",
    "SandboxUnavailable", "StartedSandbox", "exit_reason", "make_sandbox_backend",
]
