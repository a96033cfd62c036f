"""What the environment costs the trainer: multi-turn tool rollouts on the real vLLM engine (the
trainer's colocated backend), timed with the tools run by a live env server, and again with the
same rollouts' tool calls answered instantly, in the same run.

    .venv/bin/python bench/bench_rollout.py [--rollouts 64] [--env-address HOST:PORT] [--model DIR]

Prints each timed batch, then `ratio = wall with tools / wall of generation alone` (target <= 1.1
at 64 concurrent rollouts) and one JSON line.

- The rollouts: the puzzles task (examples/demo.yaml's; each puzzle a big product or a modular power
  for `run_python`), `--rollouts` of them at once through the trainer's rollout loop and scheduler
  (`trainer.rollout.run_rollouts`), each request seeded (StepSeeds), max 3 turns of up to 64 tokens.
- The model must write tool calls, which a random one never does: `--model DIR` (a trainer
  checkpoint, e.g. runs/demo_vllm_seed0/checkpoint after the vLLM demo), else the tiny Qwen3
  (head_dim 32) warm-started here on the task's demonstrations, made through the env server
  (`--warm-start-steps`), so that it calls run_python, then answers.
- With tools: the env server (`--env-address`, or one started here with a warm pool of `--rollouts`
  sandboxes) opens a session per rollout, runs each tool call in its sandbox and renders the
  suffix ids. Generation alone: an in-process stand-in replays each session's recorded answers at
  once; the seeds are the same, so the engine generates the same ids (checked), and the only
  difference is the environment. The engine's prefix cache is reset before every timed batch.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.inprocess_env import InProcessEnv  # noqa: E402
from tito.client import RecordingClient  # noqa: E402
from tito.types import OpenedSession, OpenSessionRequest, StepRequest, StepResult  # noqa: E402


class OpenRecordingClient(RecordingClient):
    """A RecordingClient that also keeps each session's OpenSession request."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.requests: dict[str, OpenSessionRequest] = {}

    async def open(self, request: OpenSessionRequest) -> OpenedSession:
        opened = await super().open(request)
        self.requests[opened.session_id] = request
        return opened


def _open_key(request: OpenSessionRequest) -> tuple:
    return request.environment, request.messages, request.env_args_json


class ReplayEnv(InProcessEnv):
    """Answers at once what the recorded server answered: a session's prompt by its OpenSession
    request, a Step by the ids of every turn so far (the same seeds give the same turns)."""

    def __init__(self, rec: OpenRecordingClient) -> None:
        self.prompts: dict[tuple, tuple[int, ...]] = {}
        self.answers: dict[tuple, StepResult] = {}
        for sid, request in rec.requests.items():
            key = _open_key(request)
            self.prompts[key] = rec.prompts[sid]
            turns: tuple = ()
            for s in rec.steps.get(sid, []):
                turns += (tuple(s.request.completion_ids),)
                self.answers[(key, turns)] = s.result
        self.sessions: dict[str, tuple] = {}
        self.missing = 0

    async def open(self, request: OpenSessionRequest) -> OpenedSession:
        sid = f"replay-{len(self.sessions)}"
        self.sessions[sid] = (_open_key(request), ())
        return OpenedSession(sid, self.prompts[_open_key(request)], tools=())

    async def step(self, request: StepRequest) -> StepResult:
        key, turns = self.sessions[request.session_id]
        turns += (tuple(request.completion_ids),)
        self.sessions[request.session_id] = (key, turns)
        if (key, turns) not in self.answers:
            self.missing += 1  # the engine generated something else: the replay cannot answer
            raise RuntimeError("no recorded answer for this turn")
        return replace(self.answers[(key, turns)], seq=request.seq)

    async def close_session(self, session_id: str) -> bool:
        return True


def pool_refilled(metrics_url: str | None, timeout_s: float = 300) -> float:
    """Wait until the server's warm pool is back to its target (`tito_pool_depth` >= `tito_pool_target`
    for every image, from its Prometheus endpoint); return the seconds waited. Every rollout closes its
    sandbox and the pool starts fresh ones: on a small machine that work shares the cores with the
    engine, so a batch timed while it runs measures the refill of the batch before it."""
    if not metrics_url:
        return 0.0
    import re
    import urllib.request

    started = time.perf_counter()
    while time.perf_counter() - started < timeout_s:
        text = urllib.request.urlopen(metrics_url, timeout=5).read().decode()
        figures = {(name, image): float(value) for name, image, value in
                   re.findall(r'^(tito_pool_depth|tito_pool_target)\{image="([^"]*)"\} (\S+)$', text, re.M)}
        images = {image for _, image in figures}
        if images and all(figures.get(("tito_pool_depth", i), 0) >= figures.get(("tito_pool_target", i), 0)
                          for i in images):
            break
        time.sleep(0.5)
    return time.perf_counter() - started


