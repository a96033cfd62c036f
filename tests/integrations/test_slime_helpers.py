"""tito.integrations.slime's pure helpers: SGLang's /generate answer read into a turn, and a rollout's token
bookkeeping as slime's Sample fields. slime and SGLang themselves are not installable here: the generate function
is NOT tested end to end (docs/integrations.md says so); these tests use no stand-in for either."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tito.integrations.slime import context_budget, messages_of, parse_generate_output, sample_fields
from tito.rollout import turns
from tito.rollout.generation import FinishReason
from tito.rollout.state import Rollout
from tito.rollout.turns import TurnLimits
from tito.types import StepResult, StepStatus

LIMITS = TurnLimits(per_turn_cap=8, reserve=0, max_turns=4)


def _answer(ids, logprobs, finish="stop"):
    # The shape of SGLang's /generate answer with return_logprob: [logprob, token_id, text] per output token.
    return {"text": "", "meta_info": {"finish_reason": {"type": finish},
                                      "output_token_logprobs": [[lp, i, None] for i, lp in zip(ids, logprobs)]}}


def test_parse_generate_output_reads_ids_logprobs_and_finish():
    r = parse_generate_output(_answer([5, 6, 7], [-0.1, -0.2, -0.3]))
    assert (r.ids, r.logprobs, r.finish_reason, r.error) == ([5, 6, 7], [-0.1, -0.2, -0.3], FinishReason.STOP, "")
    assert parse_generate_output(_answer([5], [-1.0], "length")).finish_reason is FinishReason.LENGTH


@pytest.mark.parametrize("output, why", [
    (_answer([5], [-0.1], "abort"), "finish_reason"),
    ({"meta_info": {"finish_reason": {"type": "stop"}}}, "output_token_logprobs"),
    ({}, "finish_reason"),
])
def test_parse_generate_output_fails_what_cannot_be_trained_on(output, why):
    assert why in parse_generate_output(output).error


def test_a_missing_logprob_aborts_the_rollout():
    r = Rollout(budget=32)
    assert turns.start(r, [1, 2, 3])
    result = parse_generate_output(_answer([5, 6], [-0.1, None]))
    assert not turns.after_generation(r, result, 8)
    assert sample_fields(r)["status"] == "aborted" and sample_fields(r)["reward"] is None


def _step(status, suffix=(), reward=None):
    return StepResult(seq=1, status=status, suffix_ids=tuple(suffix), reward=reward)


def test_sample_fields_of_a_two_turn_episode():
    r = Rollout(budget=32)
    assert turns.start(r, [1, 2, 3])
    assert turns.after_generation(r, parse_generate_output(_answer([10, 11], [-0.5, -0.25])), 8)
    assert turns.after_step(r, _step(StepStatus.OK, [20, 21, 22]), LIMITS)
    assert turns.after_generation(r, parse_generate_output(_answer([12], [-0.125])), 8)
    assert not turns.after_step(r, _step(StepStatus.EPISODE_END, reward=1.0), LIMITS)
    f = sample_fields(r)
    assert f["tokens"] == [1, 2, 3, 10, 11, 20, 21, 22, 12]
    assert f["response_length"] == 6
    assert f["loss_mask"] == [1, 1, 0, 0, 0, 1]
    assert f["rollout_log_probs"] == [-0.5, -0.25, 0.0, 0.0, 0.0, -0.125]
    assert (f["status"], f["reward"]) == ("completed", 1.0)


def test_sample_fields_of_a_suffix_over_the_budget():
    r = Rollout(budget=8)
    assert turns.start(r, [1, 2, 3])
    assert turns.after_generation(r, parse_generate_output(_answer([10, 11], [-0.5, -0.25])), 5)
    assert not turns.after_step(r, _step(StepStatus.OK, [20, 21, 22, 23]), LIMITS)  # 4 > the 3 left
    f = sample_fields(r)
    assert f["tokens"] == [1, 2, 3, 10, 11] and f["loss_mask"] == [1, 1] and f["status"] == "truncated"
    assert f["reward"] is None  # slime's reward model scores it


def test_context_budget_and_messages():
    assert context_budget(SimpleNamespace(rollout_max_context_len=4096)) == 4096
    assert context_budget(SimpleNamespace(rollout_max_context_len=None, context_parallel_size=2,
                                          max_tokens_per_gpu=1024)) == 2048
    assert messages_of("hi") == [{"role": "user", "content": "hi"}]
    assert messages_of([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]
