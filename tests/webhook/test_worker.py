"""The serving worker (webhook.worker) over real TLS, with raw sockets where a normal client would hide what
matters: requests pipelined on one connection, ``Expect: 100-continue``, framing the worker answers itself
(chunked bodies and a missing length among it), a body cut short, a client that does not read its answers, and a
stop with connections open.

``serve`` runs as a subprocess (``tests.fakes.webhook_server``) with its one worker, so that every connection of a
test meets the same event loop.
"""

from __future__ import annotations

import json
import signal
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.webhook.reasons import BadRequestReason, DropReason
from gpu_fence.webhook.worker import WEBHOOK_TIMEOUT_SECONDS, Limits
from gpu_fence.webhook.wsgi import MAX_BODY_BYTES
from tests.fakes.polling import wait_for
from tests.fakes.webhook_server import HOSTNAME, Server, serving

pytestmark = pytest.mark.e2e

FIXTURES = Path(__file__).parent / "admissionreviews"


def review_body() -> bytes:
    document = json.loads((FIXTURES / "pod-create-kubectl.json").read_text())
    document["request"]["uid"] = str(uuid.uuid4())
    return json.dumps(document).encode()


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    with serving(tmp_path_factory.mktemp("worker"), workers=1) as started:
        yield started


def tls(server: Server, *, receive_buffer: int | None = None) -> ssl.SSLSocket:
    raw = socket.socket()
    if receive_buffer is not None:
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    raw.settimeout(10)
    raw.connect(("127.0.0.1", server.port))
    return server.context.wrap_socket(raw, server_hostname=HOSTNAME)


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {HOSTNAME}", "Content-Type: application/json", *extra]
    if not any(line.lower().startswith(("transfer-encoding", "content-length")) for line in extra):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def responses(sock: ssl.SSLSocket, count: int) -> list[tuple[int, dict[str, str], bytes]]:
    """Read ``count`` responses (status, headers with lower-case names, body by Content-Length)."""
    buffer = b""
    found = []
    while len(found) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = sock.recv(65536)
            assert chunk, f"connection closed after {len(found)} responses"
            buffer += chunk
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(buffer) < length:
            chunk = sock.recv(65536)
            assert chunk, "connection closed within a body"
            buffer += chunk
        found.append((int(lines[0].split()[1]), headers, buffer[:length]))
        buffer = buffer[length:]
    return found


def closed_by_server(sock: ssl.SSLSocket, within: float) -> bool:
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:
        return True
    return True


