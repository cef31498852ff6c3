"""Where one HTTP/1.1 request ends in the bytes a connection has received so far: pure, no I/O.

The serving worker (``webhook.worker``) reads each connection without blocking and hands a request to a thread
only once it is whole, so that no client can hold a thread by sending slowly. To know when a request is whole it
needs the request's framing, and only that: the end of the head (``CRLF CRLF``), then ``Content-Length`` bytes
or a chunked body. Everything else about the request (the request line, header syntax, what the headers mean) is
gunicorn's parser's business, which reads the head afterwards in the thread, as for any gunicorn worker.

Framing that is ambiguous or that gunicorn would refuse (two ``Content-Length`` fields, one that is not a plain
number, ``Transfer-Encoding`` with ``Content-Length``, a coding other than a final ``chunked``) is not guessed at:
the head alone goes to the parser, which answers it (400 or 501), and the connection closes after that answer,
since where the next request would start is unknown. A body over the limit is not read: the head goes on alone,
the application answers 413 from the announced length, and the worker discards what follows while it closes.

A chunked body is decoded here (the thread gets the body, not the chunks), up to the limit; past it, the first
``max_body + 1`` decoded bytes go on, so that the application answers 413 as it does for a long chunked body.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

#: The end of a request head (RFC 9112 section 2.1); a chunk-size line and a trailer line end in CRLF too.
_END_OF_HEAD = b"\r\n\r\n"
_CRLF = b"\r\n"
#: A chunk-size line is a few hex digits and, rarely, extensions; longer is an abuse.
MAX_CHUNK_LINE = 1024
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")


class FrameKind(enum.Enum):
    """What the bytes received so far amount to."""

    #: a whole request: its head and its body (possibly cut at ``max_body + 1`` decoded bytes: ``close`` is set)
    COMPLETE = "complete"
    #: framing for gunicorn's parser to refuse (ambiguous or malformed length): the head alone; close after
    HEAD_ONLY = "head-only"
    #: ``Content-Length`` over the limit: the head alone, the application answers 413; close, discarding the rest
    OVERSIZED = "oversized"
    #: the client ended its side in the middle of a ``Content-Length`` body: the head and what came; close after
    TRUNCATED = "truncated"
    #: no end of head within the limit: answered 431 by the worker, then closed
    HEAD_TOO_LARGE = "head-too-large"
    #: a chunked body that does not parse, or that ended before its last chunk: answered 400 by the worker
    BAD_CHUNKING = "bad-chunking"
    #: the client ended its side before a whole head (or between requests): closed without an answer
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameKind
    #: the request head, ``CRLF CRLF`` included (empty for the kinds without one)
    head: bytes = b""
    #: the body as the application reads it (decoded when chunked)
    body: bytes = b""
    #: how many bytes of the connection's buffer this request used; what follows belongs to the next one
    consumed: int = 0
    #: no further request is read on this connection
    close: bool = False
    #: bytes the client announced but that are not read; the worker discards them while it closes
    discard: int = 0


class RequestReader:
    """Frames one request as its bytes arrive: call :meth:`advance` with the connection's buffer after each read.

    The buffer always starts at this request's first byte and only grows between calls; each call resumes where
    the last one stopped, so reading a request costs time linear in its size however it is split. After the
    head is read, ``body_length`` (the announced length, or None when chunked or when the head alone goes on)
    and ``expects_continue`` tell the worker whether to reserve memory for the body and to send
    ``100 Continue``.
    """

    def __init__(self, *, max_head: int, max_body: int) -> None:
        self.max_head = max_head
        self.max_body = max_body
        self.head_end: int | None = None
        self.body_length: int | None = None
        self.chunked = False
        self.expects_continue = False
        self._scanned = 0  # bytes already searched for the end of the head
        self._chunks: _Chunks | None = None

    def advance(self, buffer: bytes | bytearray, *, eof: bool = False) -> Frame | None:
        """The request, when the buffer holds a whole one (or what the client's end makes of it); else None."""
        if self.head_end is None:
            frame = self._read_head(buffer, eof)
            if frame is not None or self.head_end is None:
                return frame
        head_end = self.head_end
        if self._chunks is not None:
            return self._chunks.advance(buffer, head_end, eof)
        length = self.body_length or 0
        end = head_end + length
        if len(buffer) >= end:
            return Frame(FrameKind.COMPLETE, bytes(buffer[:head_end]), bytes(buffer[head_end:end]), end)
        if eof:
            return Frame(FrameKind.TRUNCATED, bytes(buffer[:head_end]), bytes(buffer[head_end:]), len(buffer), True)
        return None

    def _read_head(self, buffer: bytes | bytearray, eof: bool) -> Frame | None:
        found = buffer.find(_END_OF_HEAD, max(0, self._scanned - len(_END_OF_HEAD) + 1))
        if found < 0 or found + len(_END_OF_HEAD) > self.max_head:
            if len(buffer) >= self.max_head:
                return Frame(FrameKind.HEAD_TOO_LARGE, close=True)
            self._scanned = len(buffer)
            return Frame(FrameKind.CLOSED, close=True) if eof else None
        head_end = found + len(_END_OF_HEAD)
        self.head_end = head_end
        head = bytes(buffer[:head_end])
        lengths, codings, expect = _framing_fields(head)
        if codings:
            if lengths or codings[-1] != b"chunked" or b"chunked" in codings[:-1]:
                return Frame(FrameKind.HEAD_ONLY, head, consumed=head_end, close=True)
            self.chunked = True
            self._chunks = _Chunks(head_end, self.max_body, self.max_head)
        elif lengths:
            if len(lengths) > 1 or not lengths[0].isdigit():
                return Frame(FrameKind.HEAD_ONLY, head, consumed=head_end, close=True)
            length = int(lengths[0])
            if length > self.max_body:
                return Frame(FrameKind.OVERSIZED, head, consumed=head_end, close=True, discard=length)
            self.body_length = length
        else:
            self.body_length = 0
        self.expects_continue = expect and (self.chunked or bool(self.body_length))
        return None


def _framing_fields(head: bytes) -> tuple[list[bytes], list[bytes], bool]:
    """The ``Content-Length`` values, the transfer codings in order, and whether ``Expect: 100-continue`` is
    asked, read from a head (field names case-insensitive, values trimmed, the request line skipped)."""
    lengths: list[bytes] = []
    codings: list[bytes] = []
    expect = False
    for line in head.split(_CRLF)[1:]:
        name, colon, value = line.partition(b":")
        if not colon:
            continue
        name = name.strip().lower()
        if name == b"content-length":
            lengths.append(value.strip())
        elif name == b"transfer-encoding":
            codings += [coding.strip().lower() for coding in value.split(b",") if coding.strip()]
        elif name == b"expect":
            expect = value.strip().lower() == b"100-continue"
    return lengths, codings, expect


class _Chunks:
    """An incremental chunked-body decoder (RFC 9112 section 7.1): positions are offsets into the buffer."""

    def __init__(self, start: int, max_body: int, max_trailers: int) -> None:
        self.position = start  # where the next chunk-size line starts
        self.max_body = max_body
        self.max_trailers = max_trailers
        self.spans: list[tuple[int, int]] = []
        self.decoded = 0
        self.trailers_at: int | None = None

    def advance(self, buffer: bytes | bytearray, head_end: int, eof: bool) -> Frame | None:
        if len(buffer) - head_end > 2 * self.max_body + self.max_trailers:
            return Frame(FrameKind.BAD_CHUNKING, close=True)  # framing that outweighs any body it could carry
        while self.trailers_at is None:
            line_end = buffer.find(_CRLF, self.position, self.position + MAX_CHUNK_LINE + len(_CRLF))
            if line_end < 0:
                if len(buffer) - self.position > MAX_CHUNK_LINE:
                    return Frame(FrameKind.BAD_CHUNKING, close=True)
                return self._incomplete(eof)
            size_field = bytes(buffer[self.position : line_end]).partition(b";")[0].strip(b" \t")
            if not size_field or not set(size_field) <= _HEX_DIGITS:
                return Frame(FrameKind.BAD_CHUNKING, close=True)
            size = int(size_field, 16)
            data = line_end + len(_CRLF)
            if size == 0:
                self.trailers_at = data
                break
            if self.decoded + size > self.max_body:  # the application answers 413 from max_body + 1 bytes
                wanted = self.max_body + 1 - self.decoded
                if len(buffer) < data + wanted:
                    return self._incomplete(eof)
                self.spans.append((data, data + wanted))
                return Frame(FrameKind.COMPLETE, bytes(buffer[:head_end]), self._body(buffer), len(buffer), close=True)
            if len(buffer) < data + size + len(_CRLF):
                return self._incomplete(eof)
            if buffer[data + size : data + size + len(_CRLF)] != _CRLF:
                return Frame(FrameKind.BAD_CHUNKING, close=True)
            self.spans.append((data, data + size))
            self.decoded += size
            self.position = data + size + len(_CRLF)
        # the trailer section: nothing, or field lines, then an empty line
        if buffer[self.trailers_at : self.trailers_at + len(_CRLF)] == _CRLF:
            end = self.trailers_at + len(_CRLF)
        else:
            found = buffer.find(_END_OF_HEAD, self.trailers_at, self.trailers_at + self.max_trailers)
            if found < 0:
                if len(buffer) - self.trailers_at >= self.max_trailers:
                    return Frame(FrameKind.BAD_CHUNKING, close=True)
                return self._incomplete(eof)
            end = found + len(_END_OF_HEAD)
        return Frame(FrameKind.COMPLETE, bytes(buffer[:head_end]), self._body(buffer), end)

    def _body(self, buffer: bytes | bytearray) -> bytes:
        return b"".join(bytes(buffer[start:end]) for start, end in self.spans)

    @staticmethod
    def _incomplete(eof: bool) -> Frame | None:
        # A chunked body cut short has no length to compare with: it is bad framing, not a truncated body.
        return Frame(FrameKind.BAD_CHUNKING, close=True) if eof else None
