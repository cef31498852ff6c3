"""Prometheus as production runs it: behind TLS and authentication, for the ``--http-config`` tests.

- :func:`pki`: a CA, a server certificate for ``localhost`` (no IP address: clients dialling 127.0.0.1 must set
  ``tls_config.server_name``), a client certificate, and a second CA nobody trusts.
- :func:`web_config`: Prometheus' own ``--web.config.file`` (exporter-toolkit): TLS with that server certificate,
  client certificates verified when given, and basic auth for one user.
- :class:`TenantGateway`: what sits in front of Mimir or a managed Prometheus: HTTPS, a bearer token and an
  ``X-Scope-OrgID`` tenant required on every request (GET, or POST with a form body), forwarded to a plain
  Prometheus. Paths under
  ``/elsewhere/`` answer a redirect to another host (``localhost`` instead of ``127.0.0.1``), where a second
  listener records which headers arrived.
"""

from __future__ import annotations

import datetime as dt
import http.server
import json
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpu_fence.webhook.certs import KeyPair, new_ca, new_serving_cert
from tests.fakes.http_listener import Listener, forward

USER = "finance"
PASSWORD = "s3cret-finance"
# bcrypt (cost 10) of PASSWORD: the only form basic_auth_users accepts. Made once with Python's crypt module
# (METHOD_BLOWFISH); the tests prove it matches, since the right password is let in and a wrong one is not.
PASSWORD_BCRYPT = "$2b$10$mVAqsH3P9nFzhOh0wdCd8eLX27BSU4i1fnc//q0Vkfd1FLZhZQgKS"
TOKEN = "tenant-a-token-7f3c"
TENANT = "tenant-a"


@dataclass(frozen=True)
class Pki:
    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name


def _client_cert(ca: KeyPair, name: str, now: dt.datetime) -> KeyPair:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca.key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def pki(directory: Path) -> Pki:
    """ca.pem, server.pem/server-key.pem (DNS localhost), client.pem/client-key.pem, and the untrusted
    other-ca.pem with other-client.pem/other-client-key.pem signed by it."""
    directory.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca = new_ca(common_name="gpu-fence test CA", now=now, days=2)
    other = new_ca(common_name="someone else's CA", now=now, days=2)
    server = new_serving_cert(ca, ["localhost"], now=now, days=1)
    pairs = {
        "ca": ca,
        "other-ca": other,
        "server": server,
        "client": _client_cert(ca, "chargeback", now),
        "other-client": _client_cert(other, "chargeback", now),
    }
    for name, pair in pairs.items():
        (directory / f"{name}.pem").write_bytes(pair.cert_pem)
        (directory / f"{name}-key.pem").write_bytes(pair.key_pem)
    return Pki(directory)


def web_config(keys: Pki) -> dict:
    return {
        "tls_server_config": {
            "cert_file": str(keys.path("server.pem")),
            "key_file": str(keys.path("server-key.pem")),
            "client_auth_type": "VerifyClientCertIfGiven",
            "client_ca_file": str(keys.path("ca.pem")),
        },
        "basic_auth_users": {USER: PASSWORD_BCRYPT},
    }


def _server_context(keys: Pki) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(keys.path("server.pem"), keys.path("server-key.pem"))
    return context


@dataclass
class TenantGateway:
    url: str  # https://127.0.0.1:PORT
    seen_elsewhere: list[dict[str, str]]  # headers of every request the other host received


@contextmanager
def tenant_gateway(upstream: str, keys: Pki) -> Iterator[TenantGateway]:
    seen: list[dict[str, str]] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(dict(self.headers.items()))
            _answer(self, 401, {"status": "error", "error": "who are you?"})

        def log_message(self, *args: object) -> None:
            pass

    with Listener(Elsewhere, _server_context(keys)) as elsewhere:

        class Gateway(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.do_GET(self.rfile.read(int(self.headers.get("Content-Length") or 0)))

            def do_GET(self, form: bytes | None = None) -> None:
                if self.path.startswith("/elsewhere/"):
                    target = f"https://localhost:{elsewhere.port}/{self.path.removeprefix('/elsewhere/')}"
                    self.send_response(302)
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    _answer(self, 401, {"status": "error", "error": "authentication required"})
                    return
                if self.headers.get("X-Scope-OrgID") != TENANT:
                    _answer(self, 401, {"status": "error", "error": "no org id"})
                    return
                forward(self, upstream, form)

            def log_message(self, *args: object) -> None:
                pass

        with Listener(Gateway, _server_context(keys)) as gateway:
            yield TenantGateway(f"https://127.0.0.1:{gateway.port}", seen)


def _answer(handler: http.server.BaseHTTPRequestHandler, status: int, document: dict) -> None:
    body = json.dumps(document).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
