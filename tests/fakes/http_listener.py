"""Small HTTP servers for the tests: a threaded listener on loopback (over TLS when given a context), and the
forwarding of one request to an upstream server, for fakes that stand in front of a real Prometheus."""

from __future__ import annotations

import http.server
import ssl
import threading
import urllib.error
import urllib.request


class Listener:
    """``handler`` served on 127.0.0.1 at a free port, in a thread, while the ``with`` block runs."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler], tls: ssl.SSLContext | None = None) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        self.port = self.server.server_address[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Listener:
        self.thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def forward(handler: http.server.BaseHTTPRequestHandler, upstream: str, form: bytes | None = None) -> None:
    """Send ``handler``'s request (a GET, or a POST with ``form``) to ``upstream`` and its answer back."""
    request = urllib.request.Request(f"{upstream}{handler.path}", data=form)
    if form is not None:
        request.add_header("Content-Type", handler.headers.get("Content-Type", ""))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            status, body = response.status, response.read()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
