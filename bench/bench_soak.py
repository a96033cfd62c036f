"""A soak at the admitted maximum: every session stepping mixed work through the real tool-call path for minutes.

    .venv/bin/python bench/bench_soak.py [--minutes 10] [--sandbox-backend docker|bwrap] [--runtime runc|runsc]
                                          [--sessions N] [--think-s 0.5 2] [--bash-share 0.25] [--churn 0.1]

Starts a real env server (tests.harness.start_server, max_sessions auto unless --max-sessions), reads the number
of sessions it admits from its /metrics (`tito_sessions_limit`; --sessions N overrides) and opens that many, in
waves. Then, for --minutes, every session loops: a random think time (--think-s), then one Step with one tool
call through the typed client. Python sessions run short arithmetic on a persistent counter, print a few KB,
raise an exception, sleep briefly or sleep past their call timeout; bash sessions (--bash-share of them) run
arithmetic, write and read back files, print a few KB, fail a command, sleep briefly or past the timeout. Each
answer is checked against what that session must see. A share of the sessions (--churn, per minute) close and
re-open meanwhile, so the count stays at the maximum.

Every --sample-s (30 s) it prints a line: progress, steps and steps/s, call timeouts, errors, sessions open,
the backend's sandbox count (seen from outside the server), the server process's open fds and RSS (and of its
child processes: with bwrap, the sandboxes), and with Docker dockerd's fds and RSS. At the end: steps in all
and per second, errors by kind with the first messages, step latency p50/p99 (steps that hit their call timeout
left out), next to the baseline measured in the same run on the same server before the soak (the same mixed
work, one python and one bash session, no think time, nothing else running); fds and RSS at the first sample
after --warmup-s vs the last, and their max; sandboxes left once the server has stopped.

Exit code 1 on any error (a failed RPC, a Step status other than OK, an answer that is not what the session must
see, a RESOURCE_EXHAUSTED re-open while fewer sessions than the limit were held) or a leaked sandbox. A Step
whose tool result says the call timed out is a normal answer (the model's problem), counted apart.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.harness import (ServerProcess, bwrap_available, docker_available, sandboxes_of,  # noqa: E402
                           start_server)
from tito.client import AsyncSession, AsyncTitoClient, ResourceExhaustedError, StepStatus, TitoError  # noqa: E402
from tito.types import ToolCall  # noqa: E402

MIB = 1024 * 1024
TIMED_OUT = "[timed out"  # how python's and bash's tool messages say a call hit its timeout
SHOW_MESSAGES = 3  # per error kind


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))] if xs else float("nan")


# ------------------------------------------------------------------ the work


@dataclass
class Work:
    """One tool call and what its answer must hold."""

    kind: str  # for the latency and error breakdown
    tool: str
    arguments: dict[str, str]
    expect: str  # a substring the tool message must contain
    timeout: bool = False  # sleeps past the call timeout: the answer must say it timed out


@dataclass
class SessionState:
    """What the client knows of one session's sandbox, to check that each answer is its own."""

    env: str
    tag: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    counter: int = 0  # python: the interpreter's `n`; bash: the number in the file `c`
    steps: int = 0


def python_work(s: SessionState, rng: random.Random) -> Work:
    r = rng.random()
    if r < 0.55:  # short arithmetic on state that must persist
        a = rng.randint(2, 999)
        s.counter += 1
        return Work("arith", "run_python", {"code": f"n = globals().get('n', 0) + 1\nn * {a}"},
                    f"Out: {s.counter * a}")
    if r < 0.75:  # a print of a few KB
        k = rng.randint(100, 400)
        return Work("print", "run_python", {"code": f"print({s.tag!r} * {k})"}, s.tag * k)
    if r < 0.88:  # an exception: its traceback is the tool message
        return Work("raise", "run_python", {"code": f"raise ValueError({s.tag!r})"}, f"ValueError: {s.tag}")
    if r < 0.97:  # a brief sleep
        return Work("sleep", "run_python",
                    {"code": f"import time\ntime.sleep({rng.uniform(0.05, 0.3):.2f})\n{s.tag!r}"}, s.tag)
    return Work("timeout", "run_python", {"code": "import time\ntime.sleep(3600)"}, TIMED_OUT, timeout=True)


