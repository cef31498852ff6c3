"""Command-line times and durations: RFC 3339, unix seconds, ``now`` and relative offsets like ``-7d``."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime

from .errors import ChargebackError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)([smhdw]))+$")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str, option: str = "--step") -> float:
    """``90``, ``90s``, ``5m``, ``1h30m`` → seconds (> 0)."""
    value = text.strip()
    try:
        seconds = float(value)
    except ValueError:
        if not _DURATION.match(value):
            raise ChargebackError(f"{option} {text!r}: expected seconds or a duration like 30s, 5m, 1h, 7d") from None
        seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(value))
    if not math.isfinite(seconds) or seconds <= 0:
        raise ChargebackError(f"{option} {text!r}: must be greater than zero")
    return seconds


def parse_time(text: str, now: float, option: str) -> float:
    """One point in time as unix seconds. ``now`` is passed in so the parser stays pure."""
    value = text.strip()
    if value == "now":
        return now
    if value.startswith("-") and not _is_number(value):
        return now - parse_duration(value[1:], option)
    if _is_number(value):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ChargebackError(f"{option} {text!r}: unix seconds must be >= 0")
        return seconds
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ChargebackError(
            f"{option} {text!r}: expected RFC 3339 (2026-01-31T00:00:00Z), unix seconds, now, or -7d / -12h"
        ) from None
    if moment.tzinfo is None:
        raise ChargebackError(f"{option} {text!r}: add a time zone offset, e.g. {value}Z for UTC")
    return moment.timestamp()


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def iso(timestamp: float) -> str:
    """Unix seconds → RFC 3339 in UTC, to the second, or to the millisecond when the time has one (a range the
    recording rules' evaluations cover starts at their phase, which Prometheus keeps in milliseconds)."""
    milliseconds = round(timestamp * 1000)
    whole = datetime.fromtimestamp(milliseconds // 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{whole}Z" if milliseconds % 1000 == 0 else f"{whole}.{milliseconds % 1000:03d}Z"


def iso_seconds(timestamp: float) -> str:
    """RFC 3339 to the second, as FOCUS writes its charge periods (``YYYY-MM-DDTHH:mm:ssZ``)."""
    return datetime.fromtimestamp(int(timestamp), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _day(moment: datetime, *, month: bool = True, year: bool = True) -> str:
    parts = [str(moment.day)]
    if month:
        parts.append(MONTHS[moment.month - 1])
    if year:
        parts.append(str(moment.year))
    return " ".join(parts)


def in_words(start: float, end: float) -> str:
    """A range as a reader says it, in UTC: whole days as the days they cover (``5 Jan 2026``, ``1–31 Jan 2026``,
    ``30 Dec 2025 – 2 Jan 2026``), anything else to the minute (``5 Jan 2026, 06:00–18:30``,
    ``5 Jan 2026 06:00 – 7 Jan 2026 18:30``), followed by ``UTC``."""
    first = datetime.fromtimestamp(start, UTC)
    after = datetime.fromtimestamp(end, UTC)
    if start % 86400 == 0 and end % 86400 == 0 and end > start:
        last = datetime.fromtimestamp(end - 86400, UTC)  # the range covers whole days up to the one before end
        if first.date() == last.date():
            return f"{_day(first)}, UTC"
        if (first.year, first.month) == (last.year, last.month):
            return f"{first.day}–{_day(last)}, UTC"
        return f"{_day(first, year=first.year != last.year)} – {_day(last)}, UTC"
    if first.date() == after.date():
        return f"{_day(first)}, {first:%H:%M}–{after:%H:%M} UTC"
    return f"{_day(first)} {first:%H:%M} – {_day(after)} {after:%H:%M} UTC"