def machine_busy_s() -> float:
    """CPU seconds this machine has been busy (all cores; /proc/stat)."""
    import os

    with open("/proc/stat") as f:
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rollouts", type=int, default=64, help="concurrent rollouts per batch")
    ap.add_argument("--num-generations", type=int, default=4, help="rollouts per prompt (a GRPO group)")
    ap.add_argument("--repeats", type=int, default=3, help="timed pairs (with tools, then replayed)")
    ap.add_argument("--env-address", help="a running env server (default: start one with a warm pool of --rollouts)")
    ap.add_argument("--sandbox-backend", choices=["docker", "bwrap"], default="docker",
                    help="where the server this starts runs its sandboxes (sandbox.backend)")
    ap.add_argument("--metrics-url", help="that server's Prometheus endpoint (http://HOST:PORT/metrics): each timed "
                    "batch then starts with its warm pool refilled")
    ap.add_argument("--model", help="a model folder that writes tool calls (a trainer checkpoint); default: warm-start one")
    ap.add_argument("--warm-start-steps", type=int, default=60)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-level", default="ERROR")
    return ap.parse_args(argv)


def bench_config(args: argparse.Namespace, address: str):
    from trainer.config import load_config

    model = [f"model.path={args.model}"] if args.model else ["model.head_dim=32"]
    return load_config(None, [
        *model, "backend=vllm", f"env.address={address}", "task.name=puzzles", "task.params={n: 4}",
        "budget.context=512", "budget.per_turn=64", "budget.reserve=16", "budget.max_turns=3",
        f"num_generations={args.num_generations}", f"prompts_per_step={args.rollouts // args.num_generations}",
        f"warm_start.steps={args.warm_start_steps}", "warm_start.learning_rate=1e-2", f"seed={args.seed}",
        "progress=false"])


async def tool_calling_model(cfg, tok, env, reg, task, limits):
    """The model the rollouts sample from: --model, or the tiny one warm-started on the teacher's
    demonstrations (a run_python call, then the answer) until it writes them itself."""
    from trainer.model import load_model
    from trainer.warmstart import build_demonstrations, warm_start

    model = load_model(cfg.model.path, vocab_size=tok.vocab_size, seed=cfg.seed, device="cpu",
                       head_dim=cfg.model.head_dim)
    if cfg.model.path == "tiny-random-qwen3":
        started = time.perf_counter()
        demos, _ = await build_demonstrations(task.demo_specs(), task, tok.encode_teacher_text, env, "python",
                                              reg.fingerprint, limits, list(reg.stop_token_ids))
        history = warm_start(model, demos, cfg.warm_start, pad_id=tok.pad_id, device="cpu", progress=False)
        print(f"warm start: {len(demos)} demonstrations, {len(history)} SFT steps, loss {history[0]['loss']:.2f} -> "
              f"{history[-1]['loss']:.3f} in {time.perf_counter() - started:.0f} s")
    return model.eval()


def summary(rollouts) -> dict:
    n = max(1, len(rollouts))
    return {"rollouts": len(rollouts), "turns_mean": sum(len(r.turns) for r in rollouts) / n,
            "tool_calls_mean": sum(r.tool_calls for r in rollouts) / n,
            "generated_mean": sum(r.num_generated for r in rollouts) / n,
            "completed_frac": sum(r.status.value == "completed" for r in rollouts) / n,
            "reward_mean": sum((r.env_reward or 0.0) for r in rollouts) / n}


