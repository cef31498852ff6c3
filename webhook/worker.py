"""The gunicorn worker ``serve`` runs: threads judge whole requests, and only the event loop waits on clients.

gunicorn's ``gthread`` worker (27.0) hands a connection to a pool thread as soon as it is accepted or, kept alive,
turns readable; the thread does the TLS handshake and reads the request on a blocking socket, so the client
decides how long it holds the thread, and a handful of slow clients starve every review. Here the event loop does
all the waiting, without blocking and without a thread:

* it does the TLS handshake and reads the whole request (framed by ``webhook.framing``) before a pool thread runs
  the app on it; the thread hands the response back and the loop writes it. No thread reads from or writes to a
  client, so no client can hold one;
* a request must be whole within ``Limits.request_seconds`` of accept (handshake included) or, on a kept-alive
  connection, of its first byte; an answer must be taken within ``Limits.response_seconds``. Past either the
  connection is closed and counted;
* past ``Limits.max_connections`` the loop stops accepting: new connections wait in the listen backlog, since
  the API server does not retry a refused call;
* the workers of one master keep their shares of the connections even (``webhook.roster``): a worker well over
  its least-loaded sibling stops accepting and answers some of its connections' next requests with
  ``Connection: close``, so that a killed worker's replacement gets its share at once; a connection older than
  ``Limits.connection_seconds`` (or past ``Limits.connection_requests``) closes the same way, so that a new pod
  of the webhook gets its share too;
* a body over ``Limits.small_body_bytes`` is read only once it has reserved its size from the worker's
  ``Limits.large_body_budget``, held until its answer is built: a review's parsed form is many times its size.

What the thread does is gunicorn's usual request handling (its parser on the head, ``wsgi.create``, the
``pre_request``/``post_request`` hooks, the access logger, its error pages), so the app sees what it saw under
``gthread``; only the body comes from the bytes the loop framed. HTTP/2 is not offered (no ALPN in the context).
Why each limit is what it is, and what was measured: docs/webhook.md, "Staying available".
"""

from __future__ import annotations

import contextlib
import dataclasses
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
import time
from collections import deque
from collections.abc import Callable
from concurrent import futures
from datetime import datetime
from typing import Any

from gunicorn import sock as gunicorn_sock
from gunicorn import util
from gunicorn.http import RequestParser, wsgi
from gunicorn.http.errors import NoMoreData
from gunicorn.workers import base

from .framing import Frame, FrameKind, RequestReader
from .metrics import WebhookMetrics
from .roster import Roster, share
from .wsgi import CLIENT_CN, CLIENT_VERIFIED, CLIENT_VERIFY, MAX_BODY_BYTES, MAX_DISCARD_BYTES, error_body

#: The webhooks' ``timeoutSeconds`` (every entry of manifests/base/webhook-configurations.yaml; a manifest test
#: holds them equal). The API server gives up on a call after it, connection and TLS handshake included, so a
#: request not received by then is not worth reading, and an answer not taken by then is not awaited.
WEBHOOK_TIMEOUT_SECONDS = 3.0

