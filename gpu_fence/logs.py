"""One JSON-lines log shape for both deployables (``gpu-fence-webhook serve`` and ``gpu-fence-auditor run``).

A platform's log pipeline parses one shape, so both write the same keys, one JSON object per line on stderr:

``time``
    when the record was made: RFC 3339, UTC, milliseconds (``2026-01-05T10:00:00.123Z``)
``level``
    ``debug``, ``info``, ``warning``, ``error`` or ``critical``
``logger``
    the Python logger (``gpu_fence.webhook``, ``gpu_fence.auditor``, ``gunicorn.error``, ...)
``event``
    what happened, a stable kebab-case name (``review``, ``cycle``, ``cycle-failed``, ...); ``log`` for lines of
    libraries (gunicorn's own messages), which name no event
``message``
    one human sentence
``exception``
    only when an exception is logged: its traceback, as one string

then the event's own fields. A field may not replace one of those keys: it is kept as ``field_<name>`` instead, so
the shape holds whatever a caller passes. Values JSON cannot hold are written as their ``str()``.

Records carry their fields in ``record.fields`` (a dict); :func:`event` puts them there. The standard library
only (plus orjson, a core dependency, for speed on the webhook's per-review line); importing this module
configures nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Mapping
from typing import Any

import orjson

#: The keys every line has (``exception`` only with one); fields never overwrite them.
RESERVED = ("time", "level", "logger", "event", "message", "exception")
#: ``event`` of a record that names none (another library's message).
NO_EVENT = "log"


def rfc3339_millis(timestamp: float) -> str:
    """Unix seconds → ``2026-01-05T10:00:00.123Z``."""
    moment = dt.datetime.fromtimestamp(timestamp, dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def event(
    logger: logging.Logger,
    name: str,
    message: str,
    /,
    *,
    level: int = logging.INFO,
    exc_info: Any = None,
    **fields: Any,
) -> None:
    """Log the event ``name`` with a human ``message`` and its ``fields``, as one JSON line once formatted.

    The first three are positional-only, so that fields may be called ``name`` or ``message`` (a field ``message``
    is written as ``field_message``, see :class:`JsonLinesFormatter`).
    """
    if logger.isEnabledFor(level):
        logger.log(level, "%s", message, exc_info=exc_info, extra={"fields": {"event": name, **fields}})


class JsonLinesFormatter(logging.Formatter):
    """Formats a record as one JSON object on one line, in the shape described in this module's docstring."""

    def format(self, record: logging.LogRecord) -> str:
        document: dict[str, Any] = {
            "time": rfc3339_millis(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": NO_EVENT,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, Mapping):
            for raw_key, value in fields.items():
                key = str(raw_key)
                if key == "event":
                    document["event"] = str(value)
                elif key in RESERVED:
                    document[f"field_{key}"] = value
                else:
                    document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        return dumps(document)


def dumps(document: Mapping[str, Any]) -> str:
    """One line of JSON, whatever the values: a logger must never fail the code that logs."""
    try:
        return orjson.dumps(document, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # an int beyond 64 bits, a nesting orjson refuses: the slower encoder takes them
        pass
    try:
        return json.dumps(document, default=str, ensure_ascii=False)
    except (TypeError, ValueError):  # a circular structure: keep the line, say what could not be written
        shape = {key: document[key] for key in RESERVED if key in document}
        shape["unwritable_fields"] = repr({k: v for k, v in document.items() if k not in RESERVED})[:2000]
        return json.dumps(shape, default=str, ensure_ascii=False)


def logging_config(level: str = "INFO", loggers: Mapping[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` document: JSON lines on stderr for ``gpu_fence.*`` at ``level``, for other
    libraries' warnings (through the root logger), and for any extra ``loggers`` given (name → settings)."""
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonLinesFormatter}},
        "handlers": {"stderr": handler},
        "root": {"level": "WARNING", "handlers": ["stderr"]},
        "loggers": {
            "gpu_fence": {"level": level, "handlers": ["stderr"], "propagate": False},
            **(loggers or {}),
        },
    }


def configure(level: str = "INFO") -> None:
    """Send every log record of this process to stderr as JSON lines (for long-running commands only)."""
    import logging.config  # noqa: PLC0415 - only the daemons configure logging

    logging.config.dictConfig(logging_config(level))
