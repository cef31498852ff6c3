"""Why the webhook refuses a request or drops a connection, declared once: the ``reason`` labels of
``gpu_fence_webhook_bad_requests_total`` and ``gpu_fence_webhook_connections_dropped_total`` (docs/metrics.md), and
the ``error`` of a refused request's JSON body (docs/webhook.md, "Bad input").

The code that refuses or drops says which member; ``webhook.metrics`` exports every dropped-connection reason at 0
from start; the tests and the docs are checked against these lists.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["BadRequestReason", "DropReason"]


class BadRequestReason(StrEnum):
    """Why a request is answered with a 4xx before any policy evaluation."""

    # the body (webhook.wsgi; body-too-large from its announced length: webhook.worker)
    WRONG_CONTENT_TYPE = "wrong-content-type"
    BODY_TOO_LARGE = "body-too-large"
    EMPTY_BODY = "empty-body"
    TRUNCATED_BODY = "truncated-body"
    INVALID_JSON = "invalid-json"
    # the AdmissionReview envelope (webhook.review)
    NOT_AN_OBJECT = "not-an-object"
    WRONG_KIND = "wrong-kind"
    WRONG_API_VERSION = "wrong-api-version"
    MISSING_REQUEST = "missing-request"
    MISSING_UID = "missing-uid"
    MISSING_OPERATION = "missing-operation"
    MALFORMED_REQUEST = "malformed-request"
    # the request head, answered by the worker (webhook.http1, webhook.worker)
    HEAD_TOO_LARGE = "head-too-large"
    LENGTH_REQUIRED = "length-required"
    BAD_CONTENT_LENGTH = "bad-content-length"
    BAD_REQUEST_LINE = "bad-request-line"
    BAD_HEADER = "bad-header"
    UNSUPPORTED_HTTP_VERSION = "unsupported-http-version"
    # the client (webhook.wsgi.ClientAuth)
    CLIENT_CERTIFICATE_REQUIRED = "client-certificate-required"
    CLIENT_NOT_ALLOWED = "client-not-allowed"
    # every other request, answered by Flask (webhook.app)
    NOT_FOUND = "not-found"
    METHOD_NOT_ALLOWED = "method-not-allowed"
    #: any other HTTP error Flask answers itself (none does today: the review bodies are read in front of it)
    HTTP_ERROR = "http-error"


class DropReason(StrEnum):
    """Why the worker closes a connection without an answer (docs/webhook.md, "Staying available")."""

    REQUEST_DEADLINE = "request-deadline"
    RESPONSE_DEADLINE = "response-deadline"
    TLS_HANDSHAKE_FAILED = "tls-handshake-failed"
    IDLE_EVICTED = "idle-evicted"
    CLIENT_LIMIT = "client-limit"
