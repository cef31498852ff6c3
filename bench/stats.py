"""Summaries of latency samples and of repeated runs: percentiles, medians, a log-log slope.

Pure functions over lists of numbers, so that every benchmark reports the same statistics the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence


def percentile(samples: Sequence[float], fraction: float) -> float:
    """The ``fraction`` quantile (0..1) by the nearest-rank method on a copy of the samples.

    Nearest rank, not interpolation: a p99 is then a latency that some request really had.
    """
    if not samples:
        raise ValueError("percentile of no samples")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction {fraction} is not within 0..1")
    ordered = sorted(samples)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def latency_summary(seconds: Sequence[float]) -> dict[str, float]:
    """p50/p90/p99/max in milliseconds of latency samples given in seconds."""
    return {
        "count": len(seconds),
        "p50_ms": percentile(seconds, 0.50) * 1e3,
        "p90_ms": percentile(seconds, 0.90) * 1e3,
        "p99_ms": percentile(seconds, 0.99) * 1e3,
        "max_ms": max(seconds) * 1e3,
    }


def median_of_runs(runs: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Key by key median of several runs' summaries (keys missing from a run are skipped for that run).

    Medians, not means: on a shared machine one disturbed run moves a mean but not a median.
    """
    runs = list(runs)
    keys = dict.fromkeys(key for run in runs for key in run)
    return {key: statistics.median(run[key] for run in runs if key in run) for key in keys}


def loglog_slope(sizes: Sequence[float], values: Sequence[float]) -> float:
    """Least-squares slope of log(value) over log(size): 1.0 means linear scaling, 2.0 quadratic."""
    if len(sizes) != len(values) or len(sizes) < 2:
        raise ValueError("need at least two (size, value) pairs")
    if min(sizes) <= 0 or min(values) <= 0:
        raise ValueError("sizes and values must be positive for a log-log fit")
    xs = [math.log(size) for size in sizes]
    ys = [math.log(value) for value in values]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if spread == 0:
        raise ValueError("sizes must not all be equal")
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / spread
