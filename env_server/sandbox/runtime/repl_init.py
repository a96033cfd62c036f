"""The REPL's start: its rlimits, and, where it is pid 1 of its sandbox, its own init.

Under bwrap (--as-pid-1) pid 1 of the sandbox is a shell as its init (bwrap/command.py, SH_INIT), which costs far
less than a forked interpreter; in an image without /bin/sh the REPL itself starts as pid 1. It forks at once: the parent
stays pid 1 as a small init, the child goes on as the REPL. The init holds no file at all (stdin, stdout and
stderr, the server's socket and pipe, are swapped for /dev/null), so nothing in the sandbox can take a handle
back to the server from it (pidfd_getfd, /proc/1/fd); its command line is the REPL's (no host path). It reaps
the orphans the sandbox leaves, ignores the signals code inside may send it, and exits with the REPL's status,
which ends the pid namespace and everything in it. Under Docker, docker-init is pid 1 and the REPL runs as it is.
"""

import os
import signal
import sys


def apply_rlimits(env_name, decode, exit_code):
    """Sets the limits $`env_name` names (decoded by `decode`), before any thread or user code exists. A limit
    that cannot be set ends the REPL (status `exit_code`): a sandbox never runs without a limit it was given."""
    text = os.environ.pop(env_name, "")
    if not text:
        return
    import resource

    try:
        for name, value in decode(text).items():
            resource.setrlimit(getattr(resource, "RLIMIT_" + name.upper()), (value, value))
    except (ValueError, OSError) as exc:
        os.write(2, ("tito REPL: cannot set rlimits %r: %s\n" % (text, exc)).encode())
        os._exit(exit_code)


def become_init_if_pid_1():
    """Where this process is pid 1: forks; returns in the child (the REPL), never in the parent (the init)."""
    if os.getpid() != 1:
        return
    try:
        child = os.fork()
    except OSError as exc:
        os.write(2, ("tito REPL: cannot fork its init: %s\n" % (exc,)).encode())
        os._exit(1)
    if child == 0:
        return
    _init(child)


def _init(repl):
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    os.closerange(3, 1 << 16)  # devnull too: nothing of the server's is left open here
    sys.stdout = sys.stderr = None  # nothing prints from here on
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == repl:
            os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))
