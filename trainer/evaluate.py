"""Evaluate a model on held-out reasoning-gym problems through the env server.

    python -m trainer.evaluate --model qwen2.5-coder-0.5b-instruct --dataset gsm_symbolic --n 50 \\
        --tools python --backend vllm --out runs/eval-0.5b-gsm-python

Each problem (split `test` of the `reasoning_gym` environment, tito.reasoning_gym_tasks) is one rollout through
the trainer's own machinery (tokenizer registration, OpenSession, the turn loop, Steps, suffix ids appended
verbatim) with the vLLM engine (CPU build or CUDA) or the transformers backend. Printed and written to
`summary.json`: accuracy (share of full-mark rewards) with a bootstrap 95% interval, the mean reward, the tool-call rate (rollouts that made at
least one call the server ran), the refused-attempt rate (turns that wrote something shaped like a tool call --
`<tool_call>`, a ```json fence or bare JSON with "name" and "arguments" -- that the server's parser did not
take as one), mean turns and generated tokens; `rollouts.jsonl` holds every rollout (its text included).
The model must be a fetched name (tito_assets.fetch_model), a folder or 'tiny-random-qwen3'; a chat template
other than the model's own (`--chat-template`, a name from tito_assets/template_sources.toml) gives a model
whose own template has no tool calling (SmolLM2) one that has.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tito.reasoning_gym_tasks import ReasoningGymTask, load_example
from trainer.report import CALL_SHAPED, turn_texts as report_turn_texts



def bootstrap_ci(values: list[float], *, samples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile bootstrap interval of the mean."""
    if not values:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(samples))
    return means[int(0.025 * samples)], means[min(samples - 1, int(0.975 * samples))]


def tokenizer_dir_with_template(model_dir: str, template: str, into: Path) -> Path:
    """The model's tokenizer files with another pinned chat template."""
    from tito_assets.template_sources import template_bytes

    into.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(model_dir) / name, into / name)
    (into / "chat_template.jinja").write_bytes(template_bytes(template))
    return into


def summarize(records: list[dict[str, Any]], n_asked: int) -> dict[str, Any]:
    rewards = [r["reward"] for r in records]
    # Accuracy counts full marks only: some reasoning-gym scorers give partial credit (basic_arithmetic 0.5 for
    # a wrong number), which the mean reward keeps.
    right = [1.0 if r >= 1.0 else 0.0 for r in rewards]
    turns = sum(len(r["turns"]) for r in records)
    attempts = sum(t["attempt"] for r in records for t in r["turns"])
    refused = sum(t["attempt"] and not t["tool_calls"] for r in records for t in r["turns"])
    low, high = bootstrap_ci(right)
    n = max(1, len(records))
    return {
        "problems": n_asked, "scored": len(records), "dropped": n_asked - len(records),
        "accuracy": sum(right) / n, "accuracy_ci95": [low, high], "mean_reward": sum(rewards) / n,
        "tool_call_rate": sum(r["tool_calls"] > 0 for r in records) / n,
        "tool_calls_per_problem": sum(r["tool_calls"] for r in records) / n,
        "refused_attempt_rate": refused / attempts if attempts else 0.0,
        "refused_attempts": refused, "tool_call_attempts": attempts,
        "mean_turns": turns / n, "mean_generated_tokens": sum(r["generated"] for r in records) / n,
        "statuses": {s: sum(r["status"] == s for r in records) for s in sorted({r["status"] for r in records})},
    }


def _record(rollout, problem, decode) -> dict[str, Any]:
    turn_texts = [{"text": text, "tool_calls": t.tool_calls, "attempt": bool(CALL_SHAPED.search(text)),
                   "finish": t.finish_reason.name, "step": t.step_status.name if t.step_status else None}
                  for t, text in zip(rollout.turns, report_turn_texts(rollout, decode))]
    return {"index": problem.index, "question": problem.question, "answer": problem.answer,
            "reward": float(rollout.env_reward or 0.0), "env_detail": rollout.env_detail,
            **{k: v for k, v in rollout.summary().items() if k not in ("reward", "env_detail")}, "turns": turn_texts}


