"""The bill from the chargeback recording rules' series against the bill from the raw series, on one real Prometheus.

The session's Prometheus (``conftest.py``) holds every scenario and what the recording rules (``rules.py``, every
10 minutes) recorded over them, backfilled by ``promtool tsdb create-blocks-from rules`` at the phase Prometheus
itself would evaluate the group at. A recorded bill covers the rules' evaluations in the range asked for; the raw
bill made at those very instants (its range, ``--step`` = the interval) must be the same bill: every group, row,
card, line and point of the timeline, for both methods, both idle policies and both groupings.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime

import pytest

from gpu_fence.chargeback import rules
from gpu_fence.chargeback.recorded import Plan, over, price_classes, timeline_points
from tests.fakes.chargeback_scenarios import (
    DCGM_WINDOWS,
    RULES_INTERVAL,
    UNRECORDED,
    WINDOWS,
    run_chargeback,
    window_args,
)

pytestmark = pytest.mark.e2e

TEAM = "label:example.com/team"
# Every scenario: "renamed" has no bill, and both paths refuse it alike (below).
SCENARIOS = [name for name in WINDOWS if name != "renamed"]
LABELLED = ("timeslice", "relabelled")


def bill(prometheus, prices_file, *arguments: str, output: str = "json"):
    return run_chargeback("--prometheus", prometheus.url, "--prices", str(prices_file), "--format", output, *arguments)


def document(result) -> dict:
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def seconds(text: str) -> str:
    """An RFC 3339 time of the bill (to the millisecond where it has one) as unix seconds for --start/--end."""
    return f"{datetime.fromisoformat(text.replace('Z', '+00:00')).timestamp():.3f}"


def covered(recorded: dict) -> list[str]:
    """The raw series' arguments for the range a recorded bill covers."""
    span = recorded["range"]
    return ["--start", seconds(span["start"]), "--end", seconds(span["end"]), "--step", "10m"]


def same_numbers(left, right, where: str = "bill") -> None:
    """Equal documents, numbers to 1e-9 (float sums in another order); every cent is then the same."""
    if isinstance(left, dict):
        assert left.keys() == right.keys(), where
        for key in left:
            same_numbers(left[key], right[key], f"{where}.{key}")
    elif isinstance(left, list):
        assert len(left) == len(right), where
        for index, (a, b) in enumerate(zip(left, right, strict=True)):
            same_numbers(a, b, f"{where}[{index}]")
    elif isinstance(left, float) or isinstance(right, float):
        assert left == pytest.approx(right, rel=1e-9, abs=1e-9), where
    else:
        assert left == right, where


def comparable(bill_document: dict) -> dict:
    """What the two paths must agree on: all but when, and from which series, the bill was made."""
    kept = {key: value for key, value in bill_document.items() if key != "generated_at"}
    kept["range"] = {
        key: value for key, value in bill_document["range"].items() if key not in ("series", "hourly_sums")
    }
    kept["notes"] = [note for note in bill_document["notes"] if "recording rules" not in note]
    return kept


def cases():
    for name in SCENARIOS:
        for method in ("holder", "usage"):
            for idle in ("proportional", "platform"):
                yield name, method, idle, "namespace"
                if name in LABELLED:
                    yield name, method, idle, TEAM


@pytest.mark.parametrize(("window", "method", "idle", "by"), list(cases()))
def test_the_recorded_bill_is_the_raw_bill_at_the_rules_instants(prometheus, prices_file, window, method, idle, by):  # noqa: PLR0917
    options = ["--method", method, "--idle", idle, "--by", by]
    recorded = document(bill(prometheus, prices_file, *window_args(window, "recorded"), *options))
    raw = document(bill(prometheus, prices_file, *covered(recorded), "--series", "raw", *options))
    assert (recorded["range"]["series"], raw["range"]["series"]) == ("recorded", "raw")
    assert recorded["range"]["step_seconds"] == raw["range"]["step_seconds"] == RULES_INTERVAL
    assert recorded["total_gpu_cost"] > 0
    same_numbers(comparable(recorded), comparable(raw))
    # The FOCUS rows are the ledger's lines: the same rows, cost for cost.
    focus = [
        list(csv.DictReader(io.StringIO(result.stdout)))
        for result in (
            bill(prometheus, prices_file, *window_args(window, "recorded"), *options, output="focus"),
            bill(prometheus, prices_file, *covered(recorded), "--series", "raw", *options, output="focus"),
        )
    ]
    for rows in focus:
        for row in rows:
            del row["x_Series"], row["x_GeneratedAt"]
    assert focus[0] == focus[1]


