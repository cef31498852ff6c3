"""serve's gunicorn set-up, in process: the fork hooks that keep start-up objects out of the workers' collections,
the collector's state around ``_serve``, and the direct review log line.

The server itself runs in ``tests/e2e/test_webhook_tls.py``, which also sees the hooks take effect (every worker
logs ``worker-started`` with the master's objects frozen). What it cannot see is checked here, and these are private
contracts on purpose: the collector's state while gunicorn runs in the master (only a stand-in for gunicorn, put in
place of ``serving._gunicorn_application``, can observe it) and the access-log work gunicorn's logger skips
(``serving._logger_class``, visible only in a profile)."""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import logging
import os
import socket
import ssl
import sys
from pathlib import Path

import pytest
from prometheus_client import values

from gpu_fence.webhook import cli, serving
from gpu_fence.webhook.certs import new_ca, new_serving_cert, service_dns_names
from gpu_fence.webhook.config import PolicyConfig
from gpu_fence.webhook.worker import Limits
from gpu_fence.webhook.wsgi import ReviewEndpoints
from tests.fakes.processes import run_captured


@pytest.fixture
def collector():
    """Leave the process's collector as it was, whatever a test does to it."""
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_pre_fork_freezes_and_post_fork_collects_again(collector, caplog):
    hooks = serving.fork_hooks()
    gc.disable()  # as _serve leaves the master
    gc.unfreeze()
    hooks["pre_fork"](None, None)
    frozen = gc.get_freeze_count()
    assert frozen > 1000  # everything imported so far, this test's modules included
    assert not gc.isenabled()  # the master stays off between forks
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        hooks["post_fork"](None, None)
    assert gc.isenabled()
    [record] = caplog.records
    assert record.fields["event"] == "worker-started"
    assert record.fields["frozen_objects"] == frozen and record.fields["gc_enabled"] is True


def _serve_args(tmp_path: Path, *, good: bool = True) -> argparse.Namespace:
    now = dt.datetime.now(dt.UTC)
    pair = new_serving_cert(new_ca(common_name="ca", now=now, days=3), service_dns_names("s", "ns"), now=now, days=2)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem if good else b"not a certificate")
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    return argparse.Namespace(
        cert_file=str(tmp_path / "tls.crt"),
        key_file=str(tmp_path / "tls.key"),
        bind="127.0.0.1",
        port=8443,
        workers=1,
        threads=4,
        log_level="INFO",
        client_ca_file=None,
        client_cn=[],
        idle_timeout=None,
        max_connection_age=None,
    )


@pytest.fixture
def multiprocess_metrics(tmp_path, monkeypatch):
    """``_serve`` switches prometheus_client to per-process files: give it a directory, undo it afterwards."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)


def test_serve_runs_gunicorn_with_the_collector_off_and_the_fork_hooks(
    tmp_path, monkeypatch, collector, multiprocess_metrics
):
    seen = {}

    class Stub:
        def run(self) -> None:
            seen["collecting"] = gc.isenabled()

    def gunicorn(app, options):
        seen["app"], seen["options"] = app, options
        return Stub()

    monkeypatch.setattr(serving, "_gunicorn_application", gunicorn)
    gc.enable()
    assert serving._serve(_serve_args(tmp_path), PolicyConfig(), str(tmp_path)) == 0
    assert seen["collecting"] is False  # off from before the app was imported until each worker starts
    assert gc.isenabled()  # and on again once serve returns
    assert {"pre_fork", "post_fork"} <= set(seen["options"])
    review_log = seen["app"].wsgi_app.review_log
    assert isinstance(seen["app"].wsgi_app, ReviewEndpoints) and review_log.fd is not None


def test_a_serve_that_cannot_start_leaves_the_collector_on(tmp_path, collector, multiprocess_metrics):
    gc.enable()
    with pytest.raises(serving.ServeError, match="not a"):
        serving._serve(_serve_args(tmp_path, good=False), PolicyConfig(), str(tmp_path))
    assert gc.isenabled()


def test_no_access_log_fields_are_built_for_any_request(monkeypatch):
    """gunicorn builds every request's access-log fields when its logger is configured by a dict, as serve's is,
    and then drops them; serve's logger class builds none."""
    from gunicorn.config import Config
    from gunicorn.glogging import Logger

    for logger_class, expected in ((Logger, 1), (serving._logger_class(), 0)):
        logger = logger_class(Config())
        monkeypatch.setattr(logger, "_access_log_enabled", True, raising=False)  # as with serve's logconfig_dict
        built = []
        monkeypatch.setattr(logger, "atoms", lambda *args, built=built: built.append(args) or {})
        monkeypatch.setattr(logger, "access_log", logging.getLogger("gpu_fence.test.access"))
        logger.access(None, None, {}, None)
        assert len(built) == expected


