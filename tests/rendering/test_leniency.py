"""The deployment parser's leniency by default, each repair reported; strict parsing answers with today's errors.

The model is served behind vLLM's parser for its family: where that parser reads an output the family's grammar
does not allow, tito reads it the same way (a parser stricter than deployment would teach the model to avoid
outputs that work) and says what it repaired; with ``strict`` the call gets the error message instead. A reading
by the grammar is always tried first, so a well-formed call never reads differently.
"""

from __future__ import annotations

import json

import pytest

from .helpers import TOOLS, ctx_for

WRITE = {"type": "function", "function": {"name": "write_file", "description": "Write a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"]}}}
OPEN_SCHEMA = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}, "limit": {"type": "integer"},
                                     "since": {"type": ["string", "null"]}}, "required": ["query"]}}}
CLOSED_SCHEMA = {"type": "function", "function": {"name": "search", "description": "Search.", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"],
    "additionalProperties": False}}}


def parse(template: str, text: str, tools=TOOLS, strict: bool = False):
    ctx = ctx_for(template)
    return ctx.parse_completion(ctx.encode(text), seq=1, tools=tools, strict=strict)


def runs(parsed) -> list:
    return [(c.name, json.loads(c.arguments)) if not c.error else c.error for c in parsed.tool_calls]


def test_hermes_call_left_open_at_the_end_runs_and_says_so():
    text = '<tool_call>\n{"name": "run_python", "arguments": {"code": "print(1)"}}\n<|im_end|>'
    lenient = parse("qwen2_5", text)
    assert runs(lenient) == [("run_python", {"code": "print(1)"})]
    assert lenient.repairs == ["call 1 (run_python): closed <tool_call> with </tool_call> at the end of the output"]
    strict = parse("qwen2_5", text, strict=True)
    assert "was not closed with </tool_call>" in strict.tool_calls[0].error and not strict.repairs


def test_hermes_open_call_followed_by_text_is_still_an_error():
    text = '<tool_call>\n{"name": "run_python", "arguments": {"code": "1"}}\nand then some text<|im_end|>'
    assert "before </tool_call>" in parse("qwen2_5", text).tool_calls[0].error or "not closed" in parse(
        "qwen2_5", text).tool_calls[0].error


@pytest.mark.parametrize("template", ["qwen3_coder", "qwen3_6"])
def test_xml_parameter_closed_by_the_next_parameter(template):
    text = ("<tool_call>\n<function=write_file>\n<parameter=content>\nhello\nworld\n<parameter=path>\na.txt\n"
            "</parameter>\n</function>\n</tool_call><|im_end|>")
    lenient = parse(template, text, tools=[WRITE])
    assert runs(lenient) == [("write_file", {"content": "hello\nworld", "path": "a.txt"})]
    assert lenient.repairs == [
        "call 1 (write_file): closed <parameter=content> with </parameter> before <parameter=path>"]
    strict = parse(template, text, tools=[WRITE], strict=True)
    assert "'content' of write_file was not closed with </parameter> before '<parameter=path>'" in (
        strict.tool_calls[0].error)


def test_a_well_formed_value_holding_a_parameter_tag_reads_as_written():
    # The grammar's reading exists, so the lenient one is never tried.
    content = "doc:\n<parameter=path>\nb.txt\n</parameter>\nend"
    text = (f"<tool_call>\n<function=write_file>\n<parameter=content>\n{content}\n</parameter>\n<parameter=path>\n"
            "a.txt\n</parameter>\n</function>\n</tool_call><|im_end|>")
    p = parse("qwen3_coder", text, tools=[WRITE])
    assert runs(p) == [("write_file", {"content": content, "path": "a.txt"})] and not p.repairs


def test_undeclared_parameter_where_the_schema_allows_more():
    text = ("<tool_call>\n<function=search>\n<parameter=query>\ncats\n</parameter>\n<parameter=lang>\nen\n"
            "</parameter>\n</function>\n</tool_call><|im_end|>")
    lenient = parse("qwen3_coder", text, tools=[OPEN_SCHEMA])
    assert runs(lenient) == [("search", {"query": "cats", "lang": "en"})]
    assert lenient.repairs == ["call 1 (search): read parameter 'lang', which search does not declare "
                               "(its schema allows more)"]
    assert "search has no parameter 'lang'" in parse("qwen3_coder", text, tools=[OPEN_SCHEMA],
                                                      strict=True).tool_calls[0].error
    # additionalProperties: false (every tito tool's schema): an error in both modes.
    assert "search has no parameter 'lang'" in parse("qwen3_coder", text, tools=[CLOSED_SCHEMA]).tool_calls[0].error


@pytest.mark.parametrize("strict", [False, True])
def test_null_for_a_string_parameter_stays_the_string(strict):
    def call(params: str) -> str:
        return f"<tool_call>\n<function=search>\n{params}</function>\n</tool_call><|im_end|>"

    def param(k, v):
        return f"<parameter={k}>\n{v}\n</parameter>\n"

    got = runs(parse("qwen3_coder", call(param("query", "null") + param("limit", "null") + param("since", "null")),
                     tools=[OPEN_SCHEMA], strict=strict))
    # query: a string, "null" as vLLM reads it; limit: not a string, JSON's null; since: the schema allows null.
    assert got == [("search", {"query": "null", "limit": None, "since": None})]


@pytest.mark.parametrize("template", ["qwen3_coder", "qwen3_6", "nemotron_3_nano"])
def test_closing_tag_then_an_undeclared_parameter_inside_a_value_reads_on_and_says_so(template):
    """vLLM's qwen3_coder ends a value only at a closing tag followed by a parameter the tool declares (or the call's
    end): 'a</parameter><parameter=mode>fast' is text of 'content' where write_file does not declare 'mode'. Where
    the schema allows more, reading 'mode' would also be grammatical, so the reading chosen is a repair, named."""
    open_write = {"type": "function", "function": dict(WRITE["function"])}
    text = ("<tool_call>\n<function=write_file>\n<parameter=content>\na</parameter><parameter=mode>fast\n</parameter>\n"
            "<parameter=path>\na.txt\n</parameter>\n</function>\n</tool_call><|im_end|>")
    lenient = parse(template, text, tools=[open_write])
    assert runs(lenient) == [("write_file", {"content": "a</parameter><parameter=mode>fast", "path": "a.txt"})]
    assert lenient.repairs == ["call 1 (write_file): read </parameter> followed by the tag of a parameter write_file "
                               "does not declare as text of 'content', as vLLM reads it"]
    strict = parse(template, text, tools=[open_write], strict=True)  # 'mode' is refused there: one reading
    assert runs(strict) == runs(lenient) and not strict.repairs
