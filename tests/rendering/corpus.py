"""A corpus of realistic model outputs, generated for every accepted family from one table.

Each case names the calls a model makes and, where the model deviates from its template, an edit
of the text (prose before the calls, text after them, whitespace, a value that holds the family's
own markup, a truncated or malformed call, ...). The text starts as the template's own writing of
the calls (so every family gets each case in its own syntax), is edited as a model would write it,
tokenized and parsed by the family's registered context, and the case says what must run, or
which message the model gets for a call that does not read. The per-family part is one table,
``WIRES``: how a call of each wire format is broken, re-spaced or written by a model where its
template writes otherwise.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from env_server.rendering import RenderingContext
from env_server.rendering import messages as msgs
from tito.types import ToolCall

from .helpers import TOOLS, writes_reasoning

CORPUS_TOOLS = TOOLS + [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}
    for name, desc, props, required in (
        ("write_file", "Write a file.", {"path": {"type": "string"}, "content": {"type": "string"}},
         ["path", "content"]),
        ("search", "Search the notes.", {"query": {"type": "string"}, "filter": {"type": ["string", "null"]},
                                         "limit": {"type": "integer"}}, ["query"]),
        ("configure", "Set options.", {"options": {"type": "object"}, "tags": {"type": "array"}}, ["options"]),
    )
]

# Templates whose family the corpus covers: one per wire format, and the variants of a format that
# write it differently (with or without reasoning, ids, several calls per turn).
FAMILIES = ("qwen2_5", "qwen3", "qwen3_6", "nemotron_3_nano", "qwen3_coder", "glm4moe", "gemma4", "lfm2_2_5",
            "lfm2_v2", "llama3_1", "llama4_json", "llama4_pythonic", "gptoss", "deepseekv3", "muse_glimmer",
            "kimi_k2", "minimax_m2", "minimax_m1", "mistral_nemo", "mistral_small_3_2", "devstral_small",
            "seed_oss", "olmo3", "xlam_qwen", "qwen2_5_coder", "internlm2", "granite_4_0", "kimi_k2_ids",
            "kimi_k2_thinking", "phi4_mini", "nemotron_nano_v2", "apertus", "muse_glimmer_vllm")

Calls = list[tuple[str, dict]]


@dataclass(frozen=True)
class Wire:
    """How a wire format's calls are broken, re-spaced, or written by a model where the template differs."""

    broken: Callable[[str], str]  # the turn with one call malformed
    message: str  # what the model is told about it
    respace: Callable[[str], str]  # the same calls, other whitespace and newlines
    cut: str = ""  # what the model is told about a call cut by the length limit (default: ``message``)
    prose: bool = True  # the format has free text around its calls (harmony's channels do not)
    quote: str = ""  # a string delimiter with no escape (Gemma 4's <|"|>): a value cannot hold it
    # the quote a template writes string values in without escaping them (LFM2.5, OLMo 3, Llama 4 pythonic)
    raw_quote: str = ""
    # how the model writes the calls where its template writes them otherwise (Llama 4's template writes raw,
    # unescaped "%s" strings; the model writes Python, which is what vLLM's llama4_pythonic parser reads)
    as_model: Callable[[Calls], str] | None = None


def _drop_last(token: str) -> Callable[[str], str]:
    return lambda text: text[:text.rindex(token)] + text[text.rindex(token) + len(token):]


def _drop_first(token: str) -> Callable[[str], str]:
    return lambda text: text.replace(token, "", 1)


def _compact_json(text: str) -> str:
    return text.replace('", "', '","').replace('": ', '":').replace("}, {", "},{")


def _spread_json(text: str) -> str:
    return text.replace('{"', '{ "').replace('"}', '" }').replace('":', '" :')


def _unframe_xml(text: str) -> str:  # values without the template's newlines, blank lines between tags
    return re.sub(r">\n(?!<)", ">", text).replace("\n</parameter>", "</parameter>").replace(">\n<", ">\n\n<")


