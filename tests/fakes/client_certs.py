"""Client certificates as the API server presents them to webhooks (``extendedKeyUsage: clientAuth``), signed by a
CA from ``gpu-fence-webhook certs``'s own ``new_ca``, written where a TLS client context can load them."""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_fence.webhook.certs import KeyPair, new_ca


@dataclass(frozen=True)
class ClientIdentity:
    ca: KeyPair
    cert_file: Path
    key_file: Path

    def context(self, server_ca_file: Path) -> ssl.SSLContext:
        """A client context that trusts the server's CA and presents this certificate."""
        context = ssl.create_default_context(cafile=str(server_ca_file))
        context.load_cert_chain(str(self.cert_file), str(self.key_file))
        return context


def client_ca(common_name: str = "apiserver-client-ca") -> KeyPair:
    return new_ca(common_name=common_name, now=dt.datetime.now(dt.UTC), days=2)


def client_identity(ca: KeyPair, common_name: str, directory: Path) -> ClientIdentity:
    """A client certificate for ``common_name`` signed by ``ca``, its PEM files in ``directory``."""
    now = dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    cert_file, key_file = directory / f"{common_name}.crt", directory / f"{common_name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ClientIdentity(ca, cert_file, key_file)
