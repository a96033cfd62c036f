"""One client for several env-server replicas: an `EnvironmentClient` over a set of servers.

    async with AsyncReplicaClient(["10.0.0.5:50051", "10.0.0.6:50051"], tls=..., token=...) as client:
    async with AsyncReplicaClient("tito-env.tito.svc.cluster.local:50051") as client:   # headless service

- Replicas: the addresses given, each host resolved with `socket.getaddrinfo` (a name with several
  records, as a Kubernetes headless service has, is several replicas; IPv4 records are preferred, so
  `localhost` is one replica). Names are resolved again every `resolve_interval_s`: new records join,
  records that left take no new sessions. With TLS the certificate is checked against the name, not
  the IP.
- Health: every replica's grpc.health.v1 is polled every `health_interval_s`; only SERVING ones take
  new sessions. A SERVING replica whose check merely times out (busy, e.g. loading a tokenizer) stays
  SERVING until `slow_checks` checks in a row have timed out (after `health_timeout_s`); NOT_SERVING or unreachable counts at once.
- Placement: a new session goes to the SERVING replica with the fewest open sessions (ties in turn);
  a replica that is full (RESOURCE_EXHAUSTED) or unreachable is skipped and the next one tried.
- Affinity: the client remembers which replica opened each session; every later call of the session
  goes there (session ids are the servers' own, unchanged).
- Loss: when a call finds its replica UNAVAILABLE after the retries and a health check confirms it is
  unreachable, the replica is lost: each of its sessions gets a `StepResult` with status SANDBOX_LOST
  (detail naming the replica) at its next step, and other replicas' sessions go on untouched. A replica
  that answers again takes new sessions; its old sessions stay lost (a restarted server swept them).
- Tokenizers: `register_tokenizer` registers on every SERVING replica; a replica that joins or comes
  back later is registered before it opens a session with that fingerprint.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tito.client.aio import AsyncTitoClient
from tito.client.connection import TlsOptions
from tito.client.errors import NotFoundError, NotServingError, ResourceExhaustedError, UnavailableError
from tito.client.protocol import EnvironmentClient
from tito.types import (EnvironmentInfo, OpenedSession, OpenSessionRequest, RegisterTokenizerRequest, StepRequest,
                        StepResult, StepStatus, TokenizerRegistration)

log = logging.getLogger(__name__)

SERVING = "SERVING"


@dataclass(eq=False)  # identity: one object per address
class Replica:
    address: str
    client: AsyncTitoClient
    state: str = "UNKNOWN"  # SERVING, NOT_SERVING, or what the last health check failed with
    in_dns: bool = True  # False once its name no longer resolves to it: no new sessions
    sessions: set[str] = field(default_factory=set)
    opening: int = 0
    slow_checks: int = 0  # health checks in a row that timed out while it was SERVING
    registered: set[str] = field(default_factory=set)  # tokenizer fingerprints

    @property
    def load(self) -> int:
        return len(self.sessions) + self.opening

    @property
    def usable(self) -> bool:
        return self.state == SERVING and self.in_dns


@dataclass(frozen=True)
class ReplicaStatus:
    address: str
    state: str
    sessions: int


def split_address(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"replica address {target!r} must be HOST:PORT (IPv6 as [ADDR]:PORT)")
    return host.strip("[]"), int(port)


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False


class AsyncReplicaClient(EnvironmentClient):
    """The client protocol over several replicas (see the module's docstring)."""

    def __init__(self, addresses: str | Sequence[str], *, health_interval_s: float = 1.0,
                 resolve_interval_s: float = 30.0, health_timeout_s: float = 2.0, slow_checks: int = 3, tls: TlsOptions | None = None,
                 **client_kwargs: Any) -> None:
        targets = [addresses] if isinstance(addresses, str) else list(addresses)
        if not targets:
            raise ValueError("AsyncReplicaClient needs at least one HOST:PORT")
        self.targets = [split_address(t) for t in targets]
        self.health_interval_s = health_interval_s
        if slow_checks < 1:
            raise ValueError("slow_checks must be at least 1")
        self.slow_checks = slow_checks
        self.health_timeout_s = health_timeout_s
        self.resolve_interval_s = resolve_interval_s
        self.tls = tls
        self.client_kwargs = client_kwargs  # token, credentials, metadata, deadline_s, retries, backoff_s
        self.replicas: dict[str, Replica] = {}
        self._routes: dict[str, Replica] = {}  # session id -> the replica that opened it
        self._lost: dict[str, str] = {}  # session id -> why, for the sessions of lost replicas
        self._tokenizers: dict[str, RegisterTokenizerRequest] = {}  # fingerprint -> its upload
        self._next = 0  # round robin among equally loaded replicas
        self._monitor: asyncio.Task | None = None
        self._started: asyncio.Lock | None = None

    # ------------------------------------------------------------ replicas

    async def start(self) -> None:
        """Resolve the addresses, check every replica once, then keep watching (idempotent)."""
        self._started = self._started or asyncio.Lock()
        async with self._started:
            if self._monitor is None:
                await self._resolve(initial=True)
                await self._check_all()
                self._monitor = asyncio.create_task(self._watch(), name="tito-replicas")

    async def _resolve(self, initial: bool = False) -> None:
        found: dict[str, str | None] = {}  # address -> the name TLS checks, when resolved from one
        for host, port in self.targets:
            try:
                infos = await asyncio.to_thread(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
            except socket.gaierror as e:
                if initial:
                    raise UnavailableError("resolve", None, f"cannot resolve replica host {host!r}: {e}") from None
                log.warning("cannot resolve %s (%s); keeping the replicas known so far", host, e)
                return
            ips = [i[4][0] for i in infos if i[0] == socket.AF_INET] or [i[4][0] for i in infos]
            for ip in dict.fromkeys(ips):
                found[f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"] = None if _is_ip(host) else host
        for address, name in found.items():
            if address not in self.replicas:
                self.replicas[address] = Replica(address, self._make_client(address, name))
                if not initial:
                    log.info("replica %s joined", address)
        for address, replica in self.replicas.items():
            replica.in_dns = address in found

    def _make_client(self, address: str, name: str | None) -> AsyncTitoClient:
        tls = self.tls
        if tls is not None and name and tls.server_name is None:
            tls = replace(tls, server_name=name)  # dialled by IP; the certificate names the host
        return AsyncTitoClient(address, tls=tls, **self.client_kwargs)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        resolved_at = loop.time()
        needs_dns = any(not _is_ip(host) for host, _ in self.targets)
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                if needs_dns and loop.time() - resolved_at >= self.resolve_interval_s:
                    resolved_at = loop.time()
                    await self._resolve()
                await self._check_all()
            except Exception:  # the watcher must outlive any one failure
                log.exception("replica watch failed; trying again")

    async def _check_all(self) -> None:
        await asyncio.gather(*(self._check(r, tolerate_slow=True) for r in list(self.replicas.values())))

    async def _check(self, replica: Replica, tolerate_slow: bool = False) -> str:
        stub = health_pb2_grpc.HealthStub(replica.client.channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=self.health_timeout_s,
                                     metadata=replica.client.metadata or None)
            state = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
            replica.slow_checks = 0
        except grpc.aio.AioRpcError as e:
            state = f"{e.code().name}: {e.details()}"
            if e.code() is grpc.StatusCode.DEADLINE_EXCEEDED and replica.state == SERVING:
                # A busy server answers late but still serves: one slow check must not send new sessions away.
                replica.slow_checks += 1
                if tolerate_slow and replica.slow_checks < self.slow_checks:
                    log.info("replica %s: health check timed out (%d in a row); still counted as SERVING",
                             replica.address, replica.slow_checks)
                    return replica.state
        if state != replica.state:
            log.info("replica %s: %s", replica.address, state)
        replica.state = state
        return state

    async def _failed(self, replica: Replica, error: UnavailableError) -> str | None:
        """After a call found `replica` UNAVAILABLE with its retries spent: when a health check confirms
        that it is unreachable, its sessions are lost, and the reason is returned; None if it answers."""
        if await self._check(replica) in (SERVING, "NOT_SERVING"):
            return None
        reason = (f"replica {replica.address} is lost (UNAVAILABLE after {replica.client.retries} retries: "
                  f"{error.details}); the session's sandbox went with it")
        if replica.sessions:
            log.warning("%s: %d session(s) lost", reason, len(replica.sessions))
        for session_id in replica.sessions:
            self._lost[session_id] = reason
            self._routes.pop(session_id, None)
        replica.sessions.clear()
        replica.registered.clear()  # a restarted server knows no tokenizer
        return reason

    def status(self) -> list[ReplicaStatus]:
        return [ReplicaStatus(r.address, r.state, len(r.sessions)) for r in self.replicas.values()]

    def replica_of(self, session_id: str) -> str | None:
        replica = self._routes.get(session_id)
        return replica.address if replica else None

    def _pick(self, exclude: set[str]) -> Replica | None:
        """The usable replica with the fewest sessions; among equals, the next in turn."""
        ordered = list(self.replicas.values())
        candidates = [r for r in ordered if r.usable and r.address not in exclude]
        if not candidates:
            return None
        least = min(r.load for r in candidates)
        for i in range(len(ordered)):
            replica = ordered[(self._next + i) % len(ordered)]
            if replica in candidates and replica.load == least:
                self._next = (ordered.index(replica) + 1) % len(ordered)
                return replica
        return None  # unreachable: some candidate has the least load

    def _describe(self) -> str:
        return "; ".join(f"{r.address}: {r.state}" + ("" if r.in_dns else " (left DNS)") for r in self.replicas.values())

    async def _any(self, rpc: str) -> Replica:
        await self.start()
        replica = self._pick(set())
        if replica is None:
            await self._check_all()
            replica = self._pick(set())
        if replica is None:
            raise NotServingError(rpc, None, f"no replica is SERVING ({self._describe()})")
        return replica

    # ------------------------------------------------------------ the client protocol

    def __str__(self) -> str:
        return ", ".join(self.replicas) or ", ".join(f"{h}:{p}" for h, p in self.targets)

    async def close(self) -> None:
        if self._monitor:
            self._monitor.cancel()
            await asyncio.gather(self._monitor, return_exceptions=True)
        await asyncio.gather(*(r.client.close() for r in self.replicas.values()))

    async def __aenter__(self) -> AsyncReplicaClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_ready(self, timeout_s: float = 120.0, min_ready: int | None = None) -> None:
        """Wait until `min_ready` replicas (default: every one resolved) report SERVING."""
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            want = min_ready if min_ready is not None else len(self.replicas)
            if sum(r.usable for r in self.replicas.values()) >= want:
                return
            if loop.time() >= deadline:
                raise NotServingError("Health", None, f"{want} replica(s) not SERVING after {timeout_s} s "
                                                      f"({self._describe()})")
            await asyncio.sleep(min(0.25, self.health_interval_s))
            await self._check_all()

    async def list_environments(self) -> list[EnvironmentInfo]:
        return await (await self._any("ListEnvironments")).client.list_environments()

    async def register(self, request: RegisterTokenizerRequest) -> TokenizerRegistration:
        """Registers on every SERVING replica now, and on later ones before they open a session with it."""
        await self._any("RegisterTokenizer")
        targets = [r for r in self.replicas.values() if r.usable]
        results = await asyncio.gather(*(self._register(r, request) for r in targets), return_exceptions=True)
        regs = [r for r in results if isinstance(r, TokenizerRegistration)]
        errors = [e for e in results if isinstance(e, BaseException)]
        for e in errors:
            if not isinstance(e, UnavailableError):
                raise e
        if not regs:
            raise NotServingError("RegisterTokenizer", None, f"no replica took the tokenizer ({self._describe()})")
        self._tokenizers[regs[0].fingerprint] = request
        return regs[0]

    async def _register(self, replica: Replica, request: RegisterTokenizerRequest) -> TokenizerRegistration:
        reg = await replica.client.register(request)
        replica.registered.add(reg.fingerprint)
        return reg

    async def open(self, request: OpenSessionRequest) -> OpenedSession:
        await self.start()
        if self._pick(set()) is None:
            await self._check_all()  # the last poll may be stale (a replica just came back)
        fingerprint = request.tokenizer_fingerprint
        tried: set[str] = set()
        full: ResourceExhaustedError | None = None
        while (replica := self._pick(tried)) is not None:
            tried.add(replica.address)
            replica.opening += 1
            try:
                if fingerprint and fingerprint in self._tokenizers and fingerprint not in replica.registered:
                    await self._register(replica, self._tokenizers[fingerprint])
                opened = await replica.client.open(request)
            except UnavailableError as e:
                await self._failed(replica, e)
                continue
            except ResourceExhaustedError as e:
                full = e
                continue
            finally:
                replica.opening -= 1
            replica.sessions.add(opened.session_id)
            self._routes[opened.session_id] = replica
            return opened
        if full is not None:
            raise ResourceExhaustedError("OpenSession", full.code, f"every SERVING replica is full (last: {full.details})")
        raise NotServingError("OpenSession", None, f"no replica could open a session ({self._describe()})")

    async def step(self, request: StepRequest) -> StepResult:
        replica = self._route("Step", request.session_id)
        if replica is None:
            return StepResult(seq=request.seq, status=StepStatus.SANDBOX_LOST, detail=self._lost[request.session_id])
        try:
            return await replica.client.step(request)
        except UnavailableError as e:
            # Another call may have found the replica lost meanwhile.
            reason = self._lost.get(request.session_id) or await self._failed(replica, e)
            if reason is None:
                raise
            return StepResult(seq=request.seq, status=StepStatus.SANDBOX_LOST, detail=reason)

    async def close_session(self, session_id: str) -> bool:
        if self._lost.pop(session_id, None) is not None:
            return False  # its server is gone, and the sandbox with it
        replica = self._routes.pop(session_id, None)
        if replica is None:
            return False
        replica.sessions.discard(session_id)
        try:
            return await replica.client.close_session(session_id)
        except UnavailableError:
            return False  # unreachable: its server's lease closes it

    def _route(self, rpc: str, session_id: str) -> Replica | None:
        """The session's replica; None when that replica was lost."""
        if session_id in self._lost:
            return None
        replica = self._routes.get(session_id)
        if replica is None:
            raise NotFoundError(rpc, grpc.StatusCode.NOT_FOUND,
                                f"session {session_id} was not opened through this client, or is closed")
        return replica

