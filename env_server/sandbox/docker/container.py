"""One container through docker-py's low-level API, in the spirit of its `Container` model: the Docker
backend's `SandboxHandle`.

The low-level `APIClient` rather than `client.containers`: the high-level `create` ends with an
extra inspect round trip (`self.get(id)`) per sandbox, and the attach stream must be taken
before `start` so no output is missed. Every method blocks: call them in the pool's executor.
"""

from __future__ import annotations

import socket
import ssl
from typing import Any, Callable

import docker
import docker.errors
import requests

from ..backend import ExitInfo
from ..errors import SandboxError


class ContainerHandle:
    def __init__(self, api: docker.APIClient, container_id: str) -> None:
        self.api = api
        self.id = container_id
        # Called once the container is gone (the backend gives its host uid back, uids.py).
        self.on_removed: Callable[[], None] | None = None

    @classmethod
    def create(cls, api: docker.APIClient, **kwargs: Any) -> ContainerHandle:
        return cls(api, api.create_container(**kwargs)["Id"])

    def attach_socket(self) -> socket.socket:
        """The container's stdin/stdout/stderr as a plain socket the caller owns."""
        attached = self.api.attach_socket(self.id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
        # Take the fd out of the SDK's hijacked-socket wrapper so nothing else can close it.
        raw = getattr(attached, "_sock", attached)
        if isinstance(raw, ssl.SSLSocket) or not isinstance(raw, socket.socket):
            raise OSError(f"the attach stream is a {type(raw).__name__}; only unix-socket or plain-TCP Docker "
                          "endpoints are supported (mount /var/run/docker.sock)")
        return socket.socket(fileno=raw.detach())

    def start(self) -> None:
        self.api.start(self.id)

    def signal(self, sig: str) -> None:
        self.api.kill(self.id, signal=sig)

    def exit_info(self, wait_s: float) -> ExitInfo:
        try:
            self.api.wait(self.id, timeout=wait_s)
        except Exception:  # noqa: BLE001 - still running (the REPL closed its channel), or gone: inspected below
            pass
        try:
            state = self.api.inspect_container(self.id)["State"]
        except docker.errors.NotFound:
            raise SandboxError("container removed from outside") from None
        except (requests.exceptions.ConnectionError, OSError) as exc:
            # dockerd stopping stops its containers (unless it runs with live-restore): the likely cause.
            raise SandboxError(f"the Docker daemon could not be reached ({type(exc).__name__}): it stopped or "
                               "restarted, which stops its containers") from None
        if state.get("Running"):
            self.signal("SIGKILL")
        code = state.get("ExitCode")
        return ExitInfo(running=bool(state.get("Running")), exit_code=code if isinstance(code, int) else None,
                        oom_killed=bool(state.get("OOMKilled")))

    def remove(self) -> bool:
        """Force-removes it; False if it was already gone."""
        try:
            self.api.remove_container(self.id, force=True)
            removed = True
        except docker.errors.NotFound:
            removed = False
        if self.on_removed is not None:
            self.on_removed()
        return removed
