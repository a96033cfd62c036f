"""The two sandbox backends side by side, in one run on this machine: Docker (runc) and bwrap.

    .venv/bin/python bench/bench_backends.py [--backends docker,bwrap] [--cold 20] [--lifecycles 32]
                                             [--idle 16] [--steps 300] [--bursts 16,64,128]

For each backend, what the issue that brought bwrap asks for (issue 23):
- cold start p50: one sandbox made from nothing to a ready REPL (`Sandbox.create`, in this process, no pool),
  destroyed between starts;
- CPU-seconds per session lifecycle: OpenSession -> one run_python Step -> CloseSession through a real server
  whose pool keeps nothing warm (so every open starts a sandbox and every close removes one), sequentially; the
  CPU counted is the server's (its reaped children included: bwrap's processes), dockerd's, containerd's and its
  shims' (live ones, and through pid 1's reaped children those that exited), divided by the lifecycles. That
  misses processes killed without being reaped by a counted parent (a bwrap sandbox's REPL dies with its pid
  namespace), so for bwrap the server also runs in a cpuacct cgroup of the bench's own and
  `cpu_s_per_lifecycle_cpuacct` is everything charged there: the server and every process of its sandboxes;
- memory per idle session: N sessions open and idle, each sandbox's cgroup memory less inactive file cache
  (what `docker stats` shows), plus each container's shim (PSS) under Docker;
- Step p50: a trivial run_python Step over gRPC, one session of a warm pool;
- first burst of N: N concurrent opens (each with one Step, then a close) on a fresh server whose pool has a
  floor of 4 and has never seen N: the wall time until all N answered.
The machine should be otherwise idle: CPU is counted per process, but other load still slows the wall times.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from env_server.sandbox import PoolConfig, Sandbox, SandboxConfig, SandboxPool  # noqa: E402
from tests.harness import (  # noqa: E402
    bwrap_available,
    bwrap_sandboxes_of,
    containers_of,
    docker_available,
    start_server,
)
from tito.client import AsyncTitoClient, StepStatus, TitoClient  # noqa: E402
from tito.types import ToolCall  # noqa: E402

MIB = 1 << 20
TICK = os.sysconf("SC_CLK_TCK")
CALL = [ToolCall("c", "run_python", '{"code": "1 + 1"}')]


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


# -- CPU ------------------------------------------------------------------------------------------------

def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def cpu_ticks(server_pid: int) -> int:
    """CPU ticks of the server and the container machinery, own and reaped children's (pid 1: reaped only)."""
    total = 0
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        pid = int(p.name)
        comm = _comm(pid)
        fields = _stat(pid)
        if fields is None:
            continue
        own, children = int(fields[11]) + int(fields[12]), int(fields[13]) + int(fields[14])
        if pid == server_pid or comm in ("dockerd", "containerd") or comm.startswith("containerd-shim"):
            total += own + children
        elif pid == 1:
            total += children
    return total


# -- memory -----------------------------------------------------------------------------------------------

def _memory_less_inactive(cgroup_dir: Path) -> int:
    stat = dict(line.split() for line in (cgroup_dir / "memory.stat").read_text().splitlines())
    if (cgroup_dir / "memory.current").exists():
        return int((cgroup_dir / "memory.current").read_text()) - int(stat.get("inactive_file", 0))
    return int((cgroup_dir / "memory.usage_in_bytes").read_text()) - int(stat.get("total_inactive_file", 0))


def _find_cgroup(name: str, under: str = "/sys/fs/cgroup") -> Path | None:
    for root, dirs, _ in os.walk(under):
        if name in dirs and ("memory" in root or (Path(root) / name / "memory.current").exists()):
            return Path(root) / name
    return None


