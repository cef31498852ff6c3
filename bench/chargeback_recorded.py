"""What the chargeback recording rules record over a synthetic fleet, written out by the exact method's own split.

Backfilling a month of rule output with ``promtool tsdb create-blocks-from rules`` means evaluating every rule
at every evaluation of the month against a Prometheus, which takes hours on the benchmark's machine (the rules'
cost is paid a little at every evaluation in a live Prometheus, not all at once). The benchmark measures the
bill over those series, so it writes them itself: at each evaluation instant it builds the :class:`Interval`
Prometheus would show (each series' latest sample within the lookback), splits it with
``ledger.split_interval`` (the code of the raw path) and records what each rule of ``rules.py`` records, with
the same names and labels. ``tests/bench/test_bench_chargeback.py`` checks, on a small fleet, that these series
are what promtool's backfill of the real rules records, series for series and value for value.

A card's split depends only on its own series and its pods' (``Fleet.by_card``), and changes only where a run of
one of them starts or leaves the lookback: the split is made once per card and stretch between such moments, and
recorded as runs of a constant value.
"""

from __future__ import annotations

import itertools
import math
import multiprocessing
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from bench.chargeback_fleet import LOOKBACK, Fleet, Grid, Key, Run, Series
from gpu_fence.chargeback import rules as r
from gpu_fence.chargeback.bill import Charge, Method
from gpu_fence.chargeback.ledger import IntervalSplit, split_interval
from gpu_fence.chargeback.samples import Allocation, ContainerRef, Device, Interval, Memory, Offered, Unattributed

EDGE = 1e-6  # a sample exactly LOOKBACK old is still seen (Prometheus 2 closes the window at both ends)


@dataclass
class Recorder:
    """The recorded series, built as runs: a new value, or a gap, starts a new run."""

    interval: float
    series: Series = field(default_factory=Series)
    _open: dict[Key, Run] = field(default_factory=dict)

    def put(self, metric: str, labels: Mapping[str, str], value: float, first: float, last: float) -> None:
        key = (metric, tuple(labels.items()))
        run = self._open.get(key)
        if run is not None and run.value == value and abs(first - run.end - self.interval) < 1e-3:
            run.end = last
            return
        run = Run(first, last, value)
        self._open[key] = run
        self.series.runs[key].append(run)


def record(
    fleet: Fleet,
    interval: float,
    phase: float | None = None,
    *,
    pod_labels: Iterable[str] = ("team",),
    workers: int = 1,
    keep: Callable[[Key], bool] | None = None,
) -> Series:
    """Every series the rules record over ``fleet`` when they evaluate every ``interval`` seconds at ``phase``
    (seconds past each multiple of the interval; by default the phase of the fleet's own samples, the instants the
    recorded series are then written at), from the fleet's first sample to its end; ``workers`` processes share the
    cards (each card's series are its own, so their results never overlap). ``keep``: only the series it keeps
    (a month's every per-container series would not fit this machine's memory)."""
    names = [f"label_{key}" for key in pod_labels]
    evaluations = evaluation_grid(fleet, interval, phase)
    cards = list(fleet.by_card)
    if workers > 1:
        context = multiprocessing.get_context("fork")  # the workers read the parent's fleet, never copy it
        with context.Pool(workers, initializer=_share, initargs=(fleet, evaluations, names, keep)) as pool:
            parts = pool.map(_record_cards, [cards[index::workers] for index in range(workers)])
    else:
        _share(fleet, evaluations, names, keep)
        parts = [_record_cards(cards)]
    series = Series()
    for runs in parts:
        series.runs.update(runs)
    series.runs[(r.INTERVAL, ())] = [Run(evaluations.origin, evaluations.last(fleet.end), interval)]
    return series


def evaluation_grid(fleet: Fleet, interval: float, phase: float | None = None) -> Grid:
    """When the rules evaluate over ``fleet``: every ``interval`` at ``phase`` past its multiples (by default in
    step with the fleet's samples), from the fleet's first sample to its end."""
    phase = fleet.grid.origin % interval if phase is None else phase
    return Grid(fleet.grid.origin + (phase - fleet.grid.origin) % interval, interval, fleet.end)


_SHARED: dict[str, object] = {}


def _share(fleet: Fleet, evaluations: Grid, names: list[str], keep: Callable[[Key], bool] | None) -> None:
    _SHARED.update(fleet=fleet, evaluations=evaluations, names=names, keep=keep)


def _record_cards(cards: list[str]) -> dict[Key, list[Run]]:
    fleet, evaluations, names = _SHARED["fleet"], _SHARED["evaluations"], _SHARED["names"]
    recorder = Recorder(evaluations.step)  # type: ignore[attr-defined]
    keep = _SHARED["keep"]
    for card in cards:
        _record_card(fleet, fleet.by_card[card], evaluations, recorder, names)  # type: ignore[arg-type, attr-defined]
        if keep is not None:  # card by card: what is dropped never piles up
            for key in [key for key in recorder.series.runs if not keep(key)]:  # type: ignore[operator]
                del recorder.series.runs[key]
                recorder._open.pop(key, None)
    return dict(recorder.series.runs)


