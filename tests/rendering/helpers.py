"""Shared helpers: registered contexts and the boundary walk against the template's own render."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

from env_server.rendering import RenderingContext, TokenizerRegistry
from tito.types import ToolCall, call_id
from tito_assets.qwen_tokenizer import build_tokenizer_dir, load_tokenizer_files

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
]

REGISTRY = TokenizerRegistry(max_entries=32)
_FILES: dict[str, dict[str, bytes]] = {}


def files_for(template: str) -> dict[str, bytes]:
    if template not in _FILES:
        _FILES[template] = load_tokenizer_files(build_tokenizer_dir(template=template))
    return _FILES[template]


def ctx_for(template: str, **kwargs) -> RenderingContext:
    return REGISTRY.register(files_for(template), kwargs)


def template_ids(ctx: RenderingContext, conv: list[dict], generation_prompt: bool = True) -> list[int]:
    """Ground truth: transformers' own apply_chat_template, control tokens in inputs encoded as text."""
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
    return ctx.tokenizer.apply_chat_template(
        conv, tools=TOOLS, add_generation_prompt=generation_prompt, tokenize=False, **ctx.chat_template_kwargs
    )


def model_completion(ctx: RenderingContext, conv: list[dict], asst: dict) -> list[int]:
    """The assistant turn as the model generates it: the template's rendering of the turn after the
    generation prompt, up to and including the first stop token, tokenized alone."""
    before = template_text(ctx, conv, True)
    after = template_text(ctx, conv + [asst], False)
    assert after.startswith(before), "generation prompt is not a prefix of the assistant turn"
    text = after[len(before) :]
    stops = [ctx.tokenizer.convert_ids_to_tokens(i) for i in ctx.stop_token_ids]
    end = min(text.find(s) + len(s) for s in stops if s in text)
    return ctx.tokenizer.encode(text[:end], add_special_tokens=False)


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


def assistant_message(ctx: RenderingContext, turn: Turn, k: int) -> dict:
    msg = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": f"call_{k}_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(turn.calls)
        ],
    }
    if ctx.rules.reasoning_field:
        msg[ctx.rules.reasoning_field] = turn.reasoning
    return msg


def walk(ctx: RenderingContext, turns: list[Turn], budget: int | None = None, check: bool = True) -> Walk:
    """Build ids as trainer + server do, comparing with the template's render at each boundary."""
    conv = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Compute things with the tools."},
    ]
    ours = ctx.render_prompt(conv, TOOLS)
    assert ours == template_ids(ctx, conv), "prompt ids differ from apply_chat_template"
    w = Walk(ours=ours, conv=conv)
    for k, turn in enumerate(turns):
        asst = assistant_message(ctx, turn, k)
        completion = model_completion(ctx, w.conv, asst)
        parsed = ctx.parse_completion(completion, seq=k)
        written = turn.calls[: ctx.rules.max_calls_per_turn or None]
        assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == written
        calls = [ToolCall(call_id(k, i), n, json.dumps(a)) for i, (n, a) in enumerate(turn.calls)]
        msgs = [
            {"role": "tool", "content": out, "name": c.name, "tool_call_id": c.id} for c, out in zip(calls, turn.outputs)
        ]
        suffix = ctx.render_suffix(calls, msgs, budget)
        assert not suffix.overflow
        w.suffixes.append(suffix)
        w.ours = w.ours + completion + suffix.ids
        w.conv = w.conv + [asst] + [m.to_dict() for m in suffix.tool_messages]
        expected = template_ids(ctx, w.conv)
        w.expected.append(expected)
        w.ours_at.append(list(w.ours))
        # The suffix is always the exact tail of the template's own render.
        assert expected[len(expected) - len(suffix.ids) :] == suffix.ids
        if check:
            assert w.ours == expected, (
                f"turn {k}: ours {ctx.decode(w.ours)[-300:]!r}\n template {ctx.decode(expected)[-300:]!r}"
            )
    return w
