"""``chargeback`` against a real Prometheus holding backfilled series; every expected figure worked out by hand.

Scenarios and prices are in ``conftest.py``. Each window is one hour, billed as six 10-minute intervals.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

from tests.fakes.chargeback_scenarios import run_chargeback, window_args
from tests.fakes.processes import run_captured

pytestmark = pytest.mark.e2e


def bill(prometheus, prices_file, window: str, *extra: str) -> dict:
    result = run_chargeback(
        "--prometheus", prometheus.url, *window_args(window), "--prices", str(prices_file), "--format", "json", *extra
    )
    assert result.code == 0, result.stderr
    return json.loads(result.stdout)


def groups(document: dict) -> dict[str, dict]:
    return {group["group"]: group for group in document["groups"]}


def test_exclusive_gpus_usage_method_platform_idle(prometheus, prices_file):
    document = bill(prometheus, prices_file, "exclusive", "--method", "usage", "--idle", "platform")
    by = groups(document)
    assert document["method"] == "usage"
    # Two H100 at 4.00/h for 1 h: 8.00 in all.
    assert document["total_gpu_cost"] == pytest.approx(8.00)
    assert document["currency"] == "EUR"
    # team-a alone on GPU-e1 all hour: 4.00/h × 1 h = 4.00; requested 1 GPU × 1 h × 4.00 = 4.00.
    assert by["team-a"]["usage_cost"] == pytest.approx(4.00)
    assert by["team-a"]["request_cost"] == pytest.approx(4.00)
    assert by["team-a"]["difference"] == pytest.approx(0.00)
    assert by["team-a"]["memory_gib_hours"] == pytest.approx(40.0)  # 40 GiB × 1 h
    # team-b on GPU-e2 for 3 of 6 intervals: 4.00 × 0.5 h = 2.00; the other half hour (2.00) is idle → platform,
    # although team-b held the GPU all hour (usage: only memory is charged).
    assert by["team-b"]["usage_cost"] == pytest.approx(2.00)
    assert by["team-b"]["reserved_cost"] == pytest.approx(0.00)
    assert by["team-b"]["idle_cost"] == pytest.approx(0.00)
    assert by["team-b"]["request_cost"] == pytest.approx(4.00)
    assert by["team-b"]["difference"] == pytest.approx(2.00 - 4.00)
    assert by["team-b"]["memory_gib_hours"] == pytest.approx(10 * 0.5)
    assert document["platform"]["cost"] == pytest.approx(2.00)


def test_exclusive_gpus_usage_method_proportional_idle(prometheus, prices_file):
    by = groups(document := bill(prometheus, prices_file, "exclusive", "--method", "usage", "--idle", "proportional"))
    # GPU-e2's idle half hour (2.00) goes to its only user, team-b: 2.00 + 2.00 = 4.00; nothing left to platform.
    assert by["team-b"]["usage_cost"] == pytest.approx(2.00)
    assert by["team-b"]["idle_cost"] == pytest.approx(2.00)
    assert by["team-b"]["total_cost"] == pytest.approx(4.00)
    assert by["team-a"]["idle_cost"] == pytest.approx(0.00)  # GPU-e1 was never idle
    assert document["platform"]["cost"] == pytest.approx(0.00)
    assert document["total_gpu_cost"] == pytest.approx(8.00)


@pytest.mark.parametrize("idle", ["platform", "proportional"])
def test_half_used_exclusive_holder_pays_the_half_it_held_idle(prometheus, prices_file, idle):
    document = bill(prometheus, prices_file, "exclusive", "--idle", idle)
    by = groups(document)
    assert document["method"] == "holder"  # the default
    # team-b held GPU-e2 all hour and used it for the first half: 2.00 usage + 2.00 reserved, unused = 4.00,
    # under both idle policies: nobody else could have used the GPU it held.
    assert by["team-b"]["usage_cost"] == pytest.approx(2.00)
    assert by["team-b"]["reserved_cost"] == pytest.approx(2.00)
    assert by["team-b"]["idle_cost"] == pytest.approx(0.00)
    assert by["team-b"]["total_cost"] == pytest.approx(4.00)
    assert by["team-b"]["difference"] == pytest.approx(0.00)  # = what requests charge for one exclusive GPU
    assert by["team-a"]["total_cost"] == pytest.approx(4.00)
    assert document["platform"]["cost"] == pytest.approx(0.00)
    assert document["notes"] == []  # every device had its offered replicas


@pytest.mark.parametrize("idle", ["platform", "proportional"])
def test_idle_exclusive_holder_pays_and_a_card_nobody_holds_is_platform(prometheus, prices_file, idle):
    document = bill(prometheus, prices_file, "held-idle", "--idle", idle)
    by = groups(document)
    # Three H100 at 4.00/h: 12.00. team-idle held two all hour with no memory on them: 2 × 4.00 = 8.00, all of it
    # reserved, unused. GPU-h3 nobody held or used: 4.00 to the platform under both policies.
    assert document["total_gpu_cost"] == pytest.approx(12.00)
    assert by["team-idle"]["usage_cost"] == pytest.approx(0.00)
    assert by["team-idle"]["reserved_cost"] == pytest.approx(8.00)
    assert by["team-idle"]["total_cost"] == pytest.approx(8.00)
    assert by["team-idle"]["memory_gib_hours"] == pytest.approx(0.0)
    assert document["platform"]["cost"] == pytest.approx(4.00)
    cards = {card["gpu_uuid"]: card for card in document["cards"]}
    assert cards["GPU-h3"]["unused_cost"] == pytest.approx(4.00)
    assert cards["GPU-h1"]["unused_cost"] == pytest.approx(0.00)


def test_idle_exclusive_holder_under_the_usage_method_pays_nothing(prometheus, prices_file):
    # The rule a finance team rejects, still there for sites that want it: the two held card-hours go to platform.
    document = bill(prometheus, prices_file, "held-idle", "--method", "usage", "--idle", "proportional")
    assert groups(document)["team-idle"]["total_cost"] == pytest.approx(0.00)
    assert groups(document)["team-idle"]["request_cost"] == pytest.approx(8.00)
    assert document["platform"]["cost"] == pytest.approx(12.00)


def test_idle_replicas_of_a_shared_gpu_pay_their_share(prometheus, prices_file):
    document = bill(prometheus, prices_file, "replicas", "--idle", "platform")
    by = groups(document)
    # A100 80GB at 3.00/h, 4 replicas offered: 0.75/h per replica. queue/waiting holds 2 and never uses them:
    # 2/4 × 3.00 × 1 h = 1.50 reserved. lab/active holds 1 and uses 4 GiB for the first half hour: there it
    # pays the rest of the card (3.00 × 0.5 h − the 0.75 queue reserved) = 0.75; in the second half it holds its
    # replica idle: 1/4 × 3.00 × 0.5 h = 0.375 reserved. The replica nobody holds is idle then: 0.375.
    # In cents (the largest remainder method): lab's 112.5 and the platform's 37.5 tie for the 300th cent, which
    # goes to the row listed first, lab: 1.13 (0.75 + 0.38) and 0.37.
    assert by["queue"]["reserved_cost"] == pytest.approx(1.50)
    assert by["queue"]["total_cost"] == pytest.approx(1.50)
    assert by["lab"]["usage_cost"] == pytest.approx(0.75)
    assert by["lab"]["reserved_cost"] == pytest.approx(0.38)
    assert by["lab"]["total_cost"] == pytest.approx(1.13)
    assert document["platform"]["cost"] == pytest.approx(0.37)
    assert document["total_gpu_cost"] == pytest.approx(3.00)
    # Requests bill each replica as a whole card-hour: queue 2 × 3.00 = 6.00, lab 3.00.
    assert by["queue"]["request_cost"] == pytest.approx(6.00)
    assert by["lab"]["request_cost"] == pytest.approx(3.00)
    assert document["notes"] == []

    spread = bill(prometheus, prices_file, "replicas", "--idle", "proportional")
    # The unheld replica's 0.375 is spread over the card's parties by what they were booked: 1.50 : 1.125, so
    # 0.2143 and 0.1607, and the rows' cents: queue 1.7143 → 1.71 (0.21 idle), lab 1.2857 → 1.29 (0.16 idle).
    assert groups(spread)["queue"]["idle_cost"] == pytest.approx(0.21)
    assert groups(spread)["lab"]["idle_cost"] == pytest.approx(0.16)
    assert groups(spread)["queue"]["total_cost"] + groups(spread)["lab"]["total_cost"] == pytest.approx(3.00)
    assert spread["platform"]["cost"] == pytest.approx(0.0)


def test_replicas_offered_missing_falls_back_to_all_held_with_a_note(prometheus, prices_file):
    document = bill(prometheus, prices_file, "replicas-unknown", "--idle", "platform")
    by = groups(document)
    # No gpu_fence_gpu_offered_replicas: the 3 ids held are taken as every replica. First half hour: queue pays
    # 2/3 × 3.00 × 0.5 = 1.00, lab the rest 0.50 (its memory); second half: queue 1.00, lab 1/3 × 1.50 = 0.50.
    assert by["queue"]["reserved_cost"] == pytest.approx(2.00)
    assert by["lab"]["usage_cost"] == pytest.approx(0.50)
    assert by["lab"]["reserved_cost"] == pytest.approx(0.50)
    assert document["platform"]["cost"] == pytest.approx(0.0)
    [note] = document["notes"]
    assert "gpu_fence_gpu_offered_replicas" in note and "ts-unknown/GPU-r4" in note and "every replica" in note


@pytest.mark.parametrize("idle", ["platform", "proportional"])
def test_mig_slices_held_idle_are_paid_by_their_holder(prometheus, prices_file, idle):
    document = bill(prometheus, prices_file, "mig-idle", "--idle", idle)
    by = groups(document)
    # A100 40GB at 7.00/h: the 3g slice 3.00/h, each 2g slice 2.00/h. infer uses the 3g all hour: 3.00. hold
    # holds both 2g slices without memory: 2 × 2.00 = 4.00 reserved. Nothing is idle.
    assert by["infer"]["usage_cost"] == pytest.approx(3.00)
    assert by["hold"]["reserved_cost"] == pytest.approx(4.00)
    assert by["hold"]["total_cost"] == pytest.approx(4.00)
    assert by["hold"]["request_cost"] == pytest.approx(4.00)
    assert document["platform"]["cost"] == pytest.approx(0.0)
    usage = bill(prometheus, prices_file, "mig-idle", "--method", "usage", "--idle", "platform")
    assert groups(usage)["hold"]["total_cost"] == pytest.approx(0.0)
    assert usage["platform"]["cost"] == pytest.approx(4.00)


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


@pytest.mark.parametrize("method", ["holder", "usage"])
def test_sm_activity_is_shown_per_group_beside_the_bill_and_never_billed(prometheus, prices_file, method):
    """The time-sliced card again, with the auditor's SM activity: a 50 % all hour, b 10 % for the first half hour,
    c sampled at 0 all hour. SM-active GPU-hours: ml 0.5 × 1 h + 0.1 × 0.5 h = 0.55, research 0 (idle, known).
    (test_recorded checks that the recording rules' bill says the same, scenario by scenario.)"""
    by = groups(bill(prometheus, prices_file, "timeslice", "--method", method))
    assert by["ml"]["sm_active_gpu_hours"] == pytest.approx(0.55)
    assert by["research"]["sm_active_gpu_hours"] == 0.0
    # the costs are those of the memory split, as without activity (test_time_slicing_splits_by_unequal_memory)
    assert by["ml"]["total_cost"] == pytest.approx(2.00) and by["research"]["total_cost"] == pytest.approx(1.00)
    # MIG: NVML samples no per-process activity there; the figure is unknown (null), not 0
    mig = groups(bill(prometheus, prices_file, "mig", "--method", method))
    assert mig["vision"]["sm_active_gpu_hours"] is None and mig["nlp"]["sm_active_gpu_hours"] is None

    common = ["--prometheus", prometheus.url, *window_args("timeslice"), "--prices", str(prices_file)]
    table = run_chargeback(*common, "--method", method).stdout
    assert "SM-active GPU-h (not billed)" in table
    [ml_line] = [line for line in table.splitlines() if line.startswith("ml ")]
    assert ml_line.split()[-1] == "0.55"
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(run_chargeback(*common, "--format", "csv").stdout))}
    assert float(rows["ml"]["sm_active_gpu_hours"]) == pytest.approx(0.55)
    assert float(rows["all groups"]["sm_active_gpu_hours"]) == pytest.approx(0.55)
    assert rows["(platform)"]["sm_active_gpu_hours"] == rows["TOTAL"]["sm_active_gpu_hours"] == ""
    # held 2 GPU-h (two replicas), 8 GiB-h, 2.00 used, total 2.00 = 1.00 per GPU-h held, 6.00 by request, -4.00
    assert "| ml | 2.00 | 8.00 | 2.00 | 0.00 | 0.00 | 0.00 | 2.00 | 1.00 | 6.00 | -4.00 | 0.55 |" in (
        run_chargeback(*common, "--format", "markdown").stdout
    )
    page = run_chargeback(*common, "--format", "html").stdout
    assert '<td class="num" data-key="sm_active_gpu_hours">0.55</td>' in page