def _spaced_pythonic(text: str) -> str:
    return re.sub(r"(\w)=(?=['\"\[{\d-]|None|True|False|true|false|null)", r"\1 = ", text).replace("), ", "),\n ")


_NOT_JSON = "not valid JSON"
_JSON = Wire(_drop_last("}"), _NOT_JSON, _compact_json)
WIRES: dict[str, Wire] = {
    "hermes": _JSON, "qwen_coder": _JSON, "internlm2": _JSON, "minimax_m1": _JSON, "json_list": _JSON,
    "mistral_v3": _JSON, "llama3": Wire(_drop_last("}"), _NOT_JSON, _spread_json),
    "deepseek": _JSON, "kimi": _JSON, "mistral": _JSON, "nemotron_json": _JSON, "apertus": _JSON,
    # Phi-4-mini writes functools[...] (what vLLM's parser reads); its template writes past calls without it.
    "phi4": Wire(_drop_last("}"), _NOT_JSON, _compact_json, as_model=lambda calls: "functools" + json.dumps(
        [{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)),
    "harmony": Wire(_drop_last("}"), _NOT_JSON, _compact_json, cut="did not end with <|call|>", prose=False),
    "gemma4": Wire(_drop_last("}"), "do not parse",
                   lambda t: t.replace("<tool_call|><|tool_call>", "<tool_call|>\n<|tool_call>"),
                   cut="was not closed", quote='<|"|>'),
    # (A missing </parameter> before the next parameter is read as vLLM reads it: test_leniency.py.)
    "xml": Wire(_drop_first("</function>"), "was not closed with </parameter>", _unframe_xml),
    "seed": Wire(_drop_first("</parameter>"), "was not closed with </parameter>",
                 lambda t: t.replace(">\n<", ">\n\n<")),
    "minimax": Wire(_drop_first("</parameter>"), "was not closed with </parameter>",
                    lambda t: t.replace(">\n<", ">\n  \n<")),
    "atem": Wire(_drop_first("</atem:parameter>"), "was not closed with </atem:parameter>",
                 lambda t: t.replace(">\n<", ">\n\n<")),
    "arg_kv": Wire(_drop_first("</arg_value>"), "was not closed with </arg_value>",
                   lambda t: t.replace("\n", "")),  # GLM-4.7's newline-free form
    "pythonic": Wire(_drop_last(")"), "do not parse", _spaced_pythonic),
    "pythonic_raw": Wire(_drop_last(")"), "do not parse", _spaced_pythonic, raw_quote="'"),
    "olmo": Wire(_drop_last(")"), "do not parse", lambda t: t.replace("(", "( ").replace(")", " )"), raw_quote="'"),
    "pythonic_list": Wire(_drop_last(")"), "do not parse", _spaced_pythonic, raw_quote='"',
                          as_model=lambda calls: "[" + ", ".join(
                              f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls) + "]"),
}


@dataclass(frozen=True)
class Expect:
    runs: Calls  # the calls that run, in order, with their typed arguments
    errors: tuple[str, ...] = ()  # a fragment of each message a call that does not run gets, in order
    content: str | None = None  # the visible text around the calls, where the case checks it


@dataclass(frozen=True)
class Case:
    name: str
    calls: Calls  # what the model calls (the template writes these)
    expect: Expect | None = None  # None: the calls run as written
    edit: Callable[[str, RenderingContext, Wire, Calls], str] | None = None
    only: tuple[str, ...] = ()  # wire formats the case applies to (empty: all)
    needs_prose: bool = False
    needs_quotable: bool = False  # a value holds the family's own markup, string delimiters included


@dataclass
class Outcome:
    runs: Calls = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    content: str = ""
    text: str = ""


# ---------------------------------------------------------------- edits a model makes

PROSE = "I'll check that first."
AFTER = "Running it now."


def _calls_start(text: str, ctx: RenderingContext) -> int:
    """Where the calls start in a turn the template wrote: after the reasoning, past leading whitespace."""
    at = 0
    if ctx.rules.reasoning_tags and ctx.rules.reasoning_tags[1] in text:
        at = text.index(ctx.rules.reasoning_tags[1]) + len(ctx.rules.reasoning_tags[1])
    return len(text) - len(text[at:].lstrip())


def _stop_at(text: str, ctx: RenderingContext) -> int:
    return text.rindex(ctx.rules.boundary)


def prose_before(text: str, ctx: RenderingContext, wire: Wire, calls: Calls) -> str:
    """Prose where the template writes an assistant message's content; before the calls where it drops it (or the
    calls: Phi-4-mini's writes content or calls)."""
    marked = write(ctx, calls, content="\ufdd0")
    if "\ufdd0" in marked and not wire.as_model and calls[0][0] in marked.split("\ufdd0", 1)[1]:
        return marked.replace("\ufdd0", PROSE + "\n\n")
    at = _calls_start(text, ctx)
    return text[:at] + PROSE + "\n\n" + text[at:]


def text_after(text: str, ctx: RenderingContext, wire: Wire, calls: Calls) -> str:
    at = _stop_at(text, ctx)
    return text[:at].rstrip("\n") + "\n" + AFTER + text[at:]


def respaced(text: str, ctx: RenderingContext, wire: Wire, calls: Calls) -> str:
    at, end = _calls_start(text, ctx), _stop_at(text, ctx)
    return text[:at] + wire.respace(text[at:end]) + text[end:]


def broken(text: str, ctx: RenderingContext, wire: Wire, calls: Calls) -> str:
    at, end = _calls_start(text, ctx), _stop_at(text, ctx)
    return text[:at] + wire.broken(text[at:end]) + text[end:]


def truncated(text: str, ctx: RenderingContext, wire: Wire, calls: Calls) -> str:
    """Cut by the length limit inside the last argument: no stop token, the call not closed."""
    return text[:text.rindex("print(6") + len("print(6")]


def escaped_quote(text: str, ctx: RenderingContext, wire: Wire, calls: Calls) -> str:
    """The model escapes the quote the way Python does, where the template wrote it raw (LFM2.5)."""
    return text.replace("'Martha's'", "'Martha\\'s'")


# ---------------------------------------------------------------- values with the family's own markup


def rendered_turn(ctx: RenderingContext, calls: Calls) -> str:
    """The family's own writing of a turn with these calls (the calls part: no reasoning, no stop token); one call
    after another where the template renders one per turn."""
    if len(calls) > 1 and ctx.rules.max_calls_per_turn == 1:
        return "\n".join(rendered_turn(ctx, [c]) for c in calls)
    text = write(ctx, calls)
    return text[_calls_start(text, ctx):_stop_at(text, ctx)].strip()


def write(ctx: RenderingContext, calls: Calls, reasoning: str | None = "Let me use the tools.",
          content: str = "") -> str:
    """The turn as the template writes it, with this tokenizer's generation prompt before it."""
    style = ctx.rules.style
    conv = [{"role": "user", "content": "Do the task with the tools."}]
    turn = msgs.assistant(style, [(style.call_id(1, i, n), n, a) for i, (n, a) in enumerate(calls)],
                          reasoning if writes_reasoning(ctx) else None, content)
    return ctx.completion_text(conv, turn, CORPUS_TOOLS)


# ---------------------------------------------------------------- the table

WEATHER = ("get_weather", {"city": "Paris", "zip": "75001", "days": 3})
CODE = 'import json\nprint(json.dumps({"k": [1, 2], \'q\': "it\'s"}), f(")"))  # done\n'
UNICODE = "naïve café — 日本語 🙂\ttab \"dq\" 'sq' {braces} [brackets] (parens) <angle> & amp"


def _markup_file(ctx: RenderingContext) -> str:
    """A file whose text holds whole turns of calls in the family's own markup (docs, tests, agent code), twice:
    the text between two copies must not pass for the text after a call."""
    turn = rendered_turn(ctx, [WEATHER, ("lookup", {"word": "x"})])
    return f"Example:\n{turn}\nAnother one:\n{turn}\n"


def _inline_markup(ctx: RenderingContext) -> str:
    """A one-line value holding a call in the family's markup (no tag starts a line, so only the text after the
    call can tell a cut inside the value from the call's end)."""
    return "see " + rendered_turn(ctx, [("lookup", {"word": "x"})]).replace("\n", " ") + " for the syntax"


def _closers_file(ctx: RenderingContext) -> str:
    """A file with lines that look like the end of a call in the family's markup."""
    tail = rendered_turn(ctx, [("lookup", {"word": "x"})])
    return "before\n" + tail[tail.index("x") + 1:].strip() + "\nafter\n"


CASES: tuple[Case, ...] = (
    Case("as written", [WEATHER]),
    Case("several calls", [("run_python", {"code": "print(1)"}), ("lookup", {"word": "a"}), WEATHER]),
    Case("prose before the call", [("lookup", {"word": "naïve"})], edit=prose_before, needs_prose=True,
         expect=Expect([("lookup", {"word": "naïve"})], content=PROSE)),
    Case("text after the call", [("lookup", {"word": "w"})], edit=text_after, needs_prose=True,
         expect=Expect([("lookup", {"word": "w"})], content=AFTER)),
    Case("other whitespace and newlines", [WEATHER, ("lookup", {"word": "w"})], edit=respaced),
    Case("code with quotes and newlines", [("run_python", {"code": CODE})]),
    Case("unicode and punctuation", [("lookup", {"word": UNICODE})]),
    Case("value ends with newlines", [("write_file", {"path": "a.txt", "content": "line\n\n"})]),
    # Computed per family: a value holding a whole turn of calls in the family's own markup runs once, as the value.
    Case("a file holding the family's own call markup", [("write_file", {"path": "notes.md", "content": _markup_file})],
         needs_quotable=True),
    Case("a one-line value holding the family's call markup",
         [("write_file", {"path": "a.txt", "content": _inline_markup}), ("lookup", {"word": "y"})], needs_quotable=True),
    Case("a file with lines like the family's closing tags",
         [("write_file", {"path": "t.txt", "content": _closers_file}), ("lookup", {"word": "after"})],
         needs_quotable=True),
    Case("optional parameter written as null", [("search", {"query": "x", "filter": None})]),
    # vLLM's reading: null written for a string parameter is the string, a string is never altered.
    Case("string parameter whose value is the word null", [("lookup", {"word": "null"}), ("lookup", {"word": "None"})]),
    Case("object written as a Python literal", [("configure", {"options": "{'a': True, 'n': [1, 2], 's': 'x'}"})],
         expect=Expect([("configure", {"options": {"a": True, "n": [1, 2], "s": "x"}})])),
    Case("object encoded twice", [("configure", {"options": '{"a": 1}', "tags": '["x", "y"]'})],
         expect=Expect([("configure", {"options": {"a": 1}, "tags": ["x", "y"]})])),
    Case("number written as text", [("get_weather", {"city": "Rome", "zip": "00100", "days": "5"})],
         expect=Expect([("get_weather", {"city": "Rome", "zip": "00100", "days": 5})])),
    Case("escaped quote in a Python string", [("lookup", {"word": "Martha's"})], edit=escaped_quote,
         only=("pythonic", "pythonic_raw", "olmo"), expect=Expect([("lookup", {"word": "Martha's"})])),
    Case("malformed call", [WEATHER], edit=broken),
    Case("cut by the length limit", [("run_python", {"code": "print(6 * 7)"})], edit=truncated),
)


def expected(case: Case, ctx: RenderingContext, calls: Calls) -> Expect:
    if case.edit is broken:
        return Expect([], (WIRES[ctx.rules.wire].message,))
    if case.edit is truncated:
        wire = WIRES[ctx.rules.wire]
        return Expect([], (wire.cut or wire.message,))
    base = case.expect or Expect(calls)
    if ctx.rules.uncarried:  # a call the template cannot write back is answered, not run (carry.py)
        unwritable = [c for c in base.runs if not ctx._writes_back(ToolCall("c1", c[0], json.dumps(c[1])), CORPUS_TOOLS)]
        if unwritable:
            base = Expect([c for c in base.runs if c not in unwritable], ("cannot write this call",) * len(unwritable),
                          base.content)
    limit = ctx.rules.max_calls_per_turn
    if limit is not None and len(base.runs) > limit:
        return Expect(base.runs[:limit], (f"allows {limit} tool call per turn",) * (len(base.runs) - limit),
                      base.content)
    return base


def applies(case: Case, ctx: RenderingContext) -> str | None:
    """None if the case applies to this family, else why not."""
    wire = WIRES[ctx.rules.wire]
    if case.only and ctx.rules.wire not in case.only:
        return f"only for {', '.join(case.only)}"
    if case.needs_prose and not wire.prose:
        return "the format has no free text around its calls"
    if case.needs_quotable and wire.quote:
        return f"the format's strings have no escape for their delimiter {wire.quote}: no value can hold its markup"
    if len(case.calls) > 1 and ctx.rules.wire == "harmony":
        return "one call per turn: <|call|> ends the turn"
    if case.edit is text_after and ctx.rules.boundary_closes_calls:
        return "the turn ends with the calls' own closing token: no text follows them"
    return None


def realize(case: Case, ctx: RenderingContext) -> tuple[str, Calls]:
    """The completion text of a case for this family, and the calls as the model meant them."""
    calls = [(name, {k: v(ctx) if callable(v) else v for k, v in args.items()}) for name, args in case.calls]
    wire = WIRES[ctx.rules.wire]
    one_per_turn = len(calls) > 1 and ctx.rules.max_calls_per_turn == 1
    if wire.as_model or one_per_turn:
        # The model writes its own syntax, or (Llama 3.1's template raises on a second call) one call after another.
        text = write(ctx, calls[:1])
        at, end = _calls_start(text, ctx), _stop_at(text, ctx)
        text = text[:at] + (wire.as_model(calls) if wire.as_model else rendered_turn(ctx, calls)) + text[end:]
    else:
        text = write(ctx, calls)
    if case.edit is not None:
        text = case.edit(text, ctx, wire, calls)
    return text, calls


def run(ctx: RenderingContext, text: str) -> Outcome:
    parsed = ctx.parse_completion(ctx.encode(text), seq=1, tools=CORPUS_TOOLS)
    out = Outcome(content=parsed.content, text=text)
    for call in parsed.tool_calls:
        if call.error:
            out.errors.append(call.error)
        else:
            out.runs.append((call.name, json.loads(call.arguments)))
    return out


def check(case: Case, ctx: RenderingContext) -> Outcome:
    text, calls = realize(case, ctx)
    out = run(ctx, text)
    want = expected(case, ctx, calls)
    where = f"{case.name!r} ({ctx.rules.wire}): text {text!r}"
    assert out.runs == want.runs, f"{where}\n ran {out.runs}\n want {want.runs}\n errors {out.errors}"
    assert len(out.errors) == len(want.errors) and all(w in e for w, e in zip(want.errors, out.errors)), (
        f"{where}\n errors {out.errors}\n want {want.errors}")
    if want.content is not None:  # (muse_glimmer's content keeps its channel headers: contained, not equal)
        assert want.content in out.content and "naïve" not in out.content, (
            f"{where}\n content {out.content!r}, want {want.content!r}")
    return out


def value_of(case: Case, ctx: RenderingContext, key: str) -> Any:
    return realize(case, ctx)[1][0][1][key]
