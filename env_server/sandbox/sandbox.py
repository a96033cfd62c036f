"""One started sandbox running the REPL, and its persistent channel: the calls every environment makes.

Whichever backend started it (backend.py), a sandbox is spoken to the same way: requests and typed replies of
the REPL protocol over a `ReplChannel` (plain asyncio socket I/O, so a call needs no thread hop); only signals,
the diagnosis of a death and removal go to the backend's handle, whose blocking calls run in the pool's
executor.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Callable, TypeVar

from .backend import SandboxBackend, SandboxHandle, exit_reason
from .channel import ChannelClosed, ReplChannel
from .config import SandboxConfig
from .errors import SandboxError
from .result import ExecResult
from .runtime import repl_protocol as protocol

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")
# How long a lost sandbox's Step waits for the backend to say why (exit code, OOM kill) before answering without it.
_DEATH_INSPECT_S = 8.0


def new_session_id() -> str:
    return uuid.uuid4().hex


def _start_error(exc: BaseException, timeout_s: float) -> BaseException:
    """What a failed start raises: a SandboxError that says why, or the exception itself."""
    if isinstance(exc, asyncio.TimeoutError):
        return SandboxError(f"sandbox did not become ready within {timeout_s:.1f} s")
    if isinstance(exc, ChannelClosed):
        return SandboxError(f"sandbox REPL died during start-up: {exc}")
    if isinstance(exc, ValueError):
        return SandboxError(f"sandbox REPL sent a malformed ready line: {exc}")
    if isinstance(exc, OSError):
        return SandboxError(f"could not start sandbox: {exc}")
    return exc


class Sandbox:
    """A started sandbox with a ready REPL; use `Sandbox.create` (or a `SandboxPool`)."""

    def __init__(self, *, handle: SandboxHandle, channel: ReplChannel, config: SandboxConfig,
                 session_id: str, executor: concurrent.futures.Executor, watch: ReplChannel | None = None):
        self.handle = handle
        # Calls go over `_channel`; `_watch` (the REPL's stdio) is the same object when calls flow over stdio,
        # and otherwise stays open as the dead-man switch and death detector.
        self._channel = channel
        self._watch = watch or channel
        self.config = config
        self.session_id = session_id
        self._executor = executor
        self._lock = asyncio.Lock()
        self._destroyed = False
        self.lost_reason: str | None = None
        self.created_at = time.monotonic()

    @property
    def backend_id(self) -> str:
        """The backend's name for it: the container id, or the bwrap sandbox's name."""
        return self.handle.id

    @property
    def alive(self) -> bool:
        return (not self._destroyed and self.lost_reason is None and not self._channel.closed
                and not self._watch.closed)

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: fn(*args, **kwargs))

    @classmethod
    async def create(cls, backend: SandboxBackend, config: SandboxConfig, *, executor: concurrent.futures.Executor,
                     timeout_s: float = 30.0, session_id: str | None = None) -> Sandbox:
        """Starts a sandbox of `config` on `backend`; a failed start leaves nothing behind."""
        session_id = session_id or new_session_id()
        try:
            started = await backend.start(config, session_id=session_id, executor=executor, timeout_s=timeout_s)
        except BaseException as exc:
            error = _start_error(exc, timeout_s)
            if error is exc:
                raise
            raise error from (None if isinstance(exc, asyncio.TimeoutError) else exc)
        return cls(handle=started.handle, channel=started.calls, config=config, session_id=session_id,
                   executor=executor, watch=started.watch)

    # -- calls ------------------------------------------------------------------------------------

    async def execute(self, code: str, timeout_s: float | None = None) -> ExecResult:
        """Runs Python code in the REPL. Never raises for anything the code does."""
        return await self._request("code", code, timeout_s, lambda timeout: protocol.ExecRequest(
            code=code, timeout=timeout, cap=self.config.output_cap_bytes, value_cap=self.config.value_cap_chars))

    async def run_shell(self, command: str, timeout_s: float | None = None) -> ExecResult:
        """Runs a command in the session's persistent bash (repl_shell.py). Never raises for anything it does."""
        return await self._request("command", command, timeout_s, lambda timeout: protocol.ShellRequest(
            command=command, timeout=timeout, cap=self.config.output_cap_bytes))

    # -- file operations: typed replies, or SandboxError saying why not ------------------------------

    @property
    def max_file_bytes(self) -> int:
        """The largest file one request carries (base64 within sandbox.max_code_bytes)."""
        return self.config.max_code_bytes * 3 // 4 - 1024

    async def write_files(self, files: Mapping[str, bytes], *, replace: bool = False,
                          remove: Sequence[str] = ()) -> None:
        """Creates these files (relative path -> bytes, paths already checked) in the working directory, in as
        many requests as sandbox.max_code_bytes needs. An existing path is an error unless `replace` (a file or
        link there is replaced; a folder never is); `remove`: files or links deleted first. Never follows a
        link. Raises SandboxError saying why it could not (an existing path, the sandbox lost, ...)."""
        batches: list[dict[str, str]] = [{}]
        size = 0
        for path, data in files.items():
            if len(data) > self.max_file_bytes:
                raise SandboxError(f"the file {path!r} is {len(data)} bytes; one request carries at most "
                                   f"{self.max_file_bytes} (sandbox.max_code_bytes {self.config.max_code_bytes})")
            encoded = base64.b64encode(data).decode("ascii")
            if batches[-1] and size + len(encoded) > self.config.max_code_bytes:
                batches.append({})
                size = 0
            batches[-1][path] = encoded
            size += len(encoded)
        for i, batch in enumerate(batches):
            request = protocol.WriteFilesRequest(files=batch, replace=replace, remove=list(remove) if i == 0 else [])
            await self._file_op(request, protocol.FilesWritten)

    async def copy_tree(self, source: str, missing_ok: bool = False) -> int:
        """Copies the image's folder `source` into the working directory (never over an existing path); how many
        files and links it copied (0 if there is no such folder and `missing_ok`)."""
        reply = await self._file_op(protocol.CopyTreeRequest(source=source, missing_ok=missing_ok),
                                    protocol.FilesWritten)
        return reply.count

    async def hash_tree(self, skip: Sequence[str] = (), max_files: int = 100_000) -> protocol.TreeHashes:
        """Digests (sha256), sizes and link targets of the working directory's files, `skip` name patterns left
        out at any depth."""
        return await self._file_op(protocol.HashTreeRequest(skip=list(skip), max_files=max_files), protocol.TreeHashes)

    async def read_files(self, paths: Sequence[str]) -> tuple[dict[str, bytes], list[str]]:
        """The bytes of these files (relative paths) and the paths that are not regular files. The caller keeps
        each request's files within max_file_bytes all together (the reply's line limit)."""
        reply = await self._file_op(protocol.ReadFilesRequest(paths=list(paths)), protocol.FilesRead)
        return {p: base64.b64decode(v) for p, v in reply.files.items()}, list(reply.missing)

    async def edit(self, request: protocol.EditRequest) -> protocol.EditReply:
        """One command of the session's file editor (runtime/repl_editor.py)."""
        return await self._file_op(request, protocol.EditReply)

    async def _file_op(self, request: Any, expect: type[R]) -> R:
        """Sends one file operation and waits for its typed reply (sandbox.exec_timeout_s at most)."""
        async with self._lock:
            if not self.alive:
                raise SandboxError(f"sandbox lost: {await self._death_reason()}")
            try:
                fut = await self._channel.send(request)
                message = await asyncio.wait_for(fut, self.config.exec_timeout_s)
            except ChannelClosed:
                raise SandboxError(f"sandbox lost: {await self._death_reason()}") from None
            except asyncio.TimeoutError:
                raise SandboxError(f"the sandbox's {request.op} took over {self.config.exec_timeout_s:g} s") from None
        try:
            reply = protocol.parse_reply(message)
        except ValueError as exc:
            raise SandboxError(f"sandbox error: malformed reply ({exc})") from None
        if not isinstance(reply, expect):
            raise SandboxError(reply.error if isinstance(reply, protocol.ErrorReply) else f"unexpected {reply.type} reply")
        return reply

    async def _request(self, what: str, text: str, timeout_s: float | None,
                       make: Callable[[float], protocol.ExecRequest | protocol.ShellRequest]) -> ExecResult:
        """Sends one exec or shell request and waits for its reply past the timeout plus a grace;
        interrupts (SIGINT), then kills a call that ignores its timeout."""
        t0 = time.perf_counter()

        def ms() -> float:
            return (time.perf_counter() - t0) * 1000.0

        if not isinstance(text, str):
            return ExecResult.failure(error=f"{what} must be a string, not {type(text).__name__}",
                                      duration_ms=ms())
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > self.config.max_code_bytes:
            return ExecResult.failure(
                error=f"{what} is {size} bytes; the limit is {self.config.max_code_bytes} bytes",
                duration_ms=ms())
        timeout = float(timeout_s) if timeout_s and timeout_s > 0 else self.config.exec_timeout_s
        async with self._lock:
            if not self.alive:
                # Died while idle (or earlier): same diagnosis as a death during a call.
                return self._lost_result(ms(), reason=await self._death_reason())
            try:
                fut = await self._channel.send(make(timeout))
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
                    if fut.done() and not fut.cancelled():
                        fut.exception()  # the closed channel's error: known, and said as the loss
                    return self._lost_result(ms(), reason=reason, timed_out=True)
                reply = fut.result()
            except ChannelClosed:
                reason = await self._death_reason()
                return self._lost_result(ms(), reason=reason)
            return self._to_result(reply, interrupted, ms())

    async def ping(self) -> float:
        """Round trip of a no-op protocol message, in ms (raises ChannelClosed if dead)."""
        t0 = time.perf_counter()
        fut = await self._channel.send(protocol.Ping())
        await fut
        return (time.perf_counter() - t0) * 1000.0

    @staticmethod
    def _to_result(message: dict[str, Any], interrupted: bool, duration_ms: float) -> ExecResult:
        try:
            reply = protocol.parse_reply(message)
        except ValueError as exc:
            return ExecResult.failure(error=f"sandbox error: malformed reply ({exc})", duration_ms=duration_ms)
        if not isinstance(reply, protocol.ExecReply):
            detail = reply.error if isinstance(reply, protocol.ErrorReply) else f"unexpected {reply.type} reply"
            return ExecResult.failure(error=f"sandbox error: {detail}", duration_ms=duration_ms)
        error = reply.error
        if interrupted and error and error.rstrip().endswith("KeyboardInterrupt"):
            error = error.rstrip() + "\n(interrupted by the sandbox after the timeout)\n"
        return ExecResult(
            stdout=reply.stdout, stderr=reply.stderr, value=reply.value, error=error,
            stdout_truncated=reply.stdout_truncated, stderr_truncated=reply.stderr_truncated,
            timed_out=reply.timed_out or interrupted, lost_reason=None, duration_ms=duration_ms,
            stdout_dropped=max(0, reply.stdout_dropped), stderr_dropped=max(0, reply.stderr_dropped),
            value_truncated=reply.value_truncated, background_dropped=max(0, reply.background_dropped),
            cwd=reply.cwd[:4096],
            background_threads=reply.background_threads[:300], background_writers=reply.background_writers[:300],
            exit_code=reply.exit_code,
            stopped_processes=max(0, reply.stopped_processes), shell_restarted=reply.shell_restarted)

    def _lost_result(self, duration_ms: float, *, reason: str | None,
                     timed_out: bool = False) -> ExecResult:
        # No error text: the loss is reported once, from lost_reason.
        return ExecResult.failure(error=None, duration_ms=duration_ms, lost_reason=reason or "sandbox lost",
                                  timed_out=timed_out)

    # -- death ------------------------------------------------------------------------------------

    async def _signal(self, sig: str) -> None:
        try:
            await self._run(self.handle.signal, sig)
        except Exception as exc:  # noqa: BLE001 - gone already: the channel's EOF says the rest
            log.info("sandbox %s: %s not delivered: %s", self.session_id[:12], sig, exc)

    async def _kill_and_mark_lost(self, reason: str) -> None:
        self.lost_reason = reason
        await self._signal("SIGKILL")
        await self._channel.close()
        await self._watch.close()
        log.warning("sandbox %s lost: %s", self.session_id[:12], reason)

    async def _death_reason(self) -> str:
        """After EOF on the channel: why did the REPL die? (the backend's exit status, OOM kill, ...)."""
        if self.lost_reason:
            return self.lost_reason
        if self._destroyed:
            return "sandbox destroyed"
        try:
            # Bounded: a backend that hangs (dockerd shutting down holds its connections open) must not hold the Step
            # past its timeout; the blocked call finishes in its executor thread.
            info = await asyncio.wait_for(self._run(self.handle.exit_info, 5.0), _DEATH_INSPECT_S)
            reason = exit_reason(info, self.config.mem_limit_bytes)
        except SandboxError as exc:  # e.g. removed from outside
            reason = str(exc)
        except TimeoutError:
            reason = (f"REPL channel closed ({self._channel.close_reason}); the {self.config.backend} backend did not "
                      f"say why within {_DEATH_INSPECT_S:.0f} s (a daemon stopping or overloaded)")
        except Exception as exc:  # noqa: BLE001
            reason = f"REPL channel closed ({self._channel.close_reason}); inspect failed: {exc}"
        self.lost_reason = reason
        log.warning("sandbox %s lost: %s", self.session_id[:12], reason)
        return reason

    def on_death(self, listener: Callable[[], Any]) -> None:
        """Calls `listener()` when the sandbox stops being able to serve (either channel closed)."""
        self._channel.on_close(listener)
        if self._watch is not self._channel:
            self._watch.on_close(listener)

    async def close_channel(self) -> None:
        """Stops serving at once (the REPL exits on the EOF); `destroy` removes the sandbox later."""
        await self._channel.close()
        await self._watch.close()

    async def destroy(self) -> None:
        """Closes the channel and removes the sandbox (every process of it). Idempotent; never raises."""
        if self._destroyed:
            return
        self._destroyed = True
        await self._channel.close()
        await self._watch.close()
        try:
            await self._run(self.handle.remove)
        except Exception as exc:  # noqa: BLE001
            log.warning("could not remove sandbox %s: %s", self.backend_id[:12], exc)

