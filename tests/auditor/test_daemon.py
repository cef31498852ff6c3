"""``run``: the real console script against a scenario node, scraped over HTTP, then stopped with SIGTERM.
Plus the pieces of the loop that are pure (backoff) and ``once``'s start-up errors. The HTTP server and health
are ``test_server.py``'s, the flags ``test_settings.py``'s."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.auditor.cli import main
from gpu_fence.auditor.daemon import api_budget, backoff
from gpu_fence.auditor.model import IdentitySource
from tests.fakes.node_scenario import Ctr, NodeScenario, uuid_of
from tests.fakes.nvml import GIB, FakeError
from tests.fakes.podresources_server import GET_ABSENT, offered
from tests.fakes.polling import wait_for

CONSOLE_SCRIPT = Path(sys.executable).with_name("gpu-fence-auditor")


def samples(text: str) -> dict[tuple[str, tuple], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(metrics: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in metrics.items() if n == name and set(labels.items()) <= set(ls))


class Daemon:
    """The console script's ``run`` in a subprocess, its JSON-lines stderr collected by a thread."""

    def __init__(self, scenario: NodeScenario, *extra: str, env: dict[str, str] | None = None) -> None:
        args = scenario.args(
            "run",
            "--interval",
            "0.2",
            "--metrics-port",
            "0",
            "--metrics-bind",
            "127.0.0.1",
            "--unhealthy-after",
            "10",  # a 2 s health window: a cycle's API calls get 0.9 s together, room on a busy test machine
            "--max-backoff",
            "0.8",
            *extra,
        )
        self.process = subprocess.Popen(
            [str(CONSOLE_SCRIPT), *args],
            env={**scenario.env(), **(env or {})},
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[dict] = []
        self.raw: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        started = wait_for(lambda: next((e for e in self.lines if e["event"] == "started"), None), "start")
        self.url = f"http://127.0.0.1:{started['port']}"

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.raw.append(line)
            if line.startswith("{"):  # anything else fails the JSON-lines check at the end of the first test
                self.lines.append(json.loads(line))

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def metrics(self) -> dict:
        return samples(self.get("/metrics")[1])

    def cycles(self) -> int:
        return sum(1 for e in self.lines if e["event"] == "cycle")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)


@pytest.fixture
def scenario(tmp_path):
    # A sampling period well under --interval, so that every cycle finds a sample newer than the last one read.
    node = NodeScenario(tmp_path / "node", gpus=2, util_period_us=20_000)
    train = Ctr("main", allocated=[0], visible=[0], processes=[(0, 4 * GIB)], activity=[(40, 10, 0, 5)])
    node.add_pod("ml", "train", train, labels={"team": "vision"})
    node.add_pod("web", "cuda", Ctr("app", visible=[1], processes=[(1, 2 * GIB)]))
    node.add_host_gpu_process(1, 100 << 20)
    with node:
        yield node


