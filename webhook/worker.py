"""The gunicorn worker ``serve`` runs: one event loop waits on every client, threads judge whole requests.

gunicorn's own ``gthread`` worker hands a connection to a pool thread that does the TLS handshake and reads the
request on a blocking socket, so a client that sends slowly holds a thread for as long as it likes; and it keeps
idle connections until they time out, so a client that holds enough of them stops every new one (docs/webhook.md,
"Staying available"). This worker is written on gunicorn's documented worker interface (``base.Worker``: ``run``,
``notify``, ``alive``, ``sockets``, ``wsgi``, ``PIPE``) and nothing else of gunicorn's; gunicorn stays the master
that binds, forks, restarts a killed worker and drains on SIGTERM. Per connection:

* the loop does the TLS handshake and reads the whole request (head by ``webhook.http1``, then exactly
  ``Content-Length`` bytes) without blocking, within ``Limits.request_seconds`` of accept (handshake included) or,
  on a kept-alive connection, of its next request's first byte; a pool thread then runs the app on the whole
  request and hands the bytes back; the loop writes them within ``Limits.response_seconds``. No thread waits on
  a client;
* connection slots are a resource: when all ``Limits.max_connections`` are taken, the connection idle longest is
  closed to admit a new one (never one with a request in flight); one client address holds at most
  ``Limits.max_connections_per_client``, past which its own idle connection goes first, else the new one is
  closed at once;
* memory: bytes are counted as they arrive, not as announced, so a client that sends slowly holds only what it
  sent; past ``Limits.small_body_bytes`` a body reads on while the worker's ``receive_budget`` (and the client
  address's share of it) has room, and once whole, a large body waits for ``Limits.work_budget`` before a thread
  parses it (a review's parsed form is many times its size): threads work at CPU speed, never at a client's.

Each connection is a generator (``_conversation``) that yields what it waits for; the loop resumes it when the
socket is ready, a thread is done or memory is freed, and closes it at its deadline.
"""

from __future__ import annotations

import contextlib
import dataclasses
import email.utils
import enum
import errno
import heapq
import io
import itertools
import os
import queue
import selectors
import socket
import ssl
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Generator
from concurrent import futures
from http import HTTPStatus
from typing import Any, cast

from gunicorn.workers import base

from .http1 import Head, Refusal, parse_head, response_head
from .metrics import WebhookMetrics
from .reasons import BadRequestReason, DropReason
from .wsgi import CLIENT_CN, CLIENT_VERIFIED, CLIENT_VERIFY, MAX_BODY_BYTES, MAX_DISCARD_BYTES, error_body

#: The webhooks' ``timeoutSeconds`` (every entry of manifests/base/webhook-configurations.yaml; a manifest test
#: holds them equal). The API server gives up on a call after it, connection and TLS handshake included, so a
#: request not received by then is not worth reading, and an answer not taken by then is not awaited.
WEBHOOK_TIMEOUT_SECONDS = 3.0

