"""Coding tasks as folders, for the `coding` environment: a repository with a bug, an issue, hidden tests and
the known fix (stdlib only).

    <task>/task.json   {"test_command": "python3 -m unittest discover -s tests", "test_timeout_s": 60,
                        "setup_command": null,                      (optional; run before the first call)
                        "fix": [{"path": "pkg/mod.py", "old_str": "...", "new_str": "..."}]}
    <task>/issue.md    what the model is asked to fix
    <task>/repo/       the repository, without .git (its history could hold the fix); baked into the task image
                       tito-task-<folder name>:<tag> by scripts/build_task_images.sh, or sent as env_args files
    <task>/hidden/     the hidden tests, at their paths in the repository: sent only as hidden_files, which the
                       server writes into the grading sandbox after the episode

    tasks = load_tasks("examples/coding_tasks")
    session = client.open_session("coding", tasks[0].messages(), env_args=tasks[0].env_args())

`CodingTask.fix_calls()` are the `str_replace_editor` calls that apply the known fix (a scripted agent's, for
checks that a task rewards its fix and nothing less: examples/coding_tasks/run_scripted.py).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TASK_FILE = "task.json"
REPO_ROOT = "/workspace"  # where the coding environment puts the repository
SYSTEM_PROMPT = (
    "You are a software engineer working in a repository at /workspace. Use execute_bash to run commands and "
    "str_replace_editor to view and edit files (absolute paths). Fix the issue the user describes; you may run "
    "the tests in tests/. When the fix is done, answer with a short summary and no tool call: your changes are "
    "then tested with tests you do not see."
)


def task_image_tag() -> str:
    """The tag of the example task images (TITO_TASK_IMAGE_TAG, default latest), as the build script uses it."""
    return os.environ.get("TITO_TASK_IMAGE_TAG") or "latest"


@dataclass(frozen=True)
class FixEdit:
    path: str  # relative to the repository's root
    old_str: str
    new_str: str


@dataclass(frozen=True)
class CodingTask:
    name: str
    issue: str
    test_command: str
    repo: dict[str, str]  # relative path -> text
    hidden: dict[str, str]
    fix: tuple[FixEdit, ...] = ()
    test_timeout_s: float = 300.0
    setup_command: str | None = None

    @property
    def image(self) -> str:
        """The task image scripts/build_task_images.sh builds for this task."""
        return f"tito-task-{self.name}:{task_image_tag()}"

    def env_args(self, *, image: bool | str = True, max_turns: int | None = None) -> dict[str, Any]:
        """OpenSession env_args of the `coding` environment. `image`: True, the task's image (the repository is
        in it); a name, that image; False, the sandbox image with the repository sent as `files`."""
        args: dict[str, Any] = {"hidden_files": dict(self.hidden), "test_command": self.test_command,
                                "test_timeout_s": self.test_timeout_s}
        if image:
            args["image"] = self.image if image is True else image
        else:
            args["files"] = dict(self.repo)
        if self.setup_command:
            args["setup_command"] = self.setup_command
        if max_turns is not None:
            args["max_turns"] = max_turns
        return args

    def messages(self, system: str | None = SYSTEM_PROMPT) -> list[dict[str, str]]:
        """The opening conversation: the system prompt (None: none) and the issue."""
        user = {"role": "user", "content": self.issue}
        return [{"role": "system", "content": system}, user] if system else [user]

    def fix_calls(self, root: str = REPO_ROOT) -> list[tuple[str, dict[str, Any]]]:
        """(tool, arguments) of the str_replace_editor calls that apply the known fix."""
        return [("str_replace_editor", {"command": "str_replace", "path": f"{root}/{e.path}", "old_str": e.old_str,
                                        "new_str": e.new_str}) for e in self.fix]


def _text_files(folder: Path) -> dict[str, str]:
    if not folder.is_dir():
        return {}
    files = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if ".git" in rel.parts or "__pycache__" in rel.parts or not path.is_file():
            continue
        files[rel.as_posix()] = path.read_text(encoding="utf-8")
    return files


def load_task(folder: str | os.PathLike[str]) -> CodingTask:
    """One task folder; ValueError saying what is wrong with it."""
    folder = Path(folder)
    try:
        spec = json.loads((folder / TASK_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{folder}: no readable {TASK_FILE} ({e})") from e
    if not isinstance(spec.get("test_command"), str):
        raise ValueError(f"{folder / TASK_FILE}: test_command (a string) is required")
    repo, hidden = _text_files(folder / "repo"), _text_files(folder / "hidden")
    if not repo:
        raise ValueError(f"{folder}: repo/ holds no files")
    clash = sorted(set(repo) & set(hidden))
    if clash:
        raise ValueError(f"{folder}: hidden files must not be in the repository: {', '.join(clash)}")
    fix = tuple(FixEdit(e["path"], e["old_str"], e["new_str"]) for e in spec.get("fix", ()))
    return CodingTask(name=folder.name, issue=(folder / "issue.md").read_text(encoding="utf-8").strip(),
                      test_command=spec["test_command"], repo=repo, hidden=hidden, fix=fix,
                      test_timeout_s=float(spec.get("test_timeout_s", 300.0)), setup_command=spec.get("setup_command"))


def load_tasks(folder: str | os.PathLike[str]) -> list[CodingTask]:
    """Every task folder (one holding task.json) in `folder`, by name."""
    folders = sorted(p for p in Path(folder).iterdir() if (p / TASK_FILE).is_file())
    if not folders:
        raise ValueError(f"{folder}: no task folders (folders holding {TASK_FILE})")
    return [load_task(p) for p in folders]
