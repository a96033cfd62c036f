"""The pythonic wire format: ``<|tool_call_start|>[f(a='x', n=3), g(b=[1, 2])]<|tool_call_end|>`` (LFM2/2.5).

Read with ``ast`` (``ast.literal_eval`` for each value; nothing is ever evaluated). The call list
is scanned by hand because one dialect is not Python: two configurations of one parser,
decided at registration by the round trip (the probe's code value has quotes and newlines):
- ``pythonic``: string arguments are Python literals (``'it\\'s\\n'``; LFM2 v2, LFM2.5-VL escape them);
- ``pythonic_raw``: the LFM2.5 template writes ``"'" + value + "'"`` unescaped, so a string runs,
  raw, to the first quote followed by the next argument (``, name=``; a name the tool's schema
  knows is preferred) or by the end of the call (``)`` then ``,``/``]``): exactly the text the
  template wrote, backslashes included.
The other values (numbers, ``True``/``None``, lists, and the JSON the templates write for
mappings) are Python or JSON literals. Quoted values of non-string parameters are typed by the
schema. (``parse_response``'s closer regex stops at the first ``)``, even inside a string.)
"""

from __future__ import annotations

import ast
import functools
import json
import re

from .parsing import Parsed, RawCall, WireFormat, read_blocks, short
from .values import ToolIndex, arguments_json, retype_literal

_START, _END = "<|tool_call_start|>", "<|tool_call_end|>"
_EXAMPLE = f"{_START}[<tool name>(<arg>='<text>', <n>=3)]{_END}"
_NAME = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*\(")
_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=")
_SPACE, _COMMA, _CLOSE = re.compile(r"\s*"), re.compile(r"\s*,"), re.compile(r"\s*\)")
_ANY_ARG = re.compile(r"\s*,\s*[A-Za-z_]\w*\s*=")
_CALL_END = re.compile(r"\s*\)\s*(?:,\s*[A-Za-z_][\w.\-]*\s*\(|\]\s*\Z)")


class _Bad(ValueError):
    pass


def _string_end(text: str, pos: int, quote: str, next_args: tuple[re.Pattern, ...], escaped: bool) -> int:
    """The closing quote of a string starting at ``pos``: followed by the next argument or the call's end.

    The patterns are tried in turn: the tool's own parameter names first, any name second. In the
    escaped dialect a backslash escapes the next character (a Python literal); in the raw one it is text."""
    for next_arg in next_args:
        i = pos
        while i < len(text):
            ch = text[i]
            if escaped and ch == "\\":
                i += 2
                continue
            if ch == quote and (next_arg.match(text, i + 1) or _CALL_END.match(text, i + 1)):
                return i
            i += 1
    raise _Bad(f"a string starting at {short(text[pos - 1:], 40)!r} is not closed")


def _python_string(literal: str) -> str:
    """A quoted Python string literal's value; raw control characters (a model's slip) are escaped first."""
    for attempt in (literal, literal.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")):
        try:
            value = ast.literal_eval(attempt)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(value, str):
            return value
    raise _Bad(f"{short(literal, 60)!r} is not a Python string literal")


@functools.lru_cache(maxsize=256)
def _next_arg(names: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    named = (re.compile(r"\s*,\s*(?:" + "|".join(map(re.escape, names)) + r")\s*="),) if names else ()
    return (*named, _ANY_ARG)


def _literal_end(text: str, pos: int) -> int:
    """End of a non-string literal: up to the ``,`` or ``)`` at bracket depth 0 (JSON/Python strings skipped)."""
    depth, i, quote = 0, pos, ""
    while i < len(text):
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif ch == "," and depth == 0:
            return i
        i += 1
    raise _Bad(f"the value at {short(text[pos:], 40)!r} is not closed")


def _literal(raw: str):
    raw = raw.strip()
    try:
        return ast.literal_eval(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # TypeError: {[1]: 2}
        pass
    try:  # the templates write mappings with tojson: true/false/null
        return json.loads(raw)
    except (ValueError, RecursionError):
        raise _Bad(f"{short(raw, 60)!r} is not a Python or JSON literal") from None


def _call(text: str, pos: int, tools: ToolIndex | None, escaped: bool) -> tuple[RawCall, int]:
    m = _NAME.match(text, pos)
    if not m:
        raise _Bad(f"expected a call like name(...) at {short(text[pos:], 40)!r}")
    name, pos = m[1], m.end()
    next_args = _next_arg(tuple(sorted((tools or {}).get(name, {}), key=len, reverse=True)))
    args: dict = {}
    while True:
        close = _CLOSE.match(text, pos)
        if close:
            return RawCall(name, arguments_json(args)), close.end()
        k = _KEY.match(text, pos)
        if not k:
            raise _Bad(f"expected name=value or ')' in the call to {name} at {short(text[pos:], 40)!r}")
        pos = _SPACE.match(text, k.end()).end()
        if pos < len(text) and text[pos] in "'\"":
            end = _string_end(text, pos + 1, text[pos], next_args, escaped)
            value = _python_string(text[pos:end + 1]) if escaped else text[pos + 1:end]
            pos = end + 1
        else:
            end = _literal_end(text, pos)
            value, pos = _literal(text[pos:end]), end
        args[k[1]] = retype_literal(tools, name, k[1], value)
        sep = _COMMA.match(text, pos)
        if sep:
            pos = sep.end()


def _calls(body: str, tools: ToolIndex | None, escaped: bool) -> list[RawCall]:
    text = body.strip()
    if not (text.startswith("[") and text.endswith("]")):
        raise _Bad("the calls must be a Python list: [name(arg=value), ...]")
    text = text[1:-1].rstrip() + "]"  # the sentinel ']' marks the end for _CALL_END
    calls, pos = [], 0
    while text[pos:].strip() != "]":
        call, pos = _call(text, pos, tools, escaped)
        calls.append(call)
        sep = _COMMA.match(text, pos)
        if sep:
            pos = sep.end()
        elif text[pos:].strip() != "]":
            raise _Bad(f"expected ',' or the end of the list at {short(text[pos:], 40)!r}")
    return calls


def parse_pythonic(text: str, tools: ToolIndex | None = None, escaped: bool = True) -> Parsed:
    def read(body: str) -> list[RawCall]:
        try:
            return _calls(body, tools, escaped)
        except _Bad as e:
            return [RawCall("", "", f"the tool calls do not parse ({e}): {short(body)}; write {_EXAMPLE}")]

    content, calls = read_blocks(text, _START, _END, _EXAMPLE, read)
    return content, None, calls


PYTHONIC = WireFormat("pythonic", parse_pythonic, _EXAMPLE)
PYTHONIC_RAW = WireFormat("pythonic_raw", lambda text, tools=None: parse_pythonic(text, tools, escaped=False), _EXAMPLE)