def sandbox_memory(backend: str, server_name: str) -> list[int]:
    """Bytes per live sandbox of a server (its cgroup less inactive file cache; + its shim's PSS for Docker)."""
    from deploy.measure_capacity import container_memory, shim_rss

    if backend == "docker":
        ids = [c.id for c in containers_of(server_name)]
        shims = shim_rss(ids)
        per_shim = statistics.fmean(shims) if shims else 0.0
        return [container_memory(cid) + int(per_shim) for cid in ids]
    found = []
    for sb in bwrap_sandboxes_of(server_name, running_only=True):
        d = _find_cgroup(sb.id, "/sys/fs/cgroup/memory") or _find_cgroup(sb.id)
        if d is not None:
            found.append(_memory_less_inactive(d))
    return found


# -- the measurements --------------------------------------------------------------------------------------

async def cold_starts(backend: str, n: int) -> list[float]:
    config = SandboxConfig(backend=backend)
    pool = SandboxPool(config, PoolConfig(target_size=0, learn_demand=False), server_name="bench-cold",
                       instance_id=f"cold-{backend}")
    await pool.start()
    assert pool.ready, pool.reason
    executor = concurrent.futures.ThreadPoolExecutor(4)
    times = []
    try:
        for _ in range(n):
            t0 = time.perf_counter()
            sb = await Sandbox.create(pool.backend, config, executor=executor)
            times.append(time.perf_counter() - t0)
            await sb.destroy()
    finally:
        executor.shutdown()
        await pool.close()
    return times


def server(tmp: Path, backend: str, **env: str):
    return start_server(tmp, backend=backend, env={k: str(v) for k, v in env.items()})


class CpuacctGroup:
    """A cgroup v1 cpuacct group of the bench's own that the server is moved into before it starts any sandbox.

    Everything the server starts afterwards is charged to it: bwrap's processes join the sandbox's memory, pids
    and cpu cgroups, never cpuacct, and where cpu and cpuacct share a hierarchy the sandbox's cgroup lies below
    the server's. Unlike reaped children's times it also counts processes that were killed and never reaped by a
    counted parent (a sandbox's REPL, killed with its pid namespace). None where there is no writable cpuacct."""

    ROOTS = (Path("/sys/fs/cgroup/cpuacct"), Path("/sys/fs/cgroup/cpu,cpuacct"))

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, pid: int) -> CpuacctGroup | None:
        for root in cls.ROOTS:
            if (root / "cpuacct.usage").exists():
                own = Path(f"/proc/{pid}/cgroup").read_text()
                rel = next((line.split(":", 2)[2] for line in own.splitlines() if "cpuacct" in line.split(":")[1]),
                           "/")
                try:
                    path = root / rel.strip("/") / f"tito-bench-{pid}"
                    path.mkdir()
                    (path / "cgroup.procs").write_text(str(pid))
                except OSError:
                    return None
                return cls(path)
        return None

    def usage_s(self) -> float:
        return int((self.path / "cpuacct.usage").read_text()) / 1e9

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def lifecycles(tmp: Path, backend: str, n: int) -> tuple[float, float | None]:
    """CPU-seconds per lifecycle: (reaped children's count, the cpuacct group's count or None)."""
    srv = server(tmp, backend, TITO_POOL__TARGET_SIZE=0, TITO_POOL__LEARN_DEMAND="false")
    group = CpuacctGroup.make(srv.proc.pid) if backend == "bwrap" else None
    try:
        with TitoClient(srv.address) as client:
            with client.open_session("python") as s:  # the first: imports, connections
                s.step(tool_calls=CALL)
            time.sleep(1.0)
            before, before_group = cpu_ticks(srv.proc.pid), group.usage_s() if group else 0.0
            for _ in range(n):
                with client.open_session("python") as s:
                    assert s.step(tool_calls=CALL).status is StepStatus.OK
            time.sleep(1.0)  # removals finish (the close answers before the sandbox is gone)
            reaped = (cpu_ticks(srv.proc.pid) - before) / TICK / n
            return reaped, (group.usage_s() - before_group) / n if group else None
    finally:
        srv.terminate()
        if group is not None:
            group.remove()