_READ_SIZE = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: what a closing connection drains at least before it closes (a request sent behind the last one)
_LINGER_DRAIN_BYTES = 64 * 1024
#: how long idle kept-alive connections stay open once the worker is stopping (gthread's value)
_STOP_LINGER_SECONDS = 2.0
#: descriptors kept for everything but client connections: listeners, pipes, logs, the metrics files
_RESERVED_DESCRIPTORS = 64
#: events handled per client address in one turn of the loop
_EVENTS_PER_CLIENT = 8


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one worker allows; the defaults are serve's (why each: docs/webhook.md, "Staying available")."""

    #: accept (or, on a kept-alive connection, the first byte) to a whole request, the TLS handshake included
    request_seconds: float = WEBHOOK_TIMEOUT_SECONDS
    #: a response handed to the loop to the last byte taken by the client
    response_seconds: float = WEBHOOK_TIMEOUT_SECONDS
    #: an idle kept-alive connection (``serve --idle-timeout``): longer than the API server's own 90 s, so that
    #: its client closes first and never sends on a connection the server is closing
    idle_seconds: float = 120.0
    #: a connection answers with ``Connection: close`` once it is this old (``serve --max-connection-age``), so
    #: that a new pod of the webhook gets its share of the API server's connections
    connection_seconds: float = 60.0
    #: ... or has carried this many requests
    connection_requests: int = 1000
    #: open connections (fewer when the descriptor limit is lower); past it the longest idle one is closed
    max_connections: int = 1024
    #: open connections from one client address: above what one API server keeps to a pod (docs/webhook.md)
    max_connections_per_client: int = 128
    max_head_bytes: int = 16 * 1024
    #: bytes a connection may hold whatever the budgets say: a typical review, whole
    small_body_bytes: int = 64 * 1024
    #: bytes received and not yet handed to a thread, over every connection, and from one client address
    receive_budget: int = 32 * 2**20
    client_receive_budget: int = 8 * 2**20
    #: bytes of bodies over ``small_body_bytes`` that threads work on at once: one largest review, so that every
    #: thread at work on one cannot take the pod past its memory limit
    work_budget: int = MAX_BODY_BYTES
    #: the largest body accepted; a longer one is answered 413 from its announced length and not read
    max_body_bytes: int = MAX_BODY_BYTES
    #: after the last response on a connection: how long, and how many bytes, to drain what the client still sends
    #: before closing (closing with unread data makes the kernel reset the connection, losing the response)
    linger_seconds: float = 2.0
    max_discard_bytes: int = MAX_DISCARD_BYTES

    def __post_init__(self) -> None:
        if self.work_budget < self.max_body_bytes or self.client_receive_budget < self.max_body_bytes:
            raise ValueError("work_budget and client_receive_budget must hold at least one body of max_body_bytes")


class _State(enum.Enum):
    HANDSHAKE = "handshake"
    READING = "reading a request"
    WAITING = "waiting for memory"
    WORKING = "in a thread"
    WRITING = "writing a response"
    IDLE = "idle, kept alive"
    LINGER = "closing"
    CLOSED = "closed"


#: what a connection's generator yields: a socket event to wait for, memory, or a request for a thread
_WAIT_FOR_MEMORY = object()


@dataclasses.dataclass(frozen=True, slots=True)
class _Work:
    head: Head
    body: bytes
    keep_alive: bool


class _Connection:
    """One client connection; touched by the loop only (a thread gets a ``_Work``, never the connection)."""

    __slots__ = (
        "accepted",
        "address",
        "buffer",
        "deadline",
        "deadline_id",
        "events",
        "held",
        "peer",
        "requests",
        "reserved",
        "server",
        "sock",
        "state",
        "steps",
        "tls_environ",
    )

    def __init__(self, sock: Any, peer: Any, server: Any, now: float) -> None:
        self.sock = sock
        self.peer = peer
        self.address: str = peer[0] if isinstance(peer, tuple) else str(peer)
        self.server = server
        self.state = _State.HANDSHAKE
        self.accepted = now
        self.deadline = now
        self.deadline_id = 0
        self.requests = 0
        self.buffer = bytearray()
        self.held = 0  # bytes of the buffer counted in the receive budgets
        self.reserved = 0  # bytes of the work budget this connection's request holds
        self.events = 0
        self.tls_environ: dict[str, str] = {}
        self.steps: Generator[Any, Any, None] | None = None


