"""The tito.v1.Environment servicer: turns RPCs into calls on sessions, environments and the renderer.

Every mistake a client or a model can make ends here as a clear gRPC status (client mistakes)
or a tool message (model mistakes); nothing raised below escapes as a crash.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections import OrderedDict
from typing import Any, Awaitable, Callable

import grpc

from env_server.config import ServerConfig
from env_server.environments.base import Environment, ToolOutput
from env_server.metrics import ServerMetrics
from env_server.rendering import (
    InvalidTokenizerFilesError,
    ParsedToolCall,
    RenderingContext,
    TokenizerRegistry,
    UnsupportedTemplateError,
)
from env_server.sandbox.docker_sandbox import new_session_id
from env_server.sandbox.pool import SandboxPool
from env_server.sessions import InFlightStep, Session, SessionNotFound, SessionRegistry
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_ROLES = {"system", "user", "assistant", "tool"}
_OFFLOAD_RENDER_CHARS = 32 * 1024


class RpcError(Exception):
    """A client mistake: becomes a gRPC status with a message that says what to do."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _rpc(kind: str) -> Callable:
    """Map RpcError to its status and anything unexpected to INTERNAL, counting both."""

    def wrap(fn: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(fn)
        async def handler(self: "EnvironmentService", request: Any, context: grpc.aio.ServicerContext) -> Any:
            try:
                return await fn(self, request, context)
            except RpcError as e:
                self.metrics.errors.labels(f"{kind}:{e.code.name.lower()}").inc()
                await context.abort(e.code, e.message)
            except SessionNotFound as e:
                self.metrics.errors.labels(f"{kind}:not_found").inc()
                await context.abort(grpc.StatusCode.NOT_FOUND, str(e))
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if isinstance(e, grpc.aio.AbortError):
                    raise
                self.metrics.errors.labels(f"{kind}:internal").inc()
                log.exception("%s failed", kind)
                await context.abort(grpc.StatusCode.INTERNAL, f"{kind} failed on the server: {type(e).__name__}: {e}")

        return handler

    return wrap


class EnvironmentService(pb_grpc.EnvironmentServicer):
    def __init__(
        self,
        config: ServerConfig,
        environments: dict[str, type[Environment]],
        pool: SandboxPool,
        tokenizers: TokenizerRegistry,
        sessions: SessionRegistry,
        metrics: ServerMetrics,
    ) -> None:
        self.config = config
        self.environments = environments
        self.pool = pool
        self.tokenizers = tokenizers
        self.sessions = sessions
        self.metrics = metrics
        self._env_specs = {name: _environment_spec(cls) for name, cls in environments.items()}
        # OpenSession retries with the same client_request_id get the first opening's answer.
        self._openings: OrderedDict[str, asyncio.Task] = OrderedDict()

    # ------------------------------------------------------------ ListEnvironments

    @_rpc("list_environments")
    async def ListEnvironments(self, request: pb.ListEnvironmentsRequest, context: Any) -> pb.ListEnvironmentsResponse:
        return pb.ListEnvironmentsResponse(environments=list(self._env_specs.values()))

    # ------------------------------------------------------------ RegisterTokenizer

    @_rpc("register_tokenizer")
    async def RegisterTokenizer(
        self, request: pb.RegisterTokenizerRequest, context: Any
    ) -> pb.RegisterTokenizerResponse:
        kwargs = _json_object(request.chat_template_kwargs_json, "chat_template_kwargs_json")
        try:
            # Loading and the golden check take a while: keep them off the event loop.
            ctx = await asyncio.to_thread(self.tokenizers.register, dict(request.files), kwargs)
        except InvalidTokenizerFilesError as e:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
        except UnsupportedTemplateError as e:
            raise RpcError(grpc.StatusCode.FAILED_PRECONDITION, str(e)) from e
        return pb.RegisterTokenizerResponse(
            fingerprint=ctx.fingerprint,
            template_family=ctx.family,
            stop_token_ids=list(ctx.stop_token_ids),
            renderer_version=ctx.renderer_version,
        )

    # ------------------------------------------------------------ OpenSession

    @_rpc("open_session")
    async def OpenSession(self, request: pb.OpenSessionRequest, context: Any) -> pb.OpenSessionResponse:
        rid = request.client_request_id
        if not rid:
            return await self._open_session(request)
        # Retries with the same client_request_id share one opening, even while it is still running;
        # shielded, so a client that gives up mid-open finds its session on the retry.
        task = self._openings.get(rid)
        if task is None:
            task = asyncio.create_task(self._open_session(request))
            task.add_done_callback(lambda t, rid=rid: self._forget_failed_opening(rid, t))
            self._openings[rid] = task
            while len(self._openings) > 4096:
                self._openings.popitem(last=False)
        return await asyncio.shield(task)

    def _forget_failed_opening(self, rid: str, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is not None:
            self._openings.pop(rid, None)  # a failed opening may be retried afresh

    async def _open_session(self, request: pb.OpenSessionRequest) -> pb.OpenSessionResponse:
        started = time.perf_counter()
        env_cls = self.environments.get(request.environment)
        if env_cls is None:
            known = ", ".join(sorted(self.environments)) or "none"
            raise RpcError(
                grpc.StatusCode.NOT_FOUND,
                f"unknown environment {request.environment!r}; this server offers: {known}",
            )
        renderer = self._renderer(request.tokenizer_fingerprint)
        try:
            env_args = env_cls.parse_env_args(request.env_args)
        except ValueError as e:
            raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, str(e)) from e
        messages = [_message_to_dict(m, i) for i, m in enumerate(request.messages)]
        tools = [spec.openai_spec() for spec in env_cls.tool_specs()]
        prompt_ids: list[int] = []
        if renderer is not None:
            try:
                prompt_ids = renderer.render_prompt(messages, tools)
            except Exception as e:
                raise RpcError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the chat template could not render the opening messages: {type(e).__name__}: {e}",
                ) from e
        if env_cls.needs_sandbox and not self.pool.ready:
            raise RpcError(grpc.StatusCode.UNAVAILABLE, f"the sandbox pool is not ready: {self.pool.status_detail}")

        # The slot is taken before the first await, so concurrent opens cannot overshoot max_sessions.
        with self.sessions.reserve_slot() as reserved:
            if not reserved:
                raise RpcError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the server holds its maximum of {self.sessions.max_sessions} sessions; "
                    "close some or retry later",
                )
            sandbox = None
            if env_cls.needs_sandbox:
                try:
                    sandbox = await self.pool.acquire()
                except Exception as e:
                    raise RpcError(grpc.StatusCode.UNAVAILABLE, f"could not start a sandbox: {e}") from e
            try:
                env = env_cls(env_args, sandbox)
                await env.setup()
            except BaseException as e:
                # Never leave an acquired sandbox behind, not even when the call is cancelled.
                if sandbox is not None:
                    await asyncio.shield(sandbox.destroy())
                if isinstance(e, Exception):
                    raise RpcError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        f"environment {env_cls.name!r} failed to set up: {type(e).__name__}: {e}",
                    ) from e
                raise
            session = Session(
                id=sandbox.session_id if sandbox is not None else new_session_id(),
                env_name=env_cls.name,
                env=env,
                renderer=renderer,
                idle_ttl_s=self.config.idle_ttl_s,
                hard_ttl_s=self.config.hard_ttl_s,
            )
            self.sessions.add(session)
        self.metrics.sessions_opened.labels(env_cls.name).inc()
        self.metrics.sessions_active.set(len(self.sessions))
        self.metrics.open_latency.observe(time.perf_counter() - started)
        return pb.OpenSessionResponse(
            session_id=session.id,
            prompt_ids=prompt_ids,
            tools=self._env_specs[env_cls.name].tools,
            idle_ttl_s=self.config.idle_ttl_s,
            hard_ttl_s=self.config.hard_ttl_s,
        )

    # ------------------------------------------------------------ Step

    @_rpc("step")
    async def Step(self, request: pb.StepRequest, context: Any) -> pb.StepResponse:
        started = time.perf_counter()
        session = self.sessions.get(request.session_id)
        session.touch()
        if request.tokenizer_fingerprint and (
            session.renderer is None or request.tokenizer_fingerprint != session.renderer.fingerprint
        ):
            have = session.renderer.fingerprint if session.renderer else "none"
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"tokenizer fingerprint mismatch: the request says {request.tokenizer_fingerprint!r} but session "
                f"{session.id!r} was opened with {have!r}; open the session with the tokenizer you generate with",
            )
        if request.seq == session.last_seq and session.last_response is not None:
            return session.last_response  # a retry: same answer, nothing runs twice
        inflight = session.inflight
        if inflight is not None and inflight.seq == request.seq:
            task = inflight.task  # a retry while the first attempt still runs: share its answer
        elif inflight is not None:
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"step {inflight.seq} of session {session.id!r} is still running; wait for its answer "
                f"(retrying seq {inflight.seq} returns it) before sending seq {request.seq}",
            )
        elif request.seq != session.last_seq + 1:
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"out-of-order step: session {session.id!r} expects seq {session.last_seq + 1} "
                f"(or {session.last_seq} to replay the last answer), got {request.seq}",
            )
        elif session.done:
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"the episode of session {session.id!r} is over; close it and open a new session",
            )
        else:
            task = asyncio.create_task(self._step_task(session, request, started), name=f"step-{session.id[:12]}")
            task.add_done_callback(_retrieve_exception)
            session.inflight = InFlightStep(request.seq, task)
        # Shielded: a client that gives up (deadline, dropped connection) does not stop the tools
        # half-way; the step runs to its end and its answer waits for the retry.
        response = await asyncio.shield(task)
        self.metrics.step_latency.labels(session.env_name).observe(time.perf_counter() - started)
        return response

    async def _step_task(self, session: Session, request: pb.StepRequest, started: float) -> pb.StepResponse:
        try:
            try:
                response = await self._run_step(session, request, started)
            except RpcError:
                raise  # refused before any tool ran: nothing to remember, the client may fix and resend
            except Exception as e:
                # Tools may have run: the sandbox state is unknown, so the episode ends, and the
                # answer is remembered like any other so a retry cannot run the calls twice.
                log.exception("step %d of session %s failed", request.seq, session.id)
                self.metrics.errors.labels("step:internal").inc()
                response = pb.StepResponse(
                    seq=request.seq,
                    done=True,
                    status=pb.STEP_STATUS_ERROR,
                    detail=f"the server failed while running this step ({type(e).__name__}: {e}); "
                    "the session is over, open a new one",
                )
                session.done = True
            session.last_seq = request.seq
            session.last_response = response
            session.touch()
            return response
        finally:
            session.inflight = None

    async def _run_step(self, session: Session, request: pb.StepRequest, started: float) -> pb.StepResponse:
        calls, final_text = self._tool_calls_of(session, request)
        parsed_at = time.perf_counter()
        response = pb.StepResponse(seq=request.seq, tool_calls=[_call_to_pb(c) for c in calls])

        if not calls:
            reward = session.env.reward(final_text)
            if reward is not None:
                response.reward = reward
            response.done = True
            response.status = pb.STEP_STATUS_EPISODE_END
            session.done = True
            response.timing.CopyFrom(_timing(started, parsed_at, parsed_at, parsed_at))
            return response

        outputs: list[ToolOutput] = []
        for call in calls:  # one sandbox per session: parallel calls run in order
            outputs.append(await self._run_call(session, call))
            if outputs[-1].lost:
                break  # the sandbox is gone; the remaining calls cannot run
        for call in calls[len(outputs) :]:
            outputs.append(ToolOutput(content="Error: not run, because the sandbox was lost by an earlier call."))
        tools_done = time.perf_counter()

        tool_messages = [
            {"role": "tool", "content": out.content, "name": call.name, "tool_call_id": call.id}
            for call, out in zip(calls, outputs)
        ]
        response.truncated = any(o.truncated for o in outputs)
        lost = next((o for o in outputs if o.lost), None)
        ended = next((o for o in outputs if o.done), None)
        rewards = [o.reward for o in outputs if o.reward is not None]
        if rewards:
            response.reward = rewards[-1]

        if lost is not None:
            response.status = pb.STEP_STATUS_SANDBOX_LOST
            response.done = True
            response.detail = f"sandbox lost: {lost.lost_reason or 'the interpreter died'}; open a new session"
        elif ended is not None:
            response.status = pb.STEP_STATUS_OK
            response.done = True
        else:
            response.status = pb.STEP_STATUS_OK
            if session.renderer is not None:
                budget = request.max_suffix_tokens or None
                render = functools.partial(session.renderer.render_suffix, calls, tool_messages, budget)
                # A big tool output can take several renders to fit the budget: keep that off the loop.
                big = sum(len(m["content"]) for m in tool_messages) > _OFFLOAD_RENDER_CHARS
                suffix = await asyncio.to_thread(render) if big else render()
                if suffix.overflow:
                    response.status = pb.STEP_STATUS_SUFFIX_OVERFLOW
                    response.done = True
                    response.detail = (
                        f"not even the minimal tool-result suffix fits max_suffix_tokens={request.max_suffix_tokens}"
                    )
                else:
                    response.suffix_ids.extend(suffix.ids)
                    tool_messages = suffix.tool_messages
                    response.truncated = response.truncated or suffix.truncated
        session.done = response.done
        response.tool_messages.extend(_dict_to_message(m) for m in tool_messages)
        response.timing.CopyFrom(_timing(started, parsed_at, tools_done, time.perf_counter()))
        return response

    async def _run_call(self, session: Session, call: ParsedToolCall) -> ToolOutput:
        if call.error:
            outcome, out = "malformed", ToolOutput(content=f"Error: {call.error}")
        else:
            out = await session.env.call_tool(call.name, call.arguments)
            outcome = "lost" if out.lost else ("error" if out.content.startswith("Error:") else "ok")
        session.tool_calls_made += 1
        self.metrics.tool_calls.labels(session.env_name, call.name or "?", outcome).inc()
        return out

    def _tool_calls_of(self, session: Session, request: pb.StepRequest) -> tuple[list[ParsedToolCall], str]:
        if request.completion_ids:
            if session.renderer is None:
                raise RpcError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    "completion_ids need a tokenizer: open the session with a tokenizer_fingerprint "
                    "(RegisterTokenizer), or send parsed tool_calls instead",
                )
            try:
                parsed = session.renderer.parse_completion(list(request.completion_ids), id_prefix=f"call_{request.seq}_")
            except ValueError as e:
                raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"completion_ids: {e}") from e
            if not parsed.stopped:
                raise RpcError(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    "completion_ids do not end with a stop token "
                    f"({', '.join(map(str, session.renderer.stop_token_ids))}): the assistant turn is unfinished, "
                    "so its tool calls are not run. A turn cut by length ends the rollout as truncated; "
                    "send the ids exactly as generated, stop token included",
                )
            calls, final_text = list(parsed.tool_calls), parsed.content
        else:
            calls = [ParsedToolCall(id=c.id, name=c.name, arguments=c.arguments, error=None) for c in request.tool_calls]
            final_text = request.assistant_content
        for i, call in enumerate(calls):
            if not call.id:
                call.id = f"call_{request.seq}_{i}"
            if not call.error and not call.name:
                call.error = "a tool call has no tool name; write {\"name\": ..., \"arguments\": {...}}"
        return calls, final_text

    def _renderer(self, fingerprint: str) -> RenderingContext | None:
        if not fingerprint:
            return None
        ctx = self.tokenizers.get(fingerprint)
        if ctx is None:
            raise RpcError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"unknown tokenizer fingerprint {fingerprint!r}: call RegisterTokenizer first "
                "(this server may have restarted or evicted it from its cache)",
            )
        return ctx

    # ------------------------------------------------------------ CloseSession

    @_rpc("close_session")
    async def CloseSession(self, request: pb.CloseSessionRequest, context: Any) -> pb.CloseSessionResponse:
        closed = await self.sessions.close(request.session_id, "closed by the client")
        return pb.CloseSessionResponse(closed=closed)


