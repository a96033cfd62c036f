"""tito sandbox REPL server (stdlib only; runs as PID 2 under docker-init, inside the container).

It serves every operation of the wire protocol (repl_protocol.py, which the host imports too):
Python code (`exec`), commands in the session's persistent bash (`shell`, repl_shell.py) and
file creation (`write_files`), each under the same output capture, cap and timeout. The ready line always goes to the original stdout (the host reads it on the
container's attach stream); requests and replies then flow over the unix socket named by
$TITO_REPL_SOCKET (bind-mounted read-only; the first line presents the one-time token), or, if it
cannot be reached, over the same stdin/stdout — the ready line says which.

The protocol fds are private: fd 0 is /dev/null and fds 1/2 are pipes drained by reader threads
into per-call capped buffers (repl_capture.py), so neither user code, C extensions nor
subprocesses can corrupt the protocol, and output is capped while it is produced. When stdin
reaches EOF (the host went away) the REPL exits, and with it the container.
"""

import ast
import base64
import builtins
import fnmatch
import hashlib
import io
import linecache
import os
import signal
import socket
import stat
import sys
import threading
import time
import traceback

# python3 -I leaves the script's folder off sys.path: the protocol and capture modules sit beside it.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import repl_protocol as protocol  # noqa: E402
from repl_capture import BackgroundWrites, PipeCapture, ThreadRoutedStream  # noqa: E402
from repl_editor import Editor  # noqa: E402
from repl_shell import Shell  # noqa: E402

del sys.path[0]

