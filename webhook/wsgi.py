"""The review endpoints as a thin WSGI layer in front of the Flask app: the hot path of every admission call.

``POST /mutate``, ``/validate`` and ``/validate/warn`` are answered here, without Flask's request dispatch and
werkzeug's body streams (per review those cost about as much as the policy itself): read ``CONTENT_LENGTH``
bytes from ``wsgi.input``, check content type and size, call :func:`webhook.review.review`, write the JSON.
Everything else (other methods on these paths, ``/healthz``, ``/readyz``, ``/metrics``, 404s) goes on to Flask.
``create_app`` installs it the way Flask documents for middleware (``app.wsgi_app = ReviewEndpoints(...)``), so
the Flask app and its test client keep working unchanged and go through this path too.

The answers are those the Flask views gave, byte for byte where it matters: the same status codes, the same
``{"error", "message"}`` bodies naming what to fix (:func:`error_body`), the same metrics and log lines. A bug in
this layer gets the JSON 500 that Flask's error handler gives for the other routes, logged and counted, from the one
function both call (:func:`internal_error`). A body shorter than its ``Content-Length`` (the client ended its side
early) is a 400 ``truncated-body``.

Each review's log line is built here too (:class:`ReviewLog`), in the shape of ``gpu_fence.logs``. ``serve``
writes it with one ``os.write`` on stderr instead of through a logging handler, whose lock the worker's threads
otherwise queue on; a line shorter than ``PIPE_BUF`` (4 KiB; a review line is a few hundred bytes) is written
atomically, so lines from several threads and from the logging module never interleave.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import KW_ONLY, dataclass
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

import orjson

from gpu_fence import logs

from .metrics import WebhookMetrics
from .reasons import BadRequestReason
from .review import BadReview, Endpoint, Outcome, Policy, review

if TYPE_CHECKING:
    from .config import PolicyConfig

#: Larger than any Pod the API server accepts (etcd's default request limit is 1.5 MiB) with room for the
#: oldObject of an ephemeral-containers update, small enough that a flood of big bodies cannot exhaust memory.
MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_DISCARD_BYTES = 4 * MAX_BODY_BYTES
_DISCARD_CHUNK = 64 * 1024

ROUTES = {"/mutate": Endpoint.MUTATE, "/validate": Endpoint.VALIDATE, "/validate/warn": Endpoint.VALIDATE_WARN}

#: What the serving worker tells the app about the client's certificate, in mod_ssl's names: whether one was
#: presented and verified against the client CA (``CLIENT_VERIFIED``, else ``"NONE"``), and its subject's CN.
CLIENT_VERIFY = "SSL_CLIENT_VERIFY"
CLIENT_VERIFIED = "SUCCESS"
CLIENT_CN = "SSL_CLIENT_S_DN_CN"

log = logging.getLogger("gpu_fence.webhook")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
_JSON_HEADER = ("Content-Type", "application/json")
_STATUS_LINES = {status.value: f"{status.value} {status.phrase}" for status in HTTPStatus}


@dataclass(frozen=True)
class ClientAuth:
    """Who may call the review endpoints when ``serve --client-ca-file`` is given: a client whose certificate the
    TLS handshake verified against that CA and, when ``names`` is not empty, whose subject CN is one of them.

    Health, readiness and metrics stay open to clients without a certificate: the kubelet's probes present none.
    """

    names: frozenset[str] = frozenset()

    def refusal(self, environ: dict[str, Any]) -> BadReview | None:
        """Why this request may not be reviewed, or None when it may."""
        if environ.get(CLIENT_VERIFY) != CLIENT_VERIFIED:
            return BadReview(
                BadRequestReason.CLIENT_CERTIFICATE_REQUIRED,
                "reviews are answered only for a client certificate from the client CA (the API server's)",
                403,
            )
        if self.names and environ.get(CLIENT_CN) not in self.names:
            return BadReview(
                BadRequestReason.CLIENT_NOT_ALLOWED, "the client certificate's CN is not one of --client-cn", 403
            )
        return None


@dataclass(eq=False)
class ReviewEndpoints:
    """WSGI middleware: answers the three review endpoints, hands every other request to ``app``."""

    app: WSGIApp
    config: PolicyConfig
    policy: Policy
    metrics: WebhookMetrics
    review_log: ReviewLog
    _: KW_ONLY
    client_auth: ClientAuth | None = None

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        endpoint = ROUTES.get(environ.get("PATH_INFO", ""))
        if endpoint is None or environ.get("REQUEST_METHOD") != "POST":
            return self.app(environ, start_response)
        try:
            status, payload = self._answer(endpoint, environ)
        except Exception as error:  # this layer's own bug or a failed read: the JSON 500 Flask's handler gives too
            status, payload = internal_error(self.metrics, str(environ.get("PATH_INFO", "")), error)
        start_response(_STATUS_LINES[status], [_JSON_HEADER, ("Content-Length", str(len(payload)))])
        return [payload]

    def _answer(self, endpoint: Endpoint, environ: dict[str, Any]) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            refusal = self.client_auth.refusal(environ) if self.client_auth is not None else None
            if refusal is not None:
                raise refusal
            body = _read_json_body(environ)
            outcome = review(body, endpoint, self.config, self.policy)
        except _TooLarge as bad:
            self.metrics.count_bad_request(bad.reason)
            return bad.status, error_body(bad.reason, bad.message)
        except BadReview as bad:
            self.metrics.count_bad_request(bad.reason)
            logs.event(
                log, "bad-request", bad.message, level=logging.WARNING, endpoint=endpoint.value, reason=bad.reason
            )
            return bad.status, error_body(bad.reason, bad.message)
        payload = orjson.dumps(outcome.response)
        seconds = time.perf_counter() - started
        self.metrics.count_review(endpoint.value, outcome.verdict.value, outcome.rules, seconds)
        self.review_log.write(endpoint, outcome, seconds)
        return 200, payload


class _TooLarge(BadReview):
    """A body without ``Content-Length`` (chunked) that grew past the limit. Counted, not logged, with the words
    Flask's 413 page had, which is how such a body was answered before this layer existed."""

    def __init__(self) -> None:
        super().__init__(BadRequestReason.BODY_TOO_LARGE, f"body larger than {MAX_BODY_BYTES} bytes", 413)


