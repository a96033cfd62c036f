"""An inference server for the frameworks' tests: the project's vLLM CPU engine behind vLLM's own
OpenAI-compatible server on loopback, serving a tiny model that calls tools.

    model_dir = tool_model_dir()                 # built once (~tens of seconds), cached under .build/
    with inference_server(model_dir) as engine:  # `python -m vllm.entrypoints.openai.api_server`
        out = complete(engine.url, engine.model, prompt_ids, max_tokens=64, stop_token_ids=[IM_END])
        out.ids, out.logprobs, out.finish_reason  # token ids and the engine's own sampled logprobs

The model is a random 2-layer Qwen3 (head_dim 64: vLLM's CPU attention refuses 16) with the real Qwen
tokenizer (tito_assets.qwen_tokenizer, template TEMPLATE), fine-tuned with torch for a few dozen steps so that,
asked `PROMPT` with the python environment's tools, it answers with a `run_python` call of `CODE`, and after
the tool's result with `FINAL` — so a rollout reaches the tool path with a real engine's ids and logprobs.
It learns the answer turns only (the loss is on the assistant's tokens), from a few renders of the
conversation, so small differences in the prompt's render do not change what it writes.

`complete` needs only the standard library: the frameworks' venvs import it too (their subprocess scripts
put the repository on sys.path). Building the model needs torch and transformers (.venv).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".build" / "tool-model"
TEMPLATE = "qwen2_5"
ENVIRONMENT = "python"
PROMPT = "What is 6 * 7? Use run_python to compute it, then give the answer."
MESSAGES = [{"role": "user", "content": PROMPT}]
CODE = "print(6 * 7)"
TOOL_OUTPUT = "42"  # what the python environment answers for CODE
FINAL = "The answer is 42."
EXPECTED_ANSWER = "42"  # the python environment's env_args: reward 1.0 for FINAL
SERVED_NAME = "tito-tool-model"
IM_END = 151645  # <|im_end|>: the Qwen family's end of turn
TRAIN_STEPS = 80
# Mean cross-entropy per answer token where training stops early. 80 steps reach ~0.06: sample it at a
# temperature well below 1 (the tests use TEMPERATURE) for the answers to come out as trained.
TARGET_LOSS = 1e-3
TEMPERATURE = 0.3
BUILD_VERSION = "1"  # bump when the recipe below changes in a way this file's hash would not show


@dataclass(frozen=True)
class Completion:
    ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (ended on a stop id, included in ids) or "length"


@dataclass(frozen=True)
class InferenceServer:
    url: str  # http://127.0.0.1:PORT (the OpenAI API is under /v1)
    model: str  # the served model name, for the requests' "model"
    model_dir: Path
    log_path: Path


def complete(url: str, model: str, prompt_ids: Sequence[int], *, max_tokens: int,
             stop_token_ids: Sequence[int] = (IM_END,), temperature: float = 1.0, top_p: float = 1.0,
             seed: int | None = None, timeout_s: float = 120.0) -> Completion:
    """One `/v1/completions` request with token ids in and out, and the sampled tokens' logprobs."""
    body = {"model": model, "prompt": list(prompt_ids), "max_tokens": max_tokens, "temperature": temperature,
            "top_p": top_p, "logprobs": 0, "stop_token_ids": list(stop_token_ids),
            "return_tokens_as_token_ids": True, "skip_special_tokens": False}
    if seed is not None:
        body["seed"] = seed
    request = urllib.request.Request(f"{url}/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            choice = json.loads(response.read())["choices"][0]
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"the vLLM server refused the request ({e.code}): {e.read()[:500]!r}") from None
    lp = choice["logprobs"]
    # With return_tokens_as_token_ids every token reads "token_id:N".
    ids = [int(t.rsplit(":", 1)[1]) for t in lp["tokens"]]
    return Completion(ids, [float(x) for x in lp["token_logprobs"]], choice["finish_reason"])


# ------------------------------------------------------------------------------------------- the model

def _conversations() -> list[list[dict]]:
    """Renders the model learns from: the test's conversation, with and without a system message."""
    call = {"type": "function", "function": {"name": "run_python", "arguments": {"code": CODE}}}
    turns = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]},
             {"role": "tool", "content": TOOL_OUTPUT, "name": "run_python"},
             {"role": "assistant", "content": FINAL}]
    return [turns, [{"role": "system", "content": "You are a helpful assistant."}, *turns]]


def _tools() -> list[dict]:
    from env_server.environments.python_env import PythonEnvironment

    return [t.openai_spec() for t in PythonEnvironment.tool_specs()]


