"""The auditor's metrics rendered from a hand-written audit: what is exported, and when it stops being exported."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_fence.auditor.audit import audit
from gpu_fence.auditor.metrics import ACTIVITY_GAUGES, AuditorMetrics
from gpu_fence.auditor.model import (
    Activity,
    ActivityUnknown,
    ClaimedDevice,
    Container,
    DraResolution,
    FailureReason,
    Gpu,
    GpuProcess,
    NodeSnapshot,
    NvmlReason,
    SliceState,
)
from gpu_fence.metric_names import label_name

G0, G1 = "GPU-0", "GPU-1"
GIB = 2**30
GPUS = (Gpu(G0, 0, 0, "H100", 80 * GIB), Gpu(G1, 1, 1, "H100", 80 * GIB))
ATTRIBUTION = (
    "gpu_fence_container_gpu_memory_bytes",
    "gpu_fence_container_allocated_gpus",
    "gpu_fence_container_gpu_processes_unknown_memory",
    "gpu_fence_overreach_findings",
    "gpu_fence_unattributed_gpu_memory_bytes",
    "gpu_fence_gpu_info",
    "gpu_fence_gpu_memory_total_bytes",
    "gpu_fence_gpu_share_ratio",
    "gpu_fence_gpu_activity_sampled",
    "gpu_fence_gpu_offered_replicas",
    "gpu_fence_container_unresolved_dra_devices",
    "gpu_fence_pod_labels",
    *(name for name, _, _ in ACTIVITY_GAUGES),
)
UNRESOLVED = ClaimedDevice(
    "ml", "big", "gpu.nvidia.com", "n", "gpu-9", ("k8s.gpu.nvidia.com/claim=u-gpu-9",), DraResolution.NO_SLICE
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def names(metrics: AuditorMetrics) -> set[str]:
    """Sample names present in one scrape."""
    return {
        sample.name
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    }


def samples(metrics: AuditorMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(sample name, sorted labels) → value, from one scrape."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics.exposition().decode())
        for sample in family.samples
    }


def total(metrics: AuditorMetrics, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples that carry ``labels``."""
    return sum(v for (n, ls), v in samples(metrics).items() if n == name and set(labels.items()) <= set(ls))


def busy_node() -> NodeSnapshot:
    train = Container("ml", "train", "main", "uid-1", "c1", allocated=(G0,), labels=(("team", "vision"),))
    claimed = Container("ml", "big", "main", "uid-3", "c3", dra_devices=(UNRESOLVED,))
    return NodeSnapshot(
        "n",
        0.0,
        GPUS,
        (train, Container("web", "cuda", "app", "uid-2", "c2"), claimed),
        (
            GpuProcess(1, G0, GIB, "uid-1", "c1", activity=Activity(sm=0.5)),
            GpuProcess(2, G1, GIB, "uid-2", "c2", activity=Activity(sm=0.25, decoder=0.5)),
            GpuProcess(3, G1, GIB),
            GpuProcess(4, G0, None, "uid-1", "c1", activity=Activity(sm=0.25, memory_controller=0.125)),
        ),
        activity_devices=frozenset({G0, G1}),
        dra_slices=SliceState.FRESH,
        offered_replicas=((G0, 1), (G1, 4)),
    )


def test_attribution_series_vanish_once_the_latest_audit_is_older_than_the_health_window():
    """Cycles failing (kubelet down) must not leave the last good cycle's memory on /metrics to be billed again."""
    clock = Clock()
    metrics = AuditorMetrics("n", ["team"], stale_after=90.0, clock=clock)
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    metrics.sync_kubelet_calls({"List": 1})
    assert set(ATTRIBUTION) <= names(metrics)
    clock.now += 90  # exactly the window: still fresh
    assert set(ATTRIBUTION) <= names(metrics)
    clock.now += 1
    metrics.failed(FailureReason.KUBELET)
    present = names(metrics)
    assert not present & set(ATTRIBUTION)
    # health, failures and cycle metrics stay: they are how the outage is seen
    assert {
        "gpu_fence_audit_last_success_timestamp_seconds",
        "gpu_fence_audit_cycle_failures_total",
        "gpu_fence_audit_cycle_duration_seconds_count",
        "gpu_fence_audit_kubelet_calls_total",
    } - present == set()
    metrics.observe(snapshot, audit(snapshot), 0.01)  # a cycle succeeds again
    assert set(ATTRIBUTION) <= names(metrics)


def test_without_a_window_the_latest_audit_never_goes_stale():
    clock = Clock()
    metrics = AuditorMetrics("n", clock=clock)
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    clock.now += 10**6
    assert "gpu_fence_container_gpu_memory_bytes" in names(metrics)


