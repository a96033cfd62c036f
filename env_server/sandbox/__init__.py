"""Docker sandboxes: one hardened container per session, a warm pool, a persistent channel to its REPL."""

from .channel import ChannelClosed, ReplChannel
from .config import DEFAULT_IMAGE, PoolConfig, SandboxConfig
from .docker_sandbox import Sandbox, SandboxError, describe_exit
from .labels import LABEL_INSTANCE, LABEL_MANAGED, LABEL_SERVER, LABEL_SESSION, selector
from .pool import PoolState, SandboxPool, SandboxUnavailable
from .result import ExecResult

__all__ = [
    "DEFAULT_IMAGE", "LABEL_INSTANCE", "LABEL_MANAGED", "LABEL_SERVER", "LABEL_SESSION",
    "ChannelClosed", "ExecResult", "PoolConfig", "PoolState", "ReplChannel", "Sandbox", "SandboxConfig",
    "SandboxError", "SandboxPool", "SandboxUnavailable", "describe_exit", "selector",
]