_READ_SIZE = 64 * 1024
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
#: what a closing connection drains at least before it closes (a request pipelined behind the last one)
_LINGER_DRAIN_BYTES = 64 * 1024
#: how long idle kept-alive connections stay open once the worker is stopping (gthread's value)
_STOP_LINGER_SECONDS = 2.0
#: how often a worker publishes its connections to the roster and reconsiders its share
_BALANCE_SECONDS = 0.05
#: after retiring connections, how long a worker waits for the siblings' counts to show them before retiring more
_SETTLE_SECONDS = 1.0
#: a connection counts toward its worker's share once it is this old: shorter-lived ones (a client that opens one
#: per request, a handshake that fails) go by themselves, and counting them would retire the long-lived ones
_KEPT_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class Limits:
    """What one worker allows each connection; the defaults are serve's."""

    #: accept (or, on a kept-alive connection, the first byte) to a whole request, the TLS handshake included
    request_seconds: float = WEBHOOK_TIMEOUT_SECONDS
    #: a response handed to the loop to the last byte taken by the client
    response_seconds: float = WEBHOOK_TIMEOUT_SECONDS
    #: an idle kept-alive connection: longer than the API server's idle timeout (Go's http.Transport: 90 s), so
    #: the client closes first and never reuses a connection the server has just dropped
    idle_seconds: int = 120
    #: a connection answers with ``Connection: close`` once it is this old (``serve --max-connection-age``): how
    #: soon a new pod of the webhook gets its share of the API server's connections. The workers of one pod even
    #: out their shares without waiting for it (``webhook.roster``).
    connection_seconds: float = 60.0
    #: ... or has carried this many requests
    connection_requests: int = 1000
    #: open connections per worker; past it new ones wait in the listen backlog
    max_connections: int = 128
    max_head_bytes: int = 16 * 1024
    #: bodies up to this size are read without a reservation
    small_body_bytes: int = 128 * 1024
    #: bytes of larger bodies a worker reads and works on at a time: one largest review (its parsed form takes many
    #: times its size), so that every thread at work on one cannot take the pod past its memory limit
    large_body_budget: int = MAX_BODY_BYTES
    #: the largest body accepted; longer ones are answered 413 from their announced length and not read
    max_body_bytes: int = MAX_BODY_BYTES
    #: after the last response on a connection: how long, and how many bytes, to drain what the client still sends
    #: before closing (closing with unread data makes the kernel reset the connection, losing the response)
    linger_seconds: float = 2.0
    max_discard_bytes: int = MAX_DISCARD_BYTES

    def __post_init__(self) -> None:
        if self.large_body_budget < self.max_body_bytes:
            raise ValueError("large_body_budget must hold at least one body of max_body_bytes")


class _State(enum.Enum):
    HANDSHAKE = "handshake"
    READING = "reading a request"
    WAITING = "waiting for the body budget"
    WORKING = "in a thread"
    WRITING = "writing a response"
    IDLE = "idle, kept alive"
    LINGER = "closing"
    CLOSED = "closed"


class _Connection:
    """One client connection and where it stands; touched by the loop only, or by the one thread it is handed to."""

    __slots__ = (
        "accepted",
        "buffer",
        "client",
        "continued",
        "deadline",
        "deadline_id",
        "discard",
        "events",
        "keep_alive",
        "output",
        "reader",
        "requests",
        "reserved",
        "retire",
        "server",
        "sock",
        "state",
        "tls_environ",
    )

    def __init__(self, sock: Any, client: Any, server: Any, now: float) -> None:
        self.sock = sock
        self.client = client
        self.server = server
        self.state = _State.HANDSHAKE
        self.accepted = now
        self.deadline = now
        self.deadline_id = 0
        self.requests = 0
        self.buffer = bytearray()
        self.reader: RequestReader | None = None
        self.reserved = 0
        self.continued = False
        self.output = memoryview(b"")
        self.keep_alive = False
        self.discard = 0
        self.retire = False  # answer the next request with Connection: close, for the workers' shares
        self.tls_environ: dict[str, str] = {}
        self.events = 0


class _Output:
    """Where the thread's gunicorn ``Response`` writes: the bytes are kept for the loop to send.

    ``send`` is used only by ``wsgi.create`` for ``100 Continue``, which the loop has answered already (or which
    the client no longer waits for: its body has arrived), so it is dropped.
    """

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def sendall(self, data: bytes) -> None:
        self.parts.append(bytes(data))

    def send(self, data: bytes) -> int:
        return len(data)

    def gettimeout(self) -> float:
        return 0.0  # as a non-blocking socket: gunicorn's error pages are written without switching modes


