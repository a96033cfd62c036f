"""An environment's turn limit: after its last tool-calling turn the step engine ends the episode through
`end("")`, so it is scored like one the model ended (the tool messages of that turn still come back)."""

from __future__ import annotations

from pydantic import BaseModel

from env_server.environments import Environment, ToolResult, tool
from env_server.testing import EpisodeRunner
from tito.types import StepStatus


class CountArgs(BaseModel):
    n: int


class LimitArgs(BaseModel):
    turns: int
    lost: bool = False


class Counter(Environment):
    name = "counter"
    EnvArgs = LimitArgs
    total = 0  # a class default: `+=` below gives each episode's instance its own

    @tool
    async def add(self, args: CountArgs) -> str:
        "Add n."
        self.total += args.n
        return str(self.total)

    def turn_limit(self) -> int | None:
        return self.env_args.turns

    async def end(self, final_text: str) -> ToolResult:
        if self.env_args.lost:
            return ToolResult(content="", done=True, lost_reason="the scorer is down")
        return ToolResult(content=f"ended with {final_text!r} at {self.total}", done=True, reward=self.total / 10)


async def test_the_last_allowed_turn_ends_and_scores_the_episode():
    async with EpisodeRunner(Counter, {"turns": 2}) as episode:
        first = await episode.step(("add", {"n": 3}))
        assert first.status is StepStatus.OK and not episode.done
        last = await episode.step(("add", {"n": 4}), ("add", {"n": 1}))  # parallel calls are one turn
        assert last.status is StepStatus.EPISODE_END and episode.done
        assert [m.content for m in last.tool_messages] == ["7", "8"]
        assert last.reward == 0.8 and last.detail == "ended with '' at 8"


async def test_an_environment_that_cannot_score_the_end_gives_error_not_a_reward():
    async with EpisodeRunner(Counter, {"turns": 1, "lost": True}) as episode:
        r = await episode.step(("add", {"n": 3}))
        assert r.status is StepStatus.ERROR and r.reward is None and "the scorer is down" in r.detail
