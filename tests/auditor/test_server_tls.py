"""``run --web-config-file``: /metrics over real TLS, with and without client certificates, certificates reloaded
when their files change, a real Prometheus scraping it with the matching scrape configuration, and every bad
configuration refused by name before the auditor starts."""

from __future__ import annotations

import datetime as dt
import http.client
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from cryptography import x509

from gpu_fence.auditor import cli
from gpu_fence.auditor.metrics import AuditorMetrics
from gpu_fence.auditor.server import Health, serve_http
from gpu_fence.auditor.webconfig import TlsContexts, WebConfigError, load_web_config
from gpu_fence.webhook.certs import KeyPair, new_ca, new_serving_cert
from tests.fakes.client_certs import client_ca, client_identity
from tests.fakes.polling import wait_for
from tests.fakes.prometheus import PrometheusServer

NAME = "gpu-fence-auditor.gpu-fence.svc"


def write_serving(directory: Path, ca: KeyPair) -> None:
    pair = new_serving_cert(ca, [NAME], now=dt.datetime.now(dt.UTC), days=1)
    (directory / "tls.crt").write_bytes(pair.cert_pem)
    (directory / "tls.key").write_bytes(pair.key_pem)


@pytest.fixture
def pki(tmp_path: Path) -> dict:
    server_ca = new_ca(common_name="auditor-ca", now=dt.datetime.now(dt.UTC), days=2)
    (tmp_path / "ca.crt").write_bytes(server_ca.cert_pem)
    write_serving(tmp_path, server_ca)
    scrapers = client_ca("scraper-ca")
    (tmp_path / "client-ca.crt").write_bytes(scrapers.cert_pem)
    return {
        "server_ca": server_ca,
        "scraper": client_identity(scrapers, "prometheus", tmp_path / "clients"),
        "stranger": client_identity(client_ca("other-ca"), "stranger", tmp_path / "strangers"),
    }


def web_config(directory: Path, **tls: str) -> Path:
    path = directory / "web.yaml"
    # relative names: read from the configuration file's own directory, as the exporter-toolkit does
    path.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key", **tls}}))
    return path


@contextmanager
def auditor_server(config: Path) -> Iterator[int]:
    metrics = AuditorMetrics("gpu-node-1")
    server = serve_http("127.0.0.1", 0, metrics, Health(30, 3), TlsContexts(load_web_config(config)))
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def get(port: int, path: str, context: ssl.SSLContext) -> tuple[int, bytes, int]:
    """(status, body, serial of the server's certificate) over TLS, verifying the server for its Service name."""
    connection = http.client.HTTPSConnection(NAME, port, context=context, timeout=10)
    connection.sock = context.wrap_socket(socket.create_connection(("127.0.0.1", port), 10), server_hostname=NAME)
    serial = x509.load_der_x509_certificate(connection.sock.getpeercert(binary_form=True)).serial_number
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read(), serial
    finally:
        connection.close()


def trusting(tmp_path: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))


def test_metrics_over_tls_and_plain_http_refused(tmp_path: Path, pki: dict) -> None:
    with auditor_server(web_config(tmp_path)) as port:
        status, body, _ = get(port, "/metrics", trusting(tmp_path))
        assert status == 200 and b"gpu_fence_audit_cycle_failures_total" in body
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError, http.client.BadStatusLine)):
            plain.request("GET", "/metrics")
            plain.getresponse()


