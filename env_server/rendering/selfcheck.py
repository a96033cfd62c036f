"""A start-up self-check of the renderer, so health turns SERVING only once rendering works.

It registers a tiny tokenizer made in memory (byte-level BPE with no merges: every byte is one
token, plus the ChatML control tokens) with a ChatML tool template, through the same path a
client's RegisterTokenizer takes: transformers loading, family detection, the golden check.
Nothing is read from disk or a hub.
"""

from __future__ import annotations

import json

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from .registry import TokenizerRegistry

_CHATML_TOOLS_TEMPLATE = (
    "{%- for m in messages %}"
    "{%- if m.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' + (m.content or '') }}"
    "{%- for c in (m.tool_calls or []) %}"
    "{%- set f = c.function if c.function is defined else c %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' + f.name + '\", \"arguments\": ' + (f.arguments | tojson) + '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def _byte_level_files() -> dict[str, bytes]:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    tok.add_tokens(["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"])
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "chat_template": _CHATML_TOOLS_TEMPLATE,
    }
    return {"tokenizer.json": tok.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode()}


def renderer_self_check() -> str:
    """Runs the check; returns the fingerprint of the check tokenizer, raises if rendering is broken."""
    ctx = TokenizerRegistry(max_entries=1).register(_byte_level_files(), {})
    return ctx.fingerprint
