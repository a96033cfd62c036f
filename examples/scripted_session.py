"""A scripted client session against a running tito environment server (no model, no tokenizer).

    .venv/bin/python examples/scripted_session.py [--target 127.0.0.1:50051]

Lists the environments, opens a `python` session, sends already-parsed tool calls (as a trainer that
parses completions itself would), prints each tool message, ends the episode and closes the session.
It exits non-zero when the server is unreachable or an answer is not what the script expects.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tito.client import StepStatus, TitoClient, TitoError
from tito.types import StepRequest, ToolCall

STEPS: list[tuple[str, list[tuple[str, str]]]] = [
    # (what it shows, [(tool name, arguments JSON as a model would write it), ...])
    ("state: define a variable", [("run_python", json.dumps({"code": "x = 21 * 2\nprint('x =', x)"}))]),
    ("state persists across calls; last expression's value", [("run_python", json.dumps({"code": "import math\nx + math.floor(math.pi)"}))]),
    ("two parallel calls in one turn", [
        ("run_python", json.dumps({"code": "squares = [i * i for i in range(6)]\nsquares"})),
        ("run_python", json.dumps({"code": "sum(squares)"})),
    ]),
    ("a traceback comes back as a tool message", [("run_python", json.dumps({"code": "1 / 0"}))]),
    ("hardened sandbox: read-only root, non-root user", [("run_python", json.dumps({"code": "import os\nprint('uid', os.getuid())\nopen('/etc/passwd', 'a')"}))]),
    ("malformed tool-call JSON is reported to the model, not a crash", [("run_python", '{"code": "print(1)"')]),
    ("unknown tool", [("rm_rf", "{}")]),
]


def show(title: str, text: str, width: int = 100) -> None:
    print(f"  {title}:")
    for line in (text or "").splitlines() or [""]:
        print("    | " + (line if len(line) <= width else line[: width - 3] + "..."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:50051", help="server address (default 127.0.0.1:50051)")
    ap.add_argument("--wait", type=float, default=60.0, help="seconds to wait for SERVING (default 60)")
    args = ap.parse_args()

    with TitoClient(args.target) as client:
        print(f"== waiting for {args.target} to report SERVING")
        client.wait_ready(args.wait)

        print("== ListEnvironments")
        envs = client.list_environments()
        for env in envs:
            print(f"  {env.name}: {env.description.splitlines()[0] if env.description else ''}")
            for tool in env.tools:
                print(f"    tool {tool.name}({', '.join(tool.parameters.get('properties', {}))})")
        if "python" not in {e.name for e in envs}:
            print("error: the server offers no 'python' environment", file=sys.stderr)
            return 1

        print("== OpenSession(python)")
        failures = 0
        # No tokenizer: the session is stepped with tool calls parsed by the caller; it closes itself.
        with client.open_session("python", [{"role": "user", "content": "Compute a few things with Python."}]) as session:
            opened = session.aio.opened
            print(f"  session {session.id} (idle TTL {opened.idle_ttl_s:.0f} s, hard TTL {opened.hard_ttl_s:.0f} s)")
            for n, (title, calls) in enumerate(STEPS, 1):
                print(f"== Step {session.seq + 1}: {title}")
                tool_calls = [ToolCall(id=f"call_{n}_{i}", name=name, arguments=a) for i, (name, a) in enumerate(calls)]
                t0 = time.perf_counter()
                reply = session.step(tool_calls=tool_calls)
                ms = (time.perf_counter() - t0) * 1000
                print(f"  status {reply.status.name}, {ms:.1f} ms round trip (server tools {reply.timing.tools_ms:.1f} ms)")
                for call, msg in zip(calls, reply.tool_messages):
                    show(f"tool {msg.name or call[0]} [{msg.tool_call_id}]", msg.content)
                if len(reply.tool_messages) != len(calls) or reply.status is not StepStatus.OK:
                    print("  unexpected: one tool message per call and an episode still running", file=sys.stderr)
                    failures += 1
            # Retrying the last step (same seq) is idempotent: the same answer, nothing runs twice.
            again = client.step(StepRequest(session.id, session.seq, tool_calls=tuple(tool_calls)))
            print(f"== Step {session.seq} again (retry): same answer: {again == reply}")
            failures += again != reply

            print(f"== Step {session.seq + 1}: a turn with no tool call ends the episode")
            final = session.step(assistant_content="The answer is 45.")
            print(f"  status {final.status.name}" + (f", reward {final.reward}" if final.reward is not None else ""))
            failures += not final.done
        print(f"== CloseSession: closed={session.aio.closed}")

    print("== scripted session " + ("OK" if not failures else f"had {failures} unexpected answer(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except TitoError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
