"""The check benchmark at a tiny size: the generated file is what it says, the real command runs in a child, and the
report has its figures (never a judgement on them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import check_bench
from gpu_fence.webhook.sources import parse_documents


def test_the_generated_file_holds_that_many_deployments_each_judged(tmp_path: Path) -> None:
    path = tmp_path / "deployments.yaml"
    size = check_bench.write_deployments(path, 3)
    assert size == path.stat().st_size
    documents = parse_documents(path.read_text(), str(path))
    assert [document.data["metadata"]["name"] for document in documents] == [f"inference-{n}" for n in range(3)]


def test_tiny_run_reports_time_and_peak_rss(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "check.json"
    assert check_bench.main(["--deployments", "20", "--rounds", "2", "--json", str(output)]) == 0
    report = json.loads(output.read_text())
    assert (report["deployments"], report["rounds"]) == (20, 2)
    assert 0 < report["file_mb"] < 1
    runs = report["this_tree"]["runs"]
    assert len(runs) == 2
    assert all(run["exit"] == 0 and run["wall_s"] > 0 and run["cpu_s"] > 0 and run["peak_rss_mb"] > 0 for run in runs)
    assert "baseline" not in report
    assert report["machine"]["python"]
    assert "| this tree |" in capsys.readouterr().out


def test_the_table_compares_with_a_baseline() -> None:
    runs = [{"wall_s": 1.0, "cpu_s": 1.0, "peak_rss_mb": 100.0, "exit": 0}]
    report = {
        "deployments": 10,
        "file_mb": 0.01,
        "rounds": 1,
        "load_average": (1.0, 1.0, 1.0),
        "this_tree": {"wall_s": 2.0, "cpu_s": 1.5, "peak_rss_mb": 50.0, "runs": runs},
        "baseline": {"site": "old-version", "wall_s": 4.0, "cpu_s": 3.0, "peak_rss_mb": 200.0, "runs": runs},
    }
    table = check_bench.markdown(report)
    assert "| baseline (old-version) | 4.0 | 3.0 | 200 |" in table
    assert "| ratio (this tree / baseline) | 0.50 | 0.50 | 0.25 |" in table
