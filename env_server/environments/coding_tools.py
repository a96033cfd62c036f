"""The coding environment's tools as the model meets them: their arguments, and the messages it reads.

Worded as OpenHands words them (openhands-aci's `OHEditor`: `cat -n` numbering, the snippet around an
edit, `<response clipped>` notes, its error texts; the command observation with its exit code and
working directory), so a model trained on those trajectories meets what it knows. The editor itself runs
inside the sandbox (runtime/repl_editor.py) and replies with typed fields; `format_edit` words them.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, Literal

from pydantic import Field

from env_server.environments.base import StrictArgs
from env_server.sandbox.result import ExecResult
from env_server.sandbox.runtime import repl_protocol as protocol

# OpenHands' editor (openhands-aci editor/prompts.py, config.py): the notices and the response limit.
MAX_RESPONSE_CHARS = 16000
TEXT_FILE_CLIPPED = ("<response clipped><NOTE>Due to the max output limit, only part of this file has been shown to "
                     "you. You should retry this tool after you have searched inside the file with `grep -n` in "
                     "order to find the line numbers of what you are looking for.</NOTE>")
DIRECTORY_CLIPPED = ("<response clipped><NOTE>Due to the max output limit, only part of this directory has been shown "
                     "to you. You should use `ls -la` instead to view large directories incrementally.</NOTE>")
# OpenHands' command observation (events/observation/commands.py): the output is cut in the middle.
MAX_COMMAND_OUTPUT_CHARS = 30000
COMMAND_OUTPUT_CUT = "\n[... Observation truncated due to length ...]\n"



class ExecuteBashArgs(StrictArgs):
    command: str = Field(description="The bash command to run (several lines allowed; chain with `&&` or `;`).")
    is_input: Literal["true", "false"] | None = Field(
        default=None, description="Always \"false\" here: a command runs to its end before the result comes back.")
    timeout: float | None = Field(default=None, gt=0, description="Seconds before the command is stopped.")
    security_risk: Literal["LOW", "MEDIUM", "HIGH"] | None = Field(default=None, description="Not used.")


class StrReplaceEditorArgs(StrictArgs):
    command: Literal["view", "create", "str_replace", "insert", "undo_edit"] = Field(
        description="The command: `view`, `create`, `str_replace`, `insert` or `undo_edit`.")
    path: str = Field(description="Absolute path of a file or folder in the repository, e.g. `/workspace/file.py`.")
    file_text: str | None = Field(default=None, description="`create`: the new file's content.")
    old_str: str | None = Field(default=None, description="`str_replace`: the text to replace; it must occur exactly "
                                                          "once in the file.")
    new_str: str | None = Field(default=None, description="`str_replace`: the replacement (none: delete old_str); "
                                                          "`insert`: the text to insert.")
    insert_line: int | None = Field(default=None, description="`insert`: new_str goes after this line (0: at the top).")
    view_range: list[int] | None = Field(
        default=None, description="`view` of a file: [first, last] line, 1-based; [first, -1] shows to the end.")
    security_risk: Literal["LOW", "MEDIUM", "HIGH"] | None = Field(default=None, description="Not used.")


# -- what the model reads ------------------------------------------------------------------------


def format_bash_result(r: ExecResult, root: str, timeout_s: float) -> str:
    """A command's observation, as OpenHands words it: the output (cut in the middle past 30,000 characters),
    then its exit code and the working directory; plus our notes (stopped processes, timeouts, losses)."""
    out = r.stdout + r.stderr
    if len(out) > MAX_COMMAND_OUTPUT_CHARS:
        half = MAX_COMMAND_OUTPUT_CHARS // 2
        out = out[:half] + COMMAND_OUTPUT_CUT + out[-half:]
    parts = [out.rstrip("\n")] if out else []
    if r.stdout_truncated or r.stderr_truncated:
        parts.append(f"[... {r.stdout_dropped + r.stderr_dropped} more bytes of output were dropped ...]")
    if r.stopped_processes:
        s = "" if r.stopped_processes == 1 else "es"
        parts.append(f"[Stopped {r.stopped_processes} process{s} the command left running in the background.]")
    if r.lost:
        parts.append(f"[sandbox lost: {r.lost_reason}; its state is gone and this session cannot continue]")
    elif r.timed_out:
        parts.append(f"[The command timed out after {timeout_s:g} seconds and was stopped. The shell was restarted in "
                     f"{root}: the working directory and variables are reset, files are kept.]")
    elif r.shell_restarted:
        parts.append(f"[The shell exited with code {r.exit_code}; a new one was started in {root}: the working "
                     "directory and variables are reset.]")
    elif r.error:
        parts.append(f"[shell error: {r.error.strip().splitlines()[-1][:300]}]")
    else:
        parts.append(f"[The command completed with exit code {r.exit_code}.]")
        parts.append(f"[Current working directory: {r.cwd or root}]")
    return "\n".join(parts)


def _numbered(text: str, start: int) -> str:
    """OpenHands' `cat -n` lines: a 6-wide number, a tab, the line."""
    return "\n".join(f"{i + start:6}\t{line}" for i, line in enumerate(text.split("\n")))


