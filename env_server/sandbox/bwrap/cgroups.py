"""Per-sandbox cgroups for the bwrap backend: pids, memory without swap, and a CPU quota.

Where the server may write cgroups, each sandbox gets its own, named after the server, its instance and the
sandbox, under a parent the server may write:

    v2 (unified): <parent>/tito-<server>/<instance>/<sandbox>; the controllers are enabled in each
                  cgroup.subtree_control on the way down. <parent>: sandbox.bwrap.cgroup_parent, else the
                  root cgroup if the server is in it, else the parent of the server's own cgroup (where its
                  controllers come from: a systemd unit's slice, a delegated subtree).
    v1 (or hybrid: v1 controllers, a controller-less v2 tree beside them): the same path below the server's
                  own cgroup in each controller's hierarchy (memory, pids, cpu).

Where it may not (an unprivileged server without a delegated subtree: the usual Slurm job), `CgroupTree.missing`
names the limits it cannot set and why; the backend then falls back to rlimits and says so. Every file write
here is a few microseconds; nothing polls.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class CgroupLimits:
    pids: int
    memory_bytes: int
    cpu_quota_us: int  # per CPU_PERIOD_US; 100_000 = one CPU


class SandboxCgroup:
    """One sandbox's cgroup: a directory (v2) or one per controller (v1)."""

    def __init__(self, dirs: dict[str, Path], version: int) -> None:
        self.dirs = dirs  # controller -> its directory (v2: the same one for all)
        self.version = version

    @property
    def procs_files(self) -> list[str]:
        """Where a process writes its pid to join (one file per distinct directory)."""
        return sorted({str(d / "cgroup.procs") for d in self.dirs.values()})

    def _read(self, controller: str, name: str) -> str | None:
        d = self.dirs.get(controller)
        if d is None:
            return None
        try:
            return (d / name).read_text()
        except OSError:
            return None

    def oom_kills(self) -> int:
        """How many processes its memory limit's OOM killer has killed."""
        text = self._read("memory", "memory.events" if self.version == 2 else "memory.oom_control") or ""
        m = re.search(r"^oom_kill (\d+)$", text, re.M)
        return int(m.group(1)) if m else 0

    def memory_bytes(self) -> int | None:
        """Memory charged to it now (page cache included)."""
        text = self._read("memory", "memory.current" if self.version == 2 else "memory.usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def pids(self) -> set[int]:
        found: set[int] = set()
        for d in set(self.dirs.values()):
            with contextlib.suppress(OSError):
                found.update(int(p) for p in (d / "cgroup.procs").read_text().split())
        return found

    def kill(self) -> None:
        """SIGKILL to every process in it (v2 with cgroup.kill: atomically, new forks included)."""
        if self.version == 2:
            for d in set(self.dirs.values()):
                with contextlib.suppress(OSError):  # before kernel 5.14 there is no cgroup.kill
                    (d / "cgroup.kill").write_text("1")
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, wait_s: float = 2.0) -> bool:
        """Kills what is left in it and removes its directories; False if they were gone already."""
        existed = False
        deadline = time.monotonic() + wait_s
        for d in set(self.dirs.values()):
            while True:
                try:
                    d.rmdir()
                    existed = True
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                        log.warning("could not remove cgroup %s: %s", d, exc)
                        break
                    self.kill()
                    time.sleep(0.01)
        return existed


