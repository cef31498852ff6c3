"""``certs``: generation (files) and the in-cluster reconcile through the real kubernetes client against a fake API."""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import socket
import ssl
import stat
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpu_fence.logs import JsonLinesFormatter
from gpu_fence.webhook import cli
from gpu_fence.webhook.certs import (
    CertsError,
    KeyPair,
    WebhookRef,
    connect,
    load_bundle,
    new_ca,
    new_serving_cert,
    parse_webhook_ref,
    reconcile,
    service_dns_names,
    serving_is_good,
)
from gpu_fence.webhook.serving import CertificateStore, ServeError
from tests.fakes.kubeapi_webhooks import FakeKubeApi, FakeKubeApiServer
from tests.fakes.polling import wait_for

NAMES = service_dns_names("gpu-fence-webhook", "gpu-fence")
NOW = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def test_certs_out_dir_writes_a_verifiable_chain_with_private_keys(tmp_path):
    out = tmp_path / "tls"
    code = cli.main(
        ["certs", "--service", "gpu-fence-webhook", "--namespace", "gpu-fence", "--out-dir", str(out), "--days", "10"]
    )
    assert code == 0
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert stat.S_IMODE((out / "tls.key").stat().st_mode) == 0o600
    leaf = x509.load_pem_x509_certificate((out / "tls.crt").read_bytes())
    ca = x509.load_pem_x509_certificate((out / "ca.crt").read_bytes())
    leaf.verify_directly_issued_by(ca)
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert sans == [
        "gpu-fence-webhook",
        "gpu-fence-webhook.gpu-fence",
        "gpu-fence-webhook.gpu-fence.svc",
        "gpu-fence-webhook.gpu-fence.svc.cluster.local",
    ]
    assert leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage(
        [ExtendedKeyUsageOID.SERVER_AUTH]
    )
    # both keys only sign; only the CA signs certificates (and CRLs); both usages critical
    for cert, signs_certificates in ((ca, True), (leaf, False)):
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage)
        assert usage.critical and usage.value.digital_signature and not usage.value.key_encipherment
        assert usage.value.key_cert_sign is usage.value.crl_sign is signs_certificates
    assert dt.timedelta(days=9) < leaf.not_valid_after_utc - leaf.not_valid_before_utc <= dt.timedelta(days=10, hours=1)
    # what an API server does: verify the chain and the Service name with a stock TLS stack
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(out / "tls.crt", out / "tls.key")
    client = ssl.create_default_context(cafile=str(out / "ca.crt"))
    assert client.verify_mode == ssl.CERT_REQUIRED


def test_leaf_never_outlives_its_ca():
    ca = new_ca(common_name="ca", now=NOW, days=5)
    leaf = new_serving_cert(ca, NAMES, now=NOW, days=365)
    assert leaf.cert.not_valid_after_utc == ca.cert.not_valid_after_utc


def test_serving_is_good_checks_names_issuer_key_and_lifetime():
    ca = new_ca(common_name="ca", now=NOW, days=100)
    leaf = new_serving_cert(ca, NAMES, now=NOW, days=60)
    renew = dt.timedelta(days=30)
    assert serving_is_good(leaf, ca, NAMES, now=NOW, renew_before=renew)
    assert not serving_is_good(leaf, ca, NAMES, now=NOW + 31 * DAY, renew_before=renew)
    assert not serving_is_good(leaf, ca, (*NAMES, "other.svc"), now=NOW, renew_before=renew)
    other_ca = new_ca(common_name="ca", now=NOW, days=100)
    assert not serving_is_good(leaf, other_ca, NAMES, now=NOW, renew_before=renew)
    other_key = new_serving_cert(ca, NAMES, now=NOW, days=60).key_pem
    assert not serving_is_good(KeyPair(leaf.cert_pem, other_key), ca, NAMES, now=NOW, renew_before=renew)
    assert not serving_is_good(KeyPair(b"garbage", b"garbage"), ca, NAMES, now=NOW, renew_before=renew)


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        ("gpu-fence", WebhookRef("", "gpu-fence")),
        ("mutating/gpu-fence", WebhookRef("mutating", "gpu-fence")),
        ("ValidatingWebhookConfiguration/x", WebhookRef("validating", "x")),
    ],
)
def test_webhook_refs(text, ref):
    assert parse_webhook_ref(text) == ref


