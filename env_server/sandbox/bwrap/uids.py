"""One host uid per live sandbox, for a server running as root (like Docker's userns-remap or Podman's
--userns=auto).

The kernel keeps some quotas per user: inotify instances and watches, POSIX message queue bytes
(RLIMIT_MSGQUEUE), pipe buffer pages, RLIMIT_NPROC. Sandboxes that share a host uid share those, and one session
could take them all from every other. So each sandbox runs as a uid of its own from a configured range
(sandbox.bwrap.uid_range_start/uid_range_size), given back when the sandbox is gone. A uid is held by an flock on
a file named after it in a folder of the host: several servers on one host (or one restarted before its old
sandboxes died) never hand out the same uid twice, and a server that dies gives its uids back with its fds.
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import threading
from pathlib import Path

from ..errors import SandboxError

log = logging.getLogger(__name__)
LOCK_DIR = Path("/run/tito-uids")


class UidLease:
    """A uid held for one sandbox; `release` gives it back (idempotent)."""

    def __init__(self, pool: UidPool, uid: int, fd: int | None) -> None:
        self.pool = pool
        self.uid = uid
        self._fd = fd
        self.released = False

    @property
    def user(self) -> str:
        return f"{self.uid}:{self.uid}"

    def release(self) -> None:
        self.pool._release(self)

    def __del__(self) -> None:  # a sandbox dropped without remove(): its uid is not lost for good
        try:
            self.release()
        except Exception:  # noqa: BLE001 - at interpreter shutdown
            pass


class UidPool:
    """The uids of [start, start + size), one lease per live sandbox."""

    def __init__(self, start: int, size: int, lock_dir: Path = LOCK_DIR) -> None:
        self.start, self.size = start, size
        self.lock_dir = lock_dir
        self._held: set[int] = set()
        self._lock = threading.RLock()  # RLock: a lease's __del__ may run inside take()
        self._next = random.randrange(size)  # servers starting together do not try the same uids first
        self._shared_locks = True
        try:
            lock_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            self._shared_locks = False
            log.warning("bwrap sandboxes: cannot make %s (%s): sandbox uids are unique within this server only; "
                        "another server on this host may hand out the same ones", lock_dir, exc)
        for path in ("/etc/subuid", "/etc/subgid"):
            for owner, first, count in _subordinate_ranges(path):
                if first < start + size and start < first + count:
                    log.warning("bwrap sandboxes: the sandbox uid range %d-%d overlaps %s's range of %s (%d-%d): its "
                                "containers and these sandboxes would share per-user quotas; move "
                                "sandbox.bwrap.uid_range_start", start, start + size - 1, owner, path, first,
                                first + count - 1)

    def take(self) -> UidLease:
        with self._lock:
            for _ in range(self.size):
                uid = self.start + self._next
                self._next = (self._next + 1) % self.size
                if uid in self._held:
                    continue
                fd = self._lock_file(uid)
                if fd is None and self._shared_locks:
                    continue  # held by another server
                self._held.add(uid)
                return UidLease(self, uid, fd)
        raise SandboxError(f"all {self.size} sandbox uids from {self.start} are in use (sandbox.bwrap.uid_range_size "
                           "bounds the live sandboxes of a root server); close sessions or widen the range")

    def _lock_file(self, uid: int) -> int | None:
        if not self._shared_locks:
            return None
        fd = os.open(self.lock_dir / str(uid), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        return fd

    def _release(self, lease: UidLease) -> None:
        with self._lock:
            if lease.released:
                return
            lease.released = True
            fd, lease._fd = lease._fd, None
            if fd is not None:
                os.close(fd)
            self._held.discard(lease.uid)


def _subordinate_ranges(path: str) -> list[tuple[str, int, int]]:
    """(owner, first, count) of each line of /etc/subuid or /etc/subgid; none where it is missing."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        owner, _, rest = line.partition(":")
        first, _, count = rest.partition(":")
        if first.strip().isdigit() and count.strip().isdigit():
            found.append((owner, int(first), int(count)))
    return found