def _read_json_body(environ: dict[str, Any]) -> object:
    mimetype = mimetype_of(environ.get("CONTENT_TYPE", ""))
    if mimetype != "application/json":
        raise BadReview(
            BadRequestReason.WRONG_CONTENT_TYPE,
            f"Content-Type must be application/json, got {mimetype or 'none'!r}",
            415,
        )
    stream = environ["wsgi.input"]
    length = content_length(environ)
    if length is not None and length > MAX_BODY_BYTES:
        _discard(stream, length)
        raise BadReview(
            BadRequestReason.BODY_TOO_LARGE, f"body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit", 413
        )
    if length is not None:
        data = stream.read(length) if length else b""
        if len(data) < length:  # the client ended its side early: what came may even parse, but is not the review
            raise BadReview(
                BadRequestReason.TRUNCATED_BODY, f"body ended after {len(data)} of its {length} bytes (Content-Length)"
            )
    elif "wsgi.input_terminated" in environ:  # chunked: the server ends the stream, this layer bounds it
        data = stream.read(MAX_BODY_BYTES + 1)
        if len(data) > MAX_BODY_BYTES:
            raise _TooLarge
    else:  # no length and a server that would not end the stream: reading could block for ever
        data = b""
    if not data:
        raise BadReview(BadRequestReason.EMPTY_BODY, "body is empty; send an AdmissionReview as JSON")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise BadReview(BadRequestReason.INVALID_JSON, f"body is not valid JSON: {error}") from None


def mimetype_of(content_type: str) -> str:
    """The media type of a ``Content-Type`` value, lower case, without parameters (as werkzeug's ``mimetype``)."""
    return content_type.partition(";")[0].strip().lower()


def content_length(environ: dict[str, Any]) -> int | None:
    """The body's length, or None for a chunked body or none announced; not a number or negative reads as 0.

    As werkzeug reads it, so that an odd header gets the answer it got before (gunicorn refuses such requests
    before they reach the app in any case).
    """
    encoding = environ.get("HTTP_TRANSFER_ENCODING")
    value = environ.get("CONTENT_LENGTH")
    if value is None or (encoding is not None and "chunked" in _tokens(encoding)):
        return None
    value = value.strip(" \t")  # HTTP's optional whitespace only: str.strip() would also drop \x1c-\x1f
    if not value.isascii() or not value.isdigit():
        return 0
    return int(value)


def _tokens(header: str) -> list[str]:
    return [token.strip().lower() for token in header.split(",")]


def _discard(stream: Any, length: int) -> None:
    """Read and drop an oversized body (in small chunks), so that the client, still sending, gets the 413.

    Answering without reading makes the server close a connection with unread data, which the client sees as a
    reset instead of the answer. Past ``MAX_DISCARD_BYTES`` the connection is simply closed: a client that sends
    that much is not an API server.
    """
    if length > MAX_DISCARD_BYTES:
        return
    remaining = length
    while remaining > 0:
        chunk = stream.read(min(remaining, _DISCARD_CHUNK))
        if not chunk:
            break
        remaining -= len(chunk)