@pytest.mark.parametrize("text", ["", "/x", "deployment/x", "mutating/"])
def test_bad_webhook_refs_name_the_accepted_forms(text):
    with pytest.raises(CertsError, match="mutating/NAME"):
        parse_webhook_ref(text)


# -- in-cluster mode: the real kubernetes client against the fake API ------------------------------------------


@pytest.fixture
def fake(tmp_path):
    api = FakeKubeApi()
    api.add_webhooks("mutating", "gpu-fence", ["pin.gpu-fence.io"])
    api.add_webhooks("validating", "gpu-fence", ["enforce.gpu-fence.io", "warn.gpu-fence.io"])
    with FakeKubeApiServer(api) as server:
        server.kubeconfig_path = server.kubeconfig(tmp_path)
        yield server


#: the fake's two configurations named ``gpu-fence``, whatever their kind, and what patching their caBundles reports
BOTH_KINDS = (WebhookRef("", "gpu-fence"),)
PATCHED_BOTH = ("patched mutating/gpu-fence", "patched validating/gpu-fence")


def run_reconcile(
    server: FakeKubeApiServer, now: dt.datetime, *, webhook_refs: Sequence[WebhookRef] = BOTH_KINDS, **kwargs
) -> list[str]:
    return reconcile(
        connect(str(server.kubeconfig_path)),
        namespace="gpu-fence",
        secret_name="webhook-tls",
        webhook_refs=webhook_refs,
        dns_names=NAMES,
        now=now,
        days=90,
        ca_days=365,
        **kwargs,
    )


def stored(api: FakeKubeApi) -> dict[str, bytes]:
    secret = api.secrets[("gpu-fence", "webhook-tls")]
    assert secret["type"] == "kubernetes.io/tls"
    return {key: base64.b64decode(value) for key, value in secret["data"].items()}


def ca_bundles(api: FakeKubeApi) -> list[bytes]:
    return [
        base64.b64decode(hook["clientConfig"]["caBundle"])
        for configuration in api.webhooks.values()
        for hook in configuration["webhooks"]
    ]


def test_first_run_publishes_the_ca_then_creates_the_secret(fake):
    assert run_reconcile(fake, NOW) == ["ca-created", *PATCHED_BOTH, "serving-cert-issued"]
    data = stored(fake.api)
    assert set(data) == {"ca.crt", "ca.key", "tls.crt", "tls.key"}
    assert ca_bundles(fake.api) == [data["ca.crt"]] * 3
    leaf = x509.load_pem_x509_certificate(data["tls.crt"])
    leaf.verify_directly_issued_by(load_bundle(data["ca.crt"])[0])
    writes = fake.api.writes()
    assert [method for method, _ in writes] == ["PATCH", "PATCH", "POST"]  # caBundle before the Secret


def test_a_rerun_with_valid_certificates_writes_nothing(fake):
    run_reconcile(fake, NOW)
    before = len(fake.api.writes())
    assert run_reconcile(fake, NOW + 10 * DAY) == []
    assert len(fake.api.writes()) == before


def test_serving_cert_renews_within_renew_before_keeping_the_ca(fake):
    run_reconcile(fake, NOW)
    first = stored(fake.api)
    assert run_reconcile(fake, NOW + 61 * DAY, renew_before=30 * DAY) == ["serving-cert-issued"]
    second = stored(fake.api)
    assert second["ca.crt"] == first["ca.crt"] and second["ca.key"] == first["ca.key"]
    assert second["tls.crt"] != first["tls.crt"]