def test_run_serves_metrics_health_and_deduplicated_events_then_stops_on_sigterm(scenario):
    daemon = Daemon(scenario, "--pod-label", "team")
    try:
        wait_for(lambda: daemon.cycles() >= 3, "three cycles")
        code, body = daemon.get("/healthz")
        assert code == 200 and body.startswith("ok")
        metrics = daemon.metrics()
        app = {"namespace": "web", "pod": "cuda", "container": "app"}
        assert value(metrics, "gpu_fence_container_gpu_memory_bytes", **app, allocated="false") == 2 * GIB
        assert value(metrics, "gpu_fence_container_gpu_memory_bytes", pod="train", allocated="true") == 4 * GIB
        assert value(metrics, "gpu_fence_container_allocated_gpus", pod="train", gpu_uuid=uuid_of(0)) == 1
        assert value(metrics, "gpu_fence_overreach_findings", **app, kind="used-unallocated") == 1
        assert value(metrics, "gpu_fence_unattributed_gpu_memory_bytes", gpu_uuid=uuid_of(1)) == 100 << 20
        assert value(metrics, "gpu_fence_pod_labels", pod="train", label_team="vision") == 1
        train = {"pod": "train", "gpu_uuid": uuid_of(0), "allocated": "true"}
        assert value(metrics, "gpu_fence_container_gpu_sm_activity_ratio", **train) == 0.4
        assert value(metrics, "gpu_fence_container_gpu_memory_controller_activity_ratio", **train) == 0.1
        assert value(metrics, "gpu_fence_container_gpu_decoder_activity_ratio", **train) == 0.05
        assert value(metrics, "gpu_fence_container_gpu_sm_activity_ratio", **app, allocated="false") == 0
        assert value(metrics, "gpu_fence_gpu_activity_sampled", gpu_uuid=uuid_of(1)) == 1
        assert value(metrics, "gpu_fence_audit_cycle_duration_seconds_count") >= 3
        assert value(metrics, "gpu_fence_audit_last_success_timestamp_seconds") > 0
        assert value(metrics, "gpu_fence_audit_kubelet_calls_total", method="List") == daemon.cycles()
        assert not [name for name, _ in metrics if name.endswith("_created")]  # undocumented, so not exported
        # the same findings every cycle, yet one Event each (used- and visible-unallocated on web/cuda)
        assert len(scenario.api.event_posts()) == 2 and not scenario.api.event_patches()
        assert {e["involvedObject"]["name"] for e in scenario.api.events.values()} == {"cuda"}
        assert daemon.get("/nope")[0] == 404
    finally:
        assert daemon.stop() == 0
    assert daemon.lines[-1]["event"] == "stopping"
    assert all(line.startswith("{") for line in daemon.raw)
    # the shape the webhook writes too (gpu_fence.logs): the same keys first on every line
    assert all(list(line)[:5] == ["time", "level", "logger", "event", "message"] for line in daemon.lines)
    assert all(line["time"].endswith("Z") and line["logger"] == "gpu_fence.auditor" for line in daemon.lines)
    started = daemon.lines[0]
    assert started["event"] == "started" and started["level"] == "info" and started["node"] == scenario.node
    cycle = next(line for line in daemon.lines if line["event"] == "cycle")
    assert {"duration_seconds", "containers", "findings", "identity", "events", "notes"} <= cycle.keys()
    finding = next(line for line in daemon.lines if line["event"] == "finding" and line["kind"] == "used-unallocated")
    assert finding["level"] == "warning" and finding["pod"] == "cuda" and finding["memory_bytes"] == 2 * GIB
    assert finding["message"].startswith(f"process {finding['pid']} uses")


def test_run_never_imports_the_kubernetes_api_or_model_classes(scenario):
    """Listing pods and creating and patching Events go through the generic ApiClient: ``CoreV1Api``'s first use
    imports ~250 API and model modules (+22 MB of RSS on a dense node) that the auditor's plain JSON never needs.
    Python's own import log (``PYTHONPROFILEIMPORTTIME``) of the real ``run`` names every module it imported."""
    daemon = Daemon(scenario, "--event-interval", "0.0005", env={"PYTHONPROFILEIMPORTTIME": "1"})  # 30 ms re-emit
    try:
        wait_for(lambda: daemon.cycles() >= 3 and scenario.api.event_patches(), "Events created and patched")
        assert len(scenario.api.pod_lists()) >= 1
    finally:
        assert daemon.stop() == 0
    imported = {line.rsplit("|", 1)[1].strip() for line in daemon.raw if line.startswith("import time:")}
    assert {"kubernetes.client.rest", "kubernetes.config.kube_config"} <= imported  # the client was loaded and logged
    # the models package itself is a lazy shell the client imports at start; its modules and the API classes are not
    heavy = sorted(n for n in imported if n.startswith(("kubernetes.client.models.", "kubernetes.client.api.")))
    assert heavy == []


