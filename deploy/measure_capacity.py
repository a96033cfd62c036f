"""Measures what one session costs on this machine: sandbox memory, server memory and CPU per step.

    .venv/bin/python deploy/measure_capacity.py [--sessions 32] [--steps 400]

Starts a real server (tests.harness, loopback), opens N python sessions, and reads memory from each
sandbox container's cgroup (memory usage less inactive file cache, which is what `docker stats` shows)
and the server's RSS from /proc. Then it runs trivial steps round-robin over the sessions and reads
the CPU time the server process and the sandboxes' cgroups spent per step. docs/scaling.md turns
the figures into sessions per GiB and per core.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from env_server.sandbox.demand import available_memory_mib  # noqa: E402
from tests.harness import containers_of, docker_available, start_server  # noqa: E402
from tito.client import TitoClient  # noqa: E402
from tito.types import ToolCall  # noqa: E402

MIB = 1 << 20
TYPICAL = ("import json, re, math, collections, itertools, statistics, fractions, decimal\n"
           "data = [i * i for i in range(100_000)]\ntotal = sum(data)\nprint(total)")


def _cgroup_dir(controller: str, cid: str) -> Path | None:
    for d in (Path(f"/sys/fs/cgroup/{controller}/docker/{cid}"), Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope"),
              Path(f"/sys/fs/cgroup/docker/{cid}")):
        if d.is_dir():
            return d
    return None


def _stat(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines())}


def container_memory(cid: str) -> int:
    """Bytes in use less inactive file cache (docker stats' MEM USAGE)."""
    d = _cgroup_dir("memory", cid)
    if d is None:  # no cgroup files here: ask the daemon
        s = docker.from_env().api.stats(cid, stream=False)["memory_stats"]
        return s["usage"] - s.get("stats", {}).get("total_inactive_file", s.get("stats", {}).get("inactive_file", 0))
    if (d / "memory.current").exists():  # cgroup v2
        return int((d / "memory.current").read_text()) - _stat(d / "memory.stat").get("inactive_file", 0)
    return int((d / "memory.usage_in_bytes").read_text()) - _stat(d / "memory.stat").get("total_inactive_file", 0)


def container_cpu_s(cid: str) -> float:
    d = _cgroup_dir("cpuacct", cid) or _cgroup_dir("cpu", cid)
    if d is not None and (d / "cpuacct.usage").exists():
        return int((d / "cpuacct.usage").read_text()) / 1e9
    if d is not None and (d / "cpu.stat").exists():
        return _stat(d / "cpu.stat")["usage_usec"] / 1e6
    return docker.from_env().api.stats(cid, stream=False)["cpu_stats"]["cpu_usage"]["total_usage"] / 1e9


def process_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def process_pss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no Pss for pid {pid}")


def process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def shim_rss(container_ids: list[str]) -> list[int]:
    """PSS of each container's containerd shim: host memory per sandbox outside its cgroup (PSS shares
    the shim binary's pages out among the shims, where RSS would count them in each)."""
    wanted, found = set(container_ids), {}
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"-id" in argv and argv[0].endswith(b"containerd-shim-runc-v2"):
            cid = argv[argv.index(b"-id") + 1].decode()
            if cid in wanted:
                found[cid] = process_pss(int(proc.name))
    return list(found.values())


def session_memory(server_name: str, session_ids: list[str]) -> list[int]:
    by_session = {c.labels.get("tito.session"): c.id for c in containers_of(server_name)}
    return [container_memory(by_session[sid]) for sid in session_ids]


def summary(values: list[int]) -> str:
    values = sorted(values)
    return (f"mean {sum(values) / len(values) / MIB:.1f} MiB, median {values[len(values) // 2] / MIB:.1f}, "
            f"max {values[-1] / MIB:.1f}")


def churn(client: TitoClient, episodes: int) -> tuple[int, float]:
    """Short episodes back to back: each takes a fresh sandbox, so container starts set the pace."""
    async def episode() -> None:
        session = await client.aio.open_session("python")
        async with session:
            await session.step(tool_calls=[ToolCall("c", "run_python", '{"code": "1 + 1"}')])

    async def run_all() -> None:
        import asyncio

        gate = asyncio.Semaphore(8)

        async def gated() -> None:
            async with gate:
                await episode()
        await asyncio.gather(*(gated() for _ in range(episodes)))

    t0 = time.perf_counter()
    client.run(run_all())
    return episodes, time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--churn", type=int, default=40, help="short episodes for the churn figure")
    args = p.parse_args()
    if why := docker_available():
        print(f"error: {why}", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="tito-capacity-"))
    srv = start_server(tmp, env={"TITO_POOL__TARGET_SIZE": "4"})
    try:
        with TitoClient(srv.address) as client:
            client.wait_ready()
            client.list_environments()
            rss_start = process_rss(srv.proc.pid)
            from tito_assets.qwen_tokenizer import build_tokenizer_dir

            client.register_tokenizer(build_tokenizer_dir(template="qwen2_5"))
            rss_before = process_rss(srv.proc.pid)
            sessions = [client.open_session("python") for _ in range(args.sessions)]
            ids = [s.id for s in sessions]
            client.gather(s.aio.step(tool_calls=[ToolCall("c", "run_python", '{"code": "x = 1"}')]) for s in sessions)
            time.sleep(1)
            idle = session_memory(srv.server_name, ids)
            rss_after = process_rss(srv.proc.pid)
            client.gather(s.aio.step(tool_calls=[ToolCall("c", "run_python", json.dumps({"code": TYPICAL}))]) for s in sessions)
            time.sleep(1)
            typical = session_memory(srv.server_name, ids)

            by_session = {c.labels.get("tito.session"): c.id for c in containers_of(srv.server_name)}
            shims = shim_rss([by_session[i] for i in ids])
            cpu0 = process_cpu_s(srv.proc.pid), sum(container_cpu_s(by_session[i]) for i in ids)
            t0 = time.perf_counter()
            rounds = max(1, args.steps // len(sessions))
            for _ in range(rounds):
                client.gather(s.aio.step(tool_calls=[ToolCall("c", "run_python", '{"code": "x += 1"}')])
                              for s in sessions)
            wall = time.perf_counter() - t0
            steps = rounds * len(sessions)
            cpu1 = process_cpu_s(srv.proc.pid), sum(container_cpu_s(by_session[i]) for i in ids)
            for s in sessions:
                s.close()
            churn_n, churn_s = churn(client, args.churn)
    finally:
        srv.terminate()

    print(f"machine: {os.cpu_count()} cores; {args.sessions} python sessions on one server")
    print(f"sandbox memory, idle REPL after one call:       {summary(idle)}")
    print(f"sandbox memory, after a typical call (imports + 100k-int list kept): {summary(typical)}")
    if shims:
        print(f"containerd shim per sandbox (host memory outside the cgroup): {summary(shims)}")
    print(f"server RSS: {rss_start / MIB:.0f} MiB at start, {rss_before / MIB:.0f} MiB with the Qwen tokenizer registered, "
          f"+{(rss_after - rss_before) / MIB / args.sessions:.2f} MiB per open session")
    per_session = (sum(typical) / len(typical) + (sum(shims) / len(shims) if shims else 0)
                   + (rss_after - rss_before) / args.sessions) / MIB
    free = available_memory_mib()
    print(f"memory per session (typical sandbox + shim + server share): {per_session:.1f} MiB = "
          f"{int(1024 / per_session)} sessions per GiB"
          + (f"; this machine's available memory ({free:.0f} MiB) holds ~{int(free / per_session)}" if free else ""))
    print(f"{steps} trivial steps in {wall:.2f} s ({steps / wall:.0f} steps/s, {len(sessions)} concurrent)")
    print(f"churn: {churn_n} episodes (open, one step, close; 8 at a time) in {churn_s:.1f} s = "
          f"{churn_n / churn_s:.1f} episodes/s, bounded by container starts (pool refill)")
    print(f"CPU per step: server {(cpu1[0] - cpu0[0]) / steps * 1e3:.2f} ms, sandbox {(cpu1[1] - cpu0[1]) / steps * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