class AdmissionWorker(base.Worker):
    """gunicorn worker: an event loop for the connections, a thread pool for the application (see module doc)."""

    limits: Limits = Limits()
    #: counts a connection dropped by the worker, by reason (``serve`` sets the metric's counter)
    count_dropped: Callable[[str], None] = staticmethod(lambda reason: None)
    #: counts a request the worker answers itself (431, 400 for bad chunking), by reason
    count_refused: Callable[[str], None] = staticmethod(lambda reason: None)
    #: the connections each worker of this master holds (``worker_class`` makes one per master)
    roster: Roster | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.poller: selectors.BaseSelector | None = None
        self.pool: futures.ThreadPoolExecutor | None = None
        self._accepting = False
        #: (deadline, its id, connection), a heap; an entry is stale once its connection has a newer deadline
        self._deadlines: list[tuple[float, int, _Connection]] = []
        self._open: set[_Connection] = set()  # every connection not yet closed
        self._sequence = itertools.count()
        self._done: queue.SimpleQueue[tuple[_Connection, bytes, bool]] = queue.SimpleQueue()
        self._wake_read = self._wake_write = -1
        self._budget = self.limits.large_body_budget
        self._waiting: deque[_Connection] = deque()
        self._slot: int | None = None  # this worker's place in the roster
        self._holding_back = False  # over its share: new connections are left to the siblings
        self._balance_at = 0.0
        self._settled_at = 0.0  # no connection is retired before this (the last ones are reconnecting)

    # -- gunicorn's Worker interface ----------------------------------------------------------------------------

    def init_process(self) -> None:
        self.pool = futures.ThreadPoolExecutor(max_workers=self.cfg.threads, thread_name_prefix="review")
        self.poller = selectors.DefaultSelector()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        super().init_process()

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.alive = False
        self._wake()

    def run(self) -> None:
        assert self.poller is not None and self.pool is not None
        self.poller.register(self._wake_read, selectors.EVENT_READ, None)
        self.poller.register(self.PIPE[0], selectors.EVENT_READ, None)  # signals wake the loop too
        for listener in self.sockets:
            listener.setblocking(False)
        if self.roster is not None:
            self._slot = self.roster.join(time.monotonic())
        while self.alive:
            self.notify()
            self._balance()
            self._set_accepting(len(self._open) < self.limits.max_connections and not self._holding_back)
            # a worker holding back for its siblings looks again soon, not after a second without events
            self._turn(_BALANCE_SECONDS if self._holding_back else 1.0)
            if self.ppid != os.getppid():
                self.log.info("Parent changed, shutting down: %s", self)
                break
        self._stop()

    # -- the loop -----------------------------------------------------------------------------------------------

    def _turn(self, longest: float = 1.0) -> None:
        """Wait for events (at most ``longest`` seconds, or until the next deadline) and handle them."""
        assert self.poller is not None
        now = time.monotonic()
        timeout = longest
        if self._deadlines:
            timeout = max(0.0, min(timeout, self._deadlines[0][0] - now))
        try:
            events = self.poller.select(timeout)
        except InterruptedError:
            events = []
        for key, mask in events:
            target = key.data
            if target is None:
                self._drain_wake(key.fd)
            elif isinstance(target, _Connection):
                self._on_event(target, mask)
            else:
                self._accept(key.fileobj)
        self._finish_done()
        self._expire(time.monotonic())

    def _set_accepting(self, accepting: bool) -> None:
        assert self.poller is not None
        if accepting == self._accepting:
            return
        for listener in self.sockets:
            if accepting:
                self.poller.register(listener, selectors.EVENT_READ, listener)
            else:
                self.poller.unregister(listener)
        self._accepting = accepting

    def _accept(self, listener: Any) -> None:
        while len(self._open) < self.limits.max_connections:
            try:
                raw, client = listener.accept()
            except OSError as error:
                if error.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.ECONNABORTED):
                    return
                raise
            now = time.monotonic()
            conn = _Connection(raw, client, listener.getsockname(), now)
            self._open.add(conn)
            try:
                if self.cfg.is_ssl:
                    raw.setblocking(False)
                    conn.sock = gunicorn_sock.ssl_context(self.cfg).wrap_socket(
                        raw, server_side=True, do_handshake_on_connect=False, suppress_ragged_eofs=True
                    )
                    conn.sock.setblocking(False)
                else:
                    raw.setblocking(False)
                    conn.state = _State.READING
            except (OSError, ValueError):
                self._close(conn)
                continue
            self._set_deadline(conn, now + self.limits.request_seconds)
            self._progress(conn)

    def _on_event(self, conn: _Connection, mask: int) -> None:
        if conn.state in (_State.HANDSHAKE, _State.READING, _State.WRITING, _State.LINGER):
            self._progress(conn)
        elif conn.state is _State.IDLE:
            conn.state = _State.READING
            conn.reader = None
            self._set_deadline(conn, time.monotonic() + self.limits.request_seconds)
            self._progress(conn)

    def _progress(self, conn: _Connection) -> None:
        """Take the connection as far as it goes without waiting; what it waits for next is then watched."""
        steps = {
            _State.HANDSHAKE: self._handshake,
            _State.READING: self._read,
            _State.WRITING: self._write,
            _State.LINGER: self._linger,
        }
        try:
            while (step := steps.get(conn.state)) is not None:
                before = conn.state
                step(conn)
                if conn.state is before:
                    return
        except ssl.SSLWantReadError:
            self._watch(conn, selectors.EVENT_READ)
        except ssl.SSLWantWriteError:
            self._watch(conn, selectors.EVENT_WRITE)
        except BlockingIOError:  # a plain socket, or the raw one under a TLS connection being closed
            self._watch(conn, selectors.EVENT_WRITE if conn.state is _State.WRITING else selectors.EVENT_READ)
        except (OSError, ValueError) as error:  # reset, broken pipe, a TLS alert, a client certificate refused
            if conn.state is _State.HANDSHAKE:
                self.count_dropped("tls-handshake-failed")
                self.log.debug("TLS handshake with %s failed: %s", conn.client, error)
            self._close(conn)

    def _handshake(self, conn: _Connection) -> None:
        conn.sock.do_handshake()
        conn.tls_environ = _client_certificate_environ(conn.sock)
        conn.state = _State.READING

    def _read(self, conn: _Connection) -> None:
        """Read until the request is whole (then hand it to a thread) or the socket has nothing more for now."""
        limits = self.limits
        if conn.reader is None:
            conn.reader = RequestReader(max_head=limits.max_head_bytes, max_body=limits.max_body_bytes)
        reader = conn.reader
        while True:
            frame = reader.advance(conn.buffer)
            if frame is None and reader.head_end is not None:
                if not self._reserve(conn):
                    return
                if reader.expects_continue and not conn.continued:
                    conn.continued = True
                    with contextlib.suppress(ssl.SSLWantWriteError, ssl.SSLWantReadError, BlockingIOError):
                        conn.sock.send(_CONTINUE)  # 25 bytes into an empty send buffer; else the client waits a while
            if frame is None:
                data = conn.sock.recv(min(_READ_SIZE, self._room(conn)))
                if data:
                    conn.buffer += data
                    continue
                frame = reader.advance(conn.buffer, eof=True)
            if frame is not None:
                self._dispatch(conn, frame)
                return

    def _room(self, conn: _Connection) -> int:
        """How many more bytes the connection may buffer now: up to the head limit while reading a head, then the
        body and a next head (a pipelined request). Always positive while the request is not whole: the framer
        answers a full head buffer or oversized chunk framing itself."""
        reader = conn.reader
        limits = self.limits
        if reader is None or reader.head_end is None:
            return limits.max_head_bytes - len(conn.buffer)
        if reader.chunked:
            return _READ_SIZE
        return reader.head_end + (reader.body_length or 0) + limits.max_head_bytes - len(conn.buffer)

    def _wanted(self, reader: RequestReader | None) -> int:
        """The body bytes a request will hold in memory: its length, or the limit when it is chunked."""
        if reader is None:
            return 0
        return self.limits.max_body_bytes if reader.chunked else reader.body_length or 0

    def _reserve(self, conn: _Connection) -> bool:
        """Whether the body of the request being read may be read now; a large one waits for the budget."""
        wanted = self._wanted(conn.reader)
        if wanted <= self.limits.small_body_bytes or conn.reserved:
            return True
        if wanted <= self._budget and not self._waiting:
            self._budget -= wanted
            conn.reserved = wanted
            return True
        conn.state = _State.WAITING
        self._watch(conn, 0)
        self._waiting.append(conn)
        return False

    def _release(self, conn: _Connection) -> None:
        """Give back a connection's reservation and let the requests waiting for the budget on, in order."""
        self._budget += conn.reserved
        conn.reserved = 0
        while self._waiting:
            waiting = self._waiting[0]
            if waiting.state is not _State.WAITING:  # closed at its deadline meanwhile
                self._waiting.popleft()
                continue
            wanted = self._wanted(waiting.reader)
            if wanted > self._budget:
                return
            self._waiting.popleft()
            self._budget -= wanted
            waiting.reserved = wanted
            waiting.state = _State.READING
            self._progress(waiting)

    def _dispatch(self, conn: _Connection, frame: Frame) -> None:
        del conn.buffer[: frame.consumed]
        conn.reader = None
        conn.continued = False
        if frame.kind is FrameKind.CLOSED:
            self._close(conn)
            return
        if frame.kind is FrameKind.HEAD_TOO_LARGE:
            self._refuse(conn, 431, "Request Header Fields Too Large", "head-too-large", "request head over the limit")
            return
        if frame.kind is FrameKind.BAD_CHUNKING:
            self._refuse(conn, 400, "Bad Request", "bad-chunking", "the chunked body does not parse or ended early")
            return
        conn.discard = max(frame.discard - len(conn.buffer), 0)  # part of an unread body may be in the buffer
        conn.state = _State.WORKING
        self._watch(conn, 0)
        assert self.pool is not None
        self.pool.submit(self._work, conn, frame)

    def _refuse(self, conn: _Connection, status: int, phrase: str, reason: str, message: str) -> None:
        """Answer a request the app never sees (its framing is beyond reading), then close."""
        self.count_refused(reason)
        body = error_body(reason, message)
        head = f"HTTP/1.1 {status} {phrase}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self._respond(conn, head.encode() + b"Connection: close\r\n\r\n" + body, keep_alive=False)

    def _respond(self, conn: _Connection, data: bytes, *, keep_alive: bool) -> None:
        conn.output = memoryview(data)
        conn.keep_alive = keep_alive
        conn.state = _State.WRITING
        self._set_deadline(conn, time.monotonic() + self.limits.response_seconds)
        self._progress(conn)

    def _write(self, conn: _Connection) -> None:
        while conn.output:
            conn.output = conn.output[conn.sock.send(conn.output) :]
        conn.requests += 1
        if conn.keep_alive and self.alive:
            now = time.monotonic()
            if conn.buffer or (isinstance(conn.sock, ssl.SSLSocket) and conn.sock.pending()):
                conn.state = _State.READING  # the next request came with this one (pipelined)
                self._set_deadline(conn, now + self.limits.request_seconds)
                return
            conn.state = _State.IDLE
            self._set_deadline(conn, now + self.limits.idle_seconds)
            self._watch(conn, selectors.EVENT_READ)
            return
        if conn.discard > self.limits.max_discard_bytes:  # a client that sends that much is not an API server
            self._close(conn)
            return
        conn.state = _State.LINGER
        conn.buffer = bytearray()
        conn.discard = max(conn.discard, _LINGER_DRAIN_BYTES)
        self._set_deadline(conn, time.monotonic() + self.limits.linger_seconds)
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)  # for a TLS socket this drops TLS too: the rest is discarded raw

    def _linger(self, conn: _Connection) -> None:
        """Drain what the client still sends after the last response, until it closes or the allowance is spent."""
        while True:
            data = conn.sock.recv(_READ_SIZE)  # BlockingIOError: nothing yet, watched by _progress
            conn.discard -= len(data)
            if not data or conn.discard <= 0:
                self._close(conn)
                return

    # -- the threads --------------------------------------------------------------------------------------------

    def _work(self, conn: _Connection, frame: Frame) -> None:
        """Runs in a pool thread: the app on one whole request; the response goes back to the loop."""
        output = _Output()
        keep_alive = False
        try:
            keep_alive = self._serve(conn, frame, output)
        except Exception:  # the last net: a worker bug must not lose the connection's slot
            self.log.exception("Error handling request")
            output.parts.clear()
        finally:
            self._done.put((conn, b"".join(output.parts), keep_alive and not frame.close))
            self._wake()

    def _serve(self, conn: _Connection, frame: Frame, output: _Output) -> bool:
        req = None
        try:
            req = next(RequestParser(self.cfg, [frame.head], conn.client))
            return self._handle(req, conn, frame, output)
        except (StopIteration, NoMoreData):
            return False
        except Exception as error:  # gunicorn's answer to a request it cannot parse (400, 431, 501 ...)
            output.parts.clear()
            self.handle_error(req, output, conn.client, error)
            return False

    def _handle(self, req: Any, conn: _Connection, frame: Frame, output: _Output) -> bool:
        """gunicorn's request handling (as its threaded worker does it), with the body from the loop."""
        environ: dict[str, Any] = {}
        resp = None
        try:
            self.cfg.pre_request(self, req)
            started = datetime.now()
            resp, environ = wsgi.create(req, output, conn.client, conn.server, self.cfg)
            environ["wsgi.multithread"] = True
            environ["wsgi.input"] = io.BytesIO(frame.body)  # reading it whole returns the same bytes, no copy
            environ.update(conn.tls_environ)
            self.nr += 1
            if self.nr >= self.max_requests and self.alive:
                self.log.info("Autorestarting worker after current request.")
                self.alive = False
            if not self.alive or not self.cfg.keepalive or frame.close or self._retiring(conn):
                resp.force_close()
            respiter = self.wsgi(environ, resp.start_response)
            try:
                if isinstance(respiter, environ["wsgi.file_wrapper"]):
                    resp.write_file(respiter)
                else:
                    for item in respiter:
                        resp.write(item)
                resp.close()
            finally:
                self.log.access(resp, req, environ, datetime.now() - started)
                if hasattr(respiter, "close"):
                    respiter.close()
            return not resp.should_close()
        finally:
            try:
                self.cfg.post_request(self, req, environ, resp)
            except Exception:
                self.log.exception("Exception in post_request hook")

    def _balance(self) -> None:
        """Publish the connections this worker keeps and act on its share of them (``webhook.roster``)."""
        now = time.monotonic()
        if self.roster is None or now < self._balance_at:
            return
        self._balance_at = now + _BALANCE_SECONDS
        if self._slot is None or not self.roster.holds(self._slot):  # none was free, or lost while wedged
            self._slot = self.roster.join(now)
            if self._slot is None:
                self._holding_back = False
                return
        kept_since = now - _KEPT_SECONDS
        keeping = [
            conn
            for conn in self._open
            if conn.accepted <= kept_since and not conn.retire and conn.state is not _State.LINGER
        ]
        self.roster.publish(self._slot, len(keeping), now)
        found = share(len(keeping), self.roster.others(self._slot, now))
        self._holding_back = not found.accept
        # the ones retired last may still be open or reconnecting elsewhere, and the siblings' counts lag: wait
        if not found.retire or now < self._settled_at or any(conn.retire for conn in self._open):
            return
        self._settled_at = now + _SETTLE_SECONDS
        keeping.sort(key=lambda conn: conn.accepted)
        for conn in keeping[: found.retire]:
            conn.retire = True
        self.log.info("Evening out the workers' connections: %d close after their next answer", found.retire)

    def _retiring(self, conn: _Connection) -> bool:
        limits = self.limits
        too_old = time.monotonic() - conn.accepted >= limits.connection_seconds
        return conn.retire or too_old or conn.requests + 1 >= limits.connection_requests

    def _finish_done(self) -> None:
        while True:
            try:
                conn, data, keep_alive = self._done.get_nowait()
            except queue.Empty:
                return
            self._release(conn)
            if not data:  # nothing to say (the client sent a partial head and left): close
                self._close(conn)
                continue
            self._respond(conn, data, keep_alive=keep_alive)

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
        if len(self._deadlines) > 2 * len(self._open) + 64:
            # Stale entries wait in the heap until their time; a kept-alive connection leaves one (120 s) per
            # request. Rebuilt from each connection's current deadline, the heap stays a few entries per connection.
            self._deadlines = [(c.deadline, c.deadline_id, c) for c in self._open if c.state is not _State.WORKING]
            heapq.heapify(self._deadlines)

    def _expire(self, now: float) -> None:
        while self._deadlines and self._deadlines[0][0] <= now:
            _, deadline_id, conn = heapq.heappop(self._deadlines)
            if deadline_id != conn.deadline_id or conn.state in (_State.WORKING, _State.CLOSED):
                continue  # a newer deadline replaced it, a thread has the connection, or it is closed
            if conn.state in (_State.HANDSHAKE, _State.READING, _State.WAITING):
                self.count_dropped("request-deadline")
            elif conn.state is _State.WRITING:
                self.count_dropped("response-deadline")
            self._close(conn)

    def _close(self, conn: _Connection) -> None:
        if conn.state is _State.CLOSED:
            return
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._watch(conn, 0)
        util.close(conn.sock)
        conn.state = _State.CLOSED
        conn.buffer = bytearray()
        conn.output = memoryview(b"")
        self._open.discard(conn)
        if conn.reserved:
            self._release(conn)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full pipe already wakes the loop
            os.write(self._wake_write, b"\0")

    @staticmethod
    def _drain_wake(fd: int) -> None:
        with contextlib.suppress(OSError):
            while os.read(fd, 4096):
                pass

    def _stop(self) -> None:
        """Stop accepting; finish what is in flight within the graceful timeout.

        Idle kept-alive connections stay open for ``_STOP_LINGER_SECONDS`` at most: a request the API server sends
        on one meanwhile is answered (with ``Connection: close``) instead of being lost with the connection.
        """
        assert self.pool is not None and self.poller is not None
        self._set_accepting(False)
        if self.roster is not None and self._slot is not None:
            self.roster.leave(self._slot)  # the siblings stop counting on this worker at once
        now = time.monotonic()
        for conn in list(self._open):
            if conn.state is _State.IDLE:
                self._set_deadline(conn, min(conn.deadline, now + _STOP_LINGER_SECONDS))
        deadline = now + self.cfg.graceful_timeout
        while self._open and time.monotonic() < deadline:
            self.notify()
            self._turn(longest=0.2)
        self.pool.shutdown(wait=False)
        self.poller.close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        for listener in self.sockets:
            listener.close()


def worker_class(limits: Limits, metrics: WebhookMetrics) -> type[AdmissionWorker]:
    """The worker ``serve`` hands gunicorn: these limits, counting in these metrics, and one roster for the workers
    of this master (made here, in the master, before it forks them)."""
    return type(
        "AdmissionWorker",
        (AdmissionWorker,),
        {
            "limits": limits,
            "count_dropped": staticmethod(metrics.count_dropped_connection),
            "count_refused": staticmethod(metrics.count_bad_request),
            "roster": Roster(),
        },
    )


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
    names = [value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"]
    return {CLIENT_VERIFY: CLIENT_VERIFIED, CLIENT_CN: names[-1] if names else ""}
