"""``chargeback --compare-device-metrics``: dcgm-exporter's series in a real Prometheus, billed two device-metric
ways beside gpu-fence's bill; every figure worked out by hand (scenarios in ``tests.fakes.chargeback_scenarios``,
``dcgm_scenarios``). Each window is one hour, billed as six 10-minute intervals."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence

import pytest

from gpu_fence.chargeback.comparison import DeviceMetricBill
from gpu_fence.chargeback.devicemetrics import device_metric_bill, device_query
from gpu_fence.chargeback.errors import ChargebackError
from gpu_fence.chargeback.prometheus import Series
from tests.fakes.chargeback_scenarios import run_chargeback, window_args

COMPARE = "--compare-device-metrics"


def compared(prometheus, prices_file, window: str, series: str = "raw") -> dict:
    result = run_chargeback(
        "--prometheus",
        prometheus.url,
        *window_args(window, series),
        "--prices",
        str(prices_file),
        "--format",
        "json",
        COMPARE,
    )
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)["device_metrics"]


def by_group(comparison: dict) -> dict[str, tuple[float, float, float]]:
    return {
        g["group"]: (g["gpu_fence_cost"], g["device_hours_cost"], g["utilisation_cost"]) for g in comparison["groups"]
    }


@pytest.mark.e2e
def test_virtual_gpu_mode_bills_a_time_sliced_card_three_times_and_this_bill_once(prometheus, prices_file):
    """--kubernetes-virtual-gpus, 4.5.3-4.8.2 on: three pods on one A100 80GB at 3.00/h each get a series of the
    card, so billing a pod the device it is labelled on charges 3 x 3.00; this bill splits the card by memory."""
    comparison = compared(prometheus, prices_file, "dcgm-virtual")
    groups = by_group(comparison)
    # ml: a and b, 2 x 3.00 by device-hours; (50 + 10) % of 3.00 by utilisation (per-process SM values, summed).
    assert groups["ml"] == pytest.approx((2.00, 6.00, 1.80))
    assert groups["research"] == pytest.approx((1.00, 3.00, 0.90))
    totals = comparison["totals"]
    assert totals["real_cost"] == pytest.approx(3.00)
    assert totals["gpu_fence_cost"] == pytest.approx(3.00)  # adds up to the card
    assert totals["device_hours_cost"] == pytest.approx(9.00)  # 3x the card
    # The per-process GPU_UTIL of 4.5.3-4.8.2 adds up to the device's own 90 %: 0.9x the card, not 3x.
    assert totals["utilisation_cost"] == pytest.approx(2.70)
    assert comparison["other_cost"] == pytest.approx(0.0) and comparison["notes"] == []


@pytest.mark.e2e
def test_the_comparison_beside_a_bill_from_the_recording_rules_is_the_same(prometheus, prices_file):
    """The recording rules evaluate at their own phase: that bill's instants are the rules', and the comparison
    reads dcgm-exporter's series at those instants, for the same figures on a window constant all hour."""
    recorded = compared(prometheus, prices_file, "dcgm-virtual", "recorded")
    raw = by_group(compared(prometheus, prices_file, "dcgm-virtual"))
    assert {group: pytest.approx(figures) for group, figures in by_group(recorded).items()} == raw
    assert recorded["totals"]["device_hours_cost"] == pytest.approx(9.00)


@pytest.mark.e2e
def test_virtual_gpu_mode_before_per_process_values_copies_utilisation_too(prometheus, prices_file):
    """Before 4.5.3-4.8.2 virtual mode copied FB_USED and GPU_UTIL to every sharing pod, with the device's value."""
    comparison = compared(prometheus, prices_file, "dcgm-virtual-copies")
    groups = by_group(comparison)
    assert groups["ml"] == pytest.approx((2.00, 6.00, 2 * 0.9 * 3.00))
    assert groups["research"] == pytest.approx((1.00, 3.00, 0.9 * 3.00))
    assert comparison["totals"]["device_hours_cost"] == pytest.approx(9.00)
    assert comparison["totals"]["utilisation_cost"] == pytest.approx(8.10)  # 2.7x the card at 90 %


@pytest.mark.e2e
def test_default_mode_bills_the_card_once_to_whichever_pod_the_exporter_mapped_last(prometheus, prices_file):
    """Without virtual-GPU mode each series carries one pod (the last replica's): the sum is the card, on the wrong
    group: research pays all of it, ml, which holds two thirds of the memory, nothing."""
    comparison = compared(prometheus, prices_file, "dcgm-default")
    groups = by_group(comparison)
    assert groups["research"] == pytest.approx((1.00, 3.00, 2.70))
    assert groups["ml"] == pytest.approx((2.00, 0.00, 0.00))
    assert comparison["totals"]["device_hours_cost"] == pytest.approx(3.00)


