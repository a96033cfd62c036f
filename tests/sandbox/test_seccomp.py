"""The sandboxes' one seccomp allow-list (env_server/sandbox/seccomp): its rules at the width the kernel reads, the
facts of Docker's default profile it is held to, and the review's syscall findings refused from inside real
sandboxes (Docker under runc and gVisor, bwrap), with the profile a container got read back from dockerd."""

from __future__ import annotations

import ast
import errno
import json
import os
import random
import uuid

import docker
import pytest

from env_server.sandbox import DEFAULT_IMAGE, PoolConfig, SandboxPool
from env_server.sandbox.seccomp import bpf, docker_profile, syscalls
from tests.harness import bwrap_available

from .conftest import SERVER_NAME, fast_config

# --- Facts of Docker's default seccomp profile (moby's profiles/seccomp, as of moby 26: io_uring removed in
# moby#46762, kernel 6.5-6.7 calls added in moby#47341), for a container without capabilities.

# Allowed whatever the arguments (including ptrace and process_vm_*, which Docker allows on kernels >= 4.8).
DOCKER_ALLOWS = set("""
accept accept4 access adjtimex alarm bind brk cachestat capget capset chdir chmod chown chown32 clock_adjtime
clock_adjtime64 clock_getres clock_getres_time64 clock_gettime clock_gettime64 clock_nanosleep
clock_nanosleep_time64 close close_range connect copy_file_range creat dup dup2 dup3 epoll_create epoll_create1
epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve execveat exit
exit_group faccessat faccessat2 fadvise64 fadvise64_64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2
fchown fchown32 fchownat fcntl fcntl64 fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat
fstat64 fstatat64 fstatfs fstatfs64 fsync ftruncate ftruncate64 futex futex_requeue futex_time64 futex_wait
futex_waitv futex_wake futimesat getcpu getcwd getdents getdents64 getegid getegid32 geteuid geteuid32 getgid
getgid32 getgroups getgroups32 getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom getresgid
getresgid32 getresuid getresuid32 getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area
gettid gettimeofday getuid getuid32 getxattr inotify_add_watch inotify_init inotify_init1 inotify_rm_watch
io_cancel ioctl io_destroy io_getevents io_pgetevents io_pgetevents_time64 ioprio_get ioprio_set io_setup
io_submit ipc kill landlock_add_rule landlock_create_ruleset landlock_restrict_self lchown lchown32 lgetxattr link
linkat listen listxattr llistxattr _llseek lremovexattr lseek lsetxattr lstat lstat64 madvise map_shadow_stack
membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod mknodat mlock mlock2 mlockall mmap mmap2 mprotect
mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedreceive_time64 mq_timedsend mq_timedsend_time64 mq_unlink
mremap msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep newfstatat
_newselect open openat openat2 pause pidfd_open pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect
poll ppoll ppoll_time64 prctl pread64 preadv preadv2 prlimit64 process_mrelease pselect6 pselect6_time64 pwrite64
pwritev pwritev2 read readahead readlink readlinkat readv recv recvfrom recvmmsg recvmmsg_time64 recvmsg
remap_file_pages removexattr rename renameat renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending
rt_sigprocmask rt_sigqueueinfo rt_sigreturn rt_sigsuspend rt_sigtimedwait rt_sigtimedwait_time64 rt_tgsigqueueinfo
sched_getaffinity sched_getattr sched_getparam sched_get_priority_max sched_get_priority_min sched_getscheduler
sched_rr_get_interval sched_rr_get_interval_time64 sched_setaffinity sched_setattr sched_setparam
sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop semtimedop_time64 send sendfile
sendfile64 sendmmsg sendmsg sendto setfsgid setfsgid32 setfsuid setfsuid32 setgid setgid32 setgroups setgroups32
setitimer setpgid setpriority setregid setregid32 setresgid setresgid32 setresuid setresuid32 setreuid setreuid32
setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid setuid32 setxattr shmat shmctl
shmdt shmget shutdown sigaltstack signalfd signalfd4 sigprocmask sigreturn socketcall socketpair splice stat stat64
statfs statfs64 statx symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time timer_create
timer_delete timer_getoverrun timer_gettime timer_gettime64 timer_settime timer_settime64 timerfd_create
timerfd_gettime timerfd_gettime64 timerfd_settime timerfd_settime64 times tkill truncate truncate64 ugetrlimit umask
uname unlink unlinkat utime utimensat utimensat_time64 utimes vfork vmsplice wait4 waitid waitpid write writev
process_vm_readv process_vm_writev ptrace arch_prctl modify_ldt
""".split())
# Allowed only for some argument values: socket (any family but AF_VSOCK), personality (these personas), clone
# (none of these namespace flags).
DOCKER_SOCKET_REFUSED_FAMILIES = {40}
DOCKER_PERSONALITIES = {0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF}
DOCKER_CLONE_NAMESPACE_MASK = 0x7E020000
# Allowed only with a capability, so refused in a sandbox (it has none).
DOCKER_NEEDS_A_CAPABILITY = set("""
open_by_handle_at bpf clone3 fanotify_init fsconfig fsmount fsopen fspick lookup_dcookie mount mount_setattr
move_mount open_tree perf_event_open quotactl quotactl_fd setdomainname sethostname setns syslog umount umount2
unshare reboot chroot delete_module init_module finit_module acct kcmp pidfd_getfd process_madvise iopl ioperm
settimeofday stime clock_settime clock_settime64 vhangup get_mempolicy mbind set_mempolicy set_mempolicy_home_node
""".split())
DOCKER_ENOSYS = {"clone3": errno.ENOSYS}  # without CAP_SYS_ADMIN: libc falls back to clone
DOCKER_DEFAULT_ERRNO = errno.EPERM
# Named nowhere in Docker's profile, so refused by its default action (a sample the review and the issue name).
DOCKER_NOT_NAMED = {"add_key", "keyctl", "request_key", "userfaultfd", "move_pages", "migrate_pages", "kexec_load",
                    "kexec_file_load", "swapon", "swapoff", "open_tree_attr", "io_uring_setup", "io_uring_enter",
                    "io_uring_register", "uselib", "ustat", "sysfs", "_sysctl", "nfsservctl", "create_module",
                    "get_kernel_syms", "query_module", "vm86", "vm86old"}

