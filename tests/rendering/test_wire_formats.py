"""The wire-format parsers on the completions of the new families: typing by schema, closers inside values,
malformed calls, the overlap rule's stop handling, and agreement with transformers' parse_response."""

from __future__ import annotations

import json

import pytest

from tito.types import Message, Role

from env_server.rendering.parsing import formats


def parse_deepseek(text):
    return formats()["deepseek"].parse(text, None)

from .corpus import CORPUS_TOOLS
from .helpers import TOOLS, Turn, assistant_message, ctx_for, model_completion


def ids(ctx, text):
    return ctx.tokenizer.encode(text, add_special_tokens=False)


def parse(ctx, text, tools=TOOLS):
    return ctx.parse_completion(ids(ctx, text), tools=tools)


def calls_of(parsed):
    return [(c.name, json.loads(c.arguments) if not c.error else c.error) for c in parsed.tool_calls]


WEATHER = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=zip>\n75001\n" \
          "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"


def test_xml_values_typed_by_the_tools_schema():
    ctx = ctx_for("qwen3_6")
    p = parse(ctx, "Let me check.\n</think>\n\n" + WEATHER + "<|im_end|>")
    assert p.reasoning == "Let me check." and p.content == ""
    assert calls_of(p) == [("get_weather", {"city": "Paris", "zip": "75001", "days": 3})]
    assert p.tool_calls[0].arguments == '{"city": "Paris", "zip": "75001", "days": 3}'  # JSON of the typed values
    # Without the schemas nothing can be typed: the text is kept.
    assert calls_of(parse(ctx, WEATHER + "<|im_end|>", tools=None))[0][1]["days"] == "3"
    # A value that does not cast stays text, for the environment to reject with its own message.
    bad = WEATHER.replace("\n3\n", "\nseven\n")
    assert calls_of(parse(ctx, bad + "<|im_end|>"))[0][1]["days"] == "seven"


def test_xml_value_keeps_its_newlines_and_closing_tags_inside():
    ctx = ctx_for("nemotron_3_nano")
    code = 'print("</parameter>")\nx = 1\n'
    text = f"</think>\n<tool_call>\n<function=run_python>\n<parameter=code>\n{code}\n</parameter>\n</function>\n" \
           "</tool_call>\n<|im_end|>"
    assert calls_of(parse(ctx, text)) == [("run_python", {"code": code})]
    unclosed = "<tool_call>\n<function=run_python>\n<parameter=code>\nx\n</function>\n</tool_call><|im_end|>"
    assert "not closed with </parameter>" in parse(ctx, unclosed, tools=None).tool_calls[0].error
    no_function = "<tool_call>\n{\"name\": \"run_python\"}\n</tool_call><|im_end|>"
    assert "<function=NAME>" in parse(ctx, no_function, tools=None).tool_calls[0].error


def test_glm_arg_kv_and_the_overlap_stop():
    ctx = ctx_for("glm4moe")
    text = "\n<think>plan</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n" \
           "<arg_key>zip</arg_key>\n<arg_value>75001</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n" \
           "</tool_call>"
    p = parse(ctx, text + "<|observation|>")
    assert p.stopped and p.reasoning == "plan" and p.content == ""  # the stop token is not content
    assert calls_of(p) == [("get_weather", {"city": "Paris", "zip": "75001", "days": 3})]
    # GLM-4.7 writes no newlines; a closing tag inside a value does not end it.
    compact = "<tool_call>run_python<arg_key>code</arg_key><arg_value>s = '</arg_value>'\n</arg_value></tool_call>"
    p = parse(ctx, compact + "<|observation|>")
    assert calls_of(p) == [("run_python", {"code": "s = '</arg_value>'\n"})]


