"""An open storm: N OpenSession calls at once against a real server, next to one cold container start.

    .venv/bin/python bench/bench_storm.py [--sessions 256] [--pool-size 2] [--max-sessions 1024|auto]

Prints the storm's wall time (first open sent -> last session ready), how many opens failed and why,
the open latency p50/p99, and the baseline measured in the same run: the time one cold sandbox takes
to start (OpenSession on an idle server whose warm pool is disabled), times N / the start slots, which
is what the storm costs if starts are the only work.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import containers_of, docker_available, start_server  # noqa: E402
from tito.client import AsyncTitoClient, TitoError  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


async def cold_start_s(address: str, tries: int) -> float:
    async with AsyncTitoClient(address, deadline_s=120) as client:
        await client.wait_ready()
        times = []
        for _ in range(tries):
            t0 = time.perf_counter()
            session = await client.open_session("python")
            times.append(time.perf_counter() - t0)
            await session.close()
        return sorted(times)[len(times) // 2]


async def storm(address: str, n: int) -> tuple[float, list[float], Counter]:
    async with AsyncTitoClient(address, deadline_s=600, retries=0) as client:
        await client.wait_ready()
        latencies: list[float] = []
        failures: Counter = Counter()
        sessions = []

        async def one() -> None:
            t0 = time.perf_counter()
            try:
                sessions.append(await client.open_session("python"))
                latencies.append(time.perf_counter() - t0)
            except TitoError as e:
                failures[f"{e.code.name if e.code else 'ERROR'}: {e.details[:120]}"] += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(n)))
        wall = time.perf_counter() - t0
        await asyncio.gather(*(s.close() for s in sessions))
        return wall, latencies, failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=256, help="opens sent at once (default 256)")
    ap.add_argument("--pool-size", type=int, default=2, help="the server's warm pool target size (default 2)")
    ap.add_argument("--cold-tries", type=int, default=5)
    ap.add_argument("--max-sessions", default="1024",
                    help="the server's max_sessions (default 1024; 'auto' sizes it from this machine, and the opens "
                         "past it must be answered RESOURCE_EXHAUSTED)")
    args = ap.parse_args()
    why = docker_available()
    if why:
        print(why, file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="tito-storm-"))
    cold = start_server(tmp, env={"TITO_POOL__TARGET_SIZE": "0"})
    try:
        single = asyncio.run(cold_start_s(cold.address, args.cold_tries))
    finally:
        cold.terminate()
    srv = start_server(tmp, env={"TITO_POOL__TARGET_SIZE": str(args.pool_size), "TITO_MAX_SESSIONS": args.max_sessions})
    try:
        wall, lat, failures = asyncio.run(storm(srv.address, args.sessions))
        slots = _start_slots(srv)
    finally:
        srv.terminate()
    left = containers_of(srv.server_name)
    print(f"one cold sandbox start (pool off, p50 of {args.cold_tries}): {single:.2f} s")
    print(f"storm of {args.sessions} opens at once (warm pool {args.pool_size}): wall {wall:.1f} s, "
          f"{len(lat)} ok, {sum(failures.values())} failed; open latency p50 {pct(lat, 50):.1f} s, "
          f"p99 {pct(lat, 99):.1f} s")
    if slots:
        print(f"baseline: {args.sessions} cold starts over {slots} start slots = "
              f"{args.sessions / slots * single:.1f} s if starts were the only work")
    for why, count in failures.most_common():
        print(f"  {count} x {why}")
    if left:
        print(f"WARNING: {len(left)} containers left behind")
    return 0 if not failures else 1


def _start_slots(srv) -> int | None:
    """The server's pool.max_concurrent_starts, from its log's settings line, if it prints one."""
    try:
        for line in srv.log_path.read_text().splitlines():
            if "max_concurrent_starts=" in line:
                return int(line.split("max_concurrent_starts=")[1].split()[0].strip(",;)"))
    except OSError:
        pass
    return None


if __name__ == "__main__":
    sys.exit(main())
