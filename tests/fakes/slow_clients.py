"""Clients that tie up a server's connections the way an attacker inside the cluster would: many of them, from one
background thread and one source address (127.0.0.2 unless told: not the API server's), each reconnecting as soon
as the server closes it.

Kinds (``Attack.kind``):

* ``silent``: a TCP connection that sends nothing at all;
* ``partial-handshake``: the first half of a real TLS ClientHello, then nothing;
* ``trickle-hello``: a real ClientHello, one byte every ``interval`` seconds;
* ``trickle-head``: a full TLS handshake, then a request head one byte every ``interval`` (never silent long
  enough for a per-read timeout);
* ``trickle-body``: a whole head announcing a 2 MB ``Content-Length``, then the body one byte every ``interval``;
* ``fast-then-stall``: a whole head announcing 3 MB, all of the body but its last byte at once, then nothing;
* ``chunked``: a head with ``Transfer-Encoding: chunked`` and a first chunk that never ends;
* ``idle``: a full TLS handshake, one request (its answer read), then nothing: a kept-alive connection held open;
* ``churn``: a full TLS handshake, one request, its answer, then close and again.

Each connection is non-blocking and driven by one selector loop, so a thousand of them cost one thread. The attack
records when each connection opened and when the server closed it (``lifetimes``) and how many got an answer and
sit idle (``idle``).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

KINDS = (
    "silent",
    "partial-handshake",
    "trickle-hello",
    "trickle-head",
    "trickle-body",
    "fast-then-stall",
    "chunked",
    "idle",
    "churn",
)
ATTACKER_ADDRESS = "127.0.0.2"


def client_hello(server_hostname: str) -> bytes:
    """The ClientHello a default client context sends (from a memory BIO: no network)."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ssl.create_default_context().wrap_bio(incoming, outgoing, server_hostname=server_hostname)
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


@dataclass
class _Slow:
    sock: socket.socket | ssl.SSLSocket
    opened: float
    payload: bytes = b""
    sent: int = 0  # bytes of the payload sent
    at_once: int = 0  # bytes of the payload sent as soon as the handshake is done; the rest trickles
    next_send: float = 0.0
    handshaking: bool = False
    answered: bool = False


