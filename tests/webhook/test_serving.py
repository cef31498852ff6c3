"""serve's gunicorn set-up, in process: the fork hooks that keep start-up objects out of the workers' collections,
the collector's state around gunicorn's run, the direct review log line, and the settings serve hands gunicorn.

The server itself runs in ``tests/e2e/test_webhook_tls.py``, which also sees the hooks take effect (every worker
logs ``worker-started`` with the master's objects frozen) and that no access log is written. What it cannot see
from outside is checked here through ``run``'s ``application`` argument, which stands in for gunicorn: the
collector's state while gunicorn runs in the master, and what serve hands gunicorn."""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import logging
import os
import socket
import ssl
import sys
import types
from pathlib import Path

import pytest
from prometheus_client import values

from gpu_fence.webhook import cli, serving
from gpu_fence.webhook.certs import new_ca, new_serving_cert, service_dns_names
from gpu_fence.webhook.worker import Limits
from gpu_fence.webhook.wsgi import ReviewEndpoints
from tests.fakes.ports import free_port
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
    gc.disable()  # as run leaves the master
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
        port=free_port(),
        workers=1,
        threads=4,
        log_level="INFO",
        client_ca_file=None,
        client_cn=[],
        idle_timeout=None,
        max_connection_age=None,
        config=None,
        namespace=None,
    )


@pytest.fixture
def multiprocess_metrics(monkeypatch):
    """``run`` switches prometheus_client to per-process files in a directory of its own: undo it afterwards."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")
    monkeypatch.setenv("PROMETHEUS_DISABLE_CREATED_SERIES", "")
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)


class StandInGunicorn:
    """What ``run`` hands gunicorn, and the collector's state when gunicorn would run."""

    def __init__(self) -> None:
        self.app: object = None
        self.options: dict = {}
        self.collecting: bool | None = None

    def __call__(self, app: object, options: dict) -> StandInGunicorn:
        self.app, self.options = app, options
        return self

    def run(self) -> None:
        self.collecting = gc.isenabled()


def test_serve_runs_gunicorn_with_the_collector_off_and_the_fork_hooks(tmp_path, collector, multiprocess_metrics):
    gunicorn = StandInGunicorn()
    gc.enable()
    assert serving.run(_serve_args(tmp_path), application=gunicorn) == 0
    assert gunicorn.collecting is False  # off from before the app was imported until each worker starts
    assert gc.isenabled()  # and on again once serve returns
    assert {"pre_fork", "post_fork"} <= set(gunicorn.options)
    review_log = gunicorn.app.wsgi_app.review_log
    assert isinstance(gunicorn.app.wsgi_app, ReviewEndpoints) and review_log.fd is not None


def test_a_serve_that_cannot_start_leaves_the_collector_on(tmp_path, collector, multiprocess_metrics):
    gc.enable()
    with pytest.raises(serving.ServeError, match="not a"):
        serving.run(_serve_args(tmp_path, good=False), application=StandInGunicorn())
    assert gc.isenabled()


def test_serves_logger_writes_no_access_log_where_gunicorns_would(tmp_path, collector, multiprocess_metrics, capsys):
    """gunicorn writes a request's access line whenever an access log is configured (and builds its fields when its
    logger is configured by a dict, as serve's is, to drop them); the logger class serve hands it writes none."""
    from gunicorn.config import Config
    from gunicorn.glogging import Logger

    gunicorn = StandInGunicorn()
    assert serving.run(_serve_args(tmp_path), application=gunicorn) == 0
    config = Config()
    config.set("accesslog", "-")
    response = types.SimpleNamespace(status="200 OK", sent=15, headers=[])
    environ = {"REQUEST_METHOD": "GET", "RAW_URI": "/healthz", "SERVER_PROTOCOL": "HTTP/1.1"}
    for logger_class, lines in ((Logger, 1), (gunicorn.options["logger_class"], 0)):
        capsys.readouterr()
        logger_class(config).access(response, types.SimpleNamespace(headers=[]), environ, dt.timedelta(0))
        written = capsys.readouterr().out
        assert len(written.splitlines()) == lines, written
        assert lines == 0 or '"GET /healthz HTTP/1.1" 200' in written


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


def test_the_connection_times_given_reach_the_worker(tmp_path, collector, multiprocess_metrics):
    gunicorn = StandInGunicorn()
    args = _serve_args(tmp_path)
    args.idle_timeout, args.max_connection_age = 95.0, 30.0
    assert serving.run(args, application=gunicorn) == 0
    limits = gunicorn.options["worker_class"].limits
    assert (limits.idle_seconds, limits.connection_seconds) == (95.0, 30.0)
    assert gunicorn.options["workers"] == 1


def test_client_cn_without_a_client_ca_is_a_usage_error(tmp_path):
    args = _serve_args(tmp_path)
    args.client_cn = ["kube-apiserver"]
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
