"""The host<->REPL protocol module: what the REPL may send is parsed or refused, never trusted."""

from __future__ import annotations

import pytest

from env_server.sandbox.runtime import repl_protocol as protocol
from env_server.sandbox.sandbox import Sandbox


def test_messages_round_trip_through_one_line():
    request = protocol.ExecRequest(code="print(1)", timeout=2.5, cap=10, value_cap=20, id=7)
    line = protocol.encode(request)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert protocol.parse_request(protocol.decode(line)) == request
    assert protocol.parse_request(protocol.decode(protocol.encode(protocol.Ping(id=3)))) == protocol.Ping(id=3)
    reply = protocol.ExecReply(id=7, stdout="1\n", value_truncated=True, duration_ms=1.0)
    assert protocol.parse_reply(protocol.decode(protocol.encode(reply))) == reply
    ready = protocol.Ready(pid=2, python="3.11.2", channel=protocol.CHANNEL_SOCKET)
    assert protocol.parse_ready(protocol.decode(protocol.encode(ready))) == ready


@pytest.mark.parametrize("line", [b"[1, 2]", b"not json", b'"text"'])
def test_a_line_that_is_not_an_object_is_refused(line):
    with pytest.raises(ValueError):
        protocol.decode(line)


@pytest.mark.parametrize("message", [
    {"type": "surprise", "id": 1},
    {"type": "result", "id": 1, "stdout": 5},
    {"type": "result", "id": 1, "stdout_dropped": True},
    {"type": "result", "id": "1"},
    {"type": "error", "id": 1},
])
def test_malformed_replies_become_a_failure_not_an_exception(message):
    with pytest.raises(ValueError):
        protocol.parse_reply(message)
    result = Sandbox._to_result(message, interrupted=False, duration_ms=1.0)  # noqa: SLF001
    assert result.error and result.error.startswith("sandbox error") and not result.lost


def test_file_operations_round_trip_and_their_containers_are_typed():
    for request in (protocol.WriteFilesRequest(files={"a": "eA=="}, replace=True, remove=["b"], id=2),
                    protocol.EditRequest(command="view", path="/w/a.py", root="/w", view_range=[1, -1], id=3),
                    protocol.HashTreeRequest(skip=["*.pyc"], max_files=10, id=4)):
        assert protocol.parse_request(protocol.decode(protocol.encode(request))) == request
    reply = protocol.TreeHashes(id=4, files={"a": "00"}, sizes={"a": 1}, links={"l": "/x"}, skipped=["f"])
    assert protocol.parse_reply(protocol.decode(protocol.encode(reply))) == reply
    for bad in ({"type": "tree_hashes", "id": 1, "sizes": {"a": "1"}},
                {"type": "tree_hashes", "id": 1, "sizes": {"a": True}},
                {"type": "files_read", "id": 1, "missing": [1]},
                {"type": "edit", "id": 1, "outcome": "error", "lines": ["2"]}):
        with pytest.raises(ValueError):
            protocol.parse_reply(bad)
    with pytest.raises(ValueError):
        protocol.parse_request({"op": "edit", "command": "view", "path": "/x", "root": "/", "view_range": [1.5, 2]})
