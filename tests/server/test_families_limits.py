"""Size limits: tokenizer uploads up to max_tokenizer_bytes, every other RPC capped at max_message_bytes.

The registry's own check is driven directly; the rest goes through a real server on loopback, started
with a small max_message_bytes, and the real client.
"""

from __future__ import annotations

import json

import grpc
import pytest

from env_server.rendering import TokenizerRegistry, UploadTooLargeError
from env_server.rendering.registry import DEFAULT_MAX_UPLOAD_BYTES, _check_files
from tests.harness import start_server
from tito.client import ResourceExhaustedError, TitoClient
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


@pytest.fixture(scope="module")
def small_message_server(docker_ok, tmp_path_factory):
    """A real server whose max_message_bytes is 64 KiB; max_tokenizer_bytes stays at its default."""
    srv = start_server(tmp_path_factory.mktemp("limits"), env={"TITO_MAX_MESSAGE_BYTES": str(64 * 1024)})
    yield srv
    srv.terminate()


def _big_tokenizer_files(size: int) -> dict[str, bytes]:
    """The offline Qwen tokenizer with unused long vocabulary entries added until tokenizer.json is `size`
    bytes, compact (a 262k-vocabulary tokenizer.json of a current model family is ~30-40 MB)."""
    from tito_assets.qwen_tokenizer import build_tokenizer_files

    files = build_tokenizer_files(template="qwen2_5")
    tok = json.loads(files["tokenizer.json"])
    vocab = tok["model"]["vocab"]
    base = len(json.dumps(tok, ensure_ascii=False, separators=(",", ":")).encode())
    next_id = 1 + max(max(vocab.values()), *(t["id"] for t in tok["added_tokens"]))
    n = 0
    while base < size:
        key = f"{n:07d}" + "x" * 96
        vocab[key] = next_id + n
        base += len(f'"{key}":{next_id + n},')  # what the entry adds, compact
        n += 1
    files["tokenizer.json"] = json.dumps(tok, ensure_ascii=False, separators=(",", ":")).encode()
    return files


@pytest.mark.docker
def test_a_40mb_tokenizer_registers_and_a_200mb_upload_is_refused_naming_the_limit(small_message_server):
    files = _big_tokenizer_files(40 * MB)
    assert len(files["tokenizer.json"]) >= 40 * MB
    with TitoClient(small_message_server.address) as client:
        # Over max_message_bytes (64 KiB) many times: uploads are capped by max_tokenizer_bytes instead.
        reg = client.register_tokenizer(files)
        assert reg.template_family and reg.stop_token_ids
        session = client.open_session("python", [{"role": "user", "content": "hi"}], fingerprint=reg.fingerprint)
        assert session.prompt_ids
        session.close()

        with pytest.raises(ResourceExhaustedError) as e:
            client.register_tokenizer({"tokenizer.json": b'{"pad": "' + b"x" * (200 * MB) + b'"}'})
        assert e.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "max_tokenizer_bytes" in e.value.details and "TITO_MAX_TOKENIZER_BYTES" in e.value.details
        assert str(DEFAULT_MAX_UPLOAD_BYTES + (1 << 20)) in e.value.details  # the transport's limit, in bytes


@pytest.mark.docker
def test_other_requests_over_max_message_bytes_are_refused_naming_the_setting(small_message_server):
    stub = small_message_server.stub()
    big = pb.StepRequest(session_id="s", seq=1, completion_ids=list(range(100_000, 130_000)))
    assert big.ByteSize() > 64 * 1024
    with pytest.raises(grpc.RpcError) as e:
        stub.Step(big, timeout=30)
    assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_message_bytes of 65536" in e.value.details() and "TITO_MAX_MESSAGE_BYTES" in e.value.details()
