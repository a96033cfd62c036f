"""Per-container host uids (docker/uids.py): one session cannot take another's per-user kernel quotas.

Under runc, inotify instances, POSIX message queue bytes (RLIMIT_MSGQUEUE) and pipe pages are counted per host
uid: with every container as uid 1000, session A holding them all left session B none. Each live container now
runs as a uid of its own from sandbox.uid_range_*, warm ones included. Under gVisor those quotas belong to each
sandbox's own kernel; the uids are per container all the same.
"""

from __future__ import annotations

import uuid

import docker
import pytest

from env_server.sandbox import PoolConfig, SandboxPool
from env_server.sandbox.docker.labels import selector
from env_server.sandbox.docker.uids import LABEL_UID, UidRange
from env_server.sandbox.errors import SandboxError
from tests.harness import runsc_missing

from .conftest import SERVER_NAME, fast_config

# Takes inotify instances until refused; the fds stay open in the REPL (module globals), as a hostile session's would.
INOTIFY_ALL = """
import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
held_inotify = []
while len(held_inotify) < 4096:
    fd = _libc.inotify_init1(0)
    if fd < 0:
        break
    held_inotify.append(fd)
print(len(held_inotify), os.strerror(ctypes.get_errno()))
"""

# Creates POSIX message queues (10 messages of 8 KiB: ~80 KiB each against RLIMIT_MSGQUEUE) until refused.
MQUEUE_ALL = """
import ctypes, os
_libc = ctypes.CDLL(None, use_errno=True)
class _Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
_libc.mq_open.restype = ctypes.c_int
held_mq = []
while len(held_mq) < 200:
    attr = _Attr(0, 10, 8192, 0)
    fd = _libc.mq_open(b"/q%d" % len(held_mq), os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(attr))
    if fd < 0:
        break
    held_mq.append(fd)
print(len(held_mq), os.strerror(ctypes.get_errno()))
"""

# Grows pipes to 1 MiB until refused (the per-user soft limit of pipe pages, 64 MiB by default), then says what size
# a new pipe gets and whether it may grow to 64 KiB; the pipes stay open in the REPL.
PIPES_ALL = """
import fcntl, os
held_pipes = []
while len(held_pipes) < 100:
    r, w = os.pipe()
    held_pipes += [r, w]
    try:
        fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 20)
    except OSError:
        break
r, w = os.pipe()
try:
    fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, 1 << 16)
    grown = True
except OSError:
    grown = False
print(len(held_pipes) // 2, fcntl.fcntl(w, fcntl.F_GETPIPE_SZ), grown)
"""


@pytest.fixture(scope="module", params=[
    pytest.param("runc", marks=pytest.mark.docker, id="runc"),
    pytest.param("runsc", marks=[pytest.mark.docker, pytest.mark.runsc], id="runsc"),
])
async def pool(request):
    request.getfixturevalue("docker_ok")
    if request.param == "runsc" and (why := runsc_missing()):
        pytest.skip(why)
    p = SandboxPool(fast_config("docker", runtime=request.param),
                    PoolConfig(target_size=2, max_concurrent_creates=2, learn_demand=False),
                    server_name=f"{SERVER_NAME}-u", instance_id=f"uids-{uuid.uuid4().hex[:8]}")
    await p.start()
    assert p.ready, p.reason
    yield p
    await p.close()


def _uid_labels(pool: SandboxPool) -> list[str]:
    rows = docker.from_env(timeout=30).api.containers(
        filters=selector(server=pool.server_name, instance=pool.instance_id))
    return [(r.get("Labels") or {}).get(LABEL_UID, "") for r in rows]


async def _ids(sb) -> tuple[int, int, int, str]:
    r = await sb.execute("import os; s = os.stat('.'); (os.getuid(), os.getgid(), s.st_uid, oct(s.st_mode & 0o777))")
    assert r.ok, r
    return eval(r.value)  # noqa: S307 - our own tuple of ints and a str


