"""The `reasoning_gym` environment: problems made the same on both sides, reasoning-gym's own scorer on the final
answer (right 1, wrong 0, malformed 0 with a reason), disjoint splits, the Python tool or none."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym", reason="reasoning-gym is in the server extra (pip install 'tito[server]')")

from env_server.environments.reasoning_gym_env import ReasoningGymEnvironment  # noqa: E402
from env_server.testing import EpisodeRunner  # noqa: E402
from tito.reasoning_gym_tasks import ReasoningGymTask, extract_answer  # noqa: E402
from tito.types import StepStatus  # noqa: E402

ARITH = ReasoningGymTask("basic_arithmetic", split="test", seed=3)


def test_reasoning_gym_answer_extraction():
    assert extract_answer("so <answer> 42 </answer>") == "42"
    assert extract_answer("<answer>1</answer> no, <answer>2</answer>") == "2"
    assert extract_answer("the result is \\boxed{-7}") == "-7"
    assert extract_answer("<think><answer>1</answer></think>I think 5") is None
    assert extract_answer("The answer is 42.") is None


def test_reasoning_gym_splits_are_disjoint_and_reproducible():
    train = {ReasoningGymTask("gsm_symbolic", split="train").problem(i).question for i in range(30)}
    test = {ReasoningGymTask("gsm_symbolic", split="test").problem(i).question for i in range(30)}
    assert len(train) > 25 and not train & test
    assert ReasoningGymTask("gsm_symbolic", split="test").problem(7) == ReasoningGymTask(
        "gsm_symbolic", split="test").problem(7)


def test_reasoning_gym_env_args_are_checked():
    with pytest.raises(ValueError, match="no_such_dataset"):
        ReasoningGymEnvironment.parse_env_args('{"dataset": "no_such_dataset"}')
    with pytest.raises(ValueError, match="split"):
        ReasoningGymEnvironment.parse_env_args('{"dataset": "basic_arithmetic", "split": "dev"}')
    none = ReasoningGymEnvironment.parse_env_args('{"dataset": "basic_arithmetic", "tools": "none"}')
    assert ReasoningGymEnvironment.session_tool_specs(none) == []
    python = ReasoningGymEnvironment.parse_env_args('{"dataset": "basic_arithmetic"}')
    assert [t.name for t in ReasoningGymEnvironment.session_tool_specs(python)] == ["run_python"]


@pytest.mark.docker
async def test_reasoning_gym_scores_right_wrong_and_malformed_answers(docker_ok):
    problem = ARITH.problem(0)
    async with EpisodeRunner(ReasoningGymEnvironment, problem.env_args()) as episode:
        # The tool computes the answer in the sandbox; the final reply states it.
        expression = problem.question.removeprefix("Calculate ").rstrip(".")
        r = await episode.step(("run_python", {"code": f"print({expression})"}))
        assert float(r.tool_messages[0].content) == float(problem.answer)
        end = await episode.end(f"It is <answer>{problem.answer}</answer>")
        assert end.status is StepStatus.EPISODE_END and end.reward == 1.0
    wrong = str(int(problem.answer) + 1)
    for reply, why in ((f"<answer>{wrong}</answer>", "scored 0"), ("The answer is " + problem.answer, "no <answer>"),
                       ("<answer>{[(</answer>", "scored 0")):
        async with EpisodeRunner(ReasoningGymEnvironment, problem.env_args()) as episode:
            end = await episode.end(reply)
            assert end.reward == 0.0, reply
            assert why in end.detail, (reply, end.detail)


@pytest.mark.docker
async def test_reasoning_gym_without_tools_refuses_calls(docker_ok):
    problem = ReasoningGymTask("basic_arithmetic", split="test", seed=3, tools="none").problem(1)
    assert "run_python" not in problem.user_turn()
    async with EpisodeRunner(ReasoningGymEnvironment, problem.env_args()) as episode:
        r = await episode.step(("run_python", {"code": "1"}))
        assert "no tools in this session" in r.tool_messages[0].content
        end = await episode.end(f"<answer>{problem.answer}</answer>")
        assert end.reward == 1.0


def test_reasoning_gym_train_task_draws_new_train_problems_each_step():
    from trainer.tasks import make_task

    task = make_task("reasoning_gym", {"dataset": "basic_arithmetic", "tools": "none"}, seed=5, vocab_size=2)
    first, second = task.sample(3, 1), task.sample(3, 2)
    indices = [s.env_args["index"] for s in first + second]
    assert len(set(indices)) == 6 and {s.env_args["split"] for s in first} == {"train"}
    assert first[0].messages[-1].content.startswith(ARITH_TRAIN.problem(indices[0]).question)
    with pytest.raises(ValueError, match="Dataset 'nope' not registered"):
        make_task("reasoning_gym", {"dataset": "nope"}, seed=0, vocab_size=2)


ARITH_TRAIN = ReasoningGymTask("basic_arithmetic", split="train", seed=5, tools="none")


def test_reasoning_gym_worked_example_goes_before_the_problem_and_is_checked(tmp_path):
    from tito.reasoning_gym_tasks import load_example

    example = load_example("examples/real_model/worked_example.json")
    messages = ARITH_TRAIN.problem(0).messages("be brief", example)
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert messages[2]["tool_calls"][0]["function"]["name"] == "run_python"
    assert load_example(None) == [] and ARITH_TRAIN.problem(0).messages()[-1]["role"] == "user"
    bad = tmp_path / "bad.json"
    for text, said in [("{", "cannot read the worked example"), ("[]", "non-empty list"),
                       ('[{"role": "system", "content": "x"}]', "role user, assistant or tool"),
                       ('[{"role": "user", "content": "x"}]', "ends with the assistant's final reply")]:
        bad.write_text(text)
        with pytest.raises(ValueError, match=said):
            load_example(bad)