# ---------------------------------------------------------------- conversions


def _retrieve_exception(task: asyncio.Task) -> None:
    # The handler that started a step may be gone (cancelled); its outcome must not be reported
    # as "never retrieved".
    if not task.cancelled():
        task.exception()


def _environment_spec(cls: type[Environment]) -> pb.EnvironmentSpec:
    return pb.EnvironmentSpec(
        name=cls.name,
        description=cls.description,
        tools=[
            pb.ToolSpec(name=s.name, description=s.description, parameters_json_schema=json.dumps(s.parameters_schema()))
            for s in cls.tool_specs()
        ],
        env_args_json_schema=json.dumps(cls.EnvArgs.model_json_schema()),
    )


def _json_object(text: str, field: str) -> dict[str, Any]:
    if not text.strip():
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"{field} is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise RpcError(grpc.StatusCode.INVALID_ARGUMENT, f"{field} must be a JSON object")
    return value


def _message_to_dict(m: pb.Message, index: int) -> dict[str, Any]:
    if m.role not in _ROLES:
        raise RpcError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"messages[{index}].role is {m.role!r}; use one of {', '.join(sorted(_ROLES))}",
        )
    d: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.role == "tool":
        d["name"] = m.name
        d["tool_call_id"] = m.tool_call_id
    if m.reasoning_content:
        d["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        calls = []
        for j, c in enumerate(m.tool_calls):
            args = _json_object(c.arguments, f"messages[{index}].tool_calls[{j}].arguments")
            calls.append({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": args}})
        d["tool_calls"] = calls
    return d


def _dict_to_message(d: dict[str, Any]) -> pb.Message:
    return pb.Message(role=d["role"], content=d["content"], name=d.get("name", ""), tool_call_id=d.get("tool_call_id", ""))


def _call_to_pb(c: ParsedToolCall) -> pb.ToolCall:
    return pb.ToolCall(id=c.id, name=c.name or "", arguments=c.arguments or "")


def _timing(started: float, parsed: float, tools: float, rendered: float) -> pb.StepTiming:
    ms = 1000.0
    return pb.StepTiming(
        parse_ms=(parsed - started) * ms,
        tools_ms=(tools - parsed) * ms,
        render_ms=(rendered - tools) * ms,
        total_ms=(rendered - started) * ms,
    )
