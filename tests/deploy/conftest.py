"""Certificates and tokens for the deployment tests: one server CA, one client CA, and a rogue CA
that nobody trusts."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from tests.deploy.certs import CertAuthority, Issued
from tito.client import TlsOptions

TOKEN = "test-token-4c1f9e0b7a2d4e6f8a9b"


@dataclass(frozen=True)
class Pki:
    folder: Path
    server_ca: CertAuthority
    server: Issued
    client_ca: CertAuthority
    client: Issued
    rogue_client: Issued  # a client certificate from a CA the server does not trust
    tokens_file: Path

    def tls(self, client: Issued | None = None) -> TlsOptions:
        return TlsOptions(ca_file=self.server_ca.cert, cert_file=client.cert if client else None,
                          key_file=client.key if client else None)

    def server_env(self, mtls: bool = False, tokens: bool = True) -> dict[str, str]:
        env = {"TITO_TLS__CERT_FILE": str(self.server.cert), "TITO_TLS__KEY_FILE": str(self.server.key)}
        if mtls:
            env["TITO_TLS__CLIENT_CA_FILE"] = str(self.client_ca.cert)
        if tokens:
            env["TITO_AUTH__TOKENS_FILE"] = str(self.tokens_file)
        return env

    def harness_credentials(self, client: Issued | None = None) -> grpc.ChannelCredentials:
        """What the harness connects with (its health checks need no token)."""
        return self.tls(client).credentials()


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    folder = tmp_path_factory.mktemp("pki")
    server_ca = CertAuthority(folder, "server-ca")
    client_ca = CertAuthority(folder, "client-ca")
    rogue_ca = CertAuthority(folder, "rogue-ca")
    tokens = folder / "tokens"
    tokens.write_text(f"# tokens of the test clients\n\n{TOKEN}\n  another-token-0123456789abcdef  \n")
    return Pki(folder, server_ca, server_ca.issue("server", server=True), client_ca,
               client_ca.issue("client", server=False), rogue_ca.issue("rogue", server=False), tokens)
