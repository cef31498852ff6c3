"""End-to-end scenarios: a described node (fake NVML, real gRPC PodResources, real /proc tree, API fake) audited
by ``gpu-fence-auditor once``, in process through ``auditor.cli.main`` and once through the real console script."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.auditor.cli import build_parser, main
from gpu_fence.auditor.daemon import Auditor
from gpu_fence.auditor.metrics import ACTIVITY_GAUGES, AuditorMetrics
from gpu_fence.auditor.settings import AuditSettings
from tests.fakes.hostproc_tree import plant_fifo, plant_symlink
from tests.fakes.node_scenario import Ctr, DraRef, NodeScenario, cgroup_layouts, replica_holder, uuid_of
from tests.fakes.nvml import GIB, FakeError
from tests.fakes.processes import run_captured

pytestmark = pytest.mark.e2e
CONSOLE_SCRIPT = Path(sys.executable).with_name("gpu-fence-auditor")


@pytest.fixture
def node(tmp_path, monkeypatch):
    made: list[NodeScenario] = []

    def build(**options) -> NodeScenario:
        scenario = NodeScenario(tmp_path / f"node{len(made)}", **options)
        made.append(scenario)
        return scenario

    monkeypatch.delenv("NODE_NAME", raising=False)
    yield build
    for scenario in made:
        scenario.stop()


def audit_json(scenario: NodeScenario, monkeypatch, capsys, *extra: str, kubernetes: bool | None = None):
    """Start the scenario if needed, run ``once --format json`` in process; (exit code, report)."""
    if scenario.kubelet is None:
        scenario.start()
    monkeypatch.setenv("FAKE_NVML_CONFIG", str(scenario.write_nvml()))
    capsys.readouterr()
    code = main(scenario.args("once", "--format", "json", *extra, kubernetes=kubernetes))
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else None), err


def console_script(scenario: NodeScenario, *extra: str) -> subprocess.CompletedProcess[str]:
    """``gpu-fence-auditor once`` as the image runs it, a process of its own with a deadline: one that hangs fails."""
    return run_captured([str(CONSOLE_SCRIPT), *scenario.args("once", *extra)], timeout=60, env=scenario.env())


def kinds(report) -> list[tuple[str, str | None, str | None]]:
    return sorted((f["kind"], f["container"], f["gpu"]) for f in report["findings"])


def row(report, pod: str, container: str | None = None):
    rows = report["containers"]
    return next(r for r in rows if r["pod"] == pod and (container is None or r["container"] == container))


def test_exclusive_gpus_are_clean(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod(
        "ml",
        "a",
        Ctr("main", allocated=[0], visible=[0], processes=[(0, 5 * GIB)], env={"NVIDIA_VISIBLE_DEVICES": uuid_of(0)}),
    )
    scenario.add_pod(
        "ml",
        "b",
        Ctr("main", allocated=[1], visible=[1], processes=[(1, 3 * GIB)]),
        Ctr("sidecar", env={"NVIDIA_VISIBLE_DEVICES": "void"}),
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 0 and report["findings"] == []
    assert report["summary"] == report["summary"] | {"containers": 3, "gpus": 2, "findings": 0}
    assert row(report, "a")["memory_bytes"] == {uuid_of(0): 5 * GIB}
    assert row(report, "b", "main")["identity"] == "kubernetes"
    assert all(r["pod_uid"] for r in report["containers"])


def test_cuda_container_without_allocation_using_a_gpu(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod("ml", "train", Ctr("main", allocated=[0], visible=[0], processes=[(0, GIB)]))
    scenario.add_pod(
        "web", "notebook", Ctr("jupyter", visible=[1], processes=[(1, 7 * GIB)], env={"NVIDIA_VISIBLE_DEVICES": "all"})
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    used = [f for f in report["findings"] if f["kind"] == "used-unallocated"]
    assert len(used) == 1
    assert used[0] | {"message": ""} == used[0] | {
        "namespace": "web",
        "pod": "notebook",
        "container": "jupyter",
        "gpu": uuid_of(1),
        "pid": scenario.container("notebook", "jupyter").pids[1],
        "memory_bytes": 7 * GIB,
        "message": "",
    }
    assert ("env-mismatch", "jupyter", None) in kinds(report)
    assert ("visible-unallocated", "jupyter", uuid_of(1)) in kinds(report)


def test_time_sliced_sharing_is_legitimate(node, monkeypatch, capsys):
    scenario = node(gpus=1)
    for replica in range(4):
        scenario.add_pod("ml", f"infer-{replica}", replica_holder(0, replica, (replica + 1) * GIB))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 0, report["findings"]
    assert sum(r["memory_bytes"].get(uuid_of(0), 0) for r in report["containers"]) == 10 * GIB
    assert all(r["allocation_counts"] == {uuid_of(0): 1} for r in report["containers"])


def test_activity_per_container_on_a_time_sliced_card_and_none_on_mig(node, monkeypatch, capsys):
    """Three pods share a time-sliced card, each busy its own share; a MIG slice beside it has no activity figure
    (NVML does not sample MIG), and a pod holding a replica without a process is idle, not unknown."""
    scenario = node(gpus=2, mig_slots={1: 2})
    for replica, (sm, memory) in enumerate([(50, 20), (30, 5), (0, 0)]):
        holder = replica_holder(0, replica, GIB, activity=(sm, memory, 0, 0) if sm else None)
        scenario.add_pod("ml", f"infer-{replica}", holder)
    scenario.add_pod("ml", "waiting", Ctr("main", allocated=[0], device_ids=[f"{uuid_of(0)}::3"], visible=[0]))
    scenario.add_pod(
        "ml",
        "slice",
        Ctr("main", allocated=["1:0"], resource="nvidia.com/mig-1g.10gb", visible=["1:0"], processes=[("1:0", GIB)]),
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 0, report["findings"]

    def sm(pod: str) -> dict[str, float]:
        return {uuid: busy["sm"] for uuid, busy in row(report, pod)["gpu_activity"].items()}

    assert sm("infer-0") == {uuid_of(0): 0.5}
    assert row(report, "infer-0")["gpu_activity"][uuid_of(0)]["memory_controller"] == 0.2
    assert sm("infer-1") == {uuid_of(0): 0.3}
    assert sm("infer-2") == sm("waiting") == {uuid_of(0): 0.0}  # a process that did nothing; a replica unused
    assert sm("slice") == {}  # unknown on MIG, never 0


def test_busy_mps_clients_have_no_activity_number_and_a_time_sliced_card_keeps_its_numbers(node, monkeypatch, capsys):
    """As a real driver does under MPS (H200, 580.159.04): clients in both process lists with their own memory, the
    server in the compute list with its own, every sample on the server's pid. GPU 0's server runs in the device
    plugin's MPS control daemon pod, GPU 1's on the host; GPU 2 is time-sliced."""
    scenario = node(gpus=3)
    daemon = Ctr("mps-control-daemon", processes=[(0, 66 << 20)], mps_server=0)
    scenario.add_pod("gpu-operator", "nvidia-device-plugin-mps-control-daemon", daemon)
    scenario.add_host_gpu_process(1, 66 << 20, mps_server=True)
    sizes = {"a": 4_366_270_464, "b": 5_440_012_288, "c": 1_713_373_184}
    for replica, (name, size) in enumerate(sizes.items()):
        scenario.add_pod("ml", f"mps-{name}", replica_holder(0, replica, size, activity=(60, 20, 0, 0), mps=True))
    scenario.add_pod("ml", "mps-host", replica_holder(1, 0, GIB, activity=(90, 0, 0, 0), mps=True))
    scenario.add_pod("ml", "sliced", replica_holder(2, 0, GIB, activity=(62, 10, 0, 0)))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)

    for name, size in sizes.items():
        client = row(report, f"mps-{name}")
        assert client["memory_bytes"] == {uuid_of(0): size}  # its own bytes, once (it is in both lists)
        assert client["gpu_activity"] == {} and client["gpu_activity_unknown"] == {uuid_of(0): "mps"}
    assert row(report, "mps-host")["gpu_activity_unknown"] == {uuid_of(1): "mps"}
    server = row(report, "nvidia-device-plugin-mps-control-daemon")
    assert server["memory_bytes"] == {uuid_of(0): 66 << 20}  # the server's own memory, on its own container
    assert server["gpu_activity"] == {}  # not the clients' aggregate
    assert report["unattributed_memory_bytes"][uuid_of(1)] == 66 << 20
    assert row(report, "sliced")["gpu_activity"][uuid_of(2)]["sm"] == 0.62
    assert {f["kind"] for f in report["findings"]} <= {
        "used-unallocated",
        "visible-unallocated",
        "unattributed-process",
    }
    assert code == 1  # the daemon pod uses GPU 0 without an allocation; the host server is unattributed

    auditor = Auditor(AuditSettings.from_args(build_parser().parse_args(scenario.args("once"))))
    try:
        auditor.preflight()
        metrics = AuditorMetrics(scenario.node)
        metrics.observe(*auditor.cycle(), 0.01)
    finally:
        auditor.close()
    scraped = [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    ]
    sm = [
        (labels["pod"], labels["gpu_uuid"], value) for name, labels, value in scraped if name == ACTIVITY_GAUGES[0][0]
    ]
    assert sm == [("sliced", uuid_of(2), 0.62)]
    unknown = {
        (labels["gpu_uuid"], labels["reason"])
        for name, labels, _ in scraped
        if name == "gpu_fence_gpu_activity_unknown"
    }
    assert unknown == {(uuid_of(0), "mps"), (uuid_of(1), "mps")}
    sampled = {labels["gpu_uuid"]: value for name, labels, value in scraped if name == "gpu_fence_gpu_activity_sampled"}
    assert sampled == {uuid_of(0): 0, uuid_of(1): 0, uuid_of(2): 1}


def test_mig_process_on_a_sibling_slice(node, monkeypatch, capsys):
    scenario = node(gpus=1, mig_slots={0: 3})
    scenario.add_pod(
        "ml",
        "small",
        Ctr(
            "main",
            allocated=["0:0"],
            resource="nvidia.com/mig-1g.10gb",
            visible=["0:0"],
            processes=[("0:0", GIB), ("0:2", 2 * GIB)],
            env={"NVIDIA_VISIBLE_DEVICES": uuid_of("0:0")},
        ),
    )
    scenario.add_pod(
        "ml",
        "other",
        Ctr("main", allocated=["0:1"], resource="nvidia.com/mig-1g.10gb", visible=["0:1"], processes=[("0:1", GIB)]),
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert kinds(report) == [("used-unallocated", "main", uuid_of("0:2"))]
    assert report["findings"][0]["pod"] == "small" and report["findings"][0]["memory_bytes"] == 2 * GIB
    assert report["summary"]["gpus"] == 1 and report["summary"]["devices"] == 4


def test_container_that_sees_all_gpus_but_uses_none(node, monkeypatch, capsys):
    scenario = node(gpus=3)
    scenario.add_pod("ops", "debug", Ctr("shell", visible="all"))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert kinds(report) == [("visible-unallocated", "shell", uuid_of(i)) for i in range(3)]


def test_host_process_on_a_gpu_is_unattributed(node, monkeypatch, capsys):
    scenario = node(gpus=1)
    pid = scenario.add_host_gpu_process(0, 300 << 20)
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    (finding,) = report["findings"]
    assert finding | {"message": ""} == {
        "kind": "unattributed-process",
        "namespace": None,
        "pod": None,
        "container": None,
        "gpu": uuid_of(0),
        "pid": pid,
        "memory_bytes": 300 << 20,
        "message": "",
        "pod_uid": None,
        "container_id": None,
    }
    assert report["unattributed_memory_bytes"] == {uuid_of(0): 300 << 20}


@pytest.mark.parametrize(("layout", "v1"), list(cgroup_layouts()))
def test_every_cgroup_layout_attributes_processes(node, monkeypatch, capsys, layout, v1):
    scenario = node(gpus=2)
    scenario.add_pod("ml", "ok", Ctr("main", allocated=[0], visible=[0], processes=[(0, GIB)]), layout=layout, v1=v1)
    scenario.add_pod("ml", "bad", Ctr("main", processes=[(1, 2 * GIB)]), layout=layout, v1=v1)
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert [(f["kind"], f["pod"]) for f in report["findings"]] == [("used-unallocated", "bad")]
    assert row(report, "ok")["used"] == [uuid_of(0)]
    assert row(report, "bad")["container_id"] == scenario.container("bad", "main").container_id


def test_exempt_namespace_is_reported_but_not_flagged(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod(
        "gpu-operator",
        "dcgm-exporter",
        Ctr("exporter", visible="all", processes=[(0, 100 << 20)], env={"NVIDIA_VISIBLE_DEVICES": "all"}),
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys, "--exempt-namespace", "gpu-operator")
    assert code == 0 and report["findings"] == []
    assert row(report, "dcgm-exporter")["exempt"] is True
    assert row(report, "dcgm-exporter")["memory_bytes"] == {uuid_of(0): 100 << 20}


def test_kai_fraction_pod_uses_the_gpu_of_its_reservation_pod(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod(
        "kai-resource-reservation",
        "gpu-reservation-node-a-1",
        Ctr("resource-reservation", allocated=[1], visible=[1]),
        labels={"runai-gpu-group": "g-1"},
    )
    scenario.add_pod(
        "team",
        "fraction",
        Ctr("main", visible=[1], processes=[(1, 10 * GIB)], env={"NVIDIA_VISIBLE_DEVICES": "1"}),
        labels={"runai-gpu-group": "g-1"},
        annotations={"gpu-fraction": "0.5"},
        scheduler_name="kai-scheduler",
    )
    scenario.add_pod(
        "team",
        "impostor",
        Ctr("main", visible=[1], processes=[(1, GIB)]),
        labels={"runai-gpu-group": "g-1"},
        annotations={"gpu-fraction": "0.5"},
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert {f["pod"] for f in report["findings"]} == {"impostor"}  # not scheduled by KAI: its label proves nothing
    assert row(report, "fraction")["allocated"] == [uuid_of(1)]


# --- DRA: NVIDIA's DRA driver, device names of every release, slices in every API version ---------------------------

#: A node whose minors are not its indices: GPU 0 is /dev/nvidia2, GPU 1 /dev/nvidia0, GPU 2 (MIG, 3 slices)
#: /dev/nvidia1. A name read as an index or as a minor names the wrong GPU under one release or another.
DRA_NODE = {"gpus": 3, "mig_slots": {2: 3}, "minors": {0: 2, 1: 0, 2: 1}}


def dra_devices(report, pod: str) -> list[tuple[str, str | None, str]]:
    return [(d["device"], d["uuid"], d["resolution"]) for d in row(report, pod)["dra_devices"]]


@pytest.mark.parametrize(
    ("release", "version"),
    [("v25.2", "v1"), ("v25.3", "v1"), ("v25.8", "v1"), ("v25.12", "v1"), ("v25.12", "v1beta2"), ("v25.12", "v1beta1")],
)
def test_a_clean_dra_node_resolves_every_claim_to_its_uuid(node, monkeypatch, capsys, release, version):
    scenario = node(**DRA_NODE, dra_release=release, slice_versions=(version,))
    scenario.add_pod("ml", "full-a", Ctr("main", dra=[0], visible=[0], processes=[(0, 5 * GIB)]))
    scenario.add_pod("ml", "full-b", Ctr("main", dra=[1], visible=[1], processes=[(1, 3 * GIB)]))
    scenario.add_pod("ml", "mig", Ctr("main", dra=["2:1"], visible=["2:1"], processes=[("2:1", GIB)]))
    for n, gib in enumerate((2, 1)):  # one claim, two pods: legitimate sharing, each metered by its own memory
        shared = Ctr("main", dra=["2:0"], claim="shared-slice", visible=["2:0"], processes=[("2:0", gib * GIB)])
        scenario.add_pod("ml", f"infer-{n}", shared)
    imex = Ctr("main", dra=[DraRef("node-a", "channel-0", driver="compute-domain.nvidia.com")])
    scenario.add_pod("ml", "imex", imex)
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 0, report["findings"]
    assert report["summary"]["dra_slices"] == "fresh" and report["notes"] == []
    assert row(report, "full-a")["allocated"] == [uuid_of(0)]
    assert row(report, "full-b")["allocated"] == [uuid_of(1)]
    assert row(report, "mig")["allocated"] == [uuid_of("2:1")]
    assert dra_devices(report, "full-a") == [(scenario.dra_name(0), uuid_of(0), "resolved")]
    assert dra_devices(report, "mig") == [(scenario.dra_name("2:1"), uuid_of("2:1"), "resolved")]
    for n, gib in enumerate((2, 1)):
        infer = row(report, f"infer-{n}")
        assert infer["allocation_counts"] == {uuid_of("2:0"): 1}
        assert infer["memory_bytes"] == {uuid_of("2:0"): gib * GIB}
    assert row(report, "imex")["dra_devices"] == [] and row(report, "imex")["allocated"] == []  # not a GPU driver


def test_a_dra_pod_using_a_gpu_it_does_not_hold_is_found_with_its_bytes(node, monkeypatch, capsys):
    scenario = node(**DRA_NODE, dra_release="v25.12")
    scenario.add_pod("ml", "holder", Ctr("main", dra=[1], visible=[1], processes=[(1, GIB)]))
    scenario.add_pod("ml", "greedy", Ctr("main", dra=[0], visible=[0, 1], processes=[(0, GIB), (1, 6 * GIB)]))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert kinds(report) == [("used-unallocated", "main", uuid_of(1)), ("visible-unallocated", "main", uuid_of(1))]
    used = next(f for f in report["findings"] if f["kind"] == "used-unallocated")
    assert (used["pod"], used["memory_bytes"]) == ("greedy", 6 * GIB)
    assert "/dev/nvidia0" in next(f["message"] for f in report["findings"] if f["kind"] == "visible-unallocated")


def test_a_dra_mig_pod_using_a_sibling_slice_is_found(node, monkeypatch, capsys):
    scenario = node(**DRA_NODE, dra_release="v25.12")
    scenario.add_pod(
        "ml", "small", Ctr("main", dra=["2:0"], visible=["2:0"], processes=[("2:0", GIB), ("2:2", 2 * GIB)])
    )
    scenario.add_pod("ml", "other", Ctr("main", dra=["2:2"], visible=["2:2"], processes=[("2:2", GIB)]))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert kinds(report) == [("used-unallocated", "main", uuid_of("2:2"))]
    (finding,) = report["findings"]
    assert (finding["pod"], finding["memory_bytes"]) == ("small", 2 * GIB)


def test_a_claim_on_a_device_no_slice_describes_is_reported_unresolved(node, monkeypatch, capsys):
    scenario = node(**DRA_NODE, dra_release="v25.12")
    ghost = DraRef("node-a", "gpu-9", cdi=("k8s.gpu.nvidia.com/claim=0f3c-gpu-9",))
    scenario.add_pod("ml", "ghost", Ctr("main", dra=[ghost], visible=[1], processes=[(1, GIB)]))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert dra_devices(report, "ghost") == [("gpu-9", None, "no-slice")]
    assert row(report, "ghost")["allocated"] == []  # never mapped by name
    (used,) = [f for f in report["findings"] if f["kind"] == "used-unallocated"]
    assert "claim ml/main-gpu: gpu.nvidia.com/node-a/gpu-9" in used["message"]
    assert main(scenario.args("once")) == 1
    text = capsys.readouterr().out
    assert "unresolved DRA device: ml/ghost/main: claim ml/main-gpu: gpu.nvidia.com/node-a/gpu-9 (CDI " in text
    assert "): no-slice" in text


@pytest.mark.parametrize(
    "case",
    [
        ("down", "none", "HTTP 503"),
        ("forbidden", "none", "HTTP 403"),
        ("not-served", "not-served", "serves no resource.k8s.io version"),
        ("no-kubernetes", "unused", "--no-kubernetes"),
    ],
    ids=lambda case: case[0],
)
def test_without_slices_claims_are_shown_with_their_names_and_the_report_says_why(node, monkeypatch, capsys, case):
    breakage, state, said = case
    scenario = node(**DRA_NODE, dra_release="v25.12", kubernetes=breakage != "no-kubernetes")
    scenario.add_pod("ml", "train", Ctr("main", dra=[0], visible=[0], processes=[(0, GIB)]))
    scenario.start()
    if breakage == "down":
        scenario.api.down = True
    elif breakage == "forbidden":
        scenario.api.resource_slices.forbidden = True
    elif breakage == "not-served":
        scenario.api.resource_slices.served = ()
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert report["summary"]["dra_slices"] == state
    assert any(said in note and "unresolved" in note for note in report["notes"]), report["notes"]
    (device,) = row(report, "train")["dra_devices"]
    assert device | {"cdi_devices": []} == {
        "claim_namespace": "ml",
        "claim_name": "main-gpu",
        "driver": "gpu.nvidia.com",
        "pool": "node-a",
        "device": scenario.dra_name(0),
        "cdi_devices": [],
        "share_id": None,
        "uuid": None,
        "resolution": "slices-unavailable",
    }
    assert device["cdi_devices"][0].startswith("k8s.gpu.nvidia.com/claim=")
    # no entitlement is guessed: the GPU the claim holds is, as far as the auditor can tell, not allocated; without a
    # pod list nothing ties the running container to train/main (it holds no GPU the auditor can name), so it is
    # reported by uid, as its own files can never name it
    assert code == 1
    flagged = None if breakage in {"down", "no-kubernetes"} else "main"
    assert kinds(report) == [("used-unallocated", flagged, uuid_of(0)), ("visible-unallocated", flagged, uuid_of(0))]


def test_api_down_still_audits_and_names_containers_by_fallback(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod(
        "ml",
        "train",
        Ctr("main", allocated=[0], visible=[0], processes=[(0, GIB)]),
        Ctr("logger", env={"NVIDIA_VISIBLE_DEVICES": "void"}),
    )
    scenario.add_pod("web", "cuda", Ctr("app", processes=[(1, GIB)]))
    scenario.start()
    scenario.api.down = True
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert report["summary"]["identity"] == "fallback"
    assert any("Kubernetes API unavailable" in note for note in report["notes"])
    assert row(report, "train", "main")["identity"] == "fallback"  # it alone holds GPU 0, which it uses
    assert row(report, "train", "main")["pod_uid"] == scenario.pods[0].uid
    app = scenario.container("cuda", "app")
    assert [(f["kind"], f["namespace"], f["container_id"]) for f in report["findings"]] == [
        ("used-unallocated", None, app.container_id)  # nothing the kubelet says names it
    ]
    flagged = next(r for r in report["containers"] if r["container_id"] == app.container_id)
    assert flagged["identity"] == "uid" and flagged["claims"] == {"namespace": "web", "pod": "cuda"}


def test_no_kubernetes_reports_by_uid_when_names_cannot_be_found(node, monkeypatch, capsys):
    scenario = node(gpus=1, kubernetes=False)
    scenario.add_pod("ml", "train", Ctr("a", processes=[(0, GIB)]), Ctr("b", processes=[(0, GIB)]))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    flagged = {(f["pod_uid"], f["container_id"]) for f in report["findings"]}
    expected = {(scenario.pods[0].uid, c.container_id) for c in scenario.pods[0].containers}
    assert flagged == expected  # two unallocated containers of one pod: told apart by container id


def test_nvml_gpu_lost_still_audits_the_other_gpus(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod("ml", "a", Ctr("main", allocated=[0], visible=[0], processes=[(0, GIB)]))
    scenario.add_pod("ml", "b", Ctr("main", processes=[(1, GIB)]))
    scenario.nvml_errors.append(FakeError("nvmlDeviceGetUUID", "GPU_IS_LOST", device=1))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 0
    assert [g["uuid"] for g in report["gpus"]] == [uuid_of(0)]
    assert any(note.startswith("NVML:") for note in report["notes"])


def test_kubelet_socket_missing_exits_2_with_the_reason(node, monkeypatch, capsys):
    scenario = node(gpus=1).start()
    scenario.kubelet.stop()
    code, report, err = audit_json(scenario, monkeypatch, capsys)
    assert code == 2 and report is None
    assert err.count("\n") == 1 and "PodResources socket" in err and "--pod-resources-socket" in err


def test_nvml_library_missing_exits_2_with_the_reason(node, monkeypatch, capsys, tmp_path):
    scenario = node(gpus=1).start()
    args = scenario.args("once")
    args[args.index("--nvml-lib") + 1] = str(tmp_path / "nowhere" / "libnvidia-ml.so.1")
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--nvml-lib" in err


def test_console_script_writes_junit_and_exits_1(node, tmp_path):
    scenario = node(gpus=1)
    scenario.add_pod("web", "cuda", Ctr("app", processes=[(0, GIB)]))
    scenario.start()
    scenario.write_nvml()
    output = tmp_path / "audit.xml"
    done = console_script(scenario, "--format", "junit", "--output", str(output))
    assert done.returncode == 1, done.stderr
    assert done.stdout == "" and 'type="used-unallocated"' in output.read_text()


def test_scaled_down_dense_node_is_clean_with_one_kubelet_call(tmp_path, monkeypatch, capsys):
    from tests.fakes.node_scenario import dense_node

    scenario = dense_node(tmp_path / "dense", gpus=2, slots=3, pods=12, gpu_processes=60, host_processes=300)
    try:
        code, report, _ = audit_json(scenario, monkeypatch, capsys, "--pod-label", "team")
        assert code == 0, report["findings"][:3]
        assert report["summary"] == report["summary"] | {"containers": 48, "gpus": 2, "devices": 8, "findings": 0}
        assert sum(sum(r["memory_bytes"].values()) for r in report["containers"]) == 60 * (64 << 20)
        assert scenario.kubelet.calls["List"] == 1
        assert row(report, "job-0", "main")["labels"] == {"team": "t0"}
    finally:
        scenario.stop()


def test_memory_nvml_does_not_report_is_counted_as_unknown_not_zero(node, monkeypatch, capsys):
    """NVML_VALUE_NOT_AVAILABLE through the real pynvml: the row keeps 0 known bytes and counts the process."""
    scenario = node(gpus=2)
    scenario.add_pod("ml", "blind", Ctr("main", allocated=[0], visible=[0], processes=[(0, None)]))
    scenario.add_pod("ml", "half", Ctr("main", allocated=[1], visible=[1], processes=[(1, 2 * GIB), (1, None)]))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 0, report["findings"]
    assert row(report, "blind")["memory_bytes"] == {uuid_of(0): 0}
    assert row(report, "blind")["unknown_memory_processes"] == {uuid_of(0): 1}
    assert row(report, "half")["memory_bytes"] == {uuid_of(1): 2 * GIB}
    assert row(report, "half")["unknown_memory_processes"] == {uuid_of(1): 1}
    assert main(scenario.args("once")) == 0
    text = capsys.readouterr().out.splitlines()
    assert next(line for line in text if line.startswith("ml/blind/main")).endswith(" unknown")
    assert next(line for line in text if line.startswith("ml/half/main")).endswith("2048 MiB + 1 process unknown")


# --- what a container controls neither steers, hangs nor leaks through the auditor ---------------------------------

NAMESPACE_FILE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"


def test_a_fifo_for_a_namespace_file_does_not_hang_the_cycle_while_the_api_is_down(node, tmp_path):
    """Run as the DaemonSet runs it, a process of its own with a deadline: a cycle that blocked on the FIFO would be
    killed by the deadline and fail the test, not hang the suite."""
    scenario = node(gpus=1)
    scenario.add_pod("web", "cuda", Ctr("app", processes=[(0, GIB)], plant=lambda fs: plant_fifo(fs, NAMESPACE_FILE)))
    scenario.start()
    scenario.api.down = True
    scenario.write_nvml()
    done = console_script(scenario, "--format", "json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    (flagged,) = [r for r in report["containers"] if r["identity"] == "uid"]
    assert flagged["claims"] == {"namespace": None, "pod": "cuda"}  # a FIFO is no claim


def test_a_symlink_to_a_host_file_never_puts_the_host_file_in_the_report(node, monkeypatch, capsys):
    """The auditor's own files (its service-account token, here a stand-in with a name-shaped content, so that only
    resolving inside the container's root keeps it out) never reach the report through a container's symlink."""
    scenario = node(gpus=1)
    host_file = scenario.root / "auditor-token"
    host_file.parent.mkdir(parents=True, exist_ok=True)
    host_file.write_text("host-secret-token")
    escape = "../" * 40 + str(host_file).lstrip("/")

    def links(fs):
        plant_symlink(fs, NAMESPACE_FILE, str(host_file))
        plant_symlink(fs, "etc/hostname", escape)

    scenario.add_pod("web", "cuda", Ctr("app", processes=[(0, GIB)], plant=links))
    scenario.add_pod(
        "web", "rel", Ctr("app", processes=[(0, GIB)], plant=lambda fs: plant_symlink(fs, NAMESPACE_FILE, escape))
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys, kubernetes=False)
    assert code == 1
    assert "host-secret-token" not in json.dumps(report)
    assert {r["pod"] for r in report["containers"] if r["identity"] == "uid"} == {None}


def test_a_spoofed_namespace_file_neither_exempts_nor_renames_a_container(node, monkeypatch, capsys):
    """It writes kube-system (exempt) into its namespace file and the name of a kube-system pod that has not started
    into HOSTNAME: it stays a container known by uid, flagged for the GPU it was never allocated."""
    scenario = node(gpus=2)
    scenario.add_pod("ml", "train", Ctr("main", allocated=[0], visible=[0], processes=[(0, GIB)]))
    scenario.add_pod("kube-system", "coredns-6d4b", Ctr("coredns", running=False))
    scenario.add_pod(
        "web",
        "miner",
        Ctr(
            "app",
            visible=[1],
            processes=[(1, 4 * GIB)],
            namespace_file="kube-system",
            env={"HOSTNAME": "coredns-6d4b", "NVIDIA_VISIBLE_DEVICES": "all"},
        ),
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys, "--exempt-namespace", "kube-system", kubernetes=False)
    assert code == 1
    miner = scenario.container("miner", "app")
    assert {(f["kind"], f["container_id"]) for f in report["findings"]} == {
        ("used-unallocated", miner.container_id),
        ("visible-unallocated", miner.container_id),
        ("env-mismatch", miner.container_id),
    }
    flagged = next(r for r in report["containers"] if r["container_id"] == miner.container_id)
    assert (flagged["namespace"], flagged["exempt"], flagged["identity"]) == (None, False, "uid")
    assert flagged["claims"] == {"namespace": "kube-system", "pod": "coredns-6d4b"}
    coredns = row(report, "coredns-6d4b")
    assert (coredns["identity"], coredns["container_id"]) == ("kubelet", None)
    assert row(report, "train", "main")["identity"] == "fallback"  # the honest container is still named


@pytest.mark.parametrize("lowest", ["chroot", "unshare"])
def test_a_lowest_pid_that_leaves_the_containers_view_hides_no_device_and_no_env(node, monkeypatch, capsys, lowest):
    """The container's lowest pid chroots into an empty tree (or unshares its mounts and covers /dev) and re-execs with
    NVIDIA_VISIBLE_DEVICES=void; its sibling still sees GPU 1 and has NVIDIA_VISIBLE_DEVICES=all."""
    scenario = node(gpus=2)
    scenario.add_pod(
        "web",
        "notebook",
        Ctr(
            "jupyter",
            visible=[1],
            env={"NVIDIA_VISIBLE_DEVICES": "all"},
            extra_processes=1,
            lowest=lowest,
            lowest_env={"NVIDIA_VISIBLE_DEVICES": "void"},
        ),
    )
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    assert kinds(report) == [("env-mismatch", "jupyter", None), ("visible-unallocated", "jupyter", uuid_of(1))]
    assert row(report, "notebook")["visible"] == [uuid_of(1)]


def test_a_process_in_a_cgroup_named_after_another_pod_is_billed_to_its_own_container(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod("ml", "victim", Ctr("main", allocated=[1], visible=[1], processes=[(1, GIB)]))
    scenario.add_pod("web", "thief", Ctr("app", processes=[(1, 6 * GIB)], nested_pod="victim"))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    thief = scenario.container("thief", "app")
    assert [(f["kind"], f["pod"], f["pid"]) for f in report["findings"]] == [
        ("used-unallocated", "thief", thief.gpu_pids[0])
    ]
    assert row(report, "victim")["memory_bytes"] == {uuid_of(1): GIB}  # not billed the thief's 6 GiB
    assert row(report, "thief")["nested_pod_uids"] == [scenario.pods[0].uid]
    assert any("name another pod" in note and "web/thief/app" in note for note in report["notes"])


def test_a_flooded_dev_is_read_up_to_its_bound_and_reported(node, monkeypatch, capsys):
    scenario = node(gpus=2)
    scenario.add_pod("ml", "train", Ctr("main", allocated=[0], visible=[0], processes=[(0, GIB)]))
    scenario.add_pod("web", "flood", Ctr("app", visible=[1], dev_flood=5000))
    code, report, _ = audit_json(scenario, monkeypatch, capsys)
    assert code == 1
    found = {(f["kind"], f["pod"]) for f in report["findings"]}
    assert ("incomplete-view", "flood") in found and {pod for _, pod in found} == {"flood"}
    assert row(report, "flood")["incomplete"] == ["dev-entries"]