@dataclass
class Attack:
    host: str
    port: int
    server_hostname: str
    context: ssl.SSLContext
    kind: str
    connections: int
    interval: float = 2.0
    source: str = ATTACKER_ADDRESS
    lifetimes: list[tuple[float, float]] = field(default_factory=list)  # (opened, closed by the server)
    opened: int = 0
    idle: int = 0  # connections that got their answer and are held open now
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}")
        self._hello = client_hello(self.server_hostname)

    def __enter__(self) -> Attack:
        self._thread = threading.Thread(target=self._run, name=f"attack-{self.kind}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=20)

    # -- the loop -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        slow: list[_Slow] = []
        try:
            while not self._stop.is_set():
                while len(slow) < self.connections and not self._stop.is_set():
                    opened = self._open(selector)
                    if opened is None:
                        break
                    slow.append(opened)
                now = time.monotonic()
                for key, _ in selector.select(timeout=0.05):
                    conn = key.data
                    if not self._readable(conn):
                        self._closed(selector, slow, conn)
                for conn in list(slow):
                    if conn.handshaking:
                        self._handshake(selector, slow, conn)
                    elif conn.sent < len(conn.payload) and now >= conn.next_send:
                        self._send(selector, slow, conn, now)
        finally:
            for conn in slow:
                conn.sock.close()
            selector.close()

    def _open(self, selector: selectors.BaseSelector) -> _Slow | None:
        try:
            raw = socket.create_connection((self.host, self.port), timeout=5, source_address=(self.source, 0))
        except OSError:
            return None
        raw.setblocking(False)
        self.opened += 1
        conn = _Slow(raw, time.monotonic())
        head = f"POST /validate HTTP/1.1\r\nHost: {self.server_hostname}\r\nContent-Type: application/json\r\n"
        if self.kind == "partial-handshake":
            raw.send(self._hello[: len(self._hello) // 2])
        elif self.kind == "trickle-hello":
            conn.payload = self._hello
        elif self.kind != "silent":
            conn.sock = self.context.wrap_socket(
                raw, server_hostname=self.server_hostname, do_handshake_on_connect=False
            )
            conn.handshaking = True
            if self.kind == "trickle-head":
                conn.payload = head.encode() + b"X-Padding: " + b"a" * 4096
            elif self.kind == "trickle-body":
                conn.payload = (head + "Content-Length: 2000000\r\n\r\n").encode() + b"{" * 2_000_000
                conn.at_once = conn.payload.index(b"\r\n\r\n") + 4
            elif self.kind == "fast-then-stall":
                conn.payload = (head + "Content-Length: 3000000\r\n\r\n").encode() + b"{" * 2_999_999
                conn.at_once = len(conn.payload)  # and the last byte never comes
            elif self.kind == "chunked":
                conn.payload = (head + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"10000\r\n{" + b"x" * 65535
                conn.at_once = conn.payload.index(b"\r\n\r\n") + 4 + 8  # the head and the chunk's size line
            else:  # idle, churn: one whole request
                conn.payload = f"GET /healthz HTTP/1.1\r\nHost: {self.server_hostname}\r\n\r\n".encode()
                conn.at_once = len(conn.payload)
        selector.register(conn.sock, selectors.EVENT_READ, conn)
        return conn

    def _handshake(self, selector: selectors.BaseSelector, slow: list[_Slow], conn: _Slow) -> None:
        try:
            conn.sock.do_handshake()  # type: ignore[union-attr]
        except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
            return
        except OSError:
            self._closed(selector, slow, conn)
            return
        conn.handshaking = False
        conn.next_send = time.monotonic()

    def _send(self, selector: selectors.BaseSelector, slow: list[_Slow], conn: _Slow, now: float) -> None:
        end = max(conn.at_once, conn.sent + 1)
        try:
            conn.sent += conn.sock.send(conn.payload[conn.sent : end])
        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
            return
        except OSError:
            self._closed(selector, slow, conn)
            return
        if conn.sent >= conn.at_once:
            conn.next_send = now + self.interval

    def _readable(self, conn: _Slow) -> bool:
        """False when the server closed the connection (EOF, reset, or an answer followed by a close), or when a
        churning client got its answer."""
        if conn.handshaking:
            return True  # the handshake step reads
        try:
            data = conn.sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            return True
        except OSError:
            return False
        if data and self.kind in ("idle", "churn") and not conn.answered:
            conn.answered = True
            self.idle += 1
            return self.kind == "idle"
        return bool(data) and not self._stop.is_set()

    def _closed(self, selector: selectors.BaseSelector, slow: list[_Slow], conn: _Slow) -> None:
        if conn not in slow:
            return
        slow.remove(conn)
        if conn.answered:
            self.idle -= 1
        self.lifetimes.append((conn.opened, time.monotonic()))
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn.sock)
        conn.sock.close()


# -- requests that are wrong or large, one connection each ------------------------------------------------------------

#: heads and bodies no server should answer with a 5xx (each sent on its own connection, then the sending side shut)
MALFORMED = (
    b"GARBAGE\r\n\r\n",
    b"GET /healthz HTTP/9.9\r\n\r\n",
    b"GET healthz HTTP/1.1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n folded: yes\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nBad Name: x\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\nX: a\x00b\r\n\r\n",
    b"POST /validate HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    b"POST /validate HTTP/1.1\r\nContent-Length: -2\r\n\r\n{}",
    b"POST /validate HTTP/1.1\r\nContent-Length: 0x2\r\n\r\n{}",
    b"POST /validate HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
    b"POST /validate HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /validate HTTP/1.1\r\n\r\n{}",
    b"POST /validate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 1\r\n\r\n{",
    b"POST /validate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n[]",
    b"POST /validate HTTP/1.1\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /validate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 0\r\n\r\n",
    b'POST /validate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 22\r\n\r\n{"kind":"AdmissionRev',
    b"POST /mutate HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\n\xff\xfe{}",
    b"POST /validate HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
    b"GET /%zz HTTP/1.1\r\n\r\n",
    b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n",
    b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 5000 + b"\r\n",
    b"DELETE /validate HTTP/1.1\r\n\r\n",
    b"PUT /mutate HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}",
)


def exchange(
    host: str, port: int, server_hostname: str, context: ssl.SSLContext, request: bytes, *, shut: bool = True
) -> int:
    """Send one request on a new TLS connection from the attacker's address; the answer's status, 0 for none."""
    raw = socket.create_connection((host, port), timeout=30, source_address=(ATTACKER_ADDRESS, 0))
    answer = b""
    with context.wrap_socket(raw, server_hostname=server_hostname) as sock, contextlib.suppress(OSError):
        sock.sendall(request)
        if shut:  # nothing more comes: a body shorter than its length ends here
            socket.socket.shutdown(sock, socket.SHUT_WR)
        while b"\r\n" not in answer and (chunk := sock.recv(65536)):
            answer += chunk
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def post_head(path: str, length: int) -> bytes:
    head = f"POST {path} HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nContent-Length: {length}"
    return head.encode() + b"\r\n\r\n"
