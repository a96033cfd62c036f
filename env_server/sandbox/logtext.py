"""Text a sandbox wrote, made safe for the server's log."""

from __future__ import annotations


def log_safe(data: bytes | bytearray | str) -> str:
    """`data` as one log-line fragment: decoded (invalid UTF-8 replaced), and every control character, newline
    and line separator escaped as Python's repr does (`\\n`, `\\x1b`, `\\u2028`), so that what a sandbox writes can
    never start a line of its own in the log or move the terminal's cursor."""
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", "replace")
    text = text.rstrip("\n")
    return text if text.isprintable() else repr(text)[1:-1]
