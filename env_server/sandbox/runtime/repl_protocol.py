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
    write_files  host -> REPL   create files (never over WriteFilesRequest(id, files, replace, remove)
                                an existing one unless `replace`; never through a link)
    copy_tree    host -> REPL   copy a folder of the     CopyTreeRequest(id, source)
                                image into the working directory (a task image's repository)
    hash_tree    host -> REPL   digests of the working   HashTreeRequest(id, skip, max_files)
                                directory's files (what changed is the host's business)
    read_files   host -> REPL   files' bytes             ReadFilesRequest(id, paths)
    edit         host -> REPL   the file editor          EditRequest(id, command, path, root, ...)
                                (repl_editor.py; the host words the reply for the model)
    ping         host -> REPL                            Ping(id)
    replies      REPL -> host   ExecReply (exec, shell) | FilesWritten (write_files, copy_tree) | TreeHashes |
                                FilesRead | EditReply | Pong | ErrorReply(id, error)

A request names its operation in `op`; a request without one is an exec (the first protocol's form).

Before anything else runs, the REPL sets on itself the resource limits $TITO_RLIMITS names ("nproc=64,
nofile=1024,..."; soft and hard alike, so code cannot raise them): the bwrap backend's rlimits. They are set
from inside because RLIMIT_NPROC counts per user namespace: set outside, it would count every sandbox at once.
"""

import json
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Union

# Exit status of a REPL that could not write a reply: its protocol channel was broken.
EXIT_CHANNEL_BROKEN = 70
CHANNEL_SOCKET = "socket"
CHANNEL_STDIO = "stdio"
# Where the host's socket folder is bind-mounted in the sandbox, and how the REPL learns of it.
SANDBOX_SOCKET_DIR = "/run/tito"
SANDBOX_SOCKET_PATH = SANDBOX_SOCKET_DIR + "/repl.sock"
# Where a task image keeps its repository (sandbox_images/task/Dockerfile); the `coding` environment copies it
# into the working directory when a session opens.
TASK_REPO_DIR = "/opt/tito-task/repo"
ENV_SOCKET = "TITO_REPL_SOCKET"
ENV_TOKEN = "TITO_REPL_TOKEN"
ENV_RLIMITS = "TITO_RLIMITS"
RLIMITS = ("nproc", "nofile", "fsize", "core", "as")  # resource.RLIMIT_<NAME upper>
EXIT_RLIMITS_FAILED = 71  # the REPL could not set a limit it was given: it refuses to run without it
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
    # True: an existing file (or link) at a path is replaced (removed first, so a link is never followed);
    # a folder never is. False: an existing path is an error.
    replace: bool = False
    remove: List[str] = field(default_factory=list)  # relative paths of files (or links) to delete first
    id: int = 0
    op: str = "write_files"


@dataclass
class CopyTreeRequest:
    source: str  # an absolute folder of the image (read-only), copied into the working directory
    missing_ok: bool = False  # no such folder: copies nothing (count 0) instead of an error
    id: int = 0
    op: str = "copy_tree"


@dataclass
class HashTreeRequest:
    skip: List[str] = field(default_factory=list)  # name patterns (fnmatch) of files and folders left out, at any depth
    max_files: int = 100000
    id: int = 0
    op: str = "hash_tree"


@dataclass
class ReadFilesRequest:
    paths: List[str]  # relative to the working directory
    id: int = 0
    op: str = "read_files"


@dataclass
class EditRequest:
    """One command of the editor (repl_editor.py), arguments as the model wrote them."""

    command: str  # view | create | str_replace | insert | undo_edit
    path: str
    root: str  # the folder the editor may touch (resolved paths must stay inside it)
    file_text: Optional[str] = None
    old_str: Optional[str] = None
    new_str: Optional[str] = None
    insert_line: Optional[int] = None
    view_range: Optional[List[int]] = None
    max_chars: int = 16000  # text longer than this comes back cut (`clipped`)
    id: int = 0
    op: str = "edit"


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
    # shell only: the command's exit status (the shell's own if it exited: `exit 3`; None if it was interrupted),
    # how many processes it left running that were killed when it returned, and whether the shell was started
    # afresh
    exit_code: Optional[int] = None
    stopped_processes: int = 0
    shell_restarted: bool = False
    cwd: str = ""  # shell only: the shell's working directory after the command (control characters as '?')
    type: str = "result"


@dataclass
class FilesWritten:
    id: Optional[int]
    count: int
    type: str = "files_written"


@dataclass
class TreeHashes:
    id: Optional[int]
    files: Dict[str, str] = field(default_factory=dict)  # relative path -> sha256 (hex) of its bytes
    sizes: Dict[str, int] = field(default_factory=dict)  # relative path -> bytes
    links: Dict[str, str] = field(default_factory=dict)  # relative path of a symbolic link -> its target
    skipped: List[str] = field(default_factory=list)  # neither file, folder nor link (fifos, sockets, ...)
    truncated: bool = False  # more than max_files: the listing stopped there
    type: str = "tree_hashes"


@dataclass
class FilesRead:
    id: Optional[int]
    files: Dict[str, str] = field(default_factory=dict)  # relative path -> content, base64
    missing: List[str] = field(default_factory=list)  # not a regular file (any more)
    type: str = "files_read"


# EditReply.outcome
EDIT_OUTCOMES = ("viewed", "listed", "created", "edited", "inserted", "undone", "error")
# EditReply.error when outcome == "error" (coding_env words each one for the model)
EDIT_ERRORS = (
    "relative",  # the path is not absolute (`suggestion`: the absolute path meant, when it exists)
    "outside",  # the path resolves outside the root
    "missing",  # no such path
    "exists",  # create: the path exists
    "no_parent",  # create: the parent folder does not exist
    "directory",  # only view works on a folder
    "not_file",  # neither a regular file nor a folder (a fifo, a device, a socket)
    "missing_param",  # `detail`: the parameter the command needs
    "same",  # str_replace: new_str equals old_str
    "range_on_directory", "bad_range", "range_start", "range_end",  # view_range (`line_count`: lines)
    "no_match", "multiple",  # str_replace: old_str occurs 0 or >1 times (`lines`: where; `stripped`)
    "insert_line",  # insert_line outside [0, line_count]
    "no_history",  # undo_edit: nothing to undo
    "too_large",  # `detail`: the file's size in bytes
    "binary",  # not UTF-8 text
    "os",  # `detail`: "Ran into <the OS error> while trying to read" (or "... to write to"); the path follows
)


@dataclass
class EditReply:
    id: Optional[int]
    outcome: str  # one of EDIT_OUTCOMES
    error: str = ""  # outcome "error": one of EDIT_ERRORS
    # The text shown: the file (view, undo_edit: the restored file), a line range (view_range, joined
    # without its last newline as OpenHands shows it), the snippet around an edit, or the folder listing.
    text: str = ""
    start_line: int = 1  # the line number of text's first line
    clipped: bool = False  # text was cut at the request's max_chars
    line_count: int = 0  # lines in the file
    hidden: int = 0  # listed: hidden entries right inside the folder (not shown)
    lines: List[int] = field(default_factory=list)  # error "multiple": the lines old_str occurs on
    stripped: bool = False  # str_replace matched, or failed, with old_str/new_str stripped of surrounding whitespace
    suggestion: str = ""  # error "relative"
    detail: str = ""  # error "missing_param", "too_large", "os"
    type: str = "edit"


@dataclass
class Pong:
    id: Optional[int]
    type: str = "pong"


@dataclass
class ErrorReply:
    id: Optional[int]
    error: str
    type: str = "error"


Reply = Union[ExecReply, FilesWritten, TreeHashes, FilesRead, EditReply, Pong, ErrorReply]
Request = Union[ExecRequest, ShellRequest, WriteFilesRequest, CopyTreeRequest, HashTreeRequest, ReadFilesRequest,
                EditRequest, Ping]
_REPLIES = {"result": ExecReply, "files_written": FilesWritten, "tree_hashes": TreeHashes, "files_read": FilesRead,
            "edit": EditReply, "pong": Pong, "error": ErrorReply}
_REQUESTS = {"exec": ExecRequest, "shell": ShellRequest, "write_files": WriteFilesRequest, "copy_tree": CopyTreeRequest,
             "hash_tree": HashTreeRequest, "read_files": ReadFilesRequest, "edit": EditRequest, "ping": Ping}
_NONE = type(None)
# isinstance checks for the field types used above (bool is refused where a number is meant), and the type
# every element of a container must have.
_TYPES: Dict[Any, Any] = {
    str: str, Optional[str]: (str, _NONE), int: int, Optional[int]: (int, _NONE),
    float: (int, float), Optional[float]: (int, float, _NONE), bool: bool, Dict[str, str]: dict,
    Dict[str, int]: dict, List[str]: list, List[int]: list, Optional[List[int]]: (list, _NONE),
}
_NUMBERS = (int, float, Optional[int], Optional[float])
_ELEMENTS: Dict[Any, Any] = {Dict[str, str]: str, Dict[str, int]: int, List[str]: str, List[int]: int,
                             Optional[List[int]]: int}


def encode(message: Any) -> bytes:
    """One protocol line (the messages are flat dataclasses: their fields are their __dict__)."""
    return (json.dumps(message.__dict__, ensure_ascii=True) + "\n").encode("ascii")


def decode(line: bytes) -> Dict[str, Any]:
    """A protocol line as a dict; raises ValueError if it is not a JSON object."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("not a JSON object")
    return obj


_SPECS: Dict[Any, Any] = {}


def _spec(cls: Any) -> Any:
    """Per message class, once: (name, the types its value may have, is a number, its elements' type)."""
    spec = _SPECS.get(cls)
    if spec is None:
        spec = _SPECS[cls] = [(f.name, _TYPES.get(f.type, object), f.type in _NUMBERS, _ELEMENTS.get(f.type))
                              for f in fields(cls)]
    return spec


def _build(cls: Any, obj: Dict[str, Any]) -> Any:
    """`cls` from the fields of `obj` that have the declared types; raises ValueError otherwise."""
    values = {}
    for name, expected, number, element in _spec(cls):
        if name not in obj:
            continue
        value = obj[name]
        if number and isinstance(value, bool):
            raise ValueError("field %r must be a number" % name)
        if not isinstance(value, expected):
            raise ValueError("field %r has type %s" % (name, type(value).__name__))
        if element is not None and value is not None:
            if isinstance(value, dict):
                keys, items = value.keys(), value.values()
            else:
                keys, items = (), value
            if not all(isinstance(k, str) for k in keys) or not all(
                    isinstance(v, element) and not isinstance(v, bool) for v in items):
                raise ValueError("field %r must hold %s values" % (name, element.__name__))
        values[name] = value
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


def encode_rlimits(limits: Dict[str, int]) -> str:
    """{"nproc": 64, ...} -> "nproc=64,..." (names from RLIMITS)."""
    unknown = set(limits) - set(RLIMITS)
    if unknown:
        raise ValueError("unknown rlimit(s) %s" % ", ".join(sorted(unknown)))
    return ",".join("%s=%d" % (name, int(limits[name])) for name in RLIMITS if name in limits)


def decode_rlimits(text: str) -> Dict[str, int]:
    limits = {}
    for item in filter(None, text.split(",")):
        name, _, value = item.partition("=")
        if name not in RLIMITS or not value.isdigit():
            raise ValueError("bad rlimit %r in %r" % (item, text))
        limits[name] = int(value)
    return limits
