"""One Jinja engine for every template: transformers' configuration and sandbox (with two of its checks answered
faster, the same answers), and for a template that changes lists it builds (llama.cpp's Kimi K2 copies call
.append/.pop, which transformers' sandbox refuses) the same configuration in a sandbox that allows them, on copies
of its inputs. Registration and Step render with the same one."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment
from transformers.utils.chat_template_utils import _compile_jinja_template

from env_server.rendering.jinja_engine import FastImmutableSandbox, FastSandbox, compile_template
from env_server.rendering.template import ChatTemplate

from .helpers import TOOLS, ctx_for, template_ids

HOSTILE = ("{%- set _ = messages.append({'role': 'user', 'content': 'injected'}) -%}"
           "{%- set _ = messages[0].update({'content': 'changed'}) -%}"
           "{%- for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")


def test_a_template_that_changes_no_list_compiles_in_transformers_sandbox_and_configuration():
    ctx = ctx_for("qwen3")
    assert ctx.template.mutates == []
    ours, theirs = ctx.template._template.environment, _compile_jinja_template(ctx.template.source).environment
    assert isinstance(ours, ImmutableSandboxedEnvironment) and type(theirs) is ImmutableSandboxedEnvironment
    assert ours.compile(ctx.template.source, raw=True) == theirs.compile(ctx.template.source, raw=True)
    assert ours.filters == theirs.filters and ours.tests == theirs.tests and ours.globals == theirs.globals
    assert [type(e) for e in ours.extensions.values()] == [type(e) for e in theirs.extensions.values()]


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


# Attribute reads and calls the sandbox allows or refuses, on the plain types whose verdicts are memoized and on
# others; calls of builtins (inside a loop too, and one raising StopIteration: an undefined value); dict keys read
# as attributes; macros.
PROBES = [
    "{{ m.get('a') }}", "{{ m.items() | list }}", "{{ 'a,b'.split(',') }}", "{{ 'x{}'.format(1) }}",
    "{{ 'x{0.__class__}'.format(1) }}", "{{ ''.__class__ }}", "{{ m.__class__ }}", "{{ m._private }}",
    "{{ l.append is defined }}", "{{ l.append(1) }}{{ l }}", "{{ m.update({'b': 2}) }}{{ m }}", "{{ m.pop('a') }}",
    "{{ ns.v }}{% set ns.v = 2 %}{{ ns.v }}", "{{ ns.f('a') }}", "{{ ns.g('a') }}",
    "{% for x in l %}{{ loop.index }}{{ x.get('k') }}{% endfor %}", "{% for x in l %}{{ loop.__class__ }}{% endfor %}",
    "{{ (1).__class__ }}", "{{ (1.5).real }}", "{{ none.__class__ }}",
    "{{ t.count(1) }}", "{{ range(3) | list }}", "{{ f.__code__ }}", "{{ f.__globals__ }}", "{{ it.__next__() }}",
    "{{ l.__getitem__(0) }}", "{{ m.get.__self__ }}", "{{ m.setdefault('c', 3) }}{{ m }}",
    "{{ nxt(it) is defined }}", "{{ 'a,b'.split(sep=',') }}", "{% for x in l %}{{ nxt(it) is undefined }}{% endfor %}",
    # a dict's keys read as attributes, its own attributes, names that are neither; macros with every kind of argument
    "{{ m.a }}{{ m.zz is defined }}{{ m._x is defined }}{{ m.zz.yy is defined }}", "{{ {'items': 1}.items is callable }}",
    "{{ {'_p': 1}._p }}{{ {'__class__': 1}.__class__ }}", "{{ m.keys() | list }}{{ m.__len__() }}",
    "{% macro k(x, y=2) %}{{ x }}{{ y }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ k(1) }}{{ k(1, 3, 4) }}{{ k(1, z=5) }}",
    "{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}",
    "{% macro k(x) %}{{ x.k }}{{ x.zz is defined }}{% endmacro %}{% for x in l %}{{ k(x) }}{% endfor %}",
    "{% macro k() %}{{ nxt(it) }}{% endmacro %}{{ k() is defined }}",
    # namespace and range called as builtins are: with arguments of every kind, in a loop, refused by range
    "{% for x in l %}{% set n = namespace({'a': 1}, b=x) %}{{ n.a }}{{ n.b }}{{ range(1, 9, 3) | list }}{% endfor %}",
    "{{ range(10 ** 9) }}", "{{ range('a') }}", "{{ namespace(1) }}", "{{ namespace.__init__ }}",
]


@pytest.mark.parametrize("fast, plain", [(FastImmutableSandbox, ImmutableSandboxedEnvironment),
                                         (FastSandbox, SandboxedEnvironment)])
@pytest.mark.parametrize("source", PROBES)
def test_the_faster_checks_answer_as_the_sandbox_does(fast, plain, source):
    def outcome(cls):
        template = cls().from_string("{% set ns = namespace(v=1, f='{}'.format, g='{0.__class__}'.format) %}" + source)
        results = []
        for _ in range(2):  # the second render reads the memoized verdicts
            data = {"m": {"a": 1}, "l": [{"k": "v"}], "t": (1, 1), "f": lambda: 0, "it": iter(()), "nxt": next}
            try:
                results.append(("ok", template.render(**data), repr(data["m"]), repr(data["l"])))
            except Exception as e:  # the sandbox's refusal (SecurityError) or the call's own error
                results.append((type(e).__name__, str(e)))
        return results

    assert outcome(fast) == outcome(plain)
