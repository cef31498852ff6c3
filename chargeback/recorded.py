"""The bill from the chargeback recording rules' series (``rules.py``): a handful of ``sum_over_time`` queries.

The rules book every evaluation's split in *card ratios*; each sample stands for the ``interval`` seconds before
it, as an instant of ``raw.py`` stands for the step before it. So a bill over the evaluations ``e_1 .. e_n`` (each
``interval`` after the last) sums each series over ``(e_1 - interval, e_n]`` with one instant query at ``e_n``,
multiplies by ``interval / 3600`` to get card-hours and prices them per card with the price list: the same
:class:`~.ledger.Ledger` the raw path fills interval by interval, so the idle policies, the report and every
format are the same code.

The rules evaluate at a fixed phase (Prometheus offsets each group by a hash of its name and file): the bill covers
the evaluations in ``(start, end]``, reported as the range they stand for. It equals the raw series' bill made at
those very instants with ``--step`` = the rules' interval (docs/chargeback.md, "When the two paths agree"). An
evaluation the rules did not record (Prometheus down, the rules deployed after the range began) is computed here
from the raw series at that instant, so a gap costs time, never correctness.

Where the rules' second level recorded hourly sums (``rules.hourly_rules``), a bill sums those for the whole hours
of its range and the interval's series only for what is left (the range's edges, an hour the second level did not
record): the same samples, summed in two steps, so the same bill, reading twelve times fewer samples at 5 minutes.
Each stretch is a query of each sum (:class:`Part`), evaluated at its own end, and the parts are added up here.
"""

from __future__ import annotations

import bisect
import functools
import math
import re
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass

from gpu_fence import metric_names
from gpu_fence.metric_names import label_name

from . import rules as r
from .bill import IDLE, OVERREACH, UNATTRIBUTED, Charge, Method, TimePoint
from .errors import ChargebackError
from .ledger import GIB, UNATTRIBUTED_PARTY, Ledger, Party, Where, nonzero
from .progress import Progress
from .prometheus import InstantSource, PrometheusError, Series
from .raw import NO_LABEL, RENAMED, RawNotes
from .times import iso

# A group's own charges on a device: what it used with an allocation, and what it held without using it.
_HELD_OR_USED = f"{Charge.USAGE.value}|{Charge.RESERVED.value}"
# At most this many timeline points: consecutive evaluations are merged into one point beyond it.
TIMELINE_POINTS = 720
SUMS = 13  # the instant queries of book() over one part of its range, before the timeline's range queries
RENAMED_CHECKS = 2  # of those, the two that read the auditor's series over the whole range
# Queries in flight at once: Prometheus evaluates each on one core (Thanos and Mimir spread them over queriers),
# so a bill's dozen sums and its timeline take the longest one's time, not their total, where cores are free.
PARALLEL = 4
# At most this many stretches of whole hours are summed from the hourly series: each adds a query to every sum (and
# splits the interval's series around it), so a range the second level recorded with many gaps sums the longest
# stretches from it and the rest from the interval's series.
MAX_HOURLY_RUNS = 4


class NotRecorded(ChargebackError):
    """The recording rules cannot make this bill (the message says why and what to do instead)."""


@dataclass(frozen=True)
class Part:
    """A stretch of a bill's evaluations, ``first`` to ``last`` (indexes), that one term of each sum reads: the
    interval's series (``hourly`` false, ``count`` evaluations' slots) or the hourly sums (``count`` hours), whose
    last sample is at ``end``."""

    hourly: bool
    first: int
    last: int
    end: float
    count: int
    step: float  # seconds between its samples: the rules' interval, or an hour

    @property
    def window(self) -> str:
        return _window(self.count * self.step)