class CgroupTree:
    """The cgroups of one server instance's sandboxes, or why there are none."""

    def __init__(self, server_name: str, instance_id: str, *, parent: str | None = None, enabled: bool = True):
        self.server_name = server_name
        self.instance_id = instance_id
        self.version = 0
        self.bases: dict[str, Path] = {}  # controller -> <parent>/tito-<server>
        self.missing: dict[str, str] = {}  # controller -> why it cannot be limited
        if not enabled:
            self.missing = {c: "sandbox.bwrap.cgroups is off" for c in CONTROLLERS}
            return
        try:
            if (CGROUP_ROOT / "cgroup.controllers").exists():
                self.version = 2
                self._setup_v2(parent)
            else:
                self.version = 1
                self._setup_v1(parent)
        except OSError as exc:  # /proc or /sys unreadable: no cgroups, said once
            self.missing = {c: f"cannot read the cgroup hierarchy ({exc})" for c in CONTROLLERS}
        for c in CONTROLLERS:
            if c not in self.bases and c not in self.missing:
                self.missing[c] = "no such controller here"

    @property
    def limited(self) -> tuple[str, ...]:
        return tuple(c for c in CONTROLLERS if c in self.bases)

    # -- finding where to write ---------------------------------------------------------------------

    def _own_paths(self) -> dict[str, str]:
        """The server's own cgroup per controller ('' for the v2 line)."""
        paths: dict[str, str] = {}
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                paths[c] = path
        return paths

    def _setup_v2(self, parent: str | None) -> None:
        own = self._own_paths().get("", "/")
        base_rel = parent if parent is not None else (own if own == "/" else os.path.dirname(own.rstrip("/")))
        base = CGROUP_ROOT / base_rel.strip("/")
        server_dir = base / f"tito-{self.server_name}"
        try:
            available = set((base / "cgroup.controllers").read_text().split())
            self._enable(base, available)
            server_dir.mkdir(exist_ok=True)
            self._enable(server_dir, available)
        except OSError as exc:
            why = f"cannot write cgroups below {base} ({exc.strerror or exc})"
            self.missing = {c: why for c in CONTROLLERS}
            return
        enabled = set((server_dir / "cgroup.subtree_control").read_text().split())
        for c in CONTROLLERS:
            if c in enabled:
                self.bases[c] = server_dir
            else:
                self.missing[c] = f"the {c} controller is not delegated to {base}"

    @staticmethod
    def _enable(cgroup: Path, available: set[str]) -> None:
        """Turns on the wanted controllers for the children of `cgroup` (each on its own: one may be refused)."""
        control = cgroup / "cgroup.subtree_control"
        have = set(control.read_text().split())
        for c in CONTROLLERS:
            if c in available and c not in have:
                with contextlib.suppress(OSError):
                    control.write_text(f"+{c}")

    def _setup_v1(self, parent: str | None) -> None:
        own = self._own_paths()
        mounts = _v1_mounts()
        for c in CONTROLLERS:
            mount = mounts.get(c)
            if mount is None:
                continue
            rel = parent if parent is not None else own.get(c, "/")
            server_dir = mount / rel.strip("/") / f"tito-{self.server_name}"
            try:
                server_dir.mkdir(parents=True, exist_ok=True)
                if c == "cpu" and not (server_dir / "cpu.cfs_quota_us").exists():
                    raise OSError(errno.ENOENT, "no CFS quota (cpu.cfs_quota_us)")
            except OSError as exc:
                self.missing[c] = f"cannot write {server_dir} ({exc.strerror or exc})"
                continue
            self.bases[c] = server_dir

    # -- sandboxes ------------------------------------------------------------------------------------

    def create(self, sandbox: str, limits: CgroupLimits) -> SandboxCgroup | None:
        """A new cgroup for one sandbox with its limits written, or None where no controller can be used.
        Raises OSError if it cannot be made where it could before."""
        if not self.bases:
            return None
        dirs: dict[str, Path] = {}
        made: list[Path] = []
        try:
            for c, base in self.bases.items():
                d = base / self.instance_id / sandbox
                if d not in made:
                    instance = base / self.instance_id
                    if not instance.exists():
                        instance.mkdir(exist_ok=True)
                        if self.version == 2:
                            self._enable(instance, set((base / "cgroup.subtree_control").read_text().split()))
                    d.mkdir()
                    made.append(d)
                dirs[c] = d
            cgroup = SandboxCgroup(dirs, self.version)
            self._write_limits(cgroup, limits)
        except OSError:
            for d in made:
                with contextlib.suppress(OSError):
                    d.rmdir()
            raise
        return cgroup

    def _write_limits(self, cgroup: SandboxCgroup, limits: CgroupLimits) -> None:
        d = cgroup.dirs
        if self.version == 2:
            if "pids" in d:
                (d["pids"] / "pids.max").write_text(str(limits.pids))
            if "memory" in d:
                (d["memory"] / "memory.max").write_text(str(limits.memory_bytes))
                swap = d["memory"] / "memory.swap.max"
                if swap.exists():
                    swap.write_text("0")
            if "cpu" in d:
                (d["cpu"] / "cpu.max").write_text(f"{limits.cpu_quota_us} {CPU_PERIOD_US}")
            return
        if "pids" in d:
            (d["pids"] / "pids.max").write_text(str(limits.pids))
        if "memory" in d:
            (d["memory"] / "memory.limit_in_bytes").write_text(str(limits.memory_bytes))
            memsw = d["memory"] / "memory.memsw.limit_in_bytes"
            if memsw.exists():  # swap accounting on: memory + swap capped at the same figure, i.e. no swap
                memsw.write_text(str(limits.memory_bytes))
            else:
                with contextlib.suppress(OSError):
                    (d["memory"] / "memory.swappiness").write_text("0")
        if "cpu" in d:
            (d["cpu"] / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
            (d["cpu"] / "cpu.cfs_quota_us").write_text(str(limits.cpu_quota_us))

    def instances(self) -> set[str]:
        """The instance directories of this server name there are now."""
        found: set[str] = set()
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                found.update(p.name for p in base.iterdir() if p.is_dir())
        return found

    def sandboxes(self, instance: str) -> list[SandboxCgroup]:
        """The sandbox cgroups of one instance (of this server name)."""
        names: set[str] = set()
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                names.update(p.name for p in (base / instance).iterdir() if p.is_dir())
        return [SandboxCgroup({c: base / instance / n for c, base in self.bases.items()}, self.version)
                for n in sorted(names)]

    def remove_instance(self, instance: str) -> int:
        """Kills and removes every sandbox cgroup of `instance`, then the instance's own; how many sandboxes."""
        cgroups = self.sandboxes(instance)
        for cg in cgroups:
            cg.kill()
        removed = sum(cg.remove() for cg in cgroups)
        for base in self.bases.values():
            with contextlib.suppress(OSError):
                (base / instance).rmdir()
        return removed


def _v1_mounts() -> dict[str, Path]:
    """controller -> the mount point of the v1 hierarchy that has it (from /proc/self/mountinfo)."""
    mounts: dict[str, Path] = {}
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        fields, extra = left.split(), right.split()
        if len(extra) < 3 or extra[0] != "cgroup":
            continue
        options = set(extra[2].split(","))
        for c in CONTROLLERS:
            if c in options and c not in mounts:
                mounts[c] = Path(fields[4])
    return mounts
