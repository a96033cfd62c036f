"""The bash environment and session files, on real sandboxes from the pool (no gRPC in between):
state across calls, the leftovers rule, timeouts, hostile commands, and seeded files in both
environments."""

from __future__ import annotations

import asyncio
import json

import pytest

from env_server.environments.bash_env import BashEnvironment
from env_server.environments.python_env import PythonEnvironment
from tito.types import ToolCall


async def _open(pool, cls, **env_args):
    sandbox = await pool.acquire()
    env = cls(cls.parse_env_args(json.dumps(env_args)), sandbox)
    await env.setup()
    return env


async def _bash(env, command: str) -> str:
    result = await env.call_tool(ToolCall("c", "run_bash", json.dumps({"command": command})))
    return result.content


async def test_the_shell_keeps_directory_variables_and_functions(pool):
    env = await _open(pool, BashEnvironment)
    try:
        assert await _bash(env, "mkdir -p sub/deeper && cd sub && export GREETING=hi && f() { echo f:$1; }") == "(no output)"
        assert await _bash(env, "pwd; echo $GREETING; f x") == "/workspace/sub\nhi\nf:x"
        assert await _bash(env, "echo to-err >&2; false") == "to-err\n[exit code 1]"
        # A syntax error is bash's message; the shell goes on.
        out = await _bash(env, "echo 'unterminated")
        assert "unexpected EOF" in out and "[exit code 2]" in out
        assert await _bash(env, "echo still $GREETING") == "still hi"
        # Quotes, backslashes, newlines and control characters reach bash unchanged.
        assert await _bash(env, "printf '%s|' 'a b' \"c\\\\d\" $'e\\tf'\necho") == "a b|c\\d|e\tf|"
        # stdin is /dev/null: a command that reads it ends at once instead of eating the protocol.
        assert await _bash(env, "cat; echo after") == "after"
    finally:
        await env.sandbox.destroy()


async def test_background_jobs_are_stopped_when_the_command_returns_and_a_timeout_restarts_the_shell(pool):
    env = await _open(pool, BashEnvironment, timeout_s=2)
    try:
        out = await _bash(env, "cd /tmp; X=1; sleep 300 & (sleep 301 &); echo started")
        assert out == "started\n[stopped 2 processes the command left running in the background]"
        assert await _bash(env, "pwd; echo $X; grep -lx sleep /proc/[0-9]*/comm 2>/dev/null | wc -l") == "/tmp\n1\n0"
        out = await _bash(env, "sleep 30")
        assert "[timed out: the command was stopped and the shell restarted" in out
        assert await _bash(env, "pwd; echo x${X}x") == "/workspace\nxx"  # fresh shell, in the working directory
    finally:
        await env.sandbox.destroy()


async def test_hostile_commands_stay_inside_the_sandbox(pool):
    env = await _open(pool, BashEnvironment, timeout_s=5)
    other = await _open(pool, BashEnvironment)
    try:
        # A fork bomb hits the pids limit; when it returns (or times out) its processes are gone.
        out = await _bash(env, ":(){ :|:& };:")
        assert await _bash(other, "echo untouched") == "untouched"
        if "sandbox lost" in out:  # only without a pids limit (gVisor): memory ends it, with the sandbox
            assert env.sandbox.config.runtime == "runsc" and "[sandbox lost: out of memory" in out, out
            return
        assert await _bash(env, "echo alive") == "alive"  # whatever the bomb left was stopped
        # Outside the working directory nothing is writable; cd / itself is allowed.
        out = await _bash(env, "cd / && touch /etc/x /x; echo rc=$?; pwd")
        # (runc says "Read-only file system"; gVisor "Permission denied".)
        assert ("Read-only file system" in out or "Permission denied" in out) and "rc=1" in out and out.endswith("/")
        out = await _bash(env, "echo hi > /workspace/../usr/y; ls /usr/y")
        assert "Read-only file system" in out or "Permission denied" in out
        uid, net = (await _bash(env, "id -u; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")).split("\n")
        config = env.sandbox.config  # 1000 under bwrap; under Docker the container's own host uid (docker/uids.py)
        assert net == "lo" and (int(uid) == 1000 if config.backend == "bwrap" else
                                config.uid_range_start <= int(uid) < config.uid_range_start + config.uid_range_size)
    finally:
        await env.sandbox.destroy()
        await other.sandbox.destroy()


async def test_seeded_files_are_visible_to_both_environments(pool):
    files = {"data/input.csv": "a,b\n1,2\n", "notes.txt": "naïve ✓\n", "deep/a/b/c.txt": ""}
    py = await _open(pool, PythonEnvironment, files=files)
    sh = await _open(pool, BashEnvironment, files=files)
    try:
        r = await py.call_tool(ToolCall("c", "run_python", json.dumps(
            {"code": "import os\nsorted(os.path.join(d, f) for d, _, fs in os.walk('.') for f in fs), "
                     "open('notes.txt').read(), open('data/input.csv').read()"})))
        assert r.content == ("Out: (['./data/input.csv', './deep/a/b/c.txt', './notes.txt'], 'naïve ✓\\n', "
                             "'a,b\\n1,2\\n')")
        assert await _bash(sh, "cat data/input.csv notes.txt; wc -c < deep/a/b/c.txt") == "a,b\n1,2\nnaïve ✓\n0"
        # The seeding left no names in the interpreter.
        r = await py.call_tool(ToolCall("c", "run_python", json.dumps({"code": "sorted(k for k in globals() if 'tito' in k)"})))
        assert r.content == "Out: []"
    finally:
        await asyncio.gather(py.sandbox.destroy(), sh.sandbox.destroy())


@pytest.mark.parametrize("path, why", [
    ("../escape.txt", "'..' component"),
    ("a/../../b", "'..' component"),
    ("/etc/passwd", "absolute"),
    ("a//b", "empty"),
    ("a\\b", "backslash"),
    ("x\n", "control character"),
    ("/".join("d" * 10) + "/f", "folders deep"),
])
def test_unsafe_seed_paths_are_refused_before_anything_starts(path, why):
    for cls in (PythonEnvironment, BashEnvironment):
        with pytest.raises(ValueError, match=why):
            cls.parse_env_args(json.dumps({"files": {path: "x"}}))


def test_seed_limits():
    with pytest.raises(ValueError, match="at most 100"):
        PythonEnvironment.parse_env_args(json.dumps({"files": {f"f{i}": "" for i in range(101)}}))
    with pytest.raises(ValueError, match="at most 524288 in all"):
        PythonEnvironment.parse_env_args(json.dumps({"files": {"big": "x" * (512 * 1024 + 1)}}))
