"""TokenizerRegistry: load uploaded tokenizer files, fingerprint them, gate on a golden check."""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Callable
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
from .errors import InvalidTokenizerFilesError, RenderingError, UnsupportedTemplateError, UploadTooLargeError
from .golden import golden_check
from .probe import decide
from .template import ChatTemplate

log = logging.getLogger(__name__)

ALLOWED_FILES = (TOKENIZER_FILE, TOKENIZER_CONFIG_FILE, CHAT_TEMPLATE_FILE, "special_tokens_map.json")
# Real tokenizer.json files reach ~40 MB compact (large vocabularies, e.g. Gemma's 262k tokens).
DEFAULT_MAX_UPLOAD_BYTES = 128 << 20


@dataclass
class TokenizerRegistry:
    """Registered tokenizers by fingerprint; an LRU bounded to ``max_entries``."""

    max_entries: int = 16
    # All uploaded files together; the server's max_tokenizer_bytes (TITO_MAX_TOKENIZER_BYTES).
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    _entries: OrderedDict[str, RenderingContext] = field(default_factory=OrderedDict, repr=False)
    # Loaded tokenizers by their files other than the chat template: registering the same model with
    # another template or other kwargs skips the slow load (seconds for a 150k vocabulary).
    _loaded: OrderedDict[str, Any] = field(default_factory=OrderedDict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def register(self, files: dict[str, bytes], chat_template_kwargs: dict | None = None) -> RenderingContext:
        """Load, check and cache; idempotent by content (same files + kwargs -> same context)."""
        kwargs = dict(chat_template_kwargs or {})
        files = _check_files(files, self.max_upload_bytes)
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
        ctx = build_context(files, kwargs, fingerprint, self._tokenizer)
        with self._lock:
            self._entries[fingerprint] = ctx
            self._entries.move_to_end(fingerprint)
            while len(self._entries) > max(1, self.max_entries):
                evicted, _ = self._entries.popitem(last=False)
                log.info("tokenizer %s evicted from the registry (LRU, max %d)", evicted[:12], self.max_entries)
        return ctx

    def _tokenizer(self, files: dict[str, bytes]) -> Any:
        digest = hashlib.sha256()
        for name in sorted(set(files) - {CHAT_TEMPLATE_FILE}):
            digest.update(name.encode() + b"\0" + len(files[name]).to_bytes(8, "big") + files[name])
        key = digest.hexdigest()
        with self._lock:
            tokenizer = self._loaded.get(key)
            if tokenizer is not None:
                self._loaded.move_to_end(key)
        if tokenizer is not None:
            # A shallow copy shares the loaded vocabulary; its own chat_template keeps
            # ctx.tokenizer.apply_chat_template rendering this upload's template.
            tokenizer = copy.copy(tokenizer)
            tokenizer.chat_template = resolve_chat_template(files)
            return tokenizer
        tokenizer = _load_tokenizer(files)
        with self._lock:
            self._loaded[key] = tokenizer
            while len(self._loaded) > max(1, self.max_entries):
                self._loaded.popitem(last=False)
        return tokenizer

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


def _check_files(files: dict[str, bytes], limit: int) -> dict[str, bytes]:
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
    out = {name: data.encode("utf-8") if isinstance(data, str) else bytes(data) for name, data in files.items()}
    total = sum(len(d) for d in out.values())
    if total > limit:
        sizes = ", ".join(f"{n} {len(d)}" for n, d in sorted(out.items()))
        raise UploadTooLargeError(
            f"the tokenizer files are {total} bytes ({sizes}), over this server's limit of {limit} bytes; "
            "raise the server setting max_tokenizer_bytes (TITO_MAX_TOKENIZER_BYTES), or upload tokenizer.json "
            "without indentation (tito.tokenizer_files does)")
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


def build_context(files: dict[str, bytes], kwargs: dict[str, Any], fingerprint: str,
                  load: Callable[[dict[str, bytes]], Any] | None = None) -> RenderingContext:
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
    tokenizer = (load or _load_tokenizer)(files)
    try:
        chat = ChatTemplate(tokenizer, template, kwargs)
    except Exception as e:
        raise UnsupportedTemplateError(f"the chat template does not compile: {type(e).__name__}: {e}") from e
    try:
        rules = decide(chat)
    except UnsupportedTemplateError:
        raise
    except Exception as e:  # the template raised on a render the probe needs
        raise UnsupportedTemplateError(
            f"registration check: the chat template raised {type(e).__name__}: {e} on a plain conversation "
            "(user, assistant, tool); tito needs a template that renders tool-calling conversations") from e
    ctx = RenderingContext(fingerprint=fingerprint, rules=rules, template=chat, renderer_version=RENDERER_VERSION)
    try:
        golden_check(ctx)
    except UnsupportedTemplateError as e:
        raise UnsupportedTemplateError(f"{rules.name} template ({rules.describe()}): {e}") from e
    except RenderingError as e:
        raise UnsupportedTemplateError(f"{rules.name} template: registration check failed: {e}") from e
    except Exception as e:  # the template raised on a plain tool conversation
        raise UnsupportedTemplateError(
            f"{rules.name} template: the chat template could not render a synthetic tool conversation: "
            f"{type(e).__name__}: {e}") from e
    for quirk in ctx.quirks:
        log.info("tokenizer %s (%s): %s", fingerprint[:12], rules.name, quirk)
    return ctx
