"""tito served as an OpenEnv environment (tito/integrations/openenv.py), driven by OpenEnv's own code: its
`create_fastapi_app` under uvicorn and its `GenericEnvClient` over WebSocket, both in .venvs/openenv, against a
real tito server (bwrap backend) and the real Qwen tokenizer. The first turn is chosen by the test: the
completion ids are a tool call's text tokenized with that tokenizer."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import textwrap
import time
import urllib.request

import pytest

from tests.harness import REPO, free_port, start_server
from tests.integrations.conftest import framework_python
from tests.sessions import wait_until
from tito.client import TitoClient

pytestmark = [pytest.mark.framework, pytest.mark.bwrap]

QUESTION = [{"role": "user", "content": "What is 6 * 7? Use the tool."}]
OTHER = [{"role": "user", "content": "Print x."}]


def tool_call_text(code: str) -> str:
    return ('<tool_call>\n' + json.dumps({"name": "run_python", "arguments": {"code": code}})
            + '\n</tool_call><|im_end|>')


# The OpenEnv side of each test: GenericEnvClient in .venvs/openenv; prints one JSON line per result.
DRIVER = textwrap.dedent('''
    import json, sys
    from openenv.core.generic_client import GenericEnvClient
    url, plan = sys.argv[1], json.loads(sys.argv[2])
    clients = {}
    def emit(**kw):
        print(json.dumps(kw), flush=True)
    for who, op, arg in plan:
        env = clients.setdefault(who, GenericEnvClient(base_url=url, message_timeout_s=120))
        try:
            if op == "reset":
                r = env.reset(**arg)
            elif op == "step":
                r = env.step(arg)
            elif op == "state":
                emit(who=who, op=op, state=env.state()); continue
            elif op == "close":
                env.close(); emit(who=who, op=op); continue
            elif op == "wait":  # hold the connection until the test kills this process
                emit(who=who, op=op); sys.stdin.read(); continue
            emit(who=who, op=op, observation=r.observation, reward=r.reward, done=r.done)
        except Exception as e:
            emit(who=who, op=op, error=f"{type(e).__name__}: {e}")
''')


def sessions_active(srv) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{srv.metrics_port}/metrics", timeout=5).read().decode()
    return float(re.search(r"^tito_sessions_active (\S+)$", text, re.M).group(1))


@pytest.fixture(scope="module")
def tokenizer_dir():
    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    return build_tokenizer_dir(template="qwen2_5")


@pytest.fixture(scope="module")
def encode(tokenizer_dir):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def tito(bwrap_ok, tmp_path_factory):
    srv = start_server(tmp_path_factory.mktemp("openenv-tito"), backend="bwrap")
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def fingerprint(tito, tokenizer_dir):
    with TitoClient(tito.address) as client:
        return client.register_tokenizer(tokenizer_dir).fingerprint


@pytest.fixture(scope="module")
def openenv_url(tito, fingerprint, tmp_path_factory):
    """`python -m tito.integrations.openenv` in .venvs/openenv (this checkout's tito first on the path)."""
    python = framework_python("openenv")
    port = free_port()
    log = tmp_path_factory.mktemp("openenv") / "openenv.log"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(python), "-m", "tito.integrations.openenv", "--tito", tito.address,
                                 "--fingerprint", fingerprint, "--port", str(port), "--max-sessions", "4"],
                                cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # its imports (gradio, fastmcp) are slow on a loaded 2-core box
        while True:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "OpenEnv app not up after 300 s:\n" + log.read_text()[-3000:]
                time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        proc.wait(30)


def drive(url: str, plan: list) -> list[dict]:
    done = subprocess.run([str(framework_python("openenv")), "-c", DRIVER, url, json.dumps(plan)], cwd="/",
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_an_episode_through_openenv(tito, fingerprint, openenv_url, encode):
    first = encode(tool_call_text("x = 6 * 7\nprint(x)"))
    # "b" runs beside "a" on its own WebSocket: its sandbox has no x.
    results = drive(openenv_url, [
        ["a", "reset", {"messages": QUESTION, "env_args": {"expected_answer": "42"}}],
        ["b", "reset", {"environment": "no_such_env"}],
        ["b", "reset", {"messages": OTHER}],
        ["a", "step", {"completion_ids": first}],
        ["b", "step", {"tool_calls": [{"name": "run_python", "arguments": {"code": "print(x)"}}]}],  # parsed
        ["a", "step", {"completion_ids": [1, "two"]}],
        ["a", "step", {"completion_ids": first, "tool_calls": [{"name": "run_python", "arguments": "{}"}]}],
        ["a", "state", None],
        ["a", "step", {"completion_ids": encode("The answer is 42.<|im_end|>")}],
        ["a", "step", {"completion_ids": first}],
        ["a", "close", None],
        ["b", "close", None],
    ])
    reset_a, unknown_env, reset_b, step_a, step_b, bad_type, both, state, final, after_end, *_ = results

    # What a direct tito client gets for the same conversation and the same ids.
    with TitoClient(tito.address) as client:
        with client.open_session("python", QUESTION, fingerprint=fingerprint,
                                 env_args={"expected_answer": "42"}) as direct:
            direct_step = direct.step(first)
            direct_prompt = list(direct.prompt_ids)
    obs = reset_a["observation"]
    assert obs["prompt_ids"] == direct_prompt and obs["session_id"]
    assert [t["function"]["name"] for t in obs["tools"]] == ["run_python"]
    assert reset_b["observation"]["session_id"] != obs["session_id"]
    assert "no_such_env" in unknown_env["error"], unknown_env  # tito's own message comes through

    obs = step_a["observation"]
    assert obs["status"] == "OK" and step_a["done"] is False
    assert obs["suffix_ids"] == list(direct_step.suffix_ids)  # verbatim
    assert [m["content"] for m in obs["tool_messages"]] == ["42"]
    assert obs["tool_calls"][0]["name"] == "run_python"
    assert "NameError" in step_b["observation"]["tool_messages"][0]["content"]  # b's sandbox is its own

    # Malformed actions are answered, named, and leave the episode as it was.
    assert "Invalid message" in bad_type["error"] and "VALIDATION_ERROR" in bad_type["error"], bad_type
    assert "not both" in both["error"] and "EXECUTION_ERROR" in both["error"], both
    assert state["state"]["step_count"] == 1 and state["state"]["session_id"] == obs["session_id"]

    assert final["done"] is True and final["reward"] == 1.0, final
    assert final["observation"]["status"] == "EPISODE_END"
    assert "the episode is over" in after_end["error"], after_end
    wait_until(lambda: sessions_active(tito) == 0, 30, "the closed episodes' tito sessions to close")


def test_a_dropped_connection_closes_its_tito_session(tito, openenv_url):
    assert sessions_active(tito) == 0
    proc = subprocess.Popen([str(framework_python("openenv")), "-c", DRIVER, openenv_url,
                             json.dumps([["c", "reset", {"messages": QUESTION}], ["c", "wait", None]])],
                            cwd="/", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        reset = json.loads(proc.stdout.readline())
        assert reset["observation"]["session_id"], reset
        assert json.loads(proc.stdout.readline())["op"] == "wait"
        assert sessions_active(tito) == 1
    finally:
        proc.send_signal(signal.SIGKILL)  # no close message: the socket just drops
        proc.wait(30)
    wait_until(lambda: sessions_active(tito) == 0, 30, "the dropped WebSocket's tito session to close")