# Where tito's list is stricter than Docker's, on purpose (docs/security.md says why).
STRICTER_ALWAYS = {"ptrace", "process_vm_readv", "process_vm_writev"}
STRICTER_BY_ARGUMENT = {"ioctl", "mknod", "mknodat"}  # TIOCSTI and TIOCLINUX; device nodes (gVisor does not check CAP_MKNOD)


def _native(names: set[str]) -> set[str]:
    return {n for n in names if bpf.known(n)}


# --- The list itself, without a sandbox.

def test_the_list_allows_what_docker_allows_a_container_without_capabilities():
    ours_always = {r.name for r in syscalls.RULES if not r.args}
    ours_by_argument = {r.name for r in syscalls.ARGUMENT_RULES}
    assert _native(ours_always) == _native(DOCKER_ALLOWS) - STRICTER_ALWAYS - STRICTER_BY_ARGUMENT
    assert ours_by_argument == {"socket", "personality", "clone"} | STRICTER_BY_ARGUMENT
    assert not syscalls.allowed_names() & (DOCKER_NEEDS_A_CAPABILITY - {"clone"})
    assert not syscalls.allowed_names() & DOCKER_NOT_NAMED
    assert dict(syscalls.ERRNO) == DOCKER_ENOSYS and syscalls.DEFAULT_ERRNO == DOCKER_DEFAULT_ERRNO
    for name in (DOCKER_NEEDS_A_CAPABILITY | DOCKER_NOT_NAMED | STRICTER_ALWAYS) - {"clone", "clone3"}:
        assert syscalls.decide(name) == errno.EPERM, name


