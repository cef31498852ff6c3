"""The Flask application: HTTP in, :func:`webhook.review.review` in the middle, JSON, metrics and logs out.

Built by :func:`create_app` from a loaded policy configuration; importing this module does no work. TLS,
workers and certificate reloading are the serving layer's business (``webhook.serving``), not this one's.

The three review endpoints are answered by a thin WSGI layer in front of Flask (``webhook.wsgi``: the hot
path); Flask answers the rest: ``/healthz``, ``/readyz``, ``/metrics``, and the errors of every other request.

Every answer is JSON. A body that is not a usable AdmissionReview gets a 4xx naming what to fix; a policy
bug never becomes a 500 (see ``review``); Flask-level errors (404, 405, 413) are JSON too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson
from flask import Flask, Response, request
from prometheus_client import disable_created_metrics
from werkzeug.exceptions import HTTPException

from .metrics import CONTENT_TYPE, WebhookMetrics
from .reasons import BadRequestReason
from .review import Policy
from .wsgi import MAX_BODY_BYTES, ROUTES, ClientAuth, ReviewEndpoints, ReviewLog, error_body, internal_error

if TYPE_CHECKING:
    from .config import PolicyConfig

__all__ = ["MAX_BODY_BYTES", "create_app"]

log = logging.getLogger("gpu_fence.webhook")

_HTTP_REASONS = {
    404: BadRequestReason.NOT_FOUND,
    405: BadRequestReason.METHOD_NOT_ALLOWED,
    413: BadRequestReason.BODY_TOO_LARGE,
    415: BadRequestReason.WRONG_CONTENT_TYPE,
}


def create_app(
    config: PolicyConfig,
    *,
    policy: Policy | None = None,
    metrics: WebhookMetrics | None = None,
    ready: Callable[[], bool] = lambda: True,
    review_log: ReviewLog | None = None,
    client_auth: ClientAuth | None = None,
) -> Flask:
    """Build the webhook app.

    ``policy`` defaults to ``webhook.policy``; tests pass a stand-in to exercise the error paths.
    ``ready`` lets the serving layer hold ``/readyz`` at 503 until its certificate is loaded.
    ``review_log`` writes the per-review log line; by default through the logging module (``serve`` passes one
    that writes stderr directly, see ``webhook.wsgi.ReviewLog``).
    ``client_auth``: answer reviews only for clients with a verified certificate (``serve --client-ca-file``).
    """
    if policy is None:
        from . import policy as policy_module  # noqa: PLC0415 - the default; tests inject stand-ins

        policy = policy_module
    # No ``_created`` series beside each counter and histogram: undocumented, and Prometheus does not need them.
    # Process-wide and read at scrape time, so gunicorn workers forked from this process inherit it.
    disable_created_metrics()
    metrics = metrics if metrics is not None else WebhookMetrics()
    app = Flask("gpu_fence_webhook")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    app.extensions["gpu_fence_metrics"] = metrics
    endpoints = ReviewEndpoints(
        app.wsgi_app,
        config,
        policy,
        metrics,
        review_log if review_log is not None else ReviewLog(log),
        client_auth=client_auth,
    )
    app.wsgi_app = endpoints  # type: ignore[method-assign]  # Flask's documented way to put middleware in front

    # The review paths are routed in Flask too, for POST only, so that Flask answers every other method on them
    # (405 naming the method, OPTIONS with Allow); a POST is answered by ReviewEndpoints and never gets here.
    for path, endpoint in ROUTES.items():
        app.add_url_rule(path, endpoint.value, _answered_in_front_of_flask, methods=["POST"])

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
        reason = _HTTP_REASONS.get(code, BadRequestReason.HTTP_ERROR)
        message = {
            404: f"no endpoint at {request.path}; use POST /mutate, /validate or /validate/warn",
            405: f"{request.method} is not allowed on {request.path}",
            413: f"body larger than {MAX_BODY_BYTES} bytes",
        }.get(code, error.description or error.name)
        metrics.count_bad_request(reason)
        return _json_bytes(code, error_body(reason, message))

    @app.errorhandler(Exception)
    def unexpected(error: Exception) -> Response:
        # Unreachable by input (review() catches policy errors); kept so that a bug in this layer still
        # answers JSON, is logged and is counted rather than leaking a traceback page.
        return _json_bytes(*internal_error(metrics, request.path, error))

    return app


def _answered_in_front_of_flask() -> Response:
    raise RuntimeError("review endpoints are answered by webhook.wsgi.ReviewEndpoints, in front of Flask")


def _json(status: int, document: dict[str, str]) -> Response:
    return _json_bytes(status, orjson.dumps(document))


def _json_bytes(status: int, payload: bytes) -> Response:
    return Response(payload, status=status, mimetype="application/json")