def bash_work(s: SessionState, rng: random.Random) -> Work:
    r = rng.random()
    if r < 0.30:  # a counter kept in a file (a timeout restarts the shell: files stay, variables go)
        s.counter += 1
        return Work("arith", "run_bash", {"command": "c=$(( $(cat c 2>/dev/null || echo 0) + 1 )); echo $c > c; "
                                          "echo count=$c"}, f"count={s.counter}")
    if r < 0.55:  # write a file and read it back (a few files, rewritten: the sandbox's disk stays flat)
        name, value = f"f{rng.randint(0, 7)}.txt", f"{s.tag}-{rng.randint(0, 10**9)}"
        return Work("file", "run_bash", {"command": f"printf '%s\\n' {value} > {name} && cat {name} && wc -c < {name}"},
                    f"{value}\n{len(value) + 1}")
    if r < 0.72:  # a few KB of output
        k = rng.randint(100, 300)
        return Work("print", "run_bash", {"command": f"yes {s.tag} | head -n {k} | tr -d '\\n'; echo"}, s.tag * k)
    if r < 0.87:  # a failing command: its exit code is in the tool message
        return Work("fail", "run_bash", {"command": f"ls /no-such-{s.tag}"}, "[exit code 2]")
    if r < 0.97:
        return Work("sleep", "run_bash", {"command": f"sleep {rng.uniform(0.05, 0.3):.2f}; echo {s.tag}"}, s.tag)
    return Work("timeout", "run_bash", {"command": "sleep 3600"}, TIMED_OUT, timeout=True)


WORK: dict[str, Callable[[SessionState, random.Random], Work]] = {"python": python_work, "bash": bash_work}


# ------------------------------------------------------------------ the tally


@dataclass
class Tally:
    steps: int = 0
    timeouts: int = 0  # steps whose tool result said the call timed out (expected ones included)
    unexpected_timeouts: int = 0  # of those, calls that were not meant to time out
    latencies: list[float] = field(default_factory=list)  # seconds, steps that did not time out
    by_kind: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    errors: Counter = field(default_factory=Counter)
    messages: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    open_latencies: list[float] = field(default_factory=list)
    reopens: int = 0
    refused_at_limit: int = 0  # RESOURCE_EXHAUSTED re-opens while the limit was really held: not errors

    def error(self, kind: str, message: str) -> None:
        self.errors[kind] += 1
        if len(self.messages[kind]) < SHOW_MESSAGES:
            self.messages[kind].append(message[:300])


async def step_once(session: AsyncSession, state: SessionState, work: Work, tally: Tally) -> bool:
    """One Step with one tool call, checked. False when the session cannot go on (it is then closed)."""
    state.steps += 1
    call = ToolCall(id=f"c{state.steps}", name=work.tool, arguments=json.dumps(work.arguments))
    t0 = time.perf_counter()
    try:
        result = await session.step(tool_calls=[call])
    except TitoError as e:
        tally.error(f"Step {e.code.name if e.code else 'ERROR'}", f"{state.env} {work.kind}: {e.details}")
        return False
    dt = time.perf_counter() - t0
    tally.steps += 1
    if result.status is not StepStatus.OK:
        tally.error(f"Step status {result.status.name}", f"{state.env} {work.kind}: {result.detail}")
        return False
    content = result.tool_messages[0].content if len(result.tool_messages) == 1 else ""
    if TIMED_OUT in content:
        tally.timeouts += 1
        if not work.timeout:
            tally.unexpected_timeouts += 1
        # A timed-out call may have run part of its code (python: the counter is kept; bash's counter is a
        # file): the next check would be wrong only if the interrupted call was the counter's, which it never is.
        return True
    tally.latencies.append(dt)
    tally.by_kind[f"{state.env} {work.kind}"].append(dt)
    if len(result.tool_messages) != 1:
        tally.error("wrong answer", f"{state.env} {work.kind}: {len(result.tool_messages)} tool messages for 1 call")
    elif work.expect not in content:
        tally.error("wrong answer", f"{state.env} {work.kind}: expected {work.expect[:60]!r} in {content[:200]!r}")
    return True


# ------------------------------------------------------------------ the soak


