"""The two channels: the unix socket (default; dockerd off the call path) and the attach stream,
and the socket's fallback to attach when the sandbox cannot reach it."""

from __future__ import annotations

import os

import pytest

from tests.harness import only_backend

# The socket and the attach stream are the Docker backend's (bwrap's channel is the REPL's stdio).
pytestmark = [pytest.mark.docker, only_backend("docker")]

STATE = "x = 41\nx += 1\nx"


async def test_socket_channel_is_used_and_leaves_nothing_reachable(make_sandbox, pool):
    sb = await make_sandbox()
    assert not sb._channel._framed, "calls should go over the unix socket"  # noqa: SLF001
    r = await sb.execute(STATE)
    assert r.value == "42", r
    # The socket was removed once connected, its mount is read-only, and the token is not visible.
    r = await sb.execute(
        "import os\nfound = os.listdir('/run/tito')\n"
        "try:\n    open('/run/tito/x', 'w')\n    wrote = True\nexcept OSError:\n    wrote = False\n"
        "(found, wrote, sorted(k for k in os.environ if k.startswith('TITO_')))")
    assert r.value == "([], False, [])", r
    # The host folder is gone too.
    assert not os.path.exists(os.path.join(sb.config.socket_dir, pool.instance_id, sb.session_id[:16]))


async def test_attach_channel(make_sandbox):
    sb = await make_sandbox(channel="attach")
    assert sb._channel._framed and sb._channel is sb._watch  # noqa: SLF001
    r = await sb.execute(STATE)
    assert r.value == "42", r
    r = await sb.execute("import os; os._exit(3)")
    assert r.lost and "code 3" in r.lost_reason, r


async def test_unreachable_socket_falls_back_to_attach(make_sandbox):
    # As when the server runs in a container without socket_dir mounted at the same path.
    sb = await make_sandbox(environment={"TITO_REPL_SOCKET": "/nonexistent/repl.sock"})
    assert sb._channel is sb._watch  # noqa: SLF001
    r = await sb.execute(STATE)
    assert r.value == "42", r


async def test_death_is_detected_on_the_socket_channel(make_sandbox):
    sb = await make_sandbox()
    r = await sb.execute("import os; os._exit(5)")
    assert r.lost and "code 5" in r.lost_reason, r
    assert not sb.alive
