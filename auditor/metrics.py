"""The auditor's Prometheus metrics, declared once here; names and labels as in ``docs/metrics.md``.

Per-container series come from the latest audit only: a collector renders the last result at scrape time, so
a container that went away stops being exported at the next cycle (no stale series to clear by hand). When cycles
keep failing (kubelet down, NVML gone), the latest result grows old: past ``stale_after`` seconds (the health
window, ``--interval`` × ``--unhealthy-after``) none of its series are exported, so that Prometheus and chargeback
see the outage as missing data rather than bill the last good cycle's memory for as long as the outage lasts.
Cycle health (duration, last success, failures, kubelet calls) uses ordinary prometheus_client metrics and is
always exported.

A private ``CollectorRegistry`` per auditor keeps tests independent and the process's default metrics out.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpu_fence import metric_names as names

from .model import (
    Activity,
    AuditResult,
    ContainerRef,
    DraResolution,
    FailureReason,
    FindingKind,
    NodeSnapshot,
    SliceState,
)
from .podresources.calls import METHODS as KUBELET_METHODS
from .podresources.calls import KubeletFailure, KubeletMethod

CYCLE_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
#: The per-container activity gauges: name, what the engine is, and the ``Activity`` field it exports.
ACTIVITY_GAUGES = (
    (names.CONTAINER_SM_ACTIVITY, "SM (3D/compute)", "sm"),
    (names.CONTAINER_MEMORY_CONTROLLER_ACTIVITY, "memory controller", "memory_controller"),
    (names.CONTAINER_ENCODER_ACTIVITY, "video encoder", "encoder"),
    (names.CONTAINER_DECODER_ACTIVITY, "video decoder", "decoder"),
)


def _who(node: str, ref: ContainerRef) -> tuple[str, str, str, str]:
    """The ``node``, ``namespace``, ``pod`` and ``container`` labels of a container's series: a container known by
    id alone is ``id:`` and the id's first 12 characters."""
    if ref.container is not None:
        container = ref.container
    else:
        container = f"id:{ref.container_id[:12]}" if ref.container_id else ""
    return (node, ref.namespace or "", ref.pod or "", container)


