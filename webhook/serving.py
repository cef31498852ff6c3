"""The ``serve`` subcommand: the Flask app under an embedded gunicorn, over TLS, with certificate hot reload.

Why these choices:

* **Our own gunicorn worker** (``webhook.worker``), one process per pod: its event loop does the TLS handshakes
  and reads each request whole, within a deadline per request, before a pool thread runs the app on it; no client
  can hold a thread by sending slowly, and when connection slots run out the connections idle longest make room.
  It keeps connections alive (a TLS handshake per admission call costs more than the review). One process, because
  the pod has one CPU: a second would add no CPU, and would split the API server's kept-alive connections
  unevenly. Replicas give availability and more CPU. Why, in detail: the worker's module docstring and
  docs/webhook.md.
* **Certificate reload without restart.** gunicorn asks its ``ssl_context`` hook for a context on every new
  connection. :class:`CertificateStore` answers with a cached context and, at most once a second, compares the
  files' inode/mtime/size; on a change it builds a *new* context and swaps it in. Connections already open
  (in-flight or keep-alive) keep the context they were accepted with, so nothing is dropped, and new ones get
  the new certificate. A half-written pair (key and certificate do not match yet) keeps the old context and is
  retried. Kubernetes updates mounted Secrets by an atomic symlink swap, which changes the inode.
* **Sockets never block without a timeout.** The worker never blocks on a client socket; sockets from our
  context still give each blocking read and write ``IO_TIMEOUT_SECONDS``, so that code which does block on them
  (gunicorn's own ``gthread`` worker, which the benchmarks run beside ours) cannot wait for ever either.
* **Metrics across workers**: ``PROMETHEUS_MULTIPROC_DIR`` is set, to a fresh temporary directory, before
  prometheus_client is imported; each worker writes its values there and ``/metrics`` merges them. The
  container's root filesystem is read-only, so ``/tmp`` (``TMPDIR``) must be a writable ``emptyDir``.
* **Fast start** (< 2 s to ready): the app is imported once in the master (``preload_app``) and forked; nothing
  here imports the ``kubernetes`` client.
* **No garbage collection of start-up objects in the workers** (:func:`fork_hooks`, the recipe of the ``gc``
  module's documentation for forking servers): the collector is off in the master from before the app is
  imported, ``gc.freeze()`` moves everything the master built into the permanent generation just before each
  fork, and each worker turns the collector back on. A worker's collections then walk only what it allocated
  itself, not the tens of thousands of objects of Flask, gunicorn and the policy, which took the p99 of
  50-container reviews at 200/s from about 20 ms to 5 ms (BENCHMARKS.md); pages stay shared with the master
  too. The master keeps the collector off: after start it only supervises workers and allocates little.
* **Logs** are JSON lines on stderr in the shape both deployables share (``gpu_fence.logs``): our review events
  and gunicorn's own messages alike; no access log (the review events carry more), not even built and dropped.
  The per-review line is written straight to stderr's file descriptor, one ``os.write`` per line
  (``webhook.wsgi.ReviewLog``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import logging
import os
import shutil
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_fence import logs
from gpu_fence.command_line import positive
from gpu_fence.exit_status import ExitStatus

EXAMPLES = """\
examples:
  gpu-fence-webhook serve --cert-file /tls/tls.crt --key-file /tls/tls.key
  gpu-fence-webhook serve --cert-file /tls/tls.crt --key-file /tls/tls.key --client-ca-file /client-ca/ca.crt
  gpu-fence-webhook serve --cert-file tls/tls.crt --key-file tls/tls.key --bind 127.0.0.1 --port 8443