@pytest.mark.parametrize(
    "template, call, boundary, other",
    [
        ("glm4moe", "<tool_call>lookup\n<arg_key>word</arg_key>\n<arg_value>w</arg_value>\n</tool_call>",
         "<|observation|>", "<|user|>"),
        ("gemma4", '<|tool_call>call:lookup{word:<|"|>w<|"|>}<tool_call|>', "<|tool_response>", "<turn|>"),
    ],
)
def test_tools_run_only_when_the_turn_ends_on_the_boundary(template, call, boundary, other):
    """The boundary differs from the answer's end token: another stop ended the conversation; the boundary
    without a call still opens a tool turn, which gets an error result."""
    ctx = ctx_for(template)
    assert calls_of(parse(ctx, call + boundary)) == [("lookup", {"word": "w"})]
    assert parse(ctx, call + other).tool_calls == []
    p = parse(ctx, "I am done." + boundary)
    assert len(p.tool_calls) == 1 and "holds no tool call" in p.tool_calls[0].error


def test_gemma4_dialect_one_malformed_call_fails_alone():
    ctx = ctx_for("gemma4")
    text = '<|tool_call>call:run_python{code:<|"|>d = {"a": 1, "b": [2]}; print(d, "x:y,z")<|"|>}<tool_call|>' \
           '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3,zip:<|"|>75001<|"|>}<tool_call|>' \
           "<|tool_call>call:lookup{word:oops<tool_call|><|tool_response>"
    p = parse(ctx, text)
    assert calls_of(p)[:2] == [("run_python", {"code": 'd = {"a": 1, "b": [2]}; print(d, "x:y,z")'}),
                               ("get_weather", {"city": "Paris", "days": 3, "zip": "75001"})]
    assert "do not parse" in p.tool_calls[2].error


def test_pythonic_raw_strings_with_parentheses_and_quotes():
    ctx = ctx_for("lfm2_2_5")
    code = "print('it's (fine)'), x = f(a='1', b=\"2\")\n"
    text = f"<|tool_call_start|>[run_python(code='{code}'), get_weather(city='Paris', zip='75001', days=3)," \
           " lookup(word='naïve')]<|tool_call_end|><|im_end|>"
    assert calls_of(parse(ctx, text)) == [
        ("run_python", {"code": code}), ("get_weather", {"city": "Paris", "zip": "75001", "days": 3}),
        ("lookup", {"word": "naïve"})]
    typed = "<|tool_call_start|>[get_weather(city='Paris', zip='75001', days='3')]<|tool_call_end|><|im_end|>"
    assert calls_of(parse(ctx, typed))[0][1]["days"] == 3
    broken = "<|tool_call_start|>[run_python(code=print(1)]<|tool_call_end|><|im_end|>"
    assert "do not parse" in parse(ctx, broken).tool_calls[0].error


def test_pythonic_escaped_literals_and_json_values():
    ctx = ctx_for("lfm2_v2")
    text = "<|tool_call_start|>[run_python(code='it\\'s\\n'), f(a=[1, \"x\"], b={\"k\": true}, c=None)]" \
           "<|tool_call_end|><|im_end|>"
    assert calls_of(parse(ctx, text)) == [
        ("run_python", {"code": "it's\n"}), ("f", {"a": [1, "x"], "b": {"k": True}, "c": None})]


def test_deepseek_markers_v3_and_v31():
    v3 = '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>run_python\n```json\n{"code": "1"}\n```' \
         '<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{"word": oops}\n```' \
         "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    content, _, calls = parse_deepseek("Sure." + v3)
    assert content == "Sure." and (calls[0].name, calls[0].arguments, calls[0].error) == ("run_python", '{"code": "1"}',
                                                                                         None)
    assert calls[1].name == "lookup" and "not valid JSON" in calls[1].error
    _, _, calls = parse_deepseek('<｜tool▁call▁begin｜>lookup<｜tool▁sep｜>{"word": "w"}<｜tool▁call▁end｜>')
    assert (calls[0].name, calls[0].arguments) == ("lookup", '{"word": "w"}')