@pytest.mark.e2e
def test_mps_clients_pay_the_card_twice_by_device_hours_and_nothing_by_utilisation(prometheus, prices_file):
    """An H100 (4.00/h) shared by MPS between two pods, labelled "hostname" as after dcgm-exporter d5e5f51: each
    pod pays the whole card by device-hours (8.00); the driver's per-process samples name the MPS server, not the
    clients, so their SM values are 0 on a busy card and utilisation bills nothing."""
    comparison = compared(prometheus, prices_file, "dcgm-mps")
    groups = by_group(comparison)
    assert groups["train"] == pytest.approx((4.00 * 20 / 30, 4.00, 0.00))
    assert groups["infer"] == pytest.approx((4.00 * 10 / 30, 4.00, 0.00))
    assert comparison["totals"]["real_cost"] == pytest.approx(4.00)
    assert comparison["totals"]["device_hours_cost"] == pytest.approx(8.00)
    assert comparison["totals"]["utilisation_cost"] == pytest.approx(0.00)


@pytest.mark.e2e
def test_mig_instances_are_billed_by_their_share_and_utilisation_is_absent(prometheus, prices_file):
    """One series per GPU instance with its holder (--use-old-namespace labels): device-hours charge each holder
    its instance's share of the A100 40GB (3/7 and 2/7 of 7.00/h), which is what this bill's holder method does;
    dcgm-exporter has no GPU_UTIL there, and the comparison says so."""
    comparison = compared(prometheus, prices_file, "dcgm-mig")
    groups = by_group(comparison)
    assert groups["vision"] == pytest.approx((3.00, 3.00, 0.00))
    assert groups["nlp"] == pytest.approx((4.00, 4.00, 0.00))
    assert comparison["totals"]["device_hours_cost"] == pytest.approx(7.00)
    [note] = comparison["notes"]
    assert "does not support DCGM_FI_DEV_GPU_UTIL for MIG instances" in note


@pytest.mark.e2e
def test_every_text_format_shows_the_comparison_beside_the_bill(prometheus, prices_file):
    common = ["--prometheus", prometheus.url, *window_args("dcgm-virtual"), "--prices", str(prices_file), COMPARE]
    table = run_chargeback(*common).stdout
    assert "Device metrics (dcgm-exporter's per-pod series) against this bill, not billed:" in table
    assert "this bill adds up to 1.00x that, device-hours to 3.00x, utilisation to 0.90x" in table
    markdown = run_chargeback(*common, "--format", "markdown").stdout
    assert "| ml | 2.00 | 6.00 | 1.80 |" in markdown and "| TOTAL | 3.00 | 9.00 | 2.70 |" in markdown
    page = run_chargeback(*common, "--format", "html").stdout
    assert '<table id="device-metrics">' in page and "device-hours to 3.00x" in page
    rows = list(csv.DictReader(io.StringIO(run_chargeback(*common, "--format", "csv").stdout)))
    [total] = [row for row in rows if row["kind"] == "device-metrics-total"]
    assert float(total["device_hours_cost"]) == pytest.approx(9.0) and float(total["real_cost"]) == pytest.approx(3)
    assert {row["group"] for row in rows if row["kind"] == "device-metrics"} == {
        "ml",
        "research",
        "(unattributed, platform)",
    }
    # without the option nothing changes: no comparison anywhere
    plain = run_chargeback(*common[:-1], "--format", "json").stdout
    assert "device_metrics" not in json.loads(plain)


@pytest.mark.e2e
def test_no_dcgm_exporter_series_in_the_range_is_one_line_and_exit_2(prometheus, prices_file):
    result = run_chargeback(
        "--prometheus", prometheus.url, *window_args("exclusive"), "--prices", str(prices_file), COMPARE
    )
    assert result.code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert "--compare-device-metrics: no DCGM_FI_DEV_FB_USED series at" in result.stderr
    assert "check that this Prometheus scrapes dcgm-exporter" in result.stderr


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--demo"], "the demo fleet has none"),
        (
            ["--prometheus", "http://127.0.0.1:1", "--start", "-1h", "--price-per-gpu-hour", "1", "--format", "focus"],
            "FOCUS rows are charges",
        ),
    ],
)
def test_the_comparison_refuses_what_it_cannot_go_with(extra: list[str], message: str):
    result = run_chargeback(*extra, COMPARE)
    assert result.code == 2 and message in result.stderr and result.stdout == ""


