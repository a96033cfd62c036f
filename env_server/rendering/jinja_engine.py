"""The one Jinja engine every chat template is rendered with, at registration and at every Step.

It is transformers' own configuration: ``apply_chat_template`` compiles a template in an
``ImmutableSandboxedEnvironment`` with its extensions (``{% generation %}``, loop controls), its
``tojson`` filter and its globals (``raise_exception``, ``strftime_now``), and vLLM renders through
it. tito compiles every template with that configuration (the same options, extensions, filters, tests
and globals, so the same generated code: checked at compile time), so a template renders here exactly as it
does there. tito's environment is a subclass of the same sandbox class that answers five of its checks
(attribute verdicts, attribute reads of dicts, calls of builtins, of macros and of ``namespace``/``range``) faster with the same answers
(``_FastChecks``): a Step renders a whole synthetic conversation, and these checks took about a third of that
render's time (the Kimi K2 templates after 8 calls).

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

import functools
import types
from typing import Any

from jinja2 import nodes
from jinja2.runtime import Context, LoopContext, Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment, safe_range
from jinja2.utils import Namespace, _PassArg
from transformers.utils.chat_template_utils import _compile_jinja_template

# The methods of list, dict, set and deque that change the object (what the immutable sandbox refuses).
MUTATING_METHODS = frozenset({
    "append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort",  # list
    "update", "setdefault", "popitem",  # dict
    "add", "discard", "difference_update", "intersection_update", "symmetric_difference_update",  # set
    "appendleft", "extendleft", "popleft", "rotate",  # deque
})

# Exact types whose every instance gets the same safety verdict for an attribute name: the sandbox decides from
# the name and from isinstance checks of the object, which for these (none overrides __class__) depend on the
# type alone.
_PLAIN_TYPES = frozenset({dict, list, tuple, str, int, float, bool, type(None), Namespace, LoopContext})
_BUILTIN = types.BuiltinFunctionType  # also the type of bound builtin methods: dict.get, list.append, str.split
# jinja2 >= 3.1.5 sandboxes str.format where the template reads it (getattr returns a wrapper); before, the sandbox
# checked it in `call`, which the fast path below skips: there, every call goes through the sandbox's `call`.
_FORMAT_CHECKED_AT_READ = hasattr(SandboxedEnvironment, "wrap_str_format")
# Context.call calls a macro with the evaluation context first (Macro.__call__ is pass_eval_context in jinja2 3.1;
# checked here, not assumed).
_MACRO_TAKES_EVAL_CONTEXT = (_PassArg.from_obj(Macro) is None
                             and _PassArg.from_obj(Macro.__call__) is _PassArg.eval_context)
# The sandbox's globals that templates call at every render (namespace(...): Gemma 4's template ten times; range(...)):
# the sandbox finds nothing unsafe on them and Context.call passes them no context (neither they nor their
# __call__ take one: checked here, not assumed), so they are called as builtins are.
# By identity (ids of objects that live as long as jinja2): `in` on the objects would call a template value's __eq__.
_PLAIN_GLOBALS = frozenset(id(f) for f in (Namespace, safe_range)
                           if _PassArg.from_obj(f) is None and _PassArg.from_obj(f.__call__) is None
                           and SandboxedEnvironment().is_safe_callable(f))
# A dict's attributes are its class's (an exact dict has no instance attributes and no __getattr__): any other name
# read as `d.name` is a lookup of the key, as the sandbox's getattr does after getattr(d, name) fails.
_DICT_ATTRIBUTES = frozenset(dir(dict))


class _FastChecks:
    """Five of the sandbox's paths, answered as the sandbox answers them, faster.

    - ``is_safe_attribute`` of an object of a plain type is memoized per (type, attribute name).
    - ``call`` of a builtin function or bound builtin method: such an object has no attributes of its own (no
      ``unsafe_callable``, ``alters_data`` or ``jinja_pass_arg``), so ``is_safe_callable`` passes it and
      ``Context.call`` calls it as is; it is called here as ``Context.call`` would (jinja2 3.1): the loop and block
      variables the generated code passes are dropped, and a StopIteration gives an undefined value.
    - ``getattr`` of an exact dict: a name it has no attribute for reads the key, as the sandbox does once Python's
      getattr has raised AttributeError (templates read ``message.role``, ``tool_call.function.name``: raising and
      catching that error was the largest part of such a read); its own attributes (``message.get``) get the
      memoized verdict, without the ``str.format`` check (a dict's attribute is never a string's method).
    - ``call`` of a template's own macro: the sandbox finds nothing unsafe on it (a template cannot set an attribute
      on a macro), and it is called as ``Context.call`` calls it: with the evaluation context first.
    - ``call`` of ``namespace`` or ``range`` (the sandbox's globals): called as a builtin is (``_PLAIN_GLOBALS``).
    Everything else goes to the sandbox's own methods."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._verdicts: dict[tuple[type, str], bool] = {}

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        cls = type(obj)
        if cls not in _PLAIN_TYPES:
            return super().is_safe_attribute(obj, attr, value)  # type: ignore[misc]
        verdict = self._verdicts.get((cls, attr))
        if verdict is None:  # the sandbox's verdict reads the name and the type, never the value
            verdict = self._verdicts[(cls, attr)] = super().is_safe_attribute(obj, attr, value)  # type: ignore[misc]
        return verdict

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is not dict:
            return super().getattr(obj, attribute)  # type: ignore[misc]
        if attribute not in _DICT_ATTRIBUTES:
            try:  # the sandbox's path once getattr(obj, attribute) has raised AttributeError, without raising it
                return obj[attribute]
            except (TypeError, LookupError):
                return self.undefined(obj=obj, name=attribute)  # type: ignore[attr-defined]
        value = getattr(obj, attribute)  # a dict's own attribute (d.get): never str.format, so no format wrapper
        if self.is_safe_attribute(obj, attribute, value):
            return value
        return self.unsafe_undefined(obj, attribute)  # type: ignore[attr-defined]

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's names)
        kind = type(__obj)
        if kind is _BUILTIN and _FORMAT_CHECKED_AT_READ:
            function = __obj
        elif kind is Macro and _MACRO_TAKES_EVAL_CONTEXT:
            function, args = __obj.__call__, (__context.eval_ctx, *args)
        elif id(__obj) in _PLAIN_GLOBALS:
            function = __obj
        else:
            return super().call(__context, __obj, *args, **kwargs)  # type: ignore[misc]
        kwargs.pop("_block_vars", None)
        kwargs.pop("_loop_vars", None)
        try:
            return function(*args, **kwargs)
        except StopIteration:
            return __context.environment.undefined(
                "value was undefined because a callable raised a StopIteration exception")


class FastImmutableSandbox(_FastChecks, ImmutableSandboxedEnvironment):
    """transformers' sandbox (lists, dicts and sets cannot be changed), with the faster checks."""


class FastSandbox(_FastChecks, SandboxedEnvironment):
    """jinja2's sandbox that allows changing lists, dicts and sets, with the faster checks."""


def mutating_calls(template: Any, source: str) -> list[str]:
    """The mutating methods the template's source names (``x.append``, ``x['append']``), sorted."""
    tree = template.environment.parse(source)
    names = {n.attr for n in tree.find_all(nodes.Getattr) if n.attr in MUTATING_METHODS}
    names |= {n.arg.value for n in tree.find_all(nodes.Getitem)
              if isinstance(n.arg, nodes.Const) and n.arg.value in MUTATING_METHODS}
    return sorted(names)


def _configured_like(base: Any, cls: type) -> Any:
    """An environment of ``cls`` with ``base``'s configuration: options, extensions, filters, tests, globals."""
    env = cls(trim_blocks=base.trim_blocks, lstrip_blocks=base.lstrip_blocks,
              extensions=[type(e) for e in base.extensions.values()])
    for option in ("block_start_string", "block_end_string", "variable_start_string", "variable_end_string",
                   "comment_start_string", "comment_end_string", "line_statement_prefix", "line_comment_prefix",
                   "newline_sequence", "keep_trailing_newline", "autoescape", "finalize", "undefined", "optimized"):
        setattr(env, option, getattr(base, option))
    env.policies = dict(base.policies)
    env.filters.update(base.filters)
    env.tests.update(base.tests)
    env.globals.update(base.globals)
    return env


def compile_template(source: str) -> tuple[Any, list[str]]:
    """``(compiled template, the mutating methods it calls)``: compiled in transformers' configuration, in its
    sandbox when the template calls no mutating method, else in the sandbox that allows them (the caller copies
    inputs per render). Raises RuntimeError if the generated code differs from transformers' (a configuration
    this module does not copy)."""
    template, methods = _compile(source)
    return template, list(methods)


@functools.lru_cache(maxsize=64)  # a compiled template is immutable and renders in any thread (as transformers')
def _compile(source: str) -> tuple[Any, tuple[str, ...]]:
    immutable = _compile_jinja_template(source)  # lru-cached in transformers
    base = immutable.environment
    methods = mutating_calls(immutable, source)
    env = _configured_like(base, FastSandbox if methods else FastImmutableSandbox)
    if env.compile(source, raw=True) != base.compile(source, raw=True):
        raise RuntimeError("tito's Jinja environment generates other code than transformers' for this template: "
                           "jinja_engine.py does not copy some option of transformers' environment")
    return env.from_string(source), tuple(methods)