class AdmissionWorker(base.Worker):  # type: ignore[misc]  # gunicorn ships no type information
    """gunicorn worker: an event loop for the connections, a thread pool for the application (see module doc)."""

    limits: Limits = Limits()
    #: the TLS context for a new connection (``serve``: the certificate store's, reloaded when the files change)
    tls_context: Callable[[], ssl.SSLContext] | None = None
    #: counts a connection closed without an answer, by reason (``serve`` sets the metric's counter)
    count_dropped: Callable[[DropReason], None] = staticmethod(lambda reason: None)
    #: counts a request the worker answers itself (431, 411, 413 ...), by reason
    count_refused: Callable[[BadRequestReason], None] = staticmethod(lambda reason: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.poller: selectors.BaseSelector | None = None
        self.pool: futures.ThreadPoolExecutor | None = None
        self.capacity = self.limits.max_connections
        self._accepting = False
        #: (deadline, its id, connection), a heap; an entry is stale once its connection has a newer deadline
        self._deadlines: list[tuple[float, int, _Connection]] = []
        self._sequence = itertools.count()
        self._open: set[_Connection] = set()
        self._idle: dict[_Connection, None] = {}  # idle kept-alive connections, longest idle first
        self._per_client: Counter[str] = Counter()
        self._received = 0
        self._received_by: Counter[str] = Counter()
        self._work_free = self.limits.work_budget
        self._waiting: deque[_Connection] = deque()
        self._freed = False  # memory was given back this turn: the waiting connections look again
        self._done: queue.SimpleQueue[tuple[_Connection, bytes]] = queue.SimpleQueue()
        self._date = (0, "")

    # -- gunicorn's Worker interface ----------------------------------------------------------------------------

    def init_process(self) -> None:
        self.pool = futures.ThreadPoolExecutor(max_workers=self.cfg.threads, thread_name_prefix="review")
        self.poller = selectors.DefaultSelector()
        super().init_process()

    def run(self) -> None:
        assert self.poller is not None
        self.capacity = min(self.limits.max_connections, _descriptor_limit() - _RESERVED_DESCRIPTORS)
        self.poller.register(self.PIPE[0], selectors.EVENT_READ, None)  # signals and finished threads wake the loop
        for listener in self.sockets:
            listener.setblocking(False)
        while self.alive:
            self.notify()
            self._set_accepting(len(self._open) < self.capacity or bool(self._idle))
            self._turn(1.0)
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
        self._stop()

    # -- the loop -----------------------------------------------------------------------------------------------

    def _turn(self, longest: float) -> None:
        """Wait for events (at most ``longest`` seconds, or until the next deadline) and handle them."""
        assert self.poller is not None
        timeout = longest
        if self._deadlines:
            timeout = max(0.0, min(timeout, self._deadlines[0][0] - time.monotonic()))
        handled: Counter[str] = Counter()
        for key, _ in self.poller.select(timeout):
            if key.data is None:
                with contextlib.suppress(OSError):
                    while os.read(key.fd, 4096):
                        pass
            elif isinstance(key.data, _Connection):
                # a few events per client address a turn: one that floods (TLS handshakes cost ~1 ms each) makes
                # every turn longer only by its share, and what it had ready more is reported again next turn
                handled[key.data.address] += 1
                if handled[key.data.address] <= _EVENTS_PER_CLIENT:
                    self._advance(key.data)
            else:
                self._accept(key.fileobj)
        while True:
            try:
                conn, data = self._done.get_nowait()
            except queue.Empty:
                break
            self._advance(conn, data)
        while self._freed:
            self._freed = False
            for conn in [self._waiting.popleft() for _ in range(len(self._waiting))]:
                self._advance(conn)
        self._expire(time.monotonic())

    def _set_accepting(self, accepting: bool) -> None:
        assert self.poller is not None
        if accepting != self._accepting:
            for listener in self.sockets:
                if accepting:
                    self.poller.register(listener, selectors.EVENT_READ, listener)
                else:
                    self.poller.unregister(listener)
            self._accepting = accepting

    def _accept(self, listener: Any) -> None:
        while len(self._open) < self.capacity or self._idle:
            try:
                raw, peer = listener.accept()
            except OSError as error:
                if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED):
                    return
                raise
            if len(self._open) >= self.capacity:
                self._evict(None)
            conn = _Connection(raw, peer, listener.getsockname(), time.monotonic())
            if self._per_client[conn.address] >= self.limits.max_connections_per_client and not self._evict(
                conn.address
            ):
                self.count_dropped(DropReason.CLIENT_LIMIT)
                raw.close()
                continue
            self._open.add(conn)
            self._per_client[conn.address] += 1
            raw.setblocking(False)
            if self.tls_context is not None:
                try:
                    conn.sock = self.tls_context().wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
                    conn.sock.setblocking(False)  # a context may give its sockets a timeout (serve's do)
                except (OSError, ValueError):
                    self._close(conn)
                    continue
            else:
                conn.state = _State.READING
            self._set_deadline(conn, conn.accepted + self.limits.request_seconds)
            conn.steps = self._conversation(conn)
            self._watch(conn, selectors.EVENT_READ)  # its handshake waits for its turn, as any client's event

    def _evict(self, address: str | None) -> bool:
        """Close the connection idle longest (of ``address``, or of any client) to make room; whether one was."""
        victim = next((conn for conn in self._idle if address is None or conn.address == address), None)
        if victim is None:
            return False
        self.count_dropped(DropReason.IDLE_EVICTED)
        self._close(victim)
        return True

    def _advance(self, conn: _Connection, value: Any = None) -> None:
        """Resume the connection's conversation until it waits again; watch what it waits for."""
        if conn.state is _State.CLOSED or conn.steps is None:
            return
        try:
            wanted = conn.steps.send(value)
        except StopIteration:
            self._close(conn)
            return
        except (OSError, ValueError) as error:  # reset, broken pipe, a TLS alert, a client certificate refused
            if conn.state is _State.HANDSHAKE:
                self.count_dropped(DropReason.TLS_HANDSHAKE_FAILED)
                self.log.debug("TLS handshake with %s failed: %s", conn.peer, error)
            self._close(conn)
            return
        except Exception:  # a bug of this worker: it loses this connection, not every other one
            self.log.exception("Error handling connection from %s", conn.peer)
            self._close(conn)
            return
        if isinstance(wanted, _Work):
            assert self.pool is not None
            self._watch(conn, 0)
            conn.state = _State.WORKING
            self.pool.submit(self._work, conn, wanted)
        elif wanted is _WAIT_FOR_MEMORY:
            self._watch(conn, 0)
            self._waiting.append(conn)
        else:
            self._watch(conn, wanted)

    # -- one connection -----------------------------------------------------------------------------------------

    def _conversation(self, conn: _Connection) -> Generator[Any, Any, None]:
        if conn.state is _State.HANDSHAKE:
            while True:
                try:
                    conn.sock.do_handshake()
                    break
                except ssl.SSLWantReadError:
                    yield selectors.EVENT_READ
                except ssl.SSLWantWriteError:
                    yield selectors.EVENT_WRITE
            conn.tls_environ = _client_certificate_environ(conn.sock)
            conn.state = _State.READING
        while True:
            request = yield from self._receive(conn)
            if request is None:
                return
            if isinstance(request, Refusal):
                self.count_refused(request.reason)
                body = error_body(request.reason, request.message)
                status = f"{request.status} {HTTPStatus(request.status).phrase}"
                headers = [("Content-Type", "application/json")]
                yield from self._send(
                    conn, response_head(status, headers, len(body), keep_alive=False, date=self._now()) + body
                )
                # a body announced too large may still be coming: read it away so that the client gets the answer
                yield from self._linger(
                    conn, self.limits.max_discard_bytes if request.status == 413 else _LINGER_DRAIN_BYTES
                )
                return
            head, body, whole = request
            if len(body) > self.limits.small_body_bytes:
                while len(body) > self._work_free:
                    conn.state = _State.WAITING
                    yield _WAIT_FOR_MEMORY
                self._work_free -= len(body)
                conn.reserved = len(body)
            keep_alive = head.keep_alive and whole and self.alive and not self._retiring(conn)
            data = yield _Work(head, body, keep_alive)
            self._release_work(conn)
            yield from self._send(conn, data)
            if not keep_alive:
                yield from self._linger(conn, _LINGER_DRAIN_BYTES)
                return
            if conn.buffer:  # the next request came with this one
                conn.state = _State.READING
                self._set_deadline(conn, time.monotonic() + self.limits.request_seconds)
            else:
                conn.state = _State.IDLE
                self._idle[conn] = None
                idle = self.limits.idle_seconds if self.alive else _STOP_LINGER_SECONDS
                self._set_deadline(conn, time.monotonic() + idle)

    def _receive(self, conn: _Connection) -> Generator[Any, Any, tuple[Head, bytes, bool] | Refusal | None]:
        """The next request (its head, its body, and whether the body came whole), a refusal, or None when the
        client ended the connection before a whole head."""
        limits = self.limits
        while (end := conn.buffer.find(b"\r\n\r\n")) < 0:
            if len(conn.buffer) >= limits.max_head_bytes:
                return Refusal(431, BadRequestReason.HEAD_TOO_LARGE, f"request head over {limits.max_head_bytes} bytes")
            data = yield from self._recv(conn, limits.max_head_bytes - len(conn.buffer))
            if not data:
                return None
            if conn.state is _State.IDLE:  # a kept-alive connection's next request: its deadline starts now
                del self._idle[conn]
                conn.state = _State.READING
                self._set_deadline(conn, time.monotonic() + limits.request_seconds)
            self._take(conn, data)
        if end + 4 > limits.max_head_bytes:
            return Refusal(431, BadRequestReason.HEAD_TOO_LARGE, f"request head over {limits.max_head_bytes} bytes")
        head = parse_head(bytes(conn.buffer[:end]))
        if isinstance(head, Refusal):
            return head
        if head.content_length > limits.max_body_bytes:
            too_large = f"body of {head.content_length} bytes is over the {limits.max_body_bytes}-byte limit"
            return Refusal(413, BadRequestReason.BODY_TOO_LARGE, too_large)
        wanted = end + 4 + head.content_length
        if head.expects_continue and len(conn.buffer) < wanted:
            with contextlib.suppress(ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                conn.sock.send(_CONTINUE)  # 25 bytes into an empty send buffer; else the client waits a while
        while len(conn.buffer) < wanted:
            while not self._room(conn):
                conn.state = _State.WAITING
                yield _WAIT_FOR_MEMORY
            conn.state = _State.READING
            data = yield from self._recv(conn, min(_READ_SIZE, wanted - len(conn.buffer)))
            if not data:  # the client ended its side mid-body: the app answers 400 truncated-body
                break
            self._take(conn, data)
        body = bytes(conn.buffer[end + 4 : wanted])
        del conn.buffer[:wanted]
        self._count_held(conn)
        return head, body, len(body) == head.content_length

    def _recv(self, conn: _Connection, size: int) -> Generator[int, None, bytes]:
        while True:
            try:
                data: bytes = conn.sock.recv(size)
            except (ssl.SSLWantReadError, BlockingIOError):
                yield selectors.EVENT_READ
            except ssl.SSLWantWriteError:
                yield selectors.EVENT_WRITE
            else:
                return data

    def _send(self, conn: _Connection, data: bytes) -> Generator[int, None, None]:
        conn.state = _State.WRITING
        self._set_deadline(conn, time.monotonic() + self.limits.response_seconds)
        view = memoryview(data)
        while view:
            try:
                view = view[conn.sock.send(view) :]
            except (ssl.SSLWantWriteError, BlockingIOError):
                yield selectors.EVENT_WRITE
            except ssl.SSLWantReadError:
                yield selectors.EVENT_READ
        conn.requests += 1

    def _linger(self, conn: _Connection, allowance: int) -> Generator[int, None, None]:
        """Drain what the client still sends after the last response, until it closes or the allowance is spent."""
        conn.state = _State.LINGER
        conn.buffer = bytearray()
        self._count_held(conn)
        self._set_deadline(conn, time.monotonic() + self.limits.linger_seconds)
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)  # for a TLS socket this drops TLS too: the rest is discarded raw
        while allowance > 0:
            data = yield from self._recv(conn, _READ_SIZE)
            if not data:
                return
            allowance -= len(data)

    def _retiring(self, conn: _Connection) -> bool:
        too_old = time.monotonic() - conn.accepted >= self.limits.connection_seconds
        return too_old or conn.requests + 1 >= self.limits.connection_requests

    # -- memory -------------------------------------------------------------------------------------------------

    def _room(self, conn: _Connection) -> bool:
        """Whether the connection may read more of its body now."""
        limits = self.limits
        return len(conn.buffer) < limits.small_body_bytes or (
            self._received < limits.receive_budget and self._received_by[conn.address] < limits.client_receive_budget
        )

    def _take(self, conn: _Connection, data: bytes) -> None:
        conn.buffer += data
        self._count_held(conn)

    def _count_held(self, conn: _Connection) -> None:
        change = len(conn.buffer) - conn.held
        conn.held = len(conn.buffer)
        self._received += change
        self._received_by[conn.address] += change
        if change < 0:
            self._freed = True
            if not self._received_by[conn.address]:
                del self._received_by[conn.address]

    def _release_work(self, conn: _Connection) -> None:
        if conn.reserved:
            self._work_free += conn.reserved
            conn.reserved = 0
            self._freed = True

    # -- the threads --------------------------------------------------------------------------------------------

    def _work(self, conn: _Connection, work: _Work) -> None:
        """Runs in a pool thread: the app on one whole request; the response goes back to the loop."""
        try:
            data = self._respond(conn, work)
        except Exception:  # the last net: a worker bug must not lose the connection
            self.log.exception("Error handling request")
            body = error_body("internal-error", "internal error in the server")
            data = response_head("500 Internal Server Error", [], len(body), keep_alive=False, date=self._now())
            data += body
        self._done.put((conn, data))
        with contextlib.suppress(OSError):  # a full pipe already wakes the loop
            os.write(self.PIPE[1], b"\0")

    def _respond(self, conn: _Connection, work: _Work) -> bytes:
        head = work.head
        started: list[Any] = []
        chunks: list[bytes] = []

        def start_response(
            status: str, headers: list[tuple[str, str]], exc_info: Any = None
        ) -> Callable[[bytes], None]:
            if exc_info and started:
                raise exc_info[1].with_traceback(exc_info[2])
            started[:] = [status, headers]
            return chunks.append

        result = self.wsgi(self._environ(conn, head, work.body), start_response)
        try:
            chunks.extend(result)
        finally:
            if hasattr(result, "close"):
                result.close()
        body = b"" if head.method == "HEAD" else b"".join(chunks)
        status, headers = started
        return response_head(status, headers, len(body), keep_alive=work.keep_alive, date=self._now()) + body

    def _environ(self, conn: _Connection, head: Head, body: bytes) -> dict[str, Any]:
        """The request as WSGI (PEP 3333) gives it to the app."""
        host, port = conn.server[:2] if isinstance(conn.server, tuple) else (str(conn.server), 0)
        environ: dict[str, Any] = {
            "REQUEST_METHOD": head.method,
            "SCRIPT_NAME": "",
            "PATH_INFO": head.path,
            "QUERY_STRING": head.query,
            "SERVER_NAME": host,
            "SERVER_PORT": str(port),
            "SERVER_PROTOCOL": head.version,
            "REMOTE_ADDR": conn.address,
            "REMOTE_PORT": str(conn.peer[1]) if isinstance(conn.peer, tuple) else "",
            "wsgi.version": (1, 0),
            "wsgi.url_scheme": "https" if self.tls_context is not None else "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.multithread": True,
            "wsgi.multiprocess": self.cfg.workers > 1,
            "wsgi.run_once": False,
            **conn.tls_environ,
        }
        for name, value in head.fields:
            if "_" in name:  # would read as its dashed twin: dropped, as gunicorn does by default
                continue
            key = name.upper().replace("-", "_")
            if key not in ("CONTENT_TYPE", "CONTENT_LENGTH"):
                key = "HTTP_" + key
            environ[key] = f"{environ[key]},{value}" if key in environ and key.startswith("HTTP_") else value
        return environ

    def _now(self) -> str:
        """The ``Date`` field's value, formatted once a second."""
        second = int(time.time())
        cached, text = self._date  # one tuple, replaced whole: threads never see half an update
        if second != cached:
            text = email.utils.formatdate(second, usegmt=True)
            self._date = (second, text)
        return text

    # -- bookkeeping --------------------------------------------------------------------------------------------

    def _watch(self, conn: _Connection, events: int) -> None:
        assert self.poller is not None
        if events == conn.events:
            return
        if conn.events and events:
            self.poller.modify(conn.sock, events, conn)
        elif events:
            self.poller.register(conn.sock, events, conn)
        else:
            self.poller.unregister(conn.sock)
        conn.events = events

    def _set_deadline(self, conn: _Connection, deadline: float) -> None:
        conn.deadline = deadline
        conn.deadline_id = next(self._sequence)
        heapq.heappush(self._deadlines, (deadline, conn.deadline_id, conn))
        if len(self._deadlines) > 2 * len(self._open) + 64:  # stale entries: rebuild from the current deadlines
            self._deadlines = [(c.deadline, c.deadline_id, c) for c in self._open]
            heapq.heapify(self._deadlines)

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, deadline_id, conn = heapq.heappop(self._deadlines)
            if deadline_id != conn.deadline_id or conn.state in (_State.WORKING, _State.CLOSED):
                continue  # a newer deadline replaced it, a thread has the request, or it is closed
            if conn.state in (_State.HANDSHAKE, _State.READING, _State.WAITING):
                self.count_dropped(DropReason.REQUEST_DEADLINE)
            elif conn.state is _State.WRITING:
                self.count_dropped(DropReason.RESPONSE_DEADLINE)
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if conn.state is _State.CLOSED:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._watch(conn, 0)
        with contextlib.suppress(OSError):
            conn.sock.close()
        conn.state = _State.CLOSED
        self._open.discard(conn)
        self._idle.pop(conn, None)
        self._per_client[conn.address] -= 1
        if not self._per_client[conn.address]:
            del self._per_client[conn.address]
        conn.buffer = bytearray()
        self._count_held(conn)
        self._release_work(conn)
        if conn.steps is not None:
            conn.steps.close()

    def _stop(self) -> None:
        """Stop accepting; finish what is in flight within the graceful timeout.

        Idle kept-alive connections stay open for ``_STOP_LINGER_SECONDS`` at most: a request the API server sends
        on one meanwhile is answered (with ``Connection: close``) instead of being lost with the connection.
        """
        assert self.pool is not None and self.poller is not None
        self._set_accepting(False)
        now = time.monotonic()
        for conn in list(self._idle):
            self._set_deadline(conn, min(conn.deadline, now + _STOP_LINGER_SECONDS))
        deadline = now + self.cfg.graceful_timeout
        while self._open and time.monotonic() < deadline:
            self.notify()
            self._turn(0.2)
        self.pool.shutdown(wait=False)
        self.poller.close()
        for listener in self.sockets:
            listener.close()