class Soak:
    def __init__(self, clients: list[AsyncTitoClient], args: argparse.Namespace, limit: int, n: int) -> None:
        self.clients = clients
        self.args = args
        self.limit = limit  # the server's admitted maximum
        self.n = n  # sessions kept open
        self.tally = Tally()
        self.rng = random.Random(args.seed)
        self.open = 0  # sessions open now (their OpenSession answered, their CloseSession not yet answered)
        self.opening = 0  # OpenSession calls in flight
        self.churn_due: set[int] = set()  # slots told to close and re-open after their current step
        self.stop = asyncio.Event()
        self.sessions: dict[int, tuple[AsyncSession, SessionState]] = {}

    def env_of(self, slot: int) -> str:
        # Spread evenly: every k-th slot is bash.
        share = self.args.bash_share
        return "bash" if share > 0 and int((slot + 1) * share) != int(slot * share) else "python"

    async def open_slot(self, slot: int, reopen: bool) -> bool:
        """Opens the slot's session; a re-open refused at the limit waits and tries again. False on an error."""
        env = self.env_of(slot)
        client = self.clients[slot % len(self.clients)]
        while not self.stop.is_set():
            self.opening += 1
            held_before = self.open + self.opening - 1
            t0 = time.perf_counter()
            try:
                session = await client.open_session(env, [{"role": "user", "content": "soak"}],
                                                    env_args={"timeout_s": self.args.call_timeout_s})
            except ResourceExhaustedError as e:
                held = max(held_before, self.open + self.opening - 1)
                if reopen and held >= self.limit:
                    self.tally.refused_at_limit += 1
                    await asyncio.sleep(1.0)
                    continue
                self.tally.error("OpenSession RESOURCE_EXHAUSTED",
                                 f"{held} other sessions open or opening, limit {self.limit}: {e.details}")
                return False
            except TitoError as e:
                self.tally.error(f"OpenSession {e.code.name if e.code else 'ERROR'}", f"{env}: {e.details}")
                return False
            finally:
                self.opening -= 1
            self.tally.open_latencies.append(time.perf_counter() - t0)
            self.open += 1
            self.tally.reopens += reopen
            self.sessions[slot] = (session, SessionState(env))
            return True
        return False

    async def close_slot(self, slot: int) -> None:
        session, state = self.sessions.pop(slot)
        try:
            await session.close()
        except TitoError as e:
            self.tally.error(f"CloseSession {e.code.name if e.code else 'ERROR'}", f"{state.env}: {e.details}")
        finally:
            self.open -= 1  # once answered: until then the server may still count it

    async def open_all(self) -> None:
        wave = self.args.wave
        for start in range(0, self.n, wave):
            slots = range(start, min(self.n, start + wave))
            t0 = time.perf_counter()
            ok = await asyncio.gather(*(self.open_slot(s, reopen=False) for s in slots))
            print(f"  opened {start + sum(ok)}/{self.n} sessions (wave of {len(slots)} in "
                  f"{time.perf_counter() - t0:.1f} s)", flush=True)
            await asyncio.sleep(self.args.wave_pause_s)

    async def worker(self, slot: int) -> None:
        lo, hi = self.args.think_s
        rng = random.Random(self.rng.random())
        await asyncio.sleep(rng.uniform(0, hi))  # out of step with the others
        while not self.stop.is_set():
            if slot not in self.sessions and not await self.open_slot(slot, reopen=True):
                await asyncio.sleep(hi)  # counted; a slot whose open failed tries again later
                continue
            session, state = self.sessions[slot]
            work = WORK[state.env](state, rng)
            if not await step_once(session, state, work, self.tally):
                await self.close_slot(slot)  # the session is over (lost, error): a fresh one takes its slot
            elif slot in self.churn_due:
                self.churn_due.discard(slot)
                await self.close_slot(slot)
            try:
                await asyncio.wait_for(self.stop.wait(), rng.uniform(lo, hi))
            except asyncio.TimeoutError:
                pass

    async def churn(self) -> None:
        """Tells one session at a time to close and re-open, --churn of them a minute."""
        per_s = self.args.churn * self.n / 60
        if per_s <= 0:
            return
        while not self.stop.is_set():
            try:
                await asyncio.wait_for(self.stop.wait(), self.rng.expovariate(per_s))
            except asyncio.TimeoutError:
                self.churn_due.add(self.rng.randrange(self.n))


# ------------------------------------------------------------------ what the machine sees


def _proc_status(pid: int) -> dict[str, str]:
    try:
        return dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    except OSError:
        return {}


def _rss(pid: int) -> int:
    value = _proc_status(pid).get("VmRSS", "0 kB").split()
    return int(value[0]) * 1024 if value else 0


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = defaultdict(list)
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            ppid = _proc_status(int(p.name)).get("PPid", "").strip()
            if ppid.isdigit():
                children[int(ppid)].append(int(p.name))
    out, todo = [], list(children[pid])
    while todo:
        c = todo.pop()
        out.append(c)
        todo.extend(children[c])
    return out


