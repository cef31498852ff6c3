"""The whole path: ``gpu-fence-auditor run`` on a described node serves /metrics, a real Prometheus scrapes it
every second, and ``chargeback`` bills what Prometheus stored.

Timing decides how many intervals the range holds, not how they split, so the checks are ratios and sums worked
out from the node: GPU 0 is time-sliced by two pods holding 3 GiB and 1 GiB, GPU 1 is used by a pod with no
allocation (2 GiB) and a host process (2 GiB). At 3600/h a card costs 1 per second.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.fakes.chargeback_scenarios import run_chargeback
from tests.fakes.node_scenario import Ctr, NodeScenario, replica_holder, uuid_of
from tests.fakes.nvml import GIB
from tests.fakes.prometheus import PrometheusServer, free_port, wait_for

pytestmark = pytest.mark.e2e
CONSOLE_SCRIPT = Path(sys.executable).with_name("gpu-fence-auditor")


@pytest.fixture
def auditor(tmp_path: Path):
    scenario = NodeScenario(tmp_path / "node", node="gpu-node-1", gpus=2)
    for name, team, replica, gib in (("a", "alpha", 0, 3), ("b", "beta", 1, 1)):
        scenario.add_pod("ml", name, replica_holder(0, replica, gib * GIB), labels={"team": team})
    scenario.add_pod(
        "web", "notebook", Ctr("jupyter", visible=[1], processes=[(1, 2 * GIB)], env={"NVIDIA_VISIBLE_DEVICES": "all"})
    )
    scenario.add_host_gpu_process(1, 2 * GIB)
    scenario.start()
    scenario.write_nvml()
    port = free_port()
    log = (tmp_path / "auditor.log").open("wb")
    process = subprocess.Popen(
        [
            str(CONSOLE_SCRIPT),
            *scenario.args(
                "run",
                "--interval",
                "1",
                "--metrics-port",
                str(port),
                "--metrics-bind",
                "127.0.0.1",
                "--pod-label",
                "team",
                "--no-events",
            ),
        ],
        env=scenario.env(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def exported() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"auditor exited: {(tmp_path / 'auditor.log').read_text()[-2000:]}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
            return b"gpu_fence_container_gpu_memory_bytes{" in response.read()

    try:
        wait_for(exported, 60, "the auditor to export per-container GPU memory")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        log.close()
        scenario.stop()


def test_prometheus_scrapes_the_auditor_and_chargeback_bills_it(auditor: str, tmp_path: Path):
    with PrometheusServer(tmp_path / "prometheus", scrape_targets=[auditor], scrape_interval="1s") as prometheus:
        # Wait until every series chargeback needs has been scraped at least once.
        needed = (
            "gpu_fence_gpu_info",
            "gpu_fence_container_gpu_memory_bytes",
            "gpu_fence_container_allocated_gpus",
            "gpu_fence_unattributed_gpu_memory_bytes",
            "gpu_fence_pod_labels",
        )
        query = " and on() ".join(f"count({name}) > 0" for name in needed)
        wait_for(lambda: prometheus.query(query), 60, "Prometheus to scrape every chargeback series")
        start = int(time.time()) + 1  # a whole second after every series exists

        def scraped_until() -> float:
            [sample] = prometheus.query('max(timestamp(gpu_fence_container_gpu_memory_bytes{pod="a"}))')
            return float(sample["value"][1]) if float(sample["value"][1]) >= start + 6 else 0.0

        end = int(wait_for(scraped_until, 60, "six more seconds of scrapes"))  # the last scrape is within lookback
        result = run_chargeback(
            "--prometheus",
            prometheus.url,
            "--start",
            str(start),
            "--end",
            str(end),
            "--step",
            "1s",
            "--by",
            "label:team",
            "--price-per-gpu-hour",
            "3600",
            "--idle",
            "platform",
            "--format",
            "json",
        )
    assert result.code == 0, result.stderr
    document = json.loads(result.stdout)
    seconds = end - start  # instants start+1 .. end, one second each; every card costs 1 per second
    by = {group["group"]: group for group in document["groups"]}
    assert document["total_gpu_cost"] == pytest.approx(2 * seconds)
    # GPU 0: alpha 3 GiB, beta 1 GiB → 3/4 and 1/4 of a card-second, every second.
    assert by["alpha"]["usage_cost"] == pytest.approx(0.75 * seconds)
    assert by["beta"]["usage_cost"] == pytest.approx(0.25 * seconds)
    # Each replica is billed as a whole GPU by requests: 1 per second each.
    assert by["alpha"]["request_cost"] == pytest.approx(seconds)
    assert by["beta"]["request_cost"] == pytest.approx(seconds)
    # GPU 1: the notebook (no allocation, no team label) and the host process hold 2 GiB each → half a card each.
    assert by["(none)"]["overreach_cost"] == pytest.approx(0.5 * seconds)
    assert by["(none)"]["total_cost"] == pytest.approx(0.0)
    assert document["unattributed"]["cost"] == pytest.approx(0.5 * seconds)
    assert document["platform"]["cost"] == pytest.approx(0.0)
    [overreach] = document["overreach"]
    assert (overreach["namespace"], overreach["pod"], overreach["node"], overreach["gpu_uuid"]) == (
        "web",
        "notebook",
        "gpu-node-1",
        uuid_of(1),
    )
