"""Tag wire formats: one tag per argument, values written raw and typed by the tool's schema.

One reader, configured per family (``TAG_FAMILIES``):
- ``xml`` (Qwen3.5/3.6/3.8, Qwen3-Coder, Nemotron 3): ``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n
  </parameter>\\n</function>\\n</tool_call>``; the template frames each value in one newline on each
  side, which is removed (a value's own newlines are kept, unlike ``parse_response``);
- ``seed`` (Seed-OSS): the same tags in ``<seed:tool_call>``, values unframed;
- ``minimax`` (MiniMax M2): ``<minimax:tool_call>\\n<invoke name="NAME">\\n<parameter name="K">V</parameter>
  \\n</invoke>\\n</minimax:tool_call>``, several invokes per block;
- ``atem``: ``<atem:function_calls><atem:invoke name="NAME"><atem:parameter name="K">V</atem:parameter>``;
- ``arg_kv`` (GLM-4.5/4.6/4.7): ``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n
  </tool_call>`` (GLM-4.7 drops the newlines).

Where a value ends comes from the grammar, never from the first closing tag (what vLLM's, SGLang's
and llama.cpp's parsers do, so a model writing a file that holds tool-call markup runs a phantom
call): a closing tag ends a value only where the grammar allows one there, i.e. followed by a
parameter the tool declares (and has not had yet) or by the call's end; the value's own markup must
be balanced (an opening tag at the start of a line that the value does not close means the model
forgot this value's closing tag: the call is refused with that message, not run with the next
parameter inside the value); and the text after the block must not hold stray closing tags (what a
wrong cut inside a value that holds a whole call leaves behind). The candidates are tried in order
(backtracking); when none leaves clean text after the block (a closing tag that no opening tag
after the block accounts for), the first is taken. A call that does
not read at all is a call with ``error`` naming the furthest problem found.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from .calls import Parsed, RawCall, WireFormat, outside, short
from .values import ToolIndex, allows_more, arguments_json, typed_value

_WS = re.compile(r"\s*")
_MAX_ALTERNATIVES = 64  # readings tried per block before taking the first (markup nested in values)


@dataclass(frozen=True)
class TagSyntax:
    name: str  # the wire format's key
    family: str
    wrap: tuple[str, str] | None  # the block around calls; None: each call stands alone
    call_open: re.Pattern  # group 1: the tool name
    call_close: str
    param_open: re.Pattern  # group 1: the parameter name
    param_close: str
    frame: str  # what the template writes on each side of a value, removed once
    shapes: tuple[str, str]  # the call and parameter tags as the model writes them, for messages
    example: str
    # Not strict: a value whose closing tag is missing ends where the next parameter's tag starts a line, as the
    # family's deployment parser reads it (vLLM's qwen3_coder: a value ends at </parameter> or before <parameter=).
    next_param_closes: bool = False


def _tags(syn: TagSyntax) -> tuple[re.Pattern, re.Pattern, re.Pattern]:
    """(any opener of a block or call, the markup a value's balance check counts: openers at the start of a
    line, closers anywhere, each group named by its kind, and the same with openers anywhere)."""
    kinds = {"call": (syn.call_open.pattern, re.escape(syn.call_close)),
             "param": (syn.param_open.pattern, re.escape(syn.param_close))}
    if syn.wrap:
        kinds["wrap"] = (re.escape(syn.wrap[0]), re.escape(syn.wrap[1]))
    opens = [f"(?P<open_{k}>{o})" for k, (o, _) in kinds.items()]
    closes = [f"(?P<close_{k}>{c})" for k, (_, c) in kinds.items()]
    markup = r"(?m)^[ \t]*(?:" + "|".join(opens) + ")|" + "|".join(closes)
    anywhere = "|".join(opens + closes)
    block = "|".join(f"(?:{p})" for p in [syn.call_open.pattern] + ([re.escape(syn.wrap[0])] if syn.wrap else []))
    return re.compile(block), re.compile(_renumbered(markup)), re.compile(_renumbered(anywhere))


def _renumbered(pattern: str) -> str:
    """The syntax's patterns capture the name (group 1); inside the markup pattern those groups are dropped."""
    return re.sub(r"\((?!\?)", "(?:", pattern)