def test_the_second_cycle_freezes_what_the_process_holds_for_good(scenario, monkeypatch):
    """Libraries and adapters leave the cyclic collector's reach once, before the second cycle, so a full collection
    no longer traverses them every cycle; the first cycle's own objects are collected first."""
    import gc

    from gpu_fence.auditor.cli import build_parser
    from gpu_fence.auditor.daemon import Auditor
    from gpu_fence.auditor.settings import AuditSettings

    monkeypatch.setenv("FAKE_NVML_CONFIG", scenario.env()["FAKE_NVML_CONFIG"])
    auditor = Auditor(AuditSettings.from_args(build_parser().parse_args(scenario.args("once"))))
    gc.unfreeze()
    try:
        auditor.preflight()
        first = auditor.cycle()
        assert gc.get_freeze_count() == 0
        del first
        second, _ = auditor.cycle()
        frozen = gc.get_freeze_count()
        assert frozen > 1000 and second.identity_source is IdentitySource.KUBERNETES
        auditor.cycle()
        assert gc.get_freeze_count() <= frozen  # once only (frozen objects may still be freed by refcount)
    finally:
        gc.unfreeze()
        auditor.close()


def test_run_survives_kubelet_restart_and_outage_and_reports_health(scenario):
    daemon = Daemon(scenario)
    try:
        wait_for(lambda: daemon.cycles() >= 1, "a first cycle")
        scenario.kubelet.restart()
        done = daemon.cycles()
        wait_for(lambda: daemon.cycles() >= done + 2, "cycles after a kubelet restart")
        # every successful cycle made a List, also those on the client rebuilt after the restart
        done = daemon.cycles()
        assert value(daemon.metrics(), "gpu_fence_audit_kubelet_calls_total", method="List") >= done

        scenario.kubelet.stop()
        wait_for(lambda: daemon.get("/healthz")[0] == 503, "healthz to fail while the kubelet is down", timeout=60)
        assert "PodResources" in daemon.get("/healthz")[1]
        outage = daemon.metrics()
        assert value(outage, "gpu_fence_audit_cycle_failures_total", reason="kubelet") >= 1
        # the last good cycle's memory is not exported (and billed) for the length of the outage
        assert not any(name.startswith("gpu_fence_container_") for name, _ in outage)
        assert value(outage, "gpu_fence_audit_last_success_timestamp_seconds") > 0
        failed = [e for e in daemon.lines if e["event"] == "cycle-failed"]
        assert failed and failed[-1]["reason"] == "kubelet" and failed[-1]["level"] == "warning"
        assert "PodResources" in failed[-1]["message"] and failed[-1]["failures_in_row"] >= 1

        scenario.kubelet.start()
        wait_for(lambda: daemon.get("/healthz")[0] == 200, "healthz to recover", timeout=60)
        assert value(daemon.metrics(), "gpu_fence_container_gpu_memory_bytes", pod="train") == 4 * GIB
        done = daemon.cycles()
        wait_for(lambda: daemon.cycles() >= done + 3, "cycles after the outage")
        done = daemon.cycles()
        assert value(daemon.metrics(), "gpu_fence_audit_kubelet_calls_total", method="List") >= done
    finally:
        assert daemon.stop() == 0
    assert all(line.startswith("{") for line in daemon.raw)  # JSON lines only, gRPC's own logging included


def test_run_keeps_auditing_while_the_api_is_down(scenario):
    scenario.api.down = True
    daemon = Daemon(scenario)
    try:
        wait_for(lambda: daemon.cycles() >= 2, "cycles with the API down")
        metrics = daemon.metrics()
        assert value(metrics, "gpu_fence_audit_cycle_failures_total", reason="kubernetes-api") >= 2
        assert value(metrics, "gpu_fence_overreach_findings", kind="used-unallocated") == 1
        assert daemon.get("/healthz")[0] == 200
        scenario.api.down = False
        wait_for(lambda: len(scenario.api.event_posts()) == 2, "Events once the API is back")
    finally:
        assert daemon.stop() == 0


