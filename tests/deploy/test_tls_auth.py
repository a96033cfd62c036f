"""TLS, mTLS and bearer tokens on a real server: the right client gets in, the wrong one gets the right
status; health stays open; a public address without TLS and auth is refused at start-up."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.deploy.conftest import TOKEN
from tests.harness import REPO, free_port, start_server
from tito.client import AsyncTitoClient, ReplicaClient, TitoClient, TlsOptions, UnauthenticatedError, UnavailableError
from tito.types import ToolCall
from tito.v1 import environment_pb2 as pb
from tito.v1 import environment_pb2_grpc as pb_grpc

pytestmark = pytest.mark.docker

LIGHT = {"TITO_POOL__TARGET_SIZE": "1"}
RUN = [ToolCall("c", "run_python", '{"code": "6 * 7"}')]


@pytest.fixture(scope="module")
def tls_server(docker_ok, pki, tmp_path_factory):
    """TLS (server certificate only) and bearer tokens; plaintext health alone on a second port."""
    health_port = free_port()
    srv = start_server(tmp_path_factory.mktemp("tls"), env={**LIGHT, **pki.server_env(),
                                                              "TITO_HEALTH_PORT": str(health_port)},
                       credentials=pki.harness_credentials())
    srv.health_port = health_port
    yield srv
    srv.terminate()


@pytest.fixture(scope="module")
def mtls_server(docker_ok, pki, tmp_path_factory):
    """mTLS (client certificates from the client CA) and bearer tokens."""
    srv = start_server(tmp_path_factory.mktemp("mtls"), env={**LIGHT, **pki.server_env(mtls=True)},
                       credentials=pki.harness_credentials(pki.client))
    yield srv
    srv.terminate()


def fails_with(code: grpc.StatusCode, fn) -> str:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    assert info.value.code() == code, info.value.details()
    return info.value.details()


def test_tls_client_with_token_runs_code(tls_server, pki):
    with TitoClient(tls_server.address, tls=pki.tls(), token=TOKEN) as client:
        with client.open_session("python") as session:
            assert session.step(tool_calls=RUN).tool_messages[0].content == "Out: 42"


def test_missing_or_wrong_token_is_unauthenticated(tls_server, pki):
    wrong = "wrong-token-0000000000000000"
    with TitoClient(tls_server.address, tls=pki.tls()) as anonymous, \
            TitoClient(tls_server.address, tls=pki.tls(), token=wrong) as impostor:
        with pytest.raises(UnauthenticatedError) as missing:
            anonymous.list_environments()
        with pytest.raises(UnauthenticatedError) as refused:
            impostor.open_session("python")
    assert "authorization: Bearer <token>" in missing.value.details
    assert "not one this server accepts" in refused.value.details and wrong not in refused.value.details
    # Nothing of the token reaches the server's log either.
    assert wrong not in tls_server.log() and TOKEN not in tls_server.log()
    # A malformed header says what the form is.
    stub = tls_server.stub()
    details = fails_with(grpc.StatusCode.UNAUTHENTICATED, lambda: stub.ListEnvironments(
        pb.ListEnvironmentsRequest(), metadata=[("authorization", TOKEN)]))
    assert "'Bearer <token>'" in details and TOKEN not in details


def test_health_is_open_and_reflection_needs_the_token(tls_server):
    channel = tls_server.channel  # TLS, no token
    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    assert status.status == health_pb2.HealthCheckResponse.SERVING

    def reflect(metadata=None):
        replies = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10, metadata=metadata)
        return {s.name for r in replies for s in r.list_services_response.service}

    fails_with(grpc.StatusCode.UNAUTHENTICATED, reflect)
    assert "tito.v1.Environment" in reflect([("authorization", f"Bearer {TOKEN}")])
    # The health-only port (for probes that cannot do TLS) serves health and nothing else.
    with grpc.insecure_channel(f"127.0.0.1:{tls_server.health_port}") as plain:
        status = health_pb2_grpc.HealthStub(plain).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        fails_with(grpc.StatusCode.UNIMPLEMENTED, lambda: pb_grpc.EnvironmentStub(plain).ListEnvironments(
            pb.ListEnvironmentsRequest(), metadata=[("authorization", f"Bearer {TOKEN}")], timeout=5))


def test_clients_that_do_not_trust_the_server_cannot_connect(tls_server, pki):
    async def attempt(**kwargs) -> UnavailableError:
        async with AsyncTitoClient(tls_server.address, token=TOKEN, retries=0, **kwargs) as client:
            with pytest.raises(UnavailableError) as info:
                await client.list_environments()
            return info.value

    # System roots only (not our CA); our CA but a name the certificate lacks; plaintext against TLS.
    asyncio.run(attempt(tls=TlsOptions()))
    asyncio.run(attempt(tls=replace(pki.tls(), server_name="not-this-server.example")))
    asyncio.run(attempt())


def test_mtls_accepts_the_client_certificate_only(mtls_server, pki):
    with TitoClient(mtls_server.address, tls=pki.tls(pki.client), token=TOKEN) as client:
        assert "python" in {e.name for e in client.list_environments()}
    for tls in (pki.tls(), pki.tls(pki.rogue_client)):  # no client certificate; one from an unknown CA
        with TitoClient(mtls_server.address, tls=tls, token=TOKEN, retries=0) as client:
            with pytest.raises(UnavailableError):
                client.list_environments()


def healthcheck(address: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TITO_", "HEALTHCHECK_"))}
    return subprocess.run([sys.executable, "-m", "env_server.healthcheck", address, *args], cwd=REPO,
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)


def test_healthcheck_speaks_tls_from_the_servers_own_settings(tls_server, mtls_server, pki):
    # In the server's container the same TITO_TLS__* variables are set; the CA comes from HEALTHCHECK_CA_FILE.
    ok = healthcheck(tls_server.address, {**pki.server_env(), "HEALTHCHECK_CA_FILE": str(pki.server_ca.cert)})
    assert ok.returncode == 0, ok.stderr
    plain = healthcheck(tls_server.address, {})
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
    mtls_env = {**pki.server_env(mtls=True), "HEALTHCHECK_CA_FILE": str(pki.server_ca.cert)}
    assert healthcheck(mtls_server.address, mtls_env).returncode == 1
    ok = healthcheck(mtls_server.address, mtls_env, "--cert-file", str(pki.client.cert), "--key-file", str(pki.client.key))
    assert ok.returncode == 0, ok.stderr


@pytest.mark.slow
def test_conformance_passes_over_mtls_with_a_token(mtls_server, pki):
    proc = subprocess.run(
        [sys.executable, "-m", "tito.conformance", "--address", mtls_server.address,
         "--ca-file", str(pki.server_ca.cert), "--cert-file", str(pki.client.cert),
         "--key-file", str(pki.client.key), "--token", TOKEN],
        cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "conformance: passed 13 of 13"


def refused_start(tmp_path, env: dict[str, str], *args: str) -> str:
    srv = start_server(tmp_path, env={**LIGHT, **env}, args=list(args), wait=False)
    assert srv.proc.wait(60) == 2, srv.log()
    return srv.log()


def test_public_address_needs_tls_and_auth_or_an_explicit_insecure(docker_ok, pki, tmp_path):
    log = refused_start(tmp_path, {}, "--host", "0.0.0.0")
    assert "refusing to listen on 0.0.0.0" in log and "TITO_ALLOW_INSECURE=1" in log and "TITO_TLS__CERT_FILE" in log
    # TLS without any client auth is refused too.
    log = refused_start(tmp_path, pki.server_env(tokens=False), "--host", "0.0.0.0")
    assert "client auth" in log and "without TLS" not in log
    # Said explicitly, it listens on every interface (the test reaches it on loopback).
    srv = start_server(tmp_path, env={**LIGHT, "TITO_ALLOW_INSECURE": "1"}, args=["--host", "0.0.0.0"])
    try:
        with TitoClient(srv.address) as client:
            assert client.list_environments()
    finally:
        srv.terminate()


def test_bad_security_files_stop_the_start_with_a_clear_error(docker_ok, pki, tmp_path):
    empty = tmp_path / "empty-tokens"
    empty.write_text("# no token yet\n\n")
    log = refused_start(tmp_path, {"TITO_AUTH__TOKENS_FILE": str(empty)})
    assert "holds no token" in log and "secrets.token_urlsafe" in log
    log = refused_start(tmp_path, {"TITO_AUTH__TOKENS_FILE": str(tmp_path / "missing")})
    assert "cannot be read" in log
    spaced = tmp_path / "spaced-tokens"
    spaced.write_text("secret-one-0123456789 # a comment\n")
    log = refused_start(tmp_path, {"TITO_AUTH__TOKENS_FILE": str(spaced)})
    assert "line 1" in log and "secret-one" not in log
    log = refused_start(tmp_path, {**pki.server_env(), "TITO_TLS__KEY_FILE": str(pki.server.cert)})
    assert "tls.key_file" in log and "PRIVATE KEY" in log
    other = pki.server_ca.issue("other", server=True)
    log = refused_start(tmp_path, {**pki.server_env(), "TITO_TLS__KEY_FILE": str(other.key)})
    assert "is not the private key of tls.cert_file" in log
    log = refused_start(tmp_path, {"TITO_TLS__CERT_FILE": str(pki.server.cert)})
    assert "set both cert_file and key_file" in log


def test_replica_client_over_tls_checks_the_certificate_against_the_name(tls_server, pki):
    # Resolved to 127.0.0.1 and dialled by IP, the certificate is still checked against "localhost".
    by_name = "localhost:" + tls_server.address.rsplit(":", 1)[1]
    with ReplicaClient([by_name], tls=pki.tls(), token=TOKEN) as client:
        client.wait_ready(timeout_s=30)
        with client.open_session("python") as session:
            assert session.step(tool_calls=RUN).tool_messages[0].content == "Out: 42"
        assert client.replica_of(session.id) is None  # closed: forgotten


def test_make_certs_script_gives_a_working_mtls_setup(docker_ok, tmp_path):
    certs = tmp_path / "certs"
    made = subprocess.run(["bash", str(REPO / "deploy/make_certs.sh"), str(certs), "tito-env.example"],
                          capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    assert "DNS:tito-env.example" in made.stdout
    token = [line for line in (certs / "tokens").read_text().splitlines() if not line.startswith("#")][0]
    tls = TlsOptions(ca_file=certs / "ca.pem", cert_file=certs / "client.pem", key_file=certs / "client.key")
    env = {"TITO_TLS__CERT_FILE": str(certs / "server.pem"), "TITO_TLS__KEY_FILE": str(certs / "server.key"),
           "TITO_TLS__CLIENT_CA_FILE": str(certs / "ca.pem"), "TITO_AUTH__TOKENS_FILE": str(certs / "tokens")}
    srv = start_server(tmp_path, env={**LIGHT, **env}, credentials=tls.credentials())
    try:
        with TitoClient(srv.address, tls=tls, token=token) as client:
            assert "python" in {e.name for e in client.list_environments()}
    finally:
        srv.terminate()


def test_the_trainer_reaches_an_mtls_server_with_a_token_file(mtls_server, pki, tmp_path):
    from trainer.config import load_config
    from trainer.setup import TokenizerInfo, connect_env

    tls = pki.tls(pki.client)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    sets = [f"env.address={mtls_server.address}", f"env.tls_ca_file={tls.ca_file}", f"env.token_file={token_file}",
            f"env.tls_cert_file={tls.cert_file}", f"env.tls_key_file={tls.key_file}"]
    cfg = load_config(None, sets)
    tok = TokenizerInfo.load(cfg)

    async def connect():
        client, registration = await connect_env(cfg, tok)
        await client.close()
        return registration

    reg = asyncio.run(connect())
    assert reg.fingerprint and reg.stop_token_ids
    without_token = load_config(None, sets[:2] + sets[3:])
    with pytest.raises(UnauthenticatedError):
        asyncio.run(connect_env(without_token, tok))