def idle_memory(tmp: Path, backend: str, n: int) -> float:
    srv = server(tmp, backend, TITO_POOL__TARGET_SIZE=0, TITO_POOL__LEARN_DEMAND="false")
    try:
        with TitoClient(srv.address) as client:
            sessions = [client.open_session("python") for _ in range(n)]
            for s in sessions:
                s.step(tool_calls=CALL)
            time.sleep(2.0)
            per = sandbox_memory(backend, srv.server_name)
            for s in sessions:
                s.close()
        return statistics.fmean(per) / MIB if per else float("nan")
    finally:
        srv.terminate()


def step_latencies(tmp: Path, backend: str, n: int) -> list[float]:
    srv = server(tmp, backend, TITO_POOL__TARGET_SIZE=2)
    try:
        with TitoClient(srv.address) as client, client.open_session("python") as s:
            for _ in range(20):
                s.step(tool_calls=CALL)
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                s.step(tool_calls=CALL)
                times.append(time.perf_counter() - t0)
            return times
    finally:
        srv.terminate()


async def _burst(address: str, n: int) -> float:
    async with AsyncTitoClient(address, deadline_s=600) as client:
        await client.wait_ready()

        async def one() -> bool:
            async with await client.open_session("python") as s:
                return (await s.step(tool_calls=CALL)).status is StepStatus.OK

        t0 = time.perf_counter()
        ok = await asyncio.gather(*(one() for _ in range(n)))
        assert all(ok)
        return time.perf_counter() - t0


def pool_depth(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    m = re.search(rf'^tito_pool_depth{{image="{re.escape(SandboxConfig().image)}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


def first_burst(tmp: Path, backend: str, n: int) -> float:
    srv = server(tmp, backend, TITO_POOL__TARGET_SIZE=4, TITO_POOL__LEARN_DEMAND="true")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and pool_depth(srv.metrics_port) < 4:
            time.sleep(0.2)  # the floor of 4 is warm, as on a server that has been up a while
        return asyncio.run(_burst(srv.address, n))
    finally:
        srv.terminate()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="docker,bwrap")
    ap.add_argument("--cold", type=int, default=20)
    ap.add_argument("--lifecycles", type=int, default=32)
    ap.add_argument("--idle", type=int, default=16)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--bursts", default="16,64,128")
    args = ap.parse_args()
    backends = args.backends.split(",")
    for b in backends:
        why = docker_available() if b == "docker" else bwrap_available()
        if why:
            print(f"{b}: {why}", file=sys.stderr)
            return 1
    tmp = Path(tempfile.mkdtemp(prefix="tito-bench-backends-"))
    results: dict[str, dict[str, float]] = {}
    for b in backends:
        r: dict[str, float] = {}
        cold = asyncio.run(cold_starts(b, args.cold))
        r["cold_start_p50_ms"] = pct(cold, 50) * 1000
        r["cpu_s_per_lifecycle"], in_group = lifecycles(tmp, b, args.lifecycles)
        if in_group is not None:
            r["cpu_s_per_lifecycle_cpuacct"] = in_group
        r["idle_session_mib"] = idle_memory(tmp, b, args.idle)
        r["step_p50_ms"] = pct(step_latencies(tmp, b, args.steps), 50) * 1000
        for n in (int(x) for x in args.bursts.split(",")):
            r[f"first_burst_{n}_s"] = first_burst(tmp, b, n)
        results[b] = r
        print(f"{b}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items()), flush=True)
    names = list(dict.fromkeys(k for r in results.values() for k in r))
    print(f"\n{'figure':<30}" + "".join(f"{b:>12}" for b in backends))
    for name in names:
        print(f"{name:<30}" + "".join(f"{results[b][name]:>12.3f}" if name in results[b] else f"{'-':>12}"
                                      for b in backends))
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