@pytest.mark.parametrize("hangs", ["everything", "events"])
def test_a_hung_api_server_degrades_cycles_but_never_the_health(scenario, hangs):
    """Every API call hangs (the pod list, the Events the findings want), or only the Event writes do: each cycle
    waits for them at most its API budget, all calls together, so /healthz stays 200 through cycles an interval of
    0.5 s apart. (Without a pod list the overreaching container has no name to hang an Event on, so the Events are
    tried only where the pod list answers.)"""
    scenario.api.hanging = hangs == "everything"
    scenario.api.hanging_events = hangs == "events"
    daemon = Daemon(scenario, "--interval", "0.5", "--unhealthy-after", "3")  # window 1.5 s: API budget 0.5 s
    try:
        started = next(e for e in daemon.lines if e["event"] == "started")
        assert started["api_budget_seconds"] == 0.5

        def healthy_through_cycles() -> bool:
            assert daemon.get("/healthz")[0] == 200  # at every poll: a failure ends the wait at once
            return daemon.cycles() >= 8  # 8 intervals: over twice the health window

        wait_for(healthy_through_cycles, "eight cycles, healthy throughout", interval=0.1, not_yet=())
        cycles = [e for e in daemon.lines if e["event"] == "cycle"]
        assert len(cycles) >= 4 and max(c["duration_seconds"] for c in cycles) < 1.5
        if hangs == "everything":
            assert value(daemon.metrics(), "gpu_fence_audit_cycle_failures_total", reason="kubernetes-api") >= 4
        else:
            assert len(scenario.api.event_posts()) >= 2  # the Events were tried, cycle after cycle
    finally:
        scenario.api.hanging = scenario.api.hanging_events = False
        assert daemon.stop() == 0


@pytest.mark.parametrize(
    ("interval", "window", "budget"),
    [(30, 90, 10.0), (3.4, 10.2, 3.4), (1, 3, 1.0), (0.5, 1.5, 0.5), (1, 1, 0.5), (30, 30, 1.0), (0.2, 0.2, 0.1)],
)
def test_the_api_budget_leaves_the_health_window_room(interval, window, budget):
    assert api_budget(interval, window) == pytest.approx(budget)
    if window >= 2 * interval:  # a cycle whose API calls all hang still ends inside the window, with room to work
        assert interval + api_budget(interval, window) <= window - api_budget(interval, window) + 1e-9


def test_run_survives_nvml_initialisation_failures(scenario):
    scenario.nvml_errors.append(FakeError("nvmlInitWithFlags", "DRIVER_NOT_LOADED"))
    scenario.write_nvml()
    daemon = Daemon(scenario)
    try:
        wait_for(
            lambda: value(daemon.metrics(), "gpu_fence_audit_cycle_failures_total", reason="nvml") >= 1,
            "an NVML failure",
        )
        assert daemon.cycles() == 0
        scenario.nvml_errors.clear()
        scenario.write_nvml()  # the driver is back: the next cycle re-initialises NVML and reads the new state
        wait_for(lambda: daemon.cycles() >= 1, "a cycle once NVML initialises")

    finally:
        assert daemon.stop() == 0


def test_run_with_a_lost_gpu_keeps_auditing_the_others(scenario):
    scenario.nvml_errors.append(FakeError("nvmlDeviceGetUUID", "GPU_IS_LOST", device=1))
    scenario.write_nvml()
    daemon = Daemon(scenario)
    try:
        wait_for(lambda: daemon.cycles() >= 2, "cycles with a lost GPU")
        metrics = daemon.metrics()
        assert value(metrics, "gpu_fence_audit_cycle_failures_total", reason="nvml") >= 2
        assert value(metrics, "gpu_fence_gpu_info", gpu_uuid=uuid_of(0)) == 1
        assert value(metrics, "gpu_fence_gpu_info", gpu_uuid=uuid_of(1)) == 0
        assert value(metrics, "gpu_fence_container_gpu_memory_bytes", pod="train") == 4 * GIB
        assert any(note.startswith("NVML:") for e in daemon.lines if e["event"] == "cycle" for note in e["notes"])
    finally:
        assert daemon.stop() == 0


