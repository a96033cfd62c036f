"""verl's own rollout code drives tito: `AgentLoopWorker.generate_sequences` (verl 0.9.1 in .venvs/verl) with
`tito.integrations.verl.TitoAgentLoop` loaded from an agent-loop yaml, a real tito server (bwrap sandboxes) and
the project's vLLM CPU engine serving a tiny model fine-tuned to call `run_python` (tests/integrations/inference.py).

One subprocess runs four batches: two rollouts of the tool task, a prompt longer than rollout.prompt_length, a
response budget the tool turn overflows, and a rollout whose session cannot open. The only stand-in is the
adapter in verl_rollout.py that forwards verl's `server_manager.generate` to the vLLM server (verl's own vLLM
server actors need a GPU).
"""

from __future__ import annotations

import json
import math
import subprocess
import urllib.request

import pytest

from tests.harness import REPO, start_server
from tests.integrations.conftest import framework_python
from tests.integrations.inference import (CODE, EXPECTED_ANSWER, FINAL, IM_END, MESSAGES, TEMPERATURE,
                                          TOOL_OUTPUT, inference_server, tool_model_dir)

pytestmark = [pytest.mark.framework, pytest.mark.vllm, pytest.mark.bwrap, pytest.mark.timeout(900)]

PROMPT_LENGTH = 512
RESPONSE_LENGTH = 160


def _row(environment: str | None = None, messages=None) -> dict:
    tito = {"env_args": json.dumps({"expected_answer": EXPECTED_ANSWER})}
    if environment:
        tito["environment"] = environment
    return {"messages": messages or MESSAGES, "extra_info": {"tito": tito}}


def _sessions_active(srv) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("tito_sessions_active"))


@pytest.fixture(scope="module")
def run(tmp_path_factory, bwrap_ok):
    python = framework_python("verl")
    pytest.importorskip("vllm", reason="vLLM is not installed (scripts/setup.sh installs its CPU build)")
    tmp = tmp_path_factory.mktemp("verl")
    model_dir = tool_model_dir()
    srv = start_server(tmp, backend="bwrap")
    try:
        with inference_server(model_dir, tmp) as engine:
            spec = {"tito": srv.address, "vllm_url": engine.url, "vllm_model": engine.model,
                    "model_dir": str(model_dir), "temperature": TEMPERATURE, "prompt_length": PROMPT_LENGTH,
                    "response_length": RESPONSE_LENGTH,
                    "batches": [
                        {"name": "tool", "rows": [_row(), _row()]},
                        {"name": "long_prompt", "rows": [_row(messages=[{"role": "user", "content": "x " * 600}])]},
                        {"name": "overflow", "rows": [_row()], "response_length": 30},
                        {"name": "aborted", "rows": [_row(environment="no_such_environment")]},
                    ]}
            (tmp / "spec.json").write_text(json.dumps(spec))
            proc = subprocess.run([str(python), str(REPO / "tests" / "integrations" / "verl_rollout.py"),
                                   str(tmp / "spec.json"), str(tmp / "out.json")], cwd=tmp, capture_output=True,
                                  text=True, timeout=420, env={
                                      "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HOME": str(tmp),
                                      # This checkout's tito (the venv holds the one `pip install .` built it with).
                                      "PYTHONPATH": str(REPO)})
            assert proc.returncode == 0, proc.stderr[-4000:]
            result = json.loads((tmp / "out.json").read_text())
        result["sessions_active_after"] = _sessions_active(srv)
        result["server"] = srv
        yield result
    finally:
        srv.terminate()


def test_verl_venv_keeps_its_transformers(run):
    major, minor = (int(x) for x in run["transformers"].split(".")[:2])
    assert (major, minor) < (5, 11), run["transformers"]  # verl's pin, untouched by `pip install .`
    assert run["verl"] == "0.9.1"


def _render(model_dir, conversation):
    from transformers import AutoTokenizer

    from env_server.environments.python_env import PythonEnvironment

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tools = [t.openai_spec() for t in PythonEnvironment.tool_specs()]
    return tokenizer, tokenizer.apply_chat_template(conversation, tools=tools, tokenize=False)