"""

log = logging.getLogger("gpu_fence.webhook")

RELOAD_CHECK_SECONDS = 1.0
#: Longest silence allowed within a blocking read or write on one of our sockets (the worker never blocks).
IO_TIMEOUT_SECONDS = 5.0


class _TimedSSLSocket(ssl.SSLSocket):
    """An SSL socket whose blocking mode always has a timeout: gunicorn switches a connection between
    non-blocking (in its poller) and blocking (in a worker thread) with ``setblocking``, which would otherwise
    clear any timeout set before."""

    io_timeout: float = IO_TIMEOUT_SECONDS

    def setblocking(self, flag: bool) -> None:
        self.settimeout(self.io_timeout if flag else 0.0)


class _ServerContext(ssl.SSLContext):
    """A server context whose sockets time out (see :class:`_TimedSSLSocket`), the handshake included."""

    sslsocket_class: type[_TimedSSLSocket]

    def wrap_socket(self, sock: Any, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        sock.settimeout(self.sslsocket_class.io_timeout)  # the handshake reads before any setblocking call
        return super().wrap_socket(sock, *args, **kwargs)


#: What identifies the certificate files as loaded: (inode, mtime in ns, size) of each.
_Signature = tuple[tuple[int, int, int], ...]


class ServeError(Exception):
    """The server cannot start; the message says what to fix."""


# -- certificates --------------------------------------------------------------------------------------------------


class CertificateStore:
    """The current server-side TLS context, rebuilt when the certificate, the key or the client CA file changes.

    With a client CA, the context asks every client for a certificate and verifies one that is presented against
    that CA (a handshake with an untrusted one fails), but lets a client without one connect: the kubelet's probes
    present none. Which requests then need one is the app's decision (``webhook.wsgi.ClientAuth``).
    """

    def __init__(
        self,
        cert_file: str,
        key_file: str,
        *,
        client_ca_file: str | None = None,
        on_load: Callable[[float], None] | None = None,
        check_interval: float = RELOAD_CHECK_SECONDS,
        io_timeout: float = IO_TIMEOUT_SECONDS,
    ) -> None:
        self.cert_file = cert_file
        self.key_file = key_file
        self.client_ca_file = client_ca_file
        self.on_load = on_load
        self.check_interval = check_interval
        self._socket_class = type("TimedSSLSocket", (_TimedSSLSocket,), {"io_timeout": io_timeout})
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None
        self._signature: _Signature | None = None
        self._rejected: _Signature | None = None
        self._next_check = 0.0
        self.not_after: float | None = None

    def load(self) -> None:
        """Load now or raise :class:`ServeError` (used at start: a bad pair must stop the rollout)."""
        signature = self._stat()
        self._context, self.not_after = self._build()
        self._signature = signature
        self._next_check = time.monotonic() + self.check_interval
        if self.on_load is not None:
            self.on_load(self.not_after)

    def report_to(self, on_load: Callable[[float], None]) -> None:
        """Call ``on_load`` with the loaded certificate's notAfter now and on every reload from here on."""
        self.on_load = on_load
        if self.not_after is not None:
            on_load(self.not_after)

    def is_loaded(self) -> bool:
        return self._context is not None

    def context(self) -> ssl.SSLContext:
        """The context for a new connection; checks the files for a change at most once per interval."""
        if time.monotonic() >= self._next_check:
            self.reload_if_changed()
        assert self._context is not None, "load() first"
        return self._context

    def reload_if_changed(self) -> bool:
        with self._lock:
            self._next_check = time.monotonic() + self.check_interval
            try:
                signature = self._stat()
            except ServeError:
                return False  # mid-swap or briefly missing: keep serving the current pair
            if signature in (self._signature, self._rejected):
                return False
            try:
                context, not_after = self._build()
            except ServeError as error:
                self._rejected = signature  # log once per change, retry when the files change again
                logs.event(
                    log,
                    "certificate-reload-failed",
                    "certificate reload failed, keeping the current one",
                    level=logging.WARNING,
                    reason=str(error),
                )
                return False
            self._context, self.not_after, self._signature = context, not_after, signature
        if self.on_load is not None:
            self.on_load(not_after)
        logs.event(
            log,
            "certificate-reloaded",
            "certificate reloaded",
            not_after=dt.datetime.fromtimestamp(not_after, dt.UTC).isoformat(),
        )
        return True

    def _stat(self) -> _Signature:
        files = [self.cert_file, self.key_file, *([self.client_ca_file] if self.client_ca_file else [])]
        try:
            found = [os.stat(name) for name in files]
        except OSError as error:
            raise ServeError(f"cannot read {error.filename}: {error.strerror}") from None
        return tuple((info.st_ino, info.st_mtime_ns, info.st_size) for info in found)

    def _build(self) -> tuple[ssl.SSLContext, float]:
        from cryptography import x509  # noqa: PLC0415 - only to read notAfter for the expiry metric

        context = _ServerContext(ssl.PROTOCOL_TLS_SERVER)
        context.sslsocket_class = self._socket_class
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # A client that ends its side of TCP without close_notify (a body cut short) still gets its 400: OpenSSL 3
        # otherwise fails the connection on that EOF, and the answer with it.
        context.options |= ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE | ssl.OP_IGNORE_UNEXPECTED_EOF
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
            with open(self.cert_file, "rb") as handle:
                not_after = x509.load_pem_x509_certificate(handle.read()).not_valid_after_utc.timestamp()
        except ssl.SSLError as error:
            reason = error.reason or error
            raise ServeError(f"--cert-file/--key-file: not a matching PEM certificate and key ({reason})") from None
        except ValueError as error:
            raise ServeError(f"--cert-file {self.cert_file}: not a PEM certificate ({error})") from None
        except OSError as error:
            raise ServeError(f"cannot read {error.filename}: {error.strerror}") from None
        if self.client_ca_file:
            self._ask_for_client_certificates(context, self.client_ca_file)
        return context, not_after

    @staticmethod
    def _ask_for_client_certificates(context: ssl.SSLContext, ca_file: str) -> None:
        try:
            context.load_verify_locations(cafile=ca_file)
        except ssl.SSLError as error:
            reason = error.reason or error
            raise ServeError(f"--client-ca-file {ca_file}: not a PEM CA certificate ({reason})") from None
        except OSError as error:
            raise ServeError(f"cannot read {error.filename}: {error.strerror}") from None
        context.verify_mode = ssl.CERT_OPTIONAL  # verified when presented; required per request by the app


