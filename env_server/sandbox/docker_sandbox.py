"""One hardened container running the REPL, and its persistent channel.

Docker SDK calls are blocking, so every one of them runs in the pool's thread executor; the
channel itself is plain asyncio socket I/O, so a call needs no thread hop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import signal
import socket
import ssl
import time
import uuid
from typing import Any, Callable, TypeVar

import docker
import docker.errors
from docker.types import LogConfig, Ulimit

from .channel import ChannelClosed, ReplChannel
from .config import SandboxConfig, parse_bytes
from .result import ExecResult
from .socket_channel import SocketEndpoint

log = logging.getLogger(__name__)
T = TypeVar("T")

LABEL_MANAGED = "tito.managed"
LABEL_SERVER = "tito.server"
LABEL_INSTANCE = "tito.instance"
LABEL_SESSION = "tito.session"
REPL_EXIT_CHANNEL_BROKEN = 70  # repl_server.py exits with this when it cannot write a reply


class SandboxError(Exception):
    """A sandbox could not be created or started."""


def new_session_id() -> str:
    return uuid.uuid4().hex


def container_name(server_name: str, session_id: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", server_name)[:40] or "x"
    return f"tito-{safe}-{session_id[:16]}"


def describe_exit(state: dict[str, Any], mem_limit: str) -> str:
    """Human-readable reason for a dead REPL from the container's State."""
    if state.get("OOMKilled"):
        return f"out of memory (limit {parse_bytes(mem_limit) / (1 << 20):.0f} MiB)"
    code = state.get("ExitCode")
    if state.get("Running"):
        return "REPL channel closed while the container was still running"
    if not isinstance(code, int):
        return "sandbox exited (exit status unknown)"
    if code > 128:
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = f"signal {code - 128}"
        if name == "SIGSEGV":
            return f"segmentation fault (SIGSEGV, exit code {code})"
        if name == "SIGKILL":
            return f"killed by SIGKILL (exit code {code})"
        return f"killed by {name} (exit code {code})"
    if code == REPL_EXIT_CHANNEL_BROKEN:
        return f"REPL exited with code {code} (its protocol channel was broken by the code)"
    return f"REPL exited with code {code}"


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def _own_socket(attached: Any) -> socket.socket:
    """Takes the fd out of the SDK's hijacked-socket wrapper so nothing else can close it."""
    raw = getattr(attached, "_sock", attached)
    if isinstance(raw, ssl.SSLSocket) or not isinstance(raw, socket.socket):
        raise SandboxError(
            f"the attach stream is a {type(raw).__name__}; only unix-socket or plain-TCP Docker "
            "endpoints are supported (mount /var/run/docker.sock)")
    return socket.socket(fileno=raw.detach())