def test_group_by_sanitised_pod_label(prometheus, prices_file):
    document = bill(prometheus, prices_file, "timeslice", "--by", "label:example.com/team")
    by = groups(document)
    # label "example.com/team" is exported as label_example_com_team; a → alpha, b → beta, c has none.
    assert by["alpha"]["usage_cost"] == pytest.approx(3.00 * 6 / 12)  # 1.50
    assert by["beta"]["usage_cost"] == pytest.approx(3.00 * 2 / 12)  # 0.50
    assert by["(none)"]["usage_cost"] == pytest.approx(3.00 * 4 / 12)  # 1.00
    assert document["group_by"] == "label:example.com/team"


def test_mig_card_split_3_2_2(prometheus, prices_file):
    platform = bill(prometheus, prices_file, "mig", "--method", "usage", "--idle", "platform")
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

    spread = groups(document := bill(prometheus, prices_file, "mig", "--method", "usage", "--idle", "proportional"))
    # The card's 1.00 idle is spread over its users in proportion to their charges on it, 3.00 : 3.00.
    assert spread["vision"]["total_cost"] == pytest.approx(3.50)
    assert spread["nlp"]["total_cost"] == pytest.approx(3.50)
    assert document["platform"]["cost"] == pytest.approx(0.0)

    for idle in ("platform", "proportional"):
        held = groups(document := bill(prometheus, prices_file, "mig", "--idle", idle))
        # holder: nlp held MIG-m2b all hour and used it half of it: 1.00 usage + 1.00 reserved, so 2.00 + 2.00.
        assert held["nlp"]["usage_cost"] == pytest.approx(3.00)
        assert held["nlp"]["reserved_cost"] == pytest.approx(1.00)
        assert held["nlp"]["total_cost"] == pytest.approx(4.00)
        assert held["vision"]["total_cost"] == pytest.approx(3.00)
        assert document["platform"]["cost"] == pytest.approx(0.0)


