"""An open-loop (constant arrival rate) HTTPS load generator, for latency at fixed offered loads.

Why not wrk: wrk is closed-loop (each connection sends its next request when the previous answer arrives), so it
has no rate setting, and when the server stalls it stops sending, hiding the stall from its percentiles
("coordinated omission"). wrk2, which adds a constant rate, is not packaged by Debian. So requests here are
scheduled at fixed times, ``start + n / rate``, spread round-robin over ``connections`` threads, and each
latency is measured from the request's *scheduled* time to the end of its response: a request that had to wait
for a busy connection counts its wait, as wrk2 does. The service time (from the actual send) is kept too.

Cheap on purpose, so that at a few hundred requests/s on a 2-core machine the client steals little CPU from the
server: the request bytes are built once (only the uid changes), responses are parsed just enough (status line,
``Content-Length``, ``Connection``), ``TCP_NODELAY`` is set (without it Nagle's algorithm adds ~40 ms stalls to
small writes and the benchmark measures the kernel, not the server), and certificates are verified against the
generated CA for the Service DNS name, as the API server does. With ``reuse=False`` every request opens a new
TCP connection and a full TLS handshake (no session resumption, which Go's HTTP client, the API server's, does
not do by default either).
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.stats import latency_summary

UID_PLACEHOLDER = b"00000000-0000-4000-8000-000000000000"


@dataclass(frozen=True)
class Target:
    """Where the server listens and how to trust it."""

    host: str
    port: int
    server_hostname: str
    ca_file: str

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=self.ca_file)


class LoadError(RuntimeError):
    """The server answered something other than 200, or the connection broke: the run is not a measurement."""


def request_bytes(target: Target, path: str, body: bytes, *, keep_alive: bool) -> tuple[bytes, int]:
    """The HTTP/1.1 request and the offset of the uid placeholder inside it (-1 when the body has none)."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {target.server_hostname}:{target.port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"Connection: {'keep-alive' if keep_alive else 'close'}\r\n\r\n"
    ).encode()
    offset = body.find(UID_PLACEHOLDER)
    return head + body, (len(head) + offset if offset >= 0 else -1)


class Client:
    """One HTTPS connection, reopened when the server closes it (``sync`` workers close after every answer)."""

    def __init__(self, target: Target, context: ssl.SSLContext) -> None:
        self.target = target
        self.context = context
        self.sock: ssl.SSLSocket | None = None
        self.connects = 0
        self._buffer = b""

    def connect(self) -> None:
        raw = socket.create_connection((self.target.host, self.target.port), timeout=10)
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = self.context.wrap_socket(raw, server_hostname=self.target.server_hostname)
        self._buffer = b""
        self.connects += 1

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            finally:
                self.sock = None

    def exchange(self, request: bytes) -> int:
        """Send one request, read its whole response; the status code. Opens a connection when none is open."""
        if self.sock is None:
            self.connect()
        assert self.sock is not None
        self.sock.sendall(request)
        status, close = self._read_response()
        if close:
            self.close()
        return status

    def _read_response(self) -> tuple[int, bool]:
        assert self.sock is not None
        while b"\r\n\r\n" not in self._buffer:
            self._receive()
        head, _, rest = self._buffer.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"connection":
                close = value.strip().lower() == b"close"
            elif name == b"transfer-encoding":
                raise LoadError("the server sent a chunked response; this client reads Content-Length bodies only")
        while len(rest) < length:
            rest += self._receive_chunk()
        self._buffer = rest[length:]
        return status, close

    def _receive(self) -> None:
        self._buffer += self._receive_chunk()

    def _receive_chunk(self) -> bytes:
        assert self.sock is not None
        chunk = self.sock.recv(65536)
        if not chunk:
            raise LoadError("the server closed the connection in the middle of a response")
        return chunk


def open_loop(
    target: Target, path: str, body: bytes, *, rate: float, seconds: float, connections: int = 8, reuse: bool = True
) -> dict[str, Any]:
    """Offer ``rate`` requests/s for ``seconds``; latency summary from scheduled time, achieved rate, connects.

    Raises :class:`LoadError` when any answer is not 200: a benchmark of error pages is not a benchmark.
    """
    if rate <= 0 or seconds <= 0 or connections < 1:
        raise ValueError("rate and seconds must be positive and connections at least 1")
    total = max(1, int(rate * seconds))
    request, uid_at = request_bytes(target, path, body, keep_alive=reuse)
    context = target.context()
    latencies: list[list[float]] = [[] for _ in range(connections)]
    services: list[list[float]] = [[] for _ in range(connections)]
    failures: list[str] = []
    connects = [0] * connections
    start = time.perf_counter() + 0.05  # every thread is waiting before the first scheduled send

    def worker(lane: int) -> None:
        client = Client(target, context)
        data = bytearray(request)
        try:
            if reuse:
                client.connect()  # the first handshake belongs to setup, not to the first request
            for number in range(lane, total, connections):
                scheduled = start + number / rate
                delay = scheduled - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)  # pacing to the schedule, not waiting for a condition
                if uid_at >= 0:
                    data[uid_at + 24 : uid_at + 36] = b"%012d" % number
                sent = time.perf_counter()
                status = client.exchange(bytes(data))
                done = time.perf_counter()
                if not reuse:
                    client.close()
                if status != 200:
                    failures.append(f"{path}: HTTP {status}")
                    return
                latencies[lane].append(done - scheduled)
                services[lane].append(done - sent)
        except (OSError, LoadError, ValueError, IndexError) as error:
            failures.append(f"{path}: {type(error).__name__}: {error}")
        finally:
            connects[lane] = client.connects
            client.close()

    threads = [threading.Thread(target=worker, args=(lane,), daemon=True) for lane in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    if failures:
        raise LoadError(f"{len(failures)} failed request(s), first: {failures[0]}")
    all_latencies = [value for lane in latencies for value in lane]
    all_services = [value for lane in services for value in lane]
    summary = latency_summary(all_latencies)
    service = latency_summary(all_services)
    summary.update(
        offered_per_s=rate,
        achieved_per_s=len(all_latencies) / elapsed,
        service_p50_ms=service["p50_ms"],
        service_p99_ms=service["p99_ms"],
        connections_opened=sum(connects),
    )
    return summary