def test_verl_rows_hold_the_conversation_as_rendered(run):
    """Each row is the prompt the server rendered, the two generated turns and the server's suffix, verbatim;
    the whole equals the chat template's own render of the conversation (no re-tokenization drift)."""
    batch = run["batches"]["tool"]
    assert "rows" in batch, batch.get("traceback")
    calls = batch["calls"]
    assert len(calls) == 4  # two rollouts, two turns each
    model_dir = tool_model_dir()
    call = {"type": "function", "function": {"name": "run_python", "arguments": {"code": CODE}}}
    conversation = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "content": TOOL_OUTPUT, "name": "run_python"},
                    {"role": "assistant", "content": FINAL}]
    tokenizer, text = _render(model_dir, conversation)
    rendered = tokenizer.encode(text[:text.rindex("<|im_end|>") + len("<|im_end|>")], add_special_tokens=False)
    by_request: dict[str, list[dict]] = {}
    for c in calls:
        by_request.setdefault(c["request_id"], []).append(c)
    assert len(by_request) == 2  # one request id per rollout, kept across its turns
    for row, (first, second) in zip(batch["rows"], by_request.values()):
        assert row["tito_status"] == "completed" and row["tito_tool_calls"] == 1, row
        prompt = row["prompt_ids"]
        assert first["prompt_ids"] == prompt
        suffix = second["prompt_ids"][len(prompt) + len(first["ids"]):]
        assert second["prompt_ids"] == prompt + first["ids"] + suffix
        assert row["response_ids"] == first["ids"] + suffix + second["ids"]
        assert first["ids"][-1] == IM_END and second["ids"][-1] == IM_END
        assert tokenizer.decode(suffix).count("<tool_response>") == 1 and TOOL_OUTPUT in tokenizer.decode(suffix)
        assert row["input_ids"] == prompt + row["response_ids"]
        assert row["input_ids"] == rendered, (tokenizer.decode(row["input_ids"]), text)
        # The loss mask is 1 exactly on the generated ids; the logprobs are the engine's, 0 elsewhere.
        assert row["response_mask"] == [1] * len(first["ids"]) + [0] * len(suffix) + [1] * len(second["ids"])
        assert set(row["response_mask_padding"]) <= {0}
        expected_lp = first["logprobs"] + [0.0] * len(suffix) + second["logprobs"]
        assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(row["rollout_log_probs"], expected_lp, strict=True))
        # verl's rm_scores: the environment's reward on the last response token.
        assert row["rm_scores"] == [0.0] * (len(row["response_ids"]) - 1) + [1.0]
        assert row["num_turns"] == 4  # user, assistant, tool, assistant


def test_verl_turns_are_clamped_to_the_response_budget(run):
    first, second = run["batches"]["tool"]["calls"][:2]
    assert first["max_tokens"] == RESPONSE_LENGTH and IM_END in first["stop_token_ids"]
    used = len(second["prompt_ids"]) - len(first["prompt_ids"])
    assert second["max_tokens"] == RESPONSE_LENGTH - used
    over = run["batches"]["overflow"]
    assert "rows" in over, over.get("traceback")
    (row,) = over["rows"]
    # The tool turn did not fit 30 tokens: the rollout ends truncated, nothing past the budget, marked.
    assert row["tito_status"] == "truncated" and row["tito_truncation"] in ("tool_overflow", "length"), row
    assert len(row["response_ids"]) <= 30 and row["response_mask"] == [1] * len(row["response_ids"])
    assert over["calls"][0]["max_tokens"] == 30


def test_verl_prompt_over_budget_fails_the_batch_loudly(run):
    batch = run["batches"]["long_prompt"]
    assert batch["error_type"] == "TitoRolloutError", batch
    assert f"more than rollout.prompt_length={PROMPT_LENGTH}" in batch["error"] and not batch["calls"]


def test_verl_aborted_rollout_is_raised_not_scored(run):
    batch = run["batches"]["aborted"]
    assert batch["error_type"] == "TitoRolloutError", batch
    assert "env_call_failed" in batch["error"] and "no_such_environment" in batch["error"]


def test_verl_leaves_no_session_open(run):
    assert run["sessions_active_after"] == 0