@dataclass(frozen=True)
class Plan:
    """The rules' evaluations in the range: which are recorded and which must be computed from raw series, and
    which whole hours the second level summed."""

    interval: float  # seconds between evaluations
    evaluations: tuple[float, ...]  # every evaluation time in (start, end], on the rules' phase
    recorded: frozenset[int]  # indexes into evaluations that the rules recorded
    hours: tuple[float, ...] = ()  # times of the hourly sums whose hour is whole and inside the range

    @property
    def first(self) -> float:
        return self.evaluations[0]

    @property
    def last(self) -> float:
        return self.evaluations[-1]

    @property
    def missing(self) -> list[float]:
        return [time for index, time in enumerate(self.evaluations) if index not in self.recorded]

    @property
    def start(self) -> float:
        """Where the range the evaluations stand for begins."""
        return self.first - self.interval

    @property
    def queries(self) -> int:
        """How many queries :func:`book` makes for this plan."""
        if not self.recorded:
            return 0
        return RENAMED_CHECKS + (SUMS - RENAMED_CHECKS) * len(self.parts) + len(self.timeline_sets())

    @property
    def hourly_sums(self) -> int:
        """How many whole hours the bill sums from the hourly series."""
        return sum(part.count for part in self.parts if part.hourly)

    @property
    def lag(self) -> float:
        """How long before its own time an hourly sum's hour ends (``rules.hourly_rules``: one interval)."""
        return self.interval

    @functools.cached_property
    def parts(self) -> tuple[Part, ...]:
        """The evaluations cut into stretches: runs of whole hours from the hourly sums (the longest
        ``MAX_HOURLY_RUNS``), the rest from the interval's series."""
        per_hour = r.hourly_evaluations(self.interval)
        count, step, origin = len(self.evaluations), _ms(self.interval), _ms(self.first)
        runs: list[list[tuple[float, int, int]]] = []  # (the hourly sum's time, first and last evaluation it covers)
        for time in self.hours:
            last = (_ms(time - self.lag) - origin) // step
            first = last - per_hour + 1
            if first < 0 or last >= count:
                continue
            if runs and _ms(time) - _ms(runs[-1][-1][0]) == _ms(r.HOUR):
                runs[-1].append((time, first, last))
            else:
                runs.append([(time, first, last)])
        chosen = sorted(
            sorted(runs, key=lambda run: (-len(run), run[0][1]))[:MAX_HOURLY_RUNS], key=lambda run: run[0][1]
        )
        parts: list[Part] = []
        position = 0
        for run in chosen:
            begin, end = run[0][1], run[-1][2]
            if begin > position:
                parts.append(self._interval_part(position, begin - 1))
            parts.append(Part(True, begin, end, run[-1][0], len(run), r.HOUR))
            position = end + 1
        if position < count:
            parts.append(self._interval_part(position, count - 1))
        return tuple(parts)

    def _interval_part(self, first: int, last: int) -> Part:
        return Part(False, first, last, self.evaluations[last], last - first + 1, self.interval)

    @property
    def at(self) -> float:
        """When a bill's checks over its whole range are evaluated: the latest end of its parts (a sum's parts are
        each evaluated at their own end)."""
        return max(part.end for part in self.parts)

    def timeline_sets(self) -> list[tuple[Part, list[float], int]]:
        """The timeline's points, as range queries: (the part, the end of each point's last sample, how many
        samples each point sums). At most ``TIMELINE_POINTS`` points of ``merge`` evaluations each, the first of a
        stretch taking what is left over; where points are an hour or longer, whole hours from the hourly sums."""
        _head, merge = timeline_points(len(self.evaluations))
        per_hour = r.hourly_evaluations(self.interval)
        sets = []
        for stretch in self.parts:
            part = stretch
            if stretch.hourly and merge >= per_hour:
                size = math.ceil(merge / per_hour)
                times = [stretch.end - r.HOUR * (stretch.count - 1 - index) for index in range(stretch.count)]
            else:  # points shorter than an hour: the interval's series, even where the hours are summed
                size = merge
                times = list(self.evaluations[stretch.first : stretch.last + 1])
                part = self._interval_part(stretch.first, stretch.last)
            head = len(times) % size
            if head:
                sets.append((part, times[head - 1 : head], head))
            if times[head + size - 1 :: size]:
                sets.append((part, times[head + size - 1 :: size], size))
        return sets


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _window(seconds: float) -> str:
    """A range selector covering the evaluations of the last ``seconds`` and not the one exactly that long ago:
    ``seconds`` less a millisecond (Prometheus 2 closes ranges at both ends, 3 only at the end)."""
    return f"[{_ms(seconds) - 1}ms]"


