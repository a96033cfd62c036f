"""tito served as an OpenEnv environment (`openenv` 0.10: `pip install 'tito[openenv]'`).

    python -m tito.integrations.openenv --tito 127.0.0.1:50051 --tokenizer ./my-tokenizer --port 8000

OpenEnv's own `create_fastapi_app` serves `TitoOpenEnv` under uvicorn; any OpenEnv client (its
`GenericEnvClient`, TRL's OpenEnv harness, NeMo Gym, verifiers) drives it over WebSocket:

- `reset(environment=, messages=, env_args=, fingerprint=)` opens a tito session (each key defaults to the
  server's command line) and answers `prompt_ids` (the conversation rendered by the tito server with the tools
  and the generation prompt) and `tools` (OpenAI-style function specs).
- `step({"completion_ids": [...]})` sends the generated ids (stop token included), or
  `step({"tool_calls": [{"name", "arguments"}], "assistant_content": ...})` calls the trainer parsed itself;
  the answer carries `suffix_ids` (append them verbatim, masked out of the loss), `tool_messages`, `status`,
  `truncated`, `done` and the environment's `reward`.

Each WebSocket session is one `TitoOpenEnv` holding its own tito session (SUPPORTS_CONCURRENT_SESSIONS); a
`close` message or a dropped connection closes it. All sessions of a process share one gRPC channel.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from tito.extras import require

require("openenv.core.env_server.interfaces", "openenv", "tito.integrations.openenv")

from openenv.core.env_server.interfaces import Environment  # noqa: E402  (after the check above)
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402
from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt  # noqa: E402

from tito.client import AsyncSession, AsyncTitoClient  # noqa: E402
from tito.types import StepResult, ToolCall  # noqa: E402

RESET_KEYS = frozenset({"environment", "messages", "env_args", "fingerprint"})
CLOSE_TIMEOUT_S = 30.0


class ToolCallIn(BaseModel):
    """A tool call the trainer parsed itself (the Hermes/OpenAI shape: name and JSON arguments)."""

    model_config = ConfigDict(extra="forbid")
    id: str = ""
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"  # the JSON text the model wrote, or that object


class TitoAction(Action):
    """One assistant turn: the ids the policy generated, or the tool calls the trainer parsed from them."""

    completion_ids: list[NonNegativeInt] = Field(default_factory=list)
    tool_calls: list[ToolCallIn] = Field(default_factory=list)
    assistant_content: str = ""  # with tool_calls: the turn's text; without either: the final answer
    max_suffix_tokens: NonNegativeInt | None = None  # what is left of the rollout's budget (None: no limit)
    # "Not both completion_ids and tool_calls" is checked in step_async, not by a validator here: OpenEnv 0.10
    # cannot serialize a validator's ValueError into its error frame and drops the whole WebSocket session.


class TitoObservation(Observation):
    """reset: session_id, prompt_ids, tools. step: suffix_ids, tool_messages, tool_calls, status, truncated,
    detail (why, for a status other than OK), with OpenEnv's own done and reward."""

    session_id: str = ""
    prompt_ids: list[int] = Field(default_factory=list)
    tools: list[dict[str, Any]] = Field(default_factory=list)
    suffix_ids: list[int] = Field(default_factory=list)
    tool_messages: list[dict[str, Any]] = Field(default_factory=list)
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    status: str = ""
    truncated: bool = False
    detail: str = ""


class TitoState(State):
    session_id: str | None = None
    environment: str = ""
    fingerprint: str = ""
    done: bool = False
    status: str = ""


# One client (one gRPC channel) per tito address and event loop: grpc.aio channels belong to the loop that
# uses them, and OpenEnv runs every session's reset_async/step_async on its server's loop.
_clients: dict[tuple[int, str], AsyncTitoClient] = {}
_clients_lock = threading.Lock()


def _client_for(address: str) -> AsyncTitoClient:
    key = (id(asyncio.get_running_loop()), address)
    with _clients_lock:
        if key not in _clients:
            _clients[key] = AsyncTitoClient(address)
        return _clients[key]


