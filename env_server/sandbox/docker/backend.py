"""The Docker backend: one hardened container per sandbox, through the Docker daemon (docker-py).

Containers carry tito's labels (labels.py), which is how sweeps find what a server left; a sandbox starts in
the named steps of startup.py; calls go over a per-sandbox unix socket (socket_channel.py) or the container's
attached stdio. Every docker-py call blocks: they run in the pool's executor.
"""

from __future__ import annotations

import concurrent.futures
import logging

import docker
import docker.errors

from ..backend import SandboxBackend, StartedSandbox
from ..config import BUILD_HINT, SandboxConfig
from ..disk import guard_for
from ..errors import BackendUnavailable, SandboxError
from .container import ContainerHandle
from .labels import LABEL_INSTANCE, LABEL_SESSION, selector
from .socket_channel import remove_instance_dirs
from .startup import SandboxStart
from .uids import LABEL_UID, shared_range

log = logging.getLogger(__name__)
_warned_seccomp = False  # once per process, not per pool


class DockerBackend(SandboxBackend):
    name = "docker"

    def __init__(self, config: SandboxConfig, *, server_name: str, instance_id: str, connections: int = 16) -> None:
        super().__init__(config, server_name=server_name, instance_id=instance_id)
        self._connections = connections
        self._client: docker.DockerClient | None = None
        # Each live container's own host uid (uids.py); none where the range is empty (all run as sandbox.user).
        self.uids = shared_range(config.uid_range_start, config.uid_range_size) if config.uid_range_size else None

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = docker.from_env(max_pool_size=self._connections, timeout=60)
        return self._client

    def probe(self, image: str) -> None:
        try:
            self.client.ping()
            self.client.api.inspect_image(image)
            self._skip_foreign_uids()
            runtime = self.config.runtime
            if self.disk is None or runtime != "runc":
                info = self.client.info()
                if self.disk is None:
                    self.disk = guard_for(info.get("DockerRootDir"), "Docker's data root", override=self.config.disk_path,
                                          min_free_mb=self.config.min_free_disk_mb)
            if runtime != "runc":
                known = (info.get("Runtimes") or {}).keys()
                if runtime not in known:
                    raise BackendUnavailable(
                        f"the Docker daemon has no runtime {runtime!r} (it has: {', '.join(sorted(known))}); for "
                        "gVisor run TITO_SANDBOX_RUNTIME=runsc scripts/setup.sh, which installs runsc and "
                        "registers it with dockerd, or set sandbox.runtime=runc")
                self._warn_unfiltered(runtime, info["Runtimes"][runtime])
        except docker.errors.ImageNotFound:
            raise BackendUnavailable(f"sandbox image {image!r} not found; {BUILD_HINT}", missing_image=True) from None
        except (docker.errors.DockerException, OSError) as exc:
            raise BackendUnavailable(
                f"Docker daemon unreachable ({exc}); start dockerd or set DOCKER_HOST, and make sure the image "
                f"{image!r} exists ({BUILD_HINT}); or run sandboxes without Docker: sandbox.backend=bwrap "
                "(docs/setup.md)") from None
        self.check_disk()

    def _warn_unfiltered(self, runtime: str, registered: dict) -> None:
        """gVisor applies the container's seccomp profile only with --oci-seccomp: say so once."""
        global _warned_seccomp
        if runtime != "runsc" or "--oci-seccomp" in (registered.get("runtimeArgs") or []) or _warned_seccomp:
            return
        _warned_seccomp = True
        log.warning("dockerd runs runsc without --oci-seccomp: gVisor ignores the sandboxes' seccomp profile, so what "
                    "only the profile refuses (mknod of character devices, which this gVisor allows without "
                    "CAP_MKNOD) is not refused (docs/security.md, gVisor)")

    def missing_task_image(self, quoted_image: str) -> str:
        return (f"the task image {quoted_image} is not on this server's Docker daemon; build it on that daemon "
                "from the sandbox image, offline (the recipe: sandbox_images/task/Dockerfile; scripts/build_task_images.sh "
                "builds the example tasks)")

    async def start(self, config: SandboxConfig, *, session_id: str, executor: concurrent.futures.Executor,
                    timeout_s: float) -> StartedSandbox:
        uid = self.uids.take(session_id) if self.uids is not None else None
        start = SandboxStart(self.client, config, server_name=self.server_name, instance_id=self.instance_id,
                             session_id=session_id, executor=executor, uid=uid)
        try:
            await start.run(timeout_s)
        except BaseException as exc:
            await start.abort()
            if self.uids is not None:
                self.uids.release(uid, session_id)
            if isinstance(exc, docker.errors.ImageNotFound):
                raise SandboxError(f"sandbox image {config.image!r} not found") from exc
            if isinstance(exc, docker.errors.DockerException):
                raise SandboxError(f"could not start sandbox: {exc}") from exc
            raise
        finally:
            start.close_endpoint()
        assert start.container is not None and start.calls is not None and start.attach is not None
        if self.uids is not None:
            start.container.on_removed = lambda: self.uids.release(uid, session_id)
        return StartedSandbox(handle=start.container, calls=start.calls, watch=start.attach)

    def sweep(self, *, keep_instance: str | None = None, only_instance: str | None = None) -> int:
        """Force-removes the containers and socket folders of this server name (labels.selector)."""
        removed = self._remove_containers(selector(server=self.server_name, instance=only_instance),
                                          keep_instance=keep_instance)
        remove_instance_dirs(self.config.socket_dir, self.server_name, keep=keep_instance, only=only_instance)
        return removed

    def remove_stopped(self) -> int:
        return self._remove_containers({**selector(server=self.server_name, instance=self.instance_id),
                                        "status": ["exited", "dead"]})

    def _remove_containers(self, filters: dict[str, list[str]], *, keep_instance: str | None = None) -> int:
        """Force-removes the containers `filters` selects (but `keep_instance`'s); returns how many."""
        removed = 0
        api = self.client.api
        for c in api.containers(all=True, filters=filters):
            container_labels = c.get("Labels") or {}
            if keep_instance is not None and container_labels.get(LABEL_INSTANCE) == keep_instance:
                continue
            try:
                removed += ContainerHandle(api, c["Id"]).remove()
            except docker.errors.APIError as exc:
                log.warning("could not remove container %s: %s", c["Id"][:12], exc)
                continue
            if self.uids is not None and container_labels.get(LABEL_INSTANCE) == self.instance_id:
                # A removal that had failed held it.
                self.uids.release(container_labels.get(LABEL_UID), container_labels.get(LABEL_SESSION))
        return removed

    def _skip_foreign_uids(self) -> None:
        """Other servers' live containers keep their uids: this server does not hand them out (uids.py)."""
        if self.uids is None:
            return
        rows = self.client.api.containers(filters={"label": [LABEL_UID]})
        self.uids.skip_foreign(r["Labels"][LABEL_UID] for r in rows
                               if (r.get("Labels") or {}).get(LABEL_INSTANCE) != self.instance_id)

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