async def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    from tqdm import tqdm

    from tito_assets.models import resolve_model
    from trainer.config import load_config
    from trainer.rollout import BatchStats, GenerationScheduler, RolloutLimits, RolloutRunner, RolloutSpec
    from trainer.setup import open_run

    tmp = tempfile.TemporaryDirectory(prefix="tito-eval-")
    overrides = [f"model.path={args.model}", f"backend={args.backend}", f"env.address={args.env_address}",
                 # The task only makes open_run connect the env; the problems are the test split's, made below.
                 "env.environment=reasoning_gym", "task.name=arithmetic", f"seed={args.seed}",
                 f"temperature={args.temperature}", f"budget.context={args.context}", f"budget.per_turn={args.per_turn}",
                 f"budget.max_turns={args.max_turns}", f"model.dtype={args.dtype}", "retries=1",
                 f"model.device={args.device}"]
    if args.backend == "vllm":
        overrides += [f"vllm.max_num_seqs={args.concurrency}", "vllm.enforce_eager=true"]
    if args.chat_template:
        folder = tokenizer_dir_with_template(resolve_model(args.tokenizer or args.model), args.chat_template,
                                             Path(tmp.name) / "tok")
        overrides.append(f"tokenizer.dir={folder}")
    elif args.tokenizer:
        overrides.append(f"tokenizer.dir={args.tokenizer}")
    cfg = load_config(None, overrides)
    task = ReasoningGymTask(args.dataset, json.loads(args.config), split="test", seed=args.data_seed,
                            tools=args.tools)
    problems = [task.problem(args.start + i) for i in range(args.n)]
    example = load_example(args.example)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    started = time.perf_counter()
    async with open_run(cfg) as run:
        limits = RolloutLimits.from_config(cfg)
        scheduler = GenerationScheduler(run.backend, max_wait_s=cfg.gen_batch_wait_s)
        runner = RolloutRunner(limits, scheduler, run.env, "reasoning_gym", run.fingerprint, run.stop_token_ids)
        gate = asyncio.Semaphore(args.concurrency)

        async def one(i: int, problem):
            async with gate:
                spec = RolloutSpec(group=i, messages=problem.messages(args.system, example), env_args=problem.env_args())
                return problem, await runner.run_with_retries(spec, i, BatchStats())

        try:
            with (out / "rollouts.jsonl").open("w") as jsonl, tqdm(total=len(problems), desc="eval",
                                                                    file=sys.stdout) as bar:
                for done in asyncio.as_completed([one(i, p) for i, p in enumerate(problems)]):
                    problem, rollout = await done
                    if rollout is not None:
                        record = _record(rollout, problem, run.decode)
                        records.append(record)
                        jsonl.write(json.dumps(record) + "\n")
                        jsonl.flush()
                    bar.update(1)
                    bar.set_postfix(acc=f"{sum(r['reward'] >= 1 for r in records) / max(1, len(records)):.2f}")
        finally:
            await scheduler.close()
    summary = summarize(records, len(problems))
    summary.update(model=args.model, dataset=args.dataset, config=json.loads(args.config), tools=args.tools,
                   backend=args.backend, temperature=args.temperature, data_seed=args.data_seed, start=args.start,
                   chat_template=args.chat_template, wall_s=round(time.perf_counter() - started, 1))
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    tmp.cleanup()
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.evaluate", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a fetched model's name, a model folder or 'tiny-random-qwen3'")
    ap.add_argument("--dataset", default="gsm_symbolic", help="a reasoning-gym dataset name")
    ap.add_argument("--config", default="{}", help="the dataset's config as a JSON object")
    ap.add_argument("--tools", choices=["python", "none"], default="python")
    ap.add_argument("--n", type=int, default=50, help="held-out problems (split test)")
    ap.add_argument("--start", type=int, default=0, help="index of the first problem")
    ap.add_argument("--data-seed", type=int, default=0, help="the test split's seed")
    ap.add_argument("--backend", choices=["vllm", "transformers"], default="vllm")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--env-address", default="127.0.0.1:50051")
    ap.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--context", type=int, default=2048, help="tokens per rollout (prompt + all turns)")
    ap.add_argument("--per-turn", type=int, default=384, help="new tokens per assistant turn")
    ap.add_argument("--max-turns", type=int, default=4)
    ap.add_argument("--concurrency", type=int, default=8, help="rollouts in flight")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--system", default=None, help="a system message (default: none, the template's own)")
    ap.add_argument("--tokenizer", default=None,
                    help="the tokenizer and chat template (a fetched model's name or a folder) where --model has none "
                         "(a trainer checkpoint: give the name of the model it was trained from)")
    ap.add_argument("--example", default=None,
                    help="a JSON file of messages: a worked example put before each problem (as the training run's "
                         "task.params.example)")
    ap.add_argument("--chat-template", default=None, help="render with this pinned template instead of the model's")
    ap.add_argument("--out", required=True, help="folder for rollouts.jsonl and summary.json")
    args = ap.parse_args(argv)
    try:
        json.loads(args.config)
    except json.JSONDecodeError as e:
        ap.error(f"--config is not JSON: {e}")
    summary = asyncio.run(evaluate(args))
    low, high = summary["accuracy_ci95"]
    print(f"{args.model} on {args.dataset} (tools {args.tools}), {summary['scored']}/{summary['problems']} scored: "
          f"accuracy {summary['accuracy']:.3f} [{low:.3f}, {high:.3f}], tool-call rate {summary['tool_call_rate']:.2f}, "
          f"refused attempts {summary['refused_attempts']}/{summary['tool_call_attempts']}, "
          f"mean turns {summary['mean_turns']:.2f}, mean tokens {summary['mean_generated_tokens']:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
