"""The outcome of one call into a sandbox."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExecResult:
    stdout: str
    stderr: str
    value: str | None  # repr of the last expression, if any
    error: str | None  # formatted traceback, if the code raised
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool  # interrupted at the timeout; interpreter state kept (unless lost)
    # Set when the sandbox is dead (killed after timeout, OOM, exit, segfault): why, for people.
    lost_reason: str | None
    duration_ms: float
    stdout_dropped: int = 0  # bytes beyond the cap, counted but not kept
    stderr_dropped: int = 0
    value_truncated: bool = False  # the value or traceback was cut to its cap
    # bytes of output dropped: written between the previous call and this one, or by threads other than the call's
    background_dropped: int = 0
    background_threads: str = ""  # threads of the code still running after this call (names)
    background_writers: str = ""  # threads whose writes were dropped (names)
    # shell commands only (Sandbox.run_shell): the exit status (the shell's own if it exited), the
    # processes it left running (killed when it returned), whether the shell was started afresh, where it is
    exit_code: int | None = None
    stopped_processes: int = 0
    shell_restarted: bool = False
    cwd: str = ""  # the shell's working directory after the command

    @property
    def lost(self) -> bool:
        return self.lost_reason is not None

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated or self.value_truncated

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out and not self.lost

    @classmethod
    def failure(cls, *, error: str | None, duration_ms: float, lost_reason: str | None = None,
                timed_out: bool = False) -> ExecResult:
        return cls(stdout="", stderr="", value=None, error=error, stdout_truncated=False,
                   stderr_truncated=False, timed_out=timed_out, lost_reason=lost_reason, duration_ms=duration_ms)