def _examples(tokenizer) -> list[tuple[list[int], list[int]]]:
    """(ids, targets) per conversation: targets are 1 on the assistant turns' tokens (through <|im_end|>)."""
    examples = []
    tools = _tools()
    for conv in _conversations():
        ids: list[int] = []
        targets: list[int] = []
        for i, message in enumerate(conv):
            if message["role"] != "assistant":
                continue
            # The render up to this turn's generation prompt, then through this turn: the difference is the turn.
            before = tokenizer.apply_chat_template(conv[:i], tools=tools, add_generation_prompt=True, tokenize=False)
            after = tokenizer.apply_chat_template(conv[:i + 1], tools=tools, tokenize=False)
            assert after.startswith(before), "the template rewrote an earlier turn"
            turn = after[len(before):]
            turn = turn[:turn.index("<|im_end|>") + len("<|im_end|>")]
            context = tokenizer.encode(before, add_special_tokens=False)
            assert context[:len(ids)] == ids, "the render's ids of the earlier turns changed"
            targets += [0] * (len(context) - len(ids))
            ids = context
            answer = tokenizer.encode(turn, add_special_tokens=False)
            ids = ids + answer
            targets += [1] * len(answer)
        examples.append((ids, targets))
    return examples


def _digest(tokenizer_dir: Path) -> str:
    """The recipe (what the model learns and how) and the tokenizer's files: the server code may change freely."""
    h = hashlib.sha256(BUILD_VERSION.encode())
    recipe = [MESSAGES, CODE, TOOL_OUTPUT, FINAL, TRAIN_STEPS, TARGET_LOSS]
    h.update(json.dumps(recipe).encode())
    for f in (_conversations, _tools, _examples, _train):
        h.update(inspect.getsource(f).encode())
    for f in sorted(tokenizer_dir.iterdir()):
        if f.is_file():
            h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def tool_model_dir(cache: Path = CACHE) -> Path:
    """The fine-tuned model's folder (weights, config, tokenizer files), built once per content hash.
    Safe to call from several processes at once (a file lock; the folder appears whole or not at all)."""
    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    tokenizer_dir = Path(build_tokenizer_dir(template=TEMPLATE))
    target = cache / _digest(tokenizer_dir)
    if (target / "config.json").exists():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (target / "config.json").exists():
            tmp = cache / f".{target.name}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            _train(tokenizer_dir, tmp)
            tmp.rename(target)
    return target


def _train(tokenizer_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    from trainer.model import build_tiny_qwen3

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    examples = _examples(tokenizer)
    model = build_tiny_qwen3(seed=11, hidden=64, heads=4, kv_heads=2, head_dim=64, intermediate=256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    torch.manual_seed(0)
    model.train()
    for step in range(TRAIN_STEPS):
        loss = torch.zeros(())
        for ids, targets in examples:
            x = torch.tensor([ids[:-1]])
            y = torch.tensor(ids[1:])
            where = torch.tensor(targets[1:]).bool()
            hidden = model.model(input_ids=x).last_hidden_state[0]
            # Logits only where the loss is: the full vocabulary over every position costs far more.
            logits = model.lm_head(hidden[where])
            loss = loss + torch.nn.functional.cross_entropy(logits, y[where])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() / len(examples) < TARGET_LOSS:
            break
        if os.environ.get("TITO_TOOL_MODEL_VERBOSE"):
            print(f"step {step} loss {loss.item() / len(examples):.4f}", flush=True)
    model.eval()
    out.mkdir(parents=True)
    model.save_pretrained(out)
    for f in tokenizer_dir.iterdir():
        if f.is_file():
            shutil.copy(f, out / f.name)
    (out / "training.json").write_text(json.dumps({"steps": step + 1, "loss": loss.item() / len(examples)}))


# ------------------------------------------------------------------------------------------ the server

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def inference_server(model_dir: Path, log_dir: Path, *, max_model_len: int = 2048,
                     timeout_s: float = 600.0) -> Iterator[InferenceServer]:
    """vLLM's OpenAI server (the CPU build in .venv) on a free loopback port, float32, eager, its CPU settings
    (tito.rollout.vllm.cpu_engine_kwargs) and the processed (after temperature) logprobs; stopped on exit."""
    from tito.rollout.vllm import cpu_engine_kwargs

    kw = cpu_engine_kwargs(max_model_len=max_model_len)
    port = _free_port()
    log_path = Path(log_dir) / f"vllm-{port}.log"
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(Path(model_dir).resolve()),
           "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", "float32", "--enforce-eager", "--max-model-len", str(max_model_len),
           "--no-enable-chunked-prefill", "--max-num-batched-tokens", str(kw["max_num_batched_tokens"]),
           "--kv-cache-memory-bytes", str(kw["kv_cache_memory_bytes"]), "--logprobs-mode", "processed_logprobs",
           "--max-num-seqs", "16"]
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the vLLM server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"the vLLM server did not answer in {timeout_s} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(0.5)
        yield InferenceServer(url, SERVED_NAME, Path(model_dir), log_path)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