def _cat_n(text: str, clipped: bool, description: str, start: int = 1) -> str:
    if clipped:
        text += TEXT_FILE_CLIPPED
    return f"Here's the result of running `cat -n` on {description}:\n" + _numbered(text, start) + "\n"


def format_edit(args: StrReplaceEditorArgs, reply: protocol.EditReply, root: str) -> str:
    """The editor's message for the model, in OpenHands' words (the error texts without the "ERROR:\\n" head)."""
    path = str(PurePosixPath(args.path)) if args.path else args.path
    if reply.outcome == "listed":
        text = reply.text + (DIRECTORY_CLIPPED if reply.clipped else "")
        message = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{text}"
        if reply.hidden:
            message += (f"\n\n{reply.hidden} hidden files/directories in this directory are excluded. You can use "
                        f"'ls -la {path}' to see them.")
        return message
    if reply.outcome == "viewed":
        shown = _cat_n(reply.text, reply.clipped, path, reply.start_line)
        end = args.view_range[1] if args.view_range and len(args.view_range) == 2 else None
        if end is not None and end > reply.line_count:
            n = reply.line_count
            shown = f"NOTE: We only show up to {n} since there're only {n} lines in this file.\n" + shown
        return shown
    if reply.outcome == "created":
        return f"File created successfully at: {path}"
    if reply.outcome == "edited":
        return (f"The file {path} has been edited. " + _cat_n(reply.text, reply.clipped, f"a snippet of {path}",
                                                              reply.start_line)
                + "Review the changes and make sure they are as expected. Edit the file again if necessary.")
    if reply.outcome == "inserted":
        return (f"The file {path} has been edited. " + _cat_n(reply.text, reply.clipped, "a snippet of the edited file",
                                                              reply.start_line)
                + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, "
                  "etc). Edit the file again if necessary.")
    if reply.outcome == "undone":
        return f"Last edit to {path} undone successfully. " + _cat_n(reply.text, reply.clipped, path)
    return _error_text(args, reply, path, root)


def _error_text(args: StrReplaceEditorArgs, reply: protocol.EditReply, path: str, root: str) -> str:
    old = args.old_str or ""
    view_range = args.view_range
    invalid_path = f"Invalid `path` parameter: {path}."
    texts: dict[str, Any] = {
        "relative": lambda: f"{invalid_path} The path should be an absolute path, starting with `/`."
                            + (f" Maybe you meant {reply.suggestion}?" if reply.suggestion else ""),
        "outside": lambda: f"{invalid_path} The path {path} is outside the repository {root}; the editor works on "
                           f"files inside it only.",
        "missing": lambda: f"{invalid_path} The path {path} does not exist. Please provide a valid path.",
        "exists": lambda: f"{invalid_path} File already exists at: {path}. Cannot overwrite files using command "
                          "`create`.",
        "no_parent": lambda: f"{invalid_path} The directory {PurePosixPath(path).parent} does not exist: create it "
                             f"first (e.g. `mkdir -p {PurePosixPath(path).parent}` with execute_bash).",
        "directory": lambda: f"{invalid_path} The path {path} is a directory and only the `view` command can be used on "
                             "directories.",
        "not_file": lambda: f"{invalid_path} The path {path} is not a regular file (a pipe, a socket or a device); only "
                            "text files can be viewed or edited.",
        "missing_param": lambda: f"Parameter `{reply.detail}` is required for command: {args.command}.",
        "same": lambda: f"Invalid `new_str` parameter: {args.new_str}. No replacement was performed. `new_str` and "
                        "`old_str` must be different.",
        "range_on_directory": lambda: f"Invalid `view_range` parameter: {view_range}. The `view_range` parameter is "
                                      "not allowed when `path` points to a directory.",
        "bad_range": lambda: f"Invalid `view_range` parameter: {view_range}. It should be a list of two integers.",
        "range_start": lambda: f"Invalid `view_range` parameter: {view_range}. Its first element `{view_range[0]}` "
                               f"should be within the range of lines of the file: {[1, reply.line_count]}.",
        "range_end": lambda: f"Invalid `view_range` parameter: {view_range}. Its second element `{view_range[1]}` "
                             f"should be greater than or equal to the first element `{view_range[0]}`.",
        "no_match": lambda: f"No replacement was performed, old_str `{old.strip()}` did not appear verbatim in {path}.",
        "multiple": lambda: f"No replacement was performed. Multiple occurrences of old_str "
                            f"`{old.strip() if reply.stripped else old}` in lines {reply.lines}. Please ensure it is "
                            "unique.",
        "insert_line": lambda: f"Invalid `insert_line` parameter: {args.insert_line}. It should be within the range of "
                               f"allowed values: {[0, reply.line_count]}",
        "no_history": lambda: f"No edit history found for {path}.",
        "too_large": lambda: f"File validation failed for {path}: File is too large "
                             f"({int(reply.detail or 0) / 1024 / 1024:.1f}MB). Maximum allowed size is 10MB.",
        "binary": lambda: f"File validation failed for {path}: File appears to be binary and this file type cannot be "
                          "read or edited by this tool.",
        "os": lambda: f"{reply.detail} {path}",
    }
    text = texts.get(reply.error)
    return text() if text is not None else f"The editor could not do that ({reply.error or 'unknown error'})."