def test_argument_rules_match_dockers_where_docker_filters_by_argument():
    for persona in range(0, 0x40000, 0x1000):
        for p in (persona, persona | 0x8):
            assert (syscalls.decide("personality", p) is None) == (p in DOCKER_PERSONALITIES), hex(p)
    assert syscalls.decide("personality", 0xFFFFFFFF) is None
    assert syscalls.decide("personality", 0x0400000) == errno.EPERM  # READ_IMPLIES_EXEC
    for bit in range(32):
        flags = 1 << bit | 17  # SIGCHLD in the low byte, as fork does
        assert (syscalls.decide("clone", flags) is None) == (not flags & DOCKER_CLONE_NAMESPACE_MASK), hex(flags)
    # Families: a subset of Docker's (unix, inet, inet6, netlink), never vsock.
    for family in range(64):
        allowed = any(syscalls.decide("socket", family, t) is None for t in (1, 2, 3, 5))
        if family in DOCKER_SOCKET_REFUSED_FAMILIES:
            assert not allowed
        assert allowed == (family in (1, 2, 10, 16)), family


def test_argument_rules_compare_at_the_width_the_kernel_reads():
    for rule in syscalls.ARGUMENT_RULES:
        for m in rule.args:
            assert m.mask <= 0xFFFFFFFF, rule
    for high in (1 << 32, 1 << 63, 0xFFFFFFFF00000000):
        assert syscalls.decide("socket", 40 | high, 1) == errno.EPERM  # AF_VSOCK
        assert syscalls.decide("socket", 2 | high, 1 | high) is None  # AF_INET, SOCK_STREAM
        assert syscalls.decide("socket", 2 | high, 2 | high, 1 | high) == errno.EPERM  # ping
        assert syscalls.decide("ioctl", 0, 0x5412 | high) == errno.EPERM  # TIOCSTI
        assert syscalls.decide("ioctl", 0, 0x541C | high) == errno.EPERM  # TIOCLINUX
        assert syscalls.decide("personality", 0x0400000 | high) == errno.EPERM
        assert syscalls.decide("clone", 0x10000000 | high) == errno.EPERM  # CLONE_NEWUSER


def test_ioctl_refuses_exactly_the_terminal_injection_requests():
    rng = random.Random(34)
    samples = {0x5412 ^ 1 << b for b in range(32)} | {0x541C ^ 1 << b for b in range(32)}
    samples |= {rng.getrandbits(32) for _ in range(3000)} | {0, 0xFFFFFFFF, 0x5401, 0x5413, 0x541B, 0x541D}
    for request in samples:
        assert syscalls.decide("ioctl", 0, request) is None, hex(request)
    assert len([r for r in syscalls.RULES if r.name == "ioctl"]) < 40  # the filter stays small


def test_mknod_makes_files_fifos_and_sockets_never_devices():
    for mode in (0o644, 0o100644, 0o010644, 0o140644):
        assert syscalls.decide("mknod", 0, mode) is None and syscalls.decide("mknodat", 0, 0, mode) is None, oct(mode)
    for mode in (0o020666, 0o060666, 0o020666 | 1 << 32):  # S_IFCHR, S_IFBLK, and high bits the kernel ignores
        assert syscalls.decide("mknod", 0, mode) == errno.EPERM, oct(mode)
        assert syscalls.decide("mknodat", 0, 0, mode) == errno.EPERM, oct(mode)


def test_the_gvisor_profile_lets_clone3_answer_enosys_itself():
    runc, runsc = docker_profile.profile(runtime="runc"), docker_profile.profile(runtime="runsc")
    assert {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS} in runc["syscalls"]
    assert "clone3" in runsc["syscalls"][0]["names"] and "clone3" not in runc["syscalls"][0]["names"]
    assert [e for e in runsc["syscalls"] if e["action"] != "SCMP_ACT_ALLOW"] == []


def test_ping_sockets_are_refused_and_ordinary_ones_are_not():
    SOCK_CLOEXEC, SOCK_NONBLOCK = 0x80000, 0x800
    assert syscalls.decide("socket", 2, 2, 1) == errno.EPERM
    assert syscalls.decide("socket", 10, 2 | SOCK_CLOEXEC, 58) == errno.EPERM
    for args in ((1, 1), (1, 2 | SOCK_CLOEXEC), (2, 1 | SOCK_NONBLOCK, 6), (2, 2), (2, 2, 17), (10, 1), (10, 2, 0),
                 (16, 3, 0)):
        assert syscalls.decide("socket", *args) is None, args


