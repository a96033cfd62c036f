"""`env_server.testing`: an environment's episode in-process, through the server's own step engine.

The example custom environment is tested this way (a few lines, no server); a sandboxed built-in
one gets a real hardened container that is gone afterwards."""

from __future__ import annotations

import sys

import docker
import pytest

from env_server.testing import TESTING_SERVER_NAME, EpisodeRunner, run_episode
from tests.harness import REPO
from tito.types import StepStatus, ToolCall

sys.path.insert(0, str(REPO / "examples" / "custom_env"))
from guess_number import GuessNumberEnvironment  # noqa: E402


def test_guess_number_example_in_a_few_lines():
    results = run_episode(GuessNumberEnvironment, {"secret": 37}, [("guess", {"number": 50}), ("guess", {"number": 37})])
    assert [r.tool_messages[0].content for r in results] == ["lower", "correct"]
    assert results[-1].status is StepStatus.EPISODE_END and results[-1].reward == 0.5


async def test_mistakes_become_tool_messages_and_the_end_scores_the_episode():
    async with EpisodeRunner(GuessNumberEnvironment, {"secret": 7, "high": 10}) as episode:
        r = await episode.step(("guess", {"number": 11}), ("guess", '{"number": "x"}'), ("peek", {}),
                               ToolCall("mine", "guess", "{not json"))
        assert r.status is StepStatus.OK and r.seq == 1
        assert [m.tool_call_id for m in r.tool_messages] == ["call_1_0", "call_1_1", "call_1_2", "mine"]
        msgs = [m.content for m in r.tool_messages]
        assert "outside the range 1..10" in msgs[0] and "number" in msgs[1]
        assert "unknown tool 'peek'" in msgs[2] and "not valid JSON" in msgs[3]
        end = await episode.end("no idea")
        assert (end.status, end.reward, end.detail, episode.done) == (StepStatus.EPISODE_END, 0.0, "gave up", True)


def test_env_args_are_validated_as_open_session_does():
    with pytest.raises(ValueError, match="env_args for environment 'guess_number' are invalid: secret"):
        EpisodeRunner(GuessNumberEnvironment, {})


@pytest.mark.docker
async def test_a_sandboxed_environment_gets_a_real_sandbox_that_is_removed_afterwards(docker_ok):
    from env_server.environments.python_env import PythonEnvironment

    client = docker.from_env()
    async with EpisodeRunner(PythonEnvironment, {"files": {"data.txt": "6 7"}, "expected_answer": "42"}) as episode:
        r = await episode.step(("run_python", {"code": "a, b = map(int, open('data.txt').read().split())\na * b"}))
        assert r.tool_messages[0].content == "Out: 42"
        assert client.containers.list(filters={"label": f"tito.server={TESTING_SERVER_NAME}"})
        end = await episode.end("The answer is 42.")
        assert end.reward == 1.0
    assert not client.containers.list(all=True, filters={"label": f"tito.server={TESTING_SERVER_NAME}"})
