"""Docker sandboxes: one hardened container per session, a warm pool, a persistent stdio channel."""

from .channel import ChannelClosed, ReplChannel
from .config import DEFAULT_IMAGE, PoolConfig, SandboxConfig
from .docker_sandbox import (LABEL_INSTANCE, LABEL_MANAGED, LABEL_SERVER, LABEL_SESSION, Sandbox,
                             SandboxError, describe_exit)
from .pool import SandboxPool, SandboxUnavailable
from .result import ExecResult

__all__ = [
    "DEFAULT_IMAGE", "LABEL_INSTANCE", "LABEL_MANAGED", "LABEL_SERVER", "LABEL_SESSION",
    "ChannelClosed", "ExecResult", "PoolConfig", "ReplChannel", "Sandbox", "SandboxConfig",
    "SandboxError", "SandboxPool", "SandboxUnavailable", "describe_exit",
]