def test_processes_of_unknown_memory_are_counted_beside_the_memory_gauge():
    snapshot = NodeSnapshot(
        "n",
        0.0,
        GPUS,
        (Container("ml", "train", "main", "uid-1", "c1", allocated=(G0,)),),
        (
            GpuProcess(1, G0, None, "uid-1", "c1"),
            GpuProcess(2, G0, None, "uid-1", "c1"),
            GpuProcess(3, G1, GIB, "uid-1", "c1"),
        ),
    )
    metrics = AuditorMetrics("n")
    metrics.observe(snapshot, audit(snapshot), 0.01)
    found = samples(metrics)

    def key(name: str, **labels: str) -> tuple:
        who = {"node": "n", "namespace": "ml", "pod": "train", "container": "main"}
        return (name, tuple(sorted((who | labels).items())))

    unknown = "gpu_fence_container_gpu_processes_unknown_memory"
    assert found[key(unknown, gpu_uuid=G0)] == 2
    assert key(unknown, gpu_uuid=G1) not in found  # every process there is measured
    assert found[key("gpu_fence_container_gpu_memory_bytes", gpu_uuid=G0, allocated="true")] == 0


def test_no_created_series_are_exposed():
    """prometheus_client adds a ``_created`` series per counter and histogram; docs/metrics.md documents none."""
    import prometheus_client

    prometheus_client.enable_created_metrics()  # as in a fresh process, whatever other tests did
    metrics = AuditorMetrics("n")
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    metrics.failed(FailureReason.KUBELET)
    metrics.sync_kubelet_calls({"List": 1})
    present = names(metrics)
    assert "gpu_fence_audit_cycle_failures_total" in present
    assert not [name for name in present if name.endswith("_created")]


def test_every_exported_family_is_documented():
    """docs/metrics.md is the names contract: each family the auditor exports has its row there."""
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "metrics.md").read_text()
    metrics = AuditorMetrics("n", ["team"])
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    metrics.sync_kubelet_calls({"List": 1}, {("GetAllocatableResources", "unimplemented"): 1})
    families = {family.name for family in text_string_to_metric_families(metrics.exposition().decode())}
    assert len(families) >= 13
    for family in families:
        documented = f"`{family}_total`" if f"{family}_total" in names(metrics) else f"`{family}`"
        assert f"| {documented} |" in doc, family


def test_each_cycle_renders_the_latest_audit_only():
    """A container gone from the latest audit is gone from the scrape, with no stale series to clear by hand."""
    first = NodeSnapshot(
        "n", 0.0, GPUS, (Container("a", "p", "c", "u", "c1", allocated=(G0,)),), (GpuProcess(1, G1, GIB, "u", "c1"),)
    )
    metrics = AuditorMetrics("n")
    metrics.observe(first, audit(first), 0.01)
    assert total(metrics, "gpu_fence_container_gpu_memory_bytes", allocated="false") == GIB
    empty = NodeSnapshot("n", 1.0, GPUS, (), ())
    metrics.observe(empty, audit(empty), 0.01)
    assert total(metrics, "gpu_fence_container_gpu_memory_bytes") == 0
    assert total(metrics, "gpu_fence_gpu_share_ratio", gpu_uuid=G1) == 1
    assert label_name("app.kubernetes.io/part-of") == "label_app_kubernetes_io_part_of"


def test_every_failure_reason_is_exported_from_the_start_and_counted_by_its_own_label():
    metrics = AuditorMetrics("n")
    failures = "gpu_fence_audit_cycle_failures_total"
    assert {reason: total(metrics, failures, reason=reason.value) for reason in FailureReason} == dict.fromkeys(
        FailureReason, 0.0
    )
    metrics.failed(FailureReason.KUBERNETES_API)
    metrics.failed(FailureReason.KUBERNETES_API)
    metrics.failed(FailureReason.PROC)
    assert total(metrics, failures, reason="kubernetes-api") == 2 and total(metrics, failures, reason="proc") == 1
    assert total(metrics, failures) == 3


def test_activity_gauges_per_container_and_gpu_with_the_allocated_label():
    metrics = AuditorMetrics("n")
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    found = samples(metrics)

    def key(name: str, who: tuple[str, str, str], **labels: str) -> tuple:
        namespace, pod, container = who
        base = {"node": "n", "namespace": namespace, "pod": pod, "container": container}
        return (name, tuple(sorted((base | labels).items())))

    train, cuda = ("ml", "train", "main"), ("web", "cuda", "app")
    sm, memory, encoder, decoder = (name for name, _, _ in ACTIVITY_GAUGES)
    assert found[key(sm, train, gpu_uuid=G0, allocated="true")] == 0.75  # two processes summed
    assert found[key(memory, train, gpu_uuid=G0, allocated="true")] == 0.125
    assert found[key(encoder, train, gpu_uuid=G0, allocated="true")] == 0
    assert found[key(sm, cuda, gpu_uuid=G1, allocated="false")] == 0.25  # overreach keeps its label
    assert found[key(decoder, cuda, gpu_uuid=G1, allocated="false")] == 0.5
    assert found[("gpu_fence_gpu_activity_sampled", (("gpu_uuid", G0), ("node", "n")))] == 1


