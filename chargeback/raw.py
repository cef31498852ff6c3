"""The bill from the auditor's raw series: the queries, the series → :class:`Interval` conversion, in bounded chunks.

Every query is a ``/api/v1/query_range`` over evaluation instants ``step`` apart, so samples of different metrics
line up by timestamp. Each instant sees the latest sample within Prometheus' lookback (5 minutes by default), the
same value a dashboard would show at that instant. Queries aggregate with ``max by (...)`` over the contract's
labels so that ``job``/``instance`` (and duplicate scrapes after an auditor restart) never count twice.

A long range is fetched a chunk of instants at a time (:func:`stream_intervals`), sized so that a chunk holds about
``CHUNK_SAMPLES`` samples, and each chunk's intervals are booked before the next is asked for: the command never
holds the range whole, whatever its length.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpu_fence import metric_names

from .progress import Progress
from .prometheus import MAX_POINTS_PER_QUERY, PrometheusError, Series, Source
from .samples import Allocation, ContainerRef, Device, Interval, Memory, Offered, SmActivity, Unattributed
from .times import iso

T = TypeVar("T")
NO_LABEL = "(none)"
# Samples one chunk may hold (~100 bytes each once parsed); the first chunk is small, later ones sized from it.
CHUNK_SAMPLES = 1_000_000
FIRST_CHUNK = 24

INFO = f"max by ({', '.join(metric_names.GPU_INFO_LABELS)}) ({metric_names.GPU_INFO})"
SHARE = f"max by (node, gpu_uuid) ({metric_names.GPU_SHARE})"
OFFERED = f"max by (node, gpu_uuid) ({metric_names.GPU_OFFERED_REPLICAS})"
# A scrape without honor_labels keeps the auditor pod's own namespace/pod/container and renames the workload's to
# exported_*: the queries keep exported_namespace so such series are refused instead of billed to the auditor.
RENAMED = "exported_namespace"
MEMORY = f"max by (node, namespace, pod, container, gpu_uuid, allocated, {RENAMED}) ({metric_names.CONTAINER_MEMORY})"
ALLOCATED = f"max by (node, namespace, pod, container, gpu_uuid, {RENAMED}) ({metric_names.CONTAINER_ALLOCATED})"
UNATTRIBUTED = f"max by (node, gpu_uuid) ({metric_names.UNATTRIBUTED_MEMORY})"
# Not billed: shown beside the bill (absent on devices NVML does not sample, such as MIG).
ACTIVITY = f"max by (node, namespace, pod, container, gpu_uuid, {RENAMED}) ({metric_names.CONTAINER_SM_ACTIVITY})"
# INFO, SHARE, MEMORY, ALLOCATED, UNATTRIBUTED, OFFERED, ACTIVITY (plus the labels with --by label:)
QUERIES_PER_CHUNK = 7


def pod_labels_query(name: str) -> str:
    """The query for ``--by label:KEY``, where ``name`` is the label the auditor exports KEY as."""
    return f'max by (namespace, pod, {name}) ({metric_names.POD_LABELS}{{{name}!=""}})'


GroupOf = Callable[[str, str, int], str]  # (namespace, pod, instant in ms) → group


def instant_key(timestamp: float) -> int:
    """An instant as Prometheus keeps it, in whole milliseconds: samples of different queries match by it."""
    return round(timestamp * 1000)


@dataclass
class RawNotes:
    """What the conversion noticed across every chunk, for the bill's notes."""

    missing_share: set[str] = field(default_factory=set)
    devices_seen: bool = False
    labels_seen: bool = False

    def notes(self) -> list[str]:
        if not self.missing_share:
            return []
        return [
            f"{len(self.missing_share)} MIG device(s) had no {metric_names.GPU_SHARE}, so their card's share is "
            f"counted as idle (e.g. {sorted(self.missing_share)[0]})"
        ]


