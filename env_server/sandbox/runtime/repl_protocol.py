"""The host <-> REPL wire protocol, declared once: every operation the server asks of a sandbox.

Both ends import this module: the host as `env_server.sandbox.runtime.repl_protocol`, the REPL
inside the sandbox image as a sibling file (`/opt/tito/repl_protocol.py`; the image bakes in the
whole `runtime/` folder). So it is stdlib-only and runs on the image's Python (3.9 or newer).

Framing: one JSON object per line, ASCII-encoded. The REPL's ready line always goes to the
container's stdout (the host reads it on the attach stream); requests and replies then flow over
the unix socket when the REPL could reach it ("socket"), else over the same stdin/stdout ("stdio").

    hello        REPL -> host (socket only, first line)  Hello(token)
    ready        REPL -> host (attach stream)            Ready(pid, python, channel, channel_error)
    exec         host -> REPL   run Python code          ExecRequest(id, code, timeout, cap, value_cap)
    shell        host -> REPL   run a command in the     ShellRequest(id, command, timeout, cap)
                                session's persistent bash (started at the first one; repl_shell.py)
    write_files  host -> REPL   create files (never      WriteFilesRequest(id, files)
                                over an existing one)
    ping         host -> REPL                            Ping(id)
    replies      REPL -> host   ExecReply (exec, shell) | FilesWritten | Pong | ErrorReply(id, error)

A request names its operation in `op`; a request without one is an exec (the first protocol's form).
"""

import json
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Optional, Union

# Exit status of a REPL that could not write a reply: its protocol channel was broken.
EXIT_CHANNEL_BROKEN = 70
CHANNEL_SOCKET = "socket"
CHANNEL_STDIO = "stdio"
# Where the host's socket folder is bind-mounted in the sandbox, and how the REPL learns of it.
SANDBOX_SOCKET_DIR = "/run/tito"
SANDBOX_SOCKET_PATH = SANDBOX_SOCKET_DIR + "/repl.sock"
ENV_SOCKET = "TITO_REPL_SOCKET"
ENV_TOKEN = "TITO_REPL_TOKEN"
MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_CAP = 65536  # bytes of stdout/stderr, characters of value/traceback, per call


@dataclass
class Hello:
    token: str
    type: str = "hello"


@dataclass
class Ready:
    pid: int
    python: str
    channel: str  # CHANNEL_SOCKET or CHANNEL_STDIO
    channel_error: Optional[str] = None  # why the socket could not be reached
    type: str = "ready"


@dataclass
class ExecRequest:
    code: str
    timeout: Optional[float]
    cap: int = DEFAULT_CAP
    value_cap: int = DEFAULT_CAP
    id: int = 0
    op: str = "exec"


@dataclass
class ShellRequest:
    command: str
    timeout: Optional[float]
    cap: int = DEFAULT_CAP
    id: int = 0
    op: str = "shell"


@dataclass
class WriteFilesRequest:
    files: Dict[str, str]  # relative path -> content, base64 (the host checked the paths)
    id: int = 0
    op: str = "write_files"


@dataclass
class Ping:
    id: int = 0
    op: str = "ping"


@dataclass
class ExecReply:
    id: Optional[int]
    stdout: str = ""
    stderr: str = ""
    value: Optional[str] = None  # repr of the last expression
    error: Optional[str] = None  # formatted traceback
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_dropped: int = 0  # bytes beyond the cap, counted but not kept
    stderr_dropped: int = 0
    value_truncated: bool = False  # the value or traceback was cut to value_cap
    timed_out: bool = False
    interrupted: bool = False
    duration_ms: float = 0.0
    # Bytes dropped, only counted: written to fds 1/2 between the previous call and this one (by threads or
    # processes the code left running), and written through sys.stdout/sys.stderr by threads other than the
    # call's own (since the previous call, this call included). The names of the threads whose writes were
    # dropped, and of the code's threads still running.
    background_dropped: int = 0
    background_threads: str = ""
    background_writers: str = ""
    # shell only: the command's exit status (None: the shell itself exited), how many processes it left
    # running that were killed when it returned, and whether the shell was started afresh
    exit_code: Optional[int] = None
    stopped_processes: int = 0
    shell_restarted: bool = False
    type: str = "result"


@dataclass
class FilesWritten:
    id: Optional[int]
    count: int
    type: str = "files_written"


@dataclass
class Pong:
    id: Optional[int]
    type: str = "pong"


@dataclass
class ErrorReply:
    id: Optional[int]
    error: str
    type: str = "error"


Reply = Union[ExecReply, FilesWritten, Pong, ErrorReply]
Request = Union[ExecRequest, ShellRequest, WriteFilesRequest, Ping]
_REPLIES = {"result": ExecReply, "files_written": FilesWritten, "pong": Pong, "error": ErrorReply}
_REQUESTS = {"exec": ExecRequest, "shell": ShellRequest, "write_files": WriteFilesRequest, "ping": Ping}
_NONE = type(None)
# isinstance checks for the field types used above (bool is refused where a number is meant).
_TYPES: Dict[Any, Any] = {
    str: str, Optional[str]: (str, _NONE), int: int, Optional[int]: (int, _NONE),
    float: (int, float), Optional[float]: (int, float, _NONE), bool: bool, Dict[str, str]: dict,
}
_NUMBERS = (int, float, Optional[int], Optional[float])


def encode(message: Any) -> bytes:
    """One protocol line."""
    return (json.dumps(asdict(message), ensure_ascii=True) + "\n").encode("ascii")


def decode(line: bytes) -> Dict[str, Any]:
    """A protocol line as a dict; raises ValueError if it is not a JSON object."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


def _build(cls: Any, obj: Dict[str, Any]) -> Any:
    """`cls` from the fields of `obj` that have the declared types; raises ValueError otherwise."""
    values = {}
    for f in fields(cls):
        if f.name not in obj:
            continue
        value = obj[f.name]
        expected = _TYPES.get(f.type, object)
        if isinstance(value, bool) and f.type in _NUMBERS:
            raise ValueError("field %r must be a number" % f.name)
        if not isinstance(value, expected):
            raise ValueError("field %r has type %s" % (f.name, type(value).__name__))
        if f.type == Dict[str, str] and not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ValueError("field %r must map strings to strings" % f.name)
        values[f.name] = value
    try:
        return cls(**values)
    except TypeError as exc:  # a required field is missing
        raise ValueError(str(exc)) from None


def parse_reply(obj: Dict[str, Any]) -> Reply:
    """A reply from the REPL; raises ValueError for anything that is not one."""
    cls = _REPLIES.get(obj.get("type"))
    if cls is None:
        raise ValueError("unknown reply type %r" % (obj.get("type"),))
    return _build(cls, obj)


def parse_ready(obj: Dict[str, Any]) -> Ready:
    return _build(Ready, obj)


def parse_request(obj: Dict[str, Any]) -> Request:
    """A request from the host (REPL side); raises ValueError for anything else."""
    cls = _REQUESTS.get(obj.get("op", "exec"))
    if cls is None:
        raise ValueError("unknown operation %r" % (obj.get("op"),))
    return _build(cls, obj)