@pytest.mark.parametrize("why", list(ActivityUnknown))
def test_a_device_whose_activity_is_unknown_has_no_activity_series_and_says_why(why: ActivityUnknown):
    snapshot = NodeSnapshot(
        "n",
        0.0,
        GPUS,
        (Container("ml", "train", "main", "uid-1", "c1", allocated=(G0, G1)),),
        (GpuProcess(1, G1, GIB, "uid-1", "c1"),),
        activity_devices=frozenset({G0}),
        activity_unknown=((G1, why),),
    )
    metrics = AuditorMetrics("n")
    metrics.observe(snapshot, audit(snapshot), 0.01)

    for name, _, _ in ACTIVITY_GAUGES:
        assert total(metrics, name, gpu_uuid=G0) == 0 and (name, G0) in series_of(metrics, name)  # held, idle
        assert (name, G1) not in series_of(metrics, name)  # unknown: absent, not 0
    assert total(metrics, "gpu_fence_gpu_activity_sampled", gpu_uuid=G0) == 1
    assert ("gpu_fence_gpu_activity_sampled", G1) in series_of(metrics, "gpu_fence_gpu_activity_sampled")
    assert total(metrics, "gpu_fence_gpu_activity_sampled", gpu_uuid=G1) == 0
    unknown = {(n, labels) for (n, labels) in samples(metrics) if n == "gpu_fence_gpu_activity_unknown"}
    assert unknown == {("gpu_fence_gpu_activity_unknown", (("gpu_uuid", G1), ("node", "n"), ("reason", why.value)))}
    assert total(metrics, "gpu_fence_gpu_activity_unknown") == 1


def series_of(metrics: AuditorMetrics, name: str) -> set[tuple[str, str]]:
    """(name, gpu_uuid) of each series of ``name`` in one scrape."""
    return {(n, dict(labels)["gpu_uuid"]) for (n, labels) in samples(metrics) if n == name}


def test_unknown_stays_unknown_a_device_nvml_could_not_list_or_measure_has_no_series_for_it():
    """NVML could not list GPU-1's processes (a 0 there would be billed as 'nothing ran'); GPU-0's memory total and
    share could not be read; an unattributed process on GPU-0 reported no memory."""
    gpus = (Gpu(G0, 0, 0, "H100", None, share=None), Gpu(G1, 1, 1, "H100", 80 * GIB))
    snapshot = NodeSnapshot(
        "n",
        0.0,
        gpus,
        (Container("ml", "train", "main", "uid-1", "c1", allocated=(G1,)),),
        (GpuProcess(1, G1, GIB, "uid-1", "c1"), GpuProcess(2, G0, GIB), GpuProcess(3, G0, None)),
        unlisted=((G1, NvmlReason.NO_PERMISSION),),
    )
    metrics = AuditorMetrics("n")
    metrics.observe(snapshot, audit(snapshot), 0.01)
    found = samples(metrics)
    assert total(metrics, "gpu_fence_unattributed_gpu_memory_bytes", gpu_uuid=G0) == GIB  # known sizes only
    assert not [k for k in found if k[0] == "gpu_fence_unattributed_gpu_memory_bytes" and ("gpu_uuid", G1) in k[1]]
    assert not [k for k in found if k[0] == "gpu_fence_container_gpu_memory_bytes" and ("gpu_uuid", G1) in k[1]]
    assert total(metrics, "gpu_fence_container_allocated_gpus", gpu_uuid=G1) == 1  # the kubelet's word stands
    assert found[("gpu_fence_gpu_processes_unknown", (("gpu_uuid", G1), ("node", "n"), ("reason", "no-permission")))]
    assert total(metrics, "gpu_fence_unattributed_gpu_processes_unknown_memory", gpu_uuid=G0) == 1
    for name in ("gpu_fence_gpu_memory_total_bytes", "gpu_fence_gpu_share_ratio"):
        assert [k for k in found if k[0] == name] == [(name, (("gpu_uuid", G1), ("node", "n")))]