# -- logs ----------------------------------------------------------------------------------------------------------


def logging_config(level: str) -> dict[str, Any]:
    """The shared JSON-lines configuration, plus gunicorn's own loggers: its messages as JSON lines too (event
    ``log``), and no access log."""
    return logs.logging_config(
        level,
        {
            "gunicorn.error": {"level": "INFO", "handlers": ["stderr"], "propagate": False},
            "gunicorn.access": {"level": "CRITICAL", "handlers": [], "propagate": False},
        },
    )


# -- gunicorn ------------------------------------------------------------------------------------------------------


def fork_hooks() -> dict[str, Callable[[Any, Any], None]]:
    """gunicorn's ``pre_fork`` and ``post_fork`` settings: freeze the master's objects, collect again in workers.

    ``run`` disables the collector before importing the app, so that no collection frees objects between
    start-up and fork (the freed slots would be reused by the workers, copying the pages they sit on).
    """

    def pre_fork(server: Any, worker: Any) -> None:
        gc.freeze()

    def post_fork(server: Any, worker: Any) -> None:
        gc.enable()
        logs.event(
            log,
            "worker-started",
            f"worker {os.getpid()} started",
            pid=os.getpid(),
            frozen_objects=gc.get_freeze_count(),
            gc_enabled=gc.isenabled(),
        )

    return {"pre_fork": pre_fork, "post_fork": post_fork}


def logger_class() -> type:
    """gunicorn's logger without its access log, which ``serve`` never writes (the review events carry more).

    Configured through ``logconfig_dict``, gunicorn builds the access-log fields of every request (headers,
    times, sizes) before the record is dropped by the silenced ``gunicorn.access`` logger: as much time per
    request, on the profile, as the policy's own rules.
    """
    from gunicorn.glogging import Logger  # noqa: PLC0415 - the CLI imports this module for --help too

    class NoAccessLog(Logger):  # type: ignore[misc]  # gunicorn ships no type information
        def access(self, resp: Any, req: Any, environ: Any, request_time: Any) -> None:
            return None

    return NoAccessLog