async def run(args: argparse.Namespace, address: str, metrics_url: str | None) -> dict:
    from trainer.backends.seeding import StepSeeds
    from trainer.backends.vllm_backend import VllmBackend
    from trainer.rollout import RolloutLimits, run_rollouts
    from trainer.setup import TokenizerInfo, connect_env
    from trainer.tasks import make_task

    cfg = bench_config(args, address)
    tok = TokenizerInfo.load(cfg)
    env, reg = await connect_env(cfg, tok)
    try:
        task = make_task("puzzles", cfg.task.params, seed=cfg.seed, vocab_size=tok.vocab_size)
        limits = RolloutLimits.from_config(cfg)
        model = await tool_calling_model(cfg, tok, env, reg, task, limits)
        started = time.perf_counter()
        backend = VllmBackend.from_training_model(model, cfg, seed=cfg.seed)
        backend.sync_weights(model)
        print(f"vLLM engine up in {time.perf_counter() - started:.1f} s (max_num_seqs {args.rollouts})")
        stops = list(reg.stop_token_ids)

        async def batch(step: int, client):
            specs = [s for s in task.sample(cfg.prompts_per_step, step) for _ in range(cfg.num_generations)]
            await asyncio.to_thread(pool_refilled, metrics_url)  # both runs start on an idle machine
            backend.llm.reset_prefix_cache()  # neither run reuses the other's KV blocks
            t0, busy0, own0 = time.perf_counter(), machine_busy_s(), time.process_time()
            rollouts, stats = await run_rollouts(specs, StepSeeds(backend, seed=cfg.seed, step=step, specs=specs),
                                                 client, "python", reg.fingerprint, limits, stops,
                                                 gen_batch_wait_s=cfg.gen_batch_wait_s)
            own = time.process_time() - own0  # the engine and the rollout loop: this process
            cpu = {"cpu_trainer_s": round(own, 1), "cpu_rest_s": round(machine_busy_s() - busy0 - own, 1)}
            return time.perf_counter() - t0, rollouts, stats, cpu

        await batch(10_000, env)  # warm-up: the engine's first batches, the server's pool
        pairs = []
        for i in range(args.repeats):
            rec = OpenRecordingClient(env)
            wall_tools, with_tools, stats, cpu_tools = await batch(i + 1, rec)
            replay = ReplayEnv(rec)
            wall_gen, alone, _, cpu_gen = await batch(i + 1, replay)
            same = replay.missing == 0 and [r.ids for r in with_tools] == [r.ids for r in alone]
            pairs.append({"with_tools_s": round(wall_tools, 3), "generation_only_s": round(wall_gen, 3),
                          "ratio": round(wall_tools / wall_gen, 3), "same_ids": same,
                          "aborted": stats.aborted_attempts, "cpu_with_tools": cpu_tools,
                          "cpu_generation_only": cpu_gen, **summary(with_tools)})
            print(f"batch {i + 1}: with tools {wall_tools:.2f} s, generation alone {wall_gen:.2f} s, "
                  f"ratio {wall_tools / wall_gen:.3f} (same ids: {same}; CPU seconds, this process / the rest "
                  f"of the machine (env server, dockerd, sandboxes): with tools {cpu_tools['cpu_trainer_s']} / "
                  f"{cpu_tools['cpu_rest_s']}, alone {cpu_gen['cpu_trainer_s']} / {cpu_gen['cpu_rest_s']}; "
                  f"{summary(with_tools)})")
        return {"rollouts": args.rollouts, "pairs": pairs,
                "median_with_tools_s": statistics.median(p["with_tools_s"] for p in pairs),
                "median_generation_only_s": statistics.median(p["generation_only_s"] for p in pairs),
                "median_ratio": statistics.median(p["ratio"] for p in pairs)}
    finally:
        await env.close()


def main(argv: list[str] | None = None) -> int:
    import logging
    import os

    args = parse_args(argv)
    if args.rollouts % args.num_generations:
        raise SystemExit("--rollouts must be a multiple of --num-generations")
    logging.basicConfig(level=args.log_level.upper())
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    server = None
    metrics_url = args.metrics_url
    if args.env_address:
        address = args.env_address
    else:
        from tests.harness import bwrap_available, docker_available, start_server

        if why := (bwrap_available() if args.sandbox_backend == "bwrap" else docker_available()):
            raise SystemExit(why)
        tmp = tempfile.mkdtemp(prefix="tito-bench-rollout-")
        server = start_server(Path(tmp), env={"TITO_POOL__TARGET_SIZE": str(args.rollouts)},
                              backend=args.sandbox_backend)
        address = server.address
        metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        print(f"env server {address} ({args.sandbox_backend} sandboxes, warm pool of {args.rollouts}; "
              f"log {server.log_path})")
    try:
        result = asyncio.run(run(args, address, metrics_url))
    finally:
        if server is not None:
            server.terminate()
    print(f"ratio (wall with tools / generation alone, {args.rollouts} rollouts, median of {args.repeats}): "
          f"{result['median_ratio']:.3f}  (target <= 1.1)")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
