"""The review endpoints' WSGI layer (webhook.wsgi) called as a WSGI server calls it: bodies with and without a
length, limits, failures while reading, what goes on to Flask, and the review log line written to a real pipe."""

from __future__ import annotations

import io
import json
import logging
import os
import select
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families
from werkzeug.http import parse_options_header
from werkzeug.wsgi import get_content_length

from gpu_fence.logs import JsonLinesFormatter, rfc3339_millis
from gpu_fence.webhook import wsgi
from gpu_fence.webhook.app import create_app
from gpu_fence.webhook.metrics import WebhookMetrics
from gpu_fence.webhook.reasons import BadRequestReason
from gpu_fence.webhook.review import Endpoint, review
from gpu_fence.webhook.wsgi import MAX_BODY_BYTES, MAX_DISCARD_BYTES, ReviewLog, content_length, mimetype_of
from tests.fakes.stand_in_policy import StandInPolicy

FIXTURES = Path(__file__).parent / "admissionreviews"
BODY = (FIXTURES / "pod-create-replicaset-gpu-mix.json").read_bytes()


class Reader(io.BytesIO):
    """``wsgi.input`` that remembers how much was read from it."""

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.consumed = self.tell()
        return data


class BrokenInput:
    def read(self, size: int = -1) -> bytes:
        raise TimeoutError("timed out")