def _record_card(fleet: Fleet, keys: list[Key], evaluations: Grid, recorder: Recorder, names: list[str]) -> None:
    changes: dict[float, list[tuple[Key, float | None]]] = defaultdict(list)
    for key in keys:
        for seen, hidden, value in _visible(fleet.grid, fleet.series.runs[key]):
            changes[seen].append((key, value))
            changes[hidden].append((key, None))
    active: dict[Key, float] = {}
    moments = sorted(changes)
    for index, moment in enumerate(moments):
        for key, value in changes[moment]:  # a run's end and the next one's start may share a moment
            if value is None:
                if key in active and not any(k == key and v is not None for k, v in changes[moment]):
                    del active[key]
            else:
                active[key] = value
        until = moments[index + 1] if index + 1 < len(moments) else fleet.end + LOOKBACK + 1
        first = evaluations.first(moment)
        if first >= until or first > fleet.end or not active:
            continue
        last = min(evaluations.last(until - EDGE / 2), evaluations.last(fleet.end))
        if last < first:
            continue
        _record_state(active, first, last, recorder, names)


def _visible(grid: Grid, runs: list[Run]) -> list[tuple[float, float, float]]:
    """(from, until, value) for each run of one series: seen at T when from <= T < until. A later run's first
    sample hides an earlier one's (the latest sample within the lookback is the one seen)."""
    spans = []
    for run in runs:
        samples = grid.samples(run)
        if samples is not None:
            spans.append([samples[0], samples[1] + LOOKBACK + EDGE, run.value])
    for earlier, later in itertools.pairwise(spans):
        earlier[1] = min(earlier[1], later[0])
    return [(seen, hidden, value) for seen, hidden, value in spans if hidden > seen]


def _interval(active: Mapping[Key, float], end: float) -> tuple[Interval, dict[tuple[str, str], str]]:
    """The :class:`Interval` these series make, one hour long (so card-hours are card ratios), and each pod's
    label values (``label_*``) beside it."""
    info, share, memory, allocations, unattributed, offered = [], {}, [], [], [], []
    labels_of: dict[tuple[str, str], dict[str, str]] = {}
    for (metric, pairs), value in active.items():
        labels = dict(pairs)
        node, gpu = labels.get("node", ""), labels.get("gpu_uuid", "")
        if metric == "gpu_fence_gpu_info":
            info.append(labels)
        elif metric == "gpu_fence_gpu_share_ratio":
            share[(node, gpu)] = value
        elif metric == "gpu_fence_pod_labels":
            labels_of[(labels["namespace"], labels["pod"])] = labels
        elif value > 0 and metric == "gpu_fence_container_gpu_memory_bytes":
            owner = ContainerRef(labels["namespace"], labels["pod"], labels["container"], labels["namespace"])
            memory.append(Memory(node, gpu, owner, labels.get("allocated") != "false", value))
        elif value > 0 and metric == "gpu_fence_container_allocated_gpus":
            owner = ContainerRef(labels["namespace"], labels["pod"], labels["container"], labels["namespace"])
            allocations.append(Allocation(node, gpu, owner, value))
        elif value > 0 and metric == "gpu_fence_unattributed_gpu_memory_bytes":
            unattributed.append(Unattributed(node, gpu, value))
        elif value > 0 and metric == "gpu_fence_gpu_offered_replicas":
            offered.append(Offered(node, gpu, value))
    devices = []
    for labels in info:
        node, gpu, parent = labels["node"], labels["gpu_uuid"], labels.get("parent_uuid", "")
        if not parent or (node, gpu) in share:
            devices.append(Device(node, gpu, parent, labels.get("model", ""), share[(node, gpu)] if parent else 1.0))
    interval = Interval(
        end, 3600.0, tuple(devices), tuple(memory), tuple(allocations), tuple(unattributed), tuple(offered)
    )
    pods = {
        pod: {name: value for name, value in labels.items() if name.startswith("label_") and value}
        for pod, labels in labels_of.items()
    }
    return interval, pods