def test_the_client_ca_is_asked_for_verified_and_reloaded_like_the_serving_pair(tmp_path, caplog):
    now = dt.datetime.now(dt.UTC)
    ca = new_ca(common_name="ca", now=now, days=3)
    pair = new_serving_cert(ca, service_dns_names("s", "ns"), now=now, days=2)
    (tmp_path / "tls.crt").write_bytes(pair.cert_pem)
    (tmp_path / "tls.key").write_bytes(pair.key_pem)
    client_ca = tmp_path / "client-ca.crt"
    client_ca.write_bytes(new_ca(common_name="clients", now=now, days=3).cert_pem)
    store = serving.CertificateStore(
        str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), client_ca_file=str(client_ca)
    )
    store.load()
    first = store.context()
    assert first.verify_mode == ssl.CERT_OPTIONAL  # asked for, verified when presented; probes need none
    assert [c["subject"] for c in first.get_ca_certs()] == [((("commonName", "clients"),),)]
    staged = tmp_path / ".client-ca.crt.new"
    staged.write_bytes(b"not a certificate")
    os.replace(staged, client_ca)
    with caplog.at_level(logging.WARNING, logger="gpu_fence.webhook"):
        assert store.reload_if_changed() is False
    assert store.context() is first and "--client-ca-file" in caplog.records[0].fields["reason"]
    staged.write_bytes(new_ca(common_name="renewed", now=now, days=3).cert_pem)
    os.replace(staged, client_ca)
    assert store.reload_if_changed() is True
    assert [c["subject"] for c in store.context().get_ca_certs()] == [((("commonName", "renewed"),),)]
    client_ca.write_bytes(b"garbage")
    with pytest.raises(serving.ServeError, match=r"--client-ca-file .*not a PEM CA certificate"):
        serving.CertificateStore(
            str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), client_ca_file=str(client_ca)
        ).load()


@pytest.mark.parametrize(
    ("option", "default"),
    [("--max-connection-age", Limits().connection_seconds), ("--idle-timeout", Limits().idle_seconds)],
)
def test_connection_times_are_checked_and_their_help_states_the_workers_defaults(capsys, option, default):
    parser = cli.build_parser()
    required = ["serve", "--cert-file", "c", "--key-file", "k"]
    destination = option.removeprefix("--").replace("-", "_")
    assert getattr(parser.parse_args([*required, option, "2.5"]), destination) == 2.5
    assert getattr(parser.parse_args(required), destination) is None  # the worker's own default applies
    with pytest.raises(SystemExit) as exited:
        parser.parse_args([*required, option, "0"])
    assert exited.value.code == 2
    assert f"{option}: '0' must be greater than 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--help"])
    assert f"(default: {default:g}" in " ".join(capsys.readouterr().out.split())


def test_the_connection_times_given_reach_the_worker(tmp_path, monkeypatch, collector, multiprocess_metrics):
    seen = {}

    class Stub:
        def run(self) -> None:
            pass

    def gunicorn(app, options):
        seen["options"] = options
        return Stub()

    monkeypatch.setattr(serving, "_gunicorn_application", gunicorn)
    args = _serve_args(tmp_path)
    args.idle_timeout, args.max_connection_age = 95.0, 30.0
    assert serving._serve(args, PolicyConfig(), str(tmp_path)) == 0
    limits = seen["options"]["worker_class"].limits
    assert (limits.idle_seconds, limits.connection_seconds) == (95.0, 30.0)
    assert seen["options"]["workers"] == 1


def test_client_cn_without_a_client_ca_is_a_usage_error(tmp_path):
    args = _serve_args(tmp_path)
    args.client_cn = ["kube-apiserver"]
    args.config, args.namespace = None, None
    with pytest.raises(serving.ServeError, match="--client-cn needs --client-ca-file"):
        serving.run(args)


def test_a_port_in_use_fails_at_once_in_one_line(tmp_path):
    """gunicorn would retry the bind five times, a second apart, and log eleven JSON lines; serve says it once."""
    args = _serve_args(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_captured(
            [
                str(Path(sys.executable).with_name("gpu-fence-webhook")),
                "serve",
                "--cert-file",
                args.cert_file,
                "--key-file",
                args.key_file,
                "--bind",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            timeout=60,
        )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        f"gpu-fence-webhook serve: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]


def test_an_address_that_is_not_this_hosts_fails_in_one_line():
    # TEST-NET-1 (RFC 5737): numeric, so no name lookup, and never an address of this host; binding sends nothing
    with pytest.raises(serving.ServeError, match=r"^cannot listen on 192\.0\.2\.1:8443: Cannot assign requested"):
        serving.check_bindable("192.0.2.1", 8443)
