"""Templates that cannot write every string value (carry.py): registration names the values, and a call holding one
is answered with an error, never run as a call the conversation would show otherwise."""

from __future__ import annotations

import json

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
