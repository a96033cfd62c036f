"""Per-family rules: how a template family ends turns, writes calls and reasoning.

The suffix algorithm itself is generic (diff of two renders of a synthetic conversation);
a family only says which tokens end an assistant turn (stop tokens, where the first render
is cut), how to parse calls, and which message field carries reasoning. Families the
renderer cannot support are refused here with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import UnsupportedTemplateError


@dataclass(frozen=True)
class FamilyRules:
    name: str
    stop_tokens: tuple[str, ...]  # generation stops on these; the first render is cut after the last one
    parser: str  # key of parsing.PARSERS
    reasoning_field: str | None  # message field the template reads reasoning from
    # The template renders at most this many calls per assistant message (None: any number).
    max_calls_per_turn: int | None = None
    notes: str = ""


QWEN = FamilyRules(
    name="qwen",
    stop_tokens=("<|im_end|>", "<|endoftext|>"),
    parser="hermes",
    reasoning_field="reasoning_content",
    notes="ChatML with Hermes <tool_call> JSON; parallel results are one user turn of <tool_response> blocks.",
)
LLAMA3 = FamilyRules(
    name="llama3",
    stop_tokens=("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
    parser="llama3",
    reasoning_field=None,
    max_calls_per_turn=1,
    notes=(
        "Llama 3.1's template raises on more than one call per assistant message; extra calls are "
        "answered with an error, and each tool result is its own ipython turn."
    ),
)
GPTOSS = FamilyRules(
    name="gptoss",
    # <|end|> closes a message but not the turn: the model goes on (analysis, then the call).
    stop_tokens=("<|call|>", "<|return|>"),
    parser="harmony",
    reasoning_field="thinking",
    max_calls_per_turn=1,
    notes=(
        "Harmony: one call per assistant message (<|call|> stops generation); the tool turn is "
        "<|start|>functions.NAME to=assistant..., so the synthetic call must carry the real tool name."
    ),
)


def detect_family(template: str, eos_token: str | None) -> FamilyRules:
    """The family of a chat template, or UnsupportedTemplateError with the reason."""
    if "<|observation|>" in template:
        raise UnsupportedTemplateError(
            "GLM-style template: the tool message opens with <|observation|>, which is also the token "
            "the model stops on, and the assistant turn has no end token, so 'cut the first render "
            "after its last end-of-turn token' would drop the model's own stop token from the suffix "
            "boundary. This renderer version does not support GLM templates; use a Qwen, Llama 3.1 "
            "or GPT-OSS template, or send parsed tool_calls without a tokenizer fingerprint."
        )
    if "<|channel|>" in template and "<|start|>" in template:
        return GPTOSS
    if "<|start_header_id|>" in template:
        return LLAMA3
    if "<|im_start|>" in template:
        if "<function=" in template:
            raise UnsupportedTemplateError(
                "this ChatML template writes tool calls as XML (<tool_call><function=NAME><parameter=...>, "
                "Qwen3.5/3.6 style); this renderer version parses only JSON tool calls "
                '(<tool_call>{"name": ..., "arguments": ...}</tool_call>). Use a Qwen2.5/Qwen3 template '
                "or send parsed tool_calls."
            )
        return QWEN
    if not eos_token:
        raise UnsupportedTemplateError(
            "unrecognised chat template family and tokenizer_config.json names no eos_token, so the "
            "end of an assistant turn is unknown; set eos_token to the token that ends an assistant turn"
        )
    return FamilyRules(
        name="generic",
        stop_tokens=(eos_token,),
        parser="hermes",
        reasoning_field="reasoning_content" if "reasoning_content" in template else None,
        notes="unrecognised family: eos_token ends turns, Hermes <tool_call> JSON parsing",
    )