class _Reader:
    """One completion read with one syntax. Alternatives are generators, earliest value ends first."""

    def __init__(self, syn: TagSyntax, text: str, tools: ToolIndex | None, strict: bool = False) -> None:
        self.syn, self.text, self.tools, self.strict = syn, text, tools or {}, strict
        # Not strict, a parameter the tool does not declare is read where its schema allows more (the deployment
        # parser reads any); and for a block with no reading by the grammar, a value the tag of a parameter the tool
        # declares closes (`lenient`, the deployment parser's reading).
        self.lenient = False
        self._rest: dict[int, bool] = {}  # position -> whether the text from there reads (rest_reads)
        self.opener, self.markup, self.tags = _SYNTAX_TAGS[syn.name]
        self.split_at = re.compile(re.escape(syn.param_close) + r"\s*")
        self.closers = tuple(c for c in (syn.param_close, syn.call_close, syn.wrap[1] if syn.wrap else None) if c)
        self.failure: tuple[int, str] = (-1, "")

    def fail(self, pos: int, message: str) -> None:
        """Keep the problem found furthest into the text (the first one found there): what the model is told."""
        if pos > self.failure[0]:
            self.failure = (pos, message)

    # ------------------------------------------------------------ the grammar

    def block(self, start: int) -> Iterator[tuple[list[RawCall], int]]:
        syn, text = self.syn, self.text
        if syn.wrap and text.startswith(syn.wrap[0], start):
            yield from self.calls_then_close(start + len(syn.wrap[0]), [])
        else:
            for call, end in self.call(start):
                yield [call], end

    def calls_then_close(self, pos: int, done: list[RawCall]) -> Iterator[tuple[list[RawCall], int]]:
        syn, text = self.syn, self.text
        at = _WS.match(text, pos).end()
        if done and text.startswith(syn.wrap[1], at):
            yield done, at + len(syn.wrap[1])
            return
        if not syn.call_open.match(text, at):
            self.fail(at, (f"expected {syn.wrap[1]} after the call" if done else
                           f"{syn.wrap[0]} is not followed by a call tag {syn.shapes[0]}")
                      + f" at {short(text[at:], 60)!r}")
            return
        for call, end in self.call(at):
            yield from self.calls_then_close(end, done + [call])

    def call(self, start: int) -> Iterator[tuple[RawCall, int]]:
        m = self.syn.call_open.match(self.text, start)
        name = m[1].strip()
        for args, end, repairs in self.params(name, m.end(), {}, ()):
            split = self.splits(name, args)
            if split:
                yield RawCall(name, "", split), end
                continue
            typed = {k: typed_value(self.tools, name, k, v) for k, v in args.items()}
            yield RawCall(name, arguments_json(typed), repairs=repairs), end

    def splits(self, name: str, args: dict[str, str]) -> str:
        """Why the reading is not the only one, or "": a value holds a closing tag followed by the tag of one of the
        call's parameters (or one the tool declares), which is exactly how one value ends and the next begins, so the
        text reads as this call and as one with that value split there. Such a call is answered, never guessed.
        A closing tag that closes a parameter tag opened inside the value (at the start of a line) is the value's own
        markup: a file holding a whole call of the same tool (vLLM's qwen3_coder pairs them the same way)."""
        names = set(args) | set(self.tools.get(name) or ())
        for key, value in args.items():
            for m in self.unpaired_closers(value):
                p = self.syn.param_open.match(value, m.end())
                if p and p[1].strip() in names:
                    return (f"the value of {key!r} holds {self.syn.param_close} followed by {p[0]!r}, which is how one "
                            f"value ends and the next begins, so the call to {name} reads two ways; write the value "
                            f"without that sequence, or in another call; write {self.syn.example}")
        return ""


    def unpaired_closers(self, value: str) -> Iterator[re.Match]:
        """Each closing tag in ``value`` (with the whitespace after it) that closes no parameter tag opened inside
        the value at the start of a line."""
        depth = 0
        for m in self.markup.finditer(value):
            if m.lastgroup == "open_param":
                depth += 1
            elif m.lastgroup == "close_param":
                if depth:
                    depth -= 1
                else:
                    yield self.split_at.match(value, m.start())

    def declares(self, name: str, key: str) -> bool:
        declared = self.tools.get(name)
        return not declared or key in declared

    def params(self, name: str, pos: int, args: dict[str, str], repairs: tuple[str, ...]
               ) -> Iterator[tuple[dict[str, str], int, tuple[str, ...]]]:
        syn, text = self.syn, self.text
        at = _WS.match(text, pos).end()
        if text.startswith(syn.call_close, at):
            yield args, at + len(syn.call_close), repairs
            return
        m = syn.param_open.match(text, at)
        if not m:
            self.fail(at, f"expected {syn.shapes[1]} or {syn.call_close} in the call to {name} at "
                          f"{short(text[at:], 60)!r}" if at < len(text) else
                      f"the call to {name} was not closed with {syn.call_close}")
            return
        key = m[1].strip()
        declared = self.tools.get(name)
        undeclared = bool(declared) and key not in declared
        if key in args or (undeclared and (self.strict or not allows_more(declared))):
            self.fail(at, f"the parameter {key!r} is given twice in the call to {name}" if key in args else
                      f"{name} has no parameter {key!r} (its parameters: {', '.join(declared)})")
            return
        if undeclared:  # the deployment parser reads any parameter; the schema allows it
            repairs += (f"read parameter {key!r}, which {name} does not declare (its schema allows more)",)
        ends, undeclared_after = 0, self.undeclared_ends(name, m.end(), args.keys() | {key})
        for end in self.value_ends(name, m.end(), args.keys() | {key}):
            ends += 1
            value = text[m.end():end]
            unpaired = {m.end() + u.start() for u in self.unpaired_closers(value)}
            passed = () if self.strict or not unpaired.intersection(undeclared_after) else (  # a reading chosen
                f"read {syn.param_close} followed by the tag of a parameter {name} does not declare as text of "
                f"{key!r}, as vLLM reads it",)
            unclosed = self.unclosed_markup(value, name, args.keys() | {key})
            if unclosed:
                kind, tag, line = unclosed
                self.fail(m.end(), f"the parameter {key!r} of {name} was not closed with {syn.param_close} before "
                                   f"{tag!r}")
                if (self.lenient and syn.next_param_closes and kind == "param" and syn.param_close not in value[:line]
                        and self.declares(name, syn.param_open.match(tag)[1].strip())):
                    cut = m.end() + line  # the closing tag was forgotten: the next parameter's tag closes the value
                    closed = f"closed {m[0].strip()} with {syn.param_close} before {tag}"
                    yield from self.params(name, cut, {**args, key: _unframe(text[m.end():cut], syn.frame)},
                                           repairs + (closed,))
                continue
            yield from self.params(name, end + len(syn.param_close), {**args, key: _unframe(value, syn.frame)},
                                   repairs + passed)
        if not ends:
            self.fail(m.end(), f"the parameter {key!r} of {name} was not closed with {syn.param_close}")

    def value_ends(self, name: str, start: int, given: set[str]) -> Iterator[int]:
        """Each closing tag after ``start`` that the grammar allows (``all_ends``); those followed by a parameter the
        tool does not declare last: vLLM's qwen3_coder reads a value on past them where a later one ends it."""
        undeclared = self.undeclared_ends(name, start, given)
        yield from (at for at in self.all_ends(start, given) if at not in undeclared)
        yield from undeclared

    def all_ends(self, start: int, given: set[str]) -> Iterator[int]:
        """Followed by the call's end or a parameter the call has not had (one the tool does not declare is read
        where its schema allows more, else refused)."""
        syn, text = self.syn, self.text
        at = start
        while (at := text.find(syn.param_close, at)) >= 0:
            after = _WS.match(text, at + len(syn.param_close)).end()
            nxt = syn.param_open.match(text, after)
            if text.startswith(syn.call_close, after) or (nxt and nxt[1].strip() not in given):
                yield at
            at += 1

    def undeclared_ends(self, name: str, start: int, given: set[str]) -> list[int]:
        """The closing tags after ``start`` followed by the tag of a parameter the tool does not declare."""
        declared, close, out = self.tools.get(name), self.syn.param_close, []
        for at in self.all_ends(start, given) if declared else ():
            nxt = self.syn.param_open.match(self.text, _WS.match(self.text, at + len(close)).end())
            if nxt and nxt[1].strip() not in declared:
                out.append(at)
        return out

    def unclosed_markup(self, value: str, name: str, given: set[str]) -> tuple[str, str, int] | None:
        """The first opening tag at the start of a line that the value does not close, as (kind, the tag, where its
        line starts in the value), or None: a call's or block's, or a parameter's the call has not had (the model
        forgot this value's closing tag before it: whether the tool declares it is decided where it is read). The
        tag of a parameter the call has had is the value's own text (code that writes this markup)."""
        stack: list[tuple[str, str, int]] = []  # (kind, the tag as written, where its line starts)
        for m in self.markup.finditer(value):
            what, kind = m.lastgroup.split("_", 1)
            tag = m[0].strip()
            if what == "open":
                if kind == "param" and ((p := self.syn.param_open.match(tag)) is None or p[1].strip() in given):
                    continue
                stack.append((kind, tag, m.start()))
            elif stack and stack[-1][0] == kind:
                stack.pop()
        return stack[0] if stack else None

    # ------------------------------------------------------------ the completion

    def clean_after(self, pos: int) -> bool:
        """No closing tag after ``pos`` that no opening tag before it (after ``pos``) accounts for: what a cut
        inside a value leaves behind (the value's own later markup, and then its real closing tags)."""
        depth = 0
        for m in self.tags.finditer(self.text, pos):
            depth += 1 if m.lastgroup.startswith("open") else -1
            if depth < 0:
                return False
        return True

    def reading(self, start: int) -> tuple[list[RawCall], int] | None:
        """The block's first reading after which the rest of the text reads, else its first reading, else None."""
        first = None
        for k, (found, end) in enumerate(self.block(start)):
            if first is None:
                first = (found, end)
            if self.rest_reads(end):
                return found, end
            if k + 1 >= _MAX_ALTERNATIVES:
                break
        return first

    def rest_reads(self, pos: int) -> bool:
        """Whether the text after ``pos`` reads: no closing tag outside a block (what a cut inside a value leaves
        behind: the value's own later markup, then its real closing tags), and each later block has a reading
        after which the rest reads too (a later call's value may hold closing tags of its own)."""
        if pos not in self._rest:
            nxt = self.opener.search(self.text, pos)
            stop = nxt.start() if nxt else len(self.text)
            if any(m.lastgroup.startswith("close") for m in self.tags.finditer(self.text, pos, stop)):
                self._rest[pos] = False
            elif nxt is None:
                self._rest[pos] = True
            else:
                self._rest[pos] = False  # (a block whose readings lead back here reads no further)
                failure = self.failure
                self._rest[pos] = any(self.rest_reads(end) for _, (_, end) in
                                      zip(range(_MAX_ALTERNATIVES), self.block(nxt.start())))
                self.failure = failure
        return self._rest[pos]

    def read(self) -> tuple[str, list[RawCall]]:
        text, spans, calls, pos = self.text, [], [], 0
        while (m := self.opener.search(text, pos)) is not None:
            start = m.start()
            self.failure = (-1, "")
            self.lenient = False
            first = self.reading(start)
            if first is None and not self.strict:
                failure, self.lenient, self._rest = self.failure, True, {}
                first = self.reading(start)
                self.failure, self.lenient, self._rest = failure, False, {}  # unread: the grammar's message
            if first is None:
                message = self.failure[1] or f"the tool call does not read: {short(text[start:], 80)!r}"
                first = ([RawCall(_name_at(self.syn, text, start), "", f"{message}; write {self.syn.example}")],
                         self.unread_end(start))
            found, end = first
            spans.append((start, end, end))
            calls.extend(found)
            pos = end
        return outside(text, spans), calls

    def unread_end(self, start: int) -> int:
        """Where a block that does not read ends: at its closing tag (the first one after which the text is clean:
        not one inside a value), else where the next block starts on a line of its own, else the text's end.
        Never inside the block: markup in its values must not become calls."""
        text, close = self.text, self.syn.wrap[1] if self.syn.wrap else self.syn.call_close
        at, first = start, -1
        while (at := text.find(close, at + 1)) >= 0:
            end = at + len(close)
            if self.clean_after(end):
                return end
            first = end if first < 0 else first
        if first >= 0:
            return first
        pos = _after_opening(self.syn, text, start)
        while (m := self.opener.search(text, pos)) is not None:
            if m.start() == 0 or text[m.start() - 1] == "\n":
                return m.start()
            pos = m.start() + 1
        return len(text)


