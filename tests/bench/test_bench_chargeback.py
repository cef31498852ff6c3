"""The chargeback benchmark's parts at small sizes: the fleet it bills, the recorded series it writes (exactly what
the real recording rules record, as promtool backfills them), and a whole run of two tiny fleets."""

from __future__ import annotations

import json
import math
import subprocess
import time
from pathlib import Path

import pytest

from bench import chargeback_bench
from bench.chargeback_fleet import BLOCK, Grid, Rates, build
from bench.chargeback_recorded import evaluation_grid, hourly, record
from gpu_fence.chargeback import rules
from tests.fakes.prometheus import PrometheusServer, binary

RECORDED = (
    rules.INTERVAL,
    rules.CARD,
    rules.BOOKED,
    rules.MEMORY,
    rules.REQUESTED,
    rules.GROUP_BOOKED,
    rules.GROUP_MEMORY,
    rules.GROUP_REQUESTED,
    rules.UNATTRIBUTED,
    rules.UNATTRIBUTED_MEMORY,
    rules.IDLE,
    rules.ISSUE,
)


def test_the_fleet_runs_the_issues_pods_a_day():
    start = 1_700_000_000 // 86400 * 86400
    fleet = build(2048, start, start + 86400, 300.0)
    # 2,048 H100: 1,792 exclusive, 128 time-sliced × 4 replicas, 128 split into 3 slices: 2,688 slots, a pod every
    # ~4 hours each (0-90 min gap, 30 min-6 h life): ~16,000 pods start in a day, plus those running at its start.
    started = [
        runs[0].start
        for (metric, _labels), runs in fleet.series.runs.items()
        if metric == "gpu_fence_container_allocated_gpus"
    ]
    assert 14_500 < sum(start <= moment < start + 86400 for moment in started) < 17_500
    assert len(fleet.by_card) == 2048
    models = {dict(labels)["model"] for metric, labels in fleet.series.runs if metric == "gpu_fence_gpu_info"}
    assert models == {"NVIDIA H100 80GB HBM3", *(f"NVIDIA H100 80GB HBM3 MIG {p}" for p in ("3g.40gb", "2g.20gb"))}


def test_a_block_holds_its_samples_once_on_the_grid():
    start = 1_700_000_000 // BLOCK * BLOCK
    fleet = build(16, start, start + 3 * 3600, 60.0)
    blocks = list(fleet.blocks())
    lines = [line for _block, text in blocks for line in text.splitlines() if not line.startswith("#")]
    assert len(lines) == fleet.series.samples(fleet.grid)
    assert all(text.endswith("# EOF\n") for _block, text in blocks)
    for block, text in blocks:
        stamps = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")]
        assert all(block <= stamp < block + BLOCK and (stamp - fleet.grid.origin) % 60 == 0 for stamp in stamps)


@pytest.fixture(scope="module")
def recorded_by_promtool(tmp_path_factory: pytest.TempPathFactory):
    """A small fleet (a time-sliced node, a MIG node, overreach and host processes made common) backfilled into
    Prometheus, and what promtool records from the real rules over it, every 5 minutes."""
    now = int(time.time()) // BLOCK * BLOCK
    start, end = now - 30 * 3600, now - 26 * 3600
    fleet = build(80, start, end, 60.0, rates=Rates(overreach=0.3, host_process=0.3))
    workdir = tmp_path_factory.mktemp("bench-recorded")
    data = workdir / "data"
    data.mkdir()
    for _block, text in fleet.blocks():
        (workdir / "block.om").write_text(text, encoding="utf-8")
        subprocess.run(
            [binary("promtool"), "tsdb", "create-blocks-from", "openmetrics", "--quiet", workdir / "block.om", data],
            check=True,
            capture_output=True,
            timeout=120,
        )
    with PrometheusServer(workdir) as server:
        for level in chargeback_bench.rule_levels(300):  # the split, then its hourly sums
            server.record(level, [(int(fleet.grid.origin), int(end))])
        yield fleet, server


def samples(server: PrometheusServer, metric: str, grid: Grid) -> dict[tuple, float]:
    """Each sample ``metric`` holds at exactly the evaluation instants of ``grid``: (labels, ms) → value."""
    found: dict[tuple, float] = {}
    start = grid.origin
    while start <= grid.end:
        end = min(grid.end, start + 9_999 * grid.step)
        for item in server.query_range(f"last_over_time({metric}[1ms])", start, end, grid.step):
            labels = tuple(sorted((k, v) for k, v in item["metric"].items() if k != "__name__"))
            for ts, value in item["values"]:
                found[(labels, round(float(ts) * 1000))] = float(value)
        start += 10_000 * grid.step
    return found


