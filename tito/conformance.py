"""Conformance suite for any implementation of the tito.v1.Environment proto.

    python -m tito.conformance --address 127.0.0.1:50051 [--tokenizer DIR] [--ca-file CA --token T]

Runs the contract's checks against a live server over the raw protocol (not through tito's own
client, so a server cannot pass by sharing its bugs), prints one line per check and ends with
`conformance: passed P of N`. Exit status 0 only when every check passed. The checks that run
code need an environment with a `run_python` tool (the built-in `python` environment).
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tito.channel_options import client_options
from tito.extras import require
from tito.fingerprint import RENDERER_VERSION, compute_fingerprint
from tito.tokenizer_files import tokenizer_files
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

SERVICE = "tito.v1.Environment"
# The names the brief fixes: any implementation must serve them.
FIXED_METHODS = {"ListEnvironments", "RegisterTokenizer", "OpenSession", "Step", "CloseSession"}
FIXED_FIELDS = {
    "ToolCall": {"id", "name", "arguments"},
    "Message": {"role", "content", "name", "tool_call_id"},
    "RegisterTokenizerRequest": {"files"},
    "RegisterTokenizerResponse": {"fingerprint"},
    "OpenSessionRequest": {"environment", "tokenizer_fingerprint", "messages", "env_args"},
    "OpenSessionResponse": {"session_id", "prompt_ids", "tools"},
    "StepRequest": {"session_id", "seq", "completion_ids", "tool_calls", "max_suffix_tokens"},
    "StepResponse": {"tool_messages", "suffix_ids", "done", "reward", "truncated"},
    "CloseSessionRequest": {"session_id"},
}
QUESTION = [{"role": "user", "content": "What is 6 * 7? Use the tool."}]


class Skip(Exception):
    """The check does not apply to this server (e.g. no run_python tool)."""


@dataclass
class CheckResult:
    name: str
    outcome: str  # "pass", "FAIL" or "skip"
    detail: str = ""


def expect(condition: object, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def expect_status(fn: Callable[[], Any], code: grpc.StatusCode, what: str) -> str:
    try:
        fn()
    except grpc.RpcError as e:
        expect(e.code() == code, f"{what}: expected {code.name}, got {e.code().name}: {e.details()}")
        return e.details() or ""
    raise AssertionError(f"{what}: expected {code.name}, but the call succeeded")


class Conformance:
    def __init__(self, channel: grpc.Channel, tokenizer_dir: Path, environment: str,
                 metadata: tuple[tuple[str, str], ...] = (), timeout_s: float = 120.0) -> None:
        # The server's extra: the check renders with transformers and reads the server's reflection.
        auto_tokenizer = require("transformers", "server", "tito.conformance").AutoTokenizer
        self.reflection = require("grpc_reflection.v1alpha.reflection_pb2", "server", "tito.conformance")
        self.reflection_grpc = require("grpc_reflection.v1alpha.reflection_pb2_grpc", "server", "tito.conformance")
        self.channel = channel
        self.stub = pb_grpc.EnvironmentStub(channel)
        self.environment = environment
        self.metadata = metadata or None
        self.timeout_s = timeout_s
        self.files = tokenizer_files(tokenizer_dir)  # compact, as tito's client uploads it
        self.tokenizer = auto_tokenizer.from_pretrained(str(tokenizer_dir))
        self.fingerprint = ""
        self.steps_seen: list[pb.StepResponse] = []

    # ------------------------------------------------------------ plumbing

    def call(self, rpc: str, request: Any) -> Any:
        response = getattr(self.stub, rpc)(request, timeout=self.timeout_s, metadata=self.metadata)
        if rpc == "Step":
            self.steps_seen.append(response)
        return response

    def step(self, sid: str, seq: int, **kw: Any) -> pb.StepResponse:
        return self.call("Step", pb.StepRequest(session_id=sid, seq=seq, **kw))

    def python_call(self, sid: str, seq: int, code: str) -> pb.StepResponse:
        return self.step(sid, seq, tool_calls=[pb.ToolCall(id=f"c{seq}", name="run_python",
                                                           arguments=json.dumps({"code": code}))])

    @contextmanager
    def session(self, **kw: Any) -> Iterator[str]:
        sid = self.call("OpenSession", pb.OpenSessionRequest(environment=self.environment, **kw)).session_id
        try:
            yield sid
        finally:
            self.call("CloseSession", pb.CloseSessionRequest(session_id=sid))

    def needs_python(self) -> None:
        envs = {e.name: e for e in self.call("ListEnvironments", pb.ListEnvironmentsRequest()).environments}
        tools = {t.name for t in envs[self.environment].tools} if self.environment in envs else set()
        if "run_python" not in tools:
            raise Skip(f"environment {self.environment!r} has no run_python tool")

    def ensure_registered(self) -> str:
        if not self.fingerprint:
            self.fingerprint = self.call("RegisterTokenizer", pb.RegisterTokenizerRequest(files=self.files)).fingerprint
        return self.fingerprint

    def render(self, conversation: list[dict], tools: list[dict]) -> list[int]:
        """The template's own ids for a conversation, with the generation prompt."""
        return list(self.tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True,
                                                       tokenize=True, return_dict=False))

    def completion(self, conversation: list[dict], assistant: dict, tools: list[dict]) -> list[int]:
        """The assistant turn as the model writes it: the template's own rendering of it after the
        generation prompt, through its end-of-turn token."""
        before = self.tokenizer.apply_chat_template(conversation, tools=tools, add_generation_prompt=True, tokenize=False)
        after = self.tokenizer.apply_chat_template(conversation + [assistant], tools=tools, tokenize=False)
        expect(after.startswith(before), "the tokenizer's template does not extend its own generation prompt")
        eos = self.tokenizer.eos_token
        text = after[len(before):]
        return self.tokenizer.encode(text[: text.index(eos) + len(eos)], add_special_tokens=False)

    # ------------------------------------------------------------ checks

    def check_health(self) -> str:
        status = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10).status
        expect(status == health_pb2.HealthCheckResponse.SERVING, f"health is {status}, not SERVING")
        return "SERVING"

    def _reflect(self, **request: Any) -> Any:
        stub = self.reflection_grpc.ServerReflectionStub(self.channel)
        (reply,) = list(stub.ServerReflectionInfo(iter([self.reflection.ServerReflectionRequest(**request)]),
                                                  timeout=10, metadata=self.metadata))
        return reply

    def check_reflection(self) -> str:
        names = {s.name for s in self._reflect(list_services="").list_services_response.service}
        expect({SERVICE, "grpc.health.v1.Health"} <= names, f"reflection lists {sorted(names)}")
        return f"{len(names)} services"

    def check_fixed_names(self) -> str:
        reply = self._reflect(file_containing_symbol=SERVICE)
        files = [descriptor_pb2.FileDescriptorProto.FromString(b)
                 for b in reply.file_descriptor_response.file_descriptor_proto]
        proto = next(f for f in files if any(s.name == "Environment" for s in f.service))
        methods = {m.name for s in proto.service if s.name == "Environment" for m in s.method}
        expect(FIXED_METHODS <= methods, f"missing RPCs: {sorted(FIXED_METHODS - methods)}")
        messages = {m.name: {f.name for f in m.field} for m in proto.message_type}
        missing = {m: sorted(want - messages.get(m, set())) for m, want in FIXED_FIELDS.items()
                   if not want <= messages.get(m, set())}
        expect(not missing, f"missing fields: {missing}")
        return f"{len(FIXED_METHODS)} RPCs, {sum(map(len, FIXED_FIELDS.values()))} fields"

    def check_list_environments(self) -> str:
        envs = self.call("ListEnvironments", pb.ListEnvironmentsRequest()).environments
        expect(envs, "no environments")
        for env in envs:
            expect(env.name and env.tools, f"environment {env.name!r} has no name or no tools")
            for tool in env.tools:
                schema = json.loads(tool.parameters_json_schema)
                expect(tool.name and isinstance(schema, dict), f"tool {tool.name!r}: no name or schema is not an object")
        expect(self.environment in {e.name for e in envs}, f"{self.environment!r} is not offered")
        return ", ".join(e.name for e in envs)

    def check_register_idempotent(self) -> str:
        a = self.call("RegisterTokenizer", pb.RegisterTokenizerRequest(files=self.files))
        b = self.call("RegisterTokenizer", pb.RegisterTokenizerRequest(files=self.files))
        expect(a.fingerprint == b.fingerprint, "two registrations of the same files gave two fingerprints")
        local = compute_fingerprint(self.files, {}, RENDERER_VERSION)
        expect(a.fingerprint == local, f"fingerprint {a.fingerprint[:12]}… is not tito's {local[:12]}… for these files")
        expect(list(a.stop_token_ids), "no stop_token_ids")
        self.fingerprint = a.fingerprint
        return f"{a.fingerprint[:12]}…, family {a.template_family or '?'}"

    def check_token_exact_episode(self) -> str:
        self.needs_python()
        fp = self.ensure_registered()
        opened = self.call("OpenSession", pb.OpenSessionRequest(
            environment=self.environment, tokenizer_fingerprint=fp,
            messages=[pb.Message(**m) for m in QUESTION], env_args=json.dumps({"expected_answer": "42"})))
        try:
            tools = [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                       "parameters": json.loads(t.parameters_json_schema)}}
                     for t in opened.tools]
            want = self.render(QUESTION, tools)
            expect(list(opened.prompt_ids) == list(want), "prompt_ids differ from the template's own render")
            call = {"id": "call_1_0", "type": "function", "function": {"name": "run_python", "arguments": {"code": "6 * 7"}}}
            assistant = {"role": "assistant", "content": "", "tool_calls": [call]}
            completion = self.completion(QUESTION, assistant, tools)
            r = self.step(opened.session_id, 1, completion_ids=completion)
            expect(r.status == pb.STEP_STATUS_OK and not r.done, f"status {pb.StepStatus.Name(r.status)}")
            expect([m.content for m in r.tool_messages] == ["Out: 42"], f"tool messages {list(r.tool_messages)}")
            tool = {"role": "tool", "content": "Out: 42", "name": "run_python", "tool_call_id": r.tool_messages[0].tool_call_id}
            full = self.render(QUESTION + [assistant, tool], tools)
            ours = list(opened.prompt_ids) + completion + list(r.suffix_ids)
            expect(ours == list(full), "prompt + completion + suffix ids differ from the template's render "
                   f"(first difference at token {next((i for i, (a, b) in enumerate(zip(ours, full)) if a != b), '?')})")
            end = self.step(opened.session_id, 2, completion_ids=self.tokenizer.encode(
                "The answer is 42." + self.tokenizer.eos_token, add_special_tokens=False))
            expect(end.status == pb.STEP_STATUS_EPISODE_END and end.done and not end.suffix_ids,
                   f"a turn without tool call answered {pb.StepStatus.Name(end.status)}")
            expect(end.HasField("reward") and end.reward == 1.0, "the expected answer was not rewarded 1.0")
            expect_status(lambda: self.step(opened.session_id, 3, completion_ids=completion),
                          grpc.StatusCode.FAILED_PRECONDITION, "a Step after the episode ended")
        finally:
            self.call("CloseSession", pb.CloseSessionRequest(session_id=opened.session_id))
        return f"{len(ours)} ids equal the template's own render"

    def check_seq_replay(self) -> str:
        self.needs_python()
        with self.session() as sid:
            first = self.python_call(sid, 1, "n = globals().get('n', 0) + 1; n")
            again = self.python_call(sid, 1, "n = globals().get('n', 0) + 1; n")
            expect(first.tool_messages[0].content == "Out: 1", f"first run said {first.tool_messages[0].content!r}")
            expect(again == first, "a replayed seq did not return the stored answer")
            after = self.python_call(sid, 2, "n")
            expect(after.tool_messages[0].content == "Out: 1", f"the replay ran the code again (n is {after.tool_messages[0].content!r})")
        return "replay returned the stored answer; nothing ran twice"

    def check_seq_order(self) -> str:
        self.needs_python()
        with self.session() as sid:
            self.python_call(sid, 1, "1")
            self.python_call(sid, 2, "2")
            expect_status(lambda: self.python_call(sid, 1, "1"), grpc.StatusCode.FAILED_PRECONDITION, "a stale seq")
            expect_status(lambda: self.python_call(sid, 4, "1"), grpc.StatusCode.FAILED_PRECONDITION, "a skipped seq")
        return "stale and skipped seqs refused"

    def check_model_mistakes_are_tool_messages(self) -> str:
        self.needs_python()
        cases = [("run_python", "{not json", "JSON"), ("run_python", '{"code": 5}', "invalid"),
                 ("no_such_tool", "{}", "unknown tool")]
        with self.session() as sid:
            for seq, (name, args, word) in enumerate(cases, start=1):
                r = self.step(sid, seq, tool_calls=[pb.ToolCall(id="x", name=name, arguments=args)])
                expect(r.status == pb.STEP_STATUS_OK and not r.done, f"{name}({args}) ended the session")
                expect(word.lower() in r.tool_messages[0].content.lower(), f"{name}({args}): {r.tool_messages[0].content!r}")
            expect(self.python_call(sid, len(cases) + 1, "'alive'").tool_messages[0].content == "Out: 'alive'",
                   "the session did not go on")
        return f"{len(cases)} mistakes answered as tool messages"

    def check_client_mistakes_get_statuses(self) -> str:
        fp = self.ensure_registered()
        open_ = lambda **kw: self.call("OpenSession", pb.OpenSessionRequest(**{"environment": self.environment, **kw}))  # noqa: E731
        expect_status(lambda: open_(environment=f"no-such-{uuid.uuid4().hex[:6]}"), grpc.StatusCode.NOT_FOUND, "unknown environment")
        expect_status(lambda: open_(tokenizer_fingerprint="0" * 64), grpc.StatusCode.FAILED_PRECONDITION, "unknown fingerprint")
        expect_status(lambda: open_(messages=[pb.Message(role="wizard", content="x")]), grpc.StatusCode.INVALID_ARGUMENT, "bad role")
        expect_status(lambda: open_(env_args="{not json"), grpc.StatusCode.INVALID_ARGUMENT, "env_args not JSON")
        expect_status(lambda: self.step(f"no-such-{uuid.uuid4().hex}", 1), grpc.StatusCode.NOT_FOUND, "unknown session")
        with self.session(tokenizer_fingerprint=fp, messages=[pb.Message(**m) for m in QUESTION]) as sid:
            expect_status(lambda: self.step(sid, 1, tokenizer_fingerprint="f" * 64),
                          grpc.StatusCode.FAILED_PRECONDITION, "a Step with another fingerprint")
        return "7 refusals with their statuses"

    def check_budget(self) -> str:
        self.needs_python()
        fp = self.ensure_registered()
        with self.session(tokenizer_fingerprint=fp, messages=[pb.Message(**m) for m in QUESTION]) as sid:
            code = [pb.ToolCall(id="x", name="run_python", arguments=json.dumps({"code": "print('x' * 3000)"}))]
            cut = self.step(sid, 1, tool_calls=code, max_suffix_tokens=64)
            expect(cut.status == pb.STEP_STATUS_OK and cut.truncated and 0 < len(cut.suffix_ids) <= 64,
                   f"budget 64: status {pb.StepStatus.Name(cut.status)}, {len(cut.suffix_ids)} ids, truncated={cut.truncated}")
            zero = self.step(sid, 2, tool_calls=code, max_suffix_tokens=0)
            expect(zero.status == pb.STEP_STATUS_SUFFIX_OVERFLOW and zero.done and not zero.suffix_ids,
                   f"budget 0: status {pb.StepStatus.Name(zero.status)}")
        return "cut to 64 ids; 0 overflows"

    def check_close_is_idempotent(self) -> str:
        sid = self.call("OpenSession", pb.OpenSessionRequest(environment=self.environment)).session_id
        expect(self.call("CloseSession", pb.CloseSessionRequest(session_id=sid)).closed, "first close said not closed")
        expect(not self.call("CloseSession", pb.CloseSessionRequest(session_id=sid)).closed, "second close said closed")
        expect_status(lambda: self.step(sid, 1), grpc.StatusCode.NOT_FOUND, "a Step on a closed session")
        return "closed once; later calls NOT_FOUND"

    def check_done_follows_status(self) -> str:
        expect(self.steps_seen, "no Step was answered by the checks before")
        bad = [r for r in self.steps_seen if r.done != (r.status != pb.STEP_STATUS_OK)]
        expect(not bad, f"{len(bad)} answers where done != (status != OK)")
        return f"{len(self.steps_seen)} answers"

    def run(self) -> list[CheckResult]:
        results = []
        for name in CHECK_ORDER:
            try:
                detail = getattr(self, f"check_{name}")()
                results.append(CheckResult(name, "pass", detail))
            except Skip as e:
                results.append(CheckResult(name, "skip", str(e)))
            except AssertionError as e:
                results.append(CheckResult(name, "FAIL", str(e)))
            except grpc.RpcError as e:
                results.append(CheckResult(name, "FAIL", f"{e.code().name}: {e.details()}"))
            except Exception as e:  # a check that crashes is a failure of the check, reported as such
                results.append(CheckResult(name, "FAIL", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
        return results


CHECK_ORDER = [
    "health", "reflection", "fixed_names", "list_environments", "register_idempotent", "token_exact_episode",
    "seq_replay", "seq_order", "model_mistakes_are_tool_messages", "client_mistakes_get_statuses", "budget",
    "close_is_idempotent", "done_follows_status",
]


def report(results: list[CheckResult], out=sys.stdout) -> bool:
    width = max(len(r.name) for r in results)
    for r in results:
        print(f"{r.outcome:4}  {r.name:{width}}  {r.detail.splitlines()[0] if r.detail else ''}", file=out)
    ran = [r for r in results if r.outcome != "skip"]
    passed = sum(r.outcome == "pass" for r in ran)
    print(f"conformance: passed {passed} of {len(ran)}", file=out)
    return passed == len(ran)


def _channel(args: argparse.Namespace) -> grpc.Channel:
    if not (args.ca_file or args.cert_file):
        return grpc.insecure_channel(args.address, options=client_options())
    read = lambda p: Path(p).read_bytes() if p else None  # noqa: E731
    creds = grpc.ssl_channel_credentials(read(args.ca_file), read(args.key_file), read(args.cert_file))
    return grpc.secure_channel(args.address, creds, options=client_options())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tito.conformance", description=__doc__.split("\n\n")[0])
    p.add_argument("--address", required=True, help="HOST:PORT of the server under test")
    p.add_argument("--environment", default="python", help="environment to run the checks in (default: python)")
    p.add_argument("--tokenizer", help="tokenizer folder (default: the offline Qwen tokenizer, qwen2_5 template)")
    p.add_argument("--ca-file", help="CA certificate: connect with TLS")
    p.add_argument("--cert-file", help="client certificate (mTLS)")
    p.add_argument("--key-file", help="client key (mTLS)")
    p.add_argument("--token", help="bearer token sent as `authorization: Bearer <token>`")
    args = p.parse_args(argv)
    if args.tokenizer:
        tokenizer_dir = Path(args.tokenizer)
    else:
        from tito_assets.qwen_tokenizer import build_tokenizer_dir

        tokenizer_dir = build_tokenizer_dir(template="qwen2_5")
    metadata = (("authorization", f"Bearer {args.token}"),) if args.token else ()
    with _channel(args) as channel:
        ok = report(Conformance(channel, tokenizer_dir, args.environment, metadata).run())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
