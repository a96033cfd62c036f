"""Sandbox latencies on this machine (real dockerd, the real image).

    .venv/bin/python bench/bench_sandbox.py [--calls 2000] [--exec-calls 50] [--cold 5] [--image IMAGE] [--runtime runsc]

Prints p50/p99 of: a trivial call (`x += 1`) over the persistent channel, a bare protocol ping,
`docker exec` of a fresh `python3 -c` in the same container (what per-call exec designs pay),
pool acquire from a warm pool, and a cold start (create + start + REPL ready).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

from env_server.sandbox import PoolConfig, SandboxConfig, SandboxPool


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def line(name: str, xs: list[float]) -> None:
    print(f"{name:<42} n={len(xs):<5} p50={pct(xs, 50):9.3f} ms  p99={pct(xs, 99):9.3f} ms  "
          f"mean={statistics.fmean(xs):9.3f} ms")


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--exec-calls", type=int, default=50)
    ap.add_argument("--cold", type=int, default=5)
    ap.add_argument("--acquires", type=int, default=8)
    ap.add_argument("--image", default=SandboxConfig().image,
                    help="sandbox image (e.g. tito-sandbox-scientific:latest); default: the server's default")
    ap.add_argument("--runtime", default="runc", help="OCI runtime: runc, or runsc (gVisor)")
    args = ap.parse_args()
    print(f"image: {args.image}, runtime: {args.runtime}")

    pool = SandboxPool(SandboxConfig(image=args.image, runtime=args.runtime), PoolConfig(target_size=2, max_concurrent_creates=2),
                       server_name=f"bench-{uuid.uuid4().hex[:6]}", instance_id="bench")
    await pool.start()
    if not pool.ready:
        raise SystemExit(f"sandbox pool not ready: {pool.reason}")
    try:
        sb = await pool.acquire()
        await sb.execute("x = 0")
        for _ in range(200):  # warm-up
            await sb.execute("x += 1")
        chan = []
        for _ in range(args.calls):
            t0 = time.perf_counter()
            r = await sb.execute("x += 1")
            chan.append((time.perf_counter() - t0) * 1000)
            assert r.ok, r
        pings = [await sb.ping() for _ in range(args.calls)]

        client = pool._client  # noqa: SLF001 - the bench reuses the pool's Docker client
        assert client is not None

        def exec_once() -> float:
            t0 = time.perf_counter()
            res = client.api.exec_create(sb.container_id, ["python3", "-c", "x = 1; x += 1"])
            client.api.exec_start(res["Id"])
            return (time.perf_counter() - t0) * 1000

        execs = [await asyncio.to_thread(exec_once) for _ in range(args.exec_calls)]
        await sb.destroy()

        acquires = []
        for _ in range(args.acquires):
            while pool.depth < 1:
                await asyncio.sleep(0.05)
            t0 = time.perf_counter()
            s = await pool.acquire()
            acquires.append((time.perf_counter() - t0) * 1000)
            await s.destroy()
            await asyncio.sleep(0.6)  # let the refill finish so creates don't skew the next sample

        cold = []
        for _ in range(args.cold):
            t0 = time.perf_counter()
            s = await pool._create()  # noqa: SLF001 - a cold start, bypassing the warm pool
            cold.append((time.perf_counter() - t0) * 1000)
            await s.destroy()

        print(f"sandbox latency ({args.calls} calls; image {pool.sandbox_config.image})")
        line("channel: execute('x += 1')", chan)
        line("channel: protocol ping", pings)
        line("docker exec python3 -c (same container)", execs)
        line("pool acquire (warm)", acquires)
        line("cold start (create+start+ready)", cold)
        print(f"docker exec / channel p50 ratio: {pct(execs, 50) / pct(chan, 50):.0f}x")
        print(f"cold start / warm acquire p50 ratio: {pct(cold, 50) / pct(acquires, 50):.0f}x")
    finally:
        await pool.close()


if __name__ == "__main__":
    asyncio.run(main())
