"""Size limits: tokenizer uploads up to max_tokenizer_bytes, every other RPC capped at max_message_bytes.

No Docker needed: the registry and the servicer are driven directly (the transport's receive limit
is the server's, set in server.py from both settings).
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest

from env_server.errors import ErrorKind
from env_server.rendering import TokenizerRegistry, UploadTooLargeError
from env_server.rendering.registry import DEFAULT_MAX_UPLOAD_BYTES, _check_files
from env_server.service import EnvironmentService
from tito.v1 import environment_pb2 as pb

MB = 1000 * 1000


def test_default_upload_limit_takes_real_tokenizers_and_names_the_setting():
    assert DEFAULT_MAX_UPLOAD_BYTES >= 128 << 20
    # A 40 MB tokenizer.json (a 262k vocabulary, compact) passes the size check.
    files = _check_files({"tokenizer.json": b" " * (40 * MB), "tokenizer_config.json": b"{}"}, DEFAULT_MAX_UPLOAD_BYTES)
    assert len(files["tokenizer.json"]) == 40 * MB
    assert 200 * MB > DEFAULT_MAX_UPLOAD_BYTES  # a 200 MB upload is refused (checked below with a small limit)
    with pytest.raises(UploadTooLargeError) as e:
        _check_files({"tokenizer.json": b" " * 2000}, 1000)
    msg = str(e.value)
    assert "limit of 1000 bytes" in msg and "max_tokenizer_bytes" in msg and "TITO_MAX_TOKENIZER_BYTES" in msg


def test_upload_limit_is_configurable():
    with pytest.raises(UploadTooLargeError, match="limit of 1000 bytes"):
        TokenizerRegistry(max_upload_bytes=1000).register({"tokenizer.json": b"{}" * 600})


class _Aborted(Exception):
    pass


class _Context:
    async def abort(self, code, details):
        self.code, self.details = code, details
        raise _Aborted


class _Metrics:
    class errors:  # noqa: N801 - mimics prometheus' labels(...).inc()
        @staticmethod
        def labels(*_):
            return type("C", (), {"inc": staticmethod(lambda: None)})


class _Engine:
    metrics = _Metrics()

    def list_environments(self):
        return []

    async def register_tokenizer(self, files, kwargs_json):
        from env_server.errors import RequestError

        raise RequestError(ErrorKind.FAILED_PRECONDITION, f"reached the engine with {sum(map(len, files.values()))}")

    async def step(self, session_id, turn):
        raise AssertionError("an oversized Step must not reach the engine")


def _call(service, rpc, request):
    ctx = _Context()
    with pytest.raises(_Aborted):
        asyncio.run(getattr(service, rpc)(request, ctx))
    return ctx


def test_requests_over_max_message_bytes_are_refused_except_uploads():
    service = EnvironmentService(_Engine(), max_message_bytes=4096)
    big = pb.StepRequest(session_id="s", seq=1, completion_ids=list(range(100_000, 102_000)))
    ctx = _call(service, "Step", big)
    assert ctx.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_message_bytes of 4096" in ctx.details and "TITO_MAX_MESSAGE_BYTES" in ctx.details
    # RegisterTokenizer is not capped by max_message_bytes: it reaches the engine (the registry caps it).
    upload = pb.RegisterTokenizerRequest(files={"tokenizer.json": json.dumps({"x": "y" * 10_000}).encode()})
    ctx = _call(service, "RegisterTokenizer", upload)
    assert ctx.code == grpc.StatusCode.FAILED_PRECONDITION and "reached the engine" in ctx.details
