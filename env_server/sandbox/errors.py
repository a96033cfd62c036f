"""What the sandbox layer raises: one vocabulary for every backend."""

from __future__ import annotations


class SandboxError(Exception):
    """A sandbox could not be created or started, or an operation on it failed; the message says why."""


class SandboxUnavailable(SandboxError):
    """No sandbox can be made now: the backend is unusable, the image is missing, or the pool is closed."""


class BackendUnavailable(SandboxUnavailable):
    """A backend's probe failed. `missing_image`: the backend works but has no such image (or root filesystem)."""

    def __init__(self, reason: str, *, missing_image: bool = False) -> None:
        super().__init__(reason)
        self.missing_image = missing_image
