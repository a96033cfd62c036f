"""tito from AReaL 1.0.4, with AReaL's own code: its RemotevLLMEngine and WorkflowExecutor.rollout_batch (in
.venvs/areal, tests/integrations/areal_rollout.py) drive tito.integrations.areal.TitoWorkflow against the vLLM
CPU server (tests/integrations/inference.py: a tiny Qwen3 that calls run_python) and a real tito server (bwrap).

What a trainer relies on is checked against the source of each fact: the ids against the chat template's render
and against the tito server's own prompt and suffix for the same turns, the logprobs against the engine's own answers to
AReaL's requests, the reward against the environment's verdict; and what AReaL does with a prompt over the budget, a
turn cut by the budget and an env server that is gone.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

from tests.harness import REPO, free_port, start_server
from tests.integrations import inference
from tests.integrations.conftest import framework_python

pytestmark = [pytest.mark.framework, pytest.mark.vllm, pytest.mark.bwrap, pytest.mark.slow, pytest.mark.timeout(900)]

MAX_TOKENS = 512
MAX_NEW = 64  # areal_rollout.py's gconfig.max_new_tokens


@pytest.fixture(scope="module")
def areal_python():
    return framework_python("areal")


@pytest.fixture(scope="module")
def model_dir():
    pytest.importorskip("vllm")
    return inference.tool_model_dir()


@pytest.fixture(scope="module")
def engine(model_dir, tmp_path_factory):
    # A loaded 2-core machine can take minutes to start it; an idle one ~15 s.
    with inference.inference_server(model_dir, tmp_path_factory.mktemp("vllm"), timeout_s=600) as server:
        yield server


@pytest.fixture(scope="module")
def tito_server(bwrap_ok, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("tito"), backend="bwrap")
    yield server
    server.terminate()


def _sessions_active(server) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("tito_sessions_active "):
                return float(line.split()[1])
    raise AssertionError("the server's metrics have no tito_sessions_active")


def _segments(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) runs of the loss mask."""
    runs = []
    start = 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            runs.append((mask[start], start, i))
            start = i
    return runs


