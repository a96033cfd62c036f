"""Session helpers for tests and benches that talk to a real server through the raw gRPC stub."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import grpc
import pytest

from tito.v1 import environment_pb2 as pb


def open_session(stub, environment: str = "python", timeout: float = 60, **kw) -> str:
    return stub.OpenSession(pb.OpenSessionRequest(environment=environment, **kw), timeout=timeout).session_id


@contextmanager
def session(stub, environment: str = "python", **kw) -> Iterator[str]:
    """An open session that is closed whatever the test does."""
    sid = open_session(stub, environment, **kw)
    try:
        yield sid
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))


def code_call(seq: int, code: str) -> pb.ToolCall:
    return pb.ToolCall(id=f"c{seq}", name="run_python", arguments=json.dumps({"code": code}))


def run(stub, sid: str, seq: int, code: str | None = None, *, arguments: str | None = None,
        name: str = "run_python", timeout: float = 60) -> pb.StepResponse:
    """One Step with one tool call (run_python with `code`, or any tool with raw `arguments`)."""
    args = arguments if arguments is not None else json.dumps({"code": code})
    call = pb.ToolCall(id=f"c{seq}", name=name, arguments=args)
    return stub.Step(pb.StepRequest(session_id=sid, seq=seq, tool_calls=[call]), timeout=timeout)


def rpc_error(fn: Callable[[], object]) -> grpc.RpcError:
    """The RpcError `fn` raises (fails the test if it raises none)."""
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


def register_qwen(stub, template: str = "qwen2_5") -> str:
    """Registers the offline Qwen tokenizer with a trl chat template; returns the fingerprint."""
    from tito_assets.qwen_tokenizer import build_tokenizer_files

    files = build_tokenizer_files(template=template)
    return stub.RegisterTokenizer(pb.RegisterTokenizerRequest(files=files), timeout=120).fingerprint


def wait_until(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
