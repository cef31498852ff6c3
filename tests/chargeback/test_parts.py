"""Unit tests of the small parts: times, price lookup, label sanitising, series alignment, renderers."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_fence.chargeback.bill import GroupCost, IdlePolicy
from gpu_fence.chargeback.errors import ChargebackError
from gpu_fence.chargeback.html import render_html
from gpu_fence.chargeback.ledger import compute_bill
from gpu_fence.chargeback.prices import Prices, prices_from_mapping
from gpu_fence.chargeback.prometheus import Series
from gpu_fence.chargeback.raw import RawNotes, intervals_from_series, pod_groups
from gpu_fence.chargeback.render import render_json, render_markdown, render_table
from gpu_fence.chargeback.samples import ContainerRef
from gpu_fence.chargeback.times import parse_duration, parse_time
from gpu_fence.metric_names import label_name
from tests.fakes.chargeback_scenarios import made, validate_bill

NOW = 1_800_000_000.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("now", NOW),
        ("-7d", NOW - 7 * 86400),
        ("-1h30m", NOW - 5400),
        ("-90s", NOW - 90),
        ("1700000000", 1_700_000_000),
        ("1700000000.5", 1_700_000_000.5),
        ("2026-01-31T00:00:00Z", 1_769_817_600),
        ("2026-01-31T01:00:00+01:00", 1_769_817_600),
    ],
)
def test_parse_time(text: str, expected: float):
    assert parse_time(text, NOW, "--start") == expected


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("5m", 300), ("1h30m", 5400), ("2.5m", 150), ("1w", 604800)])
def test_parse_duration(text: str, seconds: float):
    assert parse_duration(text) == seconds


@given(st.text(max_size=20))
def test_time_parser_never_crashes(text: str):
    try:
        parse_time(text, NOW, "--start")
    except ChargebackError as error:
        assert "--start" in str(error)


def test_price_lookup_order():
    prices = prices_from_mapping(
        {
            "default": 1.0,
            "models": {"NVIDIA A100-SXM4-40GB": 3.0},
            "nodes": {"gpu-spot-*": 0.5, "gpu-spot-special": 9.0},
        }
    )
    assert prices.per_hour("gpu-spot-special", "NVIDIA A100-SXM4-40GB") == 9.0  # exact node beats a pattern
    assert prices.per_hour("gpu-spot-3", "NVIDIA A100-SXM4-40GB") == 0.5  # node pattern beats model
    assert prices.per_hour("gpu-1", "NVIDIA A100-SXM4-40GB") == 3.0
    assert prices.per_hour("gpu-1", "NVIDIA A100-SXM4-40GB MIG 3g.20gb") == 3.0  # a slice priced as its card
    assert prices.per_hour("gpu-1", "Tesla T4") == 1.0
    assert Prices(models=(("x", 1.0),)).per_hour("n", "y") is None


@pytest.mark.parametrize("key", ["team", "app.kubernetes.io/part-of", "example.com/cost-center", "a-b_c.d"])
def test_label_names_are_the_exporters_own(key: str):
    """--by label:KEY must find the label under exactly the name the auditor exports --pod-label KEY as."""
    from prometheus_client.parser import text_string_to_metric_families

    from gpu_fence.auditor.audit import audit
    from gpu_fence.auditor.metrics import AuditorMetrics
    from gpu_fence.auditor.model import Container, NodeSnapshot

    pod = Container("ml", "train", "main", "uid-1", "c1", labels=((key, "vision"),))
    snapshot = NodeSnapshot("n", 0.0, (), (pod,), ())
    metrics = AuditorMetrics("n", [key])
    metrics.observe(snapshot, audit(snapshot), 0.01)
    (exported,) = (
        sample.labels
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
        if sample.name == "gpu_fence_pod_labels"
    )
    assert exported[label_name(key)] == "vision"


def test_label_names_are_sanitised_like_prometheus():
    assert label_name("team") == "label_team"
    assert label_name("app.kubernetes.io/part-of") == "label_app_kubernetes_io_part_of"


def test_pod_groups_are_the_label_at_each_instant():
    series = [
        Series({"namespace": "n", "pod": "p", "label_team": "old"}, ((10.0, 1.0), (20.0, 1.0))),
        Series({"namespace": "n", "pod": "p", "label_team": "new"}, ((20.0, 1.0), (30.0, 1.0))),
        Series({"namespace": "n", "pod": "q"}, ((20.0, 1.0),)),
    ]
    # At 20 s both series are within the lookback (the label just changed): the greater value, whatever the order.
    expected = {(10_000, "n", "p"): "old", (20_000, "n", "p"): "old", (30_000, "n", "p"): "new"}
    assert pod_groups(series, "label_team") == expected
    assert pod_groups(series[::-1], "label_team") == expected


def one_minute_intervals(instants: list[float], *, group_of=None, notes=None, **series: list[Series]):
    """``intervals_from_series`` at a 60 s step, every series list empty but those given, grouped by namespace."""
    lists = {"info": [], "share": [], "memory": [], "allocated": [], "unattributed": [], **series}
    group_of = group_of or (lambda namespace, pod, instant: namespace)
    return intervals_from_series(instants, 60.0, group_of=group_of, notes=notes, **lists)


def test_series_align_on_instants_and_mig_without_share_is_noted():
    info = [
        Series({"node": "n", "gpu_uuid": "GPU-1", "model": "m"}, ((60.0, 1.0), (120.0, 1.0))),
        Series({"node": "n", "gpu_uuid": "MIG-1", "parent_uuid": "GPU-1", "model": "m"}, ((60.0, 1.0),)),
    ]
    memory = [
        Series(
            {"node": "n", "gpu_uuid": "GPU-1", "namespace": "a", "pod": "p", "container": "c", "allocated": "false"},
            ((120.0, 5.0), (120.0, float("nan"))),
        ),
    ]
    notes = RawNotes()
    intervals = one_minute_intervals(
        [60.0, 120.0],
        info=info,
        memory=memory,
        group_of=lambda namespace, pod, instant: f"{namespace}!{instant}",
        notes=notes,
    )
    assert [interval.end for interval in intervals] == [60.0, 120.0]
    assert [device.uuid for device in intervals[0].devices] == ["GPU-1"]  # the MIG device has no share ratio
    assert intervals[0].memory == ()
    assert intervals[1].memory[0].owner == ContainerRef("a", "p", "c", "a!120000")  # the group at that instant
    assert intervals[1].memory[0].allocated is False
    assert "MIG-1" in notes.notes()[0]


def hostile_bill():
    group = GroupCost(group="<script>alert(1)</script>", usage=1.0, request=2.0)
    bill = compute_bill([], lambda node, model: 1.0, IdlePolicy.PLATFORM)
    return dataclasses.replace(bill, groups=(group,), total_gpu_cost=1.0)


def test_html_escapes_names_and_loads_nothing():
    provenance = made(group_by="label:team")
    page = render_html(hostile_bill(), provenance)
    assert "<script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    # The Prometheus URL is printed as the bill's source, as text; nothing else names a URL, and nothing links one.
    assert f'<td class="text" data-key="value">{provenance.source}</td>' in page
    text = page.replace('xmlns="http://www.w3.org/2000/svg"', "").replace(provenance.source, "")
    assert "http://" not in text
    assert "https://" not in text
    assert "href=" not in page and "src=" not in page


def test_text_renderers_agree():
    bill = hostile_bill()
    document = validate_bill(json.loads(render_json(bill, made())))
    assert document["groups"][0]["difference"] == -1.0
    assert "-1.00" in render_table(bill, made())
    assert "| **TOTAL** |" in render_markdown(bill, made())


def test_series_renamed_by_a_scrape_without_honor_labels_are_refused():
    renamed = Series(
        {
            "node": "n",
            "gpu_uuid": "GPU-1",
            "namespace": "gpu-fence",
            "pod": "gpu-fence-auditor-1",
            "container": "auditor",
            "exported_namespace": "ml",
        },
        ((60.0, 1.0),),
    )
    for field in ("memory", "allocated"):
        with pytest.raises(ChargebackError, match=r"exported_namespace='ml'.*honor_labels: true"):
            one_minute_intervals([60.0], **{field: [renamed]})


def hour_bill():
    """One card used by namespace a for one hour, billed in six 10-minute intervals from 1_800_000_000."""
    from gpu_fence.chargeback.samples import Device, Interval, Memory

    start, step = 1_800_000_000.0, 600.0
    a = ContainerRef("a", "p", "c", "a")
    intervals = [
        Interval(
            end=start + step * k,
            seconds=step,
            devices=(Device("n", "GPU-1", "", "T4"),),
            memory=(Memory("n", "GPU-1", a, True, 1 << 30),),
        )
        for k in range(1, 7)
    ]
    return compute_bill(intervals, lambda node, model: 1.0, IdlePolicy.PLATFORM)


def test_html_time_axis_and_bar_titles_span_the_range():
    import itertools
    import re

    from gpu_fence.chargeback.times import iso

    page = render_html(hour_bill(), made(step=600))
    timeline = page[page.index('<svg id="timeline"') : page.index("</svg>")]
    # The hour from 08:00 UTC on 15 Jan 2027: round ticks every 10 minutes inside it, each at its instant.
    ticks = re.findall(r'<text class="time-tick" x="([^"]+)"[^>]*data-time="([^"]+)">([^<]+)</text>', timeline)
    assert [label for _x, _time, label in ticks] == ["08:10", "08:20", "08:30", "08:40", "08:50"]
    assert [time for _x, time, _label in ticks] == [iso(1_800_000_000 + 600 * k) for k in range(1, 6)]
    gaps = [float(b[0]) - float(a[0]) for a, b in itertools.pairwise(ticks)]
    assert min(gaps) > 0 and max(gaps) - min(gaps) < 0.2  # evenly spaced, to the tenth of a pixel the SVG keeps
    titles = re.findall(r"<title>a: [^,]+, ([^<]+)</title>", timeline)
    # Each bar covers the 10 minutes before its instant, said in words.
    assert titles[0] == "15 Jan 2027, 08:00–08:10 UTC"
    assert titles[-1] == "15 Jan 2027, 08:50–09:00 UTC"


def test_html_tables_and_charts_are_labelled_for_screen_readers():
    import re

    page = render_html(hostile_bill(), made())
    for table in re.findall(r"<table.*?</table>", page, flags=re.S):
        assert "<caption>" in table
        head = table[table.index("<thead>") : table.index("</thead>")]
        assert len(re.findall(r"<th[ >]", head)) == head.count('<th scope="col"') > 0
        for row in re.findall(r"<tbody>.*?</tbody>", table, flags=re.S)[0].split("<tr")[1:]:
            assert re.match(r'[^>]*><th scope="row"', row), row  # the group name heads its row
    for svg in re.findall(r"<svg.*?</svg>", page, flags=re.S):
        assert re.match(r'<svg[^>]*role="img"[^>]*>\s*<title>[^<]+</title>', svg)


def test_memory_of_unknown_entitlement_is_billed_as_its_containers_usage_not_as_overreach():
    """allocated="unknown" (beside a DRA device that could not be resolved): overreach is not known, so the bill
    does not price it as overreach; the container's memory is still its usage."""
    labels = {"node": "n", "gpu_uuid": "GPU-1", "namespace": "a", "pod": "p", "container": "c"}
    memory = [
        Series({**labels, "allocated": "unknown"}, ((60.0, 5.0),)),
        Series({**labels, "container": "d", "allocated": "false"}, ((60.0, 7.0),)),
    ]
    info = [Series({"node": "n", "gpu_uuid": "GPU-1", "model": "m"}, ((60.0, 1.0),))]
    intervals = one_minute_intervals([60.0], info=info, memory=memory)
    assert {(m.owner.container, m.allocated) for m in intervals[0].memory} == {("c", True), ("d", False)}


def test_a_bill_runs_without_the_cyclic_collector_and_leaves_it_as_it_was():
    import gc

    from gpu_fence.chargeback.cli import paused_collector

    assert gc.isenabled()
    with pytest.raises(ChargebackError), paused_collector():
        assert not gc.isenabled()
        raise ChargebackError("a bill that fails")
    assert gc.isenabled()
    gc.disable()
    try:
        with paused_collector():
            assert not gc.isenabled()
        assert not gc.isenabled()  # off before, off after
    finally:
        gc.enable()