def call(
    app,
    method: str,
    path: str,
    body: bytes = b"",
    *,
    length: str | None = "auto",
    content_type: str | None = "application/json",
    terminated: bool = True,
    stream=None,
):
    """Call ``app`` as gunicorn does (``wsgi.input_terminated``), and return (status, headers, body)."""
    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "localhost",
        "SERVER_PORT": "8443",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.url_scheme": "https",
        "wsgi.input": stream if stream is not None else Reader(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.version": (1, 0),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    if terminated:
        environ["wsgi.input_terminated"] = True
    if length == "auto":
        environ["CONTENT_LENGTH"] = str(len(body))
    elif length is not None:
        environ["CONTENT_LENGTH"] = length
    if content_type is not None:
        environ["CONTENT_TYPE"] = content_type
    else:
        environ.pop("CONTENT_TYPE", None)
    answer: dict = {}

    def start_response(status, headers, exc_info=None):
        answer["status"], answer["headers"] = status, dict(headers)

    data = b"".join(app(environ, start_response))
    return answer["status"], answer["headers"], data, environ["wsgi.input"]


@pytest.fixture
def metrics() -> WebhookMetrics:
    return WebhookMetrics()


@pytest.fixture
def app(metrics):
    return create_app(None, policy=StandInPolicy(), metrics=metrics)


def counts(metrics: WebhookMetrics) -> dict[tuple, float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for s in family.samples
    }


def bad_requests(metrics: WebhookMetrics, reason: str) -> float:
    return counts(metrics).get(("gpu_fence_webhook_bad_requests_total", (("reason", reason),)), 0)


def test_a_review_is_answered_in_front_of_flask_with_its_length(app, metrics):
    status, headers, data, _ = call(app, "POST", "/validate", BODY)
    assert status == "200 OK"
    assert headers == {"Content-Type": "application/json", "Content-Length": str(len(data))}
    assert orjson.loads(data) == review(orjson.loads(BODY), Endpoint.VALIDATE, None, StandInPolicy()).response
    assert isinstance(app.wsgi_app, wsgi.ReviewEndpoints)  # the Flask test client goes through it too


def test_a_chunked_body_is_read_to_its_end(app):
    status, _, data, _ = call(app, "POST", "/mutate", BODY, length=None)
    assert status == "200 OK" and orjson.loads(data)["response"]["patchType"] == "JSONPatch"


def test_a_chunked_body_past_the_limit_is_413_counted_as_flask_answered_it(app, metrics, caplog):
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        status, _, data, stream = call(app, "POST", "/validate", b"{" + b" " * MAX_BODY_BYTES + b"}", length=None)
    assert status == "413 Request Entity Too Large"
    assert orjson.loads(data) == {
        "error": BadRequestReason.BODY_TOO_LARGE,
        "message": f"body larger than {MAX_BODY_BYTES} bytes",
    }
    assert stream.consumed == MAX_BODY_BYTES + 1  # bounded: never more than one byte past the limit
    assert bad_requests(metrics, BadRequestReason.BODY_TOO_LARGE) == 1
    assert caplog.records == []


def test_an_announced_body_past_the_limit_is_read_away_then_refused(app, metrics, caplog):
    body = b"x" * (MAX_BODY_BYTES + 10)
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        status, _, data, stream = call(app, "POST", "/validate", body)
    assert status.startswith("413 ")
    document = orjson.loads(data)
    assert document["error"] == BadRequestReason.BODY_TOO_LARGE and f"body of {len(body)} bytes" in document["message"]
    assert stream.consumed == len(body)  # read away, so that the sender gets the answer instead of a reset
    [record] = caplog.records
    assert record.levelno == logging.WARNING and record.fields["reason"] == BadRequestReason.BODY_TOO_LARGE


def test_a_body_past_the_discard_limit_is_not_read(app):
    status, _, _, stream = call(app, "POST", "/validate", b"", length=str(MAX_DISCARD_BYTES + 1))
    assert status.startswith("413 ") and not hasattr(stream, "consumed")


@pytest.mark.parametrize("body", [BODY[: len(BODY) // 2], b'{"apiVersion": "admission.k8s.io/v1"}'])
def test_a_body_shorter_than_its_length_is_a_counted_400_even_when_what_came_parses(app, metrics, body):
    status, _, data, _ = call(app, "POST", "/validate", body, length=str(len(body) + 7))
    assert status == "400 Bad Request"
    assert orjson.loads(data) == {
        "error": BadRequestReason.TRUNCATED_BODY,
        "message": f"body ended after {len(body)} of its {len(body) + 7} bytes (Content-Length)",
    }
    assert bad_requests(metrics, BadRequestReason.TRUNCATED_BODY) == 1


@pytest.mark.parametrize(("length", "terminated"), [(None, False), ("abc", True), ("-5", True), ("0", True)])
def test_no_usable_length_reads_as_an_empty_body(app, metrics, length, terminated):
    """As werkzeug read it: no length from a server that does not end the stream is no body (reading could hang);
    a length that is not a number, or negative, is 0."""
    status, _, data, _ = call(app, "POST", "/validate", BODY, length=length, terminated=terminated)
    assert status == "400 Bad Request" and orjson.loads(data)["error"] == BadRequestReason.EMPTY_BODY
    assert bad_requests(metrics, BadRequestReason.EMPTY_BODY) == 1


@settings(max_examples=200, deadline=None)
@given(
    st.one_of(st.none(), st.text(max_size=8), st.integers(-5, 10**9).map(str)),
    st.sampled_from([None, "chunked", "gzip, chunked", "Chunked", " chunked ", "xchunked", "chunked;q=1", "identity"]),
)
def test_content_length_reads_headers_as_werkzeug(value, encoding):
    environ = {
        key: header
        for key, header in (("CONTENT_LENGTH", value), ("HTTP_TRANSFER_ENCODING", encoding))
        if header is not None
    }
    assert content_length(environ) == get_content_length(environ)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet='aAjJsonxt/; =\t,"-+.8', max_size=30)
    | st.sampled_from(["application/json", "Application/JSON; charset=utf-8", "application/json;", ""])
)
def test_mimetype_is_read_as_werkzeug(content_type):
    assert mimetype_of(content_type) == parse_options_header(content_type)[0].lower()


def test_a_failed_read_is_a_counted_logged_json_500(app, metrics, caplog):
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        status, headers, data, _ = call(app, "POST", "/validate/warn", b"", length="100", stream=BrokenInput())
    assert status == "500 Internal Server Error" and headers["Content-Type"] == "application/json"
    assert orjson.loads(data) == {"error": "internal-error", "message": "internal error: TimeoutError"}
    assert counts(metrics)[("gpu_fence_webhook_internal_errors_total", (("endpoint", "validate-warn"),))] == 1
    [record] = caplog.records
    assert record.fields["event"] == "internal-error" and record.fields["path"] == "/validate/warn"
    assert "TimeoutError: timed out" in json.loads(JsonLinesFormatter().format(record))["exception"]


def test_a_bug_in_front_of_flask_and_one_behind_it_get_the_same_answer(app, metrics, caplog):
    @app.get("/boom")
    def boom():
        raise TimeoutError("timed out")

    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        in_front = call(app, "POST", "/validate", b"", length="100", stream=BrokenInput())
        behind = call(app, "GET", "/boom")
    body = orjson.dumps({"error": "internal-error", "message": "internal error: TimeoutError"})
    for status, headers, data, _ in (in_front, behind):
        assert (status.split()[0], headers["Content-Type"], data) == ("500", "application/json", body)
    found = counts(metrics)
    for label in ("validate", "boom"):
        assert found[("gpu_fence_webhook_internal_errors_total", (("endpoint", label),))] == 1
    lines = [json.loads(JsonLinesFormatter().format(record)) for record in caplog.records]
    assert [line.pop("path") for line in lines] == ["/validate", "/boom"]
    for line in lines:
        line.pop("time"), line.pop("exception")
    assert lines[0] == lines[1]


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/validate", "405 METHOD NOT ALLOWED"),
        ("PUT", "/mutate", "405 METHOD NOT ALLOWED"),
        ("POST", "/validate/", "404 NOT FOUND"),
        ("POST", "/Validate", "404 NOT FOUND"),
        ("GET", "/healthz", "200 OK"),
        ("OPTIONS", "/mutate", "200 OK"),
    ],
)
def test_everything_else_goes_on_to_flask(app, method, path, status):
    got, headers, _, _ = call(app, method, path, BODY)
    assert got == status
    if method == "OPTIONS":
        assert set(headers["Allow"].replace(" ", "").split(",")) == {"OPTIONS", "POST"}


