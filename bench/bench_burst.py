"""Bursts of sessions against a real server whose pool learns demand, next to the machine's docker run rate.

    .venv/bin/python bench/bench_burst.py [--sizes 16,64,128]

For each N: a fresh server (warm pool floor 4); burst 1 = N concurrent OpenSession + one Step + close, on
a pool that has never seen N; then the pool warms up to what it saw (the wait is printed); burst 2 = the
same N again. Baseline, measured in the same run: `docker run -d` of the sandbox image, 4 at a time, as
containers per second, and N divided by it (what burst 1 cannot beat when every session needs a start).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import re
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import docker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import SANDBOX_IMAGE, containers_of, docker_available, start_server  # noqa: E402
from tito.client import AsyncTitoClient, StepStatus  # noqa: E402
from tito.types import ToolCall  # noqa: E402


def docker_run_rate(n: int = 16, parallel: int = 4) -> float:
    """Containers per second that `docker run -d` starts here (the sandbox image, no network)."""
    client = docker.from_env(timeout=60)
    ids: list[str] = []

    def run_one(_: int) -> str:
        c = client.containers.run(SANDBOX_IMAGE, ["python3", "-c", "import time; time.sleep(60)"], detach=True,
                                  network_mode="none", labels={"tito.bench": "run-rate"})
        return c.id

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(parallel) as ex:
        ids = list(ex.map(run_one, range(n)))
    rate = n / (time.perf_counter() - t0)
    for cid in ids:
        client.api.remove_container(cid, force=True)
    client.close()
    return rate


def pool_depth(metrics_port: int, image: str = SANDBOX_IMAGE) -> float:
    """The warm depth of `image`'s pool, as the server exports it."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    m = re.search(rf'^tito_pool_depth{{image="{re.escape(image)}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def burst(address: str, n: int) -> tuple[float, int]:
    async with AsyncTitoClient(address, deadline_s=600) as client:
        async def one(i: int) -> bool:
            async with await client.open_session("python") as s:
                r = await s.step(tool_calls=[ToolCall("c", "run_python", f'{{"code": "{i} + 1"}}')])
                return r.status is StepStatus.OK and r.tool_messages[0].content == f"Out: {i + 1}"

        t0 = time.perf_counter()
        ok = await asyncio.gather(*(one(i) for i in range(n)))
        return time.perf_counter() - t0, sum(ok)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="16,64,128")
    args = ap.parse_args()
    why = docker_available()
    if why:
        print(why, file=sys.stderr)
        return 1
    rate = docker_run_rate()
    print(f"docker run -d rate here: {rate:.1f} containers/s (16 containers, 4 at a time)")
    print(f"{'N':>5} {'burst 1':>9} {'N/run rate':>10} {'warm-up':>8} {'burst 2':>8}  ok")
    tmp = Path(tempfile.mkdtemp(prefix="tito-burst-"))
    for n in (int(x) for x in args.sizes.split(",")):
        srv = start_server(tmp, env={"TITO_POOL__TARGET_SIZE": "4", "TITO_POOL__LEARN_DEMAND": "true"})
        try:
            first, ok1 = asyncio.run(burst(srv.address, n))
            t0 = time.perf_counter()
            while pool_depth(srv.metrics_port) < n:
                if time.perf_counter() - t0 > 300:
                    break
                time.sleep(0.2)
            warm = time.perf_counter() - t0
            second, ok2 = asyncio.run(burst(srv.address, n))
        finally:
            srv.terminate()
        print(f"{n:>5} {first:>8.1f}s {n / rate:>9.1f}s {warm:>7.1f}s {second:>7.2f}s  {ok1 + ok2}/{2 * n}")
        left = containers_of(srv.server_name)
        if left:
            print(f"  WARNING: {len(left)} containers left behind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
