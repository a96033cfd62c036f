"""The built-in `python` environment: a stateful Python interpreter in a sandbox."""

from __future__ import annotations

from pydantic import Field

from env_server.environments.base import StrictArgs, tool
from env_server.environments.sandboxed import SandboxedEnvironment, SandboxEnvArgs
from env_server.sandbox.config import SCIENTIFIC_IMAGE
from env_server.sandbox.result import ExecResult
from tito.answers import answer_matches
from tito.types import ToolResult


class PythonEnvArgs(SandboxEnvArgs):
    expected_answer: str | None = Field(
        default=None,
        description="If set, the episode's reward is 1.0 when the final answer equals it, else 0.0.",
    )


class RunPythonArgs(StrictArgs):
    code: str = Field(description="Python source to run. Variables, imports and files persist across calls.")


class PythonEnvironment(SandboxedEnvironment):
    name = "python"
    description = (
        "A stateful Python interpreter in an isolated sandbox (no network). "
        "Variables, imports and files in the working directory persist across calls within a session."
    )
    EnvArgs = PythonEnvArgs

    @tool
    async def run_python(self, args: RunPythonArgs) -> ToolResult:
        """Run Python code and return its stdout, stderr, the value of the last expression and any traceback."""
        assert self.sandbox is not None, "the python environment always gets a sandbox"
        result = await self.sandbox.execute(args.code, timeout_s=self.env_args.timeout_s)
        return ToolResult(
            content=format_exec_result(result),
            truncated=result.truncated,
            lost_reason=result.lost_reason,
        )

    async def end(self, final_text: str) -> ToolResult:
        expected = self.env_args.expected_answer
        if expected is None:
            return ToolResult(content="", done=True)
        right = answer_matches(final_text, expected)
        return ToolResult(content="correct" if right else "wrong", done=True, reward=1.0 if right else 0.0)


class ScientificPythonEnvironment(PythonEnvironment):
    """`python` in the scientific image: numpy, scipy, sympy, pandas and matplotlib (Agg) installed."""

    name = "python_scientific"
    description = (
        "A stateful Python interpreter with numpy, scipy, sympy, pandas and matplotlib, in an isolated sandbox "
        "(no network). Variables, imports and files in the working directory persist across calls within a session."
    )
    sandbox_image = SCIENTIFIC_IMAGE


def format_exec_result(r: ExecResult) -> str:
    """The tool message the model sees: what a terminal would show, plus explicit notes."""
    parts: list[str] = []
    if r.stdout:
        parts.append(r.stdout.rstrip("\n"))
    if r.stderr:
        parts.append("[stderr]\n" + r.stderr.rstrip("\n"))
    if r.value is not None:
        parts.append(f"Out: {r.value}")
    if r.error and not r.lost:  # a lost call is reported once, by the line below
        parts.append(r.error.rstrip("\n"))
    if r.stdout_truncated or r.stderr_truncated:
        parts.append("[output truncated: too much output]")
    if r.background_dropped:
        by = f" (threads: {r.background_writers})" if r.background_writers else ""
        parts.append(f"[{r.background_dropped} bytes of output written by code running in the background{by} were "
                     "dropped]")
    if r.background_threads:
        parts.append(f"[still running in the background: {r.background_threads}; what threads started by a call "
                     "print shows in that call only]")
    if r.timed_out and not r.lost:
        parts.append("[timed out: execution was interrupted; variables defined before the interrupt are kept]")
    if r.lost:
        parts.append(f"[sandbox lost: {r.lost_reason}; its state is gone and this session cannot continue]")
    return "\n".join(parts) if parts else "(no output)"
