"""The built-in `python` environment: a stateful Python interpreter in a sandbox."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field

from env_server.environments.base import Environment, ToolOutput, tool
from env_server.sandbox.result import ExecResult


class PythonEnvArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    expected_answer: str | None = Field(
        default=None,
        description="If set, the episode's reward is 1.0 when the final answer equals it, else 0.0.",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, le=600, description="Per-call timeout; defaults to the server's sandbox setting."
    )


class RunPythonArgs(BaseModel):
    # strict: a number or a list where code belongs is an error, not silently str()-ed.
    model_config = ConfigDict(extra="forbid", strict=True)

    code: str = Field(description="Python source to run. Variables, imports and files persist across calls.")


class PythonEnvironment(Environment):
    name = "python"
    description = (
        "A stateful Python interpreter in an isolated sandbox (no network). "
        "Variables, imports and files in the working directory persist across calls within a session."
    )
    EnvArgs = PythonEnvArgs
    needs_sandbox = True

    @tool
    async def run_python(self, args: RunPythonArgs) -> ToolOutput:
        """Run Python code and return its stdout, stderr, the value of the last expression and any traceback."""
        assert self.sandbox is not None, "the python environment always gets a sandbox"
        result = await self.sandbox.execute(args.code, timeout_s=self.env_args.timeout_s)
        return ToolOutput(
            content=format_exec_result(result),
            truncated=result.stdout_truncated or result.stderr_truncated,
            lost=result.lost,
            lost_reason=result.lost_reason,
        )

    def reward(self, final_text: str) -> float | None:
        expected = self.env_args.expected_answer
        if expected is None:
            return None
        return 1.0 if extract_final_answer(final_text) == _normalize(expected) else 0.0


def format_exec_result(r: ExecResult) -> str:
    """The tool message the model sees: what a terminal would show, plus explicit notes."""
    parts: list[str] = []
    if r.stdout:
        parts.append(r.stdout.rstrip("\n"))
    if r.stderr:
        parts.append("[stderr]\n" + r.stderr.rstrip("\n"))
    if r.value is not None:
        parts.append(f"Out: {r.value}")
    if r.error:
        parts.append(r.error.rstrip("\n"))
    if r.stdout_truncated or r.stderr_truncated:
        parts.append("[output truncated: too much output]")
    if r.timed_out and not r.lost:
        parts.append("[timed out: execution was interrupted; variables defined before the interrupt are kept]")
    if r.lost:
        parts.append(f"[sandbox lost: {r.lost_reason or 'the interpreter died'}; this session cannot continue]")
    return "\n".join(parts) if parts else "(no output)"


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _normalize(text: str) -> str:
    return text.strip().replace(",", "").rstrip(".")


def extract_final_answer(final_text: str) -> str:
    """The last number in the text (commas removed), else its last non-empty line."""
    text = final_text.split("</think>")[-1].replace(",", "")
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1].lstrip("+")
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return _normalize(lines[-1]) if lines else ""
