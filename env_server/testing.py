"""Run an environment's episode in-process — from a test or a notebook, with no server and no gRPC.

    from env_server.testing import EpisodeRunner

    async with EpisodeRunner(GuessNumberEnvironment, {"secret": 37}) as episode:
        result = await episode.step(("guess", {"number": 50}))   # a StepResult, as a Step would answer
        assert result.tool_messages[0].content == "lower"
        result = await episode.end("I give up")                  # the model answers without a tool call
        assert result.status is StepStatus.EPISODE_END and result.reward == 0.0

A step runs through the server's own step engine (`env_server.episode.Episode`: the seq, the tool
calls in order, malformed calls answered with a message, the statuses), so what passes here
passes through a server; only parsing and rendering (tokenizer work) are left out. Sandboxed
environments get a real sandbox: a container from their image, hardened as the server starts it
(a running dockerd and the image are needed), removed when the block ends. `sandbox_config`
changes its settings (timeouts, limits). In a script, `run_episode(...)` does all of it in one call.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Union

from env_server.environments.base import Environment
from env_server.episode import Episode
from env_server.metrics import ServerMetrics
from env_server.sandbox.config import PoolConfig, SandboxConfig
from env_server.sandbox.pool import SandboxPool
from tito.types import StepRequest, StepResult, ToolCall

# A call as a test writes it: a ToolCall, or (tool name, arguments as a dict or as JSON text).
Call = Union[ToolCall, tuple[str, Union[Mapping[str, Any], str]]]

TESTING_SERVER_NAME = "tito-testing"


class EpisodeRunner:
    """One episode of `environment` with `env_args` (validated as OpenSession validates them)."""

    def __init__(self, environment: type[Environment], env_args: Mapping[str, Any] | None = None, *,
                 sandbox_config: SandboxConfig | None = None) -> None:
        self.environment_class = environment
        self.env_args = environment.parse_env_args(json.dumps(dict(env_args or {})))
        config = sandbox_config or SandboxConfig()
        image = environment.session_image(self.env_args) or environment.sandbox_image
        if image and (sandbox_config is None or environment.session_image(self.env_args)):
            config = config.model_copy(update={"image": image})
        self.sandbox_config = config
        self.env: Environment | None = None
        self._pool: SandboxPool | None = None
        self._episode: Episode | None = None
        self._seq = 0

    async def __aenter__(self) -> EpisodeRunner:
        sandbox = None
        try:
            if self.environment_class.needs_sandbox:
                self._pool = SandboxPool(self.sandbox_config, PoolConfig(target_size=0, learn_demand=False),
                                         server_name=TESTING_SERVER_NAME, instance_id=uuid.uuid4().hex[:12])
                await self._pool.start()
                if not self._pool.ready:
                    raise RuntimeError(f"environment {self.environment_class.name!r} needs a sandbox, which cannot "
                                       f"start here: {self._pool.status_detail}")
                sandbox = await self._pool.acquire()
            self.env = self.environment_class(self.env_args, sandbox)
            if self._pool is not None:
                self.env.sandbox_factory = self._pool.acquire  # (the pool removes them all at the end)
            await self.env.setup()
        except BaseException:
            await self._close()
            raise
        session_id = sandbox.session_id if sandbox is not None else uuid.uuid4().hex
        self._episode = Episode(session_id, self.env, renderer=None, metrics=ServerMetrics())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._close()

    async def _close(self) -> None:
        if self.env is not None:
            await self.env.close()
        if self._pool is not None:
            await self._pool.close()  # removes the sandbox container

    @property
    def done(self) -> bool:
        return self._episode is not None and self._episode.done

    async def step(self, *calls: Call) -> StepResult:
        """One assistant turn calling these tools, in order (as parallel calls of one turn)."""
        return await self._step(StepRequest(session_id="", seq=self._seq + 1,
                                            tool_calls=tuple(_tool_call(c) for c in calls)))

    async def end(self, final_text: str = "") -> StepResult:
        """The model answers `final_text` without calling a tool: the environment ends the episode."""
        return await self._step(StepRequest(session_id="", seq=self._seq + 1, assistant_content=final_text))

    async def _step(self, request: StepRequest) -> StepResult:
        if self._episode is None:
            raise RuntimeError("use the EpisodeRunner in `async with` before stepping it")
        result = await self._episode.step(request)
        self._seq = request.seq
        return result


def run_episode(environment: type[Environment], env_args: Mapping[str, Any] | None,
                turns: Iterable[Call | list[Call]], final_text: str | None = None, *,
                sandbox_config: SandboxConfig | None = None) -> list[StepResult]:
    """A whole episode in one call, from synchronous code: each turn (one call, or a list of calls)
    is a Step; `final_text` then ends the episode. Stops early when a step ends it. In a notebook
    (a running event loop) use `EpisodeRunner` with `await` instead."""
    async def go() -> list[StepResult]:
        results: list[StepResult] = []
        async with EpisodeRunner(environment, env_args, sandbox_config=sandbox_config) as episode:
            for turn in turns:
                results.append(await episode.step(*(turn if isinstance(turn, list) else [turn])))
                if results[-1].done:
                    return results
            if final_text is not None:
                results.append(await episode.end(final_text))
        return results

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(go())
    raise RuntimeError("run_episode runs its own event loop: in async code (or a notebook) use "
                       "`async with EpisodeRunner(...) as episode: await episode.step(...)`")


def _tool_call(call: Call) -> ToolCall:
    """An id left empty gets the step's own (`call_<seq>_<index>`), as the server assigns it."""
    if isinstance(call, ToolCall):
        return call
    name, arguments = call
    return ToolCall(id="", name=name, arguments=arguments if isinstance(arguments, str) else json.dumps(arguments))
