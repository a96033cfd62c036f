"""tito sandbox REPL server (stdlib only; runs as PID 2 under docker-init, inside the container, and under bwrap
as the child of its own init, repl_init.py).

It serves every operation of the wire protocol (repl_protocol.py, which the host imports too):
Python code (`exec`) and commands in the session's persistent bash (`shell`, repl_shell.py), each
under the same output capture, cap and timeout; file operations (repl_files.py) and the editor
(repl_editor.py). The ready line always goes to the original stdout (the host reads it on the
container's attach stream); requests and replies then flow over the unix socket named by
$TITO_REPL_SOCKET (bind-mounted read-only; the first line presents the one-time token), or, if it
cannot be reached, over the same stdin/stdout — the ready line says which.

The protocol fds are private: fd 0 is /dev/null and fds 1/2 are pipes drained by reader threads
into per-call capped buffers (repl_capture.py), so neither user code, C extensions nor
subprocesses can corrupt the protocol, and output is capped while it is produced. When stdin
reaches EOF (the host went away) the REPL exits, and with it the container.
"""

import builtins
import io
import os
import signal
import sys
import threading
import time

# python3 -I leaves the script's folder off sys.path: the protocol and capture modules sit beside it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repl_protocol as protocol  # noqa: E402
from repl_capture import BackgroundWrites, PipeCapture, ThreadRoutedStream  # noqa: E402
from repl_cells import cap_text, compile_cell, format_error  # noqa: E402
from repl_init import apply_rlimits, become_init_if_pid_1  # noqa: E402

del sys.path[0]

MAIN_PID = os.getpid()
THIS_FILE = os.path.abspath(__file__)