@pytest.mark.parametrize("method", ["holder", "usage"])
def test_overreach_unattributed_and_unused_card(prometheus, prices_file, method):
    for policy in ("platform", "proportional"):
        document = bill(prometheus, prices_file, "overreach", "--idle", policy, "--method", method)
        by = groups(document)
        # GPU-o: Tesla T4 has no model price → default 2.50/h; 8 GiB in use: legit 3, miner 1, host 4.
        # GPU-idle: node cheap-7 matches "cheap-*" → 1.00/h, never used → platform under both policies.
        assert document["total_gpu_cost"] == pytest.approx(2.50 + 1.00)
        # 2.50 × 3/8 = 0.9375; in cents 0.94 (its .75 of a cent is the largest remainder)
        assert by["batch"]["usage_cost"] == pytest.approx(0.94)
        assert by["batch"]["total_cost"] == pytest.approx(0.94)
        # The miner's memory share is priced (2.50 × 1/8 = 0.3125) and charged to its namespace, which used the
        # capacity without an allocation: in its total, in a column of its own.
        assert by["sneaky"]["overreach_cost"] == pytest.approx(0.31)
        assert by["sneaky"]["total_cost"] == pytest.approx(0.31)
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
                "cost": pytest.approx(0.31),
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
    assert by["batch"]["usage_cost"] == "0.94"
    assert by["(unattributed)"]["total_cost"] == "1.25"
    assert by["TOTAL"]["total_cost"] == "3.50"  # every row, overreach in its user's
    assert by["TOTAL"]["overreach_cost"] == by["sneaky"]["total_cost"] == "0.31"
    markdown = run_chargeback(*common, "--format", "markdown").stdout
    assert "| batch |" in markdown and "| sneaky | miner | main | sneaky | over | GPU-o |" in markdown


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
    done = run_captured(
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
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["group"]: row for row in csv.DictReader(io.StringIO(done.stdout))}
    assert float(rows["ml"]["usage_cost"]) == pytest.approx(2.00)
    relative = run_captured(
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
        timeout=120,
    )
    # Parsed, queried, and nothing there 29 days ago: the one-line "no data" error, not an argparse complaint.
    assert relative.returncode == 2
    assert "no gpu_fence_gpu_info samples" in relative.stderr


