"""The environment engine: what each RPC does, in tito's own types (no grpc here).

The gRPC adapter (`service.py`) converts a request into these calls and the answer back; the
engine opens sessions (environment, renderer, sandbox from the pool), hands Steps to the
session's `Episode`, and closes sessions. Client mistakes raise `RequestError`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

from env_server.config import ServerConfig
from env_server.environments.base import Environment
from env_server.episode import Episode
from env_server.errors import ErrorKind, RequestError, quote
from env_server.idempotency import OnceByKey
from env_server.metrics import ServerMetrics
from env_server.rendering import (InvalidTokenizerFilesError, RenderingContext, TokenizerRegistry,
                                  UnsupportedTemplateError, UploadTooLargeError)
from env_server.sandbox.sandbox import new_session_id
from env_server.sandbox.pool import SandboxPool
from env_server.sandbox.pools import SandboxPools
from env_server.sessions import Session, SessionRegistry
from tito.types import (EnvironmentInfo, OpenedSession, OpenSessionRequest, RegisterTokenizerRequest,
                        StepRequest, StepResult, TokenizerRegistration)

log = logging.getLogger(__name__)

# Retried OpenSession calls are recognised by client_request_id for this many recent openings.
_REMEMBERED_OPENINGS = 4096


@dataclass
class Engine:
    config: ServerConfig
    environments: dict[str, type[Environment]]
    pools: SandboxPools  # one per image: the environments' (by name) and task images' (made at first open)
    tokenizers: TokenizerRegistry
    sessions: SessionRegistry
    metrics: ServerMetrics

    def __post_init__(self) -> None:
        self._openings: OnceByKey[str, OpenedSession] = OnceByKey(_REMEMBERED_OPENINGS, name="open")

    def list_environments(self) -> list[EnvironmentInfo]:
        return [cls.info() for cls in self.environments.values()]

    async def register_tokenizer(self, request: RegisterTokenizerRequest) -> TokenizerRegistration:
        try:
            # Loading and the golden check take a while: keep them off the event loop.
            ctx = await asyncio.to_thread(self.tokenizers.register, dict(request.files),
                                          dict(request.chat_template_kwargs))
        except UploadTooLargeError as e:
            raise RequestError(ErrorKind.RESOURCE_EXHAUSTED, str(e)) from e
        except InvalidTokenizerFilesError as e:
            raise RequestError(ErrorKind.INVALID_ARGUMENT, str(e)) from e
        except UnsupportedTemplateError as e:
            raise RequestError(ErrorKind.FAILED_PRECONDITION, str(e)) from e
        return TokenizerRegistration(fingerprint=ctx.fingerprint, stop_token_ids=tuple(ctx.stop_token_ids),
                                     template_family=ctx.family, renderer_version=ctx.renderer_version)

    # ------------------------------------------------------------ sessions

    async def open_session(self, request: OpenSessionRequest) -> OpenedSession:
        if not request.client_request_id:
            return await self._open(request)
        # Retries with the same key share one opening, also while it still runs.
        return await self._openings.run(request.client_request_id, functools.partial(self._open, request))

    async def _open(self, request: OpenSessionRequest) -> OpenedSession:
        started = time.perf_counter()
        env_cls = self.environments.get(request.environment)
        if env_cls is None:
            known = ", ".join(sorted(self.environments)) or "none"
            raise RequestError(ErrorKind.NOT_FOUND,
                               f"unknown environment {quote(request.environment)}; this server offers: {known}")
        renderer = self._renderer(request.tokenizer_fingerprint)
        try:
            env_args = env_cls.parse_env_args(request.env_args_json, context={"config": self.config})
        except ValueError as e:
            raise RequestError(ErrorKind.INVALID_ARGUMENT, str(e)) from e
        tools = tuple(env_cls.session_tool_specs(env_args))  # not info(): its env_args JSON schema costs ~0.6 ms a call
        prompt_ids: list[int] = []
        if renderer is not None:
            try:
                prompt_ids = renderer.render_prompt(request.messages, tools)
            except ValueError as e:  # the conversation itself is wrong
                raise RequestError(ErrorKind.INVALID_ARGUMENT, f"the opening messages: {e}") from e
            except Exception as e:
                raise RequestError(
                    ErrorKind.INVALID_ARGUMENT,
                    f"the chat template could not render the opening messages: {type(e).__name__}: {e}",
                ) from e
        pool = await self._pool_for(env_cls, env_args) if env_cls.needs_sandbox else None
        if pool is not None and not pool.ready:
            raise RequestError(ErrorKind.UNAVAILABLE, f"the sandbox pool of environment {env_cls.name!r} is not "
                                                      f"ready: {pool.status_detail}")

        # The slot is taken before the first await, so concurrent opens cannot overshoot max_sessions.
        with self.sessions.reserve_slot() as reserved:
            if not reserved:
                raise RequestError(
                    ErrorKind.RESOURCE_EXHAUSTED,
                    f"the server holds its maximum of {self.sessions.max_sessions} sessions "
                    f"({self.sessions.limit_why or 'max_sessions'}); close some or retry later",
                )
            env = await self._start_environment(env_cls, env_args, pool)
            session_id = env.sandbox.session_id if env.sandbox is not None else new_session_id()
            strict = self.config.parsing.strict if request.parsing_strict is None else request.parsing_strict
            episode = Episode(session_id, env, renderer, self.metrics, strict_parsing=strict,
                              history_calls=sum(len(m.tool_calls) for m in request.messages))
            self.sessions.add(Session(
                id=session_id, env_name=env_cls.name, episode=episode,
                idle_ttl_s=self.config.idle_ttl_s, hard_ttl_s=self.config.hard_ttl_s,
            ))
        self.metrics.sessions_opened.labels(env_cls.name).inc()
        self.metrics.sessions_active.set(len(self.sessions))
        self.metrics.open_latency.observe(time.perf_counter() - started)
        return OpenedSession(session_id=session_id, prompt_ids=tuple(prompt_ids), tools=tools,
                             idle_ttl_s=self.config.idle_ttl_s, hard_ttl_s=self.config.hard_ttl_s)

    async def _pool_for(self, env_cls: type[Environment], env_args: Any) -> SandboxPool:
        """The pool of the session's image: a task image the session asks for (if config task_images allows it),
        else the environment's."""
        image = env_cls.session_image(env_args)
        if image is None:
            return self.pools.of_environment(env_cls.name)
        if not self.pools.allows(image):
            allowed = ", ".join(repr(p) for p in self.pools.task_images) or "none"
            raise RequestError(ErrorKind.INVALID_ARGUMENT,
                               f"env_args image {quote(image)} is not allowed on this server: the setting task_images "
                               f"(TITO_TASK_IMAGES) allows {allowed}")
        pool = await self.pools.task_pool(image)
        if pool.missing_image:
            raise RequestError(ErrorKind.FAILED_PRECONDITION, pool.backend.missing_task_image(quote(image)))
        return pool

    async def _start_environment(self, env_cls: type[Environment], env_args: Any,
                                 pool: SandboxPool | None) -> Environment:
        sandbox = None
        if pool is not None:
            try:
                sandbox = await pool.acquire()
            except Exception as e:
                log.warning("OpenSession(%s) failed: could not start a sandbox: %s", env_cls.name, e)
                raise RequestError(ErrorKind.UNAVAILABLE, f"could not start a sandbox: {e}") from e
        try:
            env = env_cls(env_args, sandbox)
            if pool is not None:
                env.sandbox_factory = pool.acquire
            await env.setup()
        except BaseException as e:
            # Never leave an acquired sandbox behind, not even when the call is cancelled.
            if sandbox is not None:
                await asyncio.shield(sandbox.destroy())
            if isinstance(e, Exception):
                raise RequestError(
                    ErrorKind.FAILED_PRECONDITION,
                    f"environment {env_cls.name!r} failed to set up: {type(e).__name__}: {e}",
                ) from e
            raise
        return env

    async def step(self, request: StepRequest) -> StepResult:
        started = time.perf_counter()
        session = self.sessions.get(request.session_id)
        session.touch()
        result = await session.episode.step(request)
        session.touch()
        self.metrics.step_latency.labels(session.env_name).observe(time.perf_counter() - started)
        return result

    async def close_session(self, session_id: str) -> bool:
        return await self.sessions.close(session_id, "closed by the client")

    def _renderer(self, fingerprint: str) -> RenderingContext | None:
        if not fingerprint:
            return None
        ctx = self.tokenizers.get(fingerprint)
        if ctx is None:
            raise RequestError(
                ErrorKind.FAILED_PRECONDITION,
                f"unknown tokenizer fingerprint {quote(fingerprint)}: call RegisterTokenizer first "
                "(this server may have restarted or evicted it from its cache)",
            )
        return ctx
