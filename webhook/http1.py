"""One HTTP/1.1 request head, read strictly, and one response head: pure, no I/O.

The serving worker (``webhook.worker``) reads a request's head and then exactly ``Content-Length`` bytes of body;
this module says what the head asks for, or why it is refused. What it accepts is what the API server sends (Go's
``net/http`` client: an origin-form target, ``Content-Length`` on every body, no pipelining, no chunking) and what
``curl``, probes and Prometheus send; everything ambiguous is refused rather than guessed at (RFC 9112 section
6.3: a length that cannot be read is an unrecoverable framing error), so that no two parties can disagree on where
a request ends:

* a ``Transfer-Encoding`` (chunked bodies) and a body-carrying method without ``Content-Length``: ``411``;
* ``Content-Length`` that is not one plain number (repeated with different values, signed, empty): ``400``;
* a line folded over two (obs-fold), a field name that is not a token, a control character in a value: ``400``;
* another HTTP version: ``400`` (gunicorn's answer too: every refusal of bad input is a 4xx).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from .reasons import BadRequestReason

_REQUEST_LINE = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+) (/\S*) (HTTP/\d\.\d)")
_FIELD = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*([^\x00-\x08\x0a-\x1f\x7f]*?)[ \t]*")
#: methods whose requests carry a body: the reviews' POST, and the two others a client may send one with
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


@dataclass(frozen=True, slots=True)
class Head:
    """A request head that can be answered."""

    method: str
    #: the target's path, percent-decoded as WSGI's ``PATH_INFO`` wants it (bytes as latin-1 text)
    path: str
    query: str
    version: str
    #: every field, names in lower case, in the order sent
    fields: tuple[tuple[str, str], ...]
    content_length: int
    keep_alive: bool
    expects_continue: bool


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a head cannot be answered: the status, a reason (a metric label) and a sentence for people."""

    status: int
    reason: BadRequestReason
    message: str


def parse_head(data: bytes) -> Head | Refusal:
    """The head (request line and fields, the final CRLF CRLF included or not) as a :class:`Head`, or why not."""
    lines = data.decode("latin-1").split("\r\n")
    while lines and not lines[-1]:
        lines.pop()
    matched = _REQUEST_LINE.fullmatch(lines[0]) if lines else None
    if matched is None:
        return Refusal(400, BadRequestReason.BAD_REQUEST_LINE, "the request line is not METHOD /path HTTP/1.1")
    method, target, version = matched.groups()
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        return Refusal(400, BadRequestReason.UNSUPPORTED_HTTP_VERSION, f"{version} is not served; use HTTP/1.1")
    fields = []
    for line in lines[1:]:
        field = _FIELD.fullmatch(line)
        if field is None:
            return Refusal(
                400,
                BadRequestReason.BAD_HEADER,
                "a header line is folded, not a name: value pair, or holds a control byte",
            )
        fields.append((field.group(1).lower(), field.group(2)))
    named = {name: [value for found, value in fields if found == name] for name, _ in fields}
    if "transfer-encoding" in named:
        return Refusal(
            411,
            BadRequestReason.LENGTH_REQUIRED,
            "bodies must come with Content-Length; Transfer-Encoding is not served",
        )
    lengths = set(named.get("content-length", ()))
    if len(lengths) > 1 or any(not value.isascii() or not value.isdigit() for value in lengths):
        return Refusal(400, BadRequestReason.BAD_CONTENT_LENGTH, "Content-Length must be one number")
    if not lengths and method in _BODY_METHODS:
        return Refusal(
            411, BadRequestReason.LENGTH_REQUIRED, f"a {method} must say its body's length in Content-Length"
        )
    tokens = {token.strip().lower() for value in named.get("connection", ()) for token in value.split(",")}
    path, _, query = target.partition("?")
    return Head(
        method=method,
        path=unquote_to_bytes(path).decode("latin-1"),
        query=query,
        version=version,
        fields=tuple(fields),
        content_length=int(lengths.pop()) if lengths else 0,
        keep_alive="close" not in tokens and (version == "HTTP/1.1" or "keep-alive" in tokens),
        expects_continue=any(value.lower() == "100-continue" for value in named.get("expect", ())),
    )


def response_head(status: str, headers: list[tuple[str, str]], length: int, *, keep_alive: bool, date: str) -> bytes:
    """``HTTP/1.1`` status line and fields for a body of ``length`` bytes; the app's own ``Content-Length``,
    ``Connection`` and ``Date`` are replaced by the server's, which knows the body and the connection."""
    lines = [f"HTTP/1.1 {status}", f"Date: {date}"]
    lines += [f"{name}: {value}" for name, value in headers if name.lower() not in _SERVER_FIELDS]
    lines += [f"Content-Length: {length}", f"Connection: {'keep-alive' if keep_alive else 'close'}", "", ""]
    return "\r\n".join(lines).encode("latin-1")


_SERVER_FIELDS = frozenset({"content-length", "connection", "date", "transfer-encoding"})