@pytest.mark.parametrize("method", ["holder", "usage"])
@pytest.mark.parametrize("idle", ["proportional", "platform"])
def test_memory_beside_an_unresolved_dra_device_is_usage_never_overreach(prometheus, prices_file, method, idle):
    document = bill(prometheus, prices_file, "dra-unknown", "--method", method, "--idle", idle)
    by = groups(document)
    # GPU-d1, an H100 at 4.00/h: infer/claim's 6 GiB (allocated="unknown") and lab/train's 2 GiB split it 6 : 2.
    assert by["infer"]["usage_cost"] == pytest.approx(4.00 * 6 / 8)  # 3.00
    assert by["infer"]["memory_gib_hours"] == pytest.approx(6.0)
    assert by["infer"]["total_cost"] == pytest.approx(3.00)
    assert by["infer"]["overreach_cost"] == 0.0
    assert document["overreach"] == []
    assert by["lab"]["total_cost"] == pytest.approx(1.00)
    # It holds nothing the kubelet knows of, so it requests nothing; lab requested the card-hour.
    assert by["infer"]["request_cost"] == 0.0 and by["lab"]["request_cost"] == pytest.approx(4.00)
    # GPU-d2, a T4 on the same node at the default 2.50/h, nobody booked: the platform's under both policies.
    assert document["platform"]["cost"] == pytest.approx(2.50)
    assert document["total_gpu_cost"] == pytest.approx(6.50)