def _record_state(active: Mapping[Key, float], first: float, last: float, recorder: Recorder, names: list[str]) -> None:
    interval, pods = _interval(active, first)

    def with_labels(labels: dict[str, str]) -> dict[str, str]:
        found = pods.get((labels["namespace"], labels["pod"]), {})
        return {**labels, **{name: found[name] for name in names if name in found}}

    def put(metric: str, labels: Mapping[str, str], value: float) -> None:
        recorder.put(metric, labels, value, first, last)

    def rollup(
        per_container: Mapping[tuple, float], metric: str, kept: tuple[str, ...], static: Mapping[str, str]
    ) -> None:
        sums: dict[tuple, float] = defaultdict(float)
        for pairs, value in per_container.items():
            labels = dict(pairs)
            sums[tuple((k, labels[k]) for k in (*kept, *names) if k in labels)] += value
        for pairs, value in sums.items():
            put(metric, {**dict(pairs), **static}, value)

    device_keys = ("node", "gpu_uuid", "card_uuid")
    holder = split_interval(interval, Method.HOLDER)
    for method, split in ((Method.HOLDER, holder), (Method.USAGE, split_interval(interval, Method.USAGE))):
        booked: dict[tuple, float] = defaultdict(float)
        reserved: dict[tuple, float] = defaultdict(float)
        for unit in split.units:
            where = {"node": unit.device.node, "gpu_uuid": unit.device.uuid, "card_uuid": unit.card_uuid}
            for booking in unit.split.bookings:
                if booking.who is None:
                    put(r.UNATTRIBUTED, {**where, "method": method.value}, booking.card_hours)
                    continue
                who = {"namespace": booking.who.namespace, "pod": booking.who.pod, "container": booking.who.container}
                if booking.party.charge is Charge.RESERVED:
                    reserved[tuple(with_labels({**where, **who}).items())] += booking.card_hours
                else:
                    labels = with_labels({**where, **who, "charge": booking.party.charge.value})
                    booked[tuple(labels.items())] += booking.card_hours
            if unit.split.idle > 0:
                put(r.IDLE, {**where, "method": method.value}, unit.split.idle)
        for (node, card), free in split.uncovered.items():
            if free > 0:
                put(r.IDLE, {"node": node, "gpu_uuid": card, "card_uuid": card, "method": method.value}, free)
        for pairs, value in booked.items():
            put(r.BOOKED, {**dict(pairs), "method": method.value}, value)
        for pairs, value in reserved.items():
            put(r.BOOKED, {**dict(pairs), "method": method.value, "charge": Charge.RESERVED.value}, value)
        rollup(booked, r.GROUP_BOOKED, (*device_keys, "namespace", "charge"), {"method": method.value})
        static = {"method": method.value, "charge": Charge.RESERVED.value}
        rollup(reserved, r.GROUP_BOOKED, (*device_keys, "namespace"), static)
    _record_method_free(interval, holder, put, rollup, with_labels)


def _record_method_free(interval: Interval, split: IntervalSplit, put, rollup, with_labels) -> None:
    """What does not depend on the method: memory, requests, cards, and the devices worth a note."""
    device_keys = ("node", "gpu_uuid", "card_uuid")
    memory: dict[tuple, float] = defaultdict(float)
    for unit in split.units:
        where = {"node": unit.device.node, "gpu_uuid": unit.device.uuid, "card_uuid": unit.card_uuid}
        for booking in unit.split.bookings:
            if booking.bytes <= 0:
                continue
            if booking.who is None:
                put(r.UNATTRIBUTED_MEMORY, where, booking.bytes)
            else:
                who = {"namespace": booking.who.namespace, "pod": booking.who.pod, "container": booking.who.container}
                memory[tuple(with_labels({**where, **who, "charge": booking.party.charge.value}).items())] += (
                    booking.bytes
                )
        if unit.split.offered_missing:
            put(r.ISSUE, {"node": unit.device.node, "gpu_uuid": unit.device.uuid, "issue": r.Issue.OFFERED_MISSING}, 1)
        if unit.split.over_held:
            put(r.ISSUE, {"node": unit.device.node, "gpu_uuid": unit.device.uuid, "issue": r.Issue.OVER_HELD}, 1)
    for pairs, value in memory.items():
        put(r.MEMORY, dict(pairs), value)
    rollup(memory, r.GROUP_MEMORY, (*device_keys, "namespace", "charge"), {})
    devices = {(device.node, device.uuid): device for device in interval.devices}
    requested: dict[tuple, float] = defaultdict(float)
    for allocation in interval.allocations:
        device = devices.get((allocation.node, allocation.gpu_uuid))
        if device is None:
            continue
        where = {"node": device.node, "gpu_uuid": device.uuid, "card_uuid": device.card[1]}
        who = {
            "namespace": allocation.owner.namespace,
            "pod": allocation.owner.pod,
            "container": allocation.owner.container,
        }
        share = device.share if device.parent_uuid else 1.0
        requested[tuple(with_labels({**where, **who}).items())] += allocation.count * share
    for pairs, value in requested.items():
        put(r.REQUESTED, dict(pairs), value)
    rollup(requested, r.GROUP_REQUESTED, (*device_keys, "namespace"), {})
    for (node, card), model in split.cards.items():
        put(r.CARD, {"node": node, "card_uuid": card, "model": model}, 1)
    for issue, found in (
        (r.Issue.UNKNOWN_DEVICE, split.unplaced | split.unknown_allocations),
        (r.Issue.OUTSIDE_SLICES, split.partitioned),
    ):
        for node, gpu in found:
            put(r.ISSUE, {"node": node, "gpu_uuid": gpu, "issue": issue}, 1)