def test_a_range_on_the_rules_grid_is_billed_exactly(prometheus, prices_file):
    off_grid = document(bill(prometheus, prices_file, *window_args("exclusive", "recorded")))
    window = WINDOWS["exclusive"]
    start, end = seconds(off_grid["range"]["start"]), seconds(off_grid["range"]["end"])
    # The rules evaluate at their own phase within each 10 minutes: the bill covers their evaluations in the range,
    # six of them, each standing for the 10 minutes before it, and says so.
    assert window.start - RULES_INTERVAL < float(start) <= window.start and float(end) - float(start) == 3600
    [note] = [note for note in off_grid["notes"] if "recording rules" in note]
    assert "every 600 s" in note and off_grid["range"]["start"] in note and off_grid["range"]["end"] in note
    # Asked for on that grid, the range is billed as asked, with nothing to say about it.
    on_grid = document(bill(prometheus, prices_file, "--start", start, "--end", end, "--series", "recorded"))
    assert (on_grid["range"]["start"], on_grid["range"]["end"]) == (
        off_grid["range"]["start"],
        off_grid["range"]["end"],
    )
    assert on_grid["notes"] == []
    assert on_grid["range"]["step_seconds"] == RULES_INTERVAL  # the rules' interval, with no --step given
    same_numbers(comparable(on_grid), comparable(off_grid))


def test_evaluations_the_rules_missed_are_computed_from_the_raw_series(prometheus, prices_file):
    recorded = document(bill(prometheus, prices_file, *window_args("unrecorded", "recorded"), "--idle", "platform"))
    start = float(seconds(recorded["range"]["start"]))
    evaluations = [start + RULES_INTERVAL * index for index in range(1, 7)]
    missing = [time for time in evaluations if UNRECORDED[0] < time < UNRECORDED[1]]
    assert len(missing) == 3
    [note] = [note for note in recorded["notes"] if "missing" in note]
    assert note.startswith("3 of 6 evaluations of the recording rules are missing")
    # The replicas scenario's figures at these instants: queue reserves 2 of 4 replicas all hour (1.50), lab uses
    # the rest of the card while its memory lasts and holds its replica idle after: the same bill as the raw one.
    groups = {group["group"]: group for group in recorded["groups"]}
    assert groups["queue"]["reserved_cost"] == pytest.approx(1.50)
    assert recorded["total_gpu_cost"] == pytest.approx(3.00)
    raw = document(bill(prometheus, prices_file, *covered(recorded), "--series", "raw", "--idle", "platform"))
    same_numbers(comparable(recorded), comparable(raw))


def test_a_label_changed_mid_range_bills_each_interval_to_the_team_of_its_instant(prometheus, prices_file):
    # A time-sliced A100 80GB at 3.00/h: x (6 GiB) and y (2 GiB) all hour, nothing reserved: x pays 3 × 6/8 = 2.25,
    # as team alpha at +10, +20, +30 min and beta at +40, +50, +60; y carries no team label: (none), 0.75.
    arguments = ["--by", TEAM, "--idle", "platform"]
    raw = document(bill(prometheus, prices_file, *window_args("relabelled"), *arguments))
    # In cents, alpha and beta tie for the last cent of 3.00, which goes to the first listed (equal totals are
    # listed by name).
    assert {group["group"]: group["total_cost"] for group in raw["groups"]} == pytest.approx(
        {"alpha": 1.13, "beta": 1.12, "(none)": 0.75}
    )
    # The rules join the label at each evaluation too: at their own instants x is alpha, then beta.
    recorded = document(bill(prometheus, prices_file, *window_args("relabelled", "recorded"), *arguments))
    teams = {group["group"]: group["total_cost"] for group in recorded["groups"]}
    assert teams["alpha"] > 0 and teams["beta"] > 0 and teams["alpha"] + teams["beta"] == pytest.approx(2.25)
    assert teams["(none)"] == pytest.approx(0.75)


def test_another_step_needs_the_raw_series(prometheus, prices_file):
    window = WINDOWS["exclusive"]
    arguments = ["--start", str(window.start), "--end", str(window.end), "--step", "5m"]
    refused = bill(prometheus, prices_file, *arguments, "--series", "recorded")
    assert refused.code == 2 and refused.stdout == ""
    assert "evaluate every 600 s: --step 300 s needs the raw series (--series raw)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert document(bill(prometheus, prices_file, *arguments))["range"]["series"] == "raw"  # auto
    without_step = ["--start", str(window.start), "--end", str(window.end)]
    assert document(bill(prometheus, prices_file, *without_step))["range"]["series"] == "recorded"  # auto


