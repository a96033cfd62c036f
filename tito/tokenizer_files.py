"""The files a client uploads to RegisterTokenizer, in compact form, from a tokenizer object or a folder.

transformers 5 saves `tokenizer.json` indented (a Qwen-class vocabulary: ~19 MB instead of ~8 MB);
the upload re-serialises it without insignificant whitespace. The server fingerprints the bytes
it receives, so the client fingerprints the same compact bytes.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tito.fingerprint import TOKENIZER_FILE, read_tokenizer_files


def compact_json(raw: bytes) -> bytes:
    """The same JSON without insignificant whitespace (key order and non-ASCII text kept)."""
    return json.dumps(json.loads(raw), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def tokenizer_files(source: Any) -> dict[str, bytes]:
    """Upload files from a transformers tokenizer, a tokenizer folder, or a mapping of file name -> bytes."""
    if isinstance(source, Mapping):
        files = {name: bytes(data) for name, data in source.items()}
    elif isinstance(source, (str, Path)):
        files = read_tokenizer_files(source)
    elif hasattr(source, "save_pretrained"):
        with tempfile.TemporaryDirectory(prefix="tito-tokenizer-") as tmp:
            source.save_pretrained(tmp)
            files = read_tokenizer_files(tmp)
    else:
        raise TypeError(
            f"cannot read tokenizer files from a {type(source).__name__}: pass a transformers tokenizer, "
            "the path of a folder holding tokenizer.json, or a dict of file name -> bytes")
    if TOKENIZER_FILE not in files:
        raise ValueError(f"{TOKENIZER_FILE} is required")
    files[TOKENIZER_FILE] = compact_json(files[TOKENIZER_FILE])
    return files