def test_client_certificates_required_for_metrics_not_for_the_kubelets_probe(tmp_path: Path, pki: dict) -> None:
    config = web_config(tmp_path, client_ca_file="client-ca.crt", client_auth_type="RequireAndVerifyClientCert")
    with auditor_server(config) as port:
        anonymous = trusting(tmp_path)
        assert get(port, "/metrics", anonymous)[0] == 403
        assert get(port, "/healthz", anonymous)[0] == 200, "the kubelet's HTTPS probe presents no certificate"
        status, body, _ = get(port, "/metrics", pki["scraper"].context(tmp_path / "ca.crt"))
        assert status == 200 and b"gpu_fence_audit_kubelet_calls_total" in body
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            get(port, "/metrics", pki["stranger"].context(tmp_path / "ca.crt"))
        # the server goes on serving after the refused handshake
        assert get(port, "/metrics", pki["scraper"].context(tmp_path / "ca.crt"))[0] == 200


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path: Path, pki: dict) -> None:
    with auditor_server(web_config(tmp_path)) as port:
        _, _, before = get(port, "/metrics", trusting(tmp_path))
        write_serving(tmp_path, pki["server_ca"])
        _, _, after = get(port, "/metrics", trusting(tmp_path))
        assert after != before
        assert after == x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes()).serial_number
        # a half-written renewal keeps the last good certificate
        (tmp_path / "tls.key").write_text("not a key")
        status, _, kept = get(port, "/metrics", trusting(tmp_path))
        assert (status, kept) == (200, after)


@pytest.mark.e2e
def test_prometheus_scrapes_it_with_the_matching_scrape_config(tmp_path: Path, pki: dict) -> None:
    config = web_config(tmp_path, client_ca_file="client-ca.crt", client_auth_type="RequireAndVerifyClientCert")
    with auditor_server(config) as port:
        job = {
            "job_name": "gpu-fence-auditor",
            "scheme": "https",
            "scrape_interval": "1s",
            "scrape_timeout": "1s",
            "tls_config": {
                "ca_file": str(tmp_path / "ca.crt"),
                "server_name": NAME,
                "cert_file": str(pki["scraper"].cert_file),
                "key_file": str(pki["scraper"].key_file),
            },
            "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
        }
        with PrometheusServer(tmp_path / "prometheus", scrape_configs=[job]) as prometheus:
            wait_for(
                lambda: prometheus.query('gpu_fence_audit_kubelet_calls_total{job="gpu-fence-auditor",method="List"}'),
                "Prometheus to scrape the auditor over TLS with its client certificate",
                timeout=60,
                interval=0.1,
            )
            [up] = prometheus.query('up{job="gpu-fence-auditor"}')
            assert up["value"][1] == "1"


@pytest.mark.parametrize(
    ("document", "says"),
    [
        (
            {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}, "basic_auth_users": {"a": "$2y$"}},
            "only tls_server_config is supported",
        ),
        (
            {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key", "cipher_suites": []}},
            "not supported: cipher_suites",
        ),
        ({"tls_server_config": {"cert_file": "tls.crt"}}, "needs key_file"),
        (
            {
                "tls_server_config": {
                    "cert_file": "tls.crt",
                    "key_file": "tls.key",
                    "client_auth_type": "RequireAnyClientCert",
                    "client_ca_file": "client-ca.crt",
                }
            },
            "is not one of",
        ),
        (
            {
                "tls_server_config": {
                    "cert_file": "tls.crt",
                    "key_file": "tls.key",
                    "client_auth_type": "RequireAndVerifyClientCert",
                }
            },
            "needs client_ca_file",
        ),
        ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "tls.key"}}, "cannot load the TLS files"),
        ({"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key", "min_version": "TLS10"}}, "min_version"),
        ("[not, a, mapping]", "only tls_server_config"),
    ],
)
def test_a_bad_configuration_is_refused_by_name(tmp_path: Path, pki: dict, document: object, says: str) -> None:
    path = tmp_path / "web.yaml"
    path.write_text(document if isinstance(document, str) else yaml.safe_dump(document))
    with pytest.raises(WebConfigError, match=says):
        load_web_config(path)


def test_run_exits_2_with_the_reason_before_touching_the_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "web.yaml"
    path.write_text(yaml.safe_dump({"tls_server_config": {"cert_file": "a", "key_file": "b"}, "rate_limit": {}}))
    assert cli.main(["run", "--web-config-file", str(path), "--no-kubernetes"]) == 2
    err = capsys.readouterr().err
    assert "--web-config-file" in err and "only tls_server_config is supported" in err and "Traceback" not in err
