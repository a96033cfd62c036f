"""The fast channel's host end: one listening unix socket per sandbox.

Layout: <socket_dir>/<instance_id>/<session_id[:16]>/repl.sock on the host, bind-mounted read-only
at /run/tito in the sandbox. The REPL connects at start-up and presents a one-time token; the
host accepts exactly that one connection, then removes the socket and its folder, so nothing else
can connect later. (Connecting to a socket needs no write access to its mount, so the sandbox gets
no writable host path.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shutil
import socket
from pathlib import Path

from ..runtime import repl_protocol as protocol

log = logging.getLogger(__name__)

_SERVER_MARK = ".server"


class SocketEndpoint:
    def __init__(self, root: str, instance_id: str, session_id: str, user: str, server_name: str):
        self.instance_dir = Path(root) / instance_id
        self.host_dir = self.instance_dir / session_id[:16]
        self.path = self.host_dir / "repl.sock"
        self.token = secrets.token_hex(16)
        self._server_name = server_name
        self._user = user
        self._listener: socket.socket | None = None

    def open(self) -> None:
        """Creates the folder and the listening socket (blocking: run it in a thread). Raises OSError."""
        if not self.instance_dir.exists():
            self.instance_dir.mkdir(parents=True, exist_ok=True)
            self.instance_dir.chmod(0o755)
            (self.instance_dir / _SERVER_MARK).write_text(self._server_name)
        self.host_dir.mkdir(mode=0o700)
        uid, _, gid = self._user.partition(":")
        if uid.isdigit() and os.geteuid() == 0:
            # Only the sandbox's user (and root) can reach the socket.
            os.chown(self.host_dir, int(uid), int(gid or uid))
        else:
            self.host_dir.chmod(0o755)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(str(self.path))
            os.chmod(self.path, 0o666)
            listener.listen(1)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener

    @property
    def environment(self) -> dict[str, str]:
        return {protocol.ENV_SOCKET: protocol.SANDBOX_SOCKET_PATH, protocol.ENV_TOKEN: self.token}

    @property
    def bind(self) -> dict[str, dict[str, str]]:
        return {str(self.host_dir): {"bind": protocol.SANDBOX_SOCKET_DIR, "mode": "ro"}}

    async def accept(self, timeout_s: float) -> socket.socket:
        """The REPL's connection, after checking its token. Raises OSError / TimeoutError."""
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        conn, _ = await asyncio.wait_for(loop.sock_accept(self._listener), timeout_s)
        try:
            line = await asyncio.wait_for(_read_line(loop, conn), timeout_s)
            message = protocol.decode(line)
            token = message.get("token") if message.get("type") == "hello" else None
            if not (isinstance(token, str) and secrets.compare_digest(token, self.token)):
                raise OSError("the connection on the sandbox socket did not present the sandbox's token")
        except BaseException:
            conn.close()
            raise
        return conn

    def close(self) -> None:
        """Stops listening and removes the folder (the accepted connection lives on)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        shutil.rmtree(self.host_dir, ignore_errors=True)


async def _read_line(loop: asyncio.AbstractEventLoop, conn: socket.socket, limit: int = 4096) -> bytes:
    data = b""
    while b"\n" not in data:
        chunk = await loop.sock_recv(conn, 1024)
        if not chunk or len(data) > limit:
            raise OSError("the sandbox closed its socket before saying hello")
        data += chunk
    head, _, rest = data.partition(b"\n")
    if rest:
        raise OSError("unexpected data after the sandbox's hello")
    return head


def remove_instance_dirs(root: str, server_name: str, *, keep: str | None = None, only: str | None = None) -> int:
    """Removes socket folders of this server name: all but `keep` (start-up sweep), or just `only`."""
    base = Path(root)
    if not base.is_dir():
        return 0
    removed = 0
    for d in base.iterdir():
        mark = d / _SERVER_MARK
        try:
            owner = mark.read_text()
        except OSError:
            continue
        if owner != server_name or d.name == keep or (only is not None and d.name != only):
            continue
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    return removed