def test_ca_rotation_publishes_old_and_new_ca_before_the_new_leaf(fake):
    run_reconcile(fake, NOW)
    old = stored(fake.api)
    old_ca = load_bundle(old["ca.crt"])[0]
    fake.api.log.clear()
    later = NOW + 340 * DAY  # the CA (365 d) expires within 30 d
    assert run_reconcile(fake, later) == ["ca-rotated", *PATCHED_BOTH, "serving-cert-issued"]
    new = stored(fake.api)
    bundle = load_bundle(new["ca.crt"])
    assert len(bundle) == 2 and bundle[1] == old_ca  # old CA kept while valid: old replicas stay trusted
    assert all(b == new["ca.crt"] for b in ca_bundles(fake.api))
    x509.load_pem_x509_certificate(new["tls.crt"]).verify_directly_issued_by(bundle[0])
    # order: store the new CA (old leaf kept), publish the bundle, then the leaf signed by the new CA
    assert [m for m, _ in fake.api.writes()] == ["PUT", "PATCH", "PATCH", "PUT"]
    # once the old CA has expired it is pruned from the bundle
    assert "expired-ca-pruned" in run_reconcile(fake, NOW + 366 * DAY)
    assert len(load_bundle(stored(fake.api)["ca.crt"])) == 1


def test_kind_qualified_refs_patch_only_that_kind(fake):
    run_reconcile(fake, NOW, webhook_refs=[WebhookRef("validating", "gpu-fence")])
    assert "caBundle" not in fake.api.webhooks[("mutating", "gpu-fence")]["webhooks"][0]["clientConfig"]
    assert "caBundle" in fake.api.webhooks[("validating", "gpu-fence")]["webhooks"][1]["clientConfig"]


def test_missing_webhook_configuration_is_a_clear_error_before_any_write(fake):
    with pytest.raises(CertsError, match="no mutatingwebhookconfiguration or validatingwebhookconfiguration named"):
        run_reconcile(fake, NOW, webhook_refs=[WebhookRef("", "nope")])
    assert fake.api.writes() == []


def test_api_errors_become_one_line_hints(fake):
    fake.api.failures[("GET", r"/secrets/")] = 403
    with pytest.raises(CertsError, match=r"read Secret gpu-fence/webhook-tls: HTTP 403 .*grant the service account"):
        run_reconcile(fake, NOW)


def test_concurrent_change_is_a_conflict_not_a_lost_update(fake):
    run_reconcile(fake, NOW)
    fake.api.failures[("PUT", r"/secrets/webhook-tls")] = 409
    with pytest.raises(CertsError, match=r"409.*run again"):
        run_reconcile(fake, NOW + 61 * DAY)


def test_cli_in_cluster_mode_end_to_end(fake, capsys):
    args = [
        "certs",
        "--service",
        "gpu-fence-webhook",
        "--namespace",
        "gpu-fence",
        "--secret",
        "webhook-tls",
        "--patch-webhooks",
        "mutating/gpu-fence",
        "validating/gpu-fence",
        "--kubeconfig",
        str(fake.kubeconfig_path),
    ]
    assert cli.main(args) == 0
    assert "serving-cert-issued" in capsys.readouterr().out
    assert cli.main(args) == 0
    assert "up to date, no change" in capsys.readouterr().out


def test_cli_in_cluster_mode_finds_the_kubeconfig_as_every_command_does(fake, capsys, monkeypatch):
    """No --kubeconfig: $KUBECONFIG, as ``check --cluster`` and the auditor read it (``gpu_fence.kubeconfig``)."""
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig_path))
    args = ["certs", "--service", "gpu-fence-webhook", "--namespace", "gpu-fence", "--secret", "webhook-tls"]
    assert cli.main([*args, "--patch-webhooks", "gpu-fence"]) == 0
    assert "serving-cert-issued" in capsys.readouterr().out


#: What every ``certs`` run names: the Service and its namespace.
SERVICE_ARGS = ("certs", "--service", "s", "--namespace", "n")