def metric(server: Server, name: str, labels: dict[str, str]) -> float:
    for family in text_string_to_metric_families(server.get("/metrics").document["text"]):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def test_pipelined_requests_are_answered_in_order_on_one_connection(server):
    with tls(server) as sock:
        sock.sendall(post("/validate", review_body()) + b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
        (first, _, body), (second, _, health) = responses(sock, 2)
        assert first == 200 and json.loads(body)["response"]["allowed"] is False
        assert second == 200 and json.loads(health) == {"status": "ok"}


def test_expect_100_continue_is_answered_before_the_body_is_sent(server):
    with tls(server) as sock:
        body = review_body()
        request = post("/validate", body, "Expect: 100-continue")
        sock.sendall(request[: -len(body)])
        assert sock.recv(1024) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(body)
        [(status, _, answer)] = responses(sock, 1)
        assert status == 200 and json.loads(answer)["response"]["allowed"] is False


@pytest.mark.parametrize(
    ("request_bytes", "status", "reason"),
    [
        (post("/validate", b"{}", "X-Padding: " + "a" * Limits().max_head_bytes), 431, BadRequestReason.HEAD_TOO_LARGE),
        # the API server always sends Content-Length (Go's client does, for a body of known length): a chunked
        # body is never read, so no stalled chunk can hold the worker
        (
            post("/validate", b"2\r\n{}\r\n0\r\n\r\n", "Transfer-Encoding: chunked"),
            411,
            BadRequestReason.LENGTH_REQUIRED,
        ),
        (
            b"POST /validate HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n\r\n{}",
            411,
            BadRequestReason.LENGTH_REQUIRED,
        ),
        (post("/validate", b"{}", "Content-Length: 2", "Content-Length: 3"), 400, BadRequestReason.BAD_CONTENT_LENGTH),
        (
            b"POST /validate HTTP/1.1\r\nHost: h\r\n X-Folded: a\r\nContent-Length: 2\r\n\r\n{}",
            400,
            BadRequestReason.BAD_HEADER,
        ),
        (b"GET /healthz HTTP/2.0\r\nHost: h\r\n\r\n", 400, BadRequestReason.UNSUPPORTED_HTTP_VERSION),
        (post("/validate", b"", f"Content-Length: {MAX_BODY_BYTES + 1}"), 413, BadRequestReason.BODY_TOO_LARGE),
    ],
    ids=[BadRequestReason.HEAD_TOO_LARGE, "chunked", "no-length", "two-lengths", "folded", "http-2", "too-large"],
)
def test_framing_beyond_reading_is_answered_by_the_worker_as_json_and_counted(server, request_bytes, status, reason):
    before = metric(server, "gpu_fence_webhook_bad_requests_total", {"reason": reason})
    with tls(server) as sock:
        sock.sendall(request_bytes)
        [(got, headers, body)] = responses(sock, 1)
        assert got == status and headers["connection"] == "close"
        document = json.loads(body)
        assert document["error"] == reason and document["message"]
        assert closed_by_server(sock, 5)
    assert metric(server, "gpu_fence_webhook_bad_requests_total", {"reason": reason}) == before + 1


def test_a_body_cut_short_by_the_client_is_a_400_truncated_body(server):
    with tls(server) as sock:
        body = review_body()
        request = post("/validate", body)
        sock.sendall(request[:-10])
        socket.socket.shutdown(sock, socket.SHUT_WR)  # TCP only (TLS stays up to read the answer): nothing more comes
        [(status, _, answer)] = responses(sock, 1)
        assert status == 400 and json.loads(answer)["error"] == BadRequestReason.TRUNCATED_BODY


def test_a_client_that_stops_mid_request_is_closed_at_the_deadline_and_counted(server):
    before = metric(server, "gpu_fence_webhook_connections_dropped_total", {"reason": DropReason.REQUEST_DEADLINE})
    with tls(server) as sock:
        request = post("/validate", review_body())
        sock.sendall(request[:-10])
        started = time.monotonic()
        assert closed_by_server(sock, WEBHOOK_TIMEOUT_SECONDS + 5)
        assert time.monotonic() - started < WEBHOOK_TIMEOUT_SECONDS + 5
    after = metric(server, "gpu_fence_webhook_connections_dropped_total", {"reason": DropReason.REQUEST_DEADLINE})
    assert after == before + 1


def test_a_client_that_does_not_read_its_answers_is_closed_and_counted(server):
    """Pipelined requests and no reads: the answers fill the socket buffers, the worker stops reading the next
    request, and once an answer is not taken within the response deadline the connection is closed."""
    before = metric(server, "gpu_fence_webhook_connections_dropped_total", {"reason": DropReason.RESPONSE_DEADLINE})
    sock = tls(server, receive_buffer=4096)
    sock.setblocking(False)
    request = b"GET /metrics HTTP/1.1\r\nHost: h\r\n\r\n"

    def closed() -> bool:
        try:
            sock.send(request)
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            return False  # the server is not reading: keep offering, as an attacker would
        except OSError:
            return True
        return False

    try:
        wait_for(closed, "the server to close a connection whose client reads nothing", timeout=30, interval=0.01)
    finally:
        sock.close()
    after = metric(server, "gpu_fence_webhook_connections_dropped_total", {"reason": DropReason.RESPONSE_DEADLINE})
    assert after >= before + 1


def test_a_stopping_server_answers_on_kept_alive_connections_then_exits(tmp_path):
    with serving(tmp_path, workers=1) as stopping:
        idle = [tls(stopping) for _ in range(3)]
        for sock in idle:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n")
            [(status, headers, _)] = responses(sock, 1)
            assert status == 200 and headers["connection"] == "keep-alive"
        stopping.process.send_signal(signal.SIGTERM)

        def answered_closing() -> bool:
            """A review on a kept-alive connection is answered; once the worker has the signal, with close."""
            idle[0].sendall(post("/validate", review_body()))
            [(status, headers, _)] = responses(idle[0], 1)
            assert status == 200
            return headers["connection"] == "close"

        wait_for(answered_closing, "the stopping worker to answer with Connection: close", timeout=10)
        assert stopping.process.wait(timeout=15) == 0
        for sock in idle:
            sock.close()