def test_docker_profile_and_bpf_are_generated_from_the_list():
    prof = docker_profile.profile()
    assert prof["defaultAction"] == "SCMP_ACT_ERRNO" and prof["defaultErrnoRet"] == errno.EPERM
    allowed = {n for e in prof["syscalls"] if e["action"] == "SCMP_ACT_ALLOW" for n in e["names"]}
    assert allowed == syscalls.allowed_names()
    conditional = [e for e in prof["syscalls"] if e.get("args")]
    assert len(conditional) == len(syscalls.ARGUMENT_RULES)
    assert all(a["op"] == "SCMP_CMP_MASKED_EQ" and a["value"] <= 0xFFFFFFFF for e in conditional for a in e["args"])
    assert {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS} in prof["syscalls"]
    program = bpf.compile_program()
    assert len(program) % 8 == 0 and len(program) // 8 < 4096  # cBPF's instruction limit


def test_an_operators_own_seccomp_option_is_kept():
    assert docker_profile.security_opt(["no-new-privileges"]) == [
        "no-new-privileges", "seccomp=" + docker_profile.profile_json()]
    assert docker_profile.security_opt(["seccomp=unconfined"]) == ["seccomp=unconfined"]
    with pytest.raises(RuntimeError, match="no seccomp profile for architecture 'mips'"):
        docker_profile.profile("mips")


# --- The findings, from inside real sandboxes.

# Each finding as the review ran it, through raw system calls (high bits included); the value is a dict of
# finding -> "ok" or the errno's name.
PROBE = r'''
import ctypes, errno, fcntl, os, platform, pty
NR = {"x86_64": {"socket": 41, "set_mempolicy": 238},
      "aarch64": {"socket": 198, "set_mempolicy": 237}}[platform.machine()]
NR.update(io_uring_setup=425, pidfd_open=434, pidfd_getfd=438, process_madvise=440, newer=1000)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(name, *args):
    r = libc.syscall(ctypes.c_long(NR[name]), *(ctypes.c_ulong(a) for a in args))
    if r < 0:
        return errno.errorcode[ctypes.get_errno()]
    if name != "set_mempolicy" and name != "process_madvise":
        os.close(r)
    return "ok"
def tiocsti(request):
    pid, fd = pty.fork()  # the child's controlling terminal is the pty: TIOCSTI needs no capability there
    if pid == 0:
        try:
            fcntl.ioctl(0, request, b"x")
            os._exit(0)
        except OSError as e:
            os._exit(e.errno)
    code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    os.close(fd)
    return "ok" if code == 0 else errno.errorcode.get(code, str(code))
params = ctypes.create_string_buffer(120)
pidfd = libc.syscall(ctypes.c_long(NR["pidfd_open"]), ctypes.c_long(os.getpid()), ctypes.c_long(0))
no_pidfd = "no pidfd: " + errno.errorcode.get(ctypes.get_errno(), "?")
found = {
    "vsock": sc("socket", 40, 1, 0),
    "vsock 1<<32": sc("socket", 40 | 1 << 32, 1, 0),
    "vsock 1<<63": sc("socket", 40 | 1 << 63, 1, 0),
    "ping": sc("socket", 2, 2, 1),
    "ping6": sc("socket", 10, 2, 58),
    "io_uring_setup": sc("io_uring_setup", 1, ctypes.addressof(params)),
    "pidfd_getfd": sc("pidfd_getfd", pidfd, 1, 0) if pidfd >= 0 else no_pidfd,
    "process_madvise": sc("process_madvise", pidfd, 0, 0, 20, 0) if pidfd >= 0 else no_pidfd,
    "set_mempolicy": sc("set_mempolicy", 0, 0, 0),
    "TIOCSTI": tiocsti(0x5412),
    "TIOCSTI 1<<32": tiocsti(0x5412 | 1 << 32),
}
# A call newer than the list (1000: none yet) answers ENOSYS, so libc falls back as on an older kernel.
found["call 1000"] = sc("newer")
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
found["Seccomp"] = status.get("Seccomp", "-").strip()
found
'''
FINDINGS = ("vsock", "vsock 1<<32", "vsock 1<<63", "ping", "ping6", "io_uring_setup", "pidfd_getfd",
            "process_madvise", "set_mempolicy", "TIOCSTI", "TIOCSTI 1<<32")
