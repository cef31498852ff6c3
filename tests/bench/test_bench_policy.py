"""The policy benchmark at a tiny size: it runs, checks the paths it times, and reports well-formed figures."""

from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from bench import policy_bench, reviews


def test_tiny_run_reports_every_path_and_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "policy.json"
    assert (
        policy_bench.main(["--sizes", "1,3", "--repeats", "2", "--seconds", "0.01", "--no-pin", "--json", str(output)])
        == 0
    )
    report = json.loads(output.read_text())
    rows = {(row["containers"], row["path"]): row for row in report["results"]}
    assert set(rows) == {(size, path) for size in (1, 3) for path in policy_bench.PATHS}
    for row in rows.values():
        assert row["reviews_per_s"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"] <= row["max_ms"]
        assert 0 <= row["cpu_p50_ms"] <= row["cpu_p99_ms"]
        assert row["count"] >= 1
    assert all(rows[(size, "floor")]["throughput_vs_floor"] == 1.0 for size in (1, 3))
    assert [t["target"].split(" ")[0] for t in report["targets"]] == ["policy"]  # no 10-container size was run
    assert all(isinstance(t["met"], bool) for t in report["targets"])
    assert report["machine"]["python"] and report["machine"]["pinned_cpu"] is None
    table = capsys.readouterr().out
    assert "| 3 | validate |" in table and "| target | measured | met |" in table


def test_pinning_restricts_the_process_to_one_cpu(tmp_path: Path) -> None:
    import os

    allowed = os.sched_getaffinity(0)
    try:
        assert (
            policy_bench.main(
                ["--sizes", "1", "--repeats", "1", "--seconds", "0.01", "--json", str(tmp_path / "p.json")]
            )
            == 0
        )
        report = json.loads((tmp_path / "p.json").read_text())
        assert os.sched_getaffinity(0) == {report["machine"]["pinned_cpu"]}
        assert report["machine"]["cpus_allowed"] == sorted(allowed)
    finally:
        os.sched_setaffinity(0, allowed)


def test_the_timed_paths_do_what_they_are_named_for() -> None:
    cases = policy_bench.build_cases(10)
    mutated = orjson.loads(cases["mutate"]())
    assert len(reviews.decode_patch(mutated)) == 9  # every non-GPU sidecar pinned
    assert orjson.loads(cases["validate"]())["response"]["allowed"] is True
    assert orjson.loads(cases["floor"]()) == reviews.floor_response(orjson.loads(reviews.mutate_body(10)))
    policy_bench.check_cases(cases, 10)


def test_a_broken_path_is_refused_rather_than_timed() -> None:
    cases = policy_bench.build_cases(2)
    cases["mutate"] = cases["floor"]  # answers allowed but pins nothing
    with pytest.raises(RuntimeError, match="pinned 0 containers, expected 1"):
        policy_bench.check_cases(cases, 2)


@pytest.mark.parametrize("argv", [["--sizes", "one"], ["--sizes", "0"], ["--repeats", "0"], ["--seconds", "-1"]])
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        policy_bench.main(argv)
    assert exit_.value.code == 2
    assert "--sizes" in capsys.readouterr().err


def test_typical_pods_are_json_of_the_advertised_shape() -> None:
    for size in reviews.CONTAINER_COUNTS:
        pod = reviews.typical_pod(size)
        assert len(pod["spec"]["containers"]) == size
        assert all(len(c["env"]) == 12 and len(c["volumeMounts"]) == 3 for c in pod["spec"]["containers"])
        gpu = [c for c in pod["spec"]["containers"] if "nvidia.com/gpu" in c["resources"]["limits"]]
        assert len(gpu) == (0 if size == 1 else 1)
        pinned = reviews.pinned_pod(size)
        assert all(
            any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in c["env"])
            for c in pinned["spec"]["containers"]
            if c not in gpu
        )
    with pytest.raises(ValueError, match="at least one container"):
        reviews.typical_pod(0)


def test_policy_profile_times_every_rule(capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from bench import policy_profile
    from gpu_fence.webhook.policy import RULES

    allowed = os.sched_getaffinity(0)
    try:
        assert policy_profile.main(["--containers", "2", "--number", "5"]) == 0
    finally:
        os.sched_setaffinity(0, allowed)
    table = capsys.readouterr().out
    for rule in RULES:
        assert f"| rule {rule.id} |" in table
    steps = policy_profile.breakdown(2, 3)
    assert all(microseconds > 0 for _, microseconds in steps)


def test_the_collector_is_frozen_while_timing_as_in_serve_and_thawed_after(tmp_path: Path) -> None:
    import gc

    seen = []
    timed = policy_bench.time_path

    def spying(function, seconds):
        seen.append(gc.get_freeze_count())
        return timed(function, seconds)

    policy_bench.time_path = spying
    try:
        for argv, frozen in (([], True), (["--no-gc-freeze"], False)):
            seen.clear()
            assert (
                policy_bench.main(
                    [
                        "--sizes",
                        "1",
                        "--repeats",
                        "1",
                        "--seconds",
                        "0.01",
                        "--no-pin",
                        "--json",
                        str(tmp_path / "p.json"),
                        *argv,
                    ]
                )
                == 0
            )
            assert json.loads((tmp_path / "p.json").read_text())["gc_freeze"] is frozen
            assert all(count > 0 for count in seen) if frozen else not any(seen)
            assert gc.get_freeze_count() == 0
    finally:
        policy_bench.time_path = timed
