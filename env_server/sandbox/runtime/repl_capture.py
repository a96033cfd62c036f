"""Capture of a call's stdout/stderr in the sandbox REPL (stdlib only).

- fd level (`PipeCapture`): fds 1/2 are pipes drained by reader threads into per-call capped buffers,
  so output is capped while it is produced; subprocesses and C code write here.
- Python level (`ThreadRoutedStream`): sys.stdout/sys.stderr route each write by the thread that
  makes it: the call's own threads (the one running the call and the threads started during the call)
  write to the capture pipe; any other thread's writes are counted in `BackgroundWrites` and dropped,
  so a thread left running by an earlier call can never crowd a call's own output out of its cap.
"""

import io
import os
import threading
import time

# Unguessable per-process marker that ends a call's output on each capture pipe.
SENTINEL = b"\x00\x1e<tito-end-" + os.urandom(12).hex().encode() + b">\x1e\x00"
SENTINEL_WAIT_S = 2.0


class CappedBuffer:
    """Keeps the first `cap` bytes of a stream and counts the rest."""

    __slots__ = ("cap", "data", "dropped")

    def __init__(self, cap):
        self.cap = cap
        self.data = bytearray()
        self.dropped = 0

    def add(self, chunk):
        room = self.cap - len(self.data)
        if room >= len(chunk):
            self.data += chunk
        else:
            if room > 0:
                self.data += chunk[:room]
            self.dropped += len(chunk) - max(room, 0)

    def text(self):
        return self.data.decode("utf-8", "replace")


class PipeCapture:
    """A pipe whose write end becomes fd 1 or 2; a thread drains it into the current call's buffer.

    Output arriving between calls (background threads/processes) is discarded and counted
    (`begin` returns the count), so the next call can say so. The end of a
    call's output is found by writing SENTINEL into the pipe: the pipe is FIFO, so everything
    written before it has been consumed once the reader sees it.
    """

    def __init__(self, target_fd):
        self.target_fd = target_fd
        r, w = os.pipe()
        self.read_fd = r
        self.write_fd = w  # private copy, re-dup2'd onto target_fd before and after every call
        self.cond = threading.Condition()
        self.sink = None
        self.seen = 0
        self.between = 0  # bytes discarded since the last call ended
        self.carry = b""
        self.thread = threading.Thread(target=self._run, name="capture-%d" % target_fd, daemon=True)
        self.thread.start()

    def _deliver(self, data):
        if not data:
            return
        if self.sink is not None:
            self.sink.add(data)
        else:
            self.between += len(data)

    def _run(self):
        slen = len(SENTINEL)
        while True:
            try:
                data = os.read(self.read_fd, 65536)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            with self.cond:
                buf = self.carry + data if self.carry else data
                while True:
                    idx = buf.find(SENTINEL)
                    if idx < 0:
                        break
                    self._deliver(buf[:idx])
                    self.sink = None
                    self.seen += 1
                    self.cond.notify_all()
                    buf = buf[idx + slen:]
                # Hold back a tail that could be the start of a sentinel split across reads.
                keep = 0
                for k in range(min(slen - 1, len(buf)), 0, -1):
                    if buf.endswith(SENTINEL[:k]):
                        keep = k
                        break
                if keep:
                    self._deliver(buf[:-keep])
                    self.carry = bytes(buf[-keep:])
                else:
                    self._deliver(buf)
                    self.carry = b""

    def begin(self, cap):
        """Starts a call's buffer; returns (the marker count, the bytes discarded since the last call)."""
        with self.cond:
            self.sink = CappedBuffer(cap)
            between, self.between = self.between, 0
            return self.seen, between

    def end(self, seen_before):
        """Marks the end of the call's output and waits until the reader has consumed it."""
        sink = self.sink
        try:
            data = SENTINEL
            while data:
                n = os.write(self.write_fd, data)
                data = data[n:]
        except OSError:
            pass
        deadline = time.monotonic() + SENTINEL_WAIT_S
        with self.cond:
            while self.seen <= seen_before:
                left = deadline - time.monotonic()
                if left <= 0:
                    # Reader did not catch up (should not happen); stop feeding this call's buffer.
                    self.sink = None
                    break
                self.cond.wait(left)
        return sink


class BackgroundWrites:
    """What threads other than the call's wrote through sys.stdout/sys.stderr: counted, never kept
    (bytes, and the names of the threads that wrote, at most MAX_NAMES of them remembered)."""

    MAX_NAMES = 64
    SHOWN = 5

    def __init__(self):
        self.lock = threading.Lock()
        self.bytes = 0
        self.names = {}  # name -> None, in order of first write

    def add(self, size, name):
        with self.lock:
            self.bytes += size
            if len(self.names) < self.MAX_NAMES:
                self.names.setdefault(name, None)

    def take(self):
        """(bytes, "name, name and N more") written since the last take; resets both."""
        with self.lock:
            size, names = self.bytes, list(self.names)
            self.bytes, self.names = 0, {}
        shown = ", ".join(n[:40] for n in names[:self.SHOWN])
        more = len(names) - self.SHOWN
        return size, shown + (" and %d%s more" % (more, "+" if len(names) >= self.MAX_NAMES else "") if more > 0 else "")


class ThreadRoutedStream(io.TextIOBase):
    """A text stream for sys.stdout/sys.stderr that sends what the call's own threads write to `target`
    (a stream on the capture pipe) and counts what any other thread writes in `background`.

    `lock` is held by every write that goes to the target, and by the REPL while it ends a call (it stops
    counting threads as the call's under it, then flushes): so no write decided "the call's" can land in the
    target's buffer after the call's end and be flushed into a later call's output."""

    def __init__(self, target, is_call_thread, background, lock):
        super().__init__()
        self._target = target
        self._is_call_thread = is_call_thread
        self._background = background
        self._lock = lock
        self.buffer = _RoutedBinary(self)

    def _route(self, data, size, to_target):
        if self._is_call_thread():
            with self._lock:
                if self._is_call_thread():  # again under the lock: the call may have ended meanwhile
                    return to_target(data)
        self._background.add(size, threading.current_thread().name)
        return len(data)

    # what print() and friends use
    def write(self, s):
        if self.closed:
            raise ValueError("I/O operation on closed file.")
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        return self._route(s, len(s.encode("utf-8", "backslashreplace")), self._target.write)

    def write_bytes(self, b):
        def to_target(data):
            self._target.flush()
            return self._target.buffer.write(data)

        return self._route(b, len(b), to_target)

    def flush(self):
        if not self.closed and self._is_call_thread():
            with self._lock:
                self._target.flush()

    def flush_target(self):
        """Flushes what the call's threads wrote (at the call's end; the caller holds the lock)."""
        self._target.flush()

    def fileno(self):
        return self._target.fileno()

    def isatty(self):
        return False

    def writable(self):
        return True

    @property
    def encoding(self):
        return self._target.encoding

    @property
    def errors(self):
        return self._target.errors

    @property
    def line_buffering(self):
        return self._target.line_buffering


class _RoutedBinary(io.RawIOBase):
    """`sys.stdout.buffer`: bytes, routed like the text stream's writes."""

    def __init__(self, stream):
        super().__init__()
        self._stream = stream

    def write(self, b):
        return self._stream.write_bytes(bytes(b))

    def writable(self):
        return True

    def flush(self):
        self._stream.flush()

    def fileno(self):
        return self._stream.fileno()
