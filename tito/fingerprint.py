"""Tokenizer fingerprint, computed the same way by the trainer and the env server.

Stdlib only on purpose: the trainer must be able to compute the fingerprint of the
files it uploads without importing the server (or transformers) and compare it with
what ``RegisterTokenizer`` answers. If the two differ, the server would render with
something other than what the trainer generates with, so the trainer should stop.

The fingerprint is sha256 over, in this order, each part length-prefixed so that no
two different inputs can produce the same byte stream:

1. ``tokenizer.json``, byte for byte;
2. the chat template text the renderer will use (``chat_template.jinja`` wins over
   ``tokenizer_config.json``'s ``chat_template``, as in transformers);
3. canonical JSON of the chat-template kwargs (sorted keys, no spaces, UTF-8);
4. the special tokens: ``[id, content]`` of every ``added_tokens`` entry with
   ``special: true`` in tokenizer.json, plus the named special tokens
   (bos/eos/pad/unk) of tokenizer_config.json, as canonical JSON;
5. the renderer version.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Bump whenever the server's rendering of prompt or suffix ids can change for the same
# files: a trainer holding ids from an older renderer must not be mixed with newer ones.
RENDERER_VERSION = "tito-render/5"

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

_NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no insignificant whitespace (non-ASCII kept as is)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _as_bytes(value: bytes | str) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _load_json(files: Mapping[str, bytes | str], name: str) -> dict:
    raw = files.get(name)
    if raw is None:
        return {}
    data = json.loads(_as_bytes(raw).decode("utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{name} must hold a JSON object, got {type(data).__name__}")
    return data


def _token_content(value: Any) -> str | None:
    # tokenizer_config stores special tokens either as strings or as AddedToken dicts.
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def resolve_chat_template(files: Mapping[str, bytes | str]) -> str | None:
    """The chat template transformers would use for these files, or None if there is none.

    ``chat_template.jinja`` wins over ``tokenizer_config.json``. A config holding a list of
    named templates gives its ``tool_use`` template if there is one (tools are always passed
    here), else ``default``.
    """
    if CHAT_TEMPLATE_FILE in files:
        return _as_bytes(files[CHAT_TEMPLATE_FILE]).decode("utf-8")
    template = _load_json(files, TOKENIZER_CONFIG_FILE).get("chat_template")
    if isinstance(template, str):
        return template
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        for name in ("tool_use", "default"):
            if isinstance(named.get(name), str):
                return named[name]
    return None


def special_tokens(files: Mapping[str, bytes | str]) -> dict[str, Any]:
    """Special-token ids from tokenizer.json's ``added_tokens`` and the named tokens of the config."""
    tokenizer = _load_json(files, TOKENIZER_FILE)
    added = sorted(
        [int(t["id"]), str(t["content"])]
        for t in tokenizer.get("added_tokens", [])
        if isinstance(t, dict) and t.get("special")
    )
    config = _load_json(files, TOKENIZER_CONFIG_FILE)
    named = {key: _token_content(config.get(key)) for key in _NAMED_SPECIAL_TOKENS}
    return {"added": added, "named": named}


def compute_fingerprint(
    files: Mapping[str, bytes | str],
    chat_template_kwargs: Mapping[str, Any] | None = None,
    renderer_version: str = RENDERER_VERSION,
) -> str:
    """sha256 (hex) of a tokenizer upload; see the module docstring for what it covers."""
    if TOKENIZER_FILE not in files:
        raise ValueError(f"{TOKENIZER_FILE} is required to fingerprint a tokenizer")
    parts = [
        _as_bytes(files[TOKENIZER_FILE]),
        (resolve_chat_template(files) or "").encode("utf-8"),
        canonical_json(dict(chat_template_kwargs or {})).encode("utf-8"),
        canonical_json(special_tokens(files)).encode("utf-8"),
        renderer_version.encode("utf-8"),
    ]
    digest = hashlib.sha256(b"tito-fingerprint/1\0")
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def read_tokenizer_files(directory: str | Path) -> dict[str, bytes]:
    """The files a client uploads to RegisterTokenizer, read from a tokenizer directory."""
    directory = Path(directory)
    files = {}
    for name in (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE):
        path = directory / name
        if path.is_file():
            files[name] = path.read_bytes()
    if TOKENIZER_FILE not in files:
        raise FileNotFoundError(f"no {TOKENIZER_FILE} in {directory}")
    return files


def fingerprint_dir(
    directory: str | Path,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    renderer_version: str = RENDERER_VERSION,
) -> str:
    """``compute_fingerprint`` of the files in a tokenizer directory."""
    return compute_fingerprint(read_tokenizer_files(directory), chat_template_kwargs, renderer_version)
