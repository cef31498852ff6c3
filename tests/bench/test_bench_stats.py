"""The statistics every benchmark reports: nearest-rank percentiles, medians of runs, the log-log slope."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.stats import latency_summary, loglog_slope, median_of_runs, percentile

samples = st.lists(st.floats(min_value=0, max_value=1e3, allow_nan=False), min_size=1, max_size=200)


def test_percentile_is_a_sample_by_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.50) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile(values, 0.0) == 1.0
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0  # unsorted input


@given(samples, st.floats(min_value=0, max_value=1))
def test_percentile_is_one_of_the_samples_and_bounded(values: list[float], fraction: float) -> None:
    value = percentile(values, fraction)
    assert value in values
    assert min(values) <= value <= max(values)


@given(samples)
def test_latency_summary_is_ordered_and_in_milliseconds(values: list[float]) -> None:
    summary = latency_summary(values)
    assert summary["count"] == len(values)
    assert summary["p50_ms"] <= summary["p90_ms"] <= summary["p99_ms"] <= summary["max_ms"]
    assert summary["max_ms"] == pytest.approx(max(values) * 1e3)


def test_percentile_rejects_no_samples_and_bad_fractions() -> None:
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match=r"within 0\.\.1"):
        percentile([1.0], 99)


def test_median_of_runs_is_per_key_and_ignores_one_disturbed_run() -> None:
    runs = [{"rate": 100.0, "p99": 1.0}, {"rate": 110.0, "p99": 50.0}, {"rate": 105.0, "p99": 1.2}, {"rate": 104.0}]
    assert median_of_runs(runs) == {"rate": 104.5, "p99": 1.2}


@given(st.floats(min_value=0.1, max_value=3), st.floats(min_value=1e-3, max_value=1e3))
def test_loglog_slope_recovers_the_power(power: float, constant: float) -> None:
    sizes = [1, 2, 4, 8]
    assert loglog_slope(sizes, [constant * size**power for size in sizes]) == pytest.approx(power, rel=1e-6)


def test_loglog_slope_of_linear_with_overhead_is_below_one() -> None:
    # a fixed cost flattens the curve: what a cycle with constant setup looks like
    slope = loglog_slope([1, 2, 4], [10 + 100 * size for size in (1, 2, 4)])
    assert 0.9 < slope < 1.0
    assert math.isfinite(slope)


@pytest.mark.parametrize(
    ("sizes", "values", "message"),
    [
        ([1], [1.0], "at least two"),
        ([1, 2], [1.0], "at least two"),
        ([0, 2], [1.0, 2.0], "positive"),
        ([2, 2], [1.0, 2.0], "not all be equal"),
    ],
)
def test_loglog_slope_rejects_unusable_input(sizes: list[float], values: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        loglog_slope(sizes, values)
