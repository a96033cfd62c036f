"""Per-container host uids: each live sandbox container runs as a uid:gid of its own from a configured range.

Per-user kernel quotas (inotify instances and watches, POSIX message queue bytes, pipe pages, RLIMIT_NPROC)
are counted by the host uid. With one uid for every container, one session could take them all from every
other; with a uid each, as Podman's `--userns=auto` gives, a session can only exhaust its own. A uid is held
from the container's create (a warm pool's containers hold theirs) until it is removed, then goes back.

One range is shared by every backend of the process with the same bounds (`shared_range`): a server's pools (one
per image) never hand out the same uid. Taking is next-fit from a random point of the range, so a freed uid is not
handed out again at once and two servers on one daemon rarely meet; the uids that other servers' live containers
carry (label `tito.uid`) when this one starts are skipped. Servers that must never share a uid get disjoint ranges.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable

from ..errors import SandboxError

LABEL_UID = "tito.uid"


class UidRange:
    """The uids [start, start + size) and which of them live containers hold. Thread-safe."""

    def __init__(self, start: int, size: int) -> None:
        self.start = start
        self.size = size
        self._held: dict[int, str] = {}  # uid -> its holder (the sandbox's session id)
        self._foreign: set[int] = set()  # held by other servers' containers at start-up
        self._next = random.randrange(size) if size else 0
        self._lock = threading.Lock()

    def take(self, holder: str) -> int:
        """A free uid, now held by `holder`. Raises SandboxError when every uid of the range is held."""
        with self._lock:
            for _ in range(self.size):
                uid = self.start + self._next
                self._next = (self._next + 1) % self.size
                if uid not in self._held and uid not in self._foreign:
                    self._held[uid] = holder
                    return uid
        raise SandboxError(
            f"all {self.size} host uids of sandbox.uid_range_start={self.start} / uid_range_size={self.size} are "
            "held by live sandboxes; widen sandbox.uid_range_size (or close sessions)")

    def release(self, uid: int | str | None, holder: str | None) -> None:
        """Gives back a uid (a container's label value; None: nothing) if `holder` still holds it: a second
        release (a sweep after the sandbox's own removal) never frees a uid that another sandbox took since."""
        try:
            value = int(uid) if uid is not None else None
        except ValueError:
            return
        with self._lock:
            if value is not None and self._held.get(value) == holder:
                del self._held[value]

    def skip_foreign(self, uids: Iterable[str | int]) -> None:
        """Marks uids that other servers' live containers hold (their `tito.uid` labels) as not to be taken."""
        found = set()
        for uid in uids:
            try:
                found.add(int(uid))
            except ValueError:
                continue
        with self._lock:
            self._foreign = found - self._held.keys()

    def holds(self, uid: int) -> bool:
        with self._lock:
            return uid in self._held


_shared: dict[tuple[int, int], UidRange] = {}
_shared_lock = threading.Lock()


def shared_range(start: int, size: int) -> UidRange:
    """The process's one `UidRange` for these bounds."""
    with _shared_lock:
        if (start, size) not in _shared:
            _shared[(start, size)] = UidRange(start, size)
        return _shared[(start, size)]
