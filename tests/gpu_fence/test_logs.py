"""The shared JSON-lines log shape: keys, time format, fields that clash, values JSON cannot hold, configuration."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.logs import JsonLinesFormatter, event, logging_config, rfc3339_millis

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
ROOT = Path(__file__).parents[2]


def record(message: str = "done", *, fields=None, level: int = logging.INFO, exc_info=None, name="gpu_fence.test"):
    made = logging.LogRecord(name, level, __file__, 1, message, None, exc_info)
    if fields is not None:
        made.fields = fields
    return made


def render(made: logging.LogRecord) -> dict:
    line = JsonLinesFormatter().format(made)
    assert "\n" not in line
    return json.loads(line)


def test_every_line_has_the_documented_keys_first_then_the_fields():
    made = record("audit cycle completed", fields={"event": "cycle", "containers": 3, "notes": None})
    made.created = 1_780_000_000.25
    document = render(made)
    assert list(document)[:5] == ["time", "level", "logger", "event", "message"]
    assert document["time"] == "2026-05-28T20:26:40.250Z"
    assert document | {} == {
        "time": "2026-05-28T20:26:40.250Z",
        "level": "info",
        "logger": "gpu_fence.test",
        "event": "cycle",
        "message": "audit cycle completed",
        "containers": 3,
        "notes": None,
    }


def test_a_record_without_fields_is_a_log_event_with_its_message():
    """gunicorn's own messages and other libraries' warnings have no event of their own."""
    document = render(record("Booting worker with pid: %s", name="gunicorn.error"))
    assert document["event"] == "log" and document["logger"] == "gunicorn.error" and "exception" not in document


def test_fields_never_replace_the_lines_own_keys():
    fields = {
        "event": "bad-request",
        "message": "body is empty",
        "time": 5,
        "level": "x",
        "logger": "y",
        "exception": "z",
    }
    document = render(record("bad request", fields=fields, level=logging.WARNING))
    assert document["message"] == "bad request" and document["level"] == "warning"
    assert document["logger"] == "gpu_fence.test" and TIME.match(document["time"])
    assert (document["field_message"], document["field_time"], document["field_exception"]) == ("body is empty", 5, "z")


def test_exceptions_are_one_string_field():
    try:
        raise ValueError("boom")
    except ValueError:
        failed = record("internal error", level=logging.ERROR, exc_info=sys.exc_info())
    document = render(failed)
    assert document["level"] == "error" and document["exception"].startswith("Traceback")
    assert "ValueError: boom" in document["exception"]


def test_values_json_cannot_hold_are_written_not_raised():
    loop: dict = {}
    loop["self"] = loop
    document = render(record(fields={"event": "e", "path": Path("/x"), "huge": 2**70, "keys": {1: "a"}, "set": {"a"}}))
    assert document["path"] == "/x" and document["huge"] == 2**70 and document["keys"] == {"1": "a"}
    assert document["set"] == "{'a'}"
    circular = render(record("still logged", fields={"event": "e", "loop": loop}))
    assert (
        circular["message"] == "still logged" and circular["event"] == "e" and "loop" in circular["unwritable_fields"]
    )


json_values = st.recursive(
    # finite floats: JSON has no NaN or infinity (orjson writes null for them)
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(message=st.text(), fields=st.dictionaries(st.text(max_size=12), json_values, max_size=6))
def test_any_fields_give_one_parseable_line_with_the_shape_intact(message, fields):
    document = render(record(message, fields=fields))
    assert document["message"] == message and document["logger"] == "gpu_fence.test"
    assert TIME.match(document["time"]) and document["level"] == "info"
    for key, value in fields.items():
        if key not in ("time", "level", "logger", "event", "message", "exception"):
            assert document[key] == value


def test_event_helper_puts_name_and_fields_on_the_record_and_respects_the_level(caplog):
    logger = logging.getLogger("gpu_fence.test.helper")
    with caplog.at_level(logging.WARNING, logger="gpu_fence.test.helper"):
        event(logger, "cycle", "audit cycle completed", containers=3)  # info: below the level, not even built
        event(logger, "cycle-failed", "100% of the kubelet is down", level=logging.WARNING, reason="kubelet")
        event(logger, "review", "denied", level=logging.ERROR, name="trainer-*", logger="x")  # fields, not params
    first, second = caplog.records
    assert first.fields == {"event": "cycle-failed", "reason": "kubelet"}
    assert second.fields == {"event": "review", "name": "trainer-*", "logger": "x"}
    assert render(second)["logger"] == "gpu_fence.test.helper" and render(second)["field_logger"] == "x"
    made = first
    assert render(made)["message"] == "100% of the kubelet is down"


def test_rfc3339_millis_is_utc_with_three_digits():
    assert rfc3339_millis(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339_millis(1.0009) == "1970-01-01T00:00:01.000Z"
    assert rfc3339_millis(1.999) == "1970-01-01T00:00:01.999Z"


def test_configure_sends_our_events_and_other_libraries_warnings_to_stderr_as_json_lines():
    program = (
        "import logging, gpu_fence.logs as logs\n"
        "assert not logging.getLogger('gpu_fence').handlers  # importing configures nothing\n"
        "logs.configure('INFO')\n"
        "logs.event(logging.getLogger('gpu_fence.auditor'), 'started', 'auditor started', port=9400)\n"
        "logging.getLogger('gpu_fence.auditor').debug('not at INFO')\n"
        "logging.getLogger('urllib3.connectionpool').warning('Retrying %s', 'GET /api')\n"
        "logging.getLogger('urllib3.connectionpool').info('below the root level')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(line["logger"], line["event"], line["message"]) for line in lines] == [
        ("gpu_fence.auditor", "started", "auditor started"),
        ("urllib3.connectionpool", "log", "Retrying GET /api"),
    ]
    assert lines[0]["port"] == 9400 and lines[1]["level"] == "warning"


def test_logging_config_adds_extra_loggers():
    config = logging_config("WARNING", {"gunicorn.error": {"level": "INFO", "handlers": ["stderr"]}})
    assert config["loggers"]["gpu_fence"]["level"] == "WARNING"
    assert config["loggers"]["gunicorn.error"]["handlers"] == ["stderr"]


@pytest.mark.parametrize("level", ["DEBUG", "INFO", "WARNING", "ERROR"])
def test_logging_config_is_accepted_by_dictconfig(level):
    import logging.config

    logging.config.dictConfig(logging_config(level) | {"root": {"level": "WARNING", "handlers": []}})
    assert logging.getLogger("gpu_fence").level == logging.getLevelName(level)
    logging.getLogger("gpu_fence").handlers.clear()  # leave the test process as it was
    logging.getLogger("gpu_fence").propagate = True
