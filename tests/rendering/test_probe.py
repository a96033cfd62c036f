"""The registration probe adapts to what a template needs (call-id format, a system message, JSON-text
arguments) and derives stop tokens from the template; and the check command reports it."""

from __future__ import annotations

import json

import pytest

from env_server.check_tokenizer import main as check_main
from env_server.rendering import UnsupportedTemplateError
from env_server.rendering.probe import Probe
from env_server.rendering.registry import _load_tokenizer
from env_server.rendering.template import ChatTemplate
from tito.types import Message, ToolCall
from tito_assets.qwen_tokenizer import build_tokenizer_dir

from .helpers import REGISTRY, Turn, ctx_for, files_for, template_ids, walk

# A Mistral-style rule: call ids must be 9 alphanumerics; the model writes the id, results quote it.
MISTRAL_IDS = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in (m.tool_calls or []) %}"
    "{%- if c.id is not string or c.id|length != 9 or not c.id.isalnum() %}"
    "{{- raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
    "{{- '<tool_call>\\n{\"name\": \"' + c.function.name + '\", \"arguments\": ' + (c.function.arguments | tojson)"
    " + ', \"id\": \"' + c.id + '\"}\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response id=\"' + m.tool_call_id + '\">\\n' + m.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
NEEDS_SYSTEM = "{%- if messages[0].role != 'system' %}{{ raise_exception('a system message is required') }}{%- endif %}"


def with_template(source: str) -> dict[str, bytes]:
    return {**files_for("qwen2_5"), "chat_template.jinja": source.encode()}


def test_call_id_format_adapted_and_model_ids_kept():
    ctx = REGISTRY.register(with_template(MISTRAL_IDS), {})
    assert ctx.rules.style.ids == "alnum9"
    w = walk(ctx, [Turn([("run_python", {"code": "1"}), ("lookup", {"word": "a"})], ["1", "a"]),
                   Turn([("run_python", {"code": "2"})], ["2"])])
    ids = [m.tool_call_id for s in w.suffixes for m in s.tool_messages]
    assert all(len(i) == 9 and i.isalnum() for i in ids) and len(set(ids)) == 3
    # The id the model wrote is the call's id (its result must quote it).
    text = '<tool_call>\n{"name": "lookup", "arguments": {"word": "w"}, "id": "abcdefghi"}\n</tool_call><|im_end|>'
    call = ctx.parse_completion(ctx.tokenizer.encode(text, add_special_tokens=False)).tool_calls[0]
    assert call.id == "abcdefghi"


def test_system_message_added_only_when_required():
    source = NEEDS_SYSTEM + files_for("qwen2_5")["chat_template.jinja"].decode()
    ctx = REGISTRY.register(with_template(source), {})
    assert ctx.rules.style.system and not REGISTRY.register(files_for("qwen2_5"), {}).rules.style.system


def _probe(template: str) -> Probe:
    files = files_for(template)
    return Probe(ChatTemplate(_load_tokenizer(files), files["chat_template.jinja"].decode(), {}))


def test_json_text_arguments_detected_not_listed():
    """DeepSeek V3 concatenates the arguments as a string: the probe finds it by rendering."""
    style = _probe("deepseekv3").message_shape()
    assert style.json_args and not style.content_none


def test_refusal_names_the_step_and_what_to_do():
    with pytest.raises(UnsupportedTemplateError) as e:
        REGISTRY.register(files_for("phi3"), {})
    msg = str(e.value)
    assert "step 'message shape'" in msg and "upload the model's tool-calling template" in msg


def test_check_tokenizer_command(capsys):
    assert check_main([str(build_tokenizer_dir(template="glm4moe"))]) == 0
    out = capsys.readouterr().out
    assert "family:        glm" in out and "parser:        arg_kv" in out and "<|observation|> = " in out
    assert "overlap rule" in out and "suffix text: '\\n<tool_response>\\n42\\n" in out and "suffix ids:  [" in out
    assert out.rstrip().endswith("verdict: ACCEPTED")
    # Realistic outputs: prose then a call, two calls, and code holding GLM's own call markup runs once, as code.
    realistic = out[out.index("prose, then a call"):]
    runs = [line.split("would run:", 1)[1].rsplit("  id ", 1)[0].strip() for line in realistic.splitlines()
            if "would run:" in line]
    assert runs[:3] == ['run_python({"code": "print(6 * 7)"})', 'run_python({"code": "print(6 * 7)"})',
                        'lookup({"word": "naïve"})']
    assert len(runs) == 4 and runs[3].startswith('run_python({"code": "doc = ') and "<tool_call>run_python" in runs[3]
    assert check_main([str(build_tokenizer_dir(template="phi3"))]) == 1
    out = capsys.readouterr().out
    assert "verdict: REFUSED" in out and "step 'message shape'" in out
    kwargs = json.dumps({"enable_thinking": False})
    assert check_main([str(build_tokenizer_dir(template="qwen3")), "--chat-template-kwargs", kwargs]) == 0


def test_a_template_that_writes_its_system_turn_only_sometimes_gets_synthetic_renders_with_a_system_message():
    """MUSE Glimmer's template writes a system turn when there are tools, a system message or a generation prompt:
    without any of them its conversation renders otherwise once the prompt follows. The synthetic conversations open
    with a system message (tried before a tool: its system turn then holds no tool definitions), and the suffix
    still joins a real conversation with tools exactly (the golden check passed at registration)."""
    from env_server.rendering import messages as msgs

    ctx = ctx_for("muse_glimmer_vllm")
    style = ctx.rules.style
    assert style.system_in_synthetic and not style.tools_in_synthetic and not style.system
    assert ctx._head[0] == msgs.SYSTEM and ctx._tools is None
    assert msgs.head(style) == [msgs.SYNTHETIC_USER]  # a client's conversation is not changed
    calls = [ToolCall(style.call_id(0, 0, "run_python"), "run_python", '{"code": "1"}')]
    conv = [{"role": "user", "content": "go"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": calls[0].id, "type": "function", "function": {"name": "run_python", "arguments": {"code": "1"}}}]},
            {"role": "tool", "content": "1\n", "name": "run_python", "tool_call_id": calls[0].id}]
    suffix = ctx.render_suffix(calls, [Message.tool_result(calls[0], "1\n")], None).ids
    expected = template_ids(ctx, conv)
    assert expected[len(expected) - len(suffix):] == suffix