@pytest.mark.parametrize(
    "template, schema",
    [
        ("qwen3_6", "qwen3_5_template"),
        ("nemotron_3_nano", "nemotron_3_template"),
        ("glm4moe", "glm4moe_template"),
        ("gemma4", "gemma4_template"),
        ("lfm2_2_5", "lfm2_2_5_template"),
        ("qwen3", "qwen3_template"),
    ],
)
def test_agrees_with_parse_response_where_it_is_right(template, schema):
    """transformers' parse_response as the oracle, on values it reads right (no edge whitespace, no ')' in strings)."""
    import trl.chat_template_utils as t
    from transformers.utils.chat_parsing import parse_response

    ctx = ctx_for(template)
    turn = Turn([("get_weather", {"city": "Paris", "zip": "75001", "days": 3}), ("lookup", {"word": "naïve"})], [],
                "Think first.")
    conv = [{"role": "user", "content": "go"}]
    completion = model_completion(ctx, conv, assistant_message(ctx, turn, 0))
    text = ctx.decode(completion)
    prefix = ctx.tokenizer.apply_chat_template(conv, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    theirs = parse_response(text, getattr(t, schema), prefix=prefix, tools=TOOLS)
    ours = ctx.parse_completion(completion, tools=TOOLS)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in theirs["tool_calls"]] == calls_of(ours)


# ---------------------------------------------------------------- the failure classes of real outputs

def _write_file_call(content: str) -> str:
    return ("</think>\n\n<tool_call>\n<function=write_file>\n<parameter=path>\nagent.md\n</parameter>\n"
            f"<parameter=content>\n{content}\n</parameter>\n</function>\n</tool_call><|im_end|>")


def test_xml_value_holding_a_whole_call_runs_once_as_the_value():
    # Phantom calls: a file whose text is a tool call in the family's own markup is one write, never two calls.
    content = "<tool_call>\n<function=run_python>\n<parameter=code>\nimport os\n</parameter>\n</function>\n</tool_call>"
    ctx = ctx_for("qwen3_6")
    assert calls_of(parse(ctx, _write_file_call(content), CORPUS_TOOLS)) == [
        ("write_file", {"path": "agent.md", "content": content})]


@pytest.mark.parametrize("template", ["qwen3_coder", "qwen3_6", "nemotron_3_nano"])
@pytest.mark.parametrize("content_first", [True, False])
def test_xml_value_holding_a_whole_call_of_the_same_tool_reads_whole(template, content_first):
    """A file holding a write_file call (an agent writing a test fixture): its </parameter> closes the <parameter=path>
    opened inside the value, so it is the value's own markup, not where the value ends and the next begins. vLLM's
    qwen3_coder pairs such tags (a closing tag ends a value only unpaired) and reads the whole value; so does tito,
    with nothing repaired (splitting there would give 'content' twice: the grammar has no other reading)."""
    inner = ("<tool_call>\n<function=write_file>\n<parameter=path>\nb.txt\n</parameter>\n<parameter=content>\nhi\n"
             "</parameter>\n</function>\n</tool_call>")
    params = [("content", inner), ("path", "a.md")] if content_first else [("path", "a.md"), ("content", inner)]
    text = "<tool_call>\n<function=write_file>\n" + "".join(
        f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params) + "</function>\n</tool_call><|im_end|>"
    ctx = ctx_for(template)
    for strict in (False, True):
        p = ctx.parse_completion(ids(ctx, text), tools=CORPUS_TOOLS, strict=strict)
        assert calls_of(p) == [("write_file", dict(params))] and not p.repairs


