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

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

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


def wait_serving(channel: grpc.Channel, timeout_s: float) -> None:
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=2).status
            if status == health_pb2.HealthCheckResponse.SERVING:
                return
            last = health_pb2.HealthCheckResponse.ServingStatus.Name(status)
        except grpc.RpcError as e:
            last = f"{e.code().name}: {e.details()}"
        time.sleep(0.5)
    raise SystemExit(f"server not SERVING after {timeout_s:.0f} s ({last})")


def show(title: str, text: str, width: int = 100) -> None:
    print(f"  {title}:")
    for line in (text or "").splitlines() or [""]:
        print("    | " + (line if len(line) <= width else line[: width - 3] + "..."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="127.0.0.1:50051", help="server address (default 127.0.0.1:50051)")
    ap.add_argument("--wait", type=float, default=60.0, help="seconds to wait for SERVING (default 60)")
    args = ap.parse_args()

    with grpc.insecure_channel(args.target) as channel:
        print(f"== waiting for {args.target} to report SERVING")
        wait_serving(channel, args.wait)
        stub = pb_grpc.EnvironmentStub(channel)

        print("== ListEnvironments")
        envs = stub.ListEnvironments(pb.ListEnvironmentsRequest(), timeout=10).environments
        for env in envs:
            print(f"  {env.name}: {env.description.splitlines()[0] if env.description else ''}")
            for tool in env.tools:
                params = json.loads(tool.parameters_json_schema or "{}").get("properties", {})
                print(f"    tool {tool.name}({', '.join(params)})")
        if "python" not in {e.name for e in envs}:
            print("error: the server offers no 'python' environment", file=sys.stderr)
            return 1

        print("== OpenSession(python)")
        opened = stub.OpenSession(
            pb.OpenSessionRequest(
                environment="python",
                messages=[pb.Message(role="user", content="Compute a few things with Python.")],
            ),
            timeout=60,
        )
        sid = opened.session_id
        print(f"  session {sid} (idle TTL {opened.idle_ttl_s:.0f} s, hard TTL {opened.hard_ttl_s:.0f} s)")
        failures = 0
        try:
            seq = 0
            for n, (title, calls) in enumerate(STEPS, 1):
                seq += 1
                print(f"== Step {seq}: {title}")
                request = pb.StepRequest(
                    session_id=sid,
                    seq=seq,
                    tool_calls=[pb.ToolCall(id=f"call_{n}_{i}", name=name, arguments=a) for i, (name, a) in enumerate(calls)],
                )
                t0 = time.perf_counter()
                reply = stub.Step(request, timeout=120)
                ms = (time.perf_counter() - t0) * 1000
                print(f"  status {pb.StepStatus.Name(reply.status)}, done={reply.done}, {ms:.1f} ms round trip"
                      f" (server tools {reply.timing.tools_ms:.1f} ms)")
                for call, msg in zip(calls, reply.tool_messages):
                    show(f"{msg.role} {msg.name or call[0]} [{msg.tool_call_id}]", msg.content)
                if len(reply.tool_messages) != len(calls) or reply.done:
                    print("  unexpected: one tool message per call and an episode still running", file=sys.stderr)
                    failures += 1
            # Retrying the last step (same seq) is idempotent: the same answer, nothing runs twice.
            again = stub.Step(pb.StepRequest(session_id=sid, seq=seq, tool_calls=request.tool_calls), timeout=60)
            print(f"== Step {seq} again (retry): same answer: {again == reply}")
            failures += again != reply

            seq += 1
            print(f"== Step {seq}: a turn with no tool call ends the episode")
            final = stub.Step(pb.StepRequest(session_id=sid, seq=seq, assistant_content="The answer is 45."), timeout=60)
            print(f"  status {pb.StepStatus.Name(final.status)}, done={final.done}"
                  + (f", reward {final.reward}" if final.HasField("reward") else ""))
            failures += not final.done
        finally:
            closed = stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=30)
            print(f"== CloseSession: closed={closed.closed}")

    print("== scripted session " + ("OK" if not failures else f"had {failures} unexpected answer(s)"))
    return 1 if failures else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except grpc.RpcError as e:
        print(f"error: {e.code().name}: {e.details()}", file=sys.stderr)
        sys.exit(1)
