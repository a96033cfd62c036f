"""The sandbox backends by name: the one place that knows them all (backend.py is only the interface)."""

from __future__ import annotations

from .backend import SandboxBackend
from .config import SandboxConfig


def make_sandbox_backend(config: SandboxConfig, *, server_name: str, instance_id: str,
                         threads: int = 12) -> SandboxBackend:
    """The backend `sandbox.backend` names, for one server instance; `threads`: how many of its blocking calls may
    run at once."""
    if config.backend == "bwrap":
        from .bwrap.backend import BwrapBackend

        return BwrapBackend(config, server_name=server_name, instance_id=instance_id)
    from .docker.backend import DockerBackend

    return DockerBackend(config, server_name=server_name, instance_id=instance_id, connections=threads + 4)
