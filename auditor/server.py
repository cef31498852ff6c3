"""The HTTP server of ``run``: ``/metrics`` and ``/healthz`` on one port, served from a thread of their own.

:class:`Health` decides ``/healthz`` from when the last cycle succeeded; the server only answers. Two read-only
endpoints need no framework: the standard library's ``ThreadingHTTPServer`` serves them, so a slow scraper never
holds up the audit loop or the other endpoint.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from .webconfig import ClientAuth

if TYPE_CHECKING:
    from .metrics import AuditorMetrics
    from .webconfig import TlsContexts

#: Seconds a client has for the TLS handshake and for each read; a scrape is one short request.
CLIENT_TIMEOUT_S = 10.0

__all__ = ["Health", "serve_http"]


class Health:
    """``/healthz``: healthy while a cycle succeeded within ``unhealthy_after`` intervals."""

    def __init__(self, interval: float, unhealthy_after: int, clock: Callable[[], float] = time.time) -> None:
        self.window = interval * max(unhealthy_after, 1)
        self._clock = clock
        self.started = clock()
        self.last_success: float | None = None
        self.last_error: str | None = None

    def check(self) -> tuple[int, str]:
        now = self._clock()
        if self.last_success is None:
            if now - self.started <= self.window:
                return 200, "starting: no cycle completed yet"
            return 503, f"no successful audit cycle in {now - self.started:.0f}s: {self.last_error or 'unknown'}"
        age = now - self.last_success
        if age > self.window:
            return 503, f"last successful audit cycle {age:.0f}s ago: {self.last_error or 'unknown'}"
        return 200, f"ok: last successful audit cycle {age:.0f}s ago"


class _TlsServer(ThreadingHTTPServer):
    """HTTPS: each connection is wrapped with the current context and its handshake is done in the connection's own
    thread, so that a slow or broken client never holds up the accept loop or the other scrapes."""

    tls: TlsContexts

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(CLIENT_TIMEOUT_S)
        try:
            wrapped = self.tls.current().wrap_socket(request, server_side=True, do_handshake_on_connect=False)
            wrapped.do_handshake()
        except (ssl.SSLError, OSError):
            return  # not TLS, or a certificate that does not verify: nothing to answer
        try:
            super().finish_request(wrapped, client_address)
        finally:
            with contextlib.suppress(OSError):
                wrapped.shutdown(socket.SHUT_RDWR)
            wrapped.close()


def serve_http(
    bind: str, port: int, metrics: AuditorMetrics, health: Health, tls: TlsContexts | None = None
) -> ThreadingHTTPServer:
    """Start serving on ``bind:port`` (port 0: a free one, see ``server_address``), over TLS with ``tls``; raises
    ``OSError`` when the address cannot be bound. Stop it with ``shutdown()`` and ``server_close()``."""
    certificate_required = tls is not None and tls.config.client_auth is ClientAuth.REQUIRED
    from .metrics import CONTENT_TYPE  # noqa: PLC0415 - prometheus_client is imported by run only

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics" and certificate_required and not self.connection.getpeercert():
                self._send(403, b"a client certificate is required for /metrics\n", "text/plain; charset=utf-8")
            elif path == "/metrics":
                self._send(200, metrics.exposition(), CONTENT_TYPE)
            elif path == "/healthz":
                code, message = health.check()
                self._send(code, (message + "\n").encode(), "text/plain; charset=utf-8")
            else:
                self._send(404, b"not found: try /metrics or /healthz\n", "text/plain; charset=utf-8")

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    if tls is None:
        server = ThreadingHTTPServer((bind, port), Handler)
    else:
        server = _TlsServer((bind, port), Handler)
        server.tls = tls
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    return server
