"""Pythonic wire formats: calls written as Python, ``[get_weather(city='Paris', days=3), run(code='...')]``.

Python's own parser decides: the call list is read with ``ast`` (``ast.literal_eval`` for each value;
nothing is ever evaluated), so escapes are Python's (``'Martha\\'s'`` is ``Martha's``), a bracket or a
closing marker inside a string is text, and where the call list ends is where Python says it does
(each closing marker, or for a bare list each ``]``, is tried until the text before it parses).
JSON literals (``true``/``false``/``null``, which the templates' ``tojson`` writes) are read as such.

Some templates write string values unescaped (``"'" + value + "'"``: LFM2.5, OLMo 3; ``"%s"`` in
double quotes: Llama 4). A value holding a quote or a raw newline is then not Python, and only for
such text a scanner reads it as the template wrote it: a string runs, raw, to the first quote
followed by the next argument (``, name=``; a name the tool declares is preferred) or by the
call's end, backslashes included. A value that is also a valid Python literal is read as Python,
escapes applied, as vLLM's parser reads it (the dialect cannot tell the two apart: a value holding a
backslash or the template's own quote is read back from the template's writing as Python reads that
text), except a value written as several adjacent literals (``""  \n"x"``, Python joins them): no model
writes that, a template writing a value that starts with its quote does, so it is read raw.

The families (``PYTHONIC_FAMILIES``): ``pythonic`` (LFM2 ``<|tool_call_start|>[...]<|tool_call_end|>``,
escaped), ``pythonic_raw`` (the LFM2.5 template's unescaped strings), ``olmo`` (OLMo 3
``<function_calls>`` with one call per line) and ``pythonic_list`` (a bare list after the
assistant header, found after prose too: Llama 4, Llama 3.2, Gemma 3, ToolACE).
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from dataclasses import dataclass

from .calls import Parsed, RawCall, WireFormat, outside, short
from .values import ToolIndex, arguments_json, retype

_JSON_NAMES = {"true": True, "false": False, "null": None}


class _Bad(ValueError):
    pass


@dataclass(frozen=True)
class PythonicSyntax:
    name: str  # the wire format's key
    family: str
    markers: tuple[str, str] | None  # around the calls; None: a bare list, found where it starts
    listed: bool  # the calls are a Python list; else one call per line
    raw_strings: bool  # the template writes strings unescaped: such text is read raw when it is not Python
    example: str


# ---------------------------------------------------------------- Python's reading


def _literal(node: ast.AST):
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise _Bad("'**' in a literal")
        return {_literal(k): _literal(v) for k, v in zip(node.keys, node.values)}
    return ast.literal_eval(node)


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    raise _Bad(f"{short(ast.unparse(node), 40)!r} is not a tool name")


def _python_calls(body: str, syn: PythonicSyntax, tools: ToolIndex | None) -> list[RawCall]:
    """The calls, read by Python; raises SyntaxError when the text is not Python, _Bad when it is not calls."""
    text = body.strip()
    if syn.listed:
        tree = ast.parse(text, mode="eval").body
        if not isinstance(tree, ast.List):
            raise _Bad("the calls must be a Python list: [name(arg=value), ...]")
        nodes = tree.elts
    else:
        nodes = [stmt.value if isinstance(stmt, ast.Expr) else stmt for stmt in ast.parse(text).body]
    calls = []
    for node in nodes:
        if not isinstance(node, ast.Call):
            raise _Bad(f"{short(ast.unparse(node), 60)!r} is not a call like name(arg=value)")
        name = _dotted(node.func)
        if node.args or any(k.arg is None for k in node.keywords):
            raise _Bad(f"the call to {name} must name its arguments: {name}(arg=value, ...)")
        args = {}
        for kw in node.keywords:
            if syn.raw_strings and _concatenated(text, kw.value):
                raise _Bad(f"the value of {kw.arg!r} in the call to {name} is several string literals")
            try:
                args[kw.arg] = retype(tools, name, kw.arg, _literal(kw.value))
            except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
                raise _Bad(f"the value of {kw.arg!r} in the call to {name} is not a literal: "
                           f"{short(ast.unparse(kw.value), 60)!r}") from None
        calls.append(RawCall(name, arguments_json(args)))
    return calls


_ONE_LITERAL = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', re.S)


def _concatenated(source: str, node: ast.AST) -> bool:
    """Whether a string value is written as several adjacent literals (``"" "x"``), which Python joins. No model
    writes that in a call, but a template that writes strings unescaped does, for a value holding its quote:
    ``"%s"`` of ``"  \n"x`` is ``""  \n"x"``. Such a value is read as the template wrote it."""
    if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
        return False
    segment = ast.get_source_segment(source, node) or ""
    if _ONE_LITERAL.fullmatch(segment):  # the common case, at regex speed
        return False
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(segment).readline))
    except (tokenize.TokenError, SyntaxError):
        return False
    return sum(t.type == tokenize.STRING for t in tokens) > 1


# ---------------------------------------------------------------- the template's unescaped strings

_NAME = re.compile(r"\s*([A-Za-z_][\w.\-]*)\s*\(")
_KEY = re.compile(r"\s*([A-Za-z_]\w*)\s*=")
_SPACE, _COMMA, _CLOSE = re.compile(r"\s*"), re.compile(r"\s*,"), re.compile(r"\s*\)")
_ANY_ARG = re.compile(r"\s*,\s*[A-Za-z_]\w*\s*=")


@functools.lru_cache(maxsize=8)
def _separators(listed: bool) -> tuple[re.Pattern, re.Pattern]:
    """(between two calls, the end of a call: ')' then the next call or the end of the text)."""
    between = r"\s*," if listed else r"[ \t]*\n"
    return re.compile(between), re.compile(r"\s*\)(?:" + between + r"\s*[A-Za-z_][\w.\-]*\s*\(|\s*\Z)")


@functools.lru_cache(maxsize=256)
def _next_arg(names: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    named = (re.compile(r"\s*,\s*(?:" + "|".join(map(re.escape, names)) + r")\s*="),) if names else ()
    return (*named, _ANY_ARG)


def _raw_string_end(text: str, pos: int, quote: str, next_args: tuple[re.Pattern, ...], call_end: re.Pattern) -> int:
    """The closing quote of a raw string starting at ``pos``: the first one followed by the next argument
    (the tool's own parameter names tried first) or by the call's end."""
    for next_arg in next_args:
        at = pos
        while (at := text.find(quote, at)) >= 0:
            if next_arg.match(text, at + 1) or call_end.match(text, at + 1):
                return at
            at += 1
    raise _Bad(f"a string starting at {short(text[pos - 1:], 40)!r} is not closed")


def _literal_end(text: str, pos: int) -> int:
    """End of a non-string value: the ``,`` or ``)`` at bracket depth 0 (strings skipped)."""
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


def _value(raw: str):
    try:
        return _literal(ast.parse(raw.strip(), mode="eval").body)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError, _Bad):
        raise _Bad(f"{short(raw.strip(), 60)!r} is not a Python or JSON literal") from None


def _raw_call(text: str, pos: int, tools: ToolIndex | None, call_end: re.Pattern) -> tuple[RawCall, int]:
    m = _NAME.match(text, pos)
    if not m:
        raise _Bad(f"expected a call like name(arg=value) at {short(text[pos:], 40)!r}")
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
            end = _raw_string_end(text, pos + 1, text[pos], next_args, call_end)
            value, pos = text[pos + 1:end], end + 1
        else:
            end = _literal_end(text, pos)
            value, pos = _value(text[pos:end]), end
        args[k[1]] = retype(tools, name, k[1], value)
        sep = _COMMA.match(text, pos)
        if sep:
            pos = sep.end()


def _raw_calls(body: str, syn: PythonicSyntax, tools: ToolIndex | None) -> list[RawCall]:
    text = body.strip()
    if syn.listed:
        if not (text.startswith("[") and text.endswith("]")):
            raise _Bad("the calls must be a Python list: [name(arg=value), ...]")
        text = text[1:-1].strip()
    between, call_end = _separators(syn.listed)
    calls, pos = [], 0
    while text[pos:].strip():
        call, pos = _raw_call(text, pos, tools, call_end)
        calls.append(call)
        sep = between.match(text, pos)
        if sep:
            pos = sep.end()
        elif text[pos:].strip():
            raise _Bad(f"expected the next call or the end of the calls at {short(text[pos:], 40)!r}")
    return calls


# ---------------------------------------------------------------- regions


def _read(body: str, syn: PythonicSyntax, tools: ToolIndex | None) -> list[RawCall]:
    """The calls of one body: Python's reading, else (unescaped dialects) the template's. Raises _Bad."""
    try:
        return _python_calls(body, syn, tools)
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        if not syn.raw_strings:
            raise _Bad(e.msg if isinstance(e, SyntaxError) else str(e)) from None
        try:
            return _raw_calls(body, syn, tools)
        except _Bad:
            if isinstance(e, _Bad):
                raise e from None
            raise


_BARE_START = re.compile(r"\[\s*([A-Za-z_][\w.\-]*)\s*\(")
_MAX_ENDS = 256  # a bare list that Python cannot tokenize: the first closing brackets tried as its end


def _python_list_end(text: str, start: int) -> int | None:
    """Where the bracket opened at ``start`` closes, by Python's tokenizer (strings and escapes as Python reads
    them); None when the text is not Python (the unescaped dialects)."""
    depth, line_starts = 0, [0]
    for line in text[start:].splitlines(keepends=True):
        line_starts.append(line_starts[-1] + len(line))
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text[start:]).readline):
            if tok.type == tokenize.ERRORTOKEN:  # an unterminated string: not Python (3.12+ raises instead)
                return None
            if tok.type == tokenize.OP and tok.string in "([{":
                depth += 1
            elif tok.type == tokenize.OP and tok.string in ")]}":
                depth -= 1
                if depth == 0:
                    return start + line_starts[tok.end[0] - 1] + tok.end[1]
    except (tokenize.TokenError, SyntaxError):
        return None
    return None


def _candidates(text: str, start: int, syn: PythonicSyntax) -> tuple[int, list[tuple[int, int]]]:
    """(where the calls start, [(where they might end, where the region then ends)]) for the region at ``start``."""
    if syn.markers:
        body_from, close = start + len(syn.markers[0]), syn.markers[1]
        ends, at = [], body_from
        while (at := text.find(close, at)) >= 0:
            ends.append((at, at + len(close)))
            at += 1
        return body_from, ends
    end = _python_list_end(text, start)
    if end is not None:
        return start, [(end, end)]
    brackets = [i + 1 for i in range(start, len(text)) if text[i] == "]"][:_MAX_ENDS]
    return start, [(e, e) for e in brackets]


@functools.lru_cache(maxsize=8)
def _bracket_pattern(markers: tuple[str, str]) -> re.Pattern:
    return re.compile("|".join(map(re.escape, markers)))


def _clean_after(text: str, pos: int, syn: PythonicSyntax) -> bool:
    """No closing marker (``]`` for a bare list) after ``pos`` that no opening one after ``pos`` accounts for: what
    a cut inside a value leaves behind (the value's own later markup, then the real closing marker)."""
    markers = syn.markers or ("[", "]")
    depth = 0
    for m in _bracket_pattern(markers).finditer(text, pos):
        depth += 1 if m[0] == markers[0] else -1
        if depth < 0:
            return False
    return True


def parse_pythonic(syn: PythonicSyntax, text: str, tools: ToolIndex | None = None, strict: bool = False) -> Parsed:
    spans: list[tuple[int, int, int]] = []
    calls: list[RawCall] = []
    pos = 0
    while True:
        m = None
        if syn.markers:
            start = text.find(syn.markers[0], pos)
        else:
            m = _BARE_START.search(text, pos)
            start = m.start() if m else -1
        if start < 0:
            break
        body_from, ends = _candidates(text, start, syn)
        found, end, problem = None, 0, ""
        # A reading after which the text is clean first (else a value held the closing marker), then any reading.
        for wanted in (True, False):
            for body_end, region_end in ends:
                if wanted and not _clean_after(text, region_end, syn):
                    continue
                try:
                    found, end = _read(text[body_from:body_end], syn, tools), region_end
                    break
                except _Bad as e:
                    problem = problem or f"{e}: {short(text[body_from:body_end].strip())}"
            if found is not None:
                break
        if found is None:
            if m is not None and tools and m[1] not in tools:
                pos = start + 1  # prose in brackets, not a call of this session's tools
                continue
            problem = problem or f"{syn.markers[0] if syn.markers else 'the call list'} is not closed"
            found = [RawCall("", "", f"the tool calls do not parse ({problem}); write {syn.example}")]
            end = ends[0][1] if ends else len(text)
        spans.append((start, end, end))
        calls.extend(found)
        pos = end
    return outside(text, spans), None, calls


_LFM = ("<|tool_call_start|>", "<|tool_call_end|>")
PYTHONIC_FAMILIES = (
    PythonicSyntax("pythonic", "pythonic", _LFM, True, False,
                   f"{_LFM[0]}[<tool name>(<arg>='<text>', <n>=3)]{_LFM[1]}"),
    PythonicSyntax("pythonic_raw", "pythonic", _LFM, True, True,
                   f"{_LFM[0]}[<tool name>(<arg>='<text>', <n>=3)]{_LFM[1]}"),
    PythonicSyntax("olmo", "olmo", ("<function_calls>", "</function_calls>"), False, True,
                   "<function_calls>\n<tool name>(<arg>='<text>', <n>=3)\n</function_calls>"),
    PythonicSyntax("pythonic_list", "pythonic-list", None, True, True, '[<tool name>(<arg>="<text>", <n>=3)]'),
)


def _format(syn: PythonicSyntax) -> WireFormat:
    return WireFormat(syn.name, lambda text, tools=None, strict=False: parse_pythonic(syn, text, tools, strict),
                      syn.example, syn.family, bare=syn.markers is None)


FORMATS = tuple(_format(syn) for syn in PYTHONIC_FAMILIES)
