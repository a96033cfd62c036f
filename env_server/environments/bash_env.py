"""The built-in `bash` environment: a persistent bash shell in a sandbox (the same hardened image and
pool as `python`). `cd`, exported variables and functions persist across calls; see
`shell_session.py` for how commands run and the rule for processes left running."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from env_server.environments.base import StrictArgs, tool
from env_server.environments.sandboxed import SandboxedEnvironment
from env_server.sandbox.result import ExecResult
from tito.types import ToolResult

_SHELL_SOURCE = Path(__file__).with_name("shell_session.py").read_text(encoding="utf-8")


class RunBashArgs(StrictArgs):
    command: str = Field(description="A bash command line (several lines allowed). The shell persists across calls.")


class BashEnvironment(SandboxedEnvironment):
    """One bash per session. What a command leaves running is stopped when it returns; a command over its
    timeout restarts the shell (shell_session.py has the rules)."""

    name = "bash"
    description = (
        "A persistent bash shell in an isolated sandbox (no network, a writable working directory). "
        "The working directory, exported variables and files persist across calls within a session."
    )

    async def setup(self) -> None:
        await super().setup()  # the seeded files first: the shell starts among them
        assert self.sandbox is not None
        started = await self.sandbox.execute(_SHELL_SOURCE)
        if not started.ok:
            why = started.lost_reason or started.error or "timed out"
            raise RuntimeError(f"could not start bash in the sandbox: {why.strip().splitlines()[-1][:300]}")

    @tool
    async def run_bash(self, args: RunBashArgs) -> ToolResult:
        """Run a bash command and return its output (stdout and stderr together) and a non-zero exit code."""
        assert self.sandbox is not None, "the bash environment always gets a sandbox"
        result = await self.sandbox.execute(f"__tito_shell.run({args.command!r})", timeout_s=self.env_args.timeout_s)
        return ToolResult(content=format_shell_result(result), truncated=result.truncated,
                          lost_reason=result.lost_reason)


def format_shell_result(r: ExecResult) -> str:
    """What a terminal would show, plus explicit notes (no Python tracebacks: the shell runs in Python)."""
    parts: list[str] = []
    if r.stdout:
        parts.append(r.stdout.rstrip("\n"))
    if r.stderr:  # the helper's own stderr: should stay empty
        parts.append(r.stderr.rstrip("\n"))
    if r.stdout_truncated or r.stderr_truncated:
        parts.append("[output truncated: too much output]")
    if r.background_dropped:
        parts.append(f"[{r.background_dropped} bytes of output written between calls were dropped]")
    if r.timed_out and not r.lost:
        parts.append("[timed out: the command was stopped and the shell restarted in the working directory; "
                     "the directory and variables are reset, files are kept]")
    elif r.error and not r.lost:
        parts.append(f"[shell error: {r.error.strip().splitlines()[-1][:300]}]")
    if r.lost:
        parts.append(f"[sandbox lost: {r.lost_reason}; its state is gone and this session cannot continue]")
    return "\n".join(parts) if parts else "(no output)"