def test_review_counters_count_every_call_per_label_set(app, metrics):
    for _ in range(3):
        call(app, "POST", "/validate", BODY)
        call(app, "POST", "/mutate", BODY)
    call(app, "POST", "/validate", b"{", content_type="application/json")
    seen = counts(metrics)
    assert (
        seen[
            (
                "gpu_fence_webhook_reviews_total",
                (("endpoint", "validate"), ("rule", "unpinned-container"), ("verdict", "denied")),
            )
        ]
        == 3
    )
    assert (
        seen[("gpu_fence_webhook_reviews_total", (("endpoint", "mutate"), ("rule", "none"), ("verdict", "patched")))]
        == 3
    )
    assert seen[("gpu_fence_webhook_review_duration_seconds_count", (("endpoint", "validate"),))] == 3
    assert bad_requests(metrics, BadRequestReason.INVALID_JSON) == 1


def test_several_rules_count_once_each(metrics):
    metrics.count_review("validate", "denied", ("privileged", "unpinned-container"), 0.001)
    metrics.count_review("validate", "denied", ("privileged", "unpinned-container"), 0.001)
    metrics.count_review("validate", "denied", ["privileged"], 0.001)
    seen = counts(metrics)

    def denied(rule: str) -> float:
        labels = (("endpoint", "validate"), ("rule", rule), ("verdict", "denied"))
        return seen[("gpu_fence_webhook_reviews_total", labels)]

    assert denied("privileged") == 3 and denied("unpinned-container") == 2


# -- the review log line --------------------------------------------------------------------------------------------


def read_pipe(fd: int) -> bytes:
    data = b""
    while select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture
def pipe():
    read_end, write_end = os.pipe()
    yield read_end, write_end
    os.close(read_end)
    os.close(write_end)


def test_the_direct_line_is_the_line_the_formatter_writes(metrics, pipe, caplog):
    """serve's line (one os.write) and the logging module's line hold the same keys, in the same order, with the
    same values; only the clock reading differs, and both are RFC 3339 with milliseconds."""
    read_end, write_end = pipe
    logger = logging.getLogger("gpu_fence.webhook")
    direct = create_app(None, policy=StandInPolicy(), metrics=metrics, review_log=ReviewLog(logger, fd=write_end))
    through_logging = create_app(None, policy=StandInPolicy(), metrics=WebhookMetrics())
    body = (FIXTURES / "pod-create-dryrun.json").read_bytes()
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        call(direct, "POST", "/validate", body)
        assert caplog.records == []  # not through the logging module
        call(through_logging, "POST", "/validate", body)
    [record] = caplog.records
    raw = read_pipe(read_end)
    assert raw.endswith(b"\n") and raw.count(b"\n") == 1
    line = json.loads(raw)
    expected = json.loads(JsonLinesFormatter().format(record))
    assert list(line) == list(expected)
    line.pop("duration_ms"), expected.pop("duration_ms")
    assert line.pop("time").endswith("Z") and len(expected.pop("time")) == 24
    assert line == expected
    assert line["message"] == "validate: denied Pod default/trainer-7d9f8c6b5d-*" and line["dry_run"] is True