class TitoOpenEnv(Environment[TitoAction, TitoObservation, TitoState]):
    """One OpenEnv session = one tito session. The constructor's arguments are the defaults of `reset`;
    it does no I/O (OpenEnv builds throwaway instances to read the class's properties)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, address: str, environment: str = "python", *, fingerprint: str = "",
                 env_args: Mapping[str, Any] | None = None, messages: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__()
        self.address = address
        self.defaults = {"environment": environment, "fingerprint": fingerprint, "env_args": dict(env_args or {}),
                         "messages": [dict(m) for m in messages]}
        self._session: AsyncSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._state = TitoState()

    # OpenEnv's server calls the async forms; the sync ones exist because the base class requires them.
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TitoObservation:
        raise NotImplementedError("TitoOpenEnv is asynchronous: call reset_async (OpenEnv's server does)")

    def step(self, action: TitoAction, timeout_s: float | None = None, **kwargs: Any) -> TitoObservation:
        raise NotImplementedError("TitoOpenEnv is asynchronous: call step_async (OpenEnv's server does)")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          **kwargs: Any) -> TitoObservation:
        """Close the episode this instance holds, if any, and open a new tito session."""
        unknown = sorted(set(kwargs) - RESET_KEYS)
        if unknown:
            raise ValueError(f"reset got unknown keys {unknown}: it takes {sorted(RESET_KEYS)} "
                             "(and OpenEnv's seed, episode_id)")
        args = {**self.defaults, **{k: v for k, v in kwargs.items() if v is not None}}
        if not isinstance(args["env_args"], Mapping):
            raise ValueError(f"env_args must be a JSON object, got {type(args['env_args']).__name__}")
        await self._close_session()
        self._loop = asyncio.get_running_loop()
        session = await _client_for(self.address).open_session(
            args["environment"], args["messages"], fingerprint=args["fingerprint"], env_args=args["env_args"])
        self._session = session
        self._state = TitoState(episode_id=episode_id or session.id, session_id=session.id,
                                environment=args["environment"], fingerprint=args["fingerprint"])
        return TitoObservation(session_id=session.id, prompt_ids=list(session.prompt_ids),
                               tools=[t.openai_spec() for t in session.tools])

    async def step_async(self, action: TitoAction, timeout_s: float | None = None,
                         **kwargs: Any) -> TitoObservation:
        """One Step of the open session; the session is closed once the episode is over."""
        if self._session is None:
            if self._state.done:
                raise RuntimeError(f"the episode is over (status {self._state.status}): reset to start another")
            raise RuntimeError("no episode is open: reset first")
        if action.completion_ids and action.tool_calls:
            raise ValueError("send completion_ids (the generated ids, stop token included) or tool_calls "
                             "(parsed by the trainer), not both")
        calls = tuple(ToolCall(c.id or f"call_{i}", c.name,
                               c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments))
                      for i, c in enumerate(action.tool_calls))
        result: StepResult = await self._session.step(
            action.completion_ids, tool_calls=calls, assistant_content=action.assistant_content,
            max_suffix_tokens=action.max_suffix_tokens)
        self._state.step_count += 1
        self._state.status = result.status.name
        if result.done:
            self._state.done = True
            await self._close_session()
        return TitoObservation(
            session_id=self._state.session_id or "", suffix_ids=list(result.suffix_ids),
            tool_messages=[m.to_dict() for m in result.tool_messages],
            tool_calls=[{"id": c.id, "name": c.name, "arguments": c.arguments, **({"error": c.error} if c.error else {})}
                        for c in result.tool_calls],
            status=result.status.name, truncated=result.truncated, detail=result.detail,
            done=result.done, reward=result.reward)

    @property
    def state(self) -> TitoState:
        return self._state

    async def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    def close(self) -> None:
        """Close the tito session. OpenEnv calls this from a worker thread when the WebSocket closes or drops."""
        loop = self._loop
        if self._session is None or loop is None or loop.is_closed():
            return  # never opened, already closed, or the loop is gone (the server's idle lease reclaims it)
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.create_task(self._close_session())
        else:
            asyncio.run_coroutine_threadsafe(self._close_session(), loop).result(CLOSE_TIMEOUT_S)


def create_app(address: str, environment: str = "python", *, fingerprint: str = "",
               env_args: Mapping[str, Any] | None = None, max_sessions: int = 64) -> Any:
    """OpenEnv's FastAPI app serving `TitoOpenEnv` sessions against the tito server at `address`."""
    from openenv.core.env_server.http_server import create_fastapi_app

    factory = functools.partial(TitoOpenEnv, address, environment, fingerprint=fingerprint, env_args=env_args)
    return create_fastapi_app(factory, TitoAction, TitoObservation, max_concurrent_envs=max_sessions,
                              env_name="tito", state_cls=TitoState)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m tito.integrations.openenv",
                                description="Serve a tito server's environments as an OpenEnv environment.")
    p.add_argument("--tito", required=True, help="the tito server's address (host:port)")
    p.add_argument("--environment", default="python", help="the default environment of reset")
    p.add_argument("--tokenizer", help="a folder with tokenizer.json, tokenizer_config.json and the chat template: "
                                       "registered at start; its fingerprint is the default of reset")
    p.add_argument("--fingerprint", default="", help="a fingerprint the server already holds (instead of --tokenizer)")
    p.add_argument("--env-args", default="{}", help="the default env_args of reset (a JSON object)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=64, help="concurrent WebSocket sessions")
    args = p.parse_args(argv)
    try:
        env_args = json.loads(args.env_args)
    except json.JSONDecodeError as e:
        p.error(f"--env-args is not JSON: {e}")
    if not isinstance(env_args, dict):
        p.error("--env-args must be a JSON object")
    fingerprint = args.fingerprint
    if args.tokenizer:
        if fingerprint:
            p.error("give --tokenizer or --fingerprint, not both")
        from tito.client import TitoClient

        with TitoClient(args.tito) as client:
            client.wait_ready(120)
            fingerprint = client.register_tokenizer(args.tokenizer).fingerprint
    import uvicorn

    app = create_app(args.tito, args.environment, fingerprint=fingerprint, env_args=env_args,
                     max_sessions=args.max_sessions)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