def plan(
    source: InstantSource,
    start: float,
    end: float,
    *,
    step: float | None,
    by: str,
    progress: Progress | None = None,
) -> Plan:
    """Which evaluations of the rules make this bill; :class:`NotRecorded` when the rules cannot make it."""

    def ask(query: str, at: float) -> list[Series]:
        answer = source.query(query, at)
        if progress is not None:
            progress.advance()
        return answer

    found = ask(f"max_over_time({r.INTERVAL}{_window(end - start + 1)})", end)
    values = [value for item in found for _, value in item.values if math.isfinite(value) and value > 0]
    if not values:
        raise NotRecorded(
            f"no series of the chargeback recording rules ({r.INTERVAL}) at {source.name} between {iso(start)} "
            f"and {iso(end)}: load them (manifests/overlays/prometheus, or gpu-fence-auditor chargeback --rules)"
        )
    interval = max(values)
    if step is not None and _ms(step) != _ms(interval):
        raise NotRecorded(
            f"the chargeback recording rules at {source.name} evaluate every {interval:g} s: --step {step:g} s "
            "needs the raw series (--series raw), or leave --step out"
        )
    count = int(_ms(end - start) // _ms(interval))
    if count < 1:
        raise NotRecorded(f"the range {iso(start)} .. {iso(end)} is shorter than the rules' interval ({interval:g} s)")
    # Presence of an evaluation in each interval-long cell ending at start + k × interval, and one recorded
    # timestamp to learn the rules' phase from.
    cells = source.query_range(f"count_over_time({r.INTERVAL}{_window(interval)})", start + interval, end, interval)
    if progress is not None:
        progress.advance()
    present = {_ms(ts) for item in cells for ts, value in item.values if value > 0}
    phase = _phase(source, interval, sorted(present), progress)
    if phase is None:  # no evaluation at all in the range: every instant comes from the raw series
        phase = _ms(start) % _ms(interval)
    offset = (phase - _ms(start)) % _ms(interval) or _ms(interval)  # first evaluation after start, in (0, interval]
    evaluations = tuple((_ms(start) + offset + index * _ms(interval)) / 1000 for index in range(count))
    recorded = frozenset(
        index for index in range(count) if _ms(start) + (index + 1) * _ms(interval) in present
    )  # cell k holds evaluation k
    schedule = Plan(interval, evaluations, recorded)
    if recorded and r.hourly_evaluations(interval):
        schedule = Plan(interval, evaluations, recorded, _hours(ask, schedule))
    if by != "namespace":
        _check_rolled_up(ask, by, schedule, source.name)
    return schedule


def _hours(ask: Callable[[str, float], list[Series]], schedule: Plan) -> tuple[float, ...]:
    """The times of the hourly sums whose hour is whole (every evaluation recorded) and inside the evaluations of
    ``schedule``: the second level's own samples, read as they are (a range selector in an instant query). The
    second level evaluates at its own phase: a sum's hour ends between two of the split's evaluations, anywhere in
    the interval after the last one it covers."""
    at = schedule.last + schedule.lag + schedule.interval - 0.001  # its hour ends with the range's last evaluation
    earliest = schedule.first - schedule.interval + r.HOUR + schedule.lag  # its hour starts with the range
    if earliest > at:
        return ()
    # A millisecond more than the span, so that a sum at ``earliest`` is in under Prometheus 3's left-open ranges
    # too (one a millisecond before it covers an evaluation outside the range, and Plan.parts leaves it out).
    found = ask(f"{r.HOURLY_EVALUATIONS}[{_ms(at - earliest) + 1}ms]", at)
    whole = r.hourly_evaluations(schedule.interval)
    return tuple(sorted({time for item in found for time, value in item.values if value == whole}))


def _phase(source: InstantSource, interval: float, present: Sequence[int], progress: Progress | None) -> int | None:
    """The rules' evaluation times modulo the interval (ms), from one evaluation's own timestamp."""
    if not present:
        return None
    cell_end = present[-1] / 1000
    step = min(interval, 60.0)
    found = source.query_range(f"timestamp({r.INTERVAL})", cell_end - interval + step, cell_end, step)
    if progress is not None:
        progress.advance()
    stamps = [value for item in found for _, value in item.values if math.isfinite(value)]
    inside = [stamp for stamp in stamps if cell_end - interval < stamp <= cell_end]
    return _ms(max(inside)) % _ms(interval) if inside else None


def _check_rolled_up(ask: Callable[[str, float], list[Series]], by: str, schedule: Plan, name: str) -> None:
    key = by.removeprefix("label:")
    label = label_name(key)
    start, end = schedule.start, schedule.last
    if any(ask(f"group({term})", at) for term, at in over(schedule, r.GROUP_BOOKED, f'{label}!=""', "last_over_time")):
        return
    window = _window(end - start + 1)
    if ask(f'group(last_over_time({metric_names.POD_LABELS}{{{label}!=""}}{window}))', end):
        raise NotRecorded(
            f"the chargeback recording rules at {name} do not carry pod label {key!r} ({label}): regenerate them "
            f"with gpu-fence-auditor chargeback --rules --pod-label {key}, or bill from the raw series (--series raw)"
        )
    raise PrometheusError(
        f"no {metric_names.POD_LABELS} series carries {label} (pod label {key!r}) between {iso(start)} and {iso(end)}: "
        f"run the auditor with --pod-label {key}, or check the label key"
    )


def over(schedule: Plan, metric: str, matchers: str, function: str) -> list[tuple[str, float]]:
    """``function`` (``sum_over_time``, ``count_over_time``, ``last_over_time``) of ``metric{matchers}`` over every
    evaluation of ``schedule``: one (expression, time to evaluate it at) per :class:`Part`, the hourly sums' reading
    the second level's series (whose hours are already summed: counts are summed there, not counted). Each is its
    own query, evaluated at its part's end: Prometheus looks a query's series up in every block its whole time range
    touches, so a short part asked for apart costs little, where one term of a longer query would cost a month's."""
    terms = []
    for part in schedule.parts:
        name, function_here = metric, function
        if part.hourly:
            name = r.HOURLY[metric][1]
            function_here = "sum_over_time" if function == "count_over_time" else function
        selector = f"{name}{{{matchers}}}" if matchers else name
        terms.append((f"{function_here}({selector}{part.window})", part.end))
    return terms


Answer = Callable[[], list[Series]]


class _Queries:
    """The queries of one bill: instant queries at its last evaluation, over all of its evaluations
    (``sum_over_time`` skips the ones the rules did not record: they have no samples), and the timeline's range
    queries. Each is sent at once, up to ``PARALLEL`` at a time, and answered when its :data:`Answer` is called, in
    the caller's thread: the caller books the answers in a fixed order, so the sums add up in the same order
    whatever order Prometheus answers in."""

    def __init__(self, source: InstantSource, schedule: Plan, progress: Progress | None, pool: Executor) -> None:
        self.source, self.progress, self.pool, self.schedule = source, progress, pool, schedule
        self.at = schedule.at
        self.window = _window(self.at - schedule.start)  # every evaluation, for what reads the auditor's series

    def sum(self, metric: str, matchers: str, by: str, function: str = "sum_over_time") -> Answer:
        """``sum by (by)`` of ``function`` over the schedule's evaluations: a query per part, added up here, part by
        part in a fixed order."""
        answers = [
            self.send(f"sum by ({by}) ({term})", at) for term, at in over(self.schedule, metric, matchers, function)
        ]

        def added() -> list[Series]:
            totals: dict[tuple[tuple[str, str], ...], float] = {}
            labels: dict[tuple[tuple[str, str], ...], Mapping[str, str]] = {}
            for answer in answers:
                for item in answer():
                    key = tuple(sorted(item.labels.items()))
                    totals[key] = totals.get(key, 0.0) + _value(item)
                    labels.setdefault(key, item.labels)
            return [Series(labels[key], ((self.at, total),)) for key, total in totals.items()]

        return added

    def ask(self, query: str) -> list[Series]:
        return self.send(query)()

    def send(self, query: str, at: float | None = None) -> Answer:
        return self._sent(self.pool.submit(self.source.query, query, self.at if at is None else at))

    def send_range(self, query: str, start: float, end: float, step: float) -> Answer:
        return self._sent(self.pool.submit(self.source.query_range, query, start, end, step))

    def answered(self, found: list[Series]) -> Answer:
        """An answer known without asking (it still counts as a query done)."""
        future: Future[list[Series]] = Future()
        future.set_result(found)
        return self._sent(future)

    def _sent(self, future: Future[list[Series]]) -> Answer:
        def answer() -> list[Series]:
            found = future.result()
            if self.progress is not None:
                self.progress.advance()
            return found

        return answer


def _value(item: Series) -> float:
    value = item.values[0][1] if item.values else 0.0
    return value if math.isfinite(value) else 0.0


DEVICE = "node, gpu_uuid, card_uuid"


def book(
    source: InstantSource,
    schedule: Plan,
    ledger: Ledger,
    by: str,
    *,
    notes: RawNotes,
    progress: Progress | None = None,
) -> list[TimePoint]:
    """Book the recorded evaluations of ``schedule`` into ``ledger`` (the missing ones are the caller's, from the
    raw series) and return the timeline's points, ready for :func:`merge_timeline`."""
    ledger.cover(schedule.start, schedule.last)
    if not schedule.recorded:
        return []
    with ThreadPoolExecutor(PARALLEL, thread_name_prefix="chargeback-query") as pool:
        try:
            return _book(_Queries(source, schedule, progress, pool), schedule, ledger, by, notes)
        finally:
            pool.shutdown(cancel_futures=True)  # after a refusal or an error, send nothing more


def _book(q: _Queries, schedule: Plan, ledger: Ledger, by: str, notes: RawNotes) -> list[TimePoint]:
    hours = schedule.interval / 3600.0
    label = None if by == "namespace" else label_name(by.removeprefix("label:"))
    groups = "namespace" if label is None else f"namespace, {label}"

    def group(item: Series) -> str:
        return item.labels.get(label or "namespace", "") or NO_LABEL

    method = f'method="{ledger.method.value}"'
    _refuse_renamed(q)
    for item in q.sum(r.CARD, "", "node, card_uuid, model", "count_over_time")():
        labels = item.labels
        ledger.card(labels.get("node", ""), labels.get("card_uuid", ""), labels.get("model", ""), _value(item) * hours)
    if ledger.unpriced:
        return []  # the caller refuses the bill
    # Everything else at once, the longest first; booked below in this order.
    timeline = _timeline(q, schedule, ledger, method, label)
    container = f"{DEVICE}, namespace, pod, container"
    booked = q.sum(r.GROUP_BOOKED, f'{method}, charge=~"{_HELD_OR_USED}"', f"{DEVICE}, charge, {groups}")
    requested = q.sum(r.GROUP_REQUESTED, "", f"node, card_uuid, {groups}")
    usage = q.sum(r.GROUP_MEMORY, f'charge="{Charge.USAGE.value}"', f"{DEVICE}, {groups}")
    idle = q.sum(r.IDLE, method, DEVICE)
    overreach_gib = q.sum(r.MEMORY, f'charge="{Charge.OVERREACH.value}"', f"{container}, {groups}")
    overreach = q.sum(r.BOOKED, f'{method}, charge="{Charge.OVERREACH.value}"', f"{container}, {groups}")
    unattributed_gib = q.sum(r.UNATTRIBUTED_MEMORY, "", DEVICE)
    unattributed = q.sum(r.UNATTRIBUTED, method, DEVICE)
    active = q.sum(r.GROUP_ACTIVE, "", groups)
    issues = q.sum(r.ISSUE, "", "issue, node, gpu_uuid", "last_over_time")

    usage_memory: dict[tuple[Where, str, str], float] = defaultdict(float)
    for item in usage():
        usage_memory[_where(item), item.labels.get("namespace", ""), group(item)] += _value(item) / GIB * hours
    for item in booked():
        charge, namespace = Charge(item.labels.get("charge", "")), item.labels.get("namespace", "")
        gib = usage_memory.pop((_where(item), namespace, group(item)), 0.0) if charge is Charge.USAGE else 0.0
        ledger.book(_where(item), Party(charge, group(item), namespace), _value(item) * hours, gib)
    overreach_memory: dict[tuple[Party, Where], float] = defaultdict(float)
    for item in overreach_gib():
        overreach_memory[_overreach_party(item, group(item)), _where(item)] += _value(item) / GIB * hours
    for item in overreach():
        party = _overreach_party(item, group(item))
        ledger.book(_where(item), party, _value(item) * hours, overreach_memory.pop((party, _where(item)), 0.0))
    unattributed_memory = {_where(item): _value(item) / GIB * hours for item in unattributed_gib()}
    for item in unattributed():
        ledger.book(_where(item), UNATTRIBUTED_PARTY, _value(item) * hours, unattributed_memory.get(_where(item), 0.0))
    for item in idle():
        ledger.book_idle(_where(item), _value(item) * hours)
    for item in requested():
        labels = item.labels
        ledger.book_request(labels.get("node", ""), labels.get("card_uuid", ""), group(item), _value(item) * hours)
    for item in active():  # not billed: shown beside the cost
        ledger.book_active(group(item), _value(item) * hours)
    _issues(issues(), ledger, notes)
    return timeline()


def _where(item: Series) -> tuple[str, str, str]:
    labels = item.labels
    return labels.get("node", ""), labels.get("gpu_uuid", ""), labels.get("card_uuid", "")


def _overreach_party(item: Series, group: str) -> Party:
    labels = item.labels
    return Party(
        Charge.OVERREACH, group, labels.get("namespace", ""), labels.get("pod", ""), labels.get("container", "")
    )


def _refuse_renamed(q: _Queries) -> None:
    for metric in (metric_names.CONTAINER_MEMORY, metric_names.CONTAINER_ALLOCATED):
        found = q.ask(f'group by ({RENAMED}, namespace, pod) (last_over_time({metric}{{{RENAMED}!=""}}{q.window}))')
        if found:
            labels = found[0].labels
            raise PrometheusError(
                f"{metric} carries {RENAMED}={labels.get(RENAMED, '')!r}: Prometheus scraped the auditor without "
                f"honor_labels and replaced the workload's namespace/pod/container with the auditor pod's own "
                f"({labels.get('namespace', '')}/{labels.get('pod', '')}); scrape it with honor_labels: true "
                "(honorLabels in a ServiceMonitor, see docs/metrics.md)"
            )


def _issues(found: list[Series], ledger: Ledger, notes: RawNotes) -> None:
    """What the rules flagged per device, into the same sets the raw path fills (and so the same notes)."""
    targets = {r.Issue.UNKNOWN_DEVICE: ledger.unknown_devices, r.Issue.OUTSIDE_SLICES: ledger.partitioned_cards}
    if ledger.method is Method.HOLDER:
        targets[r.Issue.OFFERED_MISSING] = ledger.offered_missing
        targets[r.Issue.OVER_HELD] = ledger.over_held
    for item in found:
        issue, device = item.labels.get("issue", ""), (item.labels.get("node", ""), item.labels.get("gpu_uuid", ""))
        if issue == r.Issue.SHARE_MISSING:
            notes.missing_share.add(device[1])
        elif issue in targets:
            targets[issue].add(device)


def _timeline(
    q: _Queries, schedule: Plan, ledger: Ledger, method: str, label: str | None
) -> Callable[[], list[TimePoint]]:
    """Cost per layer at the points of ``schedule.timeline_sets``, every point ending on an evaluation and none
    reaching before the range. The queries are sent now; the points are made when the result is called."""
    prices = {card: ledger.price_of(*card) for card in ledger.cards}
    layers = _Layers(q, schedule.lag, price_classes(prices), method, label)
    made = [layers.points(part, times, size) for part, times, size in schedule.timeline_sets()]
    return lambda: [point for points in made for point in points()]


def timeline_points(evaluations: int, most: int = TIMELINE_POINTS) -> tuple[int, int]:
    """How ``evaluations`` make at most ``most`` points: the first point's evaluations (0: it is like the others)
    and every other point's."""
    merge = max(1, math.ceil(evaluations / most))
    return evaluations % merge, merge


def price_classes(prices: Mapping[tuple[str, str], float]) -> list[tuple[float, str]]:
    """The cards (node, card UUID) grouped by their price per hour, each group as label matchers selecting its
    cards' series: none when one price covers every card; else its nodes by name where every card of a node has
    that price, and card by card on a node of mixed prices. Cards at no cost are left out (they add nothing)."""
    cards_at: dict[float, list[tuple[str, str]]] = defaultdict(list)
    prices_on: dict[str, set[float]] = defaultdict(set)
    for (node, card), price in sorted(prices.items()):
        cards_at[price].append((node, card))
        prices_on[node].add(price)
    if len(cards_at) == 1:
        return [(price, "") for price in cards_at if price]
    classes = []
    for price, cards in sorted(cards_at.items()):
        if not price:
            continue
        whole = sorted({node for node, _card in cards if len(prices_on[node]) == 1})
        if whole:
            classes.append((price, f"node=~{r.string(_alternatives(whole))}"))
        mixed: dict[str, list[str]] = defaultdict(list)
        for node, card in cards:
            if len(prices_on[node]) > 1:
                mixed[node].append(card)
        classes += [
            (price, f"node={r.string(node)}, card_uuid=~{r.string(_alternatives(uuids))}")
            for node, uuids in mixed.items()
        ]
    return classes


def _alternatives(values: Sequence[str]) -> str:
    """A regex (anchored by PromQL's ``=~``) matching exactly ``values``; Prometheus looks such a set up in its
    index value by value instead of running the regex over every label value."""
    return "|".join(re.escape(value) for value in values)


@dataclass(frozen=True)
class _Layers:
    """The timeline's layers (groups, overreach, unattributed, idle) as one range query of card ratios summed per
    price class, priced here by the ledger's prices. Nothing is joined in Prometheus: a join with the cards' prices
    at every point cost more than all of the bill's sums together, and grew with the cards and the price list."""

    q: _Queries
    lag: float  # how long before its own time an hourly sum's hour ends
    classes: Sequence[tuple[float, str]]  # (price per hour, matchers selecting the cards at that price)
    method: str  # the method's label matcher
    label: str | None  # the pod label grouped by, or None for namespaces

    def points(self, part: Part, ends: Sequence[float], size: int) -> Callable[[], list[TimePoint]]:
        """Every layer's cost over the ``size`` samples of ``part``'s series up to each of ``ends`` (evaluations, or
        hourly sums): asked now, made when called."""
        if not ends:
            return list
        span = size * part.step
        window = _window(span)

        def layer(term: int, metric: str, matchers: str, by: str, name: str | None) -> str:
            cards = self.classes[term][1]
            if part.hourly:  # the sums per node, unless this price is a choice of cards on a node of several
                metric = r.HOURLY[metric][1] if "card_uuid" in cards else r.PER_NODE[metric]
            summed = f"sum by ({by}) (sum_over_time({metric}{{{matchers}{', ' + cards if cards else ''}}}{window}))"
            named = (
                f'label_replace({summed}, "layer", "$1", "{by}", "(.*)")'
                if name is None
                else f'label_replace({summed}, "layer", {r.string(name)}, "", "")'
            )
            return f'label_replace({named}, "price_class", "{term}", "", "")'

        by = self.label or "namespace"
        layers = [
            (r.GROUP_BOOKED, f'{self.method}, charge=~"{_HELD_OR_USED}"', by, None),
            (r.GROUP_BOOKED, f'{self.method}, charge="{Charge.OVERREACH.value}"', "", OVERREACH),
            (r.UNATTRIBUTED, self.method, "", UNATTRIBUTED),
            (r.IDLE, self.method, "", IDLE),
        ]
        terms = [layer(term, *each) for term in range(len(self.classes)) for each in layers]
        # Every card free: nothing to ask, and no cost to chart.
        answer = self.q.send_range(" or ".join(terms), ends[0], ends[-1], span) if terms else self.q.answered([])
        hours = self.q.schedule.interval / 3600.0  # each sample is an evaluation's card ratios, summed or not
        shift = self.lag if part.hourly else 0.0  # an hourly sum at T stands for the hour ending at T - lag

        def made() -> list[TimePoint]:
            costs: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
            for item in answer():
                name = item.labels.get("layer", "") or NO_LABEL
                price = self.classes[int(item.labels.get("price_class", "0"))][0]
                for ts, value in item.values:
                    if math.isfinite(value):
                        costs[_ms(ts)][name] += value * price * hours
            return [
                TimePoint(end=end - shift, costs=nonzero(costs.get(_ms(end), {})), start=end - shift - span)
                for end in ends
            ]

        return made


def merge_timeline(points: Sequence[TimePoint], filled: Sequence[TimePoint]) -> list[TimePoint]:
    """The recorded points with the raw series' points (the evaluations the rules missed) added to the point whose
    span holds them; without recorded points, the raw ones as they are."""
    if not points:
        return list(filled)
    merged = [dict(point.costs) for point in points]
    ends = [_ms(point.end) for point in points]
    for point in filled:
        index = bisect.bisect_left(ends, _ms(point.end))
        if index < len(points) and _ms(points[index].start) < _ms(point.end):
            for name, cost in point.costs.items():
                merged[index][name] = merged[index].get(name, 0.0) + cost
    return [
        TimePoint(end=point.end, costs=costs, start=point.start) for point, costs in zip(points, merged, strict=True)
    ]