def _stderr_fd() -> int | None:
    """stderr's file descriptor, where the logging configuration writes too; None when it has none."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


#: What builds gunicorn's application from the Flask app and serve's gunicorn settings.
ApplicationFactory = Callable[[Any, dict[str, Any]], Any]


def gunicorn_application(app: Any, options: dict[str, Any]) -> Any:
    """gunicorn's embedded application: ``app`` under ``options`` (the settings this gunicorn knows)."""
    from gunicorn.app.base import BaseApplication  # noqa: PLC0415 - the CLI imports this module for --help too

    class Server(BaseApplication):  # type: ignore[misc]  # gunicorn ships no type information
        def load_config(self) -> None:
            for key, value in options.items():
                if key in self.cfg.settings:  # older gunicorn lacks some settings (control_socket_disable)
                    self.cfg.set(key, value)

        def load(self) -> Any:
            return app

    return Server()


def add_arguments(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the admission webhook over HTTPS",
        description="Serve POST /mutate, /validate, /validate/warn and GET /healthz, /readyz, /metrics over TLS.",
        epilog=EXAMPLES,
    )
    parser.add_argument("--cert-file", required=True, help="PEM serving certificate (reloaded when it changes)")
    parser.add_argument("--key-file", required=True, help="PEM private key of --cert-file")
    parser.add_argument(
        "--client-ca-file",
        help="PEM CA certificate(s) that sign the API server's client certificate: reviews are then answered only "
        "for clients with such a certificate (health and metrics stay open); reloaded when it changes",
    )
    parser.add_argument(
        "--client-cn",
        action="append",
        default=[],
        metavar="NAME",
        help="with --client-ca-file: also require the client certificate's CN to be NAME (repeatable)",
    )
    parser.add_argument("--bind", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)")  # noqa: S104
    parser.add_argument("--port", type=int, default=8443, help="port (default: 8443)")
    parser.add_argument("--config", help="policy configuration YAML (default: built-in defaults)")
    parser.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE"),
        help="the webhook's own namespace, always exempt (default: $POD_NAMESPACE)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes (default: 1, for a pod of one CPU: more add no CPU there, and split the API "
        "server's kept-alive connections unevenly; scale with replicas)",
    )
    parser.add_argument("--threads", type=int, default=4, help="threads per worker (default: 4)")
    parser.add_argument(
        "--idle-timeout",
        type=positive(float, "number of seconds"),
        metavar="S",
        help="close a kept-alive connection idle for S seconds (default: 120: longer than the "
        "API server's own 90 s, so that it closes first)",
    )
    parser.add_argument(
        "--max-connection-age",
        type=positive(float, "number of seconds"),
        metavar="S",
        help="a kept-alive connection older than S seconds answers with Connection: close, so that the API server "
        "reconnects and a new pod of the webhook gets its share (default: 60)",
    )
    parser.add_argument(
        "--log-level",
        default="INFO",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="level of the review log (default: INFO: one line per review)",
    )
    parser.set_defaults(run=run)


def check_bindable(host: str, port: int) -> None:
    """Raise :class:`ServeError` at once when ``host:port`` cannot be bound (in use, no such address, no permission).

    gunicorn tries five times a second apart, logging two lines each time, and then a last one (``create_sockets``
    in ``gunicorn/sock.py``): eleven JSON lines over five seconds for what is one mistake. The probe binds as
    gunicorn does (``SO_REUSEADDR``: a port left in TIME_WAIT is free) and is closed before gunicorn binds, so a
    port taken in between still meets gunicorn's retries.
    """
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as error:
        raise ServeError(f"--bind {host}: not an address to listen on ({error.strerror})") from None
    with socket.socket(family, kind, protocol) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as error:
            raise ServeError(f"cannot listen on {host}:{port}: {error.strerror or error}") from None