def error_body(reason: str, message: str) -> bytes:
    """The body of every error answer, 4xx and 5xx, here and in Flask: a token for machines, a sentence for people."""
    return orjson.dumps({"error": reason, "message": message})


def internal_error(metrics: WebhookMetrics, path: str, error: Exception) -> tuple[int, bytes]:
    """The answer to a bug in the web layers (this one or a Flask view): a JSON 500 naming only the exception's type,
    counted per path and logged with the traceback, never shown to the client."""
    metrics.internal_errors.labels(path.strip("/").replace("/", "-") or "root").inc()
    logs.event(
        log,
        "internal-error",
        f"internal error: {type(error).__name__}",
        level=logging.ERROR,
        exc_info=error,
        path=path,
    )
    return 500, error_body("internal-error", f"internal error: {type(error).__name__}")


# -- the review log line --------------------------------------------------------------------------------------------


class ReviewLog:
    """Writes one ``review`` event per answered review, in the shape of ``gpu_fence.logs`` (see docs/webhook.md).

    With ``fd`` None the event goes through the logging module (``logs.event``), where tests and embedders see it
    as a record. With an ``fd`` (``serve`` passes 2, stderr) the line is serialised here, with the same keys in the
    same order as ``logs.JsonLinesFormatter`` writes them, and written with one ``os.write``: no LogRecord, no
    handler lock. The level still decides: nothing is written unless the logger is enabled for INFO. Internal
    errors always go through the logging module, at ERROR.
    """

    def __init__(
        self, logger: logging.Logger = log, *, fd: int | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.logger = logger
        self.fd = fd
        self._clock = clock  # the line's "time", in Unix seconds
        self._second_stamp: tuple[float, str] = (math.nan, "")

    def write(self, endpoint: Endpoint, outcome: Outcome, seconds: float) -> None:
        if outcome.error:
            fields = review_fields(endpoint, outcome, seconds)
            logs.event(self.logger, "review", f"internal error: {outcome.error}", level=logging.ERROR, **fields)
            return
        if not self.logger.isEnabledFor(logging.INFO):
            return
        fields = review_fields(endpoint, outcome, seconds)
        message = review_message(endpoint, outcome)
        if self.fd is None:
            logs.event(self.logger, "review", message, **fields)
            return
        document = {
            "time": self._timestamp(self._clock()),
            "level": "info",
            "logger": self.logger.name,
            "event": "review",
            "message": message,
            **fields,
        }
        try:
            line = orjson.dumps(document) + b"\n"
        except TypeError:  # nothing in a review is beyond orjson; kept so that a log line never fails a review
            line = logs.dumps(document).encode("utf-8", "backslashreplace") + b"\n"
        try:
            while line:
                line = line[os.write(self.fd, line) :]
        except OSError:
            pass  # stderr gone: there is nowhere left to say so, and the review must still be answered

    def _timestamp(self, now: float) -> str:
        """``logs.rfc3339_millis(now)``, formatting the date and time once per second rather than per line."""
        fraction, whole = math.modf(now)
        micros = round(fraction * 1e6)  # rounded as datetime.fromtimestamp rounds, carry included
        second = int(whole) + (micros >= 1_000_000)
        cached_second, stamp = self._second_stamp  # one tuple, replaced whole: threads never see half an update
        if second != cached_second:
            stamp = logs.rfc3339_millis(second)[:-4]  # "2026-01-05T10:00:00."
            self._second_stamp = (second, stamp)
        return f"{stamp}{micros % 1_000_000 // 1000:03d}Z"


def review_fields(endpoint: Endpoint, outcome: Outcome, seconds: float) -> dict[str, Any]:
    """The fields of a ``review`` event (docs/webhook.md, Logs): never the pod, its env or anything secret."""
    req = outcome.request
    fields: dict[str, Any] = {
        "endpoint": endpoint.value,
        "verdict": outcome.verdict.value,
        "duration_ms": round(seconds * 1000, 3),
    }
    if req is not None:
        fields.update(uid=req.uid, operation=req.operation, kind=req.kind, namespace=req.namespace, name=req.name)
        if req.sub_resource:
            fields["subresource"] = req.sub_resource
        if req.dry_run:
            fields["dry_run"] = True
    if outcome.rules:
        fields["rules"] = list(outcome.rules)
    if outcome.error:
        fields["error"] = outcome.error
    return fields


def review_message(endpoint: Endpoint, outcome: Outcome) -> str:
    req = outcome.request
    who = f"{req.kind} {req.namespace}/{req.name}" if req is not None else "a request"
    return f"{endpoint.value}: {outcome.verdict.value} {who}"
