"""One Jinja engine for every template: transformers' own, and for a template that changes lists it builds
(llama.cpp's Kimi K2 copies call .append/.pop, which transformers' sandbox refuses) the same configuration in a
sandbox that allows them, on copies of its inputs. Registration and Step render with the same one."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError
from transformers.utils.chat_template_utils import _compile_jinja_template

from env_server.rendering.jinja_engine import compile_template
from env_server.rendering.template import ChatTemplate

from .helpers import TOOLS, ctx_for, template_ids

HOSTILE = ("{%- set _ = messages.append({'role': 'user', 'content': 'injected'}) -%}"
           "{%- set _ = messages[0].update({'content': 'changed'}) -%}"
           "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")


def test_a_template_that_changes_no_list_is_transformers_own_compiled_template():
    ctx = ctx_for("qwen3")
    assert ctx.template.mutates == []
    assert ctx.template._template is _compile_jinja_template(ctx.template.source)


@pytest.mark.parametrize("template", ["kimi_k2_instruct", "kimi_k2_thinking"])
def test_llamacpp_kimi_templates_render_here_and_transformers_refuses_them(template):
    ctx = ctx_for(template)
    assert ctx.template.mutates == ["append", "pop"]
    conv = [{"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "functions.lookup:0", "type": "function", "function": {"name": "lookup", "arguments": {}}}]},
            {"role": "tool", "content": "r", "name": "lookup", "tool_call_id": "functions.lookup:0"}]
    with pytest.raises(SecurityError, match="'append' of 'list' object is unsafe"):
        ctx.tokenizer.apply_chat_template(conv, tools=TOOLS, tokenize=False)
    text = ctx.decode(template_ids(ctx, conv))
    assert "<|tool_call_begin|>functions.lookup:0<|tool_call_argument_begin|>" in text
    assert "## Return of functions.lookup:0\nr" in text  # the id the template queued with .append, taken with .pop


def test_a_template_cannot_change_the_callers_objects_or_the_next_render():
    t = ChatTemplate(ctx_for("qwen2_5").tokenizer, HOSTILE, {})
    assert t.mutates == ["append", "update"]
    messages = [{"role": "user", "content": "hello"}]
    first = t.render(messages)
    assert first == t.render(messages) == "user: changed\nuser: injected\n"
    assert messages == [{"role": "user", "content": "hello"}]


def test_everything_else_stays_forbidden_in_the_permissive_sandbox():
    template, methods = compile_template("{{ messages.append.__self__.__class__ }}{{ ''.__class__.__mro__ }}")
    assert methods == ["append"]
    with pytest.raises(SecurityError):
        template.render(messages=[])