def hourly(recorded: Series, evaluations: Grid, phase: float = 0.0) -> Series:
    """What the rules' second level (``rules.hourly_rules``) records over ``recorded``, the split's series evaluated
    on ``evaluations``, when the hourly group evaluates at ``phase`` seconds past each hour: for every hour whose
    evaluations are all there, each series the second level reads summed (counted, or its greatest value) over the
    evaluations in ``(T - interval - 1h, T - interval]``. Each run of the split's series is one value over
    consecutive evaluations, so the hours inside it get that value times an hour's evaluations, and only the hours at
    its edges are summed from parts. ``tests/bench/test_bench_chargeback.py`` checks these against what promtool's
    backfill of the real rules records, series for series."""
    interval = evaluations.step
    per_hour = r.hourly_evaluations(interval)
    if not per_hour:
        return Series()
    lag = interval
    # The hourly sums' times T0 + h × 1h; the last evaluation of hour h has index a0 + h × per_hour.
    first_time = evaluations.origin + lag + r.HOUR
    t0 = first_time + (phase - first_time) % r.HOUR
    a0 = math.floor(round((t0 - lag - evaluations.origin) / interval, 6))
    last_index = round((evaluations.last(evaluations.end) - evaluations.origin) / interval)
    whole = range(math.ceil(max(0, -a0 + per_hour - 1) / per_hour), (last_index - a0) // per_hour + 1)
    out = Series(grid=Grid(t0, r.HOUR, t0 + r.HOUR * (whole.stop - 1) if whole else t0))

    def block(index: int) -> int:  # the hour an evaluation index is summed in
        return -(-(index - a0) // per_hour)

    functions = {metric: function for metric, (function, _name) in r.HOURLY.items()}
    nodes: dict[Key, dict[int, float]] = {}
    wanted = {r.BOOKED: Charge.OVERREACH.value, r.MEMORY: Charge.OVERREACH.value}
    for (metric, labels), runs in recorded.runs.items():
        if metric not in functions or (metric in wanted and dict(labels).get("charge") != wanted[metric]):
            continue
        function, name = functions[metric], r.HOURLY[metric][1]
        hours: dict[int, float] = defaultdict(float)  # hour → its value, for the hours at runs' edges
        inside: list[tuple[int, int, float]] = []  # (first hour, last hour, value) of the hours inside runs
        for run in runs:
            span = evaluations.samples(run)
            if span is None:
                continue
            p, q = (round((moment - evaluations.origin) / interval) for moment in span)
            hp, hq = block(p), block(q)
            for hour, count in ((hp, min(q, a0 + hp * per_hour) - p + 1), (hq, q - (a0 + (hq - 1) * per_hour))):
                if hour in whole and count > 0:
                    hours[hour] = _combine(function, hours.get(hour), run.value, count)
                if hp == hq:
                    break
            inner = range(max(hp + 1, whole.start), min(hq - 1, whole.stop - 1) + 1)
            if inner:
                inside.append((inner.start, inner[-1], _combine(function, None, run.value, per_hour)))
        stretches = sorted([*inside, *((hour, hour, value) for hour, value in hours.items())])
        for first, last, value in stretches:
            out.runs[(name, labels)].append(Run(t0 + first * r.HOUR, t0 + last * r.HOUR, value))
        if metric in r.PER_NODE:  # the same hours summed per node, for long ranges' timelines
            node_key = (r.PER_NODE[metric], tuple((k, v) for k, v in labels if k not in ("gpu_uuid", "card_uuid")))
            per_node = nodes.setdefault(node_key, defaultdict(float))
            for first, last, value in stretches:
                for hour in range(first, last + 1):
                    per_node[hour] += value
    for key, values in nodes.items():
        out.runs[key] = [Run(t0 + hour * r.HOUR, t0 + hour * r.HOUR, value) for hour, value in sorted(values.items())]
    if whole:
        out.runs[(r.HOURLY_EVALUATIONS, ())] = [
            Run(t0 + whole.start * r.HOUR, t0 + (whole.stop - 1) * r.HOUR, float(per_hour))
        ]
    return out


def _combine(function: str, so_far: float | None, value: float, count: int) -> float:
    """An hour's value of a series after ``count`` more evaluations of ``value``."""
    if function == "count_over_time":
        return (so_far or 0.0) + count
    if function == "max_over_time":
        return value if so_far is None else max(so_far, value)
    return (so_far or 0.0) + value * count
