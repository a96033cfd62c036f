"""The conformance suite passes against tito's server and catches a server that ignores seq."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from tests.harness import REPO
from tito.channel_options import server_options
from tito.conformance import Conformance, report
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

pytestmark = pytest.mark.docker


# (Against a bwrap server: tests/server/test_unprivileged.py, run by an unprivileged user.)
def test_tito_server_passes_every_check(server):
    proc = subprocess.run([sys.executable, "-m", "tito.conformance", "--address", server.address],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == "conformance: passed 13 of 13"


class SeqIgnoringProxy(pb_grpc.EnvironmentServicer):
    """A defective server: forwards to a real one but numbers each session's Steps itself,
    so a retried seq runs its tools again and stale seqs are accepted."""

    def __init__(self, upstream: pb_grpc.EnvironmentStub) -> None:
        self.up = upstream
        self.next_seq: dict[str, int] = {}

    def _forward(self, rpc, request, context):
        try:
            return getattr(self.up, rpc)(request)
        except grpc.RpcError as e:
            context.abort(e.code(), e.details())

    def ListEnvironments(self, request, context):
        return self._forward("ListEnvironments", request, context)

    def RegisterTokenizer(self, request, context):
        return self._forward("RegisterTokenizer", request, context)

    def OpenSession(self, request, context):
        return self._forward("OpenSession", request, context)

    def CloseSession(self, request, context):
        return self._forward("CloseSession", request, context)

    def Step(self, request, context):
        seq = self.next_seq.get(request.session_id, 1)
        self.next_seq[request.session_id] = seq + 1
        forwarded = pb.StepRequest()
        forwarded.CopyFrom(request)
        forwarded.seq = seq
        return self._forward("Step", forwarded, context)


def test_a_server_that_ignores_seq_fails_the_seq_checks(server, tokenizer_dir):
    proxy = grpc.server(futures.ThreadPoolExecutor(8), options=server_options(64 << 20))
    pb_grpc.add_EnvironmentServicer_to_server(SeqIgnoringProxy(server.stub()), proxy)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, proxy)
    reflection.enable_server_reflection(
        ["tito.v1.Environment", "grpc.health.v1.Health", reflection.SERVICE_NAME], proxy)
    port = proxy.add_insecure_port("127.0.0.1:0")
    proxy.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            results = Conformance(channel, tokenizer_dir, "python").run()
    finally:
        proxy.stop(None)
    report(results)
    failed = {r.name for r in results if r.outcome == "FAIL"}
    assert failed == {"seq_replay", "seq_order"}, [(r.name, r.detail) for r in results if r.outcome == "FAIL"]


@pytest.fixture(scope="module")
def tokenizer_dir():
    from tito_assets.qwen_tokenizer import build_tokenizer_dir

    return build_tokenizer_dir(template="qwen2_5")
