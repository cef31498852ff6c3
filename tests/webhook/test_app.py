"""The Flask layer (webhook.app) through Flask's test client: routing, bad input → JSON 4xx, metrics, logs."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import orjson
import pytest
from flask import abort
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.webhook.app import MAX_BODY_BYTES, create_app
from gpu_fence.webhook.metrics import WebhookMetrics
from gpu_fence.webhook.reasons import BadRequestReason, DropReason
from tests.fakes.stand_in_policy import StandInPolicy

FIXTURES = Path(__file__).parent / "admissionreviews"


def body(name: str = "pod-create-replicaset-gpu-mix") -> bytes:
    return (FIXTURES / f"{name}.json").read_bytes()


@pytest.fixture
def metrics() -> WebhookMetrics:
    return WebhookMetrics()


@pytest.fixture
def client(metrics):
    return create_app(None, policy=StandInPolicy(), metrics=metrics).test_client()


def samples(metrics: WebhookMetrics) -> dict[tuple, float]:
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def post(client, path: str, data: bytes, content_type: str = "application/json"):
    return client.post(path, data=data, headers={"Content-Type": content_type})


def test_mutate_validate_and_warn_answer_json(client, metrics):
    for path, allowed, verdict, rule in (
        ("/mutate", True, "patched", "none"),
        ("/validate", False, "denied", "unpinned-container"),
        ("/validate/warn", True, "allowed", "none"),  # judged as the pin would leave it: nothing else is wrong
    ):
        response = post(client, path, body())
        assert response.status_code == 200
        assert response.mimetype == "application/json"
        assert response.json["response"]["allowed"] is allowed
        endpoint = path.strip("/").replace("/", "-")
        key = ("gpu_fence_webhook_reviews_total", (("endpoint", endpoint), ("rule", rule), ("verdict", verdict)))
        assert samples(metrics)[key] == 1
    count = samples(metrics)[("gpu_fence_webhook_review_duration_seconds_count", (("endpoint", "mutate"),))]
    assert count == 1


def test_content_type_with_charset_is_accepted(client):
    response = post(client, "/validate", body(), "application/json; charset=utf-8")
    assert response.status_code == 200


@pytest.mark.parametrize(
    "case",
    [
        ("/validate", b"{not json", "application/json", 400, BadRequestReason.INVALID_JSON),
        ("/validate", b"", "application/json", 400, BadRequestReason.EMPTY_BODY),
        ("/validate", b"\xff\xfe", "application/json", 400, BadRequestReason.INVALID_JSON),
        ("/validate", body(), "text/plain", 415, BadRequestReason.WRONG_CONTENT_TYPE),
        ("/mutate", body(), "", 415, BadRequestReason.WRONG_CONTENT_TYPE),
        ("/validate", body("pod-create-v1beta1"), "application/json", 400, BadRequestReason.WRONG_API_VERSION),
        (
            "/validate",
            b'{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}',
            "application/json",
            400,
            BadRequestReason.MISSING_REQUEST,
        ),
        ("/validate", b"[]", "application/json", 400, BadRequestReason.NOT_AN_OBJECT),
    ],
)
def test_bad_input_is_a_json_4xx_naming_the_problem(client, metrics, case):
    path, data, content_type, status, reason = case
    response = post(client, path, data, content_type)
    assert response.status_code == status
    assert response.mimetype == "application/json"
    assert response.json["error"] == reason
    assert response.json["message"]
    assert samples(metrics)[("gpu_fence_webhook_bad_requests_total", (("reason", reason),))] == 1


def test_body_over_the_limit_is_413(client, metrics):
    big = b'{"apiVersion":"admission.k8s.io/v1","pad":"' + b"x" * MAX_BODY_BYTES + b'"}'
    response = post(client, "/validate", big)
    assert response.status_code == 413
    assert response.json["error"] == BadRequestReason.BODY_TOO_LARGE
    assert str(MAX_BODY_BYTES) in response.json["message"]


def test_flask_level_errors_are_json(client, metrics):
    missing = client.get("/nope")
    assert missing.status_code == 404 and missing.json["error"] == BadRequestReason.NOT_FOUND
    assert "/validate" in missing.json["message"]
    wrong = client.get("/validate")
    assert wrong.status_code == 405 and wrong.json["error"] == BadRequestReason.METHOD_NOT_ALLOWED
    counts = samples(metrics)
    assert counts[("gpu_fence_webhook_bad_requests_total", (("reason", BadRequestReason.NOT_FOUND),))] == 1
    assert counts[("gpu_fence_webhook_bad_requests_total", (("reason", BadRequestReason.METHOD_NOT_ALLOWED),))] == 1


def test_any_other_http_error_keeps_its_status_and_is_counted_under_one_reason(metrics):
    """No route of the app raises another HTTP error today; one that did would answer JSON with its own status and
    be counted under one bounded label, not a label per status code."""
    app = create_app(None, policy=StandInPolicy(), metrics=metrics)
    app.add_url_rule("/teapot", "teapot", lambda: abort(418))
    response = app.test_client().get("/teapot")
    assert response.status_code == 418 and response.json["error"] == BadRequestReason.HTTP_ERROR
    assert samples(metrics)[("gpu_fence_webhook_bad_requests_total", (("reason", BadRequestReason.HTTP_ERROR),))] == 1


def test_internal_error_is_counted_logged_and_fails_closed(metrics, caplog):
    app = create_app(None, policy=StandInPolicy(fail=ValueError("bad rule table")), metrics=metrics)
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        response = post(app.test_client(), "/validate", body())
    assert response.status_code == 200
    assert response.json["response"]["allowed"] is False
    assert response.json["response"]["status"]["code"] == 500
    counts = samples(metrics)
    assert counts[("gpu_fence_webhook_internal_errors_total", (("endpoint", "validate"),))] == 1
    assert (
        counts[("gpu_fence_webhook_reviews_total", (("endpoint", "validate"), ("rule", "none"), ("verdict", "error")))]
        == 1
    )
    [record] = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert record.fields["error"] == "ValueError: bad rule table"
    assert record.fields["uid"] == json.loads(body())["request"]["uid"]


def test_review_log_fields(client, caplog):
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        post(client, "/validate", body("pod-create-dryrun"))
    [record] = [r for r in caplog.records if getattr(r, "fields", {}).get("event") == "review"]
    fields = record.fields
    assert fields["verdict"] == "denied" and fields["rules"] == ["unpinned-container"]
    assert fields["namespace"] == "default" and fields["name"] == "trainer-7d9f8c6b5d-*"
    assert fields["dry_run"] is True and fields["duration_ms"] >= 0
    orjson.dumps(fields)  # everything logged is JSON-serialisable


def test_health_readiness_and_metrics_endpoints(metrics):
    state = {"ready": False}
    client = create_app(None, policy=StandInPolicy(), metrics=metrics, ready=lambda: state["ready"]).test_client()
    assert client.get("/healthz").json == {"status": "ok"}
    assert client.get("/readyz").status_code == 503
    state["ready"] = True
    assert client.get("/readyz").status_code == 200
    scrape = client.get("/metrics")
    assert scrape.status_code == 200
    assert scrape.content_type.startswith("text/plain")
    assert b"gpu_fence_webhook_certificate_expiry_timestamp_seconds" in scrape.data


def test_metrics_expose_no_created_series():
    """prometheus_client adds a ``_created`` series per counter and histogram; docs/metrics.md documents none."""
    import prometheus_client

    prometheus_client.enable_created_metrics()  # as in a fresh process, whatever other tests did
    client = create_app(None, policy=StandInPolicy(), metrics=WebhookMetrics()).test_client()
    post(client, "/validate", body())
    client.get("/nope")
    names = {
        sample.name
        for family in text_string_to_metric_families(client.get("/metrics").data.decode())
        for sample in family.samples
    }
    assert "gpu_fence_webhook_reviews_total" in names and "gpu_fence_webhook_bad_requests_total" in names
    assert not [name for name in names if name.endswith("_created")]


def test_every_bad_request_reason_is_documented():
    """The reasons are metric label values and the ``error`` of the answers: docs/metrics.md and docs/webhook.md list
    each one the code declares (webhook/reasons.py), and the dropped connections' too."""
    root = Path(__file__).parents[2]
    metrics_doc = (root / "docs" / "metrics.md").read_text()
    webhook_doc = (root / "docs" / "webhook.md").read_text()
    for reason in BadRequestReason:
        assert f"`{reason}`" in metrics_doc, reason
        assert f"| `{reason}` |" in webhook_doc, reason
    for dropped in DropReason:
        assert f"`{dropped}`" in metrics_doc, dropped


