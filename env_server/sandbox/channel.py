"""Newline-delimited JSON channel to the REPL: over the container's attached stdio (hijacked
Docker socket), or over a unix socket the host listens on.

On the attach stream (framed=True), with tty=False, Docker multiplexes the container's stdout and
stderr as frames: an 8-byte header (stream type, 3 zero bytes, big-endian payload length) and the
payload. What we write goes to the container's stdin unframed. The unix socket carries plain lines. All I/O runs on the event loop; one reader
task per channel demultiplexes frames and resolves the pending request futures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from typing import Any, Callable

from .logtext import log_safe
from .runtime import repl_protocol as protocol

log = logging.getLogger(__name__)

STDOUT, STDERR = 1, 2
_STDERR_LOG_CAP = 8 * 1024  # the REPL's own stderr is diagnostic only; keep the log bounded
_MAX_UNSOLICITED = 16


class ChannelClosed(Exception):
    """The channel reached EOF or was closed; the REPL is gone (or unreachable)."""


class ReplChannel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                 name: str, max_line_bytes: int, framed: bool = True):
        self._framed = framed
        self._reader = reader
        self._writer = writer
        self.name = name
        self._max_line = max_line_bytes
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self._ready: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._linebuf = bytearray()
        self._stderr_logged = 0
        self._unsolicited = 0
        self.closed = False
        self.close_reason: str | None = None
        self._close_listeners: list[Callable[[], Any]] = []
        self._task = asyncio.get_running_loop().create_task(self._read_loop(), name=f"chan-{name}")

    @classmethod
    async def open(cls, sock: socket.socket, *, name: str, max_line_bytes: int,
                   framed: bool = True) -> "ReplChannel":
        reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 20)
        return cls(reader, writer, name=name, max_line_bytes=max_line_bytes, framed=framed)

    # -- reading ----------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        reason = "EOF on the container's attach stream"
        try:
            while not self._framed:
                data = await self._reader.read(1 << 16)
                if not data:
                    raise asyncio.IncompleteReadError(b"", None)
                self._feed(data)
            while True:
                header = await self._reader.readexactly(8)
                size = int.from_bytes(header[4:8], "big")
                payload = await self._reader.readexactly(size) if size else b""
                if header[0] == STDOUT:
                    self._feed(payload)
                elif header[0] == STDERR:
                    self._log_stderr(payload)
                else:
                    raise ValueError(f"unexpected stream type {header[0]} in attach stream")
        except asyncio.IncompleteReadError:
            pass
        except asyncio.CancelledError:
            reason = "channel closed"
        except (OSError, ValueError) as exc:
            reason = f"channel error: {exc}"
        except Exception as exc:  # noqa: BLE001 - whatever the sandbox sends must not kill the reader silently
            reason = f"channel error: {type(exc).__name__}: {exc}"
        self._shutdown(reason)

    def _feed(self, data: bytes) -> None:
        buf = self._linebuf
        buf += data
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            if line.strip():
                self._dispatch(line)
        if len(buf) > self._max_line:
            raise ValueError(f"reply line exceeds {self._max_line} bytes")

    def _dispatch(self, line: bytes) -> None:
        try:
            msg = protocol.decode(line)
        except ValueError:
            raise ValueError(f"malformed reply: {line[:200]!r}") from None
        if msg.get("type") == "ready":
            if not self._ready.done():
                self._ready.set_result(msg)
            return
        rid = msg.get("id")
        fut = self._pending.pop(rid, None) if type(rid) is int else None
        if fut is not None and not fut.done():
            fut.set_result(msg)
            return
        # Code in the sandbox can write to the protocol fd; a few stray lines are tolerated (and
        # logged once), a stream of them is a protocol violation that ends the sandbox.
        self._unsolicited += 1
        if self._unsolicited == 1:
            log.warning("sandbox %s: unexpected message on the channel: %s", self.name, line[:200])
        if self._unsolicited > _MAX_UNSOLICITED:
            raise ValueError(f"protocol violation: more than {_MAX_UNSOLICITED} unexpected messages from the sandbox")

    def _log_stderr(self, data: bytes) -> None:
        if self._stderr_logged < _STDERR_LOG_CAP:
            chunk = data[: _STDERR_LOG_CAP - self._stderr_logged]
            self._stderr_logged += len(chunk)
            # Escaped: the container writes these bytes, and must never start a line of the server's log.
            log.warning("sandbox %s REPL stderr: %s", self.name, log_safe(chunk))

    def on_close(self, listener: Callable[[], Any]) -> None:
        """Calls `listener()` once, when the channel closes (at once if it already has)."""
        if self.closed:
            listener()
        else:
            self._close_listeners.append(listener)

    def _shutdown(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        for listener in self._close_listeners:
            listener()
        self._close_listeners.clear()
        exc = ChannelClosed(reason)
        if not self._ready.done():
            self._ready.set_exception(exc)
            self._ready.exception()  # mark retrieved: nobody may be waiting on it
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(exc)
        self._pending.clear()
        try:
            self._writer.close()
        except Exception:  # noqa: BLE001 - transport may already be gone
            pass

    # -- API --------------------------------------------------------------------------------------

    async def wait_ready(self) -> dict[str, Any]:
        return await asyncio.shield(self._ready)

    async def send(self, request: protocol.Request) -> asyncio.Future[dict[str, Any]]:
        """Writes a request (its id assigned here); returns the future of its reply, a decoded line
        for the caller to parse (fails with ChannelClosed on EOF)."""
        if self.closed:
            raise ChannelClosed(self.close_reason or "channel closed")
        self._next_id += 1
        rid = self._next_id
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = fut
        try:
            self._writer.write(protocol.encode(dataclasses.replace(request, id=rid)))
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:
            self._pending.pop(rid, None)
            self._shutdown(f"write failed: {exc}")
            raise ChannelClosed(self.close_reason or "write failed") from exc
        return fut

    async def wait_closed(self, timeout: float) -> bool:
        """Waits for EOF; True when the channel is closed."""
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
        return self.closed

    async def close(self) -> None:
        if not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._shutdown("channel closed")
