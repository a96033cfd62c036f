"""TitoRollout under an unchanged GRPOTrainer, against a real env server with real sandboxes.

A random model never writes a tool call, so the trainer samples with the example's steering
(`sequence_bias` in GRPOConfig.generation_kwargs): its own `model.generate` writes a scripted
run_python call and then the answer. Every id, mask and status is compared with what the server
answered, as recorded by the client.
"""

from __future__ import annotations

import pytest
from datasets import Dataset

from tests.trl.helpers import CapturingGRPOTrainer, Row, assert_logprobs, assert_token_exact, grpo_config
from tito.client import TitoError
from tito.trl import TitoRollout
from trainer.model import build_tiny_qwen3

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def row(question: str, answer: str, code: str) -> dict:
    return {"prompt": [{"role": "user", "content": question}], "answer": answer, "code": code}


STEERED = row("What is 12 * 34?", "408", "print(12 * 34)")
UNSTEERED = row("What is 56 * 78?", "4368", "print(56 * 78)")
# Steered too, for direct calls: a tool call that kills the sandbox, and one with a big output.
CRASH = row("What is 0 * 1?", "0", "import os; os._exit(3)")
FLOOD = row("What is 9 * 9?", "81", "print('x' * 4000)")


def env_args(r):
    return {"expected_answer": r["answer"]}


@pytest.fixture(scope="module")
def trained(client, tokenizer, example, tmp_path_factory):
    """One GRPO step (2 prompts x 2 generations): one prompt steered through a tool call, one not."""
    tito = TitoRollout(client, tokenizer, "python", max_turns=3, max_tokens_per_turn=48)
    bias = example.steering_bias(tokenizer, [STEERED, CRASH, FLOOD])
    trainer = CapturingGRPOTrainer(
        model=build_tiny_qwen3(seed=0), processing_class=tokenizer,
        args=grpo_config(tmp_path_factory.mktemp("grpo"), generation_kwargs={"sequence_bias": bias}),
        train_dataset=tito.attach(Dataset.from_list([STEERED, UNSTEERED]), env_args=env_args),
        rollout_func=tito.rollout_func, reward_funcs=tito.reward_func)
    trainer.train()
    return trainer


def test_the_loss_gets_tito_ids_token_for_token(trained, client):
    rows = trained.captured
    assert len(rows) == 4
    for r in rows:
        assert_token_exact(client, r)
    by_status = sorted((r.extras["tito_status"], r.extras["tito_reward"], r.extras["tito_tool_calls"]) for r in rows)
    assert by_status == [("completed", 1.0, 1)] * 2 + [("truncated:length", None, 0)] * 2
    # Not vacuous: the completed rows carry tito's suffix ids, masked out.
    assert all(0 in r.env_mask for r in rows if r.extras["tito_status"] == "completed")
    logged = [h for h in trained.state.log_history if "reward" in h]
    assert logged[0]["reward"] == pytest.approx(0.5) and logged[0]["tito/tool_calls_per_rollout"] == 0.5
    assert logged[0]["tito/env_seconds"] > 0


def test_every_session_is_closed(trained, client):
    sessions = [r.extras["tito_session_id"] for r in trained.captured]
    assert set(sessions) <= set(client.aio.closed)
    # The server agrees: none of them is open any more.
    assert not any(client.close_session(s) for s in sessions)


def _call(tito: TitoRollout, trainer, rows: list[dict]) -> tuple[dict, list[Row]]:
    prompts = [r["prompt"] for r in tito.attach(rows, env_args=env_args)]
    out = tito.rollout_func(prompts, trainer)
    assert all(len(v) == len(rows) for v in out.values())
    return out, [Row(out["prompt_ids"][i], out["completion_ids"][i], out["env_mask"][i],
                     {k: v[i] for k, v in out.items() if k.startswith("tito_")}) for i in range(len(rows))]


@pytest.mark.parametrize(("rows", "limits", "expected"), [
    ([STEERED], {"max_turns": 1}, ["truncated:max_turns"]),  # the tool ran; its suffix is not appended
    ([STEERED], {"max_completion_tokens": 30}, ["truncated:tool_overflow"]),  # not even a cut suffix fits
    ([FLOOD], {"max_completion_tokens": 120}, ["truncated:length"]),  # output cut head/tail to fit
    ([CRASH, STEERED], {}, ["aborted", "completed"]),  # the sandbox died
], ids=["max_turns", "tool_overflow", "output_cut", "aborted"])
def test_statuses_token_for_token(trained, client, tokenizer, rows, limits, expected):
    kw = {"max_turns": 3, "max_tokens_per_turn": 48, **limits}
    tito = TitoRollout(client, tokenizer, "python", **kw)
    out, got = _call(tito, trained, rows)
    assert [r.extras["tito_status"] for r in got] == expected
    for i, r in enumerate(got):
        assert_token_exact(client, r)
        assert_logprobs(out, i)
        assert len(r.completion_ids) <= kw.get("max_completion_tokens", trained.max_completion_length)
    extras = {k: v for k, v in out.items() if k.startswith("tito_")}
    rewards = tito.reward_func(completions=[None] * len(rows), **extras)
    assert rewards == [{"completed": 1.0, "aborted": None}.get(s, 0.0) for s in expected]
    if rows == [FLOOD]:
        assert out["tito_tool_output_cut"] == [True]
        assert 0 in out["env_mask"][0]  # the cut output was appended
    if "aborted" in expected:
        assert out["tito_step_status"][0] == "SANDBOX_LOST" and out["tito_detail"][0]


def test_refuses_tools_and_another_tokenizer(client, tokenizer, tmp_path):
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    tito = TitoRollout(client, tokenizer, "python")
    data = tito.attach(Dataset.from_list([STEERED, UNSTEERED]), env_args=env_args)
    prompts = [data[0]["prompt"]] * 2

    def calculator(expression: str) -> str:
        """Evaluates an arithmetic expression.

        Args:
            expression: The expression.
        """
        return expression

    with_tools = GRPOTrainer(model=build_tiny_qwen3(), processing_class=tokenizer, args=grpo_config(tmp_path),
                             train_dataset=data, rollout_func=tito.rollout_func, reward_funcs=tito.reward_func,
                             tools=[calculator])
    with pytest.raises(ValueError, match="WITHOUT tools= or environment_factory="):
        tito.rollout_func(prompts, with_tools)

    other = AutoTokenizer.from_pretrained(build_tokenizer_dir(template="qwen3"), padding_side="left")
    other_trainer = GRPOTrainer(model=build_tiny_qwen3(), processing_class=other, args=grpo_config(tmp_path),
                                train_dataset=data, rollout_func=tito.rollout_func, reward_funcs=tito.reward_func)
    with pytest.raises(ValueError, match="not the tokenizer TitoRollout registered"):
        tito.rollout_func(prompts, other_trainer)

    # AsyncTitoClient.environment raises a plain TitoError (code NOT_FOUND), not NotFoundError.
    with pytest.raises(TitoError, match="python") as e:
        TitoRollout(client, tokenizer, "no-such-environment")
    assert e.value.code.name == "NOT_FOUND"
    with pytest.raises(ValueError, match="extras of TitoRollout.rollout_func"):
        tito.reward_func(completions=[])
