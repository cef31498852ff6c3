"""``gpu-fence-webhook serve`` as a subprocess on a loopback port, with certificates from our own ``certs``, and an
HTTPS client that connects as the API server does: to 127.0.0.1, verifying the certificate for the Service DNS
name (SNI included), with ``TCP_NODELAY``.

Shared by the end-to-end tests of the webhook over TLS (the admission contract, availability under slow clients,
client certificates); starting a server is the slow part, so each test module starts one and reuses it. The HTTPS
benchmarks start their servers with the same ``certs`` and ``serve`` arguments (:func:`certs_command`,
:func:`serve_options`) and stop them the same way (``processes.stop``): what they measure is what the tests prove.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from tests.fakes.polling import wait_for
from tests.fakes.ports import PortTaken, on_a_free_port
from tests.fakes.processes import stop

SERVICE, NAMESPACE = "gpu-fence-webhook", "gpu-fence"
HOSTNAME = f"{SERVICE}.{NAMESPACE}.svc"
BIN = Path(sys.executable).parent
STARTUP_DEADLINE_S = 30.0  # generous: a loaded CI machine; never asserted as a speed


class Connection(http.client.HTTPSConnection):
    """HTTPS to 127.0.0.1, verifying the certificate for the Service DNS name (SNI included), TCP_NODELAY."""

    def __init__(self, port: int, context: ssl.SSLContext, timeout: float = 10) -> None:
        super().__init__(HOSTNAME, port, context=context, timeout=timeout)
        self._port = port

    def connect(self) -> None:
        raw = socket.create_connection(("127.0.0.1", self._port), self.timeout)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self._context.wrap_socket(raw, server_hostname=self.host)

    def peer_serial(self) -> int:
        return x509.load_der_x509_certificate(self.sock.getpeercert(binary_form=True)).serial_number


@dataclass
class Reply:
    status: int
    document: dict
    headers: dict


def send(
    conn: Connection, method: str, path: str, body: bytes | None = None, content_type: str | None = "application/json"
) -> Reply:
    headers = {"Content-Type": content_type} if content_type and body is not None else {}
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    is_json = response.getheader("Content-Type", "").startswith("application/json")
    return Reply(response.status, json.loads(data) if is_json else {"text": data.decode()}, dict(response.getheaders()))


@dataclass
class Server:
    port: int
    tls_dir: Path
    context: ssl.SSLContext
    process: subprocess.Popen
    stderr_path: Path

    def connect(self, context: ssl.SSLContext | None = None, timeout: float = 10) -> Connection:
        return Connection(self.port, context or self.context, timeout)

    def post(self, path: str, document: dict | bytes, *, timeout: float = 10, **kwargs) -> Reply:
        body = document if isinstance(document, bytes) else json.dumps(document).encode()
        conn = self.connect(timeout=timeout)
        try:
            return send(conn, "POST", path, body, **kwargs)
        finally:
            conn.close()

    def get(self, path: str) -> Reply:
        conn = self.connect()
        try:
            return send(conn, "GET", path)
        finally:
            conn.close()

    def stderr_lines(self) -> list[str]:
        return self.stderr_path.read_text(errors="replace").splitlines()

    def events(self) -> list[dict]:
        """The JSON-line events logged so far (import-time lines and other text left out)."""
        return [json.loads(line) for line in self.stderr_lines() if line.startswith("{")]

    def workers(self) -> list[int]:
        """The pids of the gunicorn workers (children of the master) now."""
        children = Path(f"/proc/{self.process.pid}/task/{self.process.pid}/children")
        return [int(pid) for pid in children.read_text().split()] if children.exists() else []


def certs_command(executable: str | Path, out_dir: Path) -> list[str]:
    """``gpu-fence-webhook certs`` writing ca.crt, tls.crt and tls.key for the Service DNS name into ``out_dir``."""
    return [str(executable), "certs", "--service", SERVICE, "--namespace", NAMESPACE, "--out-dir", str(out_dir)]


def serve_options(tls: Path, port: int, *, workers: int | None, threads: int) -> list[str]:
    """The options of ``serve`` that put it on 127.0.0.1:``port`` with the certificates ``certs`` wrote in ``tls``
    (``workers`` None: serve's own default, as the manifests run it)."""
    return [
        "--cert-file",
        str(tls / "tls.crt"),
        "--key-file",
        str(tls / "tls.key"),
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        *([] if workers is None else ["--workers", str(workers)]),
        "--threads",
        str(threads),
        "--namespace",
        NAMESPACE,
    ]


def run_certs(out_dir: Path) -> None:
    subprocess.run(certs_command(BIN / "gpu-fence-webhook", out_dir), check=True, capture_output=True)


@contextmanager
def serving(
    tmp: Path, *extra: str, workers: int | None = None, threads: int = 4, env: dict[str, str] | None = None
) -> Iterator[Server]:
    """``serve`` with certificates for the Service name in ``tmp/tls``, ready (``/readyz`` answered 200)."""
    tls = tmp / "tls"
    run_certs(tls)
    stderr_path = tmp / "serve.stderr"
    context = ssl.create_default_context(cafile=str(tls / "ca.crt"))

    def start(port: int) -> Server:
        command = [
            str(BIN / "gpu-fence-webhook"),
            "serve",
            *serve_options(tls, port, workers=workers, threads=threads),
            *extra,
        ]
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                command, stdout=subprocess.DEVNULL, stderr=stderr, env={**os.environ, "TMPDIR": str(tmp), **(env or {})}
            )
        started = Server(port, tls, context, process, stderr_path)
        try:
            wait_ready(started)
        except AssertionError:
            stop(process, grace_s=20)
            if any(f"cannot listen on 127.0.0.1:{port}" in line for line in started.stderr_lines()):
                raise PortTaken(port) from None
            raise
        return started

    started = on_a_free_port(start)
    try:
        yield started
    finally:
        stop(started.process, grace_s=20)


def wait_ready(server: Server, deadline_s: float = STARTUP_DEADLINE_S) -> None:
    def ready() -> bool:
        assert server.process.poll() is None, "serve exited"
        return server.get("/readyz").status == 200

    try:
        wait_for(ready, "serve to answer /readyz with 200", timeout=deadline_s)
    except AssertionError as error:
        raise AssertionError(f"{error}; its last lines:\n" + "\n".join(server.stderr_lines()[-20:])) from None
