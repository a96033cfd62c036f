"""Environment-server benchmarks through real gRPC against real containers.

    .venv/bin/python bench/bench_env_server.py [--steps 500] [--sessions 64]

Prints, each with a baseline measured in the same run:
  1. Step latency of a trivial call (`x += 1`) on a warm session, vs `docker exec` of a fresh
     interpreter in the same container (targets: p50 <= 2 ms, >= 30x faster).
  2. OpenSession latency from the warm pool, vs a cold container start (pool disabled). Target p50 <= 20 ms.
  3. Aggregate throughput of 64 concurrent sessions (target >= 1,000 steps/s), with zero errors and
     each session seeing only its own outputs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import docker
import grpc
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import containers_of, docker_available, start_server  # noqa: E402
from tito.v1 import environment_pb2 as pb  # noqa: E402
from tito.v1 import environment_pb2_grpc as pb_grpc  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def call(seq: int, code: str) -> pb.ToolCall:
    return pb.ToolCall(id=str(seq), name="run_python", arguments=json.dumps({"code": code}))


def wait_for_pool(server_name: str, size: int, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    with tqdm(total=size, desc="filling the warm pool", leave=False) as bar:
        while (n := len(containers_of(server_name))) < size and time.monotonic() < deadline:
            bar.n = n
            bar.refresh()
            time.sleep(0.5)
    time.sleep(1.0)  # the last ones finish starting


def bench_step_latency(stub, server_name: str, steps: int) -> None:
    sid = stub.OpenSession(pb.OpenSessionRequest(environment="python")).session_id
    stub.Step(pb.StepRequest(session_id=sid, seq=1, tool_calls=[call(1, "x = 0")]))
    lat = []
    for seq in tqdm(range(2, steps + 2), desc="step latency", leave=False):
        t = time.perf_counter()
        r = stub.Step(pb.StepRequest(session_id=sid, seq=seq, tool_calls=[call(seq, "x += 1")]))
        lat.append((time.perf_counter() - t) * 1000)
        assert r.status == pb.STEP_STATUS_OK, r
    check = stub.Step(pb.StepRequest(session_id=sid, seq=steps + 2, tool_calls=[call(0, "x")]))
    assert check.tool_messages[0].content == f"Out: {steps}", check.tool_messages[0].content

    (info,) = [c for c in containers_of(server_name) if c.labels.get("tito.session") == sid]
    container = docker.from_env().containers.get(info.id)
    exec_lat = []
    for _ in tqdm(range(30), desc="docker exec", leave=False):
        t = time.perf_counter()
        res = container.exec_run(["python3", "-c", "x = 0\nx += 1"])
        exec_lat.append((time.perf_counter() - t) * 1000)
        assert res.exit_code == 0
    stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    p50, p99, e50 = pct(lat, 50), pct(lat, 99), pct(exec_lat, 50)
    print(f"[1] step latency (x += 1, gRPC, warm session, n={len(lat)}): p50 {p50:.3f} ms  p99 {p99:.3f} ms")
    print(f"    docker exec of a fresh python3 (n={len(exec_lat)}): p50 {e50:.1f} ms  -> {e50 / p50:.0f}x faster"
          f"   [targets: p50 <= 2 ms, >= 30x]")


def bench_open_latency(stub, cold_stub, n: int) -> None:
    def opens(s, label):
        lat = []
        for _ in tqdm(range(n), desc=label, leave=False):
            t = time.perf_counter()
            sid = s.OpenSession(pb.OpenSessionRequest(environment="python")).session_id
            lat.append((time.perf_counter() - t) * 1000)
            s.CloseSession(pb.CloseSessionRequest(session_id=sid))
            time.sleep(0.6)  # let the pool refill, as between real rollouts
        return lat

    warm = opens(stub, "open (warm pool)")
    cold = opens(cold_stub, "open (cold)")
    print(f"[2] OpenSession from the warm pool (n={n}): p50 {pct(warm, 50):.2f} ms  p99 {pct(warm, 99):.2f} ms")
    print(f"    cold container start (pool off): p50 {pct(cold, 50):.1f} ms  -> {pct(cold, 50) / pct(warm, 50):.0f}x"
          f"   [target: warm p50 <= 20 ms]")


async def bench_throughput(address: str, sessions: int, steps_each: int) -> None:
    channel = grpc.aio.insecure_channel(address)
    stub = pb_grpc.EnvironmentStub(channel)
    sids = await asyncio.gather(*(stub.OpenSession(pb.OpenSessionRequest(environment="python")) for _ in range(sessions)))
    sids = [s.session_id for s in sids]
    errors = 0
    mismatches = 0

    async def run(i: int, sid: str) -> None:
        nonlocal errors, mismatches
        await stub.Step(pb.StepRequest(session_id=sid, seq=1, tool_calls=[call(1, f"x = {i * 1_000_000}")]))
        for seq in range(2, steps_each + 2):
            try:
                r = await stub.Step(pb.StepRequest(session_id=sid, seq=seq, tool_calls=[call(seq, "x += 1; x")]))
            except grpc.aio.AioRpcError:
                errors += 1
                continue
            if r.tool_messages[0].content != f"Out: {i * 1_000_000 + seq - 1}":
                mismatches += 1

    t = time.perf_counter()
    await asyncio.gather(*(run(i, sid) for i, sid in enumerate(sids)))
    elapsed = time.perf_counter() - t
    total = sessions * steps_each
    await asyncio.gather(*(stub.CloseSession(pb.CloseSessionRequest(session_id=s)) for s in sids))
    await channel.close()
    print(f"[3] {sessions} concurrent sessions x {steps_each} steps: {total / elapsed:,.0f} steps/s "
          f"({elapsed:.2f} s), errors {errors}, cross-session mismatches {mismatches}   [target: >= 1,000 steps/s, 0 errors]")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--opens", type=int, default=20)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--steps-per-session", type=int, default=50)
    args = ap.parse_args()
    if why := docker_available():
        print(f"cannot benchmark: {why}")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="tito-bench-"))
    warm = start_server(tmp, env={"TITO_POOL__TARGET_SIZE": str(args.sessions), "TITO_LOG_LEVEL": "WARNING"},
                        args=["--metrics-port", "0"])
    cold = start_server(tmp, env={"TITO_POOL__TARGET_SIZE": "0", "TITO_LOG_LEVEL": "WARNING"},
                        args=["--metrics-port", "0"])
    try:
        print(f"machine: {docker.from_env().info()['NCPU']} CPUs; servers {warm.address} (warm) {cold.address} (cold)")
        wait_for_pool(warm.server_name, args.sessions)  # no container starts in the background while timing
        bench_step_latency(warm.stub(), warm.server_name, args.steps)
        bench_open_latency(warm.stub(), cold.stub(), args.opens)
        wait_for_pool(warm.server_name, args.sessions)
        asyncio.run(bench_throughput(warm.address, args.sessions, args.steps_per_session))
    finally:
        warm.terminate()
        cold.terminate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
