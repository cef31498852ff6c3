"""``chargeback`` against a real Prometheus holding backfilled series; every expected figure worked out by hand.

Scenarios and prices are in ``conftest.py``. Each window is one hour, billed as six 10-minute intervals.
"""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.chargeback_scenarios import run_chargeback, window_args

pytestmark = pytest.mark.e2e


def bill(prometheus, prices_file, window: str, *extra: str) -> dict:
    result = run_chargeback(
        "--prometheus", prometheus.url, *window_args(window), "--prices", str(prices_file), "--format", "json", *extra
    )
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def groups(document: dict) -> dict[str, dict]:
    return {group["group"]: group for group in document["groups"]}


def test_exclusive_gpus_platform_idle(prometheus, prices_file):
    document = bill(prometheus, prices_file, "exclusive", "--idle", "platform")
    by = groups(document)
    # Two H100 at 4.00/h for 1 h: 8.00 in all.
    assert document["total_gpu_cost"] == pytest.approx(8.00)
    assert document["currency"] == "EUR"
    # team-a alone on GPU-e1 all hour: 4.00/h × 1 h = 4.00; requested 1 GPU × 1 h × 4.00 = 4.00.
    assert by["team-a"]["usage_cost"] == pytest.approx(4.00)
    assert by["team-a"]["request_cost"] == pytest.approx(4.00)
    assert by["team-a"]["difference"] == pytest.approx(0.00)
    assert by["team-a"]["memory_gib_hours"] == pytest.approx(40.0)  # 40 GiB × 1 h
    # team-b on GPU-e2 for 3 of 6 intervals: 4.00 × 0.5 h = 2.00; the other half hour (2.00) is idle → platform.
    assert by["team-b"]["usage_cost"] == pytest.approx(2.00)
    assert by["team-b"]["idle_cost"] == pytest.approx(0.00)
    assert by["team-b"]["request_cost"] == pytest.approx(4.00)
    assert by["team-b"]["difference"] == pytest.approx(2.00 - 4.00)
    assert by["team-b"]["memory_gib_hours"] == pytest.approx(10 * 0.5)
    assert document["platform"]["cost"] == pytest.approx(2.00)


def test_exclusive_gpus_proportional_idle(prometheus, prices_file):
    by = groups(document := bill(prometheus, prices_file, "exclusive", "--idle", "proportional"))
    # GPU-e2's idle half hour (2.00) goes to its only user, team-b: 2.00 + 2.00 = 4.00; nothing left to platform.
    assert by["team-b"]["usage_cost"] == pytest.approx(2.00)
    assert by["team-b"]["idle_cost"] == pytest.approx(2.00)
    assert by["team-b"]["total_cost"] == pytest.approx(4.00)
    assert by["team-a"]["idle_cost"] == pytest.approx(0.00)  # GPU-e1 was never idle
    assert document["platform"]["cost"] == pytest.approx(0.00)
    assert document["total_gpu_cost"] == pytest.approx(8.00)


def test_time_slicing_splits_by_unequal_memory(prometheus, prices_file):
    document = bill(prometheus, prices_file, "timeslice")
    by = groups(document)
    # One A100 80GB at 3.00/h for 1 h = 3.00, shared 6 : 2 : 4 GiB (12 GiB in use every interval).
    # ml = a + b = 3.00 × 6/12 + 3.00 × 2/12 = 1.50 + 0.50 = 2.00; research = 3.00 × 4/12 = 1.00.
    assert by["ml"]["usage_cost"] == pytest.approx(2.00)
    assert by["research"]["usage_cost"] == pytest.approx(1.00)
    # Requests: each replica is billed as a whole GPU-hour at 3.00: ml holds 2 → 6.00, research 1 → 3.00,
    # 9.00 in all for a card that cost 3.00.
    assert by["ml"]["request_cost"] == pytest.approx(6.00)
    assert by["research"]["request_cost"] == pytest.approx(3.00)
    assert by["ml"]["difference"] == pytest.approx(2.00 - 6.00)
    assert document["platform"]["cost"] == pytest.approx(0.0)


def test_group_by_sanitised_pod_label(prometheus, prices_file):
    document = bill(prometheus, prices_file, "timeslice", "--by", "label:example.com/team")
    by = groups(document)
    # label "example.com/team" is exported as label_example_com_team; a → alpha, b → beta, c has none.
    assert by["alpha"]["usage_cost"] == pytest.approx(3.00 * 6 / 12)  # 1.50
    assert by["beta"]["usage_cost"] == pytest.approx(3.00 * 2 / 12)  # 0.50
    assert by["(none)"]["usage_cost"] == pytest.approx(3.00 * 4 / 12)  # 1.00
    assert document["group_by"] == "label:example.com/team"


def test_mig_card_split_3_2_2(prometheus, prices_file):
    platform = bill(prometheus, prices_file, "mig", "--idle", "platform")
    by = groups(platform)
    # A100 40GB at 7.00/h; slices cost 3/7 × 7.00 = 3.00/h and 2/7 × 7.00 = 2.00/h each.
    assert platform["total_gpu_cost"] == pytest.approx(7.00)
    assert by["vision"]["usage_cost"] == pytest.approx(3.00)  # 3g slice, used all hour
    # nlp: 2g slice all hour (2.00) + the other 2g slice for half an hour (1.00) = 3.00.
    assert by["nlp"]["usage_cost"] == pytest.approx(3.00)
    assert platform["platform"]["cost"] == pytest.approx(1.00)  # the idle half hour of MIG-m2b
    # Requests: vision 3/7 × 7.00 × 1 h = 3.00; nlp two 2g slices = 2 × 2.00 = 4.00.
    assert by["vision"]["request_cost"] == pytest.approx(3.00)
    assert by["nlp"]["request_cost"] == pytest.approx(4.00)
    assert by["vision"]["requested_gpu_hours"] == pytest.approx(3 / 7)

    spread = groups(document := bill(prometheus, prices_file, "mig", "--idle", "proportional"))
    # The card's 1.00 idle is spread over its users in proportion to their charges on it, 3.00 : 3.00.
    assert spread["vision"]["total_cost"] == pytest.approx(3.50)
    assert spread["nlp"]["total_cost"] == pytest.approx(3.50)
    assert document["platform"]["cost"] == pytest.approx(0.0)