# --- the pure part, on hand-made series --------------------------------------------------------------------------

A100 = "NVIDIA A100-SXM4-80GB"


def series(value: float, *instants: float, **labels: str) -> Series:
    return Series({"Hostname": "n", "UUID": "GPU-1", "modelName": A100, **labels}, tuple((t, value) for t in instants))


def compare(
    fb_used: Sequence[Series], gpu_util: Sequence[Series] = (), prices: dict[str, float] | None = None
) -> DeviceMetricBill:
    return device_metric_bill(
        [60.0, 120.0],
        60.0,
        fb_used=fb_used,
        gpu_util=gpu_util,
        price_of=lambda node, model: ({A100: 3600.0} if prices is None else prices).get(model),  # 1.00 per second
        group_of=lambda namespace, pod, key: namespace,
        gpu_fence={"ml": 100.0},
        gpu_fence_rest=20.0,
        real_cost=120.0,
    )


def test_a_pod_counts_once_per_device_and_instant_however_many_containers_and_replicas():
    found = compare(
        [
            series(1, 60, 120, namespace="ml", pod="a", container="x", vgpu="0"),
            series(2, 60, 120, namespace="ml", pod="a", container="y", vgpu="1"),
            series(3, 60, namespace="ml", pod="b"),
        ]
    )
    [ml] = found.groups
    assert ml.device_hours == pytest.approx(60 + 60 + 60)  # a at both instants, b at one; a second each
    assert found.device_hours_total == pytest.approx(180) and found.gpu_fence_total == pytest.approx(120)


def test_the_workloads_exported_labels_win_over_the_exporters_own_and_old_names_are_read():
    found = compare(
        [
            # scraped without honor_labels: namespace/pod are dcgm-exporter's own pod, exported_* the workload's
            series(
                1, 60, namespace="gpu-operator", pod="nvidia-dcgm-exporter-x", exported_namespace="ml", exported_pod="a"
            ),
            series(1, 60, pod_namespace="lab", pod_name="b", uuid="GPU-2"),
        ]
    )
    groups = {group.group: group.device_hours for group in found.groups}
    assert groups == {"ml": pytest.approx(60), "lab": pytest.approx(60)}


def test_series_without_a_pod_or_off_the_instants_or_not_a_number_bill_nothing():
    found = compare(
        [series(1, 60, 120), series(1, 90, namespace="ml", pod="a"), series(float("nan"), 60, namespace="ml", pod="b")]
    )
    assert found.device_hours_total == 0 and found.notes == ()
    [note] = compare([series(1, 60, 120)]).notes  # no series at all names a pod: says why both bills are empty
    assert "no DCGM_FI_DEV_FB_USED series carries a pod label" in note


def test_utilisation_is_capped_at_the_device_and_mig_shares_follow_the_profile():
    found = compare(
        [series(1, 60, namespace="ml", pod="a", GPU_I_PROFILE="3g.40gb", GPU_I_ID="2")],
        [series(250, 60, namespace="ml", pod="b")],
    )
    [ml] = found.groups
    assert ml.device_hours == pytest.approx(60 * 3 / 7)
    assert ml.utilisation == pytest.approx(60)  # 250 % is read as the whole device, never more
    a30 = compare(
        [series(1, 60, namespace="ml", pod="a", GPU_I_PROFILE="2g.12gb", GPU_I_ID="1", modelName="NVIDIA A30")],
        prices={"NVIDIA A30": 3600.0},
    )
    assert a30.device_hours_total == pytest.approx(60 * 2 / 4)  # the A30 has four compute slices


def test_an_unknown_profile_is_a_note_and_an_unpriced_device_an_error():
    found = compare([series(1, 60, namespace="ml", pod="a", GPU_I_PROFILE="weird", GPU_I_ID="1")])
    assert found.device_hours_total == 0
    assert any("MIG profile(s) weird name no compute slices" in note for note in found.notes)
    with pytest.raises(ChargebackError, match="no price for dcgm-exporter's GPU model 'NVIDIA A100-SXM4-80GB'"):
        compare([series(1, 60, namespace="ml", pod="a")], prices={})


def test_the_query_keeps_every_label_the_methods_read():
    query = device_query("DCGM_FI_DEV_FB_USED")
    for label in ("Hostname", "hostname", "UUID", "uuid", "GPU_I_ID", "GPU_I_PROFILE", "modelName", "pod_name"):
        assert label in query
    assert query.endswith("(DCGM_FI_DEV_FB_USED)") and "container" not in query and "vgpu" not in query
