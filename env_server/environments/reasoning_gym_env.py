"""The built-in `reasoning_gym` environment: any reasoning-gym dataset (reasoning-gym 0.1.25, ~100 procedural
task generators with their own scorers) by name, config, split and seed, with the Python tool or none.

The pattern for a task environment of your own (docs/trainer.md, "Task environments"): the client makes the
problem and sends it as the user turn (`tito.reasoning_gym_tasks.Problem.messages()`); env_args say which
problem it is (`Problem.env_args()`), so the environment makes the same entry again and scores the final
answer with the dataset's own `score_answer`. The reference answer never travels through the model's side.

    env_args = {"dataset": "gsm_symbolic", "config": {}, "split": "test", "seed": 0, "index": 3,
                "tools": "python"}          # or "none": no tool in the prompt, every call refused

The reward: 0..1 from reasoning-gym's scorer on the reply's last `<answer>...</answer>` (or `\\boxed{}`); a
reply without one scores 0 (the record says why). `max_turns` caps the tool-calling turns.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from env_server.environments.base import StrictArgs, tool
from env_server.environments.python_env import RunPythonArgs, format_exec_result
from env_server.environments.sandboxed import SandboxedEnvironment, SandboxEnvArgs
from tito import reasoning_gym_tasks as rgt
from tito.types import ToolCall, ToolResult, ToolSpec

log = logging.getLogger(__name__)


class ReasoningGymEnvArgs(SandboxEnvArgs):
    dataset: str = Field(min_length=1, description="A reasoning-gym dataset name, e.g. gsm_symbolic, basic_arithmetic.")
    config: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the dataset's config.")
    split: Literal["train", "test"] = Field("train", description="train and test problems come from disjoint seeds.")
    seed: int = Field(0, ge=0, description="The split's seed.")
    index: int = Field(0, ge=0, lt=rgt.MAX_INDEX, description="Which problem of the split.")
    tools: Literal["python", "none"] = Field("python", description="python: the run_python tool; none: no tools.")
    max_turns: int | None = Field(None, ge=1, le=64, description="Tool-calling turns before the episode is scored.")

    @model_validator(mode="after")
    def _exists(self) -> ReasoningGymEnvArgs:
        # The dataset and config checked on problem 0 (a ValueError: the client's mistake). Not the problem itself:
        # a far index builds a large dataset (seconds), which must not happen on the server's event loop; the
        # scorer makes it in a thread at the end.
        rgt.entry(self.dataset, self.config, self.split, self.seed, 0)
        return self


class ReasoningGymEnvironment(SandboxedEnvironment):
    name = "reasoning_gym"
    description = ("A reasoning-gym problem (env_args: dataset, config, split, seed, index), scored by the "
                   "dataset's own scorer on the final <answer>...</answer>; with a stateful Python interpreter "
                   "(tools: python) or none.")
    EnvArgs = ReasoningGymEnvArgs

    @tool
    async def run_python(self, args: RunPythonArgs) -> ToolResult:
        """Run Python code and return its stdout, stderr, the value of the last expression and any traceback."""
        assert self.sandbox is not None, "the reasoning_gym environment always gets a sandbox"
        result = await self.sandbox.execute(args.code, timeout_s=self.env_args.timeout_s)
        return ToolResult(content=format_exec_result(result), truncated=result.truncated,
                          lost_reason=result.lost_reason)

    @classmethod
    def session_tool_specs(cls, env_args: BaseModel) -> list[ToolSpec]:
        return cls.tool_specs() if getattr(env_args, "tools", "python") == "python" else []

    async def call_tool(self, call: ToolCall) -> ToolResult:
        if self.env_args.tools == "none":
            return ToolResult.error(f"there are no tools in this session; {call.name!r} cannot run. Answer directly "
                                    "with the final answer inside <answer></answer> tags.")
        return await super().call_tool(call)

    def turn_limit(self) -> int | None:
        return self.env_args.max_turns

    async def end(self, final_text: str) -> ToolResult:
        a = self.env_args
        answer = rgt.extract_answer(final_text)
        if answer is None:
            return ToolResult(content="no <answer></answer> in the final reply", done=True, reward=0.0)
        try:
            reward = await asyncio.to_thread(rgt.score, a.dataset, a.config, a.split, a.seed, a.index, answer)
        except Exception as e:  # the scorer choked on what the model wrote: the model's answer is not a right one
            log.warning("reasoning-gym %s scorer raised on %r: %s", a.dataset, answer[:200], e)
            return ToolResult(content=f"answer {answer[:200]!r} could not be scored ({type(e).__name__})",
                              done=True, reward=0.0)
        return ToolResult(content=f"answer {answer[:200]!r} scored {reward:g}", done=True, reward=reward)