def intervals_from_series(
    instants: Sequence[float],
    step: float,
    *,
    info: list[Series],
    share: list[Series],
    memory: list[Series],
    allocated: list[Series],
    unattributed: list[Series],
    group_of: GroupOf,
    offered: Sequence[Series] = (),
    activity: Sequence[Series] = (),
    notes: RawNotes | None = None,
) -> list[Interval]:
    """Regroup per-series samples into one :class:`Interval` per instant. Pure; what it notices goes to ``notes``."""
    notes = notes if notes is not None else RawNotes()
    for name, items in (
        (metric_names.CONTAINER_MEMORY, memory),
        (metric_names.CONTAINER_ALLOCATED, allocated),
        (metric_names.CONTAINER_SM_ACTIVITY, activity),
    ):
        renamed = next((item.labels for item in items if item.labels.get(RENAMED)), None)
        if renamed is not None:
            raise PrometheusError(
                f"{name} carries {RENAMED}={renamed[RENAMED]!r}: Prometheus scraped the auditor without honor_labels "
                f"and replaced the workload's namespace/pod/container with the auditor pod's own "
                f"({renamed.get('namespace', '')}/{renamed.get('pod', '')}); scrape it with honor_labels: true "
                "(honorLabels in a ServiceMonitor, see docs/metrics.md)"
            )
    slots = {instant_key(instant): instant for instant in instants}
    devices: dict[int, list[Device]] = defaultdict(list)
    shares: dict[tuple[int, str, str], float] = {}
    for item in share:
        for ts, value in item.values:
            if math.isfinite(value) and value >= 0:
                shares[(instant_key(ts), item.labels.get("node", ""), item.labels.get("gpu_uuid", ""))] = value
    for item in info:
        labels = item.labels
        node, uuid, parent = labels.get("node", ""), labels.get("gpu_uuid", ""), labels.get("parent_uuid", "")
        for ts, _ in item.values:
            ratio = 1.0
            if parent:
                found = shares.get((instant_key(ts), node, uuid))
                if found is None:
                    notes.missing_share.add(uuid)
                    continue
                ratio = found
            devices[instant_key(ts)].append(Device(node, uuid, parent, labels.get("model", ""), ratio))
    notes.devices_seen = notes.devices_seen or bool(devices)

    def owner_at(labels: Mapping[str, str]) -> Callable[[int], ContainerRef]:
        """The container a series is about, in the group its pod had at each instant (one object per group)."""
        namespace, pod, container = labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", "")
        refs: dict[str, ContainerRef] = {}

        def at(key: int) -> ContainerRef:
            group = group_of(namespace, pod, key)
            ref = refs.get(group)
            if ref is None:
                ref = refs[group] = ContainerRef(namespace, pod, container, group)
            return ref

        return at

    def device(labels: Mapping[str, str]) -> tuple[str, str]:
        return labels.get("node", ""), labels.get("gpu_uuid", "")

    def memory_of(labels: Mapping[str, str]) -> Callable[[int, float], Memory]:
        node, gpu = device(labels)
        owner, allocated_flag = owner_at(labels), labels.get("allocated", "true") != "false"
        return lambda key, value: Memory(node, gpu, owner(key), allocated_flag, value)

    def allocation_of(labels: Mapping[str, str]) -> Callable[[int, float], Allocation]:
        node, gpu = device(labels)
        owner = owner_at(labels)
        return lambda key, value: Allocation(node, gpu, owner(key), value)

    memory_at = _at(memory, memory_of)
    allocations_at = _at(allocated, allocation_of)
    unattributed_at = _at(unattributed, lambda labels: lambda _key, value: Unattributed(*device(labels), value))
    offered_at = _at(offered, lambda labels: lambda _key, value: Offered(*device(labels), value))

    def activity_of(labels: Mapping[str, str]) -> Callable[[int, float], SmActivity]:
        node, gpu = device(labels)
        owner = owner_at(labels)
        return lambda key, value: SmActivity(node, gpu, owner(key), value)

    # an idle container's 0 is kept: sampled and idle is not the same as not sampled
    activity_at = _at(activity, activity_of, keep_zero=True)
    return [
        Interval(
            end=instant,
            seconds=step,
            devices=tuple(devices.get(key, ())),
            memory=tuple(memory_at.get(key, ())),
            allocations=tuple(allocations_at.get(key, ())),
            unattributed=tuple(unattributed_at.get(key, ())),
            offered=tuple(offered_at.get(key, ())),
            activity=tuple(activity_at.get(key, ())),
        )
        for key, instant in sorted(slots.items())
    ]


def _at(
    series: Sequence[Series],
    sample_of: Callable[[Mapping[str, str]], Callable[[int, float], T]],
    *,
    keep_zero: bool = False,
) -> dict[int, list[T]]:
    """Every finite, positive (with ``keep_zero``, non-negative) sample of ``series``, made by
    ``sample_of(labels)(instant, value)``, by instant."""
    result: dict[int, list[T]] = defaultdict(list)
    for item in series:
        make = sample_of(item.labels)
        for ts, value in item.values:
            if math.isfinite(value) and (value > 0 or (keep_zero and value == 0)):
                key = instant_key(ts)
                result[key].append(make(key, value))
    return result