def test_offered_replicas_are_the_latest_answer_and_absent_while_unknown():
    metrics = AuditorMetrics("n")
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    offered = "gpu_fence_gpu_offered_replicas"
    assert total(metrics, offered, gpu_uuid=G0) == 1 and total(metrics, offered, gpu_uuid=G1) == 4
    assert {dict(labels)["node"] for name, labels in samples(metrics) if name == offered} == {"n"}
    unknown = NodeSnapshot("n", 1.0, GPUS, (), (), offered_replicas=None)
    metrics.observe(unknown, audit(unknown), 0.01)
    assert offered not in names(metrics)


def test_unresolved_dra_devices_are_counted_per_container_driver_and_reason():
    metrics = AuditorMetrics("n")
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    key = (
        "gpu_fence_container_unresolved_dra_devices",
        tuple(
            sorted(
                {
                    "node": "n",
                    "namespace": "ml",
                    "pod": "big",
                    "container": "main",
                    "driver": "gpu.nvidia.com",
                    "reason": "no-slice",
                }.items()
            )
        ),
    )
    found = samples(metrics)
    assert found[key] == 1
    assert [k for k in found if k[0] == key[0]] == [key]  # resolved devices and other containers: no series


def test_the_slice_state_is_one_of_its_values():
    metrics = AuditorMetrics("n")
    snapshot = busy_node()
    metrics.observe(snapshot, audit(snapshot), 0.01)
    state = "gpu_fence_dra_slices_state"
    assert {s.value: total(metrics, state, state=s.value) for s in SliceState} == {
        s.value: float(s is SliceState.FRESH) for s in SliceState
    }
    stale = NodeSnapshot("n", 1.0, GPUS, (), (), dra_slices=SliceState.STALE)
    metrics.observe(stale, audit(stale), 0.01)
    assert total(metrics, state, state="stale") == 1 and total(metrics, state) == 1


def test_kubelet_call_failures_are_added_as_the_client_counts_them():
    metrics = AuditorMetrics("n")
    failed = "gpu_fence_audit_kubelet_call_failures_total"
    metrics.sync_kubelet_calls({"List": 3, "GetAllocatableResources": 1}, {("GetAllocatableResources", "timeout"): 1})
    metrics.sync_kubelet_calls({"List": 4, "GetAllocatableResources": 2}, {("GetAllocatableResources", "timeout"): 2})
    assert total(metrics, failed, method="GetAllocatableResources", reason="timeout") == 2
    assert total(metrics, "gpu_fence_audit_kubelet_calls_total", method="List") == 4


def test_memory_beside_an_unresolved_dra_device_is_allocated_unknown_not_overreach():
    """The device the kubelet could not name may be the very GPU the process uses: neither true nor false; memory on
    a GPU the container is known to hold stays true, and a container without DRA devices keeps false."""
    held = Container("ml", "big", "main", "uid-3", "c3", allocated=(G0,), dra_devices=(UNRESOLVED,))
    plain = Container("web", "cuda", "app", "uid-2", "c2")
    snapshot = NodeSnapshot(
        "n",
        0.0,
        GPUS,
        (held, plain),
        (
            GpuProcess(1, G0, GIB, "uid-3", "c3"),
            GpuProcess(2, G1, 2 * GIB, "uid-3", "c3"),
            GpuProcess(3, G1, GIB, "uid-2", "c2"),
        ),
        dra_slices=SliceState.STALE,
    )
    metrics = AuditorMetrics("n")
    metrics.observe(snapshot, audit(snapshot), 0.01)
    memory = "gpu_fence_container_gpu_memory_bytes"
    assert {
        (dict(labels)["pod"], dict(labels)["gpu_uuid"], dict(labels)["allocated"]): value
        for (name, labels), value in samples(metrics).items()
        if name == memory
    } == {("big", G0, "true"): GIB, ("big", G1, "unknown"): 2 * GIB, ("cuda", G1, "false"): GIB}


def test_kubelet_calls_and_their_failures_are_exported_at_zero_from_the_start():
    """An alert on increase() sees the first failure only as a rise from an earlier sample of the same series."""
    from gpu_fence.auditor.podresources.calls import METHODS, KubeletFailure

    families = {f.name: f for f in text_string_to_metric_families(AuditorMetrics("n").exposition().decode())}
    calls = {s.labels["method"]: s.value for s in families["gpu_fence_audit_kubelet_calls"].samples}
    assert calls == dict.fromkeys(("List", "GetAllocatableResources"), 0.0) and set(METHODS) == set(calls)
    failures = {
        (s.labels["method"], s.labels["reason"]): s.value
        for s in families["gpu_fence_audit_kubelet_call_failures"].samples
    }
    assert failures == {(method, reason): 0.0 for method in METHODS for reason in KubeletFailure}
