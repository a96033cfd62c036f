"""End to end on CPU: a real env server (subprocess) with real containers, the real offline Qwen
tokenizer (qwen2_5 template) and a random tiny Qwen3.

A random model never writes a tool call, so the assistant turns come from a scripted policy (the
tokenizer's encoding of scripted `<tool_call>` text, stop token included); the tiny model supplies
their logprobs and is what the loss recomputes them with.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.harness import REPO
from tito.client import AsyncTitoClient, RecordingClient
from tito.rollout.state import Status, TruncationCause
from tito.types import StepStatus
from trainer.backends.scripted import ScriptedBackend
from trainer.model import build_tiny_qwen3, collate, target_logprobs
from trainer.rollout import RolloutLimits, RolloutSpec, run_rollouts
from trainer.teacher_text import tool_call_text as call

pytestmark = [pytest.mark.docker, pytest.mark.slow]

MESSAGES = [{"role": "user", "content": "What is 6 * 7? Use run_python."}]


class FirstStepToUnknownSession(RecordingClient):
    """Sends the first Step to a session the server does not know: the real server answers
    NOT_FOUND, as after a restart. Only that rollout may abort; its retry must start clean."""

    sabotaged = False

    async def step(self, request):
        if not self.sabotaged:
            self.sabotaged = True
            return await self.inner.step(dataclasses.replace(request, session_id="no-such-session"))
        return await super().step(request)


@pytest.fixture(scope="module")
def model():
    return build_tiny_qwen3(seed=0).eval()


async def _connect(server, files):
    from tito.fingerprint import compute_fingerprint
    from tito.tokenizer_files import tokenizer_files

    client = AsyncTitoClient(server.address)
    await client.wait_ready(60)
    reg = await client.register_tokenizer(files)
    assert reg.fingerprint == compute_fingerprint(tokenizer_files(files))
    return client, reg


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


async def _run(server, files, tokenizer, model, scripts, limits, *, env_args=None, sabotage=False,
               n=1):
    client, reg = await _connect(server, files)
    try:
        rec = (FirstStepToUnknownSession if sabotage else RecordingClient)(client)
        turns = {i: [_encode(tokenizer, t) for t in s] for i, s in enumerate(scripts)}

        def script(req):
            return turns[req.key.spec][req.turn]

        specs = [RolloutSpec(group=0, messages=MESSAGES, env_args=env_args) for _ in range(n)]
        rollouts, stats = await run_rollouts(specs, ScriptedBackend(script, model=model), rec, "python",
                                             reg.fingerprint, limits, reg.stop_token_ids, gen_batch_wait_s=0.01)
        return rollouts, stats, rec, turns, reg
    finally:
        await client.close()


def test_multi_turn_rollout_ids_are_exact_concatenation(server, tok, model):
    files, tokenizer = tok
    script = [call("x = 6 * 7\nprint(x)"), call("x + 0"), "The answer is 42.<|im_end|>"]
    limits = RolloutLimits(budget=2048, per_turn_cap=128, reserve=16, max_turns=4)
    rollouts, stats, rec, turns, reg = asyncio.run(
        _run(server, files, tokenizer, model, [script], limits, env_args={"expected_answer": "42"}))
    assert stats.aborted_attempts == 0
    (r,) = rollouts
    assert r.status is Status.COMPLETED and r.env_reward == 1.0
    steps = [s.result for s in rec.steps[r.session_id]]
    assert [s.status for s in steps] == [StepStatus.OK, StepStatus.OK, StepStatus.EPISODE_END]
    assert [t.step_status for t in r.turns] == [s.status for s in steps]
    assert "42" in steps[0].tool_messages[0].content
    gens = turns[0]
    expected = [*rec.prompts[r.session_id], *gens[0], *steps[0].suffix_ids, *gens[1],
                *steps[1].suffix_ids, *gens[2]]
    assert r.ids == expected  # verbatim: prompt, each turn's generated ids, each suffix, in order
    mask = [0] * r.prompt_len + [1] * len(gens[0]) + [0] * len(steps[0].suffix_ids) + \
        [1] * len(gens[1]) + [0] * len(steps[1].suffix_ids) + [1] * len(gens[2])
    assert r.mask == mask
    assert all(len(s.suffix_ids) > 0 for s in steps[:2]) and steps[2].suffix_ids == ()
    assert gens[0][-1] in reg.stop_token_ids
    r.check()
    assert rec.closed == [r.session_id]
    # The loss sees the same logprobs at the same positions as the policy produced.
    batch = collate([r], torch.zeros(1), pad_id=0, device="cpu")
    with torch.no_grad():
        lp = target_logprobs(model, batch.input_ids, batch.mask)
    sel = batch.mask.bool()
    assert lp[sel].tolist() == pytest.approx(batch.old_logp[sel].tolist(), abs=1e-4)


def test_suffix_cut_to_budget_then_overflow_truncates(server, tok, model):
    files, tokenizer = tok
    big, big2 = call("print('x' * 20000)"), call("print('y' * 9000)")
    script = [big, big2, "done<|im_end|>"]
    # Probe the prompt length (deterministic for the same messages).
    probe, *_ = asyncio.run(_run(server, files, tokenizer, model, [["ok<|im_end|>"]],
                                 RolloutLimits(budget=4096, per_turn_cap=64, reserve=0, max_turns=1)))
    p = probe[0].prompt_len
    g, g2 = len(_encode(tokenizer, big)), len(_encode(tokenizer, big2))
    k = 60  # suffix room after turn 1
    reserve = g2 + 2  # just enough for turn 2, then no room for any suffix
    limits = RolloutLimits(budget=p + g + k + reserve, per_turn_cap=max(g, g2), reserve=reserve,
                           max_turns=4)
    rollouts, stats, rec, turns, _ = asyncio.run(_run(server, files, tokenizer, model, [script], limits))
    (r,) = rollouts
    steps = [s.result for s in rec.steps[r.session_id]]
    # Turn 1: the server cut the tool output (head/tail + marker) to fit max_suffix_tokens = k.
    assert steps[0].status is StepStatus.OK and steps[0].truncated
    assert 0 < len(steps[0].suffix_ids) <= k
    assert r.turns[0].suffix_len == len(steps[0].suffix_ids) and r.turns[0].tool_truncated
    # Turn 2: not even the minimal suffix fits what is left: truncated, nothing appended.
    assert r.status is Status.TRUNCATED and r.truncation is TruncationCause.TOOL_OVERFLOW, \
        (r.summary(), [(s.status, len(s.suffix_ids)) for s in steps])
    assert len(r.turns) == 2 and r.turns[1].suffix_len == 0
    assert r.ids == [*rec.prompts[r.session_id], *turns[0][0], *steps[0].suffix_ids, *turns[0][1]]
    assert r.mask == [0] * p + [1] * g + [0] * len(steps[0].suffix_ids) + [1] * g2
    assert len(r.ids) == len(r.mask) == len(r.logprobs) <= limits.budget
    r.check()


def test_env_failure_aborts_one_rollout_and_retry_starts_clean(server, tok, model):
    files, tokenizer = tok
    script = [call("print(1)"), "1<|im_end|>"]
    limits = RolloutLimits(budget=2048, per_turn_cap=128, reserve=16, max_turns=3, retries=1)
    rollouts, stats, rec, turns, _ = asyncio.run(
        _run(server, files, tokenizer, model, [script] * 3, limits, sabotage=True, n=3))
    assert stats.aborted_attempts == 1 and stats.dropped == 0 and len(rollouts) == 3
    assert "NOT_FOUND" in stats.abort_reasons[0]
    assert sorted(r.attempt for r in rollouts) == [0, 0, 1]
    for r in rollouts:
        assert r.status is Status.COMPLETED
        assert r.ids[: r.prompt_len] == list(rec.prompts[r.session_id])  # a fresh session's prompt
        assert r.ids == [*rec.prompts[r.session_id], *turns[0][0], *rec.steps[r.session_id][0].result.suffix_ids,
                         *turns[0][1]]
    assert len(rec.closed) == 4  # the aborted attempt's session was closed too


def test_sandbox_lost_aborts_and_is_dropped_after_retries(server, tok, model):
    files, tokenizer = tok
    script = [call("import os\nos._exit(3)"), "x<|im_end|>"]
    limits = RolloutLimits(budget=2048, per_turn_cap=128, reserve=16, max_turns=3, retries=0)
    rollouts, stats, rec, _, _ = asyncio.run(_run(server, files, tokenizer, model, [script], limits))
    assert rollouts == [] and stats.dropped == 1
    assert stats.abort_reasons[0].startswith("sandbox_lost: ")


def test_cli_demo_smoke(server, tmp_path):
    """`python -m trainer --config examples/demo.yaml` against the server: a two-step warm start
    (demonstrations through the server), then two short GRPO steps."""
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainer", "--config", str(REPO / "examples/demo.yaml"),
           "--output-dir", str(out), "--env-address", server.address, "--steps", "2",
           "--set", "prompts_per_step=1", "--set", "num_generations=2", "--set", "warm_start.steps=2",
           "--set", "progress=false"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2]
    for key in ("reward_mean", "reward_std", "truncated_frac", "aborted_frac", "tool_calls_mean"):
        assert key in lines[-1]
    assert (out / "metrics.png").is_file() and (out / "checkpoint" / "config.json").is_file()
    warm = [json.loads(x) for x in (out / "warmstart.jsonl").read_text().splitlines()]
    assert [(m["phase"], m["step"]) for m in warm] == [("warm_start", 1), ("warm_start", 2)]
    assert all(m["loss"] > 0 for m in warm) and (out / "warmstart.png").is_file()
    demos = [json.loads(x) for x in (out / "demonstrations.jsonl").read_text().splitlines()]
    # The demo's warm start also shows estimates given without the tool ("head"): the env scores those 0.
    assert demos and all(d["status"] == "completed" for d in demos)
    assert all(d["env_reward"] == (0.0 if d["meta"]["teacher"] == "head" else 1.0) for d in demos)


@pytest.mark.vllm
def test_cli_demo_vllm_smoke(server, tmp_path):
    """`python -m trainer --config examples/demo_vllm.yaml --steps 3` against the server: the demo on
    a colocated vLLM engine (its CPU build here), with a two-step warm start to keep it short."""
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "trainer", "--config", str(REPO / "examples/demo_vllm.yaml"),
           "--output-dir", str(out), "--env-address", server.address, "--steps", "3",
           "--set", "prompts_per_step=2", "--set", "num_generations=2", "--set", "warm_start.steps=2",
           "--set", "progress=false", "--set", "save_checkpoint=false"]
    env = {**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    # Sampler and recompute agree (fp32 engine and policy), and no rollout lost its logprobs.
    assert all(abs(m["ratio_mean"] - 1) < 1e-3 and m["aborted_frac"] == 0 for m in lines)