async def test_each_live_container_has_its_own_uid_and_owns_its_workdir(pool):
    config = pool.sandbox_config
    a, b = await pool.acquire(), await pool.acquire()
    try:
        ids = [await _ids(a), await _ids(b)]
        for uid, gid, owner, mode in ids:
            assert config.uid_range_start <= uid < config.uid_range_start + config.uid_range_size, ids
            assert gid == uid and owner == uid and mode == "0o700", ids
        assert ids[0][0] != ids[1][0], ids
        # The warm pool's pre-started containers hold uids too, none of them A's or B's.
        held = _uid_labels(pool)
        assert "" not in held and len(held) == len(set(held)), held
        assert {str(ids[0][0]), str(ids[1][0])} <= set(held), held
    finally:
        await a.destroy()
        await b.destroy()


async def test_one_session_cannot_take_anothers_inotify_instances_mqueue_bytes_or_pipe_pages(pool):
    a, b = await pool.acquire(), await pool.acquire()
    try:
        # Queues first: under gVisor inotify has no per-user cap, and A's loop then ends at its nofile limit.
        queues = (await a.execute(MQUEUE_ALL)).stdout.split()
        assert int(queues[0]) > 0, queues
        queues_b = (await b.execute(MQUEUE_ALL)).stdout.split()
        # B still gets as many queues while A holds all the bytes its uid may have (RLIMIT_MSGQUEUE, 800 KiB).
        assert int(queues_b[0]) >= int(queues[0]), (queues, queues_b)

        # Pipe pages: with A over its uid's soft limit, A's new pipes are cut to 8 KiB; B's still get 64 KiB.
        pipes_a, pipes_b = (await a.execute(PIPES_ALL)).stdout.split(), (await b.execute(PIPES_ALL)).stdout.split()
        assert pipes_b[1:] == ["65536", "True"], (pipes_a, pipes_b)

        taken = (await a.execute(INOTIFY_ALL)).stdout.split()
        assert int(taken[0]) >= 1, taken
        got = (await b.execute(INOTIFY_ALL)).stdout.split()
        # B still gets instances while A holds every one its uid may have (128 by default under runc).
        assert int(got[0]) >= min(int(taken[0]), 100), (taken, got)
    finally:
        await a.destroy()
        await b.destroy()


async def test_a_removed_container_gives_its_uid_back(pool):
    uids = pool.backend.uids
    sb = await pool.acquire()
    uid = (await _ids(sb))[0]
    assert uids.holds(uid) and str(uid) in _uid_labels(pool)
    await sb.destroy()
    assert not uids.holds(uid) and str(uid) not in _uid_labels(pool)


def test_uid_range_hands_out_each_uid_once_and_says_when_full():
    r = UidRange(5000, 3)
    taken = {holder: r.take(holder) for holder in "abc"}  # next-fit from a random point of the range
    assert sorted(taken.values()) == [5000, 5001, 5002]
    with pytest.raises(SandboxError, match="widen sandbox.uid_range_size"):
        r.take("d")
    r.release(taken["b"], "b")
    assert r.take("d") == taken["b"]
    r.release(taken["b"], "b")  # a second release by its earlier holder (a sweep) leaves d's uid held
    assert r.holds(taken["b"])
    r.release(str(taken["a"]), "a")
    r.skip_foreign([str(taken["a"]), "junk"])
    with pytest.raises(SandboxError):
        r.take("e")  # a's uid is now held by another server's live container


def test_every_backend_of_a_server_takes_from_one_range():
    from env_server.sandbox.docker.backend import DockerBackend

    config = fast_config("docker", uid_range_start=7000, uid_range_size=2)
    python, scientific = (DockerBackend(config, server_name="s", instance_id="i") for _ in range(2))
    assert python.uids is scientific.uids  # the pools of two images never hand out the same uid
    assert {python.uids.take("a"), scientific.uids.take("b")} == {7000, 7001}
    assert DockerBackend(fast_config("docker", uid_range_size=0), server_name="s", instance_id="i").uids is None