# Under gVisor these never reach the host kernel; gVisor refuses these itself whatever the profile.
GVISOR_REFUSES_ITSELF = ("vsock", "vsock 1<<32", "vsock 1<<63", "TIOCSTI", "TIOCSTI 1<<32")


def _runtimes() -> dict:
    client = docker.from_env(timeout=10)
    try:
        return client.info().get("Runtimes") or {}
    finally:
        client.close()


def _runsc_applies_profiles() -> bool:
    return "--oci-seccomp" in ((_runtimes().get("runsc") or {}).get("runtimeArgs") or [])


@pytest.fixture(scope="module", params=[
    pytest.param(("docker", "runc"), marks=pytest.mark.docker, id="docker-runc"),
    pytest.param(("docker", "runsc"), marks=pytest.mark.docker, id="docker-runsc"),
    pytest.param(("bwrap", "runc"), marks=pytest.mark.bwrap, id="bwrap"),
])
async def seccomp_pool(request):
    backend, runtime = request.param
    if backend == "bwrap":
        why = bwrap_available(DEFAULT_IMAGE)
        if why:
            pytest.skip(why)
    else:
        request.getfixturevalue("docker_ok")
        if runtime == "runsc" and os.environ.get("TITO_REQUIRE_RUNSC") != "1" and "runsc" not in _runtimes():
            pytest.skip("dockerd has no runsc runtime (TITO_INSTALL_RUNSC=1 scripts/setup.sh registers it)")
    p = SandboxPool(fast_config(backend, image=DEFAULT_IMAGE, runtime=runtime),
                    PoolConfig(target_size=1, max_concurrent_creates=1, learn_demand=False),
                    server_name=f"{SERVER_NAME}-sc", instance_id=f"seccomp-{uuid.uuid4().hex[:8]}")
    await p.start()
    assert p.ready, p.reason
    yield p
    await p.close()


async def _probe(sandbox) -> dict[str, str]:
    r = await sandbox.execute(PROBE, timeout_s=20)
    assert r.ok, r
    return ast.literal_eval(r.value)


async def test_every_syscall_finding_is_refused_inside_a_sandbox(seccomp_pool):
    sb = await seccomp_pool.acquire()
    try:
        found = await _probe(sb)
    finally:
        await sb.destroy()
    if sb.config.runtime == "runsc":
        for name in GVISOR_REFUSES_ITSELF:
            assert found[name] != "ok", (name, found)
        if not _runsc_applies_profiles():
            pytest.skip(f"runsc applies the sandbox's profile only with --oci-seccomp (scripts/setup.sh sets it); "
                        f"without it: {found}")
        assert all(found[name] != "ok" for name in FINDINGS), found
        return
    # runc and bwrap: refused by the filter itself (EPERM, the list's answer), not by chance elsewhere.
    assert {name: found[name] for name in FINDINGS} == {name: "EPERM" for name in FINDINGS}, found
    assert found["Seccomp"] == "2", found  # filter mode
    assert found["call 1000"] == "ENOSYS", found


# Calls whose refusal the kernel would never answer with EPERM itself: ioctl on no file (EBADF when allowed) and
# socket's families, types and protocols (allowed ones succeed or fail with EAFNOSUPPORT, EPROTONOSUPPORT, ...).
MATRIX = r'''
import ctypes, errno, os, platform
SOCKET = {"x86_64": 41, "aarch64": 198}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def sc(nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *(ctypes.c_ulong(a) for a in args))
    if r >= 0:
        os.close(r) if nr == SOCKET else None
        return "ok"
    return errno.errorcode[ctypes.get_errno()]
[[sc(16 if platform.machine() == "x86_64" else 29, 2**32 - 1, r) for r in REQUESTS],
 [sc(SOCKET, *a) for a in SOCKETS]]
'''


