"""The cost dashboard's panels against the session's real Prometheus (every scenario, the rules' split, hourly sums
and price group backfilled): every query parses and returns data, and the range panels say what the bill says for
the same hour. The dashboard's shape is tested in ``tests/manifests/test_cost_dashboard.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_fence.chargeback import rules
from tests.fakes.chargeback_scenarios import RULES_INTERVAL, WINDOWS, run_chargeback

pytestmark = pytest.mark.e2e

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "manifests" / "overlays" / "prometheus" / "gpu-fence-cost-dashboard.json"
)


def queries(time_range: str) -> dict[str, str]:
    """Each panel's query as Grafana sends it: every cluster (none is set here), method holder, ``time_range``."""
    found = {}
    for panel in json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$cluster", ".*").replace("$method", "holder")
            found[panel["title"]] = expr.replace("$__range", time_range)
    return found


def an_hour(prometheus) -> float:
    """The time of an hourly sum whose hour is whole and holds the "overreach" scenario's window's middle."""
    window = WINDOWS["overreach"]
    middle = (window.start + window.end) / 2
    [marker] = prometheus.query(f"{rules.HOURLY_EVALUATIONS}[1d]", at=window.end + 86400 / 2)
    times = [float(time) for time, _value in marker["values"]]
    return next(time for time in times if time - RULES_INTERVAL - 3600 < middle <= time - RULES_INTERVAL)


def test_every_panel_returns_data(prometheus):
    window = WINDOWS["overreach"]
    hour = an_hour(prometheus)
    for title, expr in queries("1h").items():
        if "$__" in expr:
            pytest.fail(f"{title}: a variable the test does not fill: {expr}")
        # the range panels at one hourly sum, the others over the window
        found = prometheus.query(expr, at=hour + 1) + prometheus.query_range(expr, window.start, window.end, 600)
        assert found, f"{title}: no data: {expr}"


def test_the_range_panels_say_what_the_bill_says_for_the_same_hour(prometheus, prices_file):
    hour = an_hour(prometheus)
    start, end = hour - RULES_INTERVAL - 3600, hour - RULES_INTERVAL  # the hour this sum stands for
    result = run_chargeback(
        "--prometheus", prometheus.url, "--start", f"{start:.3f}", "--end", f"{end:.3f}", "--prices", str(prices_file),
        "--series", "recorded", "--idle", "platform", "--format", "json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    bill = json.loads(result.stdout)
    assert bill["range"]["hourly_sums"] == 1  # the bill reads the same hourly sums
    panels = {title: prometheus.query(expr, at=hour + 1) for title, expr in queries("1h").items()}

    def one(title: str) -> float:
        [found] = panels[title]
        return float(found["value"][1])

    assert one("GPU cost of the range") == pytest.approx(bill["total_gpu_cost"], abs=0.005)
    assert one("Idle capacity of the range") == pytest.approx(bill["platform"]["cost"], abs=0.005)
    assert one("Unattributed memory of the range") == pytest.approx(bill["unattributed"]["cost"], abs=0.005)
    overreach = sum(group["overreach_cost"] for group in bill["groups"])
    assert overreach > 0 and one("Used without an allocation, of the range") == pytest.approx(overreach, abs=0.005)
    by_namespace = {
        row["metric"]["namespace"]: float(row["value"][1]) for row in panels["Cost of the range per namespace"]
    }
    billed = {group["group"]: group["total_cost"] for group in bill["groups"] if group["total_cost"]}
    assert by_namespace == pytest.approx(billed, abs=0.01)