def test_a_label_the_rules_do_not_carry_needs_the_raw_series(prometheus, prices_file):
    arguments = [*window_args("timeslice", "recorded"), "--by", "label:app"]
    refused = bill(prometheus, prices_file, *arguments)
    assert refused.code == 2
    assert "do not carry pod label 'app' (label_app)" in refused.stderr
    assert "--rules --pod-label app" in refused.stderr
    auto = document(bill(prometheus, prices_file, *window_args("timeslice", "auto"), "--by", "label:app"))
    assert auto["range"]["series"] == "raw"
    assert {group["group"] for group in auto["groups"]} == {"trainer", "(none)"}
    missing = bill(prometheus, prices_file, *window_args("timeslice", "recorded"), "--by", "label:nobody")
    assert missing.code == 2 and "no gpu_fence_pod_labels series carries label_nobody" in missing.stderr


@pytest.mark.parametrize("series", ["recorded", "raw"])
def test_series_scraped_without_honor_labels_are_refused_from_either_series(prometheus, prices_file, series):
    result = bill(prometheus, prices_file, *window_args("renamed", series))
    assert result.code == 2 and result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "exported_namespace='ml'" in result.stderr and "honor_labels: true" in result.stderr


def test_an_unpriced_card_is_refused_from_the_rules_too(prometheus, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text('models:\n  "NVIDIA H100 80GB HBM3": 4.0\n', encoding="utf-8")
    result = run_chargeback(
        "--prometheus", prometheus.url, *window_args("overreach", "recorded"), "--prices", str(prices)
    )
    assert result.code == 2 and "no price for GPU model 'Tesla T4'" in result.stderr


def test_the_demo_has_no_recorded_series(tmp_path):
    result = run_chargeback("--demo", "--series", "recorded")
    assert result.code == 2 and "the demo fleet has no recording rules' series" in result.stderr
    assert document(run_chargeback("--demo", "--format", "json"))["range"]["series"] == "raw"


@pytest.mark.parametrize(
    ("evaluations", "expected"),
    [(6, (0, 1)), (720, (0, 1)), (721, (1, 2)), (8640, (0, 12)), (8641, (9, 13))],
)
def test_long_ranges_merge_evaluations_into_at_most_720_points(evaluations: int, expected: tuple[int, int]):
    head, merge = timeline_points(evaluations)
    assert (head, merge) == expected
    points = (1 if head else 0) + (evaluations - head) // merge
    assert points <= 720 and head + merge * (points - (1 if head else 0)) == evaluations


def test_the_timeline_sums_cards_per_price_and_selects_each_price_by_its_nodes_or_cards():
    # One price for every card: nothing to select.
    assert price_classes({("n1", "GPU-a"): 4.0, ("n2", "GPU-b"): 4.0}) == [(4.0, "")]
    # Whole nodes by name where all their cards cost the same; a node of mixed prices card by card; free cards
    # add nothing to the timeline and are left out.
    classes = price_classes(
        {
            ("spot-1", "GPU-s1"): 1.1,
            ("spot-2", "GPU-s2"): 1.1,
            ("mixed.example", "GPU-h"): 4.0,
            ("mixed.example", "GPU-t"): 1.1,
            ("lab", "GPU-f"): 0.0,
        }
    )
    assert classes == [
        (1.1, 'node=~"spot\\\\-1|spot\\\\-2"'),
        (1.1, 'node="mixed.example", card_uuid=~"GPU\\\\-t"'),
        (4.0, 'node="mixed.example", card_uuid=~"GPU\\\\-h"'),
    ]
    assert price_classes({("lab", "GPU-f"): 0.0}) == []


def test_a_long_range_sums_its_whole_hours_from_the_hourly_series(prometheus, prices_file):
    """Twelve scenarios back to back (35 hours, the rules' gap in "unrecorded" among them): the recorded bill sums
    the hours the second level recorded whole from its hourly sums, the rest (the edges, the hours around the gap)
    from the split's series and the evaluations the rules missed from the raw series, and is the raw bill at the
    rules' instants."""
    span = ["--start", str(WINDOWS["held-idle"].start), "--end", str(WINDOWS[DCGM_WINDOWS[-1]].end)]
    for method, idle in (("holder", "proportional"), ("usage", "platform")):
        options = ["--method", method, "--idle", idle]
        recorded = document(bill(prometheus, prices_file, *span, "--series", "recorded", *options))
        hours = recorded["range"]["hourly_sums"]
        # 35 hours less the edges and the three the gap touches (the rules missed half an hour): most of them.
        assert 25 <= hours <= 33, hours
        assert any("missing" in note for note in recorded["notes"])
        raw = document(bill(prometheus, prices_file, *covered(recorded), "--series", "raw", *options))
        assert raw["range"]["hourly_sums"] == 0
        same_numbers(comparable(recorded), comparable(raw))


def hourly_plan(evaluations: int, hours: list[float], interval: float = 300.0) -> Plan:
    """A plan of ``evaluations`` every ``interval`` from 1_800_000_000 + interval, all recorded, with hourly sums
    at ``hours`` (each standing for the hour that ends one interval before it)."""
    times = tuple(1_800_000_000 + interval * (index + 1) for index in range(evaluations))
    return Plan(interval, times, frozenset(range(evaluations)), tuple(hours))


def test_whole_hours_inside_the_range_are_summed_from_the_hourly_series_and_the_edges_from_the_split():
    # 5-minute evaluations from 00:05 to 10:00; hourly sums at 01:05 (the hour 00:00-01:00, at 00:05 .. 01:00),
    # 02:05, 03:05, then a gap (no sum at 04:05: an incomplete hour), then 05:05 .. 07:05; one at 11:05 is past the
    # range. The sum stands for (T - 5 min - 1 h, T - 5 min].
    base = 1_800_000_000
    plan = hourly_plan(120, [base + 3600 * k + 300 for k in (1, 2, 3, 5, 6, 7, 11)])
    parts = [(part.hourly, part.first, part.last, part.count) for part in plan.parts]
    assert parts == [
        (True, 0, 35, 3),  # 00:05 .. 03:00
        (False, 36, 47, 12),  # 03:05 .. 04:00, from the split's series
        (True, 48, 83, 3),  # 04:05 .. 07:00
        (False, 84, 119, 36),  # 07:05 .. 10:00
    ]
    assert plan.hourly_sums == 6 and plan.at == plan.last
    terms = over(plan, rules.GROUP_BOOKED, 'charge="usage"', "sum_over_time")
    hourly = rules.HOURLY[rules.GROUP_BOOKED][1]
    # A query per stretch, evaluated at the stretch's own end (the hourly sum's time, or its last evaluation).
    assert terms == [
        (f'sum_over_time({hourly}{{charge="usage"}}[10799999ms])', base + 3 * 3600 + 300),
        (f'sum_over_time({rules.GROUP_BOOKED}{{charge="usage"}}[3599999ms])', base + 4 * 3600),
        (f'sum_over_time({hourly}{{charge="usage"}}[10799999ms])', base + 7 * 3600 + 300),
        (f'sum_over_time({rules.GROUP_BOOKED}{{charge="usage"}}[10799999ms])', base + 10 * 3600),
    ]
    # A count is summed where the hours already counted it.
    assert over(plan, rules.CARD, "", "count_over_time")[0][0].startswith(
        f"sum_over_time({rules.HOURLY[rules.CARD][1]}["
    )
    # Without hourly sums, one query over every evaluation, as a bill has always asked.
    plain = hourly_plan(120, [])
    assert over(plain, rules.IDLE, 'method="holder"', "sum_over_time") == [
        (f'sum_over_time({rules.IDLE}{{method="holder"}}[35999999ms])', plain.last)
    ]


def test_the_longest_runs_of_hours_are_used_and_the_timeline_uses_hours_only_for_points_of_an_hour_or_more():
    base = 1_800_000_000
    # Eleven one-hour runs separated by gaps: the four longest (all one hour: the earliest four) are used.
    scattered = hourly_plan(24 * 12, [base + 3600 * k + 300 for k in range(1, 24, 2)])
    assert sum(part.hourly for part in scattered.parts) == 4
    # A month at 5 minutes: 8,640 evaluations make 720 points of 12 evaluations: an hour each, from the hourly sums
    # where they are (each point ending where its hour ends), from the split's series elsewhere.
    month = hourly_plan(8640, [base + 3600 * k + 300 for k in range(2, 720)])
    sets = month.timeline_sets()
    assert [(part.hourly, len(ends), size) for part, ends, size in sets] == [
        (False, 1, 12),
        (True, 718, 1),
        (False, 1, 12),
    ]
    assert sum(len(ends) for _part, ends, _size in sets) == 720
    # the two checks over the whole range, the eleven sums per stretch (three stretches), the three range queries
    assert month.queries == 2 + 11 * 3 + 3
    # Three days: points of two evaluations, shorter than an hour: the split's series, the hours' stretch included.
    days = hourly_plan(864, [base + 3600 * k + 300 for k in range(1, 73)])
    assert all(not part.hourly and size == 2 for part, _ends, size in days.timeline_sets())
    assert days.hourly_sums == 72 and [part.hourly for part in days.parts] == [True]