def worker_class(limits: Limits, metrics: WebhookMetrics, tls_context: Callable[[], ssl.SSLContext]) -> type:
    """The worker ``serve`` hands gunicorn: these limits and TLS contexts, counting in these metrics."""
    return type(
        "AdmissionWorker",
        (AdmissionWorker,),
        {
            "limits": limits,
            "tls_context": staticmethod(tls_context),
            "count_dropped": staticmethod(metrics.count_dropped_connection),
            "count_refused": staticmethod(metrics.count_bad_request),
        },
    )


def _descriptor_limit() -> int:
    """The soft limit on open files, raised to the hard one first (as Go's runtime does at start)."""
    import resource  # noqa: PLC0415 - POSIX only, and only here

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def _client_certificate_environ(sock: Any) -> dict[str, str]:
    """What the WSGI app learns of the client's certificate (``webhook.wsgi.ClientAuth`` reads it).

    With a client CA, the context verifies a certificate during the handshake and fails the handshake on one it does
    not trust, so a certificate present here is a verified one; without one, no certificate is asked for.
    """
    if not isinstance(sock, ssl.SSLSocket):
        return {}
    certificate = sock.getpeercert()
    if not certificate:
        return {CLIENT_VERIFY: "NONE"}
    # a subject is relative distinguished names of (key, value) pairs (ssl.SSLSocket.getpeercert)
    subject = cast(tuple[tuple[tuple[str, str], ...], ...], certificate.get("subject", ()))
    names = [value for rdn in subject for key, value in rdn if key == "commonName"]
    return {CLIENT_VERIFY: CLIENT_VERIFIED, CLIENT_CN: names[-1] if names else ""}
