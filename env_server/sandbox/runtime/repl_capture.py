"""Capture of a call's stdout/stderr in the sandbox REPL: pipes drained by reader threads into
per-call capped buffers, so output is capped while it is produced (stdlib only)."""

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
