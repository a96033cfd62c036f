"""The one Jinja engine every chat template is rendered with, at registration and at every Step.

It is transformers' own: ``apply_chat_template`` compiles a template in an
``ImmutableSandboxedEnvironment`` with its extensions (``{% generation %}``, loop controls), its
``tojson`` filter and its globals (``raise_exception``, ``strftime_now``), and vLLM renders through
it. tito compiles every template with that function, so a template renders here exactly as it
does there.

One difference, for one kind of template: transformers' sandbox refuses every method that changes a
list, dict or set (``SecurityError: access to attribute 'append' of 'list' object is unsafe``), so
transformers and vLLM cannot render a template that builds a list with ``.append`` or takes from it
with ``.pop`` (llama.cpp's copies of the Kimi K2 Instruct and Thinking templates keep a queue of call
ids that way; llama.cpp's own Jinja engine allows it). A template whose source calls such a method
is compiled by the same environment's configuration (extensions, filters, tests, globals) in
jinja2's ``SandboxedEnvironment``, which allows those methods and still blocks everything unsafe
(private attributes, internals). That template gets a deep copy of the conversation, tools and
variables at every render, so nothing it changes can reach the caller's objects (tito caches the
synthetic conversation a suffix is rendered from) or the next render. Which engine a template gets
is decided once, from its source, when it is compiled: registration and Step use the same one.
"""

from __future__ import annotations

from typing import Any

from jinja2 import nodes
from jinja2.sandbox import SandboxedEnvironment
from transformers.utils.chat_template_utils import _compile_jinja_template

# The methods of list, dict, set and deque that change the object (what the immutable sandbox refuses).
MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort",  # list
    "update", "setdefault", "popitem",  # dict
    "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",  # set
    "appendleft", "extendleft", "popleft", "rotate",  # deque
})


def mutating_calls(template: Any, source: str) -> list[str]:
    """The mutating methods the template's source names (``x.append``, ``x['append']``), sorted."""
    tree = template.environment.parse(source)
    names = {n.attr for n in tree.find_all(nodes.Getattr) if n.attr in MUTATING_METHODS}
    names |= {n.arg.value for n in tree.find_all(nodes.Getitem)
              if isinstance(n.arg, nodes.Const) and n.arg.value in MUTATING_METHODS}
    return sorted(names)


def compile_template(source: str) -> tuple[Any, list[str]]:
    """``(compiled template, the mutating methods it calls)``: transformers' compiled template when it calls
    none, else the same configuration in a sandbox that allows them (the caller copies inputs per render)."""
    immutable = _compile_jinja_template(source)  # lru-cached in transformers
    methods = mutating_calls(immutable, source)
    if not methods:
        return immutable, []
    base = immutable.environment
    env = SandboxedEnvironment(trim_blocks=base.trim_blocks, lstrip_blocks=base.lstrip_blocks,
                               extensions=[type(e) for e in base.extensions.values()])
    env.filters.update(base.filters)
    env.tests.update(base.tests)
    env.globals.update(base.globals)
    return env.from_string(source), methods
