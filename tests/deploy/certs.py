"""Real X.509 certificates for TLS tests, made with `cryptography` (no openssl subprocess)."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _builder(subject: str, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer).public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1)))


class CertAuthority:
    """A CA that writes itself and the certificates it issues as PEM files under `folder`."""

    def __init__(self, folder: Path, name: str) -> None:
        self.folder, self.name = folder, name
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        cert = (_builder(name, self.subject, self.key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False, data_encipherment=False,
                                             key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
                .sign(self.key, hashes.SHA256()))
        self.cert = folder / f"{name}.pem"
        self.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, *, server: bool) -> Issued:
        """A leaf certificate: a server one for localhost and 127.0.0.1, or a client one."""
        key = ec.generate_private_key(ec.SECP256R1())
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (_builder(name, self.subject, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([usage]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        issued = Issued(self.folder / f"{name}.pem", self.folder / f"{name}.key")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(_key_pem(key))
        issued.key.chmod(0o600)
        return issued
