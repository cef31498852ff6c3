"""The auditor benchmark at a tiny fraction of the dense node: the real daemon in a child process, every phase
timed, one kubelet call per cycle, a scaling exponent, and the report's shape."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import auditor_bench


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory with a short path: the fake kubelet's unix socket path must stay under 108 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="gfb-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def run_bench(short_dir: Path, output: Path, *args: str) -> int:
    """The benchmark's main, writing its JSON report to ``output`` and building its fake node in ``short_dir``."""
    return auditor_bench.main([*args, "--json", str(output), "--node-dir", str(short_dir)])


def test_tiny_run_reports_phases_calls_and_scaling(short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = short_dir / "auditor.json"
    flags = ["--scales", "1,2", "--fraction", "0.02", "--cycles", "3", "--rounds", "2", "--flooded-dev", "0"]
    assert run_bench(short_dir, output, *flags) == 0
    report = json.loads(output.read_text())
    assert [row["scale"] for row in report["results"]] == [1, 2]
    for row in report["results"]:
        assert set(row["warm_phases_ms"]) == set(auditor_bench.PHASES) == set(row["first_phases_ms"])
        assert all(value >= 0 for value in row["warm_phases_ms"].values())
        assert row["warm_cycle_ms"] >= sum(v for k, v in row["warm_phases_ms"].items() if k != "join") * 0.99
        assert row["kubelet_calls_per_cycle"] == 1 and row["kubelet_calls_served"] == row["cycles_run"] == 6
        assert row["allocatable_calls_per_process"] == 1 and row["allocatable_calls_warm"] == 0
        assert row["api_requests_per_process"] >= 3  # the pod list; ResourceSlice discovery and list (then a watch)
        assert row["auditor_processes"] == 2 and row["warm_cycles"] == 4
        assert row["identity"] == "kubernetes"  # the pods were named through the API fake
        assert row["containers_audited"] == row["sizes"]["containers"]
        assert row["gpu_processes_seen"] == row["sizes"]["gpu_processes"]
        assert row["peak_rss_mb"] >= row["rss_before_cycles_mb"] > 1
        assert row["warm_cpu_ms"] > 0 and row["steady_cpu_ms"] is None
    assert report["results"][1]["sizes"]["host_processes"] == 2 * report["results"][0]["sizes"]["host_processes"]
    assert isinstance(report["scaling_exponent"], float)
    assert set(report["phase_scaling_exponents"]) == set(auditor_bench.PHASES)
    # at a fraction the cycle-time and RSS targets are not judged; the kubelet-call and scaling ones are
    judged = [t["target"] for t in report["targets"]]
    assert judged == [
        "one kubelet List per cycle (GetAllocatableResources at start only, at this length)",
        "linear in the input (log-log slope ~1, <= 1.15)",
    ]
    assert all(t["met"] for t in report["targets"] if t["target"].startswith("one kubelet List"))
    assert report["targets"][0]["met"] is True
    assert "| 2x | warm (median) |" in capsys.readouterr().out
    assert report["node_dir"] == str(short_dir)
    assert list(short_dir.iterdir()) == [output]  # the node tree was built there and removed
    # three cycles end inside the settling window: no steady figure is made up
    assert all(row["steady_cycle_ms"] is None and row["steady_cycles"] == 0 for row in report["results"])
    assert report["results"][0]["hidden_modules"] == list(auditor_bench.TEST_ONLY_MODULES)


def test_steady_cycles_follow_the_settling_window_and_test_extras_can_be_kept(
    short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = short_dir / "auditor.json"
    flags = ["--scales", "1", "--fraction", "0.01", "--cycles", "13", "--rounds", "1", "--with-test-extras"]
    assert run_bench(short_dir, output, *flags, "--flooded-dev", "5000") == 0
    report = json.loads(output.read_text())
    row, flooded = report["results"]
    # the flooded /dev case: the same node, one container's /dev past the bound, reported, and no scaling judged
    assert (flooded["case"], flooded["scale"], flooded["flooded_dev"]) == ("1x + flooded /dev (5,000)", 1, 5000)
    assert (row["findings"], flooded["findings"]) == (0, 1) and "scaling_exponent" not in report
    assert row["settling_cycles"] == 10 and row["warm_cycles"] == 12 and row["steady_cycles"] == 2
    assert row["steady_cycle_ms"] > 0 and set(row["steady_phases_ms"]) == set(auditor_bench.PHASES)
    assert row["hidden_modules"] == [] and report["test_extras"] is True
    out = capsys.readouterr().out
    assert "| 1x | steady (after 10) |" in out and "none (--with-test-extras)" in out


def installed_copy(site: Path) -> Path:
    """A stand-in for ``pip install --target site``: the installed layout of this checkout, by symlinks."""
    root = Path(auditor_bench.ROOT)
    package = site / "gpu_fence"
    package.mkdir(parents=True)
    for module in (root / "gpu_fence").glob("*.py"):
        (package / module.name).symlink_to(module)
    for deployable in ("auditor", "webhook"):
        (package / deployable).symlink_to(root / deployable, target_is_directory=True)
    return site


def test_shared_layout_and_a_baseline_side_by_side(short_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The time-sliced layout, where NVML samples every process, run beside a baseline installed elsewhere."""
    site = installed_copy(short_dir / "site")
    output = short_dir / "auditor.json"
    flags = ["--scales", "1", "--fraction", "0.02", "--cycles", "3", "--rounds", "1", "--layout", "shared"]
    assert run_bench(short_dir, output, *flags, "--flooded-dev", "0", "--baseline", str(site)) == 0
    report = json.loads(output.read_text())

    (mine,), (theirs,) = report["results"], report["baseline"]["results"]
    assert report["layout"] == "shared" and mine["sizes"]["mig_slices"] == 0
    assert mine["auditor_module"].startswith(str(auditor_bench.ROOT))
    assert theirs["auditor_module"].startswith(str(site))  # that run audited with the baseline's code
    for row in (mine, theirs):
        assert row["kubelet_calls_per_cycle"] == 1 and row["kubelet_calls_served"] == row["cycles_run"] == 3
        assert row["gpu_processes_seen"] == row["sizes"]["gpu_processes"]
    out = capsys.readouterr().out
    assert f"baseline: {site}" in out and "| 1x | warm (median) |" in out and "layout: shared" in out


def test_a_baseline_without_an_installed_gpu_fence_is_a_usage_error(
    short_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        auditor_bench.main(["--baseline", str(short_dir)])
    assert exit_.value.code == 2
    assert "no installed gpu_fence there" in capsys.readouterr().err


def test_hidden_test_only_modules_cannot_be_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the image lacks must fail to import in the child, as the libraries that try it expect."""
    import sys

    for name in auditor_bench.TEST_ONLY_MODULES:
        monkeypatch.delitem(sys.modules, name, raising=False)
    hidden = auditor_bench.hide_test_only_modules()
    try:
        assert hidden == list(auditor_bench.TEST_ONLY_MODULES)
        for name in hidden:
            with pytest.raises(ImportError):
                __import__(name)
    finally:
        for name in hidden:
            sys.modules.pop(name, None)


def test_sizes_scale_every_count_and_never_reach_zero() -> None:
    assert auditor_bench.sizes(1, 1.0) == auditor_bench.BASE
    four = auditor_bench.sizes(4, 1.0)
    assert (four["host_processes"], four["pods"], four["gpus"], four["gpu_processes"]) == (120_000, 440, 32, 8000)
    assert four["containers_per_pod"] == 4  # more pods, not bigger ones
    assert min(auditor_bench.sizes(1, 0.0001).values()) == 1


def test_phase_clock_times_a_wrapped_method() -> None:
    class Adapter:
        def list(self) -> list[int]:
            return [1, 2]

    adapter, clock = Adapter(), auditor_bench.PhaseClock()
    clock.wrap(adapter, "list", "kubelet")
    assert adapter.list() == [1, 2]
    assert clock.seconds["kubelet"] > 0
    clock.reset()
    assert clock.seconds["kubelet"] == 0.0


@pytest.mark.parametrize(
    "argv", [["--scales", "x"], ["--cycles", "1"], ["--rounds", "0"], ["--fraction", "2"], ["--bogus"]]
)
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        auditor_bench.main(argv)
    assert exit_.value.code == 2
    assert "--" in capsys.readouterr().err
