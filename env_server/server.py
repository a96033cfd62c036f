"""Assembles and runs one environment server: the gRPC service, health, reflection and metrics."""

from __future__ import annotations

import asyncio
import logging
import signal
import uuid
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import start_http_server

from env_server.auth import TokenAuthInterceptor, load_tokens, server_credentials
from env_server.capacity import default_session_memory_mb, session_capacity
from env_server.config import ServerConfig
from env_server.engine import Engine
from env_server.environments.loader import load_environments
from env_server.metrics import ServerMetrics
from env_server.rendering import TokenizerRegistry
from env_server.rendering.selfcheck import renderer_self_check
from env_server.sandbox.pools import SandboxPools
from env_server.service import EnvironmentService
from env_server.sessions import Session, SessionRegistry
from tito.channel_options import server_options
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Environment"].full_name


@dataclass
class EnvServer:
    """One running server. `await start()`, then `await stop()` (or `serve_forever()`)."""

    config: ServerConfig
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics()
        self.environments = load_environments(self.config.environments, self.config.load_entry_points)
        # One warm pool per sandbox image; `pool` (sandbox.image) decides health, the others only their
        # environments' opens (and task images, made at their first open, their sessions').
        self.pools = SandboxPools(self.config.sandbox, self.config.pool, self.config.server_name, self.instance_id,
                                  self.config.task_images)
        self.pool = self.pools.main
        for name, env_cls in self.environments.items():
            if env_cls.needs_sandbox:
                self.pools.add_environment(name, self.config.environment_images.get(name) or env_cls.sandbox_image)
        self.tokenizers = TokenizerRegistry(max_entries=self.config.tokenizer_cache_size,
                                            max_upload_bytes=self.config.max_tokenizer_bytes)
        sandbox = self.config.sandbox
        self.capacity = session_capacity(self.config.max_sessions, sandbox.backend,
                                         session_memory_mb=self.config.session_memory_mb
                                         or default_session_memory_mb(sandbox.backend, sandbox.runtime),
                                         docker_max_containers=self.config.docker_max_containers)
        self.sessions = SessionRegistry(self.capacity.limit, on_closed=self._on_session_closed,
                                        limit_why=self.capacity.why)
        self.pools.bound_by_sessions(self.sessions.room)
        self.health = health.aio.HealthServicer()
        # Read now, so a bad file stops `python -m env_server` before anything starts.
        self.tokens = load_tokens(self.config.auth.tokens_file) if self.config.auth.tokens_file else ()
        self.credentials = server_credentials(self.config.tls) if self.config.tls.enabled else None
        self.port: int | None = None
        self.health_port: int | None = None
        self.renderer_ready = False
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._metrics_http = None
        self._serving: bool | None = None  # what health says now
        self._stopped = asyncio.Event()

    @property
    def address(self) -> str:
        return f"{self.config.host}:{self.port}"

    async def start(self) -> None:
        interceptors = [TokenAuthInterceptor(self.tokens)] if self.tokens else []
        # The transport takes tokenizer uploads (plus room for the message framing); the servicer holds
        # every other RPC to max_message_bytes.
        transport = max(self.config.max_message_bytes, self.config.max_tokenizer_bytes + (1 << 20))
        server = grpc.aio.server(options=server_options(transport), interceptors=interceptors)
        engine = Engine(self.config, self.environments, self.pools, self.tokenizers, self.sessions, self.metrics)
        service = EnvironmentService(engine, max_message_bytes=self.config.max_message_bytes)
        pb_grpc.add_EnvironmentServicer_to_server(service, server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            server,
        )
        await self._set_health(False)
        self.port = self._listen(server, self.config.port, self.credentials)
        await server.start()
        self._server = server
        if self.config.health_port:
            self._health_server = grpc.aio.server(options=server_options(self.config.max_message_bytes))
            health_pb2_grpc.add_HealthServicer_to_server(self.health, self._health_server)
            self.health_port = self._listen(self._health_server, self.config.health_port, None)
            await self._health_server.start()
        if self.config.metrics_port:
            self._metrics_http, _ = start_http_server(
                self.config.metrics_port, addr=self.config.metrics_host, registry=self.metrics.registry
            )
        self.sessions.start_reaper(self.config.reap_interval_s)
        renderer_check = asyncio.create_task(asyncio.to_thread(renderer_self_check))
        # Health follows the pool's transitions (no polling); the pools' figures are read when scraped.
        self.pool.on_change(lambda state: self._update_health())
        # A copy: /metrics is served from another thread while task images' pools are added.
        self.metrics.watch_pools(lambda: dict(self.pools.by_image))
        await self.pools.start()
        try:
            await renderer_check
            self.renderer_ready = True
        except Exception:
            log.exception("renderer self-check failed: health stays NOT_SERVING")
        await self._update_health()
        log.info("max %d sessions (%s; bounds: %s)", self.capacity.limit, self.capacity.why,
                 ", ".join(f"{k} {v}" for k, v in self.capacity.bounds.items()))
        self.metrics.sessions_limit.set(self.capacity.limit)
        log.info(
            "tito env server %s (%s) listening on %s (%s); environments: %s",
            self.config.server_name,
            self.instance_id,
            self.address,
            self.security,
            ", ".join(sorted(self.environments)),
        )

    @property
    def security(self) -> str:
        """What protects the port, for the start-up log line (never the tokens themselves)."""
        tls = self.config.tls
        parts = ["mTLS" if tls.client_ca_file else "TLS"] if tls.enabled else ["plaintext"]
        parts.append(f"{len(self.tokens)} bearer token(s)" if self.tokens else "no token")
        if self.health_port:
            parts.append(f"plaintext health on port {self.health_port}")
        return ", ".join(parts)

    def _listen(self, server: grpc.aio.Server, port: int, credentials: grpc.ServerCredentials | None) -> int:
        address = f"{self.config.host}:{port}"
        try:
            bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        except RuntimeError:
            bound = 0
        if bound == 0:  # OSError: `python -m env_server` reports it as one line
            raise OSError(f"cannot listen on {address}: the port is in use or the host is not an address of this "
                          "machine (set host/port, TITO_HOST/TITO_PORT or --host/--port)")
        return bound

    async def _update_health(self) -> None:
        """SERVING only once the renderer passed its self-check and while the pool can hand out sandboxes."""
        ready = self.renderer_ready and self.pool.ready
        if ready != self._serving:
            self._serving = ready
            await self._set_health(ready)
            log.info("health: %s (%s)", "SERVING" if ready else "NOT_SERVING", self.pool.status_detail)

    async def _set_health(self, ok: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", SERVICE_NAME):
            await self.health.set(name, status)

    def _on_session_closed(self, session: Session, reason: str) -> None:
        self.metrics.sessions_closed.labels(reason).inc()
        self.metrics.sessions_active.set(len(self.sessions))

    async def stop(self) -> None:
        """Drain in-flight calls, close every session, remove every container of this instance."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        log.info("shutting down: draining calls (grace %.1fs)", self.config.shutdown_grace_s)
        await self._set_health(False)
        if self._server:
            await self._server.stop(self.config.shutdown_grace_s)
        if self._health_server:
            await self._health_server.stop(None)
        await self.sessions.stop_reaper()
        await self.sessions.close_all("server shutdown")
        await self.pools.close()
        if self._metrics_http:
            self._metrics_http.shutdown()
        log.info("shut down cleanly")

    async def serve_forever(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        await stop.wait()
        await self.stop()
