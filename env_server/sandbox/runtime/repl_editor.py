"""The file editor of the `coding` environment, inside the sandbox (stdlib only, Python 3.9+).

The REPL runs one `Editor` per session (its undo history lives in the REPL process) and answers each
`repl_protocol.EditRequest` with a typed `EditReply`: what happened, the text to show and the figures a
message needs. The host words the message the model reads (env_server/environments/coding_tools.py), in
OpenHands' words. What the editor does follows OpenHands' editor (openhands-aci `OHEditor`, the
`str_replace_editor` tool OpenHands and SWE-agent trajectories use):

- `view`: a file's text (or `view_range` [start, end], 1-based, end -1 = to the end; an end past the
  last line is clamped), or a folder's entries up to 2 levels deep, hidden ones left out and counted;
- `create`: a new file (never over an existing path); `str_replace`: `old_str` must occur exactly once
  (no match: tried again with both strings stripped of surrounding whitespace), the reply carries the
  lines around the edit; `insert`: `new_str` after line `insert_line` (0 = at the top);
  `undo_edit`: the file as it was before its last edit (the last 10 per file).

Paths must be absolute and, resolved on the real filesystem (links followed), stay inside `root`:
a link that leads out is refused like any other path outside. Files are opened without following a
link at the last step and only when they are regular files (a fifo would block the REPL); files over
10 MB and files that are not UTF-8 text are refused. A file's newlines are kept as they are.
"""

import os
import re
import stat
from pathlib import PurePosixPath

import repl_protocol as protocol

MAX_FILE_BYTES = 10 * 1024 * 1024
SNIPPET_CONTEXT = 4  # lines shown around an edit, each side
HISTORY_PER_FILE = 10
HISTORY_MAX_BYTES = 32 * 1024 * 1024  # all files' undo history together; the oldest entries go first
MAX_LISTED = 20000  # folder entries walked for one view


class EditError(Exception):
    """Ends a command with an error reply: `code` is one of protocol.EDIT_ERRORS."""

    def __init__(self, code, **fields):
        super().__init__(code)
        self.code = code
        self.fields = fields


def split_lines(text):
    """The file's lines as iterating over it in Python gives them ('\\n' ends a line; the last may lack it)."""
    parts = text.split("\n")
    lines = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