def test_run_exports_offered_replicas_asked_at_start_and_every_interval_only(scenario):
    """GetAllocatableResources through the real gRPC server, answered in the kubelet's shape: four time-slicing
    replicas of GPU 0 on two NUMA nodes (each id listed twice), GPU 1 unshared."""
    scenario.kubelet.allocatable = [
        *offered("nvidia.com/gpu.shared", [f"{uuid_of(0)}::{n}" for n in range(4)], numa_nodes=(0, 1)),
        *offered("nvidia.com/gpu", [uuid_of(1)]),
    ]
    daemon = Daemon(scenario, "--allocatable-interval", "1")
    try:
        wait_for(lambda: daemon.cycles() >= 10, "ten cycles")
        metrics = daemon.metrics()
        assert value(metrics, "gpu_fence_gpu_offered_replicas", gpu_uuid=uuid_of(0)) == 4
        assert value(metrics, "gpu_fence_gpu_offered_replicas", gpu_uuid=uuid_of(1)) == 1
        asked = value(metrics, "gpu_fence_audit_kubelet_calls_total", method="GetAllocatableResources")
        lists = value(metrics, "gpu_fence_audit_kubelet_calls_total", method="List")
        assert 1 <= asked <= lists / 3  # at start, then once a second: not every cycle (one every 0.2 s)
        assert scenario.kubelet.calls["GetAllocatableResources"] >= asked

        scenario.kubelet.allocatable_mode = GET_ABSENT  # a kubelet that lacks the call: absent, and counted
        wait_for(
            lambda: "gpu_fence_gpu_offered_replicas" not in {name for name, _ in daemon.metrics()},
            "the offer to be withdrawn",
        )
        failed = daemon.metrics()
        assert value(failed, "gpu_fence_audit_kubelet_call_failures_total", reason="unimplemented") >= 1
        assert value(failed, "gpu_fence_audit_cycle_failures_total", reason="kubelet") == 0  # the audit goes on
        notes = [n for e in daemon.lines if e["event"] == "cycle" for n in e["notes"] or ()]
        assert any("GetAllocatableResources" in n and "not served by this kubelet" in n for n in notes)
    finally:
        assert daemon.stop() == 0


def test_run_keeps_resolving_dra_claims_with_the_last_slices_while_the_api_is_down(tmp_path):
    node = NodeScenario(tmp_path / "dra", gpus=2, minors={0: 1, 1: 0}, dra_release="v25.12")
    node.add_pod("ml", "train", Ctr("main", dra=[1], visible=[1], processes=[(1, 3 * GIB)]))
    with node:
        daemon = Daemon(node)
        try:
            wait_for(lambda: daemon.cycles() >= 5, "five cycles")
            metrics = daemon.metrics()
            assert value(metrics, "gpu_fence_container_allocated_gpus", pod="train", gpu_uuid=uuid_of(1)) == 1
            assert value(metrics, "gpu_fence_container_gpu_memory_bytes", pod="train", allocated="true") == 3 * GIB
            assert value(metrics, "gpu_fence_dra_slices_state", state="fresh") == 1
            # listed once, then watched: no list per cycle
            lists = [q for _, path, q in node.api.slice_requests() if path.endswith("/resourceslices")]
            assert sum(1 for q in lists if "watch" not in q) == 1 and node.api.resource_slices.watches_open == 1

            node.api.down = True
            wait_for(lambda: value(daemon.metrics(), "gpu_fence_dra_slices_state", state="stale") == 1, "stale")
            done = daemon.cycles()
            wait_for(lambda: daemon.cycles() >= done + 2, "cycles with the API down")
            down = daemon.metrics()
            assert value(down, "gpu_fence_container_allocated_gpus", pod="train", gpu_uuid=uuid_of(1)) == 1
            assert value(down, "gpu_fence_overreach_findings", pod="train") == 0
            assert value(down, "gpu_fence_audit_cycle_failures_total", reason="kubernetes-api") >= 2

            node.api.down = False
            wait_for(lambda: value(daemon.metrics(), "gpu_fence_dra_slices_state", state="fresh") == 1, "recovery")
        finally:
            assert daemon.stop() == 0


# --- the pure parts of the loop --------------------------------------------------------------------------


def test_backoff_doubles_per_failure_and_is_capped():
    assert [backoff(30, n, 300) for n in range(7)] == [30, 30, 60, 120, 240, 300, 300]
    assert backoff(600, 3, 300) == 600  # never shorter than the interval


def test_backoff_after_a_very_long_outage_stays_capped():
    """--interval is a float: 2**n past ~1024 failures in a row must not overflow and end the loop."""
    assert backoff(30.0, 1100, 300.0) == 300.0
    assert backoff(30.0, 10**6, 300.0) == 300.0


def test_missing_host_proc_is_a_one_line_reason(tmp_path, capsys):
    assert main(["once", "--no-kubernetes", "--host-proc", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--host-proc" in err
