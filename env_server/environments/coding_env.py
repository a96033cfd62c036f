"""The built-in `coding` environment: a repository, a shell and an editor, and a reward from tests the model
never sees (SWE-bench / SWE-Gym / R2E-Gym style).

Tools, shaped like the ones open coding models are trained on (OpenHands' CodeAct agent, SWE-agent):
- `execute_bash(command)`: the session's persistent bash (the `bash` environment's: directory and
  variables kept; what a command leaves running is stopped when it returns; a timeout restarts the shell);
  the output, then `[The command completed with exit code N.]` and `[Current working directory: ...]`;
- `str_replace_editor(command, path, ...)`: `view`, `create`, `str_replace`, `insert`, `undo_edit` on
  files inside the repository. It runs inside the sandbox (runtime/repl_editor.py, behind the protocol's
  `edit` operation) and replies with typed fields; `coding_tools.py` words the message as OpenHands'
  editor does, so a model trained on those trajectories meets what it knows.

The repository is the sandbox's working directory (`/workspace`, the shell starts there): the task image's
repository (`/opt/tito-task/repo`, copied in; sandbox_images/task/Dockerfile), then env_args `files` over it,
then `setup_command`. What is there then is the baseline (sha256 of every file).

The end (the model answers without a tool call, or its `max_turns`-th tool turn is done), graded as
SWE-bench, NeMo Gym and Harbor grade: the repository's changes against the baseline (files changed, added,
deleted; caches left out) are carried into a **fresh sandbox** of the same image, seeded the same way;
`setup_command` runs again, `hidden_files` are written (over the model's version of the same paths), and
`test_command` runs with `test_timeout_s`. Reward 1.0 if it exits 0, else 0.0; the test output and the
changes go to the rollout's record (`StepResult.detail`), never to the model. The hidden files and the test
command never enter the model's sandbox. A failure of the grading itself (no sandbox could start, the
grader's own operations failed or timed out) is a `lost_reason`: the Step's status is ERROR and the
trainer drops the sample instead of training on a 0 that is not the model's.
"""

from __future__ import annotations

import logging
import shlex
from dataclasses import dataclass, field

from pydantic import Field, ValidationInfo, field_validator, model_validator

from env_server.environments.base import tool
from env_server.environments.bash_env import start_shell
from env_server.environments.coding_tools import (MAX_RESPONSE_CHARS, ExecuteBashArgs, StrReplaceEditorArgs,
                                                   format_bash_result, format_edit)
from env_server.environments.files import RepoLimits, check_files, encoded
from env_server.environments.sandboxed import SandboxedEnvironment, SandboxEnvArgs
from env_server.sandbox.errors import SandboxError
from env_server.sandbox.sandbox import Sandbox
from env_server.sandbox.runtime import repl_protocol as protocol
from tito.types import ToolResult

log = logging.getLogger(__name__)

# Names (fnmatch, at any depth) that are not the repository's: caches and the shell's home files (HOME is the
# working directory). They are never carried into the grading sandbox.
NOT_REPOSITORY = ("__pycache__", "*.pyc", "*.pyo", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis",
                  ".cache", ".local", ".python_history", ".bash_history", ".lesshst", ".viminfo")
MAX_TREE_FILES = 40_000  # files in the repository we digest (the reply's line limit holds about this many)
RECORD_OUTPUT_CHARS = 8000  # of the test output kept in the record (its end)
MAX_BASH_TIMEOUT_S = 600.0