def test_log_lines_have_the_shared_shape(client, caplog):
    """serve formats with gpu_fence.logs: the review line carries the shared keys, then the review's fields."""
    from gpu_fence.logs import JsonLinesFormatter
    from gpu_fence.webhook.serving import logging_config

    assert logging_config("INFO")["formatters"]["json"]["()"] is JsonLinesFormatter
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        post(client, "/validate", body("pod-create-dryrun"))
        post(client, "/validate", b"")
    lines = [json.loads(JsonLinesFormatter().format(r)) for r in caplog.records]
    review, bad = lines
    assert list(review)[:5] == ["time", "level", "logger", "event", "message"]
    assert review["event"] == "review" and review["level"] == "info" and review["logger"] == "gpu_fence.webhook"
    assert review["message"] == "validate: denied Pod default/trainer-7d9f8c6b5d-*"
    assert review["rules"] == ["unpinned-container"] and review["dry_run"] is True and review["time"].endswith("Z")
    assert bad["event"] == "bad-request" and bad["level"] == "warning" and bad["reason"] == BadRequestReason.EMPTY_BODY
    assert bad["message"] == "body is empty; send an AdmissionReview as JSON" and bad["endpoint"] == "validate"


def test_unexpected_error_is_logged_with_its_traceback_as_a_string(metrics, caplog):
    from gpu_fence.logs import JsonLinesFormatter

    app = create_app(None, policy=StandInPolicy(), metrics=metrics)

    @app.get("/boom")
    def boom():
        raise RuntimeError("layer bug")

    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        response = app.test_client().get("/boom")
    assert response.status_code == 500 and response.json["error"] == "internal-error"
    (line,) = [json.loads(JsonLinesFormatter().format(r)) for r in caplog.records]
    assert line["event"] == "internal-error" and line["level"] == "error" and line["path"] == "/boom"
    assert "RuntimeError: layer bug" in line["exception"]
