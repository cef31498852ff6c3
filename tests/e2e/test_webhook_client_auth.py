"""``serve --client-ca-file`` over real TLS: reviews only for the API server's client certificate; health, readiness
and metrics for anyone (the kubelet's probes present no certificate); the client CA reloaded like the serving
certificate.

Clients: none (no certificate), one with a certificate from another CA, one from the client CA but with another
CN, and the API server's (client CA, CN ``kube-apiserver``).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.webhook.reasons import BadRequestReason, DropReason
from tests.fakes.client_certs import ClientIdentity, client_ca, client_identity
from tests.fakes.polling import in_a_row, wait_for
from tests.fakes.webhook_server import Reply, Server, send, serving

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parents[1] / "webhook" / "admissionreviews"
API_SERVER_CN = "kube-apiserver"


def review() -> bytes:
    document = json.loads((FIXTURES / "pod-create-kubectl.json").read_text())
    document["request"]["uid"] = str(uuid.uuid4())
    return json.dumps(document).encode()


@dataclass
class Setup:
    server: Server
    ca_file: Path
    api_server: ClientIdentity
    other_cn: ClientIdentity
    other_ca: ClientIdentity
    clients: Path


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Iterator[Setup]:
    tmp = tmp_path_factory.mktemp("client-auth")
    clients = tmp / "clients"
    ca = client_ca()
    ca_file = tmp / "client-ca.crt"
    ca_file.write_bytes(ca.cert_pem)
    api_server = client_identity(ca, API_SERVER_CN, clients)
    other_cn = client_identity(ca, "system:node:worker-1", clients)
    other_ca = client_identity(client_ca("someone-elses-ca"), API_SERVER_CN, clients / "other")
    with serving(tmp, "--client-ca-file", str(ca_file), "--client-cn", API_SERVER_CN) as server:
        yield Setup(server, ca_file, api_server, other_cn, other_ca, clients)


def call(setup: Setup, identity: ClientIdentity | None, method: str, path: str, body: bytes | None = None) -> Reply:
    context = identity.context(setup.server.tls_dir / "ca.crt") if identity else setup.server.context
    conn = setup.server.connect(context)
    try:
        return send(conn, method, path, body)
    finally:
        conn.close()


def counter(setup: Setup, name: str, reason: str) -> float:
    text = call(setup, None, "GET", "/metrics").document["text"]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == {"reason": reason}:
                return sample.value
    return 0.0


def test_the_api_servers_certificate_gets_reviews_answered(setup):
    reply = call(setup, setup.api_server, "POST", "/validate", review())
    assert reply.status == 200 and reply.document["response"]["allowed"] is False


def test_a_client_without_a_certificate_gets_health_and_metrics_but_no_review(setup):
    before = counter(setup, "gpu_fence_webhook_bad_requests_total", BadRequestReason.CLIENT_CERTIFICATE_REQUIRED)
    for path in ("/mutate", "/validate", "/validate/warn"):
        reply = call(setup, None, "POST", path, review())
        assert reply.status == 403 and reply.document["error"] == BadRequestReason.CLIENT_CERTIFICATE_REQUIRED, path
        assert "response" not in reply.document  # no AdmissionReview: nothing to forge a denial count with
    assert call(setup, None, "GET", "/healthz").status == 200
    assert call(setup, None, "GET", "/readyz").status == 200
    assert (
        counter(setup, "gpu_fence_webhook_bad_requests_total", BadRequestReason.CLIENT_CERTIFICATE_REQUIRED)
        == before + 3
    )


def test_a_certificate_from_the_client_ca_with_another_cn_is_refused(setup):
    reply = call(setup, setup.other_cn, "POST", "/validate", review())
    assert reply.status == 403 and reply.document["error"] == BadRequestReason.CLIENT_NOT_ALLOWED


def test_a_certificate_from_another_ca_fails_the_handshake_for_every_path(setup):
    before = counter(setup, "gpu_fence_webhook_connections_dropped_total", DropReason.TLS_HANDSHAKE_FAILED)
    for method, path in (("POST", "/validate"), ("GET", "/healthz")):
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            call(setup, setup.other_ca, method, path, review() if method == "POST" else None)
    wait_for(
        lambda: (
            counter(setup, "gpu_fence_webhook_connections_dropped_total", DropReason.TLS_HANDSHAKE_FAILED) >= before + 2
        ),
        "the failed handshakes to be counted",
        timeout=10,
    )


def test_a_new_client_ca_is_taken_up_without_a_restart(setup):
    """Last: it replaces the client CA. The file is swapped atomically, as a mounted Secret or ConfigMap is."""
    renewed = client_ca("renewed-apiserver-client-ca")
    staged = setup.ca_file.with_name(".client-ca.crt.new")
    staged.write_bytes(renewed.cert_pem)
    os.replace(staged, setup.ca_file)
    new_identity = client_identity(renewed, API_SERVER_CN, setup.clients / "renewed")

    def accepted() -> bool:
        try:
            return call(setup, new_identity, "POST", "/validate", review()).status == 200
        except (ssl.SSLError, ConnectionError, http.client.HTTPException):
            return False

    # every worker checks at most once a second: until fresh connections all see the new CA
    wait_for(in_a_row(accepted, 6), "every worker to take up the new client CA", timeout=20)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
        call(setup, setup.api_server, "POST", "/validate", review())  # signed by the CA that was replaced


def test_the_install_guides_certificates_get_reviews_answered(tmp_path):
    """docs/install.md's openssl commands, run as written, make a CA and a certificate that serve accepts."""
    text = (Path(__file__).parents[2] / "docs" / "install.md").read_text(encoding="utf-8")
    block = re.search(r"A CA used for nothing else.*?```sh\n(.*?)```", text, re.S)
    assert block, "the openssl commands of docs/install.md, step 5"
    subprocess.run(
        ["bash", "-euo", "pipefail", "-c", textwrap.dedent(block.group(1))],
        cwd=tmp_path,
        check=True,
        capture_output=True,
        timeout=60,
    )
    (tmp_path / "serve").mkdir()
    ca_file = tmp_path / "apiserver-client-ca.crt"
    with serving(tmp_path / "serve", "--client-ca-file", str(ca_file), "--client-cn", API_SERVER_CN) as server:
        context = ssl.create_default_context(cafile=str(server.tls_dir / "ca.crt"))
        context.load_cert_chain(
            str(tmp_path / "apiserver-webhook-client.crt"), str(tmp_path / "apiserver-webhook-client.key")
        )
        conn = server.connect(context)
        try:
            reply = send(conn, "POST", "/validate", review())
        finally:
            conn.close()
        assert reply.status == 200 and reply.document["response"]["allowed"] is False
        assert server.post("/validate", review()).document["error"] == BadRequestReason.CLIENT_CERTIFICATE_REQUIRED
