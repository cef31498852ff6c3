"""Round ticks for the HTML bill's charts: money at 1, 2, 2.5 or 5 times a power of ten, time at whole minutes,
hours or days (UTC), so that a reader can read a bar against the axis without arithmetic."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from .times import MONTHS

_NICE = (1.0, 2.0, 2.5, 5.0, 10.0)
# Steps of a time axis, shortest first: minutes, hours, then days.
_TIME_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 1209600)


def money_ticks(peak: float, most: int = 5) -> tuple[list[float], int]:
    """Ticks from 0 to at or above ``peak``, at most ``most`` intervals of a round step, and the decimal places
    their labels need (``0, 2, 4, 6``; ``0, 0.5, 1``; ``0, 0.25, 0.5``)."""
    if not math.isfinite(peak) or peak <= 0:
        return [0.0, 1.0], 0
    raw = peak / most
    magnitude = 10 ** math.floor(math.log10(raw))
    nice = next(factor for factor in _NICE if factor * magnitude >= raw - 1e-12)
    step = nice * magnitude
    count = math.ceil(peak / step - 1e-9)
    places = max(0, -math.floor(math.log10(step) + 1e-9)) + (1 if nice == 2.5 and step < 10 else 0)
    return [round(step * index, 10) for index in range(count + 1)], places


def time_ticks(start: float, end: float, most: int = 8) -> list[tuple[float, str]]:
    """Instants strictly inside (start, end) on a round step (whole minutes, hours or days of UTC), at most
    ``most`` of them, each with its label: the time of day, with the date where a day begins (or only the date
    when the step is a day or more)."""
    span = end - start
    step = next((step for step in _TIME_STEPS if span / step <= most), _TIME_STEPS[-1])
    first = math.floor(start / step) * step + step if step <= 86400 else math.floor(start / 86400) * 86400 + 86400
    ticks: list[tuple[float, str]] = []
    moment = float(first)
    while moment < end and len(ticks) <= most:
        if moment > start:
            ticks.append((moment, _label(moment, step)))
        moment += step
    return ticks


def _label(moment: float, step: int) -> str:
    when = datetime.fromtimestamp(moment, UTC)
    date = f"{when.day} {MONTHS[when.month - 1]}"
    if step >= 86400:
        return date
    if moment % 86400 == 0:
        return f"{date} 00:00"
    return f"{when:%H:%M}"