def test_cli_errors_are_one_line_exit_2(tmp_path, capsys):
    assert cli.main([*SERVICE_ARGS, "--secret", "x", "--kubeconfig", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpu-fence-webhook certs: error: no Kubernetes credentials") and err.count("\n") == 1
    assert cli.main([*SERVICE_ARGS, "--out-dir", str(tmp_path), "--days", "30", "--ca-days", "10"]) == 2
    assert "cannot outlive" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert cli.main([*SERVICE_ARGS, "--out-dir", str(blocker / "sub")]) == 2
    assert "cannot write to --out-dir" in capsys.readouterr().err


def test_days_must_be_positive(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "gpu_fence.webhook.cli", *SERVICE_ARGS, "--out-dir", str(tmp_path), "--days", "0"],
        check=False,
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 2
    assert "'0' must be at least 1" in result.stderr


# -- serve's certificate store: reload on change, never on a half-written pair ------------------------------------


def _write_pair(directory: Path, pair: KeyPair) -> None:
    for name, data in (("tls.key", pair.key_pem), ("tls.crt", pair.cert_pem)):
        staging = directory / f".{name}.new"
        staging.write_bytes(data)
        staging.replace(directory / name)


def served_serial(store: CertificateStore, ca: KeyPair) -> int:
    """The serial of the certificate a new connection gets: a real TLS handshake with the store's current context,
    from a client that trusts ``ca`` and checks the Service name."""
    server_end, client_end = socket.socketpair()
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    accepted: list[ssl.SSLSocket] = []
    server = threading.Thread(target=lambda: accepted.append(store.context().wrap_socket(server_end, server_side=True)))
    server.start()
    try:
        with client.wrap_socket(client_end, server_hostname=NAMES[2]) as connection:
            certificate = connection.getpeercert(binary_form=True)
    finally:
        server.join(timeout=10)
        for end in (*accepted, server_end):
            end.close()
    assert certificate is not None
    return x509.load_der_x509_certificate(certificate).serial_number


def test_a_store_loaded_before_its_reader_reports_the_loaded_certificate_then_each_reload(tmp_path):
    """``serve`` loads the pair before it probes the port, and the metrics that read its expiry come later."""
    ca = new_ca(common_name="ca", now=dt.datetime.now(dt.UTC), days=30)
    first = new_serving_cert(ca, NAMES, now=dt.datetime.now(dt.UTC), days=10)
    second = new_serving_cert(ca, NAMES, now=dt.datetime.now(dt.UTC), days=20)
    _write_pair(tmp_path, first)
    store = CertificateStore(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), check_interval=0.0)
    store.load()
    loaded: list[float] = []
    store.report_to(loaded.append)
    assert loaded == [first.cert.not_valid_after_utc.timestamp()]
    _write_pair(tmp_path, second)
    assert store.reload_if_changed() is True
    assert loaded == [first.cert.not_valid_after_utc.timestamp(), second.cert.not_valid_after_utc.timestamp()]


def test_certificate_store_reloads_a_new_pair_and_keeps_the_old_one_on_a_half_written_pair(tmp_path, caplog):
    ca = new_ca(common_name="ca", now=dt.datetime.now(dt.UTC), days=30)
    first = new_serving_cert(ca, NAMES, now=dt.datetime.now(dt.UTC), days=10)
    second = new_serving_cert(ca, NAMES, now=dt.datetime.now(dt.UTC), days=20)
    _write_pair(tmp_path, first)
    loaded: list[float] = []
    store = CertificateStore(
        str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), on_load=loaded.append, check_interval=0.0
    )
    store.load()
    assert store.context().minimum_version == ssl.TLSVersion.TLSv1_2
    assert served_serial(store, ca) == served_serial(store, ca) == first.cert.serial_number
    assert loaded == [first.cert.not_valid_after_utc.timestamp()]  # unchanged files: loaded once, never rebuilt

    (tmp_path / "tls.key").write_bytes(second.key_pem)  # key renewed, certificate not yet: a mismatched pair
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        assert store.reload_if_changed() is False
        assert store.reload_if_changed() is False  # the same rejected pair is logged once
    assert served_serial(store, ca) == first.cert.serial_number
    (failed,) = [json.loads(JsonLinesFormatter().format(record)) for record in caplog.records]
    assert failed["event"] == "certificate-reload-failed" and failed["level"] == "warning"
    assert "not a matching PEM certificate and key" in failed["reason"]
    caplog.clear()

    (tmp_path / "tls.crt").unlink()  # mid-swap: a file briefly missing
    assert store.reload_if_changed() is False
    assert served_serial(store, ca) == first.cert.serial_number
    assert len(loaded) == 1

    _write_pair(tmp_path, second)
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        assert store.reload_if_changed() is True
    assert served_serial(store, ca) == second.cert.serial_number
    (reloaded,) = [json.loads(JsonLinesFormatter().format(record)) for record in caplog.records]
    assert reloaded["event"] == "certificate-reloaded" and reloaded["level"] == "info"
    assert reloaded["not_after"] == second.cert.not_valid_after_utc.isoformat()
    assert loaded[-1] == second.cert.not_valid_after_utc.timestamp()
    assert store.not_after == loaded[-1]