def pid_of(name: str) -> int | None:
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and (p / "comm").read_text().strip() == name:
                return int(p.name)
        except OSError:
            continue
    return None


@dataclass
class Sample:
    t: float  # seconds into the soak
    steps: int
    timeouts: int
    errors: int
    open: int
    sandboxes: int
    fds: int
    rss: int
    children: int
    children_rss: int
    dockerd_fds: int | None
    dockerd_rss: int | None


def take_sample(t: float, soak: Soak, srv: ServerProcess, backend: str, dockerd: int | None) -> Sample:
    kids = descendants(srv.proc.pid)
    return Sample(t, soak.tally.steps, soak.tally.timeouts, sum(soak.tally.errors.values()), soak.open,
                  len(sandboxes_of(backend, srv.server_name)), _fds(srv.proc.pid), _rss(srv.proc.pid), len(kids),
                  sum(_rss(k) for k in kids), _fds(dockerd) if dockerd else None, _rss(dockerd) if dockerd else None)


def sample_line(s: Sample, prev: Sample | None, total_s: float) -> str:
    done = min(1.0, s.t / total_s)
    bar = "#" * int(done * 20)
    rate = (s.steps - prev.steps) / (s.t - prev.t) if prev and s.t > prev.t else 0.0
    line = (f"[{bar:<20}] {s.t:5.0f}/{total_s:.0f} s  steps {s.steps} ({rate:.1f}/s)  timeouts {s.timeouts}  "
            f"errors {s.errors}  open {s.open}  sandboxes {s.sandboxes}  server fds {s.fds} RSS "
            f"{s.rss / MIB:.0f} MiB")
    if s.children:
        line += f" (+{s.children} child processes, {s.children_rss / MIB:.0f} MiB)"
    if s.dockerd_fds is not None:
        line += f"  dockerd fds {s.dockerd_fds} RSS {s.dockerd_rss / MIB:.0f} MiB"
    return line


