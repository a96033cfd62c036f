"""The built-in `bash` environment: a persistent bash shell in a sandbox (the same hardened image and
pool as `python`). `cd`, exported variables and functions persist across calls; see
`env_server/sandbox/runtime/repl_shell.py` for how commands run and the rule for processes left running."""

from __future__ import annotations

from pydantic import Field

from env_server.environments.base import StrictArgs, tool
from env_server.environments.sandboxed import SandboxedEnvironment
from env_server.sandbox.errors import SandboxError
from env_server.sandbox.sandbox import Sandbox
from env_server.sandbox.result import ExecResult
from tito.types import ToolResult


async def start_shell(sandbox: Sandbox) -> None:
    """Starts the session's bash now (its first command), so the first tool call does not wait for it.
    Raises SandboxError saying why it could not."""
    started = await sandbox.run_shell("true")
    if not started.ok:
        why = started.lost_reason or started.error or "timed out"
        raise SandboxError(f"could not start bash in the sandbox: {why.strip().splitlines()[-1][:300]}")


class RunBashArgs(StrictArgs):
    command: str = Field(description="A bash command line (several lines allowed). The shell persists across calls.")


class BashEnvironment(SandboxedEnvironment):
    """One bash per session. What a command leaves running is stopped when it returns; a command over its
    timeout restarts the shell (repl_shell.py has the rules)."""

    name = "bash"
    description = (
        "A persistent bash shell in an isolated sandbox (no network, a writable working directory). "
        "The working directory, exported variables and files persist across calls within a session."
    )

    async def setup(self) -> None:
        await super().setup()  # the seeded files first: the shell starts among them
        assert self.sandbox is not None
        await start_shell(self.sandbox)

    @tool
    async def run_bash(self, args: RunBashArgs) -> ToolResult:
        """Run a bash command and return its output (stdout and stderr together) and a non-zero exit code."""
        assert self.sandbox is not None, "the bash environment always gets a sandbox"
        result = await self.sandbox.run_shell(args.command, timeout_s=self.env_args.timeout_s)
        return ToolResult(content=format_shell_result(result), truncated=result.truncated,
                          lost_reason=result.lost_reason)


def format_shell_result(r: ExecResult) -> str:
    """What a terminal would show, plus explicit notes (no Python tracebacks: the shell runs in Python)."""
    parts: list[str] = []
    if r.stdout:
        parts.append(r.stdout.rstrip("\n"))
    if r.stderr:  # the driver's own stderr: should stay empty
        parts.append(r.stderr.rstrip("\n"))
    if r.stdout_truncated or r.stderr_truncated:
        parts.append("[output truncated: too much output]")
    if r.stopped_processes:
        s = "" if r.stopped_processes == 1 else "es"
        parts.append(f"[stopped {r.stopped_processes} process{s} the command left running in the background]")
    if r.background_dropped:
        parts.append(f"[{r.background_dropped} bytes of output written outside the command were dropped]")
    if r.shell_restarted and not r.timed_out and not r.lost:
        parts.append("[the shell exited; a new one was started in the working directory: directory and variables "
                     "are reset]")
    elif r.exit_code:
        parts.append(f"[exit code {r.exit_code}]")
    if r.timed_out and not r.lost:
        parts.append("[timed out: the command was stopped and the shell restarted in the working directory; "
                     "the directory and variables are reset, files are kept]")
    elif r.error and not r.lost:
        parts.append(f"[shell error: {r.error.strip().splitlines()[-1][:300]}]")
    if r.lost:
        parts.append(f"[sandbox lost: {r.lost_reason}; its state is gone and this session cannot continue]")
    return "\n".join(parts) if parts else "(no output)"
