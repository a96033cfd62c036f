"""Outputs as models write them, through a real server: RegisterTokenizer, OpenSession, Step in a sandbox.

For families whose calls carry markup a value can hold, and whose call ids the model writes (Kimi K2 in every
template version, llama.cpp's two that need list.append among them): code whose
text holds the family's own writing of a call runs once (the sandbox prints its length), a second turn
with prose and two calls runs both in order, each tool message answers the call id the model wrote,
and the ids stay the template's own render, round after round.
"""

from __future__ import annotations

import json
import re

import pytest

from env_server.rendering import messages as msgs
from tests.server.test_families_server import _expected, _open
from tito import wire
from tito.v1 import environment_pb2 as pb

pytestmark = pytest.mark.docker


def _written(ctx, conv, tools, calls, content="", calls_before=0):
    style = ctx.rules.style
    ids = [style.call_id(len(conv), i, n, calls_before) if style.ids == "kimi" else f"c{len(conv):04d}x{i:03d}"[:9]
           for i, (n, _) in enumerate(calls)]
    turn = msgs.assistant(style, [(i, n, a) for i, (n, a) in zip(ids, calls)],
                          "Let me compute." if style.reasoning_field else None, content)
    return turn, ctx.completion_text(conv, turn, tools)


# Every Kimi K2 version, and one family per other way a call's markup or id is written (the corpus tests
# tests/rendering/test_corpus.py read markup in code for every family without a server).
@pytest.mark.parametrize("template", ["kimi_k2", "kimi_k2_ids", "kimi_k2_instruct", "kimi_k2_thinking",
                                      "mistral_small_3_2", "llama4_json", "qwen3_6"])
def test_markup_in_code_runs_once_and_results_answer_the_written_ids(stub, template):
    ctx, conv, opened, tools = _open(stub, template)
    sid = opened.session_id
    try:
        _, markup = _written(ctx, conv, tools, [("run_python", {"code": "print(6 * 7)"})])
        code = f"doc = {markup!r}\nprint(len(doc))"
        turns = [[("run_python", {"code": code})],
                 [("run_python", {"code": "print(1)"}), ("run_python", {"code": "print(2)"})]]
        calls_before = 0
        for seq, calls in enumerate(turns, start=1):
            turn, text = _written(ctx, conv, tools, calls, "Running it." if seq == 2 else "", calls_before)
            completion = ctx.encode(text)
            r = stub.Step(pb.StepRequest(session_id=sid, seq=seq, completion_ids=completion), timeout=120)
            assert r.status == pb.STEP_STATUS_OK, r.detail
            assert [(c.name, json.loads(c.arguments)) for c in r.tool_calls] == calls  # no phantom call, in order
            assert [m.tool_call_id for m in r.tool_messages] == [c.id for c in r.tool_calls]
            ids = [c.id for c in r.tool_calls]
            if ctx.rules.wire == "mistral":  # the ids the model wrote ([CALL_ID]), answered in the tool turn
                assert ids == [t["id"] for t in turn["tool_calls"]]
                assert all(i in ctx.decode(list(r.suffix_ids)) for i in ids)
            if ctx.rules.wire == "kimi":  # functions.NAME:IDX as the template writes it (per turn or per conversation)
                heads = re.findall(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>", text)
                assert ids == heads[:len(ids)]  # (the code of round 1 holds a call's markup too)
                assert all(re.fullmatch(r"functions\.run_python:\d+", i) for i in ids), ids
            calls_before += len(calls)
            outputs = [m.content.strip() for m in r.tool_messages]
            assert outputs == ([str(len(markup))] if seq == 1 else ["1", "2"]), outputs
            # The call turn as the tool results answer it, for the template's own render of the conversation.
            answered = dict(turn, tool_calls=[dict(t, id=c.id) for t, c in zip(turn["tool_calls"], r.tool_calls)])
            conv = conv + [answered] + [wire.message_from_pb(m).to_dict() for m in r.tool_messages]
            expected = _expected(ctx, conv, tools)
            assert expected[len(expected) - len(r.suffix_ids):] == list(r.suffix_ids), f"round {seq}"
    finally:
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
