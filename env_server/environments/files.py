"""Session files: text files a client seeds into a session's working directory at OpenSession.

    env_args = {"files": {"data/input.csv": "a,b\\n1,2\\n", "notes.txt": "..."}}

Paths are relative to the sandbox's working directory and are checked before anything starts: no
absolute paths, no `..`, `.` or empty components, no NUL or control characters, at most MAX_DEPTH
folders deep; at most MAX_FILES files and MAX_TOTAL_BYTES in all. A bad path is refused with
INVALID_ARGUMENT naming it. The files are written by the sandbox's REPL (the protocol's
`write_files`), as its user, before the first tool call; it never replaces a path or follows a link.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from env_server.errors import quote

if TYPE_CHECKING:
    from env_server.sandbox.sandbox import Sandbox

MAX_FILES = 100
MAX_TOTAL_BYTES = 512 * 1024  # base64 inside one REPL request, well under sandbox.max_code_bytes
MAX_PATH_CHARS = 255
MAX_DEPTH = 8


def check_path(path: str) -> str:
    """The path if it is a safe relative path; ValueError saying what is wrong otherwise."""
    if not path or len(path) > MAX_PATH_CHARS:
        raise ValueError(f"file path {quote(path)} must have 1 to {MAX_PATH_CHARS} characters")
    if any(ord(ch) < 32 or ch == "\x7f" for ch in path) or "\\" in path:
        raise ValueError(f"file path {quote(path)} holds a control character or a backslash")
    if path.startswith("/"):
        raise ValueError(f"file path {quote(path)} is absolute; give it relative to the working directory")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"file path {quote(path)} has an empty, '.' or '..' component; files stay inside the "
                         "working directory")
    if len(parts) > MAX_DEPTH + 1:
        raise ValueError(f"file path {quote(path)} is more than {MAX_DEPTH} folders deep")
    return path


class RepoLimits(BaseModel):
    """Limits of a repository sent as files (the `coding` environment's env_args `files` and `hidden_files`;
    server config `coding`). The files travel in OpenSession, so max_message_bytes bounds them too."""

    model_config = ConfigDict(extra="forbid")

    max_files: int = Field(5000, ge=1, description="Files in env_args files (and in hidden_files), each.")
    max_bytes: int = Field(8 * 1024 * 1024, ge=1, description="Bytes in env_args files (and in hidden_files), each.")


def check_files(files: dict[str, str], max_files: int = MAX_FILES, max_bytes: int = MAX_TOTAL_BYTES,
                setting: str = "") -> dict[str, str]:
    """`files` if within the limits and every path is safe; ValueError saying what is wrong otherwise
    (naming `setting`, the server setting that moves the limits, if any)."""
    where = f" (server setting {setting})" if setting else ""
    if len(files) > max_files:
        raise ValueError(f"{len(files)} files; at most {max_files}{where}")
    total = sum(len(c.encode("utf-8", "surrogatepass")) for c in files.values())
    if total > max_bytes:
        raise ValueError(f"the files hold {total} bytes; at most {max_bytes} in all{where}")
    for path in files:
        check_path(path)
    paths = set(files)
    for path in files:  # "a" and "a/b" cannot both be files
        parts = path.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in paths:
                raise ValueError(f"file path {quote(path)} puts a file inside the file {quote('/'.join(parts[:i]))}")
    return files


def encoded(files: dict[str, str]) -> dict[str, bytes]:
    """Text files as the bytes written in the sandbox."""
    return {p: c.encode("utf-8", "surrogatepass") for p, c in files.items()}


async def seed_files(sandbox: Sandbox, files: dict[str, str], replace: bool = False) -> None:
    """Writes the files in the sandbox (`replace`: over files already there); raises RuntimeError (a failed
    set-up) if it could not."""
    if not files:
        return
    try:
        await sandbox.write_files(encoded(files), replace=replace)
    except Exception as e:
        raise RuntimeError(f"could not write the seeded files: {e}") from e