def test_areal_rollout_batch_through_tito(areal_python, model_dir, engine, tito_server, tmp_path):
    from transformers import AutoTokenizer

    from tito.client import StepStatus, TitoClient

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    env_args = {"expected_answer": inference.EXPECTED_ANSWER}
    with TitoClient(tito_server.address) as client:
        fingerprint = client.register_tokenizer(tokenizer).fingerprint
        with client.open_session(inference.ENVIRONMENT, inference.MESSAGES, fingerprint=fingerprint,
                                 env_args=env_args) as s:
            prompt_ids = list(s.prompt_ids)

    dead = free_port()  # nothing listens there
    spec = {"vllm": engine.url.removeprefix("http://"), "tito": tito_server.address, "dead_tito": f"127.0.0.1:{dead}",
            "model_dir": str(model_dir), "messages": inference.MESSAGES, "env_args": env_args,
            "max_tokens": MAX_TOKENS, "prompt_len": len(prompt_ids),
            "temperature": inference.TEMPERATURE}
    proc = subprocess.run([str(areal_python), str(REPO / "tests" / "integrations" / "areal_rollout.py"),
                           json.dumps(spec)], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                               "HOME": str(tmp_path)})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("AREAL-RESULT ")]
    assert proc.returncode == 0 and lines, f"rc {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    out = json.loads(lines[-1].removeprefix("AREAL-RESULT "))

    # AReaL's own transformers (its pin is <= 5.3.0) stayed, and the tito client imported beside it.
    major, minor, *_ = (int(x) for x in out["transformers"].split(".")[:2])
    assert (major, minor) <= (5, 3), out["transformers"]
    assert out["areal"] == "1.0.4" and "+cpu" in out["torch"], out

    # The prompt far over the budget: both its episodes None, so its group is dropped; the good group is whole.
    assert out["batches"] == 1 and len(out["batch"]) == 2, out["batch"]
    conversation = [*inference.MESSAGES,
                    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                        "name": "run_python", "arguments": {"code": inference.CODE}}}]},
                    {"role": "tool", "content": inference.TOOL_OUTPUT, "name": "run_python"},
                    {"role": "assistant", "content": inference.FINAL}]
    rendered = tokenizer.apply_chat_template(conversation, tools=inference._tools(), tokenize=True)
    rendered = list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)
    for row in out["batch"]:
        ids, mask, logprobs, versions = row["input_ids"], row["loss_mask"], row["logprobs"], row["versions"]
        assert len(ids) == len(mask) == len(logprobs) == len(versions) <= MAX_TOKENS
        # The row is the template's render of the conversation (its trailing newline is after the last turn).
        assert ids == rendered[:len(ids)] and len(rendered) - len(ids) <= 1, tokenizer.decode(ids)
        runs = _segments(mask)
        assert [v for v, _, _ in runs] == [0, 1, 0, 1], runs  # prompt, tool call, suffix, answer
        (_, _, p_end), (_, _, g1_end), (_, _, s_end), (_, _, g2_end) = runs
        assert ids[:p_end] == prompt_ids
        # The suffix is the tito server's, verbatim: replay the same turns in a fresh session.
        with TitoClient(tito_server.address) as client:
            with client.open_session(inference.ENVIRONMENT, inference.MESSAGES, fingerprint=fingerprint,
                                     env_args=env_args) as s:
                first = s.step(ids[p_end:g1_end])
                assert first.status is StepStatus.OK and list(first.suffix_ids) == ids[g1_end:s_end]
                last = s.step(ids[s_end:g2_end])
                assert last.status is StepStatus.EPISODE_END
        assert ids[g1_end - 1] == inference.IM_END and ids[-1] == inference.IM_END
        # The reward is the environment's verdict (the python env's expected answer).
        assert row["rewards"] == last.reward == 1.0
        # Logprobs: the engine's on generated ids, 0.0 elsewhere; versions the engine's (0) there, -1 elsewhere.
        # What the engine was asked and answered, turn by turn (AReaL's own requests, recorded as sent).
        turn1 = [c for c in out["calls"] if c["prompt_ids"] == ids[:p_end] and c["ids"] == ids[p_end:g1_end]]
        turn2 = [c for c in out["calls"] if c["prompt_ids"] == ids[:s_end] and c["ids"] == ids[s_end:g2_end]]
        assert turn1 and turn2, "the row's generated ids are not what the engine returned for its context"
        for call in (turn1[0], turn2[0]):
            assert inference.IM_END in call["stop_token_ids"] and call["finish_reason"] == "stop"
            assert call["max_tokens"] == min(MAX_NEW, MAX_TOKENS - len(call["prompt_ids"]))
        expected = [0.0] * p_end + turn1[0]["logprobs"] + [0.0] * (s_end - g1_end) + turn2[0]["logprobs"]
        assert len(expected) == len(logprobs)
        assert all(abs(a - b) < 1e-6 for a, b in zip(logprobs, expected)), (logprobs, expected)
        assert versions == [0 if m else -1 for m in mask]

    # The tight budget: the first turn is cut by length, kept (AReaL trains on it) with no reward.
    [tight] = out["tight"]
    assert [c["max_tokens"] for c in out["calls"] if c["prompt_ids"] == prompt_ids and len(c["ids"]) == 4] == [4]
    assert tight["loss_mask"] == [0] * len(prompt_ids) + [1] * 4 and tight["input_ids"][:len(prompt_ids)] == prompt_ids
    assert tight["rewards"] == 0.0

    # The env server gone: the episodes are aborted, AReaL gets None for each and keeps nothing.
    assert out["dead"] == []
    assert "tito episode rejected (env_call_failed" in proc.stderr, proc.stderr[-3000:]
    # Every session the workflows opened is closed.
    assert _sessions_active(tito_server) == 0
