"""The command's flags as one frozen value, checked once: :func:`settings_from` reads the parsed arguments.

Every value that can be checked without reading a file is checked here, each bad one a :class:`ChargebackError`
that names the flag and what to give instead; the files the flags name (prices, cost centres, the HTTP client
configuration, the demo fleet) are read by the bill's making (``make.py``), which says what is wrong in them.
"""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from gpu_fence.metric_names import label_name

from . import rules as recording_rules
from .bill import IdlePolicy, Method
from .errors import ChargebackError
from .times import parse_duration, parse_time

# Default resolution: at most this many instants over the range, and never finer than a minute.
TARGET_POINTS = 2000
# Finer steps only repeat the same scraped sample, and a tiny one would make billions of instants.
MIN_STEP = 1.0
# The default --timeout grows with the range (a month's sums read a month of samples): 30 s, 10 s more per day.
TIMEOUT_BASE, TIMEOUT_PER_DAY, TIMEOUT_MOST = 30.0, 10.0, 900.0
_LABEL_KEY = re.compile(r"[A-Za-z0-9_./-]+")


class Format(Enum):
    TABLE = "table"
    CSV = "csv"
    JSON = "json"
    MARKDOWN = "markdown"
    HTML = "html"
    FOCUS = "focus"


class SeriesChoice(Enum):
    """``--series``: which series the bill is made from (``provenance.Series`` says which one it was)."""

    AUTO = "auto"  # the recording rules' where they can make this bill, else the raw series
    RECORDED = "recorded"
    RAW = "raw"


def default_timeout(seconds: float) -> float:
    """The default --timeout for a range of ``seconds``: what a 2-core Prometheus needs for it, with room."""
    return min(TIMEOUT_MOST, TIMEOUT_BASE + TIMEOUT_PER_DAY * max(0.0, seconds) / 86400)


def default_step(seconds: float) -> float:
    return max(60.0, math.ceil(seconds / TARGET_POINTS / 60.0) * 60.0)


def milliseconds(seconds: float) -> float:
    """Prometheus keeps time in whole milliseconds: a time or step as it will evaluate it."""
    return round(seconds * 1000) / 1000


@dataclass(frozen=True)
class Settings:
    """What one ``chargeback`` run was asked to do. Times are unix seconds (``now`` is when it was asked, to the
    second), steps and timeouts seconds."""

    now: float
    rules: bool  # write the recording rules instead of a bill
    demo: bool
    prometheus: str | None
    http_config: Path | None
    start: float | None  # None: the demo fleet's
    end: float | None  # None: the demo fleet's (without --demo, now)
    step: float | None  # None: the default for the range (for --rules, rules.DEFAULT_INTERVAL)
    step_given: str | None  # --step as written, for the messages that quote it
    by: str  # "namespace" or "label:KEY"
    price_per_gpu_hour: float | None
    prices: Path | None
    cost_centres: Path | None
    method: Method
    idle: IdlePolicy
    series: SeriesChoice
    compare_device_metrics: bool
    format: Format
    output: Path | None
    timeout: float | None  # None: default_timeout for the range
    quiet: bool
    pod_labels: tuple[str, ...]  # --rules: the label keys the rollups carry


def settings_from(args: argparse.Namespace, now: float) -> Settings:
    """The parsed command line as :class:`Settings`. Raises ChargebackError with a fix-it message."""
    if args.rules:
        step = _step(args.step)
        if step is not None and step < MIN_STEP:
            raise ChargebackError(f"--step {args.step!r}: the rules' interval must be at least {MIN_STEP:g} s")
        start = end = None
        by = args.by
    else:
        start, end = _range(args, now)
        step = _step(args.step)
        if step is not None and step < MIN_STEP:
            raise ChargebackError(
                f"--step {args.step!r}: must be at least {MIN_STEP:g} s (auditor samples are scrape intervals apart)"
            )
        by = _group_by(args.by)
        if args.compare_device_metrics and args.format == Format.FOCUS.value:
            raise ChargebackError(
                "--compare-device-metrics with --format focus: FOCUS rows are charges, and a comparison is not one; "
                "use another --format"
            )
    return Settings(
        now=now,
        rules=args.rules,
        demo=args.demo,
        prometheus=args.prometheus,
        http_config=args.http_config,
        start=start,
        end=end,
        step=step,
        step_given=args.step,
        by=by,
        price_per_gpu_hour=args.price_per_gpu_hour,
        prices=args.prices,
        cost_centres=args.cost_centres,
        method=Method(args.method),
        idle=IdlePolicy(args.idle),
        series=SeriesChoice(args.series),
        compare_device_metrics=args.compare_device_metrics,
        format=Format(args.format),
        output=args.output,
        timeout=args.timeout,
        quiet=args.quiet,
        pod_labels=_pod_labels(args.pod_label) if args.rules else (),
    )


def _step(given: str | None) -> float | None:
    return milliseconds(parse_duration(given)) if given else None


def _range(args: argparse.Namespace, now: float) -> tuple[float | None, float | None]:
    """--start and --end, with what the source needs beside them: the demo fleet or Prometheus and its prices."""
    if args.compare_device_metrics and args.demo:
        raise ChargebackError(
            "--compare-device-metrics reads dcgm-exporter's series from --prometheus: the demo fleet has none"
        )
    if args.demo:
        if args.prometheus or args.http_config:
            raise ChargebackError("--demo bills the bundled sample fleet: leave out --prometheus and --http-config")
        start = parse_time(args.start, now, "--start") if args.start else None
        end = parse_time(args.end, now, "--end") if args.end else None
        return start, end
    if not args.prometheus:
        raise ChargebackError("--prometheus URL is required (or try --demo for a bill over a bundled sample fleet)")
    if not args.start:
        raise ChargebackError("--start is required: the start of the range to bill, e.g. -30d or 2026-01-01T00:00:00Z")
    if args.prices is None and args.price_per_gpu_hour is None:
        raise ChargebackError("give prices: --price-per-gpu-hour N, or --prices FILE (a price list per model/node)")
    start = parse_time(args.start, now, "--start")
    end = parse_time(args.end or "now", now, "--end")
    if args.timeout is not None and (not math.isfinite(args.timeout) or args.timeout <= 0):
        raise ChargebackError(f"--timeout {args.timeout:g}: must be a number of seconds greater than zero")
    return start, end


def _group_by(by: str) -> str:
    if by == "namespace":
        return by
    if by.startswith("label:") and by.removeprefix("label:").strip():
        key = by.removeprefix("label:").strip()
        if not _LABEL_KEY.fullmatch(key):
            raise ChargebackError(f"--by {by!r}: {key!r} is not a Kubernetes label key")
        return f"label:{key}"
    raise ChargebackError(f"--by {by!r}: expected namespace or label:KEY (e.g. label:team)")


def _pod_labels(given: list[str] | None) -> tuple[str, ...]:
    keys = tuple(given) if given is not None else recording_rules.DEFAULT_POD_LABELS
    for key in keys:
        if not _LABEL_KEY.fullmatch(key):
            raise ChargebackError(f"--pod-label {key!r}: not a Kubernetes label key")
    if len({label_name(key) for key in keys}) < len(keys):
        raise ChargebackError(f"--pod-label {' '.join(keys)}: two keys become the same Prometheus label name")
    return keys
