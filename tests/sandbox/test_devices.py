"""Devices and the read-only root under every isolation (issue 34's gVisor findings): runc, runsc, bwrap.

Under gVisor (runsc) an outside review found `/dev/fuse` and `/dev/net/tun` in the sandbox, `mknod` of a character
device in /tmp allowed (and the node then opened as that device: gVisor's tmpfs ignores `nodev`), and writes into the
read-only root answered EACCES rather than EROFS.
"""

from __future__ import annotations

import uuid

import docker
import pytest

from env_server.sandbox import PoolConfig, SandboxPool
from tests.harness import bwrap_available, runsc_missing

from .conftest import SERVER_NAME, fast_config


@pytest.fixture(scope="module", params=[
    pytest.param(("docker", "runc"), marks=pytest.mark.docker, id="runc"),
    pytest.param(("docker", "runsc"), marks=[pytest.mark.docker, pytest.mark.runsc], id="runsc"),
    pytest.param(("bwrap", "runc"), marks=pytest.mark.bwrap, id="bwrap"),
])
async def pool(request):
    backend, runtime = request.param
    if backend == "bwrap":
        if why := bwrap_available():
            pytest.skip(why)
    else:
        request.getfixturevalue("docker_ok")
        if runtime == "runsc" and (why := runsc_missing()):
            pytest.skip(why)
    p = SandboxPool(fast_config(backend, runtime=runtime),
                    PoolConfig(target_size=1, max_concurrent_creates=1, learn_demand=False),
                    server_name=f"{SERVER_NAME}-d", instance_id=f"devices-{uuid.uuid4().hex[:8]}")
    await p.start()
    assert p.ready, p.reason
    yield p
    await p.close()


@pytest.fixture
async def sandbox(pool):
    sb = await pool.acquire()
    yield sb
    await sb.destroy()


async def _value(sb, code: str):
    r = await sb.execute(code)
    assert r.ok, r
    return eval(r.value)  # noqa: S307 - the sandbox's repr of plain data


async def test_no_fuse_or_tun_device(sandbox):
    # (10, 229) is FUSE, (10, 200) TUN: whatever name is left at those paths, it must not be those devices.
    found = await _value(sandbox, """
import os
found = {}
for path in ("/dev/fuse", "/dev/net/tun"):
    try:
        st = os.stat(path)
    except OSError:
        continue
    found[path] = (os.major(st.st_rdev), os.minor(st.st_rdev))
    try:
        os.close(os.open(path, os.O_RDWR))
        found[path] += ("opened read-write",)
    except OSError as e:
        found[path] += (e.strerror,)
found""")
    assert all(v[:2] not in ((10, 229), (10, 200)) and "opened read-write" not in v for v in found.values()), found
    assert "/dev/net/tun" not in found, found


def _runsc_loads_seccomp() -> bool:
    """Whether dockerd runs runsc with --oci-seccomp: without it gVisor ignores the container's seccomp profile."""
    client = docker.from_env(timeout=10)
    try:
        runtime = (client.info().get("Runtimes") or {}).get("runsc") or {}
    finally:
        client.close()
    return "--oci-seccomp" in (runtime.get("runtimeArgs") or [])


async def test_mknod_of_a_character_device_is_refused(sandbox):
    if sandbox.config.runtime == "runsc" and not _runsc_loads_seccomp():
        # Debian's runsc (release 20221219) does not check CAP_MKNOD and its tmpfs ignores nodev; only a seccomp rule
        # can refuse it, and runsc applies none without --oci-seccomp (docs/security.md, "gVisor").
        pytest.xfail("runsc without --oci-seccomp: mknod of a character device cannot be refused")
    results = await _value(sandbox, """
import os, stat
results = {}
for name, dev in (("null", (1, 3)), ("tun", (10, 200)), ("fuse", (10, 229))):
    path = "/tmp/dev-" + name
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(*dev))
    except OSError as e:
        results[name] = e.strerror
        continue
    try:
        os.close(os.open(path, os.O_RDWR))
        results[name] = "created and opened"
    except OSError as e:
        results[name] = "created; open: " + e.strerror
# A FIFO is no device: it stays allowed, as under runc.
os.mkfifo("/tmp/fifo")
results["fifo"] = stat.S_ISFIFO(os.stat("/tmp/fifo").st_mode)
results""")
    assert results.pop("fifo") is True, results
    assert all(not v.startswith("created") for v in results.values()), (
        f"{results}: under runsc this needs dockerd's runsc runtimeArgs to carry --oci-seccomp (scripts/setup.sh) "
        "and the container's seccomp profile to refuse mknod/mknodat of S_IFCHR and S_IFBLK")


async def test_the_root_filesystem_is_read_only_whatever_the_permissions(sandbox):
    # /var/tmp is world-writable in the image: only the read-only mount can refuse a new file there (EROFS). Where the
    # sandbox's user lacks permission (/etc), gVisor checks permission first and answers EACCES, Linux EROFS (an
    # existing root-owned file opened for writing is EACCES under both: Linux too checks permission first there).
    errors = await _value(sandbox, """
import errno, os
errors = {}
for path in ("/var/tmp/x", "/etc/x", "/opt/x"):
    if os.path.ismount(os.path.dirname(path)):
        continue  # a writable place of its own (a tmpfs), not the root filesystem
    try:
        with open(path, "a"):
            pass
        errors[path] = "written"
    except OSError as e:
        errors[path] = errno.errorcode[e.errno]
errors""")
    assert errors.pop("/var/tmp/x", "EROFS") == "EROFS", errors
    allowed = {"EROFS", "EACCES"} if sandbox.config.runtime == "runsc" else {"EROFS"}
    assert set(errors.values()) <= allowed, errors
