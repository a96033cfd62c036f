"""TitoEnvironmentSpec under an unchanged GRPOTrainer's own tool loop, against a real env server.

The trainer samples with the example's steering (a scripted run_python call, then the answer);
TRL parses the call and calls the environment's tool method. Checked against what the server
recorded: every tool call TRL made reached tito with the same arguments, TRL's tool messages are
tito's, and every session is closed.
"""

from __future__ import annotations

import json
import time

import pytest
from datasets import Dataset
from transformers.utils import get_json_schema
from trl import GRPOTrainer

from tests.harness import containers_of
from tests.trl.helpers import grpo_config
from tito.client import StepStatus
from tito.trl import TitoEnvironmentSpec
from tito.trl.environment import environment_class, tool_method
from tito.types import EnvironmentInfo, ToolSpec
from trainer.model import build_tiny_qwen3

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROWS = [{"prompt": [{"role": "user", "content": q}], "answer": a, "code": c} for q, a, c in (
    ("What is 21 * 43?", "903", "print(21 * 43)"), ("What is 17 * 29?", "493", "print(17 * 29)"))]


def env_args(row):
    return {"expected_answer": row["answer"]}


@pytest.fixture(scope="module")
def run(client, tokenizer, example, tmp_path_factory):
    """One GRPO step (2 prompts x 2 generations) with TRL's tool loop; a reward function records
    TRL's completions and which environment (session) each came from."""
    spec = TitoEnvironmentSpec(client, "python", env_args=env_args)
    seen = []

    def record(completions, environments, **_):
        seen.extend(zip(completions, [e.session_id for e in environments], strict=True))
        return [None] * len(completions)

    trainer = GRPOTrainer(
        model=build_tiny_qwen3(seed=0), processing_class=tokenizer,
        args=grpo_config(tmp_path_factory.mktemp("grpo"), chat_template_kwargs=spec.chat_template_kwargs,
                         max_tool_calling_iterations=2,
                         generation_kwargs={"sequence_bias": example.steering_bias(tokenizer, ROWS)}),
        train_dataset=Dataset.from_list(ROWS), environment_factory=spec.environment_factory,
        reward_funcs=[spec.reward_funcs, record])
    trainer.train()
    spec.close()
    return trainer, seen


def test_every_tool_call_reached_tito(run, client):
    trainer, seen = run
    assert len(seen) == 4
    for completion, session_id in seen:
        steps = client.aio.steps[session_id]
        calls = [c for m in completion if m["role"] == "assistant" for c in m.get("tool_calls") or []]
        tool_messages = [m["content"] for m in completion if m["role"] == "tool"]
        assert calls, "the steered model made no tool call: the test would prove nothing"
        # One Step per call TRL parsed, with its name and arguments; then one Step ending the episode.
        assert [(s.request.tool_calls[0].name, json.loads(s.request.tool_calls[0].arguments)) for s in steps[:-1]] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in calls]
        assert tool_messages == [s.result.tool_messages[0].content for s in steps[:-1]]
        final = steps[-1]
        assert not final.request.tool_calls and final.request.assistant_content == completion[-1]["content"]
        assert final.result.status is StepStatus.EPISODE_END and final.result.reward == 1.0
    logged = [h for h in trainer.state.log_history if "reward" in h][0]
    assert logged["rewards/tito_reward/mean"] == 1.0 and logged["tools/call_frequency"] == 1.0
    assert logged["tito/env_seconds"] > 0


def test_every_session_is_closed(run, client, server):
    _, seen = run
    sessions = [s for _, s in seen]
    assert set(sessions) <= set(client.aio.closed)
    assert not any(client.close_session(s) for s in sessions)
    # No container is left but the warm pool (TITO_POOL__TARGET_SIZE=2 in tests.harness).
    deadline = time.monotonic() + 30
    while len(containers_of(server.server_name)) > 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(containers_of(server.server_name)) <= 2


def test_reset_and_close_end_open_sessions(client):
    spec = TitoEnvironmentSpec(client, "python")
    env = spec.environment_factory()
    env.reset(prompt=[], answer="1")
    first = env.session_id
    assert env.run_python(code="6 * 7") == "Out: 42"
    env.reset(prompt=[], answer="2")  # TRL only ever resets: the previous session must go
    assert not client.close_session(first)
    second = env.session_id
    spec.close()
    assert not client.close_session(second)


def test_the_tool_schema_is_tito_s(client):
    info = client.environment("python")
    env_cls = environment_class(info)
    schema = get_json_schema(env_cls.run_python)["function"]
    tito = info.tools[0]
    assert schema["name"] == tito.name and schema["description"] == tito.description
    assert schema["parameters"]["required"] == tito.parameters["required"]
    assert schema["parameters"]["properties"]["code"] == {
        "type": "string", "description": tito.parameters["properties"]["code"]["description"]}
    guess = get_json_schema(environment_class(client.environment("guess_number")).guess)["function"]
    assert guess["parameters"]["properties"]["number"]["type"] == "integer"


def test_typed_methods_from_a_json_schema():
    spec = ToolSpec("search", "Search the notes.", {"type": "object", "required": ["query"], "properties": {
        "query": {"type": "string", "description": "What to look for."},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags."},
        "order": {"enum": ["asc", "desc"], "type": "string", "description": "Sort order."}}})
    params = get_json_schema(tool_method(spec))["function"]["parameters"]
    assert params["required"] == ["query"]
    assert params["properties"]["limit"]["type"] == "integer"
    assert params["properties"]["tags"] == {"type": "array", "items": {"type": "string"}, "description": "Tags.",
                                            "nullable": True}
    assert params["properties"]["order"]["enum"] == ["asc", "desc"]
    with pytest.raises(ValueError, match="cannot be a method"):
        tool_method(ToolSpec("reset", "", {}))
    with pytest.raises(ValueError, match="not a Python identifier"):
        environment_class(EnvironmentInfo("x", "", (ToolSpec("t", "", {"properties": {"a-b": {}}}),), {}))


def test_refuses_a_config_without_sanitized_templates(client, tokenizer, tmp_path):
    spec = TitoEnvironmentSpec(client, "python")
    with pytest.raises(ValueError, match="sanitize_control_tokens"):
        GRPOTrainer(model=build_tiny_qwen3(), processing_class=tokenizer, args=grpo_config(tmp_path),
                    train_dataset=Dataset.from_list(ROWS), environment_factory=spec.environment_factory,
                    reward_funcs=spec.reward_funcs)


def test_why_async_grpo_trainer_cannot_take_the_spec(client):
    """AsyncGRPOTrainer (trl.experimental.async_grpo, TRL 1.16) is not supported (docs/trl.md), for
    two reasons this pins: its rollout worker runs environment_factory in a spawned process, so the
    factory must pickle, and the spec's holds a live gRPC client; and its reward functions get no
    `environments=`, so the episode's final answer never reaches tito, which scores it."""
    import inspect
    import pickle

    from trl.experimental.async_grpo.async_rollout_worker import _AsyncRolloutLoop

    spec = TitoEnvironmentSpec(client, "python")
    try:
        with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
            pickle.dumps(spec.environment_factory)
    finally:
        spec.close()
    assert "environments" not in inspect.getsource(_AsyncRolloutLoop._score_group)