def run(args: argparse.Namespace, *, application: ApplicationFactory | None = None) -> ExitStatus:
    """Serve until gunicorn stops. ``application`` builds gunicorn's application (by default
    :func:`gunicorn_application`, looked up when called): a test or a benchmark may stand in for gunicorn."""
    if not 0 < args.port < 65536:
        raise ServeError(f"--port {args.port}: must be 1-65535")
    if args.workers < 1 or args.threads < 1:
        raise ServeError("--workers and --threads must be at least 1")
    if args.client_cn and not args.client_ca_file:
        raise ServeError("--client-cn needs --client-ca-file (the CA that signs the certificates it names)")
    from .config import load_config  # noqa: PLC0415 - the heavy imports come after argument checks

    config = load_config(args.config, own_namespace=args.namespace)
    # the operator's own files are judged before the port: their mistakes are the ones to name first
    store = CertificateStore(args.cert_file, args.key_file, client_ca_file=args.client_ca_file)
    store.load()
    check_bindable(args.bind, args.port)
    workdir = tempfile.mkdtemp(prefix="gpu-fence-webhook-")
    try:
        metrics_dir = Path(workdir, "metrics")
        metrics_dir.mkdir()
        # must precede the first import of prometheus_client (it picks its value storage at import)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(metrics_dir)
        # likewise read at import: no undocumented ``_created`` series, in the master and every worker
        os.environ["PROMETHEUS_DISABLE_CREATED_SERIES"] = "True"
        return _serve(args, config, store, workdir, application or gunicorn_application)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _serve(
    args: argparse.Namespace, config: Any, store: CertificateStore, workdir: str, application: ApplicationFactory
) -> ExitStatus:
    collecting = gc.isenabled()
    gc.disable()  # until each worker starts: see fork_hooks
    try:
        return _serve_without_gc(args, config, store, workdir, application)
    finally:
        if collecting:
            gc.enable()


def _serve_without_gc(
    args: argparse.Namespace, config: Any, store: CertificateStore, workdir: str, application: ApplicationFactory
) -> ExitStatus:
    from prometheus_client import multiprocess, values  # noqa: PLC0415 - after PROMETHEUS_MULTIPROC_DIR is set

    # prometheus_client picks its value storage when first imported; should anything have imported it before the
    # variable was set, pick again, or each worker would count alone and /metrics would show one worker's share.
    values.ValueClass = values.get_value_class()

    from .app import create_app  # noqa: PLC0415
    from .metrics import WebhookMetrics  # noqa: PLC0415
    from .worker import Limits, worker_class  # noqa: PLC0415
    from .wsgi import ClientAuth, ReviewLog  # noqa: PLC0415

    metrics = WebhookMetrics()
    store.report_to(metrics.certificate_expiry.set)
    client_auth = ClientAuth(frozenset(args.client_cn)) if args.client_ca_file else None
    app = create_app(
        config,
        metrics=metrics,
        ready=store.is_loaded,
        review_log=ReviewLog(log, fd=_stderr_fd()),
        client_auth=client_auth,
    )
    host = f"[{args.bind}]" if ":" in args.bind and not args.bind.startswith("[") else args.bind

    def child_exit(server: Any, worker: Any) -> None:
        multiprocess.mark_process_dead(worker.pid)

    def when_ready(server: Any) -> None:
        logs.event(
            log,
            "ready",
            f"serving on {host}:{args.port}",
            bind=f"{host}:{args.port}",
            workers=args.workers,
            threads=args.threads,
            pid=os.getpid(),
        )

    chosen = {"idle_seconds": args.idle_timeout, "connection_seconds": args.max_connection_age}
    limits = Limits(**{name: value for name, value in chosen.items() if value is not None})
    options = {
        "bind": [f"{host}:{args.port}"],
        "workers": args.workers,
        "worker_class": worker_class(limits, metrics, store.context),
        "threads": args.threads,
        "timeout": 30,
        "graceful_timeout": 20,
        "preload_app": True,
        "worker_tmp_dir": workdir,
        "control_socket_disable": True,
        "accesslog": None,
        "logger_class": logger_class(),
        "errorlog": "-",
        "logconfig_dict": logging_config(args.log_level),
        "child_exit": child_exit,
        "when_ready": when_ready,
        **fork_hooks(),
        "proc_name": "gpu-fence-webhook",
    }
    try:
        application(app, options).run()
    except SystemExit as exit_:
        # gunicorn exits 0 on a clean shutdown (SIGTERM) and non-zero when it could not start (port in use)
        return ExitStatus.ERROR if exit_.code else ExitStatus.SUCCESS
    return ExitStatus.SUCCESS