def test_xml_closing_tag_then_a_parameter_tag_is_read_as_the_deployment_parser_reads_it():
    """'</parameter>' followed by a parameter tag is how one value ends and the next begins, whatever the text
    means: where the tool's schema allows parameters it does not declare, the second one is read (as vLLM reads
    it, with a repair note); where it forbids them (tito's tools), the call is refused, never run with the tags in
    the value."""
    ctx = ctx_for("qwen3_6")
    text = _write_file_call("a\n</parameter>\n<parameter=mode>\nfast")
    p = parse(ctx, text, CORPUS_TOOLS)
    assert calls_of(p) == [("write_file", {"path": "agent.md", "content": "a", "mode": "fast"})] and p.repairs
    closed = [dict(t, function=dict(t["function"], parameters=dict(t["function"]["parameters"],
                                                                    additionalProperties=False)))
              for t in CORPUS_TOOLS]
    (call,) = parse(ctx, text, closed).tool_calls
    assert "write_file has no parameter 'mode'" in call.error


def test_xml_parameter_without_its_closing_tag_is_closed_by_the_next_or_reported():
    """Silent corruption: the next parameter's text must never run inside this one's value. By default the next
    parameter's tag closes it, as vLLM's parser reads it (with a repair note); strict, the call is refused."""
    ctx = ctx_for("qwen3_6")
    text = "</think>\n\n" + WEATHER.replace("Paris\n</parameter>", "Paris") + "<|im_end|>"
    p = parse(ctx, text)
    assert calls_of(p) == [("get_weather", {"city": "Paris", "zip": "75001", "days": 3})]
    assert p.repairs == ["call 1 (get_weather): closed <parameter=city> with </parameter> before <parameter=zip>"]
    (call,) = ctx.parse_completion(ids(ctx, text), tools=TOOLS, strict=True).tool_calls
    assert call.name == "get_weather" and call.arguments == ""
    assert "'city' of get_weather was not closed with </parameter> before '<parameter=zip>'" in call.error


def test_llama3_call_after_prose_is_a_call():
    ctx = ctx_for("llama3_1")
    p = parse(ctx, 'Let me look that up.\n{"name": "lookup", "parameters": {"word": "naïve"}}<|eot_id|>')
    assert calls_of(p) == [("lookup", {"word": "naïve"})] and p.content == "Let me look that up."


def test_lfm_escaped_quote_is_read_as_python():
    ctx = ctx_for("lfm2_2_5")
    p = parse(ctx, "<|tool_call_start|>[lookup(word='Martha\\'s')]<|tool_call_end|><|im_end|>")
    assert calls_of(p) == [("lookup", {"word": "Martha's"})]


def test_values_are_typed_by_the_schema():
    from env_server.rendering.values import Param, cast

    optional_text, obj = Param(("string",), required=False), Param(("object",), required=True)
    # A string is never altered: null written for a string parameter is the string, as vLLM reads it, unless the
    # schema also allows null.
    assert cast("null", optional_text) == "null" and cast("None", optional_text) == "None"
    assert cast("None", Param(("string",), required=True)) == "None"
    assert cast("null", Param(("string", "null"), required=True)) is None
    assert cast("null", Param(("integer",), required=True)) is None  # JSON's null (vLLM's fallback reads it)
    assert cast("None", Param(("integer",), required=False)) is None  # an optional parameter left unset
    assert cast("{'a': True, 'b': None}", obj) == {"a": True, "b": None}  # a Python literal
    assert cast('"{\\"a\\": 1}"', obj) == {"a": 1}  # JSON encoded twice
    assert cast("3.0", Param(("integer",), True)) == 3 and cast("True", Param(("boolean",), True)) is True
    assert cast("seven", Param(("integer",), True)) == "seven"  # the environment says what is wrong


# ---------------------------------------------------------------- call ids the model writes


def test_kimi_ids_are_what_the_model_wrote_and_results_answer_them():
    ctx = ctx_for("kimi_k2")
    text = ('<|tool_calls_section_begin|><|tool_call_begin|>functions.lookup:0<|tool_call_argument_begin|>'
            '{"word": "a"}<|tool_call_end|><|tool_call_begin|>functions.run_python:1<|tool_call_argument_begin|>'
            '{"code": "1"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>')
    p = parse(ctx, text)
    assert [c.id for c in p.tool_calls] == ["functions.lookup:0", "functions.run_python:1"]
    suffix = ctx.decode(ctx.render_suffix(p.tool_calls, [Message(Role.TOOL, "A"), Message(Role.TOOL, "1")], None).ids)
    # (this template writes a literal backslash-n after the id)
    assert "## Return of functions.lookup:0\\nA" in suffix and "## Return of functions.run_python:1\\n1" in suffix