class Editor:
    def __init__(self):
        self.history = {}  # real path -> [earlier texts], oldest first
        self.history_bytes = 0

    # -- entry ------------------------------------------------------------------------------------

    def run(self, req):
        try:
            return self._run(req)
        except EditError as exc:
            return protocol.EditReply(id=req.id, outcome="error", error=exc.code, **exc.fields)

    def _run(self, req):
        root = os.path.realpath(req.root)
        shown = str(PurePosixPath(req.path)) if req.path else req.path
        real = self._check_path(req, root, shown)
        if req.command == "view":
            if os.path.isdir(real):
                return self._list(req, real, shown)
            return self._view(req, real)
        if req.command == "create":
            if req.file_text is None:
                raise EditError("missing_param", detail="file_text")
            return self._create(req, real)
        if req.command == "str_replace":
            if req.old_str is None:
                raise EditError("missing_param", detail="old_str")
            if req.new_str == req.old_str:
                raise EditError("same")
            return self._str_replace(req, real)
        if req.command == "insert":
            if req.insert_line is None:
                raise EditError("missing_param", detail="insert_line")
            if req.new_str is None:
                raise EditError("missing_param", detail="new_str")
            return self._insert(req, real)
        if req.command == "undo_edit":
            return self._undo(req, real)
        raise EditError("missing_param", detail="command")

    def _check_path(self, req, root, shown):
        """The resolved path, if the command may use it (OpenHands' order of checks)."""
        path = req.path
        if not path.startswith("/"):
            meant = os.path.join(root, path)
            inside = os.path.realpath(meant)
            ok = (inside == root or inside.startswith(root + "/")) and os.path.exists(meant)
            raise EditError("relative", suggestion=str(PurePosixPath(meant)) if ok else "")
        if "\x00" in path:
            raise EditError("missing")
        real = os.path.realpath(path)
        if real != root and not real.startswith(root + "/"):
            raise EditError("outside")
        exists = os.path.lexists(path)
        if req.command == "create" and exists:
            raise EditError("exists")
        if req.command != "create" and not exists:
            raise EditError("missing")
        if req.command != "view" and os.path.isdir(real):
            raise EditError("directory")
        return real

    # -- reading and writing ----------------------------------------------------------------------

    @staticmethod
    def _read(real):
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError as exc:
            raise EditError("os", detail="Ran into %s while trying to read" % exc)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise EditError("not_file")
            if st.st_size > MAX_FILE_BYTES:
                raise EditError("too_large", detail=str(st.st_size))
            data = f.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise EditError("too_large", detail=str(len(data)))
        if b"\x00" in data[:8192]:
            raise EditError("binary")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise EditError("binary")

    @staticmethod
    def _write(real, text, create=False):
        flags = os.O_WRONLY | os.O_NOFOLLOW | (os.O_CREAT | os.O_EXCL if create else os.O_TRUNC)
        try:
            fd = os.open(real, flags, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(text.encode("utf-8", "replace"))
        except OSError as exc:
            raise EditError("os", detail="Ran into %s while trying to write to" % exc)

    def _remember(self, real, text):
        entries = self.history.setdefault(real, [])
        entries.append(text)
        self.history_bytes += len(text)
        while len(entries) > HISTORY_PER_FILE:
            self.history_bytes -= len(entries.pop(0))
        while self.history_bytes > HISTORY_MAX_BYTES:
            oldest = next((k for k, v in self.history.items() if v), None)
            if oldest is None:
                break
            self.history_bytes -= len(self.history[oldest].pop(0))

    @staticmethod
    def _reply(req, outcome, text="", **fields):
        clipped = len(text) > req.max_chars
        return protocol.EditReply(id=req.id, outcome=outcome, text=text[:req.max_chars] if clipped else text,
                                  clipped=clipped, **fields)

    # -- commands ---------------------------------------------------------------------------------

    def _list(self, req, real, shown):
        if req.view_range:
            raise EditError("range_on_directory")
        hidden = 0
        entries = [(shown, True)]
        try:
            top = sorted(os.listdir(real))
        except OSError as exc:
            raise EditError("os", detail="Ran into %s while trying to read" % exc)
        for name in top:
            if name.startswith("."):
                hidden += 1
                continue
            if len(entries) >= MAX_LISTED:
                continue
            path = os.path.join(real, name)
            is_dir = os.path.isdir(path)
            entries.append((shown.rstrip("/") + "/" + name, is_dir))
            if is_dir and not os.path.islink(path) and len(entries) < MAX_LISTED:
                try:
                    below = sorted(os.listdir(path))
                except OSError:
                    below = []
                for sub in below[:MAX_LISTED - len(entries)]:
                    if not sub.startswith("."):
                        entries.append((shown.rstrip("/") + "/" + name + "/" + sub,
                                        os.path.isdir(os.path.join(path, sub))))
        entries.sort()  # as `find ... | sort` lists them
        text = "\n".join(p + "/" if is_dir else p for p, is_dir in entries)
        return self._reply(req, "listed", text, hidden=hidden)

    def _view(self, req, real):
        text = self._read(real)
        lines = split_lines(text)
        count = len(lines)
        if not req.view_range:
            return self._reply(req, "viewed", text, line_count=count)
        if len(req.view_range) != 2:
            raise EditError("bad_range")
        start, end = req.view_range
        if start < 1 or start > count:
            raise EditError("range_start", line_count=count)
        if end == -1 or end > count:
            end = count
        if end < start:
            raise EditError("range_end", line_count=count)
        shown = "\n".join("".join(lines[start - 1:end]).splitlines())
        return self._reply(req, "viewed", shown, start_line=start, line_count=count)

    def _create(self, req, real):
        parent = os.path.dirname(real)
        if not os.path.isdir(parent):
            raise EditError("no_parent")
        self._write(real, req.file_text, create=True)
        return self._reply(req, "created")

    def _str_replace(self, req, real):
        text = self._read(real)
        old, new = req.old_str, req.new_str or ""
        found = [m.start() for m in re.finditer(re.escape(old), text)]
        stripped = False
        if not found:
            old, new, stripped = old.strip(), new.strip(), True
            found = [m.start() for m in re.finditer(re.escape(old), text)]
            if not found:
                raise EditError("no_match", stripped=True)
        if len(found) > 1:
            lines = sorted({text.count("\n", 0, at) + 1 for at in found})
            raise EditError("multiple", lines=lines, stripped=stripped)
        at = found[0]
        edited = text[:at] + new + text[at + len(old):]
        self._write(real, edited)
        self._remember(real, text)
        line = text.count("\n", 0, at) + 1
        first = max(0, line - SNIPPET_CONTEXT)
        last = line + SNIPPET_CONTEXT + new.count("\n")
        snippet = "".join(split_lines(edited)[first:last])
        return self._reply(req, "edited", snippet, start_line=first + 1, stripped=stripped,
                           line_count=len(split_lines(edited)))

    def _insert(self, req, real):
        text = self._read(real)
        lines = split_lines(text)
        count = len(lines)
        at = req.insert_line
        if at < 0 or at > count:
            raise EditError("insert_line", line_count=count)
        before = lines[:at]
        if before and not before[-1].endswith("\n"):  # the last line had no newline: end it first
            before[-1] += "\n"
        added = [line + "\n" for line in req.new_str.split("\n")]
        edited = "".join(before + added + lines[at:])
        self._write(real, edited)
        self._remember(real, text)
        first = max(0, at - SNIPPET_CONTEXT)
        last = min(count + len(added), at + SNIPPET_CONTEXT + len(added))
        snippet = "".join(split_lines(edited)[first:last])
        return self._reply(req, "inserted", snippet, start_line=max(1, at - SNIPPET_CONTEXT + 1),
                           line_count=count + len(added))

    def _undo(self, req, real):
        self._read(real)  # still a text file we may open
        entries = self.history.get(real)
        if not entries:
            raise EditError("no_history")
        earlier = entries.pop()
        self.history_bytes -= len(earlier)
        self._write(real, earlier)
        return self._reply(req, "undone", earlier, line_count=len(split_lines(earlier)))