async def test_the_compiled_filter_decides_as_the_list_does(seccomp_pool):
    if seccomp_pool.sandbox_config.runtime == "runsc" and not _runsc_applies_profiles():
        pytest.skip("runsc applies the sandbox's profile only with --oci-seccomp (scripts/setup.sh sets it)")
    rng = random.Random(7)
    requests = [0x5412, 0x541C, 0x5412 | 1 << 32, 0x541C | 1 << 63, 0x5413, 0x5411, 0x5401, 0x541D]
    requests += [0x5412 ^ 1 << b for b in range(32)] + [rng.getrandbits(64) for _ in range(200)]
    sockets = [(f, t, p) for f in range(48) for t in (1, 2, 3, 5) for p in (0, 1, 17, 58)]
    sockets += [(40 | 1 << 40, 1, 0), (2 | 1 << 40, 1 | 0x80000, 0), (2, 2 | 0x800, 1 | 1 << 32), (10, 2 | 1 << 33, 17)]
    sb = await seccomp_pool.acquire()
    try:
        r = await sb.execute(f"REQUESTS = {requests!r}\nSOCKETS = {sockets!r}\n" + MATRIX, timeout_s=30)
    finally:
        await sb.destroy()
    assert r.ok, r
    ioctls, socks = ast.literal_eval(r.value)
    for request, got in zip(requests, ioctls):
        assert (got == "EPERM") == (syscalls.decide("ioctl", 2**32 - 1, request) == errno.EPERM), (hex(request), got)
    for args, got in zip(sockets, socks):
        assert (got == "EPERM") == (syscalls.decide("socket", *args) == errno.EPERM), (args, got)
    assert ioctls.count("EPERM") == 4 and "EPERM" in socks and "ok" in socks  # TIOCSTI, TIOCLINUX, high bits


async def test_a_container_gets_tito_s_profile_not_the_daemon_s_default(seccomp_pool):
    """Docker: the container's profile is the generated one, and in force. bwrap has no daemon default to replace:
    there the check is that the process runs under tito's filter (mode 2) and io_uring is refused."""
    sb = await seccomp_pool.acquire()
    opts: list[str] = []
    try:
        if seccomp_pool.sandbox_config.backend == "docker":
            client = docker.from_env(timeout=30)
            try:
                opts = client.api.inspect_container(sb.backend_id)["HostConfig"]["SecurityOpt"]
            finally:
                client.close()
        r = await sb.execute("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
                             "status = open('/proc/self/status').read()\n"
                             "(libc.syscall(425, 1, ctypes.create_string_buffer(120)), ctypes.get_errno(), "
                             "[l for l in status.splitlines() if l.startswith('Seccomp')])")
    finally:
        await sb.destroy()
    if seccomp_pool.sandbox_config.backend == "bwrap":
        rc, err, seccomp_lines = ast.literal_eval(r.value)
        assert rc == -1 and err == errno.EPERM and "Seccomp:\t2" in seccomp_lines, r.value
        return
    profiles = [o.split("=", 1)[1] for o in opts if o.startswith("seccomp=")]
    assert len(profiles) == 1 and json.loads(profiles[0]) == docker_profile.profile(runtime=sb.config.runtime), opts
    assert "no-new-privileges" in opts
    rc, err, seccomp_lines = ast.literal_eval(r.value)
    if sb.config.runtime == "runc":
        # io_uring_setup: the 20.10 daemon's own default profile allows it; this one refuses it.
        assert rc == -1 and err == errno.EPERM, r.value
        assert "Seccomp:\t2" in seccomp_lines, r.value
        assert any(line.startswith("Seccomp_filters:\t") and int(line.split()[-1]) >= 1 for line in seccomp_lines)
    elif _runsc_applies_profiles():
        assert rc == -1 and err == errno.EPERM, r.value