def test_the_direct_line_respects_the_level(metrics, pipe):
    read_end, write_end = pipe
    logger = logging.getLogger("gpu_fence.webhook.quiet-test")
    logger.setLevel(logging.WARNING)
    app = create_app(None, policy=StandInPolicy(), metrics=metrics, review_log=ReviewLog(logger, fd=write_end))
    call(app, "POST", "/mutate", BODY)
    assert read_pipe(read_end) == b""
    logger.setLevel(logging.INFO)
    call(app, "POST", "/mutate", BODY)
    assert json.loads(read_pipe(read_end))["verdict"] == "patched"


def test_internal_errors_are_logged_through_logging_at_error_even_with_an_fd(metrics, pipe, caplog):
    read_end, write_end = pipe
    app = create_app(
        None,
        policy=StandInPolicy(fail=ValueError("bad rule table")),
        metrics=metrics,
        review_log=ReviewLog(logging.getLogger("gpu_fence.webhook"), fd=write_end),
    )
    with caplog.at_level(logging.INFO, logger="gpu_fence.webhook"):
        status, _, data, _ = call(app, "POST", "/validate", BODY)
    assert status == "200 OK" and orjson.loads(data)["response"]["status"]["code"] == 500
    assert read_pipe(read_end) == b""
    [record] = caplog.records
    assert record.levelno == logging.ERROR and record.fields["error"] == "ValueError: bad rule table"


def test_a_closed_stderr_never_fails_a_review(metrics):
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.close(write_end)  # writes now fail with EBADF
    app = create_app(
        None,
        policy=StandInPolicy(),
        metrics=metrics,
        review_log=ReviewLog(logging.getLogger("gpu_fence.webhook"), fd=write_end),
    )
    status, _, _, _ = call(app, "POST", "/validate", BODY)
    assert status == "200 OK"


@settings(max_examples=500, deadline=None)
@given(
    st.floats(min_value=0, max_value=4e9, allow_nan=False)
    | st.integers(0, 4 * 10**9).map(lambda s: s + 0.9995)
    | st.integers(0, 4 * 10**9).map(lambda s: s + 0.9999996)
)
def test_the_direct_line_time_is_rfc3339_millis_through_the_cached_second(now):
    """The line formats the date and time once a second: a second line in the same second, or in the next, says
    what ``gpu_fence.logs`` would."""
    outcome = review(json.loads(BODY), Endpoint.MUTATE, None, StandInPolicy())
    times = iter((now, now + 0.25))
    read_end, write_end = os.pipe()
    try:
        logger = logging.getLogger("gpu_fence.webhook.clock-test")
        logger.setLevel(logging.INFO)
        log = ReviewLog(logger, fd=write_end, clock=lambda: next(times))
        log.write(Endpoint.MUTATE, outcome, 0.001)
        log.write(Endpoint.MUTATE, outcome, 0.001)
        lines = os.read(read_end, 1 << 16).splitlines()
    finally:
        os.close(read_end)
        os.close(write_end)
    assert [json.loads(line)["time"] for line in lines] == [rfc3339_millis(now), rfc3339_millis(now + 0.25)]


@pytest.mark.parametrize(
    ("tls", "status", "reason"),
    [
        (
            {},
            "403 Forbidden",
            BadRequestReason.CLIENT_CERTIFICATE_REQUIRED,
        ),  # served without our worker: no certificate known
        ({wsgi.CLIENT_VERIFY: "NONE"}, "403 Forbidden", BadRequestReason.CLIENT_CERTIFICATE_REQUIRED),
        (
            {wsgi.CLIENT_VERIFY: wsgi.CLIENT_VERIFIED, wsgi.CLIENT_CN: "system:node:a"},
            "403 Forbidden",
            BadRequestReason.CLIENT_NOT_ALLOWED,
        ),
        ({wsgi.CLIENT_VERIFY: wsgi.CLIENT_VERIFIED, wsgi.CLIENT_CN: "kube-apiserver"}, "200 OK", None),
    ],
)
def test_with_client_auth_reviews_need_the_api_servers_certificate_and_health_does_not(metrics, tls, status, reason):
    app = create_app(
        None, policy=StandInPolicy(), metrics=metrics, client_auth=wsgi.ClientAuth(frozenset({"kube-apiserver"}))
    )
    wrapped = app.wsgi_app

    def with_tls(environ, start_response):
        environ.update(tls)
        return wrapped(environ, start_response)

    app.wsgi_app = with_tls
    got, _, data, _ = call(app, "POST", "/validate", BODY)
    assert got == status
    if reason:
        assert orjson.loads(data)["error"] == reason and bad_requests(metrics, reason) == 1
    assert call(app, "GET", "/healthz")[0] == "200 OK"