MAIN_PID = os.getpid()
THIS_FILE = os.path.abspath(__file__)


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
        self.shell = None  # the session's bash, started by its first shell request
        self.editor = None  # the session's file editor (its undo history), made by the first edit request
        if self.workdir not in sys.path:
            sys.path.insert(0, self.workdir)  # like `python -c`: files written in the workdir are importable

        signal.signal(signal.SIGINT, self._on_sigint)
        signal.signal(signal.SIGALRM, self._on_alarm)
        # tini forwards SIGTERM to us; code that kills PID 1 should not take the session down.
        signal.signal(signal.SIGTERM, lambda signum, frame: None)
        signal.signal(signal.SIGHUP, lambda signum, frame: None)
        # The REPL's own threads (capture readers, stdin watch); any other live thread is the user's.
        self.own_threads = {t.ident for t in threading.enumerate()}

    # -- plumbing -------------------------------------------------------------------------------

    def _connect_socket(self, path, token):
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

    @staticmethod
    def _cap_text(text, cap):
        if text is None:
            return None, False
        text = text.encode("utf-8", "replace").decode("utf-8")  # drop lone surrogates
        if len(text) <= cap:
            return text, False
        return text[:cap] + "\n... [truncated %d characters]" % (len(text) - cap), True

    def _compile(self, code):
        self.exec_count += 1
        filename = "<cell-%d>" % self.exec_count
        # Register the source so tracebacks show the offending lines.
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        tree = ast.parse(code, filename, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        body = compile(tree, filename, "exec")
        expr = compile(last, filename, "eval") if last is not None else None
        return body, expr

    def _format_error(self, exc):
        tb = exc.__traceback__
        # Hide the REPL's own frames: start at the user's cell...
        while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell-"):
            tb = tb.tb_next
        if isinstance(exc, SyntaxError):
            tb = None
        te = traceback.TracebackException(type(exc), exc, tb)
        # ...and drop the signal handlers' frames that raised the interrupt inside it.
        seen = set()
        node = te
        while node is not None and id(node) not in seen:
            seen.add(id(node))
            node.stack = traceback.StackSummary.from_list(
                [f for f in node.stack if f.filename != THIS_FILE])
            node = node.__cause__ or node.__context__
        return "".join(te.format())

    def run(self, req):
        """Runs Python code; the value of a last expression comes back as its repr."""
        def body():
            code, expr = self._compile(req.code)
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
                self.shell = Shell(self.workdir)
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

    # -- files (paths relative to the working directory; the host checked them, this checks again) -------

    def _inside(self, path):
        """The absolute path of a relative path; ValueError unless every component is a plain name."""
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\x00" in path:
            raise ValueError("bad path %r" % path)
        return os.path.join(self.workdir, path)

    def _folders(self, path, make):
        """Checks (and with `make`, creates) the folders above `path`: real folders, never links.
        False when one is missing (and not made)."""
        folder = self.workdir
        for part in path.split("/")[:-1]:
            folder = os.path.join(folder, part)
            if make:
                try:
                    os.mkdir(folder, 0o755)
                    continue
                except FileExistsError:
                    pass
            if os.path.islink(folder) or not os.path.isdir(folder):
                if not make and not os.path.lexists(folder):
                    return False
                raise ValueError("%r: %r is not a folder" % (path, part))
        return True

    def write_files(self, req):
        """Creates each file (and its folders) under the working directory; never follows a link. An existing
        path is an error, or with `replace` a file or link there is removed first (a folder never is).
        `remove` deletes files or links first (a missing one is fine), and the folders that leaves empty."""
        for path in req.remove:
            full = self._inside(path)
            if self._folders(path, make=False) and os.path.lexists(full):
                if os.path.isdir(full) and not os.path.islink(full):
                    raise ValueError("%r is a folder, not a file" % path)
                os.unlink(full)
                folder = os.path.dirname(full)
                while folder != self.workdir and not os.listdir(folder):  # folders it leaves empty go too
                    os.rmdir(folder)
                    folder = os.path.dirname(folder)
        for path, data in req.files.items():
            full = self._inside(path)
            self._folders(path, make=True)
            if req.replace and os.path.lexists(full):
                if os.path.isdir(full) and not os.path.islink(full):
                    raise ValueError("%r is a folder, not a file" % path)
                os.unlink(full)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(data))
        return protocol.FilesWritten(id=req.id, count=len(req.files))

    def copy_tree(self, req):
        """Copies the image's folder `source` (files, folders, links as links, the executable bit) into the
        working directory; never over an existing path. No such folder: nothing, if `missing_ok`."""
        source = os.path.realpath(req.source)
        if not os.path.isdir(source):
            if req.missing_ok and not os.path.lexists(req.source):
                return protocol.FilesWritten(id=req.id, count=0)
            raise ValueError("%r is not a folder" % req.source)
        count = 0
        for top, folders, files in os.walk(source):
            rel = os.path.relpath(top, source)
            target = self.workdir if rel == "." else os.path.join(self.workdir, rel)
            if rel != ".":
                os.mkdir(target, 0o755)
            for name in folders + files:
                src, dst = os.path.join(top, name), os.path.join(target, name)
                if os.path.islink(src):
                    os.symlink(os.readlink(src), dst)
                    count += 1
                    if name in folders:
                        folders.remove(name)  # (os.walk does not enter it: links are copied as links)
                elif name in files and stat.S_ISREG(os.lstat(src).st_mode):
                    mode = 0o755 if os.lstat(src).st_mode & 0o111 else 0o644
                    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
                    with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
                        while True:
                            chunk = inp.read(1 << 20)
                            if not chunk:
                                break
                            out.write(chunk)
                    count += 1
        return protocol.FilesWritten(id=req.id, count=count)

    def hash_tree(self, req):
        """sha256 and size of every regular file under the working directory, the target of every link; names
        matching a `skip` pattern (files or folders, at any depth) left out; at most max_files entries."""
        reply = protocol.TreeHashes(id=req.id)
        for top, folders, files in os.walk(self.workdir):
            folders[:] = sorted(f for f in folders if not any(fnmatch.fnmatchcase(f, p) for p in req.skip))
            for name in sorted(files + [f for f in folders if os.path.islink(os.path.join(top, f))]):
                if any(fnmatch.fnmatchcase(name, p) for p in req.skip):
                    continue
                full = os.path.join(top, name)
                rel = os.path.relpath(full, self.workdir)
                if len(reply.files) + len(reply.links) + len(reply.skipped) >= req.max_files:
                    reply.truncated = True
                    return reply
                mode = os.lstat(full).st_mode
                if stat.S_ISLNK(mode):
                    reply.links[rel] = os.readlink(full)
                elif stat.S_ISREG(mode):
                    digest, size = hashlib.sha256(), 0
                    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        while True:
                            chunk = f.read(1 << 20)
                            if not chunk:
                                break
                            digest.update(chunk)
                            size += len(chunk)
                    reply.files[rel], reply.sizes[rel] = digest.hexdigest(), size
                else:
                    reply.skipped.append(rel)
            folders[:] = [f for f in folders if not os.path.islink(os.path.join(top, f))]
        return reply

    def read_files(self, req):
        """The bytes of each regular file (never through a link); others are listed as missing."""
        reply = protocol.FilesRead(id=req.id)
        root = os.path.realpath(self.workdir)
        for path in req.paths:
            full = self._inside(path)
            if not os.path.realpath(full).startswith(root + "/"):
                reply.missing.append(path)
                continue
            try:
                fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                reply.missing.append(path)
                continue
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    reply.missing.append(path)
                    continue
                reply.files[path] = base64.b64encode(f.read()).decode("ascii")
        return reply

    def edit(self, req):
        if self.editor is None:
            self.editor = Editor()
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
                error = self._format_error(exc)
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

        value, value_cut = self._cap_text(returned if keep_value else None, value_cap)
        error, error_cut = self._cap_text(error, value_cap)
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

    # file operations: (method, the errors that are the request's fault and become an ErrorReply saying why)
    _FILE_OPS = {
        protocol.WriteFilesRequest: ("write_files", "could not write the files"),
        protocol.CopyTreeRequest: ("copy_tree", "could not copy the folder"),
        protocol.HashTreeRequest: ("hash_tree", "could not list the files"),
        protocol.ReadFilesRequest: ("read_files", "could not read the files"),
        protocol.EditRequest: ("edit", "the editor failed"),
    }

    def serve_one(self, req):
        if isinstance(req, protocol.Ping):
            return protocol.Pong(id=req.id)
        if isinstance(req, protocol.ShellRequest):
            return self.run_shell(req)
        op = self._FILE_OPS.get(type(req))
        if op is not None:
            method, what = op
            try:
                return getattr(self, method)(req)
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
    Repl().serve()