class Sandbox:
    """A started container with a ready REPL; use `Sandbox.create` (or a `SandboxPool`)."""

    def __init__(self, *, client: docker.DockerClient, container_id: str, channel: ReplChannel,
                 config: SandboxConfig, session_id: str, executor: concurrent.futures.Executor,
                 attach: ReplChannel | None = None):
        self._client = client
        self.container_id = container_id
        # Calls go over `_channel`; `_attach` (the container's stdio) is the same object in attach
        # mode, and in socket mode stays open as the dead-man switch and death detector.
        self._channel = channel
        self._attach = attach or channel
        self.config = config
        self.session_id = session_id
        self._executor = executor
        self._lock = asyncio.Lock()
        self._destroyed = False
        self.lost_reason: str | None = None
        self.created_at = time.monotonic()

    @property
    def alive(self) -> bool:
        return (not self._destroyed and self.lost_reason is None and not self._channel.closed
                and not self._attach.closed)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    # -- creation ---------------------------------------------------------------------------------

    @staticmethod
    def container_kwargs(config: SandboxConfig, labels: dict[str, str], name: str,
                         client: docker.DockerClient,
                         endpoint: SocketEndpoint | None = None) -> dict[str, Any]:
        """Arguments for the low-level `APIClient.create_container` (it alone takes stdin_once)."""
        tmpfs_opts = config.tmpfs_options
        uid, _, gid = config.user.partition(":")
        # Numeric user: the workdir belongs to it (0700). A user name can't be resolved here,
        # so fall back to a sticky world-writable workdir.
        numeric = uid.isdigit() and (gid or uid).isdigit()
        owner = f",mode=0700,uid={uid},gid={gid or uid}" if numeric else ",mode=1777"
        host_config = client.api.create_host_config(
            network_mode=config.network_mode,
            read_only=config.read_only,
            tmpfs={
                config.workdir: f"{tmpfs_opts},size={config.workdir_size}{owner}",
                "/tmp": f"{tmpfs_opts},size={config.tmp_size},mode=1777",
            },
            cap_drop=list(config.cap_drop),
            security_opt=list(config.security_opt),
            pids_limit=config.pids_limit,
            mem_limit=config.mem_limit,
            memswap_limit=config.effective_memswap_limit,
            nano_cpus=config.nano_cpus,
            init=config.init,
            # No core files (a host core_pattern pipe would run on the host); bounded fds.
            ulimits=[Ulimit(name="core", soft=0, hard=0),
                     Ulimit(name="nofile", soft=config.nofile_limit, hard=config.nofile_limit)],
            # The protocol flows through stdout: don't have dockerd write it to disk too.
            log_config=LogConfig(type=LogConfig.types.NONE),
            binds=endpoint.bind if endpoint else None,
        )
        return dict(
            image=config.image,
            command=list(config.command) if config.command else None,
            name=name,
            labels=labels,
            # detach=False + stdin_open sets StdinOnce: when our attach closes (server exit,
            # crash, SIGKILL), the REPL gets EOF on stdin and exits; the container stops
            # instead of leaking.
            stdin_open=True, tty=False, detach=False,
            use_config_proxy=False,  # never inject the host's proxy settings
            working_dir=config.workdir,
            environment={"HOME": config.workdir, **(endpoint.environment if endpoint else {}),
                         **config.environment},
            user=config.user,
            hostname="sandbox",
            host_config=host_config,
        )

    @classmethod
    async def create(cls, client: docker.DockerClient, config: SandboxConfig, *, server_name: str,
                     instance_id: str, executor: concurrent.futures.Executor,
                     timeout_s: float = 30.0, session_id: str | None = None) -> "Sandbox":
        """Creates, attaches, starts and waits for the REPL's ready line. Removes the container on failure."""
        session_id = session_id or new_session_id()
        labels = {**config.labels, LABEL_MANAGED: "1", LABEL_SERVER: server_name,
                  LABEL_INSTANCE: instance_id, LABEL_SESSION: session_id}
        loop = asyncio.get_running_loop()
        endpoint = None
        if config.channel == "socket":
            endpoint = SocketEndpoint(config.socket_dir, instance_id, session_id, config.user, server_name)
            try:
                await loop.run_in_executor(executor, endpoint.open)
            except OSError as exc:
                _warn_once(f"cannot listen in socket_dir {config.socket_dir!r} ({exc}); sandboxes use the "
                           "slower attach channel (set sandbox.socket_dir to a writable folder)")
                endpoint = None
        kwargs = cls.container_kwargs(config, labels, container_name(server_name, session_id), client, endpoint)
        holder: dict[str, str] = {}

        def create_and_start() -> socket.socket:
            holder["id"] = client.api.create_container(**kwargs)["Id"]
            # Attach before start so no output can be missed, and so no read-ahead is buffered
            # inside the HTTP client when we take the socket.
            attached = client.api.attach_socket(
                holder["id"], params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            sock = _own_socket(attached)
            try:
                client.api.start(holder["id"])
            except BaseException:
                sock.close()
                raise
            return sock

        def remove() -> None:
            if "id" in holder:
                try:
                    client.api.remove_container(holder["id"], force=True)
                except docker.errors.NotFound:
                    pass
                except Exception as exc:  # noqa: BLE001
                    log.warning("could not remove failed sandbox %s: %s", holder["id"][:12], exc)

        def cleanup() -> None:
            try:
                cfut.result().close()
            except BaseException:  # noqa: BLE001 - create failed; nothing to close
                pass
            remove()

        start = loop.time()
        channel: ReplChannel | None = None
        calls: ReplChannel | None = None
        cfut = executor.submit(create_and_start)
        try:
            sock = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(cfut)), timeout_s)
            max_line = 6 * (2 * config.output_cap_bytes + 2 * config.value_cap_chars) + (1 << 16)
            channel = await ReplChannel.open(sock, name=session_id[:12], max_line_bytes=max_line)
            left = max(0.1, timeout_s - (loop.time() - start))
            ready = await asyncio.wait_for(channel.wait_ready(), left)
            calls = channel
            if endpoint is not None:
                if ready.get("channel") == "socket":
                    left = max(0.1, timeout_s - (loop.time() - start))
                    conn = await endpoint.accept(left)
                    calls = await ReplChannel.open(conn, name=session_id[:12], max_line_bytes=max_line,
                                                   framed=False)
                else:
                    _warn_once(f"a sandbox could not reach its socket ({ready.get('channel_error')}); "
                               "sandboxes use the slower attach channel. If the server runs in a container, "
                               f"mount {config.socket_dir} at the same path in it")
        except BaseException as exc:
            if calls is not None and calls is not channel:
                await calls.close()
            if channel is not None:
                await channel.close()
            # If the SDK call is still blocked, this waits for it in the executor, then cleans up.
            await asyncio.shield(loop.run_in_executor(executor, cleanup))
            if isinstance(exc, asyncio.TimeoutError):
                raise SandboxError(f"sandbox did not become ready within {timeout_s:.1f} s") from None
            if isinstance(exc, docker.errors.ImageNotFound):
                raise SandboxError(f"sandbox image {config.image!r} not found") from exc
            if isinstance(exc, ChannelClosed):
                raise SandboxError(f"sandbox REPL died during start-up: {exc}") from exc
            if isinstance(exc, (docker.errors.DockerException, OSError)):
                raise SandboxError(f"could not start sandbox: {exc}") from exc
            raise
        finally:
            if endpoint is not None:
                endpoint.close()  # the accepted connection lives on; nothing else may connect
        return cls(client=client, container_id=holder["id"], channel=calls, config=config,
                   session_id=session_id, executor=executor, attach=channel)

    # -- calls ------------------------------------------------------------------------------------

    async def execute(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Runs code in the REPL. Never raises for anything the code does."""
        t0 = time.perf_counter()

        def ms() -> float:
            return (time.perf_counter() - t0) * 1000.0

        if not isinstance(code, str):
            return ExecResult.failure(error=f"code must be a string, not {type(code).__name__}",
                                      duration_ms=ms())
        size = len(code.encode("utf-8", "surrogatepass"))
        if size > self.config.max_code_bytes:
            return ExecResult.failure(
                error=f"code is {size} bytes; the limit is {self.config.max_code_bytes} bytes",
                duration_ms=ms())
        timeout = float(timeout_s) if timeout_s and timeout_s > 0 else self.config.exec_timeout_s
        async with self._lock:
            if not self.alive:
                # Died while idle (or earlier): same diagnosis as a death during a call.
                return self._lost_result(ms(), reason=await self._death_reason())
            request = {"code": code, "timeout": timeout, "cap": self.config.output_cap_bytes,
                       "value_cap": self.config.value_cap_chars}
            try:
                fut = await self._channel.send(request)
                interrupted = False
                done, _ = await asyncio.wait({fut}, timeout=timeout + self.config.interrupt_grace_s)
                if not done:
                    # The REPL's own alarm did not stop the code (C loop, or it caught the interrupt).
                    interrupted = True
                    await self._signal("SIGINT")
                    done, _ = await asyncio.wait({fut}, timeout=self.config.kill_grace_s)
                if not done:
                    reason = (f"code ignored the {timeout:g} s timeout and the interrupt; "
                              "sandbox killed")
                    await self._kill_and_mark_lost(reason)
                    return self._lost_result(ms(), reason=reason, timed_out=True)
                reply = fut.result()
            except ChannelClosed:
                reason = await self._death_reason()
                return self._lost_result(ms(), reason=reason)
            return self._to_result(reply, interrupted, ms())

    async def ping(self) -> float:
        """Round trip of a no-op protocol message, in ms (raises ChannelClosed if dead)."""
        t0 = time.perf_counter()
        fut = await self._channel.send({"op": "ping"})
        await fut
        return (time.perf_counter() - t0) * 1000.0

    @staticmethod
    def _to_result(reply: dict[str, Any], interrupted: bool, duration_ms: float) -> ExecResult:
        def s(key: str) -> str:
            v = reply.get(key)
            return v if isinstance(v, str) else ""

        def opt(key: str) -> str | None:
            v = reply.get(key)
            return v if isinstance(v, str) else None

        def n(key: str) -> int:
            v = reply.get(key)
            return v if isinstance(v, int) and v >= 0 else 0

        if reply.get("type") != "result":
            return ExecResult.failure(error=f"sandbox error: {opt('error') or 'malformed reply'}",
                                      duration_ms=duration_ms)
        timed_out = bool(reply.get("timed_out")) or interrupted
        error = opt("error")
        if interrupted and error and error.rstrip().endswith("KeyboardInterrupt"):
            error = error.rstrip() + "\n(interrupted by the sandbox after the timeout)\n"
        return ExecResult(
            stdout=s("stdout"), stderr=s("stderr"), value=opt("value"), error=error,
            stdout_truncated=bool(reply.get("stdout_truncated")),
            stderr_truncated=bool(reply.get("stderr_truncated")),
            timed_out=timed_out, lost=False, lost_reason=None, duration_ms=duration_ms,
            stdout_dropped=n("stdout_dropped"), stderr_dropped=n("stderr_dropped"))

    def _lost_result(self, duration_ms: float, *, reason: str | None,
                     timed_out: bool = False) -> ExecResult:
        reason = reason or "sandbox lost"
        return ExecResult.failure(error=f"The sandbox was lost: {reason}. Its state is gone.",
                                  duration_ms=duration_ms, lost=True, lost_reason=reason,
                                  timed_out=timed_out)

    # -- death ------------------------------------------------------------------------------------

    async def _signal(self, sig: str) -> None:
        try:
            await self._run(self._client.api.kill, self.container_id, signal=sig)
        except docker.errors.DockerException as exc:
            log.info("sandbox %s: %s not delivered: %s", self.session_id[:12], sig, exc)

    async def _kill_and_mark_lost(self, reason: str) -> None:
        self.lost_reason = reason
        await self._signal("SIGKILL")
        await self._channel.close()
        await self._attach.close()
        log.warning("sandbox %s lost: %s", self.session_id[:12], reason)

    async def _death_reason(self) -> str:
        """After EOF on the channel: why did the REPL die? (container.wait + inspect)."""
        if self.lost_reason:
            return self.lost_reason
        if self._destroyed:
            return "sandbox destroyed"

        def inspect() -> dict[str, Any]:
            try:
                self._client.api.wait(self.container_id, timeout=5)
            except Exception:  # noqa: BLE001 - still running (REPL closed its channel) or gone
                pass
            state = self._client.api.inspect_container(self.container_id)["State"]
            if state.get("Running"):
                self._client.api.kill(self.container_id)
            return state

        try:
            state = await self._run(inspect)
            reason = describe_exit(state, self.config.mem_limit)
        except docker.errors.NotFound:
            reason = "container removed from outside"
        except Exception as exc:  # noqa: BLE001
            reason = f"REPL channel closed ({self._channel.close_reason}); inspect failed: {exc}"
        self.lost_reason = reason
        log.warning("sandbox %s lost: %s", self.session_id[:12], reason)
        return reason

    async def destroy(self) -> None:
        """Closes the channel and force-removes the container. Idempotent; never raises."""
        if self._destroyed:
            return
        self._destroyed = True
        await self._channel.close()
        await self._attach.close()
        try:
            await self._run(self._client.api.remove_container, self.container_id, force=True)
        except docker.errors.NotFound:
            pass
        except Exception as exc:  # noqa: BLE001
            log.warning("could not remove sandbox container %s: %s", self.container_id[:12], exc)

