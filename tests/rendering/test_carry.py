"""Templates that cannot write every string value (carry.py): registration names the values, and a call holding one
is answered with an error, never run as a call the conversation would show otherwise."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env_server.rendering import carry
from tito.types import ToolCall

from .helpers import TOOLS, ctx_for

CONTINUED = "ls \\\n  -la"  # a shell line continuation: a backslash ending a line


def _call(ctx, value: str) -> str:
    turn = {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "id": "c1", "function": {"name": "run_python", "arguments": {"code": value}}}]}
    return ctx.completion_text([{"role": "user", "content": "Do it."}], turn, TOOLS)


def test_llama4_pythonic_names_what_it_cannot_write_and_answers_such_calls():
    ctx = ctx_for("llama4_pythonic")
    # Accepted, with the limitation named: its "%s" writes the value raw, and Python (vLLM's reading, the model's
    # dialect) reads a backslash before a newline as joining the lines.
    assert CONTINUED in ctx.rules.uncarried
    assert any("cannot write every string value" in n for n in ctx.rules.notes)
    written = _call(ctx, CONTINUED)
    assert written.startswith(f'[run_python(code="{CONTINUED}")]')
    assert json.loads(ctx.parse_completion(ctx.encode(written), tools=TOOLS).tool_calls[0].arguments) == {
        "code": "ls   -la"}  # the template's writing means another value
    # The model writes the value as Python: read as vLLM reads it, it is a call the template would show otherwise,
    # so it is answered with an error instead of running.
    (call,) = ctx.parse_completion(ctx.encode(f"[run_python(code={CONTINUED!r})]<|eot|>"), tools=TOOLS).tool_calls
    assert "cannot write this call to run_python" in call.error
    # Whitespace at both ends, newlines and quotes it writes faithfully: those calls run.
    for value in ("  both ends \n\n", "\nx\n", 'say "hi"', "it's"):
        (call,) = ctx.parse_completion(ctx.encode(_call(ctx, value)), tools=TOOLS).tool_calls
        assert not call.error and json.loads(call.arguments) == {"code": value}


def test_templates_that_escape_their_strings_name_nothing():
    for template in ("qwen3_6", "llama3_1", "gemma4", "qwen2_5"):
        ctx = ctx_for(template)
        assert ctx.rules.uncarried == ()
        (call,) = ctx.parse_completion(ctx.encode(_call(ctx, CONTINUED)), tools=TOOLS).tool_calls
        assert json.loads(call.arguments) == {"code": CONTINUED}


PLAIN_TEXT = st.text(alphabet=sorted(carry.PLAIN), min_size=1, max_size=40).map(str.strip).filter(bool)


@pytest.mark.parametrize("template", ["llama4_pythonic", "lfm2_2_5", "olmo3"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=PLAIN_TEXT)
def test_plain_values_skip_the_write_back_only_where_it_would_pass(template, value):
    """The fast path (carry.needs_write_back) skips rendering a call back only for values the write-back passes."""
    ctx = ctx_for(template)
    assert ctx.rules.uncarried and carry.PLAIN_SAMPLE not in ctx.rules.uncarried
    arguments = json.dumps({"code": value})
    assert not carry.needs_write_back(ctx.rules.uncarried, arguments)
    assert ctx._writes_back(ToolCall("c1", "run_python", arguments), TOOLS), value
    (call,) = ctx.parse_completion(ctx.encode(_call(ctx, value)), tools=TOOLS).tool_calls
    assert not call.error and json.loads(call.arguments) == {"code": value}


def test_which_calls_are_written_back():
    hazards = ("it's",)
    assert not carry.needs_write_back((), '{"code": "x\\\\y"}')  # the template carries every value
    assert not carry.needs_write_back(hazards, '{"code": "print(6*7)", "path": "a/b.txt"}')
    for arguments in ('{"code": "print(\'x\')"}', '{"code": " lead"}', '{"code": "a\\nb"}', '{"code": "[x]"}',
                      '{"code": "a\\\\b"}', '{"we\\"ird": "x"}', '{"two words": "x"}', "not json", "[]",
                      # values other than strings: a template may write them with its own quote inside
                      '{"code": "x", "n": 3}', '{"opts": {"k": "b"}}', '{"opts": ["b"]}', '{"flag": null}'):
        assert carry.needs_write_back(hazards, arguments), arguments
    # A template that cannot write even the plain sample writes every call back.
    assert carry.needs_write_back((*hazards, carry.PLAIN_SAMPLE), '{"code": "print(6*7)"}')