def test_the_series_the_bench_writes_are_what_the_rules_record(recorded_by_promtool):
    fleet, server = recorded_by_promtool
    # promtool evaluated the group at its own phase (a hash of its name and file): write ours at the same one.
    [stamp] = server.query(f"timestamp({rules.INTERVAL})", at=fleet.end)
    phase = float(stamp["value"][1]) % 300
    written = record(fleet, 300.0, phase=phase)
    grid = Grid(fleet.grid.origin + (phase - fleet.grid.origin) % 300, 300.0, fleet.end)
    for metric in RECORDED:
        by_rules = samples(server, metric, grid)
        ours: dict[tuple, float] = {}
        for (name, labels), runs in written.runs.items():
            if name != metric:
                continue
            for run in runs:
                span = grid.samples(run)
                moment = span[0] if span else math.inf
                while span and moment <= span[1] + 1e-6:
                    ours[(tuple(sorted(labels)), round(moment * 1000))] = run.value
                    moment += 300.0
        assert by_rules, f"the rules recorded no {metric}: the fleet does not exercise it"
        assert by_rules.keys() == ours.keys(), metric
        for key, value in by_rules.items():
            assert ours[key] == pytest.approx(value, rel=1e-9, abs=1e-9), (metric, key)


def test_a_tiny_run_bills_both_paths_alike_and_reports_growth(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    output = tmp_path / "chargeback.json"
    argv = ["--sizes", "16,32", "--resolutions", "300", "--days", "0.1", "--repeats", "1", "--workdir", str(tmp_path)]
    assert chargeback_bench.main([*argv, "--json", str(output)]) == 0
    report = json.loads(output.read_text())
    assert [result["gpus"] for result in report["results"]] == [16, 32]
    for result in report["results"]:
        assert set(result["bills"]) == {"recorded", "raw"}
        assert result["same_total"] is True  # both paths billed the same instants: the same total
        assert result["bills"]["recorded"]["series"] == "recorded" and result["bills"]["raw"]["series"] == "raw"
        for bill in result["bills"].values():
            assert bill["seconds"] > 0 and bill["peak_rss_mb"] > 10 and bill["prometheus_peak_rss_mb"] > 10
        assert result["raw_samples"] > result["raw_series"] > 0 and result["recorded_samples"] > 0
        assert result["cardinality"]["per_gpu"] > 1 and result["cardinality"]["per_container"] > 1
        assert result["intervals"] == round(0.1 * 86400 / 300)
    [row] = [row for row in report["growth"] if row["path"] == "recorded"]
    assert row["sizes"] == [16, 32] and len(row["time_ratios"]) == 1 and isinstance(row["slope"], float)
    assert report["targets"] == []  # judged only at the month's size
    assert "| 16 GPUs, 0.1 d, 300 s |" in capsys.readouterr().out
    assert [path.name for path in tmp_path.iterdir()] == [output.name]  # every Prometheus and its data removed


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]):
    for argv in (["--sizes", "12"], ["--paths", "rules"], ["--resolutions", "fast"], ["--repeats", "0"]):
        with pytest.raises(SystemExit) as raised:
            chargeback_bench.main(argv)
        assert raised.value.code == 2
    assert "multiples of 8" in capsys.readouterr().err


def test_before_bills_each_path_beside_with_another_installation(tmp_path: Path):
    output = tmp_path / "chargeback.json"
    argv = ["--sizes", "16", "--resolutions", "300", "--days", "0.1", "--repeats", "1", "--paths", "recorded"]
    before = str(chargeback_bench.COMMAND)  # this installation stands in for another one
    assert chargeback_bench.main([*argv, "--before", before, "--workdir", str(tmp_path), "--json", str(output)]) == 0
    [result] = json.loads(output.read_text())["results"]
    assert set(result["bills"]) == {"recorded", "before-recorded"}
    assert result["bills"]["before-recorded"]["series"] == "recorded" and result["same_total"] is True


def test_the_hourly_sums_the_bench_writes_are_what_the_second_level_records(recorded_by_promtool):
    fleet, server = recorded_by_promtool
    [stamp] = server.query(f"timestamp({rules.INTERVAL})", at=fleet.end)
    phase = float(stamp["value"][1]) % 300
    evaluations = evaluation_grid(fleet, 300.0, phase)
    [hours] = server.query(f"{rules.HOURLY_EVALUATIONS}[12h]", at=fleet.end + 3600)  # its samples as stored
    hour_phase = float(hours["values"][0][0]) % 3600
    written = hourly(record(fleet, 300.0, phase=phase), evaluations, hour_phase)
    assert written.grid is not None
    for metric in (
        rules.HOURLY_EVALUATIONS,
        *(name for _function, name in rules.HOURLY.values()),
        *rules.PER_NODE.values(),
    ):
        by_rules = samples(server, metric, written.grid)
        ours: dict[tuple, float] = {}
        for (name, labels), runs in written.runs.items():
            if name != metric:
                continue
            for run in runs:
                span = written.grid.samples(run)
                moment = span[0] if span else math.inf
                while span and moment <= span[1] + 1e-6:
                    ours[(tuple(sorted(labels)), round(moment * 1000))] = run.value
                    moment += 3600.0
        if metric == rules.HOURLY[rules.GROUP_ACTIVE][1]:
            assert by_rules == ours == {}, metric  # the fleet has no SM activity
            continue
        assert by_rules, f"the second level recorded no {metric}: the fleet does not exercise it"
        assert by_rules.keys() == ours.keys(), metric
        for key, value in by_rules.items():
            assert ours[key] == pytest.approx(value, rel=1e-9, abs=1e-6), (metric, key)
