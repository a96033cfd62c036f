"""Mistral v11 and later (Magistral, Devstral, Mistral Small 3.2) write calls as ``[TOOL_CALLS]NAME[ARGS]{...}``,
each after its own marker; as decoded text without control tokens, ``[TOOL_CALLS]NAME{...}`` (the shape vLLM's
mistral parser tests use). Both Mistral formats read them; the JSON list of v3 tokenizers is still read."""

from __future__ import annotations

import json

import pytest

from env_server.rendering.parsing import formats

V11_OUTPUTS = [  # (completion text, [(name, arguments)]) — the call shapes of vLLM's mistral parser tests
    ('[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}', [("add_this_and_that", {"a": 3.5, "b": 4})]),
    ('[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
     [("add", {"a": 3.5, "b": 4}), ("multiply", {"a": 3, "b": 6})]),
    ('[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}',
     [("get_weather", {"city": "Paris", "unit": "celsius"})]),
    ('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}', [("get_weather", {"city": "Paris"})]),
    ('[TOOL_CALLS]write{"content": "[TOOL_CALLS]x{\\"y\\": 1}"}', [("write", {"content": '[TOOL_CALLS]x{"y": 1}'})]),
]


@pytest.mark.parametrize("wire", ["mistral_v3", "mistral"])
@pytest.mark.parametrize("text,expected", V11_OUTPUTS)
def test_mistral_v11_calls_are_read_by_both_mistral_formats(wire, text, expected):
    content, _, calls = formats()[wire].parse(text)
    assert [(c.error, c.name, json.loads(c.arguments)) for c in calls] == [(None, n, a) for n, a in expected]
    assert content == ""


def test_mistral_v11_call_id_is_kept():
    _, _, calls = formats()["mistral_v3"].parse('[TOOL_CALLS]get_weather[CALL_ID]a1B2c3D4e[ARGS]{"city": "Paris"}')
    assert calls[0].id == "a1B2c3D4e"


def test_mistral_v3_json_list_still_read():
    text = '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}, "id": "abcdefghi"}, {"name": "neg", "arguments": {}}]'
    _, _, calls = formats()["mistral_v3"].parse(text)
    assert [(c.name, c.arguments, c.id, c.error) for c in calls] == [
        ("add", '{"a": 1}', "abcdefghi", None), ("neg", "{}", "", None)]


@pytest.mark.parametrize("text", ["[TOOL_CALLS]add", "[TOOL_CALLS]add{\"a\": ", "[TOOL_CALLS]add[ARGS]not json"])
def test_malformed_v11_call_gets_an_error_for_the_model(text):
    _, _, calls = formats()["mistral_v3"].parse(text)
    assert len(calls) == 1 and calls[0].error and "[TOOL_CALLS]" in calls[0].error
