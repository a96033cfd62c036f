"""The bwrap backend's walls that an outside review found thinner than Docker's (issue 34), each tried from
inside a real sandbox of a root server (this test process; the unprivileged server's side is in
tests/server/test_unprivileged.py): /proc and /dev as Docker has them, no handle back to the server from pid 1,
one host uid per sandbox (per-user kernel quotas per session), the server's log safe from what a sandbox writes,
and root filesystems no one but root can write into."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from env_server.sandbox import BackendUnavailable
from env_server.sandbox.bwrap import command, rootfs
from env_server.sandbox.bwrap.handle import StderrTail
from env_server.sandbox.bwrap.rootfs_tree import clone_tree, harden
from env_server.sandbox.bwrap.uids import UidPool
from env_server.sandbox.errors import SandboxError
from env_server.sandbox.logtext import log_safe
from tests.harness import SANDBOX_IMAGE, only_backend

pytestmark = pytest.mark.bwrap


async def _value(sb, code: str) -> str:
    r = await sb.execute(code)
    assert r.ok and not r.stderr, r
    return r.value


@only_backend("bwrap")
async def test_proc_and_dev_are_masked_and_read_only_as_docker_has_them(sandbox):
    got = await _value(sandbox, r'''
import errno, os
def write(path):
    try:
        with open(path, "w") as f:
            f.write("1\n")
        return "written"
    except OSError as e:
        return errno.errorcode[e.errno]
def read(path):
    try:
        with open(path, "rb") as f:
            return len(f.read())
    except OSError as e:
        return errno.errorcode[e.errno]
out = {"sys": write("/proc/sys/kernel/msgmax"), "pid_max": write("/proc/sys/kernel/pid_max"),
       "dev": write("/dev/planted"), "shm": write("/dev/shm/ok")}
for p in ("/proc/keys", "/proc/interrupts", "/proc/timer_list", "/proc/kcore"):
    if os.path.lexists(p):
        out[p] = read(p)
if os.path.isdir("/proc/acpi"):
    out["acpi"] = os.listdir("/proc/acpi")
out''')
    found = eval(got)  # noqa: S307 - the repr of a dict of str and int, made by the code above
    assert found.pop("sys") == "EROFS" and found.pop("pid_max") == "EROFS", got
    assert found.pop("dev") == "EROFS" and found.pop("shm") == "written", got
    assert found.pop("acpi", []) == [], got
    for path, result in found.items():  # masked: /dev/null (nodev: refused) or nothing to read
        assert result in (0, "EACCES", "ENOENT"), (path, got)


PID_1_PROBE = r'''
import ctypes, errno, os, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
SYS_pidfd_open, SYS_pidfd_getfd = 434, 438
pidfd = libc.syscall(SYS_pidfd_open, 1, 0)
taken = []
for fd in range(0, 8):
    got = libc.syscall(SYS_pidfd_getfd, pidfd, fd, 0)
    taken.append(got if got < 0 else os.readlink("/proc/self/fd/%d" % got))
# An orphan: its parent exits at once, so pid 1 must reap it.
subprocess.run(["sh", "-c", "sleep 0.2 & exit 0"])
time.sleep(0.8)
zombies = [p for p in os.listdir("/proc") if p.isdigit() and open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()[0] == "Z"]
(open("/proc/1/cmdline").read().split("\0"), os.readlink("/proc/1/exe"),
 [os.readlink("/proc/1/fd/" + fd) for fd in os.listdir("/proc/1/fd")],
 [t for t in taken if t != -1], zombies, os.getpid())'''


async def _check_pid_1(sandbox) -> list[str]:
    """What every pid 1 must do: hold nothing of the server's, name no host path, reap orphans, ignore signals
    from inside. Returns its command line."""
    got = await _value(sandbox, PID_1_PROBE)
    cmdline, exe, fds, taken, zombies, repl_pid = eval(got)  # noqa: S307 - a repr of str/int lists
    assert str(rootfs.default_rootfs_dir()) not in got and "bwrap" not in exe, got
    # Nothing of the server's (no stdin socket, no stderr pipe): /dev/null as fds 0-2, and nothing else.
    # pidfd_getfd: refused by the seccomp filter (nothing taken), or, without it, only /dev/null to take.
    assert set(fds) == {"/dev/null"} and len(fds) == 3 and set(taken) <= {"/dev/null"}, got
    assert zombies == [] and repl_pid == 2, got
    # Signals from inside do not reach the init; the session goes on, and its timeouts still interrupt.
    r = await sandbox.execute("import os, signal\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):\n"
                              "    os.kill(1, s)\n'sent'")
    assert r.ok and r.value == "'sent'", r
    r = await sandbox.execute("while True: pass", timeout_s=0.5)
    assert r.timed_out and sandbox.alive, r
    assert await _value(sandbox, "'alive'") == "'alive'"
    return cmdline


@only_backend("bwrap")
async def test_pid_1_is_a_small_init_and_holds_no_handle_back_to_the_server(sandbox):
    cmdline = await _check_pid_1(sandbox)
    # pid 1: the shell init (the images have /bin/sh), its command line the script and the REPL's.
    assert cmdline[:4] == ["/bin/sh", "-c", command.SH_INIT, "tito-init"], cmdline
    assert cmdline[4:7] == ["python3", "-I", "/opt/tito/repl_server.py"], cmdline
    # User code's processes get the default signal dispositions, as under docker-init (nothing ignored).
    ignored = await _value(sandbox, "import subprocess\nsubprocess.run(['grep', 'SigIgn', '/proc/self/status'], "
                                    "capture_output=True, text=True).stdout.split()[1]")
    assert ignored == "'0000000000000000'", ignored
    # The REPL's exit status is the sandbox's: the init passes it on.
    await sandbox.execute("import os\nos._exit(7)")
    info = await asyncio.get_running_loop().run_in_executor(None, sandbox.handle.exit_info, 5.0)
    assert not info.running and info.exit_code == 7, info


@only_backend("bwrap")
async def test_in_an_image_without_a_shell_the_repl_forks_its_own_init(make_sandbox, monkeypatch):
    # An image without /bin/sh (a distroless one): the REPL starts as pid 1 and forks its own init instead.
    monkeypatch.setattr(command, "with_init", lambda tree, cmd: tuple(cmd))
    cmdline = await _check_pid_1(await make_sandbox())
    assert cmdline[:3] == ["python3", "-I", "/opt/tito/repl_server.py"], cmdline


def test_the_shell_init_is_used_only_where_the_image_has_an_executable_shell(tmp_path):
    repl = ("python3", "-I", "/opt/tito/repl_server.py")
    assert command.with_init(tmp_path, repl) == repl
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    (tmp_path / "usr" / "bin" / "dash").write_text("")
    os.chmod(tmp_path / "usr" / "bin" / "dash", 0o755)
    (tmp_path / "usr" / "bin" / "sh").symlink_to("/usr/bin/dash")  # absolute: resolved inside the tree
    command._has_shell.cache_clear()
    assert command.with_init(tmp_path, repl)[:2] == ("/bin/sh", "-c")


@only_backend("bwrap")
async def test_one_session_exhausting_inotify_instances_leaves_others_theirs(make_sandbox):
    if os.geteuid() != 0:
        pytest.skip("per-sandbox host uids need a root server; an unprivileged one says the quotas are shared")
    a, b = await make_sandbox(), await make_sandbox()
    assert a.handle.uid is not None and b.handle.uid is not None and a.handle.uid.uid != b.handle.uid.uid
    exhaust = ("import ctypes, ctypes.util, errno\nlibc = ctypes.CDLL(None, use_errno=True)\nheld = []\n"
               "while len(held) < 4096:\n    fd = libc.inotify_init1(0)\n    if fd < 0:\n        break\n"
               "    held.append(fd)\n(len(held), errno.errorcode.get(ctypes.get_errno()))")
    held, error = eval(await _value(a, exhaust))  # noqa: S307 - a (int, str) tuple's repr
    limit = int(open("/proc/sys/fs/inotify/max_user_instances").read())
    assert held <= limit and error == "EMFILE", (held, error)
    one = await _value(b, "import ctypes\nctypes.CDLL(None, use_errno=True).inotify_init1(0) >= 0")
    assert one == "True"


@only_backend("bwrap")
async def test_host_uids_are_given_back_when_the_sandbox_is_gone(make_sandbox, pool):
    if os.geteuid() != 0:
        pytest.skip("per-sandbox host uids need a root server")
    sb = await make_sandbox()
    lease = sb.handle.uid
    assert not lease.released and lease.uid in pool.backend._uids._held
    await sb.destroy()
    assert lease.released and lease.uid not in pool.backend._uids._held


async def test_a_sandbox_never_starts_a_line_of_the_servers_log(caplog):
    with caplog.at_level(logging.WARNING, logger="env_server.sandbox.bwrap.backend"):
        tail = StderrTail("s1")
        tail.data_received(b"oops\n2026-11-28 00:00:00 INFO health: SERVING\r\x1b[2Kmore")
        tail.data_received(b" text\n")
        tail.connection_lost(None)
        await asyncio.sleep(0)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["sandbox s1 stderr: oops",
                     "sandbox s1 stderr: 2026-11-28 00:00:00 INFO health: SERVING\\r\\x1b[2Kmore text"], lines
    assert log_safe("a\nb\u2028c") == "a\\nb\\u2028c" and log_safe(b"plain \xff") == "plain \ufffd"


def test_a_root_filesystem_others_may_write_is_refused_at_start_and_hardened_by_the_build(bwrap_ok):
    real = rootfs.load(rootfs.default_rootfs_dir(), SANDBOX_IMAGE)
    # The built root filesystem: nothing in it that anyone but root (or this user) may write.
    assert rootfs.unsafe_paths(real.path) == []
    # One built before trees were hardened (Debian's /var/tmp and /run/lock are 1777): refused, saying how. The
    # copy sits beside the real one (hard links need the same filesystem).
    copy_dir = Path(tempfile.mkdtemp(prefix=".test-walls-", dir=rootfs.default_rootfs_dir()))
    try:
        where = rootfs.image_dir(copy_dir, SANDBOX_IMAGE)
        where.mkdir(parents=True)
        clone_tree(real.path, where / rootfs.TREE)
        (where / rootfs.METADATA).write_bytes((real.path.parent / rootfs.METADATA).read_bytes())
        for rel in ("var/tmp", "run/lock"):
            os.chmod(where / rootfs.TREE / rel, 0o1777)
        with pytest.raises(BackendUnavailable) as refused:
            rootfs.load(copy_dir, SANDBOX_IMAGE)
        said = str(refused.value)
        assert "var/tmp (mode 1777" in said and "run/lock" in said and "scripts/build_rootfs.sh" in said, said
        # The build's repair (a re-run of scripts/build_rootfs.sh on a current tree) takes the write bits off.
        assert sorted(harden(where / rootfs.TREE)) == ["run/lock", "var/tmp"]
        assert stat.S_IMODE((where / rootfs.TREE / "var/tmp").stat().st_mode) == 0o1755
        assert rootfs.load(copy_dir, SANDBOX_IMAGE).path == where / rootfs.TREE
    finally:
        shutil.rmtree(copy_dir, ignore_errors=True)


def test_two_servers_on_one_host_never_hand_out_the_same_sandbox_uid(tmp_path):
    first, second = UidPool(5000, 2, tmp_path), UidPool(5000, 2, tmp_path)
    a, b = first.take(), first.take()
    assert {a.uid, b.uid} == {5000, 5001}
    with pytest.raises(SandboxError, match="all 2 sandbox uids from 5000 are in use"):
        second.take()
    a.release()
    c = second.take()
    assert c.uid == a.uid and a.uid not in first._held