def test_overreach_unattributed_and_unused_card(prometheus, prices_file):
    for policy in ("platform", "proportional"):
        document = bill(prometheus, prices_file, "overreach", "--idle", policy)
        by = groups(document)
        # GPU-o: Tesla T4 has no model price → default 2.50/h; 8 GiB in use: legit 3, miner 1, host 4.
        # GPU-idle: node cheap-7 matches "cheap-*" → 1.00/h, never used → platform under both policies.
        assert document["total_gpu_cost"] == pytest.approx(2.50 + 1.00)
        assert by["batch"]["usage_cost"] == pytest.approx(2.50 * 3 / 8)  # 0.9375
        assert by["batch"]["total_cost"] == pytest.approx(0.9375)
        # The miner's memory share is priced (2.50 × 1/8 = 0.3125) but stays out of every group's total.
        assert by["sneaky"]["overreach_cost"] == pytest.approx(0.3125)
        assert by["sneaky"]["total_cost"] == pytest.approx(0.0)
        assert by["sneaky"]["request_cost"] == pytest.approx(0.0)
        assert document["overreach"] == [
            {
                "namespace": "sneaky",
                "pod": "miner",
                "container": "main",
                "group": "sneaky",
                "node": "over",
                "gpu_uuid": "GPU-o",
                "memory_gib_hours": pytest.approx(1.0),
                "cost": pytest.approx(0.3125),
            }
        ]
        assert document["unattributed"]["cost"] == pytest.approx(2.50 * 4 / 8)  # 1.25
        assert document["unattributed"]["memory_gib_hours"] == pytest.approx(4.0)
        assert document["platform"]["cost"] == pytest.approx(1.00)


def test_table_csv_and_markdown_show_the_same_bill(prometheus, prices_file):
    common = ["--prometheus", prometheus.url, *window_args("overreach"), "--prices", str(prices_file)]
    table = run_chargeback(*common, "--format", "table")
    assert table.code == 0, table.stderr
    assert "sneaky/miner/main on over GPU-o" in table.stdout
    assert "GPU cost of the range: 3.50 EUR" in table.stdout
    rows = list(csv.DictReader(io.StringIO(run_chargeback(*common, "--format", "csv").stdout)))
    by = {row["group"]: row for row in rows}
    assert float(by["batch"]["usage_cost"]) == pytest.approx(0.9375)
    assert float(by["(unattributed)"]["total_cost"]) == pytest.approx(1.25)
    assert float(by["TOTAL"]["total_cost"]) == pytest.approx(3.50 - 0.3125)  # billed, overreach apart
    assert float(by["TOTAL"]["overreach_cost"]) == pytest.approx(0.3125)
    markdown = run_chargeback(*common, "--format", "markdown").stdout
    assert "| batch |" in markdown and "| sneaky | miner | main | over | GPU-o |" in markdown


def test_flat_price_and_relative_times_and_output_file(prometheus, tmp_path):
    window = window_args("exclusive")
    output = tmp_path / "bill.json"
    result = run_chargeback(
        "--prometheus",
        prometheus.url,
        *window,
        "--price-per-gpu-hour",
        "1.5",
        "--format",
        "json",
        "--output",
        str(output),
    )
    assert result.code == 0 and result.stdout == ""
    document = json.loads(output.read_text())
    assert document["total_gpu_cost"] == pytest.approx(2 * 1.5)  # two cards × 1 h × 1.50
    assert document["currency"] == "USD"


def test_step_with_sub_millisecond_digits_keeps_every_sample(prometheus):
    # Prometheus counts time in milliseconds: a step of 600.0004 s is evaluated as 600 s, and every instant must
    # still find its samples (they used to be dropped from the second instant on, billing a fraction of the hour).
    window = window_args("exclusive")[:4]
    result = run_chargeback(
        "--prometheus", prometheus.url, *window, "--step", "600.0004", "--price-per-gpu-hour", "1", "--format", "json"
    )
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["range"]["step_seconds"] == 600
    assert document["total_gpu_cost"] == pytest.approx(2 * 1.0)  # two cards × 1 h × 1.00
    assert groups(document)["team-a"]["usage_cost"] == pytest.approx(1.0)


def test_console_script(prometheus, prices_file):
    """The installed entry point, as an operator runs it (``--start -30d`` style values reach the subcommand)."""
    script = Path(sys.executable).with_name("gpu-fence-auditor")
    done = subprocess.run(
        [
            str(script),
            "chargeback",
            "--prometheus",
            prometheus.url,
            *window_args("timeslice"),
            "--prices",
            str(prices_file),
            "--format",
            "csv",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(done.stdout))}
    assert float(rows["ml"]["usage_cost"]) == pytest.approx(2.00)
    relative = subprocess.run(
        [
            str(script),
            "chargeback",
            "--prometheus",
            prometheus.url,
            "--start",
            "-30d",
            "--end",
            "-29d",
            "--price-per-gpu-hour",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # Parsed, queried, and nothing there 29 days ago: the one-line "no data" error, not an argparse complaint.
    assert relative.returncode == 2
    assert "no gpu_fence_gpu_info samples" in relative.stderr