def _unframe(value: str, frame: str) -> str:
    return value.removeprefix(frame).removesuffix(frame) if frame else value


def _name_at(syn: TagSyntax, text: str, start: int) -> str:
    """The tool name of a call that does not read, if its opening tag names one."""
    at = start + len(syn.wrap[0]) if syn.wrap and text.startswith(syn.wrap[0], start) else start
    m = syn.call_open.match(text, _WS.match(text, at).end())
    return m[1].strip() if m else ""


def _after_opening(syn: TagSyntax, text: str, start: int) -> int:
    """Past the block's opening tag and its first call's: a later block may start from there."""
    at = start + len(syn.wrap[0]) if syn.wrap and text.startswith(syn.wrap[0], start) else start
    m = syn.call_open.match(text, _WS.match(text, at).end())
    return m.end() if m else at + 1


def parse_tags(syn: TagSyntax, text: str, tools: ToolIndex | None = None, strict: bool = False) -> Parsed:
    content, calls = _Reader(syn, text, tools, strict).read()
    return content, None, calls


TAG_FAMILIES = (
    TagSyntax("xml", "qwen-xml", ("<tool_call>", "</tool_call>"), re.compile(r"<function=([^>\n]+)>"), "</function>",
              re.compile(r"<parameter=([^>\n]+)>"), "</parameter>", "\n",
              ("<function=NAME>", "<parameter=NAME>"),
              "<tool_call>\n<function=<tool name>>\n<parameter=<name>>\n<value>\n</parameter>\n</function>\n"
              "</tool_call>", next_param_closes=True),
    TagSyntax("seed", "seed-oss", ("<seed:tool_call>", "</seed:tool_call>"), re.compile(r"<function=([^>\n]+)>"),
              "</function>", re.compile(r"<parameter=([^>\n]+)>"), "</parameter>", "",
              ("<function=NAME>", "<parameter=NAME>"),
              "<seed:tool_call>\n<function=<tool name>>\n<parameter=<name>><value></parameter>\n</function>\n"
              "</seed:tool_call>"),
    TagSyntax("minimax", "minimax-m2", ("<minimax:tool_call>", "</minimax:tool_call>"),
              re.compile(r'<invoke name="([^"\n]+)">'), "</invoke>", re.compile(r'<parameter name="([^"\n]+)">'),
              "</parameter>", "", ('<invoke name="NAME">', '<parameter name="NAME">'),
              '<minimax:tool_call>\n<invoke name="<tool name>">\n<parameter name="<name>"><value></parameter>\n'
              "</invoke>\n</minimax:tool_call>"),
    TagSyntax("atem", "atem", ("<atem:function_calls>", "</atem:function_calls>"),
              re.compile(r'<atem:invoke name="([^"\n]+)">'), "</atem:invoke>",
              re.compile(r'<atem:parameter name="([^"\n]+)">'), "</atem:parameter>", "",
              ('<atem:invoke name="NAME">', '<atem:parameter name="NAME">'),
              '<atem:function_calls>\n<atem:invoke name="<tool name>">\n<atem:parameter name="<name>"><value>'
              "</atem:parameter>\n</atem:invoke>\n</atem:function_calls>"),
    TagSyntax("arg_kv", "glm", None, re.compile(r"<tool_call>([^<\n]*?)(?=\s*(?:<arg_key>|</tool_call>))"),
              "</tool_call>", re.compile(r"<arg_key>([^<\n]*)</arg_key>\s*<arg_value>"), "</arg_value>", "",
              ("<tool_call>NAME", "<arg_key>NAME</arg_key><arg_value>"),
              "<tool_call><tool name>\n<arg_key><name></arg_key>\n<arg_value><value></arg_value>\n</tool_call>"),
)
_SYNTAX_TAGS = {syn.name: _tags(syn) for syn in TAG_FAMILIES}


def _format(syn: TagSyntax) -> WireFormat:
    return WireFormat(syn.name, lambda text, tools=None, strict=False: parse_tags(syn, text, tools, strict),
                      syn.example, syn.family)


FORMATS = tuple(_format(syn) for syn in TAG_FAMILIES)
