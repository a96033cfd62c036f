"""Zero silent wrong: random argument values, written by each accepted family's template and parsed back, are the
calls that were written, or every call is answered with an error; never another call.

Values draw on what breaks parsers: whitespace at both ends, blank lines, both quotes, backslashes, unicode, and
the markup of every family (tags, markers, separators). Each accepted template of the corpus's families (one per
wire format and variant) gets the same examples (hypothesis, derandomized so a run is repeatable).
"""

from __future__ import annotations

import json
import os
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env_server.rendering import messages as msgs

from .corpus import FAMILIES, WIRES
from .helpers import TOOLS, ctx_for, writes_reasoning

MARKUP = (
    # Hermes / Qwen / Nemotron / Granite / InternLM2 / MiniMax M1 / Qwen2.5-Coder / Phi-4 / xLAM / Llama 3
    "<tool_call>", "</tool_call>", '{"name": "lookup", "arguments": {}}', "<tools>", "</tools>", "<TOOLCALL>[",
    "]</TOOLCALL>", "<|tool_call|>", "<|action_start|><|plugin|>", "<|action_end|>", "<tool_calls>", "functools[",
    '[{"name": "lookup"', "<|python_tag|>", '{"name": "lookup", "parameters": {}}',
    # XML parameters, Seed-OSS, MiniMax M2, MUSE Glimmer, GLM
    "<function=lookup>", "</function>", "<parameter=word>", "</parameter>", "<parameter=code>", "<seed:tool_call>",
    '<invoke name="lookup">', "</invoke>", '<parameter name="word">', "<atem:function_calls>",
    '<atem:parameter name="word">', "</atem:parameter>", "<arg_key>word</arg_key>", "<arg_value>", "</arg_value>",
    # DeepSeek, Kimi, Mistral, Gemma 4, harmony, Apertus
    "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "```json\n", "\n```",
    "<|tool_calls_section_begin|>", "<|tool_call_begin|>functions.lookup:0", "<|tool_call_argument_begin|>",
    "<|tool_call_end|>", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "<|tool_call>call:lookup{", "<tool_call|>",
    "<|channel|>commentary to=functions.lookup", "<|message|>", "<|call|>", "<|tools_prefix|>", "<|tools_suffix|>",
    # pythonic
    "[lookup(word='x')]", "<|tool_call_start|>", "<|tool_call_end|>", "<function_calls>", "</function_calls>",
    "), lookup(word=", ", word=", "')", '")', "'", '"', '"""', "\\", "\\n", "\\'", ")]",
)
PIECES = st.one_of(
    st.sampled_from(MARKUP),
    st.sampled_from([" ", "  ", "\t", "\n", "\n\n", " \n \n", "\r\n", "x", "print(1)", "é", "日本", "🙂", "\u200b", "null",
                     "None", "true", "3", "{", "}", "[", "]", ",", ":", "="]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=6),
)
# NFC: the tokenizer normalizes what it encodes, so a model never writes another form.
VALUES = st.lists(PIECES, max_size=10).map(lambda pieces: unicodedata.normalize("NFC", "".join(pieces)))
CALLS = st.lists(
    st.one_of(
        st.builds(lambda v: ("run_python", {"code": v}), VALUES),
        st.builds(lambda v: ("lookup", {"word": v}), VALUES),
        st.builds(lambda city, zip_, days: ("get_weather", {"city": city, "zip": zip_, "days": days}),
                  VALUES, VALUES, st.integers(-5, 10**6)),
    ),
    min_size=1, max_size=2,
)
# 5 examples per family in the test command (its time budget: each example mixes many of the hazards, and the
# examples are derandomized, so every run checks the same 5); TITO_PROPERTY_EXAMPLES=250 is the deep run.
SETTINGS = settings(max_examples=int(os.environ.get("TITO_PROPERTY_EXAMPLES", "5")), deadline=None,
                    derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _writable(ctx, value: str) -> bool:
    """Whether the template's writing of ``value`` is a text that means it. Gemma 4's strings have no escape for
    their delimiter <|"|>: no value can hold it. LFM2.5's, OLMo 3's and Llama 4's templates write strings without
    escaping them: a value holding a backslash or the template's own quote is then valid Python that means another
    value, and Python's reading is the deployment parser's (vLLM's, what the model writes); such values are
    checked as the model writes them (test_model_written_python_literals_parse_back)."""
    wire = WIRES[ctx.rules.wire]
    if wire.quote and wire.quote in value:
        return False
    return not (wire.raw_quote and (wire.raw_quote in value or "\\" in value))


@pytest.mark.parametrize("template", FAMILIES)
@SETTINGS
@given(calls=CALLS)
def test_written_calls_parse_back_or_are_answered(template, calls):
    ctx = ctx_for(template)
    if ctx.rules.max_calls_per_turn == 1:
        calls = calls[:1]
    if not all(_writable(ctx, v) for _, args in calls for v in args.values() if isinstance(v, str)):
        return
    style = ctx.rules.style
    turn = msgs.assistant(style, [(style.call_id(1, i, n), n, a) for i, (n, a) in enumerate(calls)],
                          "Let me use the tools." if writes_reasoning(ctx) else None)
    text = ctx.completion_text([{"role": "user", "content": "Do it."}], turn, TOOLS)
    parsed = ctx.parse_completion(ctx.encode(text), seq=1, tools=TOOLS)
    got = [(c.name, json.loads(c.arguments)) if not c.error else None for c in parsed.tool_calls]
    read = [g for g in got if g is not None]
    # Every call read is one that was written, in order; and with no error, all of them.
    assert read == calls if len(read) == len(got) else _in_order(read, calls), (
        f"{template}: wrote {calls}, read {got} from {text!r}")


def _in_order(read: list, written: list) -> bool:
    it = iter(written)
    return all(any(r == w for w in it) for r in read)


RAW = ["lfm2_2_5", "olmo3", "llama4_pythonic"]  # the templates that write strings unescaped


@pytest.mark.parametrize("template", RAW)
@SETTINGS
@given(calls=CALLS)
def test_model_written_python_literals_parse_back(template, calls):
    """The pythonic families as their models write calls (Python literals, escapes and all: what vLLM's parsers
    read), where the templates' unescaped writing cannot carry every value."""
    from env_server.rendering.parse_pythonic import PYTHONIC_FAMILIES

    ctx = ctx_for(template)
    syn = next(s for s in PYTHONIC_FAMILIES if s.name == ctx.rules.wire)
    written = [f"{n}({', '.join(f'{k}={v!r}' for k, v in a.items())})" for n, a in calls]
    body = "[" + ", ".join(written) + "]" if syn.listed else "\n".join(written)
    opened, closed = syn.markers or ("", "")
    text = f"{opened}{body}{closed}{ctx.rules.boundary}"
    parsed = ctx.parse_completion(ctx.encode(text), seq=1, tools=TOOLS)
    got = [(c.name, json.loads(c.arguments)) if not c.error else c.error for c in parsed.tool_calls]
    # A value the template cannot write back (registration names them: a backslash, its quote) is answered with
    # an error, never run as a call the conversation would show otherwise (carry.py); every other call runs.
    quote = WIRES[ctx.rules.wire].raw_quote
    assert ctx.rules.uncarried and len(got) == len(calls), f"{template}: wrote {calls}, read {got} from {text!r}"
    for g, (name, args) in zip(got, calls):
        plain = not any(isinstance(v, str) and any(c in v for c in ("\\", quote, *(syn.markers or ())))
                        for v in args.values())
        assert g == (name, args) or (not plain and "cannot write this call" in g), (
            f"{template}: wrote {calls}, read {got} from {text!r}")


NESTED_XML = (  # balanced markup of the XML families, with the probe tools' own parameter names
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nx\n</parameter>\n<parameter=zip>\ny\n</parameter>\n"
    "</function>\n</tool_call>",
    "<tool_call>\n<function=lookup>\n<parameter=word>\nw\n</parameter>\n</function>\n</tool_call>",
    "<parameter=code>\nprint(1)\n</parameter>", "<parameter=zip>\n</parameter>", "<parameter=word>\nz\n</parameter>",
)
NESTED_VALUES = st.lists(st.one_of(st.sampled_from(NESTED_XML), st.sampled_from(["", "x", "  ", "print(1)"])),
                         max_size=5).map("\n".join)
NESTED_CALLS = st.lists(st.one_of(
    st.builds(lambda v: ("run_python", {"code": v}), NESTED_VALUES),
    st.builds(lambda v: ("lookup", {"word": v}), NESTED_VALUES),
    st.builds(lambda city, zip_: ("get_weather", {"city": city, "zip": zip_, "days": 3}), NESTED_VALUES,
              NESTED_VALUES)), min_size=1, max_size=2)


@pytest.mark.parametrize("template", ["qwen3_coder", "qwen3_6", "nemotron_3_nano"])
@SETTINGS
@given(calls=NESTED_CALLS)
def test_xml_values_holding_balanced_markup_read_whole(template, calls):
    """A value holding whole calls or parameters in the family's own markup, each tag pair balanced (a parameter
    tag opened at the start of a line, closed by its own closing tag), reads whole, as vLLM's qwen3_coder reads it:
    such a closing tag is the value's own, never where the value ends."""
    ctx = ctx_for(template)
    style = ctx.rules.style
    turn = msgs.assistant(style, [(style.call_id(1, i, n), n, a) for i, (n, a) in enumerate(calls)],
                          "Let me use the tools." if writes_reasoning(ctx) else None)
    text = ctx.completion_text([{"role": "user", "content": "Do it."}], turn, TOOLS)
    parsed = ctx.parse_completion(ctx.encode(text), seq=1, tools=TOOLS)
    got = [(c.name, json.loads(c.arguments)) if not c.error else c.error for c in parsed.tool_calls]
    assert got == calls and not parsed.repairs, f"{template}: wrote {calls}, read {got} from {text!r}"