def _by_namespace(namespace: str, pod: str, key: int) -> str:
    return namespace or NO_LABEL


def _by_label(groups: Mapping[tuple[int, str, str], str]) -> GroupOf:
    """The group of a pod at an instant: its label's value then (``pod_groups``), or ``NO_LABEL``."""

    def group_of(namespace: str, pod: str, key: int) -> str:
        return groups.get((key, namespace, pod), NO_LABEL)

    return group_of


def pod_groups(series: Sequence[Series], label: str) -> dict[tuple[int, str, str], str]:
    """(instant in ms, namespace, pod) → the value of ``label`` on ``gpu_fence_pod_labels`` at that instant.

    A pod seen with two values at one instant (its label changed less than a lookback ago and the old series had
    no staleness marker) takes the greater, so that the bill does not depend on the order of the answer."""
    groups: dict[tuple[int, str, str], str] = {}
    for item in series:
        value = item.labels.get(label, "")
        if not value:
            continue
        namespace, pod = item.labels.get("namespace", ""), item.labels.get("pod", "")
        for ts, _ in item.values:
            key = (instant_key(ts), namespace, pod)
            if value > groups.get(key, ""):
                groups[key] = value
    return groups


def runs(instants: Sequence[float], step: float) -> list[list[float]]:
    """``instants`` (ascending) cut into runs ``step`` apart: each run is one range query's evaluation instants."""
    result: list[list[float]] = []
    for instant in instants:
        if result and instant_key(instant) - instant_key(result[-1][-1]) == instant_key(step):
            result[-1].append(instant)
        else:
            result.append([instant])
    return result


def stream_intervals(
    source: Source,
    instants: Sequence[float],
    step: float,
    by: str,
    *,
    notes: RawNotes,
    progress: Progress | None = None,
    chunk_samples: int = CHUNK_SAMPLES,
) -> Iterator[Interval]:
    """The intervals ending at ``instants`` (each ``step`` long), a chunk of instants at a time.

    A chunk starts at ``FIRST_CHUNK`` instants and is then sized from the samples per instant seen so far, so that
    one chunk holds about ``chunk_samples`` samples; the caller books each interval before the next chunk is read.
    """
    label = None if by == "namespace" else metric_names.label_name(by.removeprefix("label:"))
    queries = QUERIES_PER_CHUNK + (label is not None)
    pending = [list(run) for run in runs(instants, step)]
    size, seen_samples, seen_instants = FIRST_CHUNK, 0, 0
    while pending:
        run = pending[0]
        chunk, pending[0] = run[:size], run[size:]
        if not pending[0]:
            pending.pop(0)
        if progress is not None:
            remaining = sum(len(item) for item in pending)
            progress.expect(progress.done + queries * (1 + math.ceil(remaining / max(1, size))))
        first, last = chunk[0], chunk[-1]

        def ask(query: str, first: float = first, last: float = last) -> list[Series]:
            answer = source.query_range(query, first, last, step)
            if progress is not None:
                progress.advance()
            return answer

        info = ask(INFO)
        if label is None:
            group_of: GroupOf = _by_namespace
        else:
            groups = pod_groups(ask(pod_labels_query(label)), label)
            notes.labels_seen = notes.labels_seen or bool(groups)
            group_of = _by_label(groups)

        answers = {
            "share": ask(SHARE),
            "memory": ask(MEMORY),
            "allocated": ask(ALLOCATED),
            "unattributed": ask(UNATTRIBUTED),
            "offered": ask(OFFERED),
            "activity": ask(ACTIVITY),
        }
        seen_samples += sum(len(item.values) for items in (info, *answers.values()) for item in items)
        seen_instants += len(chunk)
        yield from intervals_from_series(chunk, step, info=info, group_of=group_of, notes=notes, **answers)
        per_instant = max(1.0, seen_samples / seen_instants)
        size = max(1, min(MAX_POINTS_PER_QUERY, int(chunk_samples / per_instant)))


def no_label(by: str, start: float, end: float) -> PrometheusError:
    key = by.removeprefix("label:")
    label = metric_names.label_name(key)
    return PrometheusError(
        f"no {metric_names.POD_LABELS} series carries {label} (pod label {key!r}) between {iso(start)} and "
        f"{iso(end)}: run the auditor with --pod-label {key}, or check the label key"
    )


def no_data(source: Source, start: float, last: float) -> PrometheusError:
    return PrometheusError(
        f"no {metric_names.GPU_INFO} samples at {source.name} between {iso(start)} and {iso(last)}: "
        "check the time range and that Prometheus scrapes the auditor"
    )
