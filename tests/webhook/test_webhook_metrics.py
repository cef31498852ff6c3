"""The webhook's counters exist at 0 before the first request: an alert on ``increase()`` sees the first event only
as a rise from an earlier sample, and a series the event itself creates has none."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.verdicts import ReviewVerdict
from gpu_fence.webhook.metrics import WebhookMetrics
from gpu_fence.webhook.policy import RULES
from gpu_fence.webhook.reasons import BadRequestReason, DropReason
from gpu_fence.webhook.review import Endpoint
from tests.fakes.webhook_server import serving

REPO = Path(__file__).resolve().parents[2]


def samples(exposition: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
    }


def expected_zeros() -> set[tuple[str, frozenset[tuple[str, str]]]]:
    zeros = set()
    for endpoint in Endpoint:
        zeros.add(("gpu_fence_webhook_internal_errors_total", frozenset({("endpoint", endpoint.value)})))
        for verdict in (ReviewVerdict.ALLOWED, ReviewVerdict.EXEMPT, ReviewVerdict.ERROR):
            labels = {("endpoint", endpoint.value), ("verdict", verdict.value), ("rule", "none")}
            zeros.add(("gpu_fence_webhook_reviews_total", frozenset(labels)))
    zeros.add(
        (
            "gpu_fence_webhook_reviews_total",
            frozenset({("endpoint", "mutate"), ("verdict", "patched"), ("rule", "none")}),
        )
    )
    for rule in RULES:
        for endpoint, verdict in (("validate", "denied"), ("validate-warn", "warned")):
            labels = {("endpoint", endpoint), ("verdict", verdict), ("rule", rule.id)}
            zeros.add(("gpu_fence_webhook_reviews_total", frozenset(labels)))
    for reason in DropReason:
        zeros.add(("gpu_fence_webhook_connections_dropped_total", frozenset({("reason", reason)})))
    for bad in BadRequestReason:
        zeros.add(("gpu_fence_webhook_bad_requests_total", frozenset({("reason", bad)})))
    return zeros


def test_every_known_label_set_is_exported_at_zero_from_start() -> None:
    exported = samples(WebhookMetrics().exposition().decode())
    for key in expected_zeros():
        assert exported.get(key) == 0.0, key


def test_an_internal_error_counts_on_the_series_that_was_already_there() -> None:
    metrics = WebhookMetrics()
    metrics.count_review("validate", ReviewVerdict.ERROR, (), 0.001)
    exported = samples(metrics.exposition().decode())
    assert exported[("gpu_fence_webhook_internal_errors_total", frozenset({("endpoint", "validate")}))] == 1.0
    assert exported[("gpu_fence_webhook_internal_errors_total", frozenset({("endpoint", "mutate")}))] == 0.0


def test_every_reason_exported_at_zero_is_one_the_worker_counts() -> None:
    """A reason nothing counts would be a series that stays at 0 for ever, which an alert on it could not tell from
    a healthy server."""
    source = (REPO / "webhook" / "worker.py").read_text(encoding="utf-8")
    for reason in DropReason:
        assert f"count_dropped(DropReason.{reason.name})" in source, reason


@pytest.mark.e2e
def test_serve_with_two_workers_exports_the_zeros_before_any_review(tmp_path: Path) -> None:
    """In multiprocess mode every worker writes its zeros; the merged scrape has each series, at 0."""
    with serving(tmp_path, workers=2) as server:
        reply = server.get("/metrics")
    assert reply.status == 200
    exported = samples(reply.document["text"])
    for key in expected_zeros():
        assert exported.get(key) == 0.0, key
