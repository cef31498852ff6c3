"""``--http-config FILE`` against Prometheus as production runs it: TLS and basic auth from Prometheus' own
``--web.config.file``, client certificates, and a tenant gateway that wants a bearer token and ``X-Scope-OrgID``.
Right credentials give the same bill as the unprotected Prometheus holding the same series; wrong ones, one line
that names the 401 or the TLS failure, and never the secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.fakes.chargeback_scenarios import run_chargeback, scenarios, window_args
from tests.fakes.prometheus import PrometheusServer
from tests.fakes.protected_prometheus import PASSWORD, TENANT, TOKEN, USER, pki, tenant_gateway, web_config

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    return pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def protected(prometheus, keys, tmp_path_factory: pytest.TempPathFactory):
    """The same scenarios as the session's plain Prometheus, and what its recording rules recorded, served over TLS
    with basic auth."""
    server = PrometheusServer(
        tmp_path_factory.mktemp("protected"),
        openmetrics=scenarios(),
        blocks=prometheus.recorded_blocks,
        web_config=web_config(keys),
        ca_file=keys.path("ca.pem"),
        basic_auth=(USER, PASSWORD),
    )
    with server:
        yield server


@pytest.fixture(scope="module")
def gateway(prometheus, keys):
    with tenant_gateway(prometheus.url, keys) as running:
        yield running


def write_config(directory: Path, document: dict, name: str = "http.yaml") -> Path:
    path = directory / name
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def bill(url: str, prices_file: Path, window: str, *extra: str):
    return run_chargeback(
        "--prometheus", url, *window_args(window), "--prices", str(prices_file), "--format", "json", *extra
    )


def comparable(result) -> dict:
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    del document["generated_at"], document["source"]
    return document


def one_line(result, *fragments: str, secret: str | None = None) -> str:
    assert result.code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("gpu-fence-auditor chargeback: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    if secret:
        assert secret not in result.stderr
    return lines[0]


@pytest.fixture
def tls_basic(keys, tmp_path: Path) -> dict:
    """CA and basic auth with the password in a file beside the config, named relative to it (as Prometheus does)."""
    (tmp_path / "password").write_text(PASSWORD + "\n", encoding="utf-8")  # trailing whitespace is trimmed
    return {
        "basic_auth": {"username": USER, "password_file": "password"},
        "tls_config": {"ca_file": str(keys.path("ca.pem")), "server_name": "localhost"},
    }


@pytest.mark.parametrize("window", ["exclusive", "mig-idle", "replicas"])
def test_tls_and_basic_auth_give_the_same_bill(prometheus, protected, prices_file, tmp_path, tls_basic, window):  # noqa: PLR0917
    config = write_config(tmp_path, tls_basic)
    assert protected.url.startswith("https://")
    expected = comparable(bill(prometheus.url, prices_file, window))
    assert comparable(bill(protected.url, prices_file, window, "--http-config", str(config))) == expected


def test_a_trusted_client_certificate_is_accepted_and_another_cas_is_refused(
    protected, prices_file, tmp_path, keys, tls_basic
):
    tls_basic["tls_config"].update(cert_file=str(keys.path("client.pem")), key_file=str(keys.path("client-key.pem")))
    assert (
        bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic))).code == 0
    )
    tls_basic["tls_config"].update(
        cert_file=str(keys.path("other-client.pem")), key_file=str(keys.path("other-client-key.pem"))
    )
    result = bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic)))
    one_line(result, "TLS with Prometheus at", protected.url, "client certificate")


def test_inline_pem_in_the_config_works_like_files(protected, prices_file, tmp_path, keys, tls_basic):
    tls_basic["tls_config"] = {
        "ca": keys.path("ca.pem").read_text(),
        "cert": keys.path("client.pem").read_text(),
        "key": keys.path("client-key.pem").read_text(),
        "server_name": "localhost",
    }
    assert (
        bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic))).code == 0
    )


def test_wrong_password_is_a_401_line_without_the_password(protected, prices_file, tmp_path, tls_basic):
    (tmp_path / "password").write_text("not-the-password", encoding="utf-8")
    result = bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic)))
    line = one_line(
        result, "answered HTTP 401 Unauthorized", "check the credentials in --http-config", secret="not-the-password"
    )
    assert PASSWORD not in line


def test_no_credentials_is_a_401_line_that_says_how_to_send_them(protected, prices_file, tmp_path, tls_basic):
    del tls_basic["basic_auth"]
    result = bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic)))
    one_line(result, "HTTP 401", "sends no credentials", "basic_auth or authorization")


def test_an_untrusted_server_is_a_tls_line(protected, prices_file, tmp_path, keys, tls_basic):
    for tls in ({}, {"ca_file": str(keys.path("other-ca.pem")), "server_name": "localhost"}):
        tls_basic["tls_config"] = tls
        result = bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic)))
        one_line(result, "TLS with Prometheus at", "certificate verify failed", "tls_config.ca_file", secret=PASSWORD)
    # No --http-config at all: the system's trust store does not know the test CA either.
    one_line(bill(protected.url, prices_file, "exclusive"), "certificate verify failed", "--http-config FILE")


def test_the_server_name_must_match_unless_verification_is_off(protected, prices_file, tmp_path, keys, tls_basic):
    del tls_basic["tls_config"]["server_name"]  # the certificate names localhost; the URL says 127.0.0.1
    result = bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic)))
    one_line(result, "certificate verify failed", "127.0.0.1", "tls_config.server_name")
    tls_basic["tls_config"] = {"insecure_skip_verify": True}
    assert (
        bill(protected.url, prices_file, "exclusive", "--http-config", str(write_config(tmp_path, tls_basic))).code == 0
    )


def test_plain_http_to_a_tls_prometheus_says_so(protected, prices_file):
    result = bill(protected.url.replace("https://", "http://"), prices_file, "exclusive")
    one_line(result, "HTTP 400")


def gateway_config(keys: Path, token_file: Path, **extra) -> dict:
    return {
        "authorization": {"credentials_file": str(token_file)},
        "http_headers": {"X-Scope-OrgID": {"values": [TENANT]}},
        "tls_config": {"ca_file": str(keys), "server_name": "localhost"},
        **extra,
    }


def test_bearer_token_and_tenant_header_give_the_same_bill(prometheus, gateway, prices_file, tmp_path, keys):
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n", encoding="utf-8")
    config = write_config(tmp_path, gateway_config(keys.path("ca.pem"), token))
    expected = comparable(bill(prometheus.url, prices_file, "timeslice"))
    assert comparable(bill(gateway.url, prices_file, "timeslice", "--http-config", str(config))) == expected
    # The deprecated bearer_token_file of older Prometheus configs means the same.
    legacy = gateway_config(keys.path("ca.pem"), token)
    del legacy["authorization"]
    legacy["bearer_token_file"] = str(token)
    config = write_config(tmp_path, legacy, "legacy.yaml")
    assert comparable(bill(gateway.url, prices_file, "timeslice", "--http-config", str(config))) == expected


def test_wrong_token_or_missing_tenant_is_a_401_line(gateway, prices_file, tmp_path, keys):
    token = tmp_path / "token"
    token.write_text("stolen-token", encoding="utf-8")
    config = write_config(tmp_path, gateway_config(keys.path("ca.pem"), token))
    one_line(
        bill(gateway.url, prices_file, "timeslice", "--http-config", str(config)), "HTTP 401", secret="stolen-token"
    )
    token.write_text(TOKEN, encoding="utf-8")
    no_tenant = gateway_config(keys.path("ca.pem"), token)
    del no_tenant["http_headers"]
    config = write_config(tmp_path, no_tenant)
    one_line(bill(gateway.url, prices_file, "timeslice", "--http-config", str(config)), "HTTP 401", secret=TOKEN)


def test_credentials_never_follow_a_redirect_to_another_host(gateway, prices_file, tmp_path, keys):
    token = tmp_path / "token"
    token.write_text(TOKEN, encoding="utf-8")
    config = write_config(tmp_path, gateway_config(keys.path("ca.pem"), token))
    result = bill(f"{gateway.url}/elsewhere", prices_file, "timeslice", "--http-config", str(config))
    one_line(result, "HTTP 401")  # the other host refuses a request without credentials
    assert gateway.seen_elsewhere, "the redirect was not followed"
    for received in gateway.seen_elsewhere:
        headers = {name.lower(): value for name, value in received.items()}
        assert "authorization" not in headers and TOKEN not in json.dumps(headers)
        assert headers.get("x-scope-orgid") == TENANT  # plain values are not secrets and do follow
    seen = len(gateway.seen_elsewhere)
    config = write_config(tmp_path, gateway_config(keys.path("ca.pem"), token, follow_redirects=False))
    result = bill(f"{gateway.url}/elsewhere", prices_file, "timeslice", "--http-config", str(config))
    one_line(result, "HTTP 302", "not followed", "follow_redirects: false")
    assert len(gateway.seen_elsewhere) == seen


def test_a_client_certificate_and_key_that_do_not_match_are_refused_at_start(keys, prices_file, tmp_path):
    config = {"tls_config": {"cert_file": str(keys.path("server.pem")), "key_file": str(keys.path("client-key.pem"))}}
    result = bill("https://127.0.0.1:9", prices_file, "exclusive", "--http-config", str(write_config(tmp_path, config)))
    one_line(result, "do not load as a PEM pair")