def metric(srv: ServerProcess, name: str) -> float | None:
    """One unlabelled figure of the server's /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=10).read().decode()
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


# ------------------------------------------------------------------ the run


async def baseline(client: AsyncTitoClient, args: argparse.Namespace, steps: int) -> Tally:
    """The same mixed work, one python and one bash session, one step at a time, nothing else running."""
    tally = Tally()
    rng = random.Random(args.seed + 1)
    sessions = []
    for env in ("python", "bash"):
        s = await client.open_session(env, [{"role": "user", "content": "baseline"}],
                                      env_args={"timeout_s": args.call_timeout_s})
        sessions.append((s, SessionState(env)))
    try:
        for i in range(steps):
            session, state = sessions[i % 2 if args.bash_share > 0 else 0]
            work = WORK[state.env](state, rng)
            if work.timeout:  # a timeout costs call_timeout_s and is left out of the latencies anyway
                continue
            await step_once(session, state, work, tally)
    finally:
        for s, _ in sessions:
            await s.close()
    return tally


async def run(srv: ServerProcess, args: argparse.Namespace) -> tuple[Soak, Tally, list[Sample], float]:
    clients = [AsyncTitoClient(srv.address, deadline_s=args.deadline_s, retries=args.retries)
               for _ in range(args.clients)]
    try:
        await clients[0].wait_ready()
        limit_metric = await asyncio.to_thread(metric, srv, "tito_sessions_limit")
        if limit_metric is None:
            raise RuntimeError(f"the server's /metrics (port {srv.metrics_port}) has no tito_sessions_limit")
        limit = int(limit_metric)
        n = args.sessions or limit
        print(f"server {srv.server_name} (pid {srv.proc.pid}) admits {limit} sessions; the soak holds {n}", flush=True)
        if n > limit:
            print(f"note: --sessions {n} is over the limit {limit}: the opens past it will fail", flush=True)

        print(f"baseline: {args.baseline_steps} mixed-work steps, one session at a time ...", flush=True)
        base = await baseline(clients[0], args, args.baseline_steps)

        soak = Soak(clients, args, limit, n)
        print(f"opening {n} sessions in waves of {args.wave} ({sum(soak.env_of(i) == 'bash' for i in range(n))} bash)",
              flush=True)
        await soak.open_all()

        dockerd = pid_of("dockerd") if args.sandbox_backend == "docker" else None
        total_s = args.minutes * 60
        samples: list[Sample] = []
        t0 = time.monotonic()
        tasks = [asyncio.create_task(soak.worker(i)) for i in range(n)] + [asyncio.create_task(soak.churn())]
        for k in range(1, 1 << 30):
            t = time.monotonic() - t0
            samples.append(await asyncio.to_thread(take_sample, t, soak, srv, args.sandbox_backend, dockerd))
            print(sample_line(samples[-1], samples[-2] if len(samples) > 1 else None, total_s), flush=True)
            if t >= total_s:
                break
            # On a fixed schedule (0, sample_s, 2 sample_s, ..., the end): a slow sample does not shift the rest.
            await asyncio.sleep(max(0.0, min(k * args.sample_s, total_s) - (time.monotonic() - t0)))
        soak_s = time.monotonic() - t0
        soak.stop.set()
        await asyncio.gather(*tasks)
        await asyncio.gather(*(soak.close_slot(slot) for slot in list(soak.sessions)))
        return soak, base, samples, soak_s
    finally:
        for c in clients:
            await c.close()


def report(args: argparse.Namespace, soak: Soak, base: Tally, samples: list[Sample], soak_s: float,
           leaked: int, log_problems: list[str]) -> int:
    t = soak.tally
    errors = sum(t.errors.values())
    print()
    print(f"== soak: {soak.n} sessions (limit {soak.limit}, {args.sandbox_backend}"
          f"{'/' + args.runtime if args.sandbox_backend == 'docker' else ''}) for {soak_s:.0f} s, "
          f"think {args.think_s[0]}-{args.think_s[1]} s")
    print(f"steps: {t.steps} ({t.steps / soak_s:.1f}/s); call timeouts (normal answers): {t.timeouts}"
          f"{f', {t.unexpected_timeouts} of them in calls not meant to time out' if t.unexpected_timeouts else ''}; "
          f"re-opens: {t.reopens}" + (f" ({t.refused_at_limit} refused at the limit, retried)" if t.refused_at_limit
                                       else ""))
    print(f"errors: {errors}")
    for kind, count in t.errors.most_common():
        print(f"  {count} x {kind}")
        for m in t.messages[kind]:
            print(f"      {m}")
    print(f"step latency (timeouts left out): p50 {pct(t.latencies, 50) * 1000:.1f} ms, p99 "
          f"{pct(t.latencies, 99) * 1000:.1f} ms, max {max(t.latencies, default=float('nan')) * 1000:.0f} ms   "
          f"| baseline (1 session, same work): p50 {pct(base.latencies, 50) * 1000:.1f} ms, "
          f"p99 {pct(base.latencies, 99) * 1000:.1f} ms ({len(base.latencies)} steps)")
    for kind in sorted(t.by_kind):
        xs, bs = t.by_kind[kind], base.by_kind.get(kind, [])
        print(f"    {kind:<14} {len(xs):>7} steps  p50 {pct(xs, 50) * 1000:7.1f} ms  p99 {pct(xs, 99) * 1000:7.1f} ms"
              f"   | baseline p50 {pct(bs, 50) * 1000:7.1f} ms  p99 {pct(bs, 99) * 1000:7.1f} ms")
    opens = t.open_latencies
    print(f"OpenSession latency ({len(opens)} opens, waves and re-opens): p50 {pct(opens, 50) * 1000:.0f} ms, "
          f"p99 {pct(opens, 99) * 1000:.0f} ms")
    # A short run's reference is its middle sample; 1 s of slack for the time a sample takes.
    warm = min(args.warmup_s, args.minutes * 60 / 2) - 1
    ref = next((s for s in samples if s.t >= warm), samples[-1])
    last = samples[-1]
    for name, get, unit in [("server fds", lambda s: s.fds, 1), ("server RSS", lambda s: s.rss, MIB),
                            ("child processes' RSS", lambda s: s.children_rss, MIB),
                            ("dockerd fds", lambda s: s.dockerd_fds, 1), ("dockerd RSS", lambda s: s.dockerd_rss, MIB)]:
        if get(last) is None or (name.startswith("child") and not last.children):
            continue
        a, b, top = get(ref) / unit, get(last) / unit, max(get(s) for s in samples) / unit
        print(f"{name}: {a:.0f} at {ref.t:.0f} s (after warm-up, {ref.open} open) -> {b:.0f} at {last.t:.0f} s "
              f"({last.open} open; {b - a:+.0f}, {(b - a) / max(a, 1):+.1%}), max {top:.0f}")
    print(f"sandboxes while soaking: {min(s.sandboxes for s in samples)}-{max(s.sandboxes for s in samples)} "
          f"(sessions + warm pool); left after the server stopped: {leaked}")
    if log_problems:
        print(f"server log: {len(log_problems)} ERROR/Traceback lines (not counted as errors), first ones:")
        for line in log_problems[:SHOW_MESSAGES]:
            print(f"      {line[:300]}")
    ok = errors == 0 and leaked == 0
    print("RESULT: " + ("OK" if ok else f"FAILED ({errors} errors, {leaked} sandboxes leaked)"))
    return 0 if ok else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long the soak runs (default 10)")
    ap.add_argument("--sandbox-backend", choices=["docker", "bwrap"], default="docker")
    ap.add_argument("--runtime", choices=["runc", "runsc"], default="runc", help="Docker's OCI runtime (default runc)")
    ap.add_argument("--max-sessions", default="auto", help="the server's max_sessions (default auto)")
    ap.add_argument("--sessions", type=int, default=0, help="sessions to hold (default: the server's admitted maximum)")
    ap.add_argument("--think-s", type=float, nargs=2, default=[0.5, 2.0], metavar=("LO", "HI"),
                    help="each session's pause between steps, uniform in [LO, HI] (default 0.5 2)")
    ap.add_argument("--bash-share", type=float, default=0.25, help="share of the sessions that are bash (default 0.25)")
    ap.add_argument("--churn", type=float, default=0.1,
                    help="share of the sessions closed and re-opened per minute (default 0.1)")
    ap.add_argument("--call-timeout-s", type=float, default=3.0,
                    help="each session's per-call timeout (env_args timeout_s; default 3)")
    ap.add_argument("--wave", type=int, default=32, help="sessions opened at once (default 32)")
    ap.add_argument("--wave-pause-s", type=float, default=1.0, help="pause between waves (default 1)")
    ap.add_argument("--sample-s", type=float, default=30.0, help="seconds between samples (default 30)")
    ap.add_argument("--warmup-s", type=float, default=60.0,
                    help="the fds and RSS reference is the first sample this far into the soak (default 60)")
    ap.add_argument("--baseline-steps", type=int, default=200, help="mixed-work steps of the baseline (default 200)")
    ap.add_argument("--pool-size", type=int, default=2, help="the server's warm pool, fixed (default 2)")
    ap.add_argument("--learn-demand", action="store_true",
                    help="let the warm pool grow with demand (the server's default; off here so that the sandbox "
                         "count stays sessions + --pool-size)")
    ap.add_argument("--clients", type=int, default=4, help="client channels the sessions are spread over (default 4)")
    ap.add_argument("--retries", type=int, default=0,
                    help="client retries on UNAVAILABLE (default 0: every failure is seen)")
    ap.add_argument("--deadline-s", type=float, default=120.0, help="client deadline of each call (default 120)")
    ap.add_argument("--seed", type=int, default=26)
    args = ap.parse_args()
    if args.think_s[0] < 0 or args.think_s[1] < args.think_s[0]:
        ap.error("--think-s LO HI needs 0 <= LO <= HI")

    why = docker_available() if args.sandbox_backend == "docker" else bwrap_available()
    if why:
        print(why, file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="tito-soak-"))
    env = {"TITO_MAX_SESSIONS": args.max_sessions, "TITO_POOL__TARGET_SIZE": str(args.pool_size),
           "TITO_POOL__LEARN_DEMAND": "true" if args.learn_demand else "false"}
    if args.sandbox_backend == "docker":
        env["TITO_SANDBOX__RUNTIME"] = args.runtime
    srv = start_server(tmp, env=env, backend=args.sandbox_backend)
    print(f"server log: {srv.log_path}", flush=True)
    try:
        soak, base, samples, soak_s = asyncio.run(run(srv, args))
    finally:
        code = srv.terminate(timeout_s=120)
    if code != 0:
        print(f"note: the server exited with {code}", flush=True)
    leaked = sandboxes_of(args.sandbox_backend, srv.server_name)
    deadline = time.monotonic() + 15
    while leaked and time.monotonic() < deadline:  # a removal may still be finishing outside the server
        time.sleep(1)
        leaked = sandboxes_of(args.sandbox_backend, srv.server_name)
    problems = [line for line in srv.log().splitlines() if " ERROR " in line or "Traceback" in line]
    return report(args, soak, base, samples, soak_s, len(leaked), problems)


if __name__ == "__main__":
    sys.exit(main())
