"""The control tokens each trl chat template needs as single tokens, on top of the Qwen vocabulary.

A template's markers (``<|observation|>``, ``<｜tool▁calls▁begin｜>``, ``<|tool_call>``, ...) are
single special tokens in the real model's tokenizer; the offline Qwen tokenizer gets them as
added special tokens so the template renders to the same token structure (the ids differ from
the real model's, the text does not). They are found by scanning the template for marker-shaped
strings (``<|x|>``, ``<|x>``, ``<x|>``, ``<｜x｜>``), plus the ones a scan cannot tell from text
(GLM's ``<arg_key>``, Gemma's ``<start_of_turn>``, Mistral's ``[TOOL_CALLS]``, Seed's ``<seed:eos>``,
MiniMax's ``]~b]``), plus each family's bos/eos as the real tokenizer_config names them (as far as
known offline).
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class TemplateTokens:
    """Extra special tokens a template needs after the Qwen ones, and the named tokens."""

    extra: tuple[str, ...] = ()
    bos_token: str | None = None
    eos_token: str = "<|im_end|>"
    pad_token: str = "<|endoftext|>"


QWEN = TemplateTokens()
_LLAMA3 = TemplateTokens(
    extra=("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
           "<|eom_id|>", "<|python_tag|>"),
    bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|end_of_text|>",
)
# Fixed lists (their ids are stable across trl versions); the other templates are scanned.
FIXED: dict[str, TemplateTokens] = {
    "llama3": _LLAMA3,
    "llama3_1": _LLAMA3,
    "llama3_2": _LLAMA3,
    "llama3_2_pythonic": _LLAMA3,
    "toolace": _LLAMA3,
    "gptoss": TemplateTokens(
        extra=("<|startoftext|>", "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>",
               "<|constrain|>"),  # the model writes <|constrain|>, the template does not
        bos_token="<|startoftext|>", eos_token="<|return|>",
    ),
    "glm4moe": TemplateTokens(
        extra=("[gMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>", "<|assistant|>", "<|observation|>",
               "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
        eos_token="<|endoftext|>",
    ),
}

_MISTRAL = ("[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_CALLS]", "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[CALL_ID]", "[ARGS]", "[TOOL_CONTENT]", "[THINK]",
            "[/THINK]", "[IMG]")
_NEMOTRON_JSON = ("<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<TOOLCALL>", "</TOOLCALL>", "<TOOL_RESPONSE>",
                  "</TOOL_RESPONSE>", "<AVAILABLE_TOOLS>", "</AVAILABLE_TOOLS>")

# (template name prefix, bos, eos, tokens a scan cannot find); the first matching prefix wins.
_FAMILIES = (
    ("kimi", "[BOS]", "[EOS]", ()),
    ("minimax_m1", "<begin_of_document>", "<end_of_sentence>", ("<beginning_of_sentence>",)),
    ("minimax_m2", "]~!b[", "[e~[", ("]~b]", "<minimax:tool_call>", "</minimax:tool_call>")),
    ("seed_oss", "<seed:bos>", "<seed:eos>", ("<seed:pad>", "<seed:tool_call>", "</seed:tool_call>", "<seed:think>",
                                              "</seed:think>", "<seed:cot_budget_reflect>",
                                              "</seed:cot_budget_reflect>")),
    ("mistral", "<s>", "</s>", _MISTRAL),
    ("ministral", "<s>", "</s>", _MISTRAL),
    ("devstral", "<s>", "</s>", _MISTRAL),
    ("llama4", "<|begin_of_text|>", "<|eot|>", ("<|eom|>", "<|python_start|>", "<|python_end|>")),
    ("nemotron_json", None, "<SPECIAL_12>", _NEMOTRON_JSON),
    ("nemotron_nano_v2", None, "<SPECIAL_12>", _NEMOTRON_JSON),
    ("granite", None, "<|end_of_text|>", ()),
    ("internlm2", "<s>", "</s>", ()),
    ("phi4", None, "<|end|>", ("<|tool|>", "<|endoftext|>")),
    ("hermes_2_pro", "<|begin_of_text|>", "<|im_end|>", ()),
    ("apertus", "<s>", "<|assistant_end|>", ()),
    ("deepseek", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", ()),
    ("gemma4", "<bos>", "<turn|>", ("<eos>",)),
    ("diffusion_gemma", "<bos>", "<turn|>", ("<eos>",)),
    ("gemma", "<bos>", "<eos>", ("<start_of_turn>", "<end_of_turn>")),
    ("lfm2", "<|startoftext|>", "<|im_end|>", ()),
    ("muse", None, "<|eot|>", ()),
    ("cohere", "<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>", ()),
    ("phi3", "<s>", "<|endoftext|>", ()),
    ("llava_next", "<s>", "</s>", ("[INST]", "[/INST]")),
    ("idefics3", "<|begin_of_text|>", "<end_of_utterance>", ("<end_of_utterance>",)),
)

_MARKERS = (
    re.compile(r"<\|[^|<>\s'\"]{1,40}\|>"),  # <|im_end|>
    re.compile(r"<\|\"\|>"),  # Gemma 4's string delimiter <|"|>
    re.compile(r"<\|[A-Za-z_]{1,30}>"),  # <|tool_call>
    re.compile(r"<[A-Za-z_]{1,30}\|>"),  # <tool_call|>
    re.compile(r"<｜[^｜]{1,40}｜>"),  # DeepSeek's full-width bars
)


def template_tokens(template: str, template_text: str, qwen_tokens: set[str]) -> TemplateTokens:
    """The tokens for trl template ``template`` (text ``template_text``) beyond ``qwen_tokens``."""
    if template in FIXED:
        return FIXED[template]
    family = next((f for f in _FAMILIES if template.startswith(f[0])), None)
    found: dict[str, None] = {}
    for rx in _MARKERS:
        for m in rx.finditer(template_text):
            found[m.group(0)] = None
    bos, eos, more = (family[1], family[2], family[3]) if family else (None, "<|im_end|>", ())
    for token in (*more, bos, eos):
        if token:
            found[token] = None
    extra = tuple(t for t in found if t not in qwen_tokens)
    if not extra and family is None:
        return QWEN  # ChatML: the Qwen tokens are all it writes
    return TemplateTokens(extra=extra, bos_token=bos, eos_token=eos)