@pytest.mark.parametrize("written, expected", [("abcDEF123", "abcDEF123"), ("x", "c00001x00"), ("", "c00001x00")])
def test_mistral_call_ids_written_or_ours_where_the_template_refuses_them(written, expected):
    ctx = ctx_for("mistral_small_3_2")
    call_id = f"[CALL_ID]{written}" if written else ""
    p = ctx.parse_completion(ids(ctx, f'[TOOL_CALLS]lookup{call_id}[ARGS]{{"word": "w"}}</s>'), seq=1, tools=TOOLS)
    assert [(c.id, c.name, c.error) for c in p.tool_calls] == [(expected, "lookup", None)]
    suffix = ctx.decode(ctx.render_suffix(p.tool_calls, [Message(Role.TOOL, "out")], None).ids)
    assert suffix == f"[TOOL_RESULTS]{expected}[TOOL_CONTENT]out[/TOOL_RESULTS]"


def test_mistral_v3_json_ids_and_a_repeated_id():
    ctx = ctx_for("mistral_nemo")
    text = ('[TOOL_CALLS][{"name": "lookup", "arguments": {"word": "a"}, "id": "abcdefghi"}, '
            '{"name": "lookup", "arguments": {"word": "b"}, "id": "abcdefghi"}]</s>')
    p = ctx.parse_completion(ids(ctx, text), seq=2, tools=TOOLS)
    assert [c.id for c in p.tool_calls] == ["abcdefghi", "c00002x01"]  # tool results must answer distinct calls


def test_llama3_json_answer_that_is_not_a_call_stays_text():
    ctx = ctx_for("llama3_1")
    p = parse(ctx, 'The record is {"name": "Bob", "age": 3}.<|eot_id|>')
    assert p.tool_calls == [] and p.content == 'The record is {"name": "Bob", "age": 3}.'


@pytest.mark.parametrize("wire, text", [
    # Formats no committed template writes today (their templates are refused for other reasons): the parser alone.
    ("granite", 'Sure.<|tool_call|>[{"name": "lookup", "arguments": {"word": "<|tool_call|>[]"}}, '
                '{"name": "get_weather", "arguments": {"city": "Paris", "zip": "75001", "days": "3"}}]'),
    ("nemotron_json", '<TOOLCALL>[{"name": "lookup", "arguments": {"word": "</TOOLCALL>"}}, '
                      '{"name": "get_weather", "arguments": {"city": "Paris", "zip": "75001", "days": 3}}]</TOOLCALL>'),
    ("phi4", 'functools[{"name": "lookup", "arguments": {"word": "functools[]"}}, '
             '{"name": "get_weather", "arguments": "{\\"city\\": \\"Paris\\", \\"zip\\": \\"75001\\", \\"days\\": 3}"}]'),
    ("apertus", '<|tools_prefix|>[{"lookup": {"word": "<|tools_suffix|>"}}, '
                '{"get_weather": {"city": "Paris", "zip": "75001", "days": 3}}]<|tools_suffix|>'),
])
def test_json_list_formats_without_a_template(wire, text):
    from env_server.rendering.values import tool_index

    content, _, calls = formats()[wire].parse(text, tool_index(TOOLS))
    word = {"granite": "<|tool_call|>[]", "nemotron_json": "</TOOLCALL>", "phi4": "functools[]",
            "apertus": "<|tools_suffix|>"}[wire]
    assert [(c.name, json.loads(c.arguments), c.error) for c in calls] == [
        ("lookup", {"word": word}, None), ("get_weather", {"city": "Paris", "zip": "75001", "days": 3}, None)]
    assert content == ("Sure." if wire == "granite" else "")
