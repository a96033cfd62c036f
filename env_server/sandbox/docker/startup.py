"""Starting one sandbox, in named steps.

    open the socket endpoint → create, attach and start the container → open the attach channel
    → wait for the REPL's ready line → accept the REPL's socket connection (or stay on attach)

Whatever a failed or cancelled start made is removed by `abort`; the listening socket is closed
in any case once the start is over (the accepted connection lives on, nothing else may connect).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import re
import socket
from typing import Any

import docker
import docker.errors
from docker.types import LogConfig, Ulimit

from ..channel import ReplChannel
from ..config import SandboxConfig
from ..runtime import repl_protocol as protocol
from ..seccomp import docker_profile as seccomp_profile
from .container import ContainerHandle
from .labels import labels
from .socket_channel import SocketEndpoint
from .uids import LABEL_UID

log = logging.getLogger(__name__)
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def container_name(server_name: str, session_id: str) -> str:
    safe = re.sub(r"[^a-zA-Z0-9_.-]", "-", server_name)[:40] or "x"
    return f"tito-{safe}-{session_id[:16]}"


def container_kwargs(config: SandboxConfig, container_labels: dict[str, str], name: str,
                     api: docker.APIClient, endpoint: SocketEndpoint | None = None,
                     user: str | None = None) -> dict[str, Any]:
    """Arguments of `APIClient.create_container` for one hardened sandbox, running as `user` (its own host
    uid:gid, uids.py) or else `config.user`."""
    user = user or config.user
    uid, _, gid = user.partition(":")
    # Numeric user: the workdir belongs to it (0700). A user name can't be resolved here,
    # so fall back to a sticky world-writable workdir.
    numeric = uid.isdigit() and (gid or uid).isdigit()
    owner = f",mode=0700,uid={uid},gid={gid or uid}" if numeric else ",mode=1777"
    # gVisor's /dev always holds /dev/fuse and /dev/net/tun, and runsc ignores Docker's masked paths: an empty
    # read-only tmpfs hides /dev/net, the host's /dev/null (read-only) stands where /dev/fuse was.
    hide_devices = config.runtime != "runc"
    binds = {**(endpoint.bind if endpoint else {}),
             **({"/dev/null": {"bind": "/dev/fuse", "mode": "ro"}} if hide_devices else {})}
    host_config = api.create_host_config(
        network_mode=config.network_mode,
        read_only=config.read_only,
        tmpfs={
            config.workdir: f"{config.tmpfs_options},size={config.workdir_size}{owner}",
            "/tmp": f"{config.tmpfs_options},size={config.tmp_size},mode=1777",
            **({"/dev/net": "ro,nosuid,nodev,noexec,size=4k,mode=0555"} if hide_devices else {}),
        },
        cap_drop=list(config.cap_drop),
        # The sandboxes' own seccomp profile, not the daemon's version's default (sandbox/seccomp).
        security_opt=seccomp_profile.security_opt(config.security_opt, config.runtime),
        pids_limit=config.host_pids_limit,
        mem_limit=config.mem_limit,
        memswap_limit=config.effective_memswap_limit,
        nano_cpus=config.nano_cpus,
        init=config.init,
        runtime=config.runtime,
        # No core files (a host core_pattern pipe would run on the host); bounded fds.
        ulimits=[Ulimit(name="core", soft=0, hard=0),
                 Ulimit(name="nofile", soft=config.nofile_limit, hard=config.nofile_limit)],
        # The protocol flows through stdout: don't have dockerd write it to disk too.
        log_config=LogConfig(type=LogConfig.types.NONE),
        binds=binds or None,
    )
    return dict(
        image=config.image,
        command=list(config.command) if config.command else None,
        name=name,
        labels=container_labels,
        # detach=False + stdin_open sets StdinOnce: when our attach closes (server exit, crash,
        # SIGKILL), the REPL gets EOF on stdin and exits; the container stops instead of leaking.
        stdin_open=True, tty=False, detach=False,
        use_config_proxy=False,  # never inject the host's proxy settings
        working_dir=config.workdir,
        environment={"HOME": config.workdir, **(endpoint.environment if endpoint else {}), **config.environment},
        user=user,
        hostname="sandbox",
        host_config=host_config,
    )


class SandboxStart:
    """The state of one start in progress; `run` walks the steps, `abort` undoes them."""

    def __init__(self, client: docker.DockerClient, config: SandboxConfig, *, server_name: str,
                 instance_id: str, session_id: str, executor: concurrent.futures.Executor,
                 uid: int | None = None) -> None:
        self.client = client
        self.config = config
        self.server_name = server_name
        self.instance_id = instance_id
        self.session_id = session_id
        self.executor = executor
        # Its own host uid:gid from the backend's range (uids.py), or the config's user for all.
        self.uid = uid
        self.user = f"{uid}:{uid}" if uid is not None else config.user
        self.endpoint: SocketEndpoint | None = None
        self.container: ContainerHandle | None = None
        self._boot: concurrent.futures.Future[socket.socket] | None = None
        self.attach: ReplChannel | None = None  # the container's stdio: ready line, dead-man switch
        self.calls: ReplChannel | None = None  # where requests go: the socket, or the attach channel

    async def run(self, timeout_s: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s

        def left() -> float:
            left_s = deadline - loop.time()
            if left_s <= 0:
                raise asyncio.TimeoutError
            return left_s

        await self._open_endpoint()
        self._boot = self.executor.submit(self._boot_container)
        # Shielded: a timeout must not abandon the blocking call; `abort` waits for it.
        sock = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(self._boot)), left())
        self.attach = await ReplChannel.open(sock, name=self.session_id[:12],
                                             max_line_bytes=self.config.max_reply_bytes)
        timeout = left()  # before the coroutine exists: a spent deadline must not leave it never awaited
        ready = protocol.parse_ready(await asyncio.wait_for(self.attach.wait_ready(), timeout))
        self.calls = await self._accept_socket(ready, left()) or self.attach

    async def _open_endpoint(self) -> None:
        if self.config.channel != "socket":
            return
        # Kept before it opens, so a start cancelled meanwhile still removes its folder and socket.
        self.endpoint = SocketEndpoint(self.config.socket_dir, self.instance_id, self.session_id, self.user,
                                       self.server_name)
        try:
            await asyncio.get_running_loop().run_in_executor(self.executor, self.endpoint.open)
        except OSError as exc:
            _warn_once(f"cannot listen in socket_dir {self.config.socket_dir!r} ({exc}); sandboxes use the "
                       "slower attach channel (set sandbox.socket_dir to a writable folder)")
            self.endpoint.close()
            self.endpoint = None

    def _boot_container(self) -> socket.socket:
        """Create, attach, start (blocking). Attach comes before start so no output is missed."""
        api = self.client.api
        kwargs = container_kwargs(
            self.config, {**self.config.labels, **labels(self.server_name, self.instance_id, self.session_id),
                          **({LABEL_UID: str(self.uid)} if self.uid is not None else {})},
            container_name(self.server_name, self.session_id), api, self.endpoint, self.user)
        self.container = ContainerHandle.create(api, **kwargs)
        sock = self.container.attach_socket()
        try:
            self.container.start()
        except BaseException:
            sock.close()
            raise
        return sock

    async def _accept_socket(self, ready: protocol.Ready, timeout_s: float) -> ReplChannel | None:
        if self.endpoint is None:
            return None
        if ready.channel != protocol.CHANNEL_SOCKET:
            _warn_once(f"a sandbox could not reach its socket ({ready.channel_error}); sandboxes use the slower "
                       f"attach channel. If the server runs in a container, mount {self.config.socket_dir} at the "
                       "same path in it")
            return None
        conn = await self.endpoint.accept(timeout_s)
        return await ReplChannel.open(conn, name=self.session_id[:12], max_line_bytes=self.config.max_reply_bytes,
                                      framed=False)

    def close_endpoint(self) -> None:
        if self.endpoint is not None:
            self.endpoint.close()

    async def abort(self) -> None:
        """Undo a failed or cancelled start: close the channels, then remove the container."""
        for channel in {self.calls, self.attach} - {None}:
            await channel.close()
        if self._boot is not None:
            await asyncio.shield(asyncio.get_running_loop().run_in_executor(self.executor, self._remove))

    def _remove(self) -> None:
        try:  # waits for a create that is still blocked in the SDK
            self._boot.result().close()
        except BaseException:  # noqa: BLE001 - the boot failed; nothing to close
            pass
        if self.container is not None:
            try:
                self.container.remove()
            except Exception as exc:  # noqa: BLE001
                log.warning("could not remove failed sandbox %s: %s", self.container.id[:12], exc)
