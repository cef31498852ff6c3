"""The Flask application: HTTP in, :func:`webhook.review.review` in the middle, JSON, metrics and logs out.

Built by :func:`create_app` from a loaded policy configuration; importing this module does no work. TLS,
workers and certificate reloading are the serving layer's business (``webhook.serving``), not this one's.

Every answer is JSON. A body that is not a usable AdmissionReview gets a 4xx naming what to fix; a policy
bug never becomes a 500 (see ``review``); Flask-level errors (404, 405, 413) are JSON too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson
from flask import Flask, Response, request
from prometheus_client import disable_created_metrics
from werkzeug.exceptions import HTTPException

from gpu_fence import logs
from webhook.metrics import CONTENT_TYPE, WebhookMetrics
from webhook.review import BadReview, Endpoint, Outcome, Policy, review

#: Larger than any Pod the API server accepts (etcd's default request limit is 1.5 MiB) with room for the
#: oldObject of an ephemeral-containers update, small enough that a flood of big bodies cannot exhaust memory.
MAX_BODY_BYTES = 3 * 1024 * 1024
MAX_DISCARD_BYTES = 4 * MAX_BODY_BYTES

log = logging.getLogger("gpu_fence.webhook")

_HTTP_REASONS = {404: "not-found", 405: "method-not-allowed", 413: "body-too-large", 415: "wrong-content-type"}


def create_app(
    config: Any,
    *,
    policy: Policy | None = None,
    metrics: WebhookMetrics | None = None,
    ready: Callable[[], bool] = lambda: True,
) -> Flask:
    """Build the webhook app.

    ``policy`` defaults to ``webhook.policy``; tests pass a stand-in to exercise the error paths.
    ``ready`` lets the serving layer hold ``/readyz`` at 503 until its certificate is loaded.
    """
    if policy is None:
        from webhook import policy as policy_module  # noqa: PLC0415 - the default; tests inject stand-ins

        policy = policy_module  # type: ignore[assignment]
    assert policy is not None
    # No ``_created`` series beside each counter and histogram: undocumented, and Prometheus does not need them.
    # Process-wide and read at scrape time, so gunicorn workers forked from this process inherit it.
    disable_created_metrics()
    metrics = metrics if metrics is not None else WebhookMetrics()
    app = Flask("gpu_fence_webhook")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["gpu_fence_metrics"] = metrics

    def handle(endpoint: Endpoint) -> Response:
        started = time.perf_counter()
        try:
            body = _read_json_body()
            outcome = review(body, endpoint, config, policy)
        except BadReview as bad:
            metrics.bad_requests.labels(bad.reason).inc()
            logs.event(log, "bad-request", bad.message, level=logging.WARNING, endpoint=endpoint.value,
                       reason=bad.reason)
            return _error(bad.status, bad.reason, bad.message)
        payload = orjson.dumps(outcome.response)
        seconds = time.perf_counter() - started
        metrics.count_review(endpoint.value, outcome.verdict.value, outcome.rules, seconds)
        _log_outcome(endpoint, outcome, seconds)
        return Response(payload, status=200, mimetype="application/json")

    app.add_url_rule("/mutate", "mutate", lambda: handle(Endpoint.MUTATE), methods=["POST"])
    app.add_url_rule("/validate", "validate", lambda: handle(Endpoint.VALIDATE), methods=["POST"])
    app.add_url_rule("/validate/warn", "validate_warn", lambda: handle(Endpoint.VALIDATE_WARN), methods=["POST"])

    @app.get("/healthz")
    def healthz() -> Response:
        return _json(200, {"status": "ok"})

    @app.get("/readyz")
    def readyz() -> Response:
        if ready():
            return _json(200, {"status": "ready"})
        return _json(503, {"status": "not ready", "message": "serving certificate not loaded yet"})

    @app.get("/metrics")
    def metrics_endpoint() -> Response:
        return Response(metrics.exposition(), status=200, content_type=CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    def http_error(error: HTTPException) -> Response:
        code = error.code or 400
        reason = _HTTP_REASONS.get(code, f"http-{code}")
        message = {
            404: f"no endpoint at {request.path}; use POST /mutate, /validate or /validate/warn",
            405: f"{request.method} is not allowed on {request.path}",
            413: f"body larger than {MAX_BODY_BYTES} bytes",
        }.get(code, error.description or error.name)
        metrics.bad_requests.labels(reason).inc()
        return _error(code, reason, message)

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:
        # Unreachable by input (review() catches policy errors); kept so that a bug in this layer still
        # answers JSON, is logged and is counted rather than leaking a traceback page.
        metrics.internal_errors.labels(request.path.strip("/").replace("/", "-") or "root").inc()
        logs.event(log, "internal-error", f"internal error: {type(error).__name__}", level=logging.ERROR,
                   exc_info=error, path=request.path)
        return _error(500, "internal-error", f"internal error: {type(error).__name__}")

    return app


def _read_json_body() -> Any:
    mimetype = request.mimetype
    if mimetype != "application/json":
        raise BadReview(
            "wrong-content-type", f"Content-Type must be application/json, got {mimetype or 'none'!r}", 415
        )
    length = request.content_length
    if length is not None and length > MAX_BODY_BYTES:
        _discard_body(length)
        raise BadReview("body-too-large", f"body of {length} bytes is over the {MAX_BODY_BYTES}-byte limit", 413)
    data = request.get_data(cache=False)  # raises 413 for a chunked body past MAX_CONTENT_LENGTH
    if not data:
        raise BadReview("empty-body", "body is empty; send an AdmissionReview as JSON")
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as error:
        raise BadReview("invalid-json", f"body is not valid JSON: {error}") from None


def _discard_body(length: int) -> None:
    """Read and drop an oversized body (in small chunks), so that the client, still sending, gets the 413.

    Answering without reading makes the server close a connection with unread data, which the client sees as a
    reset instead of the answer. Past ``MAX_DISCARD_BYTES`` the connection is simply closed: a client that sends
    that much is not an API server.
    """
    if length > MAX_DISCARD_BYTES:
        return
    stream = request.environ.get("wsgi.input")
    remaining = length
    while stream is not None and remaining > 0:
        chunk = stream.read(min(remaining, 64 * 1024))
        if not chunk:
            break
        remaining -= len(chunk)


def _log_outcome(endpoint: Endpoint, outcome: Outcome, seconds: float) -> None:
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
        logs.event(log, "review", f"internal error: {outcome.error}", level=logging.ERROR, **fields)
        return
    if log.isEnabledFor(logging.INFO):
        who = f"{req.kind} {req.namespace}/{req.name}" if req is not None else "a request"
        logs.event(log, "review", f"{endpoint.value}: {outcome.verdict.value} {who}", **fields)


def _json(status: int, document: dict) -> Response:
    return Response(orjson.dumps(document), status=status, mimetype="application/json")


def _error(status: int, reason: str, message: str) -> Response:
    return _json(status, {"error": reason, "message": message})
