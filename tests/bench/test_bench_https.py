"""The HTTPS and recovery benchmarks at a tiny size, and their parts against a real server: ``bench.server`` (the
real ``serve`` plus ``/noop``, worker class swap), the open-loop load generator, and wrk with ``bench/wrk/post.lua``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import https_bench, loadgen, reviews
from bench.server import NOOP_PATH, NOOP_RESPONSE


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, https_bench.Server]]:
    with https_bench.servers(
        tmp_path_factory.mktemp("https"), ["serve", "gthread", "sync", "serve-unfrozen"], workers=1, threads=2
    ) as running:
        yield running


def test_noop_answers_the_fixed_review_and_the_real_endpoints_still_judge(servers) -> None:
    target = servers["serve"].target
    client = loadgen.Client(target, target.context())
    try:
        client.connect()
        request, _ = loadgen.request_bytes(target, NOOP_PATH, reviews.mutate_body(2), keep_alive=True)
        assert client.exchange(request) == 200
        request, _ = loadgen.request_bytes(target, "/mutate", b"not json", keep_alive=True)
        assert client.exchange(request) == 400  # the real app behind the no-op: bad input is a clear 4xx
        assert client.connects == 1  # serve kept the connection alive through both
    finally:
        client.close()
    assert NOOP_RESPONSE.startswith(b'{"apiVersion":"admission.k8s.io/v1"')


def test_keep_alive_reuses_connections_and_new_connection_mode_handshakes_per_request(servers) -> None:
    target, body = servers["serve"].target, reviews.mutate_body(2)
    kept = loadgen.open_loop(target, "/mutate", body, rate=100, seconds=0.2, connections=2, reuse=True)
    assert kept["count"] == 20 and kept["connections_opened"] == 2
    fresh = loadgen.open_loop(target, NOOP_PATH, body, rate=100, seconds=0.2, connections=2, reuse=False)
    assert fresh["count"] == 20 and fresh["connections_opened"] == 20
    for summary in (kept, fresh):
        assert 0 < summary["p50_ms"] <= summary["p99_ms"] <= summary["max_ms"]
        assert summary["service_p50_ms"] > 0 and summary["achieved_per_s"] > 0


def test_sync_workers_close_every_connection(servers) -> None:
    summary = loadgen.open_loop(
        servers["sync"].target, "/validate", reviews.validate_body(2), rate=100, seconds=0.1, connections=1, reuse=True
    )
    assert summary["count"] == 10 and summary["connections_opened"] == 10


def test_a_non_200_answer_fails_the_run(servers) -> None:
    with pytest.raises(loadgen.LoadError, match="HTTP 404"):
        loadgen.open_loop(servers["serve"].target, "/nowhere", b"{}", rate=50, seconds=0.1, connections=1)


def test_wrk_script_posts_reviews_and_reports_json(servers, tmp_path: Path) -> None:
    body = tmp_path / "body.json"
    body.write_bytes(reviews.mutate_body(2))
    figures = https_bench.wrk_saturation(servers["serve"], "/mutate", body, seconds=1, connections=2)
    assert figures["requests"] > 0 and figures["reviews_per_s"] > 0
    assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["max_ms"]
    wrong = tmp_path / "wrong.json"
    wrong.write_bytes(b'{"apiVersion":"v1","request":{"uid":"00000000-0000-4000-8000-000000000000"}}')
    with pytest.raises(https_bench.BenchError, match="errors"):  # 400s are counted by wrk, and refused here
        https_bench.wrk_saturation(servers["serve"], "/mutate", wrong, seconds=1, connections=1)


def test_worker_rss_is_read_for_each_worker(servers) -> None:
    workers = servers["serve"].worker_rss()
    assert len(workers) == 1
    assert all(w["rss_bytes"] > 1 << 20 and w["peak_rss_bytes"] >= w["rss_bytes"] for w in workers)


def test_tiny_run_reports_every_point(tmp_path: Path) -> None:
    output = tmp_path / "https.json"
    assert (
        https_bench.main(
            [
                "--rates",
                "50",
                "--repeats",
                "1",
                "--saturation-repeats",
                "1",
                "--seconds",
                "0.2",
                "--wrk-seconds",
                "1",
                "--connections",
                "2",
                "--containers",
                "2",
                "--workers",
                "1",
                "--threads",
                "2",
                "--json",
                str(output),
            ]
        )
        == 0
    )
    report = json.loads(output.read_text())
    points = {(r["server"], r["mode"], r["endpoint"]) for r in report["results"]}
    for name in ("serve", "gthread", "sync"):
        for endpoint in https_bench.ENDPOINTS:
            assert (name, "saturation", endpoint) in points
            assert (name, "keep-alive", endpoint) in points
    assert ("serve", "new-connection", "/mutate") in points
    assert not [point for point in points if point[1] == "new-connection" and point[0] != "serve"]
    saturation = [r for r in report["results"] if r["mode"] == "saturation"]
    assert all(r["reviews_per_s"] > 0 and r["throughput_vs_noop"] > 0 for r in saturation)
    assert all(r["server_cpu_us"] >= 0 for r in saturation)  # CPU ticks are 10 ms: a tiny run may see none
    assert {r["throughput_vs_noop"] for r in saturation if r["endpoint"] == NOOP_PATH} == {1.0}
    assert set(report["worker_rss"]) == set(https_bench.DEFAULT_SERVERS)
    assert all(len(workers) == 1 for workers in report["worker_rss"].values())
    assert report["servers"]["sync"] == {
        "worker_class": "sync",
        "log_level": "INFO",
        "gc_freeze": True,
        "workers": 1,
        "threads": 1,
    }
    for name in ("serve", "gthread"):
        assert report["servers"][name] == {
            "worker_class": name,
            "log_level": "INFO",
            "gc_freeze": True,
            "workers": 1,
            "threads": 2,
        }
    assert {t["target"].split(" (")[0] for t in report["targets"]} == {"throughput >= 0.8x no-op, same stack"}


@pytest.mark.parametrize(
    "argv", [["--rates", "fast"], ["--servers", "gevent"], ["--connections", "0"], ["--threads", "0"]]
)
def test_bad_arguments_are_usage_errors(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        https_bench.main(argv)
    assert exit_.value.code == 2
    assert "--" in capsys.readouterr().err


def test_the_production_server_logs_every_review_as_measured(servers) -> None:
    target = servers["serve"].target
    loadgen.open_loop(target, "/validate", reviews.validate_body(2), rate=50, seconds=0.1, connections=1)
    events = [
        json.loads(line) for line in servers["serve"].stderr_path.read_text().splitlines() if line.startswith("{")
    ]
    assert any(event.get("event") == "review" and event.get("endpoint") == "validate" for event in events)


def test_the_unfrozen_variant_serves_the_real_endpoints(servers) -> None:
    summary = loadgen.open_loop(
        servers["serve-unfrozen"].target, "/mutate", reviews.mutate_body(2), rate=50, seconds=0.1, connections=1
    )
    assert summary["count"] == 5
    assert servers["serve-unfrozen"].worker_class == "serve"


def test_the_gthread_variant_runs_gunicorns_threaded_worker(servers) -> None:
    def workers_used(name: str) -> set[str]:
        lines = servers[name].stderr_path.read_text().splitlines()
        messages = [json.loads(line).get("message", "") for line in lines if line.startswith("{")]
        return {message.removeprefix("Using worker: ") for message in messages if message.startswith("Using worker:")}

    assert workers_used("gthread") == {"gthread"} and workers_used("serve") == {"AdmissionWorker"}


def test_the_recovery_benchmark_kills_a_worker_and_reports_each_server(tmp_path: Path) -> None:
    from bench import recovery_bench

    output = tmp_path / "recovery.json"
    arguments = ["--before", "1.5", "--after", "2", "--tail", "1", "--connections", "2", "--json", str(output)]
    assert recovery_bench.main(arguments) == 0
    report = json.loads(output.read_text())
    assert [row["server"] for row in report["results"]] == ["serve", "gthread"]
    for row in report["results"]:
        assert row["before_per_s"] > 0 and row["tail_per_s"] >= 0 and len(row["rates_per_s"]) == 14
        assert 1.5 <= row["killed_at_s"] < 2.5 and sum(row["connections_per_worker"]) <= 2


def test_the_availability_benchmark_reports_each_row_and_a_baseline(tmp_path: Path) -> None:
    """One held-connection row, one disturbance row, with this checkout installed as the baseline too."""
    import subprocess
    import sys

    from bench import availability_bench

    site = tmp_path / "site"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target", str(site), "."],
        cwd=Path(__file__).parents[2],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    output = tmp_path / "availability.json"
    arguments = ["--rows", "silent-320,malformed-512", "--rate", "5", "--seconds", "1", "--json", str(output)]
    assert availability_bench.main([*arguments, "--baseline", str(site)]) == 0
    report = json.loads(output.read_text())
    assert [(row["server"], row["row"]) for row in report["results"]] == [
        ("serve", "silent-320"),
        ("serve", "malformed-512"),
        ("baseline", "silent-320"),
        ("baseline", "malformed-512"),
    ]
    for row in report["results"]:
        assert row["reviews"] == 5 and row["failed"] + row["count"] == 5 and row["worker_rss_mib"] > 1
    assert report["results"][0]["attack_opened"] >= 320
