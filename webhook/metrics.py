"""The webhook's Prometheus metrics, declared once (names and meanings: ``docs/metrics.md``).

Each app gets its own :class:`WebhookMetrics` with its own registry, so tests and several apps in one
process never share counters. Under gunicorn with several workers, ``serve`` sets
``PROMETHEUS_MULTIPROC_DIR`` before this module is imported: prometheus_client then keeps every value in
per-process files there, and :meth:`WebhookMetrics.exposition` merges all workers' files, so a scrape that
lands on any worker sees the whole server.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from gpu_fence.verdicts import ReviewVerdict

from .policy import RULES
from .reasons import BadRequestReason, DropReason
from .review import Endpoint

#: Seconds. Starts at 0.25 ms so a 1 ms review is distinguishable from a 0.3 ms one; ends past the API
#: server's 10 s default webhook timeout.
DURATION_BUCKETS = (
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    10.0,
)

CONTENT_TYPE = CONTENT_TYPE_LATEST

_NO_RULE = ("none",)
_EVERY_RULE = tuple(rule.id for rule in RULES)
_UNJUDGED = ((ReviewVerdict.ALLOWED, _NO_RULE), (ReviewVerdict.EXEMPT, _NO_RULE), (ReviewVerdict.ERROR, _NO_RULE))
#: The (verdict, rules) each endpoint answers with, exported at 0 before the first review: what the dashboard's and
#: the alerts' rates read.
_KNOWN_REVIEWS = {
    Endpoint.MUTATE: (*_UNJUDGED, (ReviewVerdict.PATCHED, _NO_RULE)),
    Endpoint.VALIDATE: (*_UNJUDGED, (ReviewVerdict.DENIED, _EVERY_RULE)),
    Endpoint.VALIDATE_WARN: (*_UNJUDGED, (ReviewVerdict.WARNED, _EVERY_RULE)),
}


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class WebhookMetrics:
    """The metric objects of one webhook app."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.reviews = Counter(
            "gpu_fence_webhook_reviews_total",
            "AdmissionReviews answered, by endpoint, verdict and broken rule (one count per distinct rule).",
            ["endpoint", "verdict", "rule"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpu_fence_webhook_review_duration_seconds",
            "Time from a parsed request to a serialised response, per endpoint.",
            ["endpoint"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.internal_errors = Counter(
            "gpu_fence_webhook_internal_errors_total",
            "Reviews that hit an internal error (denied on /validate: fail closed).",
            ["endpoint"],
            registry=self.registry,
        )
        self.bad_requests = Counter(
            "gpu_fence_webhook_bad_requests_total",
            "Requests answered with a 4xx before any policy evaluation, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.connections_dropped = Counter(
            "gpu_fence_webhook_connections_dropped_total",
            "Connections the server closed without an answer: the request or the response was not done in time, or "
            "the TLS handshake failed.",
            ["reason"],
            registry=self.registry,
        )
        self.certificate_expiry = Gauge(
            "gpu_fence_webhook_certificate_expiry_timestamp_seconds",
            "notAfter (Unix time) of the serving certificate currently loaded.",
            registry=self.registry,
            multiprocess_mode="livemostrecent",
        )

        # Every label set known before the first request is exported at 0 from start (in multiprocess mode each
        # process writes its zeros): increase() and rate() see an event only as a rise between two samples, so the
        # first internal error would never fire its alert if the error itself created the series.
        for endpoint in Endpoint:
            self.internal_errors.labels(endpoint.value)
            for verdict, rules in _KNOWN_REVIEWS[endpoint]:
                for rule in rules:
                    self.reviews.labels(endpoint.value, verdict.value, rule)
        for reason in DropReason:
            self.connections_dropped.labels(reason)
        for bad in BadRequestReason:
            self.bad_requests.labels(bad)

        # Children (one labelled series each) looked up once and kept: ``labels()`` validates and locks on every
        # call, which per review costs more than the increments. The keys are bounded: endpoints x verdicts x
        # combinations of rule ids, all fixed strings; dict reads and writes are atomic, and two threads that
        # race to fill a key get the same children from ``labels()``.
        self._review_children: dict[tuple[str, str, tuple[str, ...]], tuple[Any, ...]] = {}
        self._duration_children: dict[str, Any] = {}
        self._bad_request_children: dict[BadRequestReason, Any] = {}

    def count_review(self, endpoint: str, verdict: str, rules: Iterable[str], seconds: float) -> None:
        rules = rules if isinstance(rules, tuple) else tuple(rules)
        key = (endpoint, verdict, rules)
        counters = self._review_children.get(key)
        if counters is None:
            counters = tuple(self.reviews.labels(endpoint, verdict, rule) for rule in rules or ("none",))
            self._review_children[key] = counters
        for counter in counters:
            counter.inc()
        histogram = self._duration_children.get(endpoint)
        if histogram is None:
            histogram = self._duration_children[endpoint] = self.duration.labels(endpoint)
        histogram.observe(seconds)
        if verdict == ReviewVerdict.ERROR:
            self.internal_errors.labels(endpoint).inc()

    def count_bad_request(self, reason: BadRequestReason) -> None:
        counter = self._bad_request_children.get(reason)
        if counter is None:
            counter = self._bad_request_children[reason] = self.bad_requests.labels(reason)
        counter.inc()

    def count_dropped_connection(self, reason: DropReason) -> None:
        self.connections_dropped.labels(reason).inc()  # rare by nature: no cached children

    def exposition(self) -> bytes:
        """The text format of every metric; merged over all worker processes in multiprocess mode."""
        if multiprocess_dir():
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            return generate_latest(registry)
        return generate_latest(self.registry)
