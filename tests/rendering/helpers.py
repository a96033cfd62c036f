"""Shared helpers: registered contexts and the boundary walk against the template's own render."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from env_server.rendering import RenderingContext, TokenizerRegistry
from env_server.rendering import messages as msgs
from tito.types import Message, ToolCall, ToolSpec
from tito.fingerprint import read_tokenizer_files
from tito_assets.qwen_tokenizer import build_tokenizer_dir

TEMPLATES = ["qwen2_5", "qwen3", "qwen3_instruct_2507", "llama3_1", "gptoss"]

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "run_python",
            "description": "Run Python code.",
            "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a place.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "zip", "days"],
            },
        },
    },
]


def tool_specs(tools: list[dict]) -> list[ToolSpec]:
    """OpenAI-style tool dicts as the `ToolSpec`s the renderer takes."""
    return [ToolSpec(t["function"]["name"], t["function"].get("description", ""), t["function"]["parameters"])
            for t in tools]

REGISTRY = TokenizerRegistry(max_entries=96)  # every template the walk registers
_FILES: dict[str, dict[str, bytes]] = {}


def files_for(template: str) -> dict[str, bytes]:
    if template not in _FILES:
        _FILES[template] = read_tokenizer_files(build_tokenizer_dir(template=template))
    return _FILES[template]


_CONTEXTS: dict[tuple[str, str], RenderingContext] = {}


def ctx_for(template: str, **kwargs) -> RenderingContext:
    """The registered context of a template; kept per test session, since registering again (idempotent) still
    fingerprints the files (~0.5 s for a 150k vocabulary)."""
    key = (template, json.dumps(kwargs, sort_keys=True))
    if key not in _CONTEXTS:
        _CONTEXTS[key] = REGISTRY.register(files_for(template), kwargs)
    return _CONTEXTS[key]


def template_ids(ctx: RenderingContext, conv: list[dict], generation_prompt: bool = True) -> list[int]:
    """Ground truth: transformers' own apply_chat_template, control tokens in inputs encoded as text. For a template
    that transformers' sandbox refuses (it calls list.append: jinja_engine.py), the one render of the whole
    conversation through the engine tito renders it with."""
    if ctx.template.mutates:
        return ctx.render_conversation(conv, TOOLS, add_generation_prompt=generation_prompt)
    return ctx.tokenizer.apply_chat_template(
        conv,
        tools=TOOLS,
        add_generation_prompt=generation_prompt,
        sanitize_control_tokens=True,
        tokenize=True,
        return_dict=False,
        **ctx.chat_template_kwargs,
    )


def template_text(ctx: RenderingContext, conv: list[dict], generation_prompt: bool) -> str:
    if ctx.template.mutates:
        return ctx.render_text(msgs.normalize(conv, ctx.rules.style), TOOLS, generation_prompt)
    return ctx.tokenizer.apply_chat_template(
        conv, tools=TOOLS, add_generation_prompt=generation_prompt, tokenize=False, **ctx.chat_template_kwargs
    )


def model_completion(ctx: RenderingContext, conv: list[dict], asst: dict) -> list[int]:
    """The assistant turn as the model generates it: the template's rendering of the turn after the
    generation prompt, through the token that ends it (the boundary, for a call turn), tokenized alone."""
    return ctx.encode(ctx.completion_text(conv, asst, TOOLS))


@dataclass
class Turn:
    calls: list[tuple[str, dict]]
    outputs: list[str]
    reasoning: str = "Let me use the tool."


@dataclass
class Walk:
    ours: list[int]
    conv: list[dict]
    suffixes: list = field(default_factory=list)
    expected: list[list[int]] = field(default_factory=list)
    ours_at: list[list[int]] = field(default_factory=list)
    rerendered: list[int] = field(default_factory=list)  # rounds where the template rewrote earlier turns


_NATURAL_REASONING: dict[str, bool] = {}


def writes_reasoning(ctx: RenderingContext) -> bool:
    """Whether a model under this template writes reasoning: the template has a field for it and its render
    of a turn with reasoning continues the generation prompt (Qwen3.5 nothink prefills an empty block)."""
    if ctx.fingerprint not in _NATURAL_REASONING:
        conv = [{"role": "user", "content": "hi"}]
        turn = msgs.assistant(ctx.rules.style, [("c", "lookup", {"word": "w"})], "Thinking.")
        before = template_text(ctx, conv, True)
        _NATURAL_REASONING[ctx.fingerprint] = bool(ctx.rules.style.reasoning_field) and template_text(
            ctx, conv + [turn], False).startswith(before)
    return _NATURAL_REASONING[ctx.fingerprint]


def assistant_message(ctx: RenderingContext, turn: Turn, k: int, calls_before: int = 0) -> dict:
    """The call turn in the template's shapes, with the ids the server gives the parsed calls of step k (after
    ``calls_before`` calls in the conversation)."""
    style = ctx.rules.style
    reasoning = turn.reasoning if writes_reasoning(ctx) else None
    return msgs.assistant(style, [(style.call_id(k, i, n, calls_before), n, a) for i, (n, a) in enumerate(turn.calls)],
                          reasoning)


def _rewrites_history(ctx: RenderingContext) -> bool:
    return any("re-renders earlier" in q for q in ctx.quirks)


def walk(ctx: RenderingContext, turns: list[Turn], budget: int | None = None, check: bool = True,
         resplit: Callable[[RenderingContext, list[int]], list[int]] | None = None) -> Walk:
    """Build ids as trainer + server do, comparing with the template's render at each boundary.

    ``resplit`` tokenizes the model's completion differently (same text): then the text must still
    equal the template's, and the suffix ids its exact tail."""
    conv = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Compute things with the tools."},
    ]
    ours = ctx.render_prompt([Message.coerce(m) for m in conv], tool_specs(TOOLS))
    assert ours == template_ids(ctx, conv), "prompt ids differ from apply_chat_template"
    w = Walk(ours=ours, conv=conv)
    calls_before = 0
    for k, turn in enumerate(turns):
        asst = assistant_message(ctx, turn, k, calls_before)
        completion = model_completion(ctx, w.conv, asst)
        if resplit is not None:
            canonical, completion = completion, resplit(ctx, completion)
            assert completion != canonical and ctx.decode(completion) == ctx.decode(canonical)
        parsed = ctx.parse_completion(completion, seq=k, tools=TOOLS, calls_before=calls_before)
        written = turn.calls[: ctx.rules.max_calls_per_turn or None]
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls][: len(written)] == written
        style = ctx.rules.style
        calls = [ToolCall(style.call_id(k, i, n, calls_before), n, json.dumps(a)) for i, (n, a) in enumerate(turn.calls)]
        results = [Message.tool_result(c, out) for c, out in zip(calls, turn.outputs)]
        suffix = ctx.render_suffix(calls, results, budget, later_round=k > 0, calls_before=calls_before)
        calls_before += len(calls)
        assert not suffix.overflow
        w.suffixes.append(suffix)
        w.ours = w.ours + completion + suffix.ids
        w.conv = w.conv + [asst] + [m.to_dict() for m in suffix.tool_messages]
        expected = template_ids(ctx, w.conv)
        w.expected.append(expected)
        w.ours_at.append(list(w.ours))
        # The suffix is always the exact tail of the template's own render.
        assert expected[len(expected) - len(suffix.ids) :] == suffix.ids
        if resplit is not None:
            if ctx.decode(w.ours) != ctx.decode(expected):
                assert _rewrites_history(ctx), (ctx.decode(w.ours)[-300:], ctx.decode(expected)[-300:])
                w.rerendered.append(k)
            w.ours = expected
        elif check and w.ours != expected and _rewrites_history(ctx):
            # The template renders earlier turns otherwise once later ones follow (registration saw it
            # and noted it): the ids are what the model saw at each round, the suffix the exact tail.
            w.rerendered.append(k)
            w.ours = expected
        elif check:
            assert w.ours == expected, (
                f"turn {k}: ours {ctx.decode(w.ours)[-300:]!r}\n template {ctx.decode(expected)[-300:]!r}"
            )
    return w
