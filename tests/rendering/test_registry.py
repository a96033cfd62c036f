"""Registry, fingerprint and refusals."""

from __future__ import annotations

import json

import pytest

from env_server.rendering import (
    InvalidTokenizerFilesError,
    TokenizerRegistry,
    UnsupportedTemplateError,
)
from tito import fingerprint as fp
from tito.types import Message, Role, ToolCall
from tito.fingerprint import read_tokenizer_files
from tito_assets.qwen_tokenizer import build_tokenizer_dir

from .helpers import REGISTRY, ctx_for, files_for


def test_fingerprint_matches_client_side():
    for template in ["qwen2_5", "llama3_1"]:
        ctx = ctx_for(template)
        assert ctx.fingerprint == fp.compute_fingerprint(files_for(template), {})
        assert ctx.fingerprint == fp.fingerprint_dir(build_tokenizer_dir(template=template))
    ctx = ctx_for("qwen3", enable_thinking=False)
    assert ctx.fingerprint == fp.compute_fingerprint(files_for("qwen3"), {"enable_thinking": False})


def test_fingerprint_equal_for_equal_content():
    a = files_for("qwen2_5")
    b = {k: bytes(bytearray(v)) for k, v in a.items()}  # same bytes, different objects
    assert fp.compute_fingerprint(a, {"x": 1, "y": [1, 2]}) == fp.compute_fingerprint(b, {"y": [1, 2], "x": 1})


def test_fingerprint_changes_with_template_kwargs_tokenizer_and_version():
    base = files_for("qwen2_5")
    ref = fp.compute_fingerprint(base)
    assert fp.compute_fingerprint(files_for("qwen3")) != ref  # other template
    assert fp.compute_fingerprint(base, {"enable_thinking": False}) != ref  # kwargs
    assert fp.compute_fingerprint(base, renderer_version="tito-render/0") != ref
    tok = json.loads(base["tokenizer.json"])
    tok["added_tokens"][0]["id"] = 999999  # a special-token id moved
    assert fp.compute_fingerprint({**base, "tokenizer.json": json.dumps(tok).encode()}) != ref
    cfg = json.loads(base["tokenizer_config.json"])
    cfg["eos_token"] = "<|endoftext|>"
    assert fp.compute_fingerprint({**base, "tokenizer_config.json": json.dumps(cfg).encode()}) != ref
    # chat_template.jinja wins over tokenizer_config's template; moving it there keeps the fingerprint.
    moved = dict(base)
    cfg2 = json.loads(base["tokenizer_config.json"])
    cfg2["chat_template"] = moved.pop("chat_template.jinja").decode()
    moved["tokenizer_config.json"] = json.dumps(cfg2).encode()
    assert fp.resolve_chat_template(moved) == fp.resolve_chat_template(base)


def test_register_is_idempotent_and_cached():
    reg = TokenizerRegistry(max_entries=2)
    a = reg.register(files_for("qwen2_5"), {})
    b = reg.register(dict(files_for("qwen2_5")), {})
    assert a is b and len(reg) == 1
    assert reg.get(a.fingerprint) is a
    assert reg.get("0" * 64) is None
    assert a.family == "qwen" and a.stop_token_ids == [151645] and a.renderer_version == fp.RENDERER_VERSION


def test_registry_is_lru_bounded():
    reg = TokenizerRegistry(max_entries=2)
    a = reg.register(files_for("qwen2_5"), {})
    b = reg.register(files_for("qwen2_5"), {"k": 1})
    reg.get(a.fingerprint)  # a is now most recent
    c = reg.register(files_for("qwen2_5"), {"k": 2})
    assert a.fingerprint in reg and c.fingerprint in reg and b.fingerprint not in reg


def test_families_and_stop_tokens():
    assert ctx_for("llama3_1").family == "llama3"
    tok = ctx_for("gptoss").tokenizer
    assert tok.convert_ids_to_tokens(ctx_for("gptoss").stop_token_ids) == ["<|call|>", "<|return|>"]
    glm = ctx_for("glm4moe")
    assert glm.tokenizer.convert_ids_to_tokens(glm.stop_token_ids) == ["<|observation|>", "<|user|>", "<|endoftext|>"]
    assert glm.rules.overlap and glm.rules.boundary == "<|observation|>"


@pytest.mark.parametrize(
    "template, reason",
    [
        ("qwen2_5_vl", "step 'message shape'"),  # no tool-call support in the template
        ("phi3", "step 'message shape'"),  # drops tool messages
    ],
)
def test_unsupported_templates_refused_with_reason(template, reason):
    with pytest.raises(UnsupportedTemplateError, match=reason):
        REGISTRY.register(read_tokenizer_files(build_tokenizer_dir(template=template)), {})


def _numbered_results_template() -> dict[str, bytes]:
    """qwen2_5 numbering each tool result by its place in the conversation: every round renders differently."""
    files = dict(files_for("qwen2_5"))
    text = files["chat_template.jinja"].decode()
    numbered = text.replace("'\\n<tool_response>\\n'", "'\\n<tool_response>\\n' ~ loop.index ~ ' '")
    assert numbered != text
    files["chat_template.jinja"] = numbered.encode()
    return files


def test_a_template_whose_rounds_keep_changing_is_refused_and_deepseeks_two_shapes_are_not():
    with pytest.raises(UnsupportedTemplateError, match=r"round 3\): the template keeps state across rounds"):
        REGISTRY.register(_numbered_results_template(), {})
    # DeepSeek V3 opens the tool outputs only in the first round: two shapes, both checked over three rounds.
    deepseek = REGISTRY.register(files_for("deepseekv3"), {})
    assert deepseek.rounds_differ and not ctx_for("qwen2_5").rounds_differ
    call = [ToolCall("c", "run_python", "{}")]
    first = deepseek.decode(deepseek.render_suffix(call, [Message(Role.TOOL, "7")], None).ids)
    later = deepseek.decode(deepseek.render_suffix(call, [Message(Role.TOOL, "7")], None, later_round=True).ids)
    assert first.startswith("<｜tool▁outputs▁begin｜>") and later.startswith("<｜tool▁output▁begin｜>7")


def test_no_chat_template_refused():
    files = {k: v for k, v in files_for("qwen2_5").items() if k != "chat_template.jinja"}
    with pytest.raises(UnsupportedTemplateError, match="no chat template"):
        REGISTRY.register(files, {})


def test_invalid_files():
    with pytest.raises(InvalidTokenizerFilesError, match="tokenizer.json is required"):
        REGISTRY.register({"tokenizer_config.json": b"{}"}, {})
    with pytest.raises(InvalidTokenizerFilesError, match="not valid JSON"):
        REGISTRY.register({"tokenizer.json": b"not json", "chat_template.jinja": b"x"}, {})
    with pytest.raises(InvalidTokenizerFilesError, match="could not load"):
        REGISTRY.register({"tokenizer.json": b'{"version": "1.0"}', "chat_template.jinja": b"x"}, {})
    with pytest.raises(InvalidTokenizerFilesError, match="unexpected tokenizer file"):
        REGISTRY.register({**files_for("qwen2_5"), "vocab.txt": b"a"}, {})


def test_out_of_vocab_completion_ids_raise_value_error():
    with pytest.raises(ValueError, match="outside this tokenizer's vocabulary"):
        ctx_for("qwen2_5").parse_completion([1, 10**9])