class CodingEnvArgs(SandboxEnvArgs):
    """OpenSession.env_args of `coding`. `files` is the repository (over the task image's, if it has one)."""

    files: dict[str, str] = Field(
        default_factory=dict,
        description="The repository's text files, written into the working directory (over a task image's "
                    "repository) before set-up: relative path -> content. Limits: server setting `coding`.",
    )
    hidden_files: dict[str, str] = Field(
        default_factory=dict,
        description="Files the model must never see (the tests): written only into the grading sandbox, after the "
                    "episode, over the model's version of the same paths.",
    )
    test_command: str | None = Field(
        default=None, min_length=1,
        description="Run in the grading sandbox after the episode: reward 1.0 if it exits 0, else 0.0. None: no reward.")
    test_timeout_s: float = Field(300.0, gt=0, le=3600, description="Timeout of test_command (a timeout scores 0).")
    setup_command: str | None = Field(
        default=None, min_length=1,
        description="Run before the first call (and again in the grading sandbox, after the model's changes), e.g. "
                    "`pip install -e .` from packages already in the image: there is no network. A failure refuses the "
                    "session (FAILED_PRECONDITION).")
    setup_timeout_s: float = Field(300.0, gt=0, le=3600)
    max_turns: int | None = Field(
        default=None, ge=1,
        description="Tool-calling turns of the episode: after the last, the episode ends and is graded.")

    @field_validator("files", "hidden_files")
    @classmethod
    def _check_files(cls, files: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        config = (info.context or {}).get("config")
        limits = getattr(config, "coding", None) or RepoLimits()
        return check_files(files, limits.max_files, limits.max_bytes, setting="coding")

    @model_validator(mode="after")
    def _hidden_need_a_test(self) -> CodingEnvArgs:
        if self.hidden_files and self.test_command is None:
            raise ValueError("hidden_files are only written for test_command: set test_command too")
        return self


@dataclass
class Changes:
    """What the model changed in the repository against the baseline."""

    files: dict[str, bytes] = field(default_factory=dict)  # changed or added
    deleted: list[str] = field(default_factory=list)
    not_carried: list[str] = field(default_factory=list)  # links and special files the grader cannot recreate

    def summary(self, baseline: set[str]) -> str:
        changed = sorted(p for p in self.files if p in baseline)
        added = sorted(p for p in self.files if p not in baseline)

        def names(paths: list[str]) -> str:
            return ", ".join(paths[:20]) + (f" and {len(paths) - 20} more" if len(paths) > 20 else "")

        parts = [f"{what}: {names(paths)}" for what, paths in
                 (("changed", changed), ("added", added), ("deleted", sorted(self.deleted)),
                  ("not carried (links, special files)", sorted(self.not_carried))) if paths]
        return "; ".join(parts) or "no changes"


class GradingLost(Exception):
    """The grading itself failed (not the model): the episode gets no reward."""


class CodingEnvironment(SandboxedEnvironment):
    name = "coding"
    description = (
        "A software repository in an isolated sandbox (no network) with a persistent bash shell and a file editor. "
        "The repository is the working directory, /workspace. Fix the issue, then answer without a tool call: the "
        "changes are then tested with tests you do not see."
    )
    EnvArgs = CodingEnvArgs

    def __init__(self, env_args: CodingEnvArgs, sandbox: Sandbox | None = None) -> None:
        super().__init__(env_args, sandbox)
        self.baseline: protocol.TreeHashes | None = None

    @property
    def root(self) -> str:
        assert self.sandbox is not None
        return self.sandbox.config.workdir

    # -- set-up: the repository, then the baseline ------------------------------------------------

    async def setup(self) -> None:
        assert self.sandbox is not None, "the coding environment always gets a sandbox"
        try:
            await self._prepare(self.sandbox)
            self.baseline = await self.sandbox.hash_tree(NOT_REPOSITORY, MAX_TREE_FILES)
        except SandboxError as e:
            raise RuntimeError(f"could not set up the repository: {e}") from e
        if self.baseline.truncated:
            raise RuntimeError(f"the repository has more than {MAX_TREE_FILES} files; the coding environment "
                               "digests at most that many")

    async def _prepare(self, sandbox: Sandbox) -> None:
        """The repository as every sandbox of the session gets it: the image's, env_args files, the set-up."""
        await sandbox.copy_tree(protocol.TASK_REPO_DIR, missing_ok=True)
        if self.env_args.files:
            await sandbox.write_files(encoded(self.env_args.files), replace=True)
        await start_shell(sandbox)
        if self.env_args.setup_command:
            await self._setup_command(sandbox)

    async def _setup_command(self, sandbox: Sandbox) -> None:
        r = await sandbox.run_shell(self.env_args.setup_command, timeout_s=self.env_args.setup_timeout_s)
        if r.exit_code != 0 or not r.ok:
            why = (r.lost_reason or (f"timed out after {self.env_args.setup_timeout_s:g} s" if r.timed_out else None)
                   or (r.error or "").strip()[-300:] or f"exit code {r.exit_code}")
            raise SandboxError(f"setup_command failed ({why}): {_tail(r.stdout, 2000)}")
        # The shell may have moved (`cd`): the model's starts in the repository.
        await sandbox.run_shell(f"cd {shlex.quote(self.root)}")

    def turn_limit(self) -> int | None:
        return self.env_args.max_turns

    # -- tools -----------------------------------------------------------------------------------

    @tool
    async def execute_bash(self, args: ExecuteBashArgs) -> ToolResult:
        """Run a command in a persistent bash shell in the repository (no network): the working directory and
        variables persist across calls. A command runs to its end (or its timeout, which stops it and restarts
        the shell); processes it leaves running in the background are stopped when it returns. Returns the output
        (stdout and stderr together), the exit code and the working directory."""
        assert self.sandbox is not None
        if args.is_input == "true" or not args.command.strip():
            return ToolResult(content="ERROR: No previous running command to interact with: every command here runs "
                                      "to its end before its result comes back. Send a new command.", is_error=True)
        timeout = min(args.timeout, MAX_BASH_TIMEOUT_S) if args.timeout else self.env_args.timeout_s
        result = await self.sandbox.run_shell(args.command, timeout_s=timeout)
        return ToolResult(content=format_bash_result(result, self.root, timeout or self.sandbox.config.exec_timeout_s),
                          truncated=result.truncated, lost_reason=result.lost_reason)

    @tool
    async def str_replace_editor(self, args: StrReplaceEditorArgs) -> ToolResult:
        """View, create and edit files in the repository. `view` shows a file with line numbers (as `cat -n`) or a
        folder's files up to 2 levels deep; `create` makes a new file (never over an existing one); `str_replace`
        replaces `old_str`, which must occur exactly once, with `new_str`; `insert` puts `new_str` after line
        `insert_line`; `undo_edit` reverts the file's last edit. Paths are absolute, inside the repository. Long
        output is clipped and marked `<response clipped>`."""
        assert self.sandbox is not None
        request = protocol.EditRequest(
            command=args.command, path=args.path, root=self.root, file_text=args.file_text, old_str=args.old_str,
            new_str=args.new_str, insert_line=args.insert_line, view_range=args.view_range,
            max_chars=MAX_RESPONSE_CHARS)
        try:
            reply = await self.sandbox.edit(request)
        except SandboxError as e:
            if not self.sandbox.alive:
                reason = self.sandbox.lost_reason or str(e)
                return ToolResult(content=f"[sandbox lost: {reason}; its state is gone and this session cannot "
                                          "continue]", lost_reason=reason)
            return ToolResult(content=f"ERROR:\nThe editor failed: {e}", is_error=True)
        text = format_edit(args, reply, self.root)
        return ToolResult(content=text if reply.outcome != "error" else "ERROR:\n" + text,
                          is_error=reply.outcome == "error", truncated=reply.clipped)

    # -- the end: grading in a fresh sandbox -----------------------------------------------------

    async def end(self, final_text: str) -> ToolResult:
        a = self.env_args
        if a.test_command is None:
            return ToolResult(content="not graded: the session has no test_command", done=True)
        try:
            changes = await self._changes()
            return await self._grade(changes)
        except GradingLost as e:
            log.warning("coding: grading failed, no reward: %s", e)
            return ToolResult(content="", done=True, lost_reason=f"grading failed: {e}")

    async def _changes(self) -> Changes:
        """The repository's changes in the model's sandbox against the baseline."""
        assert self.sandbox is not None and self.baseline is not None
        try:
            now = await self.sandbox.hash_tree(NOT_REPOSITORY, MAX_TREE_FILES)
        except SandboxError as e:
            raise GradingLost(f"could not list the repository's files in the model's sandbox: {e}") from e
        before = self.baseline
        changes = Changes()
        wanted = [p for p, digest in now.files.items() if before.files.get(p) != digest]
        changes.deleted = sorted(p for p in {*before.files, *before.links} if p not in now.files and p not in now.links)
        changes.not_carried = sorted([p for p, target in now.links.items() if before.links.get(p) != target]
                                     + now.skipped)
        batch: list[str] = []
        size = 0
        limit = self.sandbox.max_file_bytes
        for path in sorted(wanted) + [None]:  # None: the last batch
            if path is not None and now.sizes.get(path, 0) > limit:
                raise GradingLost(f"the changed file {path!r} is {now.sizes[path]} bytes; one request carries at most "
                                  f"{limit} (raise sandbox.max_code_bytes)")
            if batch and (path is None or size + now.sizes.get(path, 0) > limit):
                try:
                    read, missing = await self.sandbox.read_files(batch)
                except SandboxError as e:
                    raise GradingLost(f"could not read the changed files in the model's sandbox: {e}") from e
                changes.files.update(read)
                changes.not_carried.extend(missing)
                batch, size = [], 0
            if path is not None:
                batch.append(path)
                size += now.sizes.get(path, 0)
        return changes

    async def _grade(self, changes: Changes) -> ToolResult:
        a = self.env_args
        assert self.baseline is not None
        if self.sandbox_factory is None:
            raise GradingLost("the server gave the environment no sandbox factory to grade in")
        try:
            grader = await self.sandbox_factory()
        except Exception as e:  # noqa: BLE001 - whatever stopped a sandbox from starting is not the model's
            raise GradingLost(f"could not start the grading sandbox: {e}") from e
        record = [f"changes: {changes.summary(set(self.baseline.files))}"]
        try:
            try:
                await self._prepare_grader(grader, changes)
            except _ModelBrokeSetup as e:
                record.insert(0, f"tests not run: the set-up failed after the model's changes ({e})")
                return ToolResult(content="\n".join(record), done=True, reward=0.0)
            except SandboxError as e:
                raise GradingLost(f"could not prepare the grading sandbox: {e}") from e
            r = await grader.run_shell(a.test_command, timeout_s=a.test_timeout_s)
        finally:
            await grader.destroy()
        if r.lost and not (r.lost_reason or "").startswith("out of memory"):
            raise GradingLost(f"the grading sandbox was lost while the tests ran: {r.lost_reason}")
        if r.lost:
            verdict, reward = f"tests failed: the sandbox ran {r.lost_reason}", 0.0
        elif r.timed_out:
            verdict, reward = f"tests timed out after {a.test_timeout_s:g} s", 0.0
        elif r.exit_code == 0:
            verdict, reward = "tests passed (exit code 0)", 1.0
        else:
            verdict, reward = f"tests failed (exit code {r.exit_code})", 0.0
        record.insert(0, verdict)
        record.append("test output (its end):\n" + _tail(r.stdout, RECORD_OUTPUT_CHARS))
        return ToolResult(content="\n".join(record), done=True, reward=reward)

    async def _prepare_grader(self, grader: Sandbox, changes: Changes) -> None:
        """The grading sandbox: the repository as seeded, the model's changes, set-up, then the hidden files."""
        a = self.env_args
        await grader.copy_tree(protocol.TASK_REPO_DIR, missing_ok=True)
        if a.files:
            await grader.write_files(encoded(a.files), replace=True)
        if changes.files or changes.deleted:
            try:
                await grader.write_files(changes.files, replace=True, remove=changes.deleted)
            except SandboxError as e:
                if not grader.alive:
                    raise
                raise _ModelBrokeSetup(f"the changes could not be applied: {e}") from e
        await start_shell(grader)
        if a.setup_command:
            try:
                await self._setup_command(grader)
            except SandboxError as e:
                if not grader.alive:
                    raise
                raise _ModelBrokeSetup(str(e)) from e
        if a.hidden_files:
            await grader.write_files(encoded(a.hidden_files), replace=True)


class _ModelBrokeSetup(Exception):
    """The model's changes made the grading sandbox's set-up fail: the model's doing, reward 0."""


def _tail(text: str, chars: int) -> str:
    return text if len(text) <= chars else "[...]" + text[-chars:]
