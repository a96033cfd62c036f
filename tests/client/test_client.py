"""tito.client against a real server: typed results, typed errors, compact uploads, sessions that close."""

from __future__ import annotations

import asyncio
import json

import pytest

from tito.client import (AsyncTitoClient, FailedPreconditionError, InvalidArgumentError, NotFoundError, StepStatus,
                         TitoClient)
from tito.fingerprint import RENDERER_VERSION, compute_fingerprint
from tito.tokenizer_files import tokenizer_files
from tito.types import StepRequest, ToolCall

pytestmark = pytest.mark.docker

QUESTION = [{"role": "user", "content": "What is 6 * 7?"}]


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import AutoTokenizer

    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    return AutoTokenizer.from_pretrained(build_tokenizer_dir(template="qwen2_5"))


@pytest.fixture(scope="module")
def client(server):
    with TitoClient(server.address) as c:
        c.wait_ready()
        yield c


@pytest.fixture(scope="module")
def registration(client, hf_tokenizer):
    return client.register_tokenizer(hf_tokenizer)


def encode(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_upload_is_compact_and_fingerprinted_like_the_server(hf_tokenizer, registration, tmp_path):
    hf_tokenizer.save_pretrained(tmp_path)
    indented = (tmp_path / "tokenizer.json").read_bytes()
    files = tokenizer_files(hf_tokenizer)
    assert len(files["tokenizer.json"]) < 0.6 * len(indented)
    assert json.loads(files["tokenizer.json"]) == json.loads(indented)
    assert registration.fingerprint == compute_fingerprint(files, {}, RENDERER_VERSION)
    assert registration.template_family and registration.stop_token_ids


def test_a_whole_episode_in_typed_results(client, registration, hf_tokenizer):
    tok = hf_tokenizer
    with client.open_session("python", QUESTION, fingerprint=registration.fingerprint,
                             env_args={"expected_answer": "42"}) as session:
        assert session.prompt_ids and [t.name for t in session.tools] == ["run_python"]
        call = encode(tok, '<tool_call>\n{"name": "run_python", "arguments": {"code": "6 * 7"}}\n</tool_call><|im_end|>')
        r = session.step(call, max_suffix_tokens=500)
        assert r.status is StepStatus.OK and not r.done and r.seq == 1
        assert r.tool_calls == (ToolCall("call_1_0", "run_python", '{"code": "6 * 7"}'),)
        assert r.tool_messages[0].content == "Out: 42" and r.tool_messages[0].tool_call_id == "call_1_0"
        assert 0 < len(r.suffix_ids) <= 500 and tok.decode(r.suffix_ids).endswith("<|im_start|>assistant\n")
        end = session.step(encode(tok, "The answer is 42.<|im_end|>"))
        assert end.status is StepStatus.EPISODE_END and end.done and end.reward == 1.0 and end.suffix_ids == ()
    assert session.aio.closed and not client.close_session(session.id)


def test_errors_are_typed_by_status(client, registration):
    with pytest.raises(NotFoundError) as e:
        client.open_session("no-such-env")
    assert "python" in e.value.details and e.value.code.name == "NOT_FOUND"
    with pytest.raises(InvalidArgumentError):
        client.open_session("python", [{"role": "user", "content": "hi"}], env_args={"bogus": 1})
    with client.open_session("python") as session:
        with pytest.raises(FailedPreconditionError) as e:
            client.step(StepRequest(session.id, 5, tool_calls=(ToolCall("c", "run_python", '{"code": "1"}'),)))
        assert "expects seq 1" in e.value.details
        assert session.step(tool_calls=[ToolCall("c", "run_python", '{"code": "1"}')]).seq == 1
    with pytest.raises(NotFoundError):
        client.step(StepRequest(session.id, 2, tool_calls=(ToolCall("c", "run_python", '{"code": "1"}'),)))


def test_a_failed_step_does_not_advance_the_seq(client, registration, hf_tokenizer):
    with client.open_session("python", QUESTION, fingerprint=registration.fingerprint) as session:
        unfinished = encode(hf_tokenizer, '<tool_call>\n{"name": "run_python", "arguments": {"code": "1"}}')
        with pytest.raises(InvalidArgumentError):
            session.step(unfinished)
        assert session.seq == 0
        assert session.step(unfinished + encode(hf_tokenizer, "\n</tool_call><|im_end|>")).status is StepStatus.OK


def test_async_client_steps_sessions_concurrently(server):
    async def main() -> list[str]:
        async with AsyncTitoClient(server.address) as client:
            sessions = await asyncio.gather(*(client.open_session("python") for _ in range(4)))
            try:
                results = await asyncio.gather(*(
                    s.step(tool_calls=[ToolCall("", "run_python", f'{{"code": "{i} * 10"}}')])
                    for i, s in enumerate(sessions)))
            finally:
                await asyncio.gather(*(s.close() for s in sessions))
            return [r.tool_messages[0].content for r in results]

    assert asyncio.run(main()) == [f"Out: {i * 10}" for i in range(4)]
