"""The disk a backend writes for every sandbox it starts, kept from filling: below `sandbox.min_free_disk_mb`
free, no sandbox starts and the pool reports why (health NOT_SERVING, opens answered UNAVAILABLE with this
message); the pool's probe re-checks and serving resumes once space returns.

Docker writes each container's layer, config and log under its data root (`docker info`'s DockerRootDir);
bwrap sandboxes write to tmpfs only, so for them the disk watched is the one holding the root filesystems,
which a rebuild needs. `sandbox.disk_path` names another path (a server in a container that sees the data
root elsewhere). A path the server cannot see is not checked (said once in the log).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from .errors import BackendUnavailable

log = logging.getLogger(__name__)
MIB = 1024 * 1024


@dataclass
class DiskGuard:
    path: str | None  # None: nothing to check from here
    what: str  # what lives there, for the message: "Docker's data root", ...
    min_free_bytes: int

    def free_bytes(self) -> int | None:
        if self.path is None:
            return None
        try:
            st = os.statvfs(self.path)
        except OSError:
            return None
        return st.f_bavail * st.f_frsize

    def check(self) -> None:
        """Raises BackendUnavailable when the disk holding `path` has less than `min_free_bytes` free."""
        if not self.min_free_bytes:
            return
        free = self.free_bytes()
        if free is not None and free < self.min_free_bytes:
            raise BackendUnavailable(
                f"the disk holding {self.what} ({self.path}) has {free / MIB:.0f} MiB free, under "
                f"sandbox.min_free_disk_mb={self.min_free_bytes // MIB}: no sandbox starts until space is freed there "
                "(docker system prune, old images and logs, or a larger disk); the server retries by itself")


def guard_for(path: str | None, what: str, *, override: str | None, min_free_mb: int) -> DiskGuard:
    """The guard of a backend's disk: `override` (sandbox.disk_path) wins; a path not visible here is not checked."""
    chosen = override or path
    if chosen and not os.path.exists(chosen):
        log.info("disk guard: %s (%s) is not visible from this server; its free space is not checked "
                 "(sandbox.disk_path names a path that is)", what, chosen)
        chosen = None
    return DiskGuard(chosen, what if not override else f"{what} (sandbox.disk_path)", min_free_mb * MIB)