def _runtime_module(name):
    """A runtime module beside this file, loaded at its first use: the shell, the file operations and the
    editor (and what they import: subprocess, hashlib, pathlib, ...) would otherwise cost every sandbox's
    start-up, and few sessions use them all. Loaded by path under a private name, so that a module the code
    made with the same name changes nothing."""
    private = "_tito_" + name
    module = sys.modules.get(private)
    if module is None:
        import importlib.util

        path = os.path.join(os.path.dirname(THIS_FILE), name + ".py")
        spec = importlib.util.spec_from_file_location(private, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[private] = module
    return module


class TimeoutInterrupt(BaseException):
    """Raised inside user code when the call's timeout fires (BaseException: `except Exception` can't eat it)."""


class Repl:
    def __init__(self):
        # Private protocol fds (os.dup makes them non-inheritable, so subprocesses never get them).
        self.proto_in = os.fdopen(os.dup(0), "rb", buffering=1 << 16)
        self.proto_out = os.dup(1)
        self.stdio_out = self.proto_out
        self.channel, self.channel_error = protocol.CHANNEL_STDIO, None
        os.register_at_fork(after_in_child=self._after_fork_in_child)
        path = os.environ.pop(protocol.ENV_SOCKET, None)
        token = os.environ.pop(protocol.ENV_TOKEN, "")  # user code must not see it
        if path:
            self._connect_socket(path, token)

        self.devnull = os.open(os.devnull, os.O_RDONLY)
        os.set_inheritable(self.devnull, False)
        os.dup2(self.devnull, 0)
        self.out = PipeCapture(1)
        self.err = PipeCapture(2)
        self.busy = False  # a call runs: the alarm and SIGINT interrupt it
        self.capturing = False  # a call's threads write to the capture (ends under stream_lock, after busy)
        self.call_id = 0  # which call is running (or ran last); threads started during it carry it
        self.main_ident = threading.get_ident()
        self.background = BackgroundWrites()
        self.stream_lock = threading.RLock()
        self._tag_new_threads()
        self._restore_fds()
        self._install_streams()

        self.interrupted = False
        self.exec_count = 0
        self.globals = {"__name__": "__main__", "__builtins__": builtins, "__doc__": None}
        self.workdir = os.getcwd()
        self._files = None  # the working directory's file operations, made by the first file request
        self.shell = None  # the session's bash, started by its first shell request
        self.editor = None  # the session's file editor (its undo history), made by the first edit request
        if self.workdir not in sys.path:
            sys.path.insert(0, self.workdir)  # like `python -c`: files written in the workdir are importable

        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGALRM, self._on_alarm)
        # SIGQUIT comes ignored from bwrap's shell init (a background command): user code gets the default.
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)
        # tini forwards SIGTERM to us; code that kills PID 1 should not take the session down.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
        # The REPL's own threads (capture readers, stdin watch); any other live thread is the user's.
        self.own_threads = {t.ident for t in threading.enumerate()}

    # -- plumbing -------------------------------------------------------------------------------

    @property
    def files(self):
        if self._files is None:
            self._files = _runtime_module("repl_files").Workdir(self.workdir)
        return self._files

    def _connect_socket(self, path, token):
        import socket  # only the socket channel (Docker's) needs it

        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(5)
            sock.connect(path)
            sock.sendall(protocol.encode(protocol.Hello(token=token)))
            sock.settimeout(None)  # blocking again: the dup below shares the file status flags
        except OSError as exc:
            self.channel_error = "%s: %s" % (type(exc).__name__, exc)
            return
        fd = os.dup(sock.fileno())  # non-inheritable, like the other protocol fds
        sock.close()
        stdin = self.proto_in
        self.proto_in = os.fdopen(os.dup(fd), "rb", buffering=1 << 16)
        self.proto_out = fd
        self.channel = protocol.CHANNEL_SOCKET
        # stdin stays the dead-man switch: EOF there means the host went away.
        threading.Thread(target=self._exit_on_eof, args=(stdin,), name="stdin-watch", daemon=True).start()
        self._stdin_watch = stdin

    @staticmethod
    def _exit_on_eof(stream):
        try:
            while stream.read(65536):
                pass
        except OSError:
            pass
        os._exit(0)

    def _after_fork_in_child(self):
        # Another thread may have held the stream lock or a stream's buffer lock at the fork, and does not exist
        # in the child: fresh ones, or the child's first print would wait forever.
        if hasattr(self, "stdout"):
            self.stream_lock = threading.RLock()
            self._install_streams()
        # A forked child (os.fork, multiprocessing) must never speak the protocol.
        watch = getattr(self, "_stdin_watch", None)
        fds = [self.proto_out, self.proto_in.fileno(), self.stdio_out] + ([watch.fileno()] if watch else [])
        for fd in fds:
            try:
                os.close(fd)
            except OSError:
                pass

    def _restore_fds(self):
        # User code may have closed or replaced fds 0-2; put ours back.
        os.dup2(self.devnull, 0)
        os.dup2(self.out.write_fd, 1)
        os.dup2(self.err.write_fd, 2)

    def _tag_new_threads(self):
        """Marks every thread started while a call runs, by one of the call's threads, as that call's: what it
        writes through sys.stdout/sys.stderr during the call is the call's output. (Threads made with the
        low-level `_thread` module carry no mark: their writes count as background.)"""
        repl = self
        start = threading.Thread.start

        def tagged_start(thread, *args, **kwargs):
            thread._tito_call = repl.call_id if repl.in_call_thread() else 0
            return start(thread, *args, **kwargs)

        threading.Thread.start = tagged_start

    def in_call_thread(self):
        """Is the running thread one of the running call's: the one that runs it, or one started during it?"""
        if not self.capturing:
            return False
        if threading.get_ident() == self.main_ident:
            return True
        return getattr(threading.current_thread(), "_tito_call", 0) == self.call_id

    def _install_streams(self):
        def stream(fd):
            raw = io.FileIO(fd, "wb", closefd=False)
            text = io.TextIOWrapper(io.BufferedWriter(raw, 1 << 16), encoding="utf-8",
                                    errors="backslashreplace", line_buffering=True)
            return ThreadRoutedStream(text, self.in_call_thread, self.background, self.stream_lock)

        self.stdout = stream(1)
        self.stderr = stream(2)
        self.stdin = io.TextIOWrapper(io.FileIO(0, "rb", closefd=False), encoding="utf-8")
        sys.stdout, sys.stderr, sys.stdin = self.stdout, self.stderr, self.stdin
        sys.__stdout__, sys.__stderr__, sys.__stdin__ = self.stdout, self.stderr, self.stdin

    def _check_streams(self):
        # exit()/quit() close sys.stdin; user code may replace or close the others.
        for name in ("stdout", "stderr", "stdin"):
            mine = getattr(self, name)
            if getattr(sys, name) is not mine or mine.closed:
                self._install_streams()
                return

    def _on_sigint(self, signum, frame):
        # Interrupts that arrive while idle (late host SIGINT, stray kill from user code) are ignored.
        if self.busy:
            self.interrupted = True
            raise KeyboardInterrupt

    def _on_alarm(self, signum, frame):
        if self.busy:
            raise TimeoutInterrupt

    def send(self, message, fd=None):
        data = protocol.encode(message)
        try:
            while data:
                n = os.write(self.proto_out if fd is None else fd, data)
                data = data[n:]
        except OSError:
            os._exit(protocol.EXIT_CHANNEL_BROKEN)  # the host is gone: nothing left to serve

    # -- one call ---------------------------------------------------------------------------------

    def run(self, req):
        """Runs Python code; the value of a last expression comes back as its repr."""
        def body():
            self.exec_count += 1
            code, expr = compile_cell(req.code, self.exec_count)
            exec(code, self.globals)
            if expr is not None:
                result = eval(expr, self.globals)
                if result is not None:
                    self.globals["_"] = result
                    return repr(result)
            return None

        reply, _ = self._call(req, req.timeout, req.cap, req.value_cap, body)
        return reply

    def run_shell(self, req):
        """Runs a command in the session's bash (started now if this is the first)."""
        def body():
            if self.shell is None:
                self.shell = _runtime_module("repl_shell").Shell(self.workdir)
            return self.shell.run(req.command)

        reply, outcome = self._call(req, req.timeout, req.cap, req.cap, body, keep_value=False)
        if outcome is not None:
            reply.exit_code = outcome.exit_code
            reply.stopped_processes = outcome.stopped
            reply.background_dropped += outcome.stopped_output_dropped
            reply.shell_restarted = outcome.restarted
            reply.cwd = outcome.cwd
        elif reply.timed_out or reply.interrupted:
            reply.shell_restarted = True  # the shell restarts itself when interrupted mid-command
        return reply

    def edit(self, req):
        if self.editor is None:
            self.editor = _runtime_module("repl_editor").Editor()
        return self.editor.run(req)

    def _call(self, req, timeout, cap, value_cap, body, keep_value=True):
        """Runs `body()` under the call's capture, cap and timeout: (its ExecReply, what body returned).
        A value body returns is the reply's value when `keep_value` (else only handed back)."""
        cap = cap or protocol.DEFAULT_CAP
        value_cap = value_cap or cap
        returned = error = None
        timed_out = False
        self.interrupted = False
        t0 = time.perf_counter()

        self._restore_fds()
        self._check_streams()
        out_seen, out_between = self.out.begin(cap)
        err_seen, err_between = self.err.begin(cap)
        self.call_id += 1
        self.capturing = True
        try:
            try:
                self.busy = True
                if timeout:
                    signal.setitimer(signal.ITIMER_REAL, float(timeout))
                returned = body()
            finally:
                self.busy = False  # first: a late alarm/SIGINT is now ignored
                signal.setitimer(signal.ITIMER_REAL, 0)
                if os.getpid() != MAIN_PID:
                    os._exit(0)  # a child forked by user code returned into the REPL
        except TimeoutInterrupt:
            timed_out = True
            error = "TimeoutError: execution exceeded the %.3g s timeout and was interrupted" % timeout
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt included
            if os.getpid() != MAIN_PID:
                os._exit(1)
            try:
                error = format_error(exc, (THIS_FILE,))
            except BaseException:  # noqa: BLE001
                error = "%s (traceback unavailable)" % type(exc).__name__
        finally:
            self.busy = False
            with self.stream_lock:
                self.capturing = False
                for stream in (self.stdout, self.stderr):  # ours, whatever user code left in sys.stdout/stderr
                    try:
                        stream.flush_target()
                    except BaseException:  # noqa: BLE001
                        pass
            self._restore_fds()
            out = self.out.end(out_seen)
            err = self.err.end(err_seen)
            python_dropped, writers = self.background.take()

        value, value_cut = cap_text(returned if keep_value else None, value_cap)
        error, error_cut = cap_text(error, value_cap)
        reply = protocol.ExecReply(
            id=req.id,
            stdout=out.text() if out else "",
            stderr=err.text() if err else "",
            stdout_truncated=bool(out and out.dropped),
            stderr_truncated=bool(err and err.dropped),
            stdout_dropped=out.dropped if out else 0,
            stderr_dropped=err.dropped if err else 0,
            value=value,
            error=error,
            value_truncated=value_cut or error_cut,
            timed_out=timed_out,
            interrupted=self.interrupted,
            duration_ms=(time.perf_counter() - t0) * 1000.0,
            background_dropped=out_between + err_between + python_dropped,
            background_threads=self._user_threads(),
            background_writers=writers,
        )
        return reply, None if keep_value else returned

    def _user_threads(self):
        """Threads the code started that are still running (names, at most 5, capped), else ""."""
        names = [t.name for t in threading.enumerate() if t.ident not in self.own_threads]
        shown = ", ".join(n[:40] for n in names[:5])
        return shown + (" and %d more" % (len(names) - 5) if len(names) > 5 else "")

    # -- main loop --------------------------------------------------------------------------------

    # file operations: (what serves it, method, what the ErrorReply says when the request's paths are at fault)
    _FILE_OPS = {
        protocol.WriteFilesRequest: ("files", "write_files", "could not write the files"),
        protocol.CopyTreeRequest: ("files", "copy_tree", "could not copy the folder"),
        protocol.HashTreeRequest: ("files", "hash_tree", "could not list the files"),
        protocol.ReadFilesRequest: ("files", "read_files", "could not read the files"),
        protocol.EditRequest: (None, "edit", "the editor failed"),
    }

    def serve_one(self, req):
        if isinstance(req, protocol.Ping):
            return protocol.Pong(id=req.id)
        if isinstance(req, protocol.ShellRequest):
            return self.run_shell(req)
        op = self._FILE_OPS.get(type(req))
        if op is not None:
            owner, method, what = op
            try:
                return getattr(getattr(self, owner) if owner else self, method)(req)
            except (OSError, ValueError) as exc:  # an existing path, a bad base64 text, a full disk
                return protocol.ErrorReply(id=req.id, error="%s: %s" % (what, exc))
        return self.run(req)

    def serve(self):
        self.send(protocol.Ready(pid=os.getpid(), python=sys.version.split()[0], channel=self.channel,
                                 channel_error=self.channel_error), fd=self.stdio_out)
        while True:
            try:
                line = self.proto_in.readline(protocol.MAX_REQUEST_BYTES)
            except KeyboardInterrupt:
                continue
            if not line:
                os._exit(0)  # stdin EOF: the host closed the attach stream (or died)
            if not line.strip():
                continue
            try:
                req = protocol.parse_request(protocol.decode(line))
                reply = self.serve_one(req)
            except KeyboardInterrupt:
                continue
            except BaseException as exc:  # noqa: BLE001 - a bad request must not kill the REPL
                reply = protocol.ErrorReply(id=None, error="bad request: %r" % (exc,))
            self.send(reply)


if __name__ == "__main__":
    apply_rlimits(protocol.ENV_RLIMITS, protocol.decode_rlimits, protocol.EXIT_RLIMITS_FAILED)
    become_init_if_pid_1()  # under bwrap: the parent stays pid 1 as the sandbox's init (repl_init.py)
    MAIN_PID = os.getpid()
    Repl().serve()
