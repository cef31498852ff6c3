"""The webhook's counters exist at 0 before the first request: an alert on ``increase()`` sees the first event only
as a rise from an earlier sample, and a series the event itself creates has none."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.verdicts import ReviewVerdict
from gpu_fence.webhook.metrics import DROPPED_CONNECTION_REASONS, WebhookMetrics
from gpu_fence.webhook.policy import RULES
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
    for reason in DROPPED_CONNECTION_REASONS:
        zeros.add(("gpu_fence_webhook_connections_dropped_total", frozenset({("reason", reason)})))
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


def test_the_reasons_the_worker_drops_connections_for_are_all_known() -> None:
    """worker.py names its reasons where it counts them; each must be one exported at 0 from start."""
    source = (REPO / "webhook" / "worker.py").read_text(encoding="utf-8")
    counted = set(re.findall(r'count_dropped\("([a-z-]+)"\)', source))
    assert counted and counted <= set(DROPPED_CONNECTION_REASONS)


@pytest.mark.e2e
def test_serve_with_two_workers_exports_the_zeros_before_any_review(tmp_path: Path) -> None:
    """In multiprocess mode every worker writes its zeros; the merged scrape has each series, at 0."""
    with serving(tmp_path, workers=2) as server:
        reply = server.get("/metrics")
    assert reply.status == 200
    exported = samples(reply.document["text"])
    for key in expected_zeros():
        assert exported.get(key) == 0.0, key