def test_certificate_store_refuses_to_start_on_bad_files(tmp_path):
    store = CertificateStore(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"))
    with pytest.raises(ServeError, match="cannot read"):
        store.load()
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(ServeError, match="not a matching PEM certificate and key"):
        store.load()
    assert not store.is_loaded()


def _served_in_thread(action) -> list[BaseException | None]:
    """Run ``action`` in a thread; the list gets its exception (or None) once it returns."""
    result: list[BaseException | None] = []

    def target() -> None:
        try:
            action()
            result.append(None)
        except BaseException as error:  # handed to the test
            result.append(error)

    threading.Thread(target=target, daemon=True).start()
    return result


def _outcome(result: list[BaseException | None]) -> BaseException | None:
    """What the thread of :func:`_served_in_thread` ended with, once it has: a server side still blocked on a silent
    client past the deadline fails the test."""
    wait_for(lambda: result, "the server side's call to return", timeout=20, interval=0.01)
    return result[0]


def test_a_silent_client_cannot_hold_a_server_thread(tmp_path):
    # serve's worker never blocks on a client socket; code that does (gunicorn's gthread worker reads each request
    # on a blocking socket) would hold a thread for good on one byte of a ClientHello, or of a second request on a
    # kept-alive connection, then silence. Sockets from the store's context time out whenever they block.
    ca = new_ca(common_name="ca", now=dt.datetime.now(dt.UTC), days=30)
    _write_pair(tmp_path, new_serving_cert(ca, NAMES, now=dt.datetime.now(dt.UTC), days=10))
    (tmp_path / "ca.crt").write_bytes(ca.cert_pem)
    store = CertificateStore(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), io_timeout=0.2)
    store.load()

    # 1. a handshake that never completes
    server_side, client_side = socket.socketpair()
    client_side.send(b"\x16")
    server_side.setblocking(True)  # what gthread does before wrapping
    tls = store.context().wrap_socket(server_side, server_side=True, do_handshake_on_connect=False)
    tls.setblocking(True)
    assert isinstance(_outcome(_served_in_thread(tls.do_handshake)), TimeoutError)
    tls.close()
    client_side.close()

    # 2. a kept-alive connection that goes silent mid-request: gthread calls setblocking(True) again
    server_side, client_side = socket.socketpair()
    client_context = ssl.create_default_context(cafile=str(tmp_path / "ca.crt"))
    tls = store.context().wrap_socket(server_side, server_side=True, do_handshake_on_connect=False)
    handshake = _served_in_thread(tls.do_handshake)
    client = client_context.wrap_socket(client_side, server_hostname=NAMES[2])
    assert _outcome(handshake) is None
    tls.setblocking(False)  # back to the poller between requests
    client.send(b"P")
    tls.setblocking(True)  # picked up by a thread for the next request
    assert tls.recv(1) == b"P"
    assert isinstance(_outcome(_served_in_thread(lambda: tls.recv(1))), TimeoutError)
    tls.close()
    client.close()
