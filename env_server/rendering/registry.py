"""TokenizerRegistry: load uploaded tokenizer files, fingerprint them, gate on a golden check."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tito.fingerprint import (
    CHAT_TEMPLATE_FILE,
    RENDERER_VERSION,
    TOKENIZER_CONFIG_FILE,
    TOKENIZER_FILE,
    compute_fingerprint,
    resolve_chat_template,
)

from .context import RenderingContext
from .errors import InvalidTokenizerFilesError, RenderingError, UnsupportedTemplateError
from .families import detect_family
from .golden import golden_check

log = logging.getLogger(__name__)

ALLOWED_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE, "special_tokens_map.json")
MAX_FILE_BYTES = 64 << 20


@dataclass
class TokenizerRegistry:
    """Registered tokenizers by fingerprint; an LRU bounded to ``max_entries``."""

    max_entries: int = 16
    _entries: OrderedDict[str, RenderingContext] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def register(self, files: dict[str, bytes], chat_template_kwargs: dict | None = None) -> RenderingContext:
        """Load, check and cache; idempotent by content (same files + kwargs -> same context)."""
        kwargs = dict(chat_template_kwargs or {})
        files = _check_files(files)
        try:
            fingerprint = compute_fingerprint(files, kwargs, RENDERER_VERSION)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidTokenizerFilesError(f"the tokenizer files are not valid JSON/UTF-8: {e}") from e
        except RecursionError:
            raise InvalidTokenizerFilesError("a tokenizer file holds JSON nested too deeply to parse") from None
        with self._lock:
            ctx = self._entries.get(fingerprint)
            if ctx is not None:
                self._entries.move_to_end(fingerprint)
                return ctx
        ctx = build_context(files, kwargs, fingerprint)
        with self._lock:
            self._entries[fingerprint] = ctx
            self._entries.move_to_end(fingerprint)
            while len(self._entries) > max(1, self.max_entries):
                evicted, _ = self._entries.popitem(last=False)
                log.info("tokenizer %s evicted from the registry (LRU, max %d)", evicted[:12], self.max_entries)
        return ctx

    def get(self, fingerprint: str) -> RenderingContext | None:
        with self._lock:
            ctx = self._entries.get(fingerprint)
            if ctx is not None:
                self._entries.move_to_end(fingerprint)
            return ctx

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, fingerprint: str) -> bool:
        return fingerprint in self._entries


def _check_files(files: dict[str, bytes]) -> dict[str, bytes]:
    if not isinstance(files, dict) or TOKENIZER_FILE not in files:
        raise InvalidTokenizerFilesError(
            f"{TOKENIZER_FILE} is required (got: {', '.join(sorted(files)) or 'no files'}); upload the "
            f"model's {TOKENIZER_FILE}, {TOKENIZER_CONFIG_FILE} and, if it has one, {CHAT_TEMPLATE_FILE}"
        )
    unknown = sorted(set(files) - set(ALLOWED_FILES))
    if unknown:
        raise InvalidTokenizerFilesError(
            f"unexpected tokenizer file(s) {unknown}; allowed: {', '.join(ALLOWED_FILES)} "
            "(only a fast tokenizer.json is supported, no slow-tokenizer vocab files)"
        )
    out = {}
    for name, data in files.items():
        data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if len(data) > MAX_FILE_BYTES:
            raise InvalidTokenizerFilesError(f"{name} is {len(data)} bytes, over the {MAX_FILE_BYTES} byte limit")
        out[name] = data
    return out


def _load_tokenizer(files: dict[str, bytes]):
    """Load with transformers from the uploaded files only: a private temp dir, local_files_only."""
    from transformers import PreTrainedTokenizerFast

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="tito-tok-") as tmp:
        for name, data in files.items():
            (Path(tmp) / name).write_bytes(data)
        try:
            return PreTrainedTokenizerFast.from_pretrained(tmp, local_files_only=True)
        except Exception as e:  # tokenizers raises plain Exceptions on bad JSON
            raise InvalidTokenizerFilesError(
                f"transformers could not load the uploaded tokenizer: {type(e).__name__}: {e}; "
                f"upload the {TOKENIZER_FILE} and {TOKENIZER_CONFIG_FILE} saved by save_pretrained()"
            ) from e


def build_context(files: dict[str, bytes], kwargs: dict[str, Any], fingerprint: str) -> RenderingContext:
    try:
        template = resolve_chat_template(files)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidTokenizerFilesError(f"{TOKENIZER_CONFIG_FILE} is not valid JSON: {e}") from e
    if not template:
        raise UnsupportedTemplateError(
            f"no chat template: neither {CHAT_TEMPLATE_FILE} nor a chat_template in {TOKENIZER_CONFIG_FILE}; "
            "upload the model's chat template (tokenizer.save_pretrained writes chat_template.jinja)"
        )
    try:
        json.dumps(kwargs)
    except TypeError as e:
        raise InvalidTokenizerFilesError(f"chat_template_kwargs must be JSON: {e}") from e
    tokenizer = _load_tokenizer(files)
    rules = detect_family(template, tokenizer.eos_token)
    stop_ids = []
    for token in rules.stop_tokens:
        token_id = tokenizer.convert_tokens_to_ids(token)
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id is not None:
            if tokenizer.convert_ids_to_tokens(token_id) == token:
                stop_ids.append(token_id)
    if not stop_ids:
        raise UnsupportedTemplateError(
            f"the {rules.name} template ends assistant turns with {' or '.join(rules.stop_tokens)}, but the "
            "tokenizer has none of these as a token; upload the tokenizer that belongs to this template"
        )
    try:
        ctx = RenderingContext(
            fingerprint=fingerprint,
            family=rules.name,
            stop_token_ids=stop_ids,
            renderer_version=RENDERER_VERSION,
            chat_template=template,
            chat_template_kwargs=kwargs,
            rules=rules,
            tokenizer=tokenizer,
        )
    except Exception as e:
        raise UnsupportedTemplateError(f"the chat template does not compile: {type(e).__name__}: {e}") from e
    try:
        golden_check(ctx)
    except UnsupportedTemplateError:
        raise
    except RenderingError as e:
        raise UnsupportedTemplateError(f"golden check failed: {e}") from e
    except Exception as e:  # the template raised on a plain tool conversation
        raise UnsupportedTemplateError(
            f"the chat template could not render a synthetic tool conversation: {type(e).__name__}: {e}"
        ) from e
    for quirk in ctx.quirks:
        log.info("tokenizer %s (%s): %s", fingerprint[:12], rules.name, quirk)
    return ctx