class _LatestAudit(Collector):
    """Renders the per-container and per-GPU series of the latest audit, while it is younger than ``stale_after``."""

    def __init__(
        self,
        node: str,
        pod_label_keys: Iterable[str],
        *,
        stale_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.node = node
        self.pod_label_keys = tuple(dict.fromkeys(pod_label_keys))  # a key given twice is one label
        self.stale_after = stale_after
        self._clock = clock
        self._lock = threading.Lock()
        self._latest: tuple[NodeSnapshot, AuditResult] | None = None
        self._updated_at = 0.0

    def update(self, snapshot: NodeSnapshot, result: AuditResult) -> None:
        with self._lock:
            self._latest = (snapshot, result)
            self._updated_at = self._clock()

    def current(self) -> tuple[NodeSnapshot, AuditResult] | None:
        """The latest audit, or None when there is none yet or it is older than ``stale_after``."""
        with self._lock:
            latest, updated_at = self._latest, self._updated_at
        if latest is not None and self.stale_after is not None and self._clock() - updated_at > self.stale_after:
            return None
        return latest

    def collect(self) -> Iterable[GaugeMetricFamily]:
        latest = self.current()
        container_labels = list(names.CONTAINER_LABELS)
        memory = GaugeMetricFamily(
            names.CONTAINER_MEMORY,
            "GPU memory used by the container's processes on that GPU or MIG device (NVML); allocated=false is "
            "overreach, allocated=unknown memory beside a DRA device that could not be resolved.",
            labels=[*container_labels, "gpu_uuid", "allocated"],
        )
        allocated = GaugeMetricFamily(
            names.CONTAINER_ALLOCATED,
            "Kubelet allocation ids the container holds on that GPU or MIG device (a replica counts 1).",
            labels=[*container_labels, "gpu_uuid"],
        )
        unknown = GaugeMetricFamily(
            names.CONTAINER_UNKNOWN_MEMORY,
            "Processes of the container on that GPU or MIG device whose memory NVML did not report (their bytes are "
            "missing from gpu_fence_container_gpu_memory_bytes, not zero).",
            labels=[*container_labels, "gpu_uuid"],
        )
        findings = GaugeMetricFamily(
            names.OVERREACH_FINDINGS,
            "Findings of the latest cycle per container and kind.",
            labels=[*container_labels, "kind"],
        )
        unattributed = GaugeMetricFamily(
            names.UNATTRIBUTED_MEMORY,
            "GPU memory of processes outside any known container (absent where NVML could not list the processes).",
            labels=["node", "gpu_uuid"],
        )
        unattributed_unknown = GaugeMetricFamily(
            names.UNATTRIBUTED_UNKNOWN_MEMORY,
            "Processes outside any known container on that GPU or MIG device whose memory NVML did not report (their "
            "bytes are missing from gpu_fence_unattributed_gpu_memory_bytes, not zero).",
            labels=["node", "gpu_uuid"],
        )
        unlisted = GaugeMetricFamily(
            names.GPU_PROCESSES_UNKNOWN,
            "1 for a GPU or MIG device whose processes NVML could not list this cycle, with NVML's reason: its "
            "unattributed memory is unknown, and so absent.",
            labels=["node", "gpu_uuid", "reason"],
        )
        info = GaugeMetricFamily(
            names.GPU_INFO,
            "One series per GPU and MIG device the auditor sees.",
            labels=list(names.GPU_INFO_LABELS),
        )
        total = GaugeMetricFamily(
            names.GPU_MEMORY_TOTAL, "Memory of the GPU or MIG device.", labels=["node", "gpu_uuid"]
        )
        share = GaugeMetricFamily(
            names.GPU_SHARE,
            "Share of the physical card this device stands for (1 for a full GPU).",
            labels=["node", "gpu_uuid"],
        )
        activity = [
            GaugeMetricFamily(
                name,
                f"Share of time (0-1) the {engine} of that GPU ran the container's processes since the previous cycle "
                "(NVML per-process utilisation samples). Operational, not a billing basis; absent where it is unknown "
                "(gpu_fence_gpu_activity_unknown says why: MIG, MPS, ...).",
                labels=[*container_labels, "gpu_uuid", "allocated"],
            )
            for name, engine, _ in ACTIVITY_GAUGES
        ]
        sampled = GaugeMetricFamily(
            names.GPU_ACTIVITY_SAMPLED,
            "1 when NVML reported per-process utilisation for the GPU in the latest cycle and it is the processes' "
            "own; 0 when not (gpu_fence_gpu_activity_unknown says why): the activity gauges are then absent, not zero.",
            labels=["node", "gpu_uuid"],
        )
        activity_unknown = GaugeMetricFamily(
            names.GPU_ACTIVITY_UNKNOWN,
            "1 for a GPU or MIG device whose per-process activity is unknown in the latest cycle, with why: mig (NVML "
            "does not sample MIG), mps (MPS clients: NVML reports their work under the MPS server's pid), "
            "not-supported, error.",
            labels=["node", "gpu_uuid", "reason"],
        )
        unresolved_dra = GaugeMetricFamily(
            names.CONTAINER_UNRESOLVED_DRA,
            "DRA devices of GPU drivers the container holds that could not be resolved to a UUID, by reason (they "
            "give no entitlement, and their memory cannot be told from overreach).",
            labels=[*container_labels, "driver", "reason"],
        )
        offered = GaugeMetricFamily(
            names.GPU_OFFERED_REPLICAS,
            "Allocation ids the device plugins offer for that GPU or MIG device (GetAllocatableResources): 1 unshared, "
            "N for N time-slicing or MPS replicas.",
            labels=["node", "gpu_uuid"],
        )
        pod_labels = GaugeMetricFamily(
            names.POD_LABELS,
            "Pod labels chosen with --pod-label, for chargeback grouping.",
            labels=["namespace", "pod", *(names.label_name(key) for key in self.pod_label_keys)],
        )
        if latest is not None:
            snapshot, result = latest
            gpus = {gpu.uuid: gpu for gpu in snapshot.gpus}
            memory_values: Tally[tuple[str, ...]] = Tally()
            allocated_values: Tally[tuple[str, ...]] = Tally()
            unknown_values: Tally[tuple[str, ...]] = Tally()
            unresolved_values: Tally[tuple[str, ...]] = Tally()
            finding_values: Tally[tuple[str, ...]] = Tally()
            activity_values: dict[tuple[str, ...], list[Activity]] = {}
            labelled_pods: dict[tuple[str, str], tuple[str, ...]] = {}
            unread = dict(snapshot.unlisted)
            for row in result.rows:
                who = _who(self.node, row.ref)
                allowed = set(row.allocated) | {gpus[u].parent_uuid for u in row.allocated if u in gpus}
                # A DRA device that could not be resolved may be any GPU: outside what is known to be allowed, the
                # container's memory is neither entitled nor overreach, but unknown.
                outside = "unknown" if any(d.uuid is None for d in row.dra_devices) else "false"
                for uuid, size in row.memory_bytes:
                    if uuid not in unread:  # a device whose process lists failed: what is listed is not all
                        memory_values[(*who, uuid, "true" if uuid in allowed else outside)] += size
                for uuid, count in row.allocation_counts:
                    allocated_values[(*who, uuid)] += count
                for uuid, count in row.unknown_memory_processes:
                    unknown_values[(*who, uuid)] += count
                for uuid, busy in row.activity:
                    activity_values.setdefault((*who, uuid, "true" if uuid in allowed else "false"), []).append(busy)
                for device in row.dra_devices:
                    if device.resolution is not DraResolution.RESOLVED:
                        unresolved_values[(*who, device.driver, device.resolution.value)] += 1
                namespace, pod = row.ref.namespace, row.ref.pod
                if self.pod_label_keys and namespace and pod:
                    chosen = dict(row.labels)
                    labelled_pods[(namespace, pod)] = tuple(chosen.get(k, "") for k in self.pod_label_keys)
            for finding in result.findings:
                if finding.kind is FindingKind.UNATTRIBUTED_PROCESS:
                    continue
                finding_values[(*_who(self.node, finding.ref), finding.kind.value)] += 1
            for labels, value in memory_values.items():
                memory.add_metric(list(labels), value)
            for labels, value in allocated_values.items():
                allocated.add_metric(list(labels), value)
            for labels, value in unknown_values.items():
                unknown.add_metric(list(labels), value)
            for labels, value in unresolved_values.items():
                unresolved_dra.add_metric(list(labels), value)
            for labels, value in finding_values.items():
                findings.add_metric(list(labels), value)
            for labels, found in activity_values.items():
                busy = found[0] if len(found) == 1 else Activity.total(found)  # two rows, one label set: add them
                for family, (_, _, field) in zip(activity, ACTIVITY_GAUGES, strict=True):
                    family.add_metric(list(labels), getattr(busy, field))
            unattributed_bytes = dict(result.unattributed_memory_bytes)
            for gpu in snapshot.gpus:
                # Unknown stays unknown: a device whose processes NVML could not list, whose memory or share it could
                # not read, has no series for it (a 0 would be billed as a measurement).
                known_bytes = unattributed_bytes.pop(gpu.uuid, 0)
                if gpu.uuid not in unread:
                    unattributed.add_metric([self.node, gpu.uuid], known_bytes)
                info.add_metric([self.node, gpu.uuid, gpu.parent_uuid or "", gpu.model, gpu.profile], 1)
                if gpu.memory_total_bytes is not None:
                    total.add_metric([self.node, gpu.uuid], gpu.memory_total_bytes)
                if gpu.share is not None:
                    share.add_metric([self.node, gpu.uuid], gpu.share)
                sampled.add_metric([self.node, gpu.uuid], 1 if gpu.uuid in snapshot.activity_devices else 0)
            for uuid, size in unattributed_bytes.items():  # a process on a device NVML did not list (lost mid-read)
                if uuid not in unread:
                    unattributed.add_metric([self.node, uuid], size)
            for uuid, count in result.unattributed_unknown_memory:
                unattributed_unknown.add_metric([self.node, uuid], count)
            for uuid, reason in snapshot.unlisted:
                unlisted.add_metric([self.node, uuid, reason.value], 1)
            for uuid, why in snapshot.activity_unknown:
                activity_unknown.add_metric([self.node, uuid, why.value], 1)
            for uuid, count in snapshot.offered_replicas or ():
                offered.add_metric([self.node, uuid], count)
            for (namespace, pod), values in labelled_pods.items():
                pod_labels.add_metric([namespace, pod, *values], 1)
        yield from (
            memory,
            allocated,
            unknown,
            unresolved_dra,
            findings,
            *activity,
            unattributed,
            unattributed_unknown,
            unlisted,
            info,
            total,
            share,
            sampled,
            activity_unknown,
            offered,
        )
        yield pod_labels


class AuditorMetrics:
    """Every metric of one auditor, in its own registry."""

    def __init__(
        self,
        node: str,
        pod_label_keys: Iterable[str] = (),
        *,
        stale_after: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``stale_after``: seconds after which the latest audit's series stop being exported (None: never)."""
        # prometheus_client would add a ``_created`` series to every counter and histogram: undocumented, and
        # useless to Prometheus (it reads counter resets itself). The switch is process-wide and read at scrape time.
        disable_created_metrics()
        self.registry = CollectorRegistry(auto_describe=True)
        self.latest = _LatestAudit(node, pod_label_keys, stale_after=stale_after, clock=clock)
        self.registry.register(self.latest)
        self.cycle_duration = Histogram(
            "gpu_fence_audit_cycle_duration_seconds",
            "Wall time of one audit cycle.",
            buckets=CYCLE_BUCKETS,
            registry=self.registry,
        )
        self.last_success = Gauge(
            "gpu_fence_audit_last_success_timestamp_seconds",
            "Unix time of the last cycle that completed.",
            registry=self.registry,
        )
        self.failures = Counter(
            "gpu_fence_audit_cycle_failures",
            "Cycles that failed or degraded, by cause.",
            ["reason"],
            registry=self.registry,
        )
        self.kubelet_calls = Counter(
            "gpu_fence_audit_kubelet_calls",
            "PodResources calls made (one List per cycle).",
            ["method"],
            registry=self.registry,
        )
        self.kubelet_failures = Counter(
            "gpu_fence_audit_kubelet_call_failures",
            "PodResources calls that failed, by method and reason (a failed List also fails its cycle).",
            ["method", "reason"],
            registry=self.registry,
        )
        self.dra_slices = Gauge(
            "gpu_fence_dra_slices_state",
            "What the auditor holds of its node's ResourceSlices: 1 for the current state, 0 for the others.",
            ["state"],
            registry=self.registry,
        )
        # Every label set known before the first cycle is exported at 0 from start: increase() and rate() see an
        # event only as a rise between two samples, so a series that the first event creates is never seen to rise.
        for reason in FailureReason:
            self.failures.labels(reason=reason.value)
        for method in KUBELET_METHODS:
            self.kubelet_calls.labels(method=method.value)
            for kubelet_failure in KubeletFailure:
                self.kubelet_failures.labels(method=method.value, reason=kubelet_failure.value)
        self._kubelet_seen: Tally[tuple[str, ...]] = Tally()
        self._failures_seen: Tally[tuple[str, ...]] = Tally()

    def observe(self, snapshot: NodeSnapshot, result: AuditResult, duration: float) -> None:
        self.latest.update(snapshot, result)
        self.cycle_duration.observe(duration)
        self.last_success.set(snapshot.time + duration)
        for state in SliceState:
            self.dra_slices.labels(state=state.value).set(1 if state is snapshot.dra_slices else 0)

    def failed(self, reason: FailureReason) -> None:
        self.failures.labels(reason=reason.value).inc()

    def sync_kubelet_calls(
        self,
        calls: Mapping[KubeletMethod, int],
        failures: Mapping[tuple[KubeletMethod, KubeletFailure], int] | None = None,
    ) -> None:
        """Add the PodResources client's own call and failure counts since the last sync (the client counts, we
        export)."""
        _add_since(self.kubelet_calls, self._kubelet_seen, (((method,), n) for method, n in calls.items()))
        _add_since(self.kubelet_failures, self._failures_seen, (failures or {}).items())

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


def _add_since(counter: Counter, seen: Tally[tuple[str, ...]], counts: Iterable[tuple[tuple[str, ...], int]]) -> None:
    """Increase ``counter`` (labels in its order) by what ``counts`` (labels, count) grew since ``seen``, and remember
    it."""
    for labels, count in counts:
        delta = count - seen[labels]
        if delta > 0:
            counter.labels(*labels).inc(delta)
            seen[labels] = count
