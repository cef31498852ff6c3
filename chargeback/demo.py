"""``chargeback --demo``: the real bill over a bundled sample fleet, with no cluster and no Prometheus.

The fleet (``demo_fleet.json`` beside this module) is the auditor's own series over one day, written as runs of
constant values and expanded into samples one scrape interval apart. :class:`SeriesSource` answers the very
queries ``raw.py`` sends (the same constants, through the same ``stream_intervals``) by evaluating them as
Prometheus does: at each instant, each series' latest sample within the 5-minute lookback, aggregated with
``max by (...)``. Only that shape of PromQL is understood; anything else is refused rather than guessed at.

The same series as OpenMetrics (:meth:`DemoFleet.openmetrics`) can be backfilled into a real Prometheus with
``promtool tsdb create-blocks-from openmetrics``; the tests bill both and compare.
"""

from __future__ import annotations

import bisect
import json
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from typing import Any

from .errors import ChargebackError
from .prices import Prices, prices_from_mapping
from .prometheus import Series

DATA = "demo_fleet.json"
NAME = "the bundled demo fleet (chargeback --demo)"
# Prometheus' default --query.lookback-delta. Prometheus 2.x keeps a sample exactly this old; 3.0 made the window
# left-open and drops it (CHANGELOG 3.0.0, prometheus/prometheus#13904). The demo's samples sit 30 s off the
# minute, so no instant of a whole-minute step ever falls on that edge and both agree.
LOOKBACK_MS = 300_000
GIB = 1 << 30

_QUERY = re.compile(
    r"^\s*max\s+by\s*\((?P<by>[^)]*)\)\s*\(\s*(?P<metric>[a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(?P<matchers>[^}]*)\})?\s*\)\s*$"
)
_MATCHER = re.compile(r'^\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>!=|=)\s*"(?P<value>[^"\\]*)"\s*$')


@dataclass(frozen=True)
class RawSeries:
    """One stored series: its metric name, labels and samples (milliseconds, value), in time order."""

    metric: str
    labels: Mapping[str, str]
    samples: tuple[tuple[int, float], ...]


@dataclass(frozen=True)
class DemoFleet:
    start: float
    end: float
    prices: Prices
    series: tuple[RawSeries, ...]

    def openmetrics(self) -> str:
        """The series as OpenMetrics text (``# EOF`` at the end), as ``promtool`` backfills it."""
        families: dict[str, list[str]] = defaultdict(list)
        for item in self.series:
            labels = ",".join(f'{key}="{value}"' for key, value in item.labels.items())
            families[item.metric] += [
                f"{item.metric}{{{labels}}} {value!r} {ms // 1000}.{ms % 1000:03d}" for ms, value in item.samples
            ]
        out = []
        for name, lines in families.items():
            out.append(f"# TYPE {name} gauge")
            out += lines
        return "\n".join([*out, "# EOF", ""])


def _moment(day: datetime, text: str, where: str) -> int:
    """``HH:MM`` on the fleet's day (``24:00`` is its end) → unix milliseconds."""
    match = re.fullmatch(r"(\d{2}):(\d{2})", text)
    if not match or int(match[1]) > 24 or int(match[2]) > 59 or (int(match[1]) == 24 and int(match[2])):
        raise ChargebackError(f"demo fleet: {where}: {text!r} is not a time of day HH:MM")
    return round(day.timestamp() * 1000) + (int(match[1]) * 3600 + int(match[2]) * 60) * 1000


def fleet_from_mapping(document: Any) -> DemoFleet:
    """Validate and expand the fleet document: every run becomes samples one scrape interval apart."""
    try:
        day = datetime.fromisoformat(document["day"])
        interval_ms = int(document["scrape_interval_seconds"] * 1000)
        offset_ms = int(document["scrape_offset_seconds"] * 1000)
        prices = prices_from_mapping(document["prices"], source="demo fleet prices")
        series = []
        for index, item in enumerate(document["series"]):
            scale = GIB if item.get("unit") == "GiB" else 1
            samples: list[tuple[int, float]] = []
            for begin, finish, value in item["runs"]:
                where = f"series {index} ({item['metric']})"
                first, last = _moment(day, begin, where), _moment(day, finish, where)
                samples += [(ms, float(value) * scale) for ms in range(first + offset_ms, last, interval_ms)]
            series.append(RawSeries(item["metric"], dict(item["labels"]), tuple(sorted(samples))))
    except (KeyError, TypeError, ValueError) as error:
        raise ChargebackError(f"the demo fleet data is damaged ({type(error).__name__}: {error})") from None
    start = day.timestamp()
    return DemoFleet(start=start, end=start + 86400, prices=prices, series=tuple(series))


def load_fleet() -> DemoFleet:
    text = resources.files(__package__).joinpath(DATA).read_text(encoding="utf-8")
    return fleet_from_mapping(json.loads(text))


class SeriesSource:
    """A :class:`~.prometheus.Source` over stored series: ``max by (...) (metric{matchers})`` evaluated in process."""

    def __init__(self, series: Sequence[RawSeries], name: str = NAME) -> None:
        self._name = name
        self._by_metric: dict[str, list[RawSeries]] = defaultdict(list)
        for item in series:
            self._by_metric[item.metric].append(item)

    @property
    def name(self) -> str:
        return self._name

    def query_range(self, query: str, start: float, end: float, step: float) -> list[Series]:
        match = _QUERY.match(query)
        if match is None:
            raise ChargebackError(f"the demo source evaluates only max by (...) (metric{{...}}), not {query!r}")
        by = [label.strip() for label in match["by"].split(",") if label.strip()]
        matchers = [_matcher(text, query) for text in (match["matchers"] or "").split(",") if text.strip()]
        first, last, step_ms = round(start * 1000), round(end * 1000), round(step * 1000)
        instants = range(first, last + 1, step_ms)
        groups: dict[tuple[tuple[str, str], ...], dict[int, float]] = defaultdict(dict)
        for item in self._by_metric.get(match["metric"], []):
            if not all(
                item.labels.get(label, "") == value if op == "=" else item.labels.get(label, "") != value
                for label, op, value in matchers
            ):
                continue
            key = tuple((label, item.labels[label]) for label in by if item.labels.get(label))
            times = [ms for ms, _ in item.samples]
            values = groups[key]
            for instant in instants:
                position = bisect.bisect_right(times, instant) - 1
                if position < 0 or times[position] < instant - LOOKBACK_MS:
                    continue
                value = item.samples[position][1]
                values[instant] = max(value, values.get(instant, value))
        return [
            Series(dict(key), tuple((ms / 1000, value) for ms, value in sorted(values.items())))
            for key, values in groups.items()
            if values
        ]


def _matcher(text: str, query: str) -> tuple[str, str, str]:
    match = _MATCHER.match(text)
    if match is None:
        raise ChargebackError(f'the demo source understands only label="v" and label!="v" matchers: {query!r}')
    return match["label"], match["op"], match["value"]
