"""Pure cost computation: samples of the auditor's metrics at evenly spaced instants → a bill per group.

No I/O, no clock. ``prometheus.py`` fetches the samples, ``__init__.py`` wires the command, this module only
does arithmetic, in the order ``docs/chargeback.md`` describes:

1. Each evaluation instant stands for the ``seconds`` before it (one query step).
2. A card (a physical GPU) costs ``price per hour × seconds / 3600`` in that interval. A card partitioned by MIG
   is split into its slices by ``gpu_fence_gpu_share_ratio``; the share no slice covers is idle.
3. The cost of a GPU or slice is split among everything that holds memory on it in that interval, in proportion
   to the bytes: containers with an allocation (their group's usage), containers without one (overreach, kept
   apart), and processes outside any container (the unattributed row). A GPU or slice with no memory in use is
   idle for that interval.
4. Idle, ``platform``: all of it goes to the platform row. ``proportional``: each card's idle over the whole range
   is spread over the parties that used that card in the range, in proportion to what they were charged on it;
   a card nobody used in the whole range has nobody to spread to, so its idle goes to the platform row.
5. Beside it, the request-based figure: allocated ids × the device's share of a card × price × hours.

Every unit of GPU cost lands in exactly one place (a group's usage or idle share, an overreach row, the
unattributed row, the platform row), so those add up to the cost of all cards over the range.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

GIB = 1 << 30


class IdlePolicy(Enum):
    PROPORTIONAL = "proportional"
    PLATFORM = "platform"


@dataclass(frozen=True)
class Device:
    """One ``gpu_fence_gpu_info`` series: a whole GPU (``parent_uuid`` empty) or a MIG slice of one."""

    node: str
    uuid: str
    parent_uuid: str
    model: str
    share: float = 1.0  # gpu_fence_gpu_share_ratio; 1 for a whole GPU

    @property
    def card(self) -> tuple[str, str]:
        return (self.node, self.parent_uuid or self.uuid)


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str
    group: str


@dataclass(frozen=True)
class Memory:
    """``gpu_fence_container_gpu_memory_bytes`` at one instant."""

    node: str
    gpu_uuid: str
    owner: ContainerRef
    allocated: bool
    bytes: float


@dataclass(frozen=True)
class Allocation:
    """``gpu_fence_container_allocated_gpus`` at one instant (allocation ids held on that device)."""

    node: str
    gpu_uuid: str
    owner: ContainerRef
    count: float


@dataclass(frozen=True)
class Unattributed:
    """``gpu_fence_unattributed_gpu_memory_bytes`` at one instant."""

    node: str
    gpu_uuid: str
    bytes: float


@dataclass(frozen=True)
class Interval:
    """Everything Prometheus returned for one evaluation instant ``end``, standing for ``seconds`` before it."""

    end: float
    seconds: float
    devices: tuple[Device, ...] = ()
    memory: tuple[Memory, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    unattributed: tuple[Unattributed, ...] = ()


@dataclass(frozen=True)
class GroupCost:
    group: str
    usage: float = 0.0  # memory share of the cost of the GPUs it used, with an allocation
    idle: float = 0.0  # its share of idle capacity (proportional policy only)
    overreach: float = 0.0  # memory share where it had NO allocation: not part of total, billed or written off apart
    request: float = 0.0  # what a request-based tool charges: allocated GPUs × hours × price
    requested_gpu_hours: float = 0.0
    memory_gib_hours: float = 0.0
    overreach_gib_hours: float = 0.0

    @property
    def total(self) -> float:
        """The usage-based bill of this group (overreach stays apart)."""
        return self.usage + self.idle

    @property
    def difference(self) -> float:
        """Usage-based minus request-based: negative when requests overstate what the group used."""
        return self.total - self.request


@dataclass(frozen=True)
class OverreachRow:
    """One container's memory on a GPU or slice it was not allocated, priced like any other memory."""

    owner: ContainerRef
    node: str
    gpu_uuid: str
    gib_hours: float
    cost: float


@dataclass(frozen=True)
class TimePoint:
    """Cost booked in one interval, by layer (group names, plus ``OVERREACH``, ``UNATTRIBUTED``, ``IDLE``)."""

    end: float
    costs: Mapping[str, float]


OVERREACH = "(overreach)"
UNATTRIBUTED = "(unattributed)"
IDLE = "(idle)"
PLATFORM = "(platform)"


@dataclass(frozen=True)
class Bill:
    idle_policy: IdlePolicy
    currency: str
    start: float
    end: float
    groups: tuple[GroupCost, ...]
    overreach: tuple[OverreachRow, ...]
    unattributed: float  # cost of memory outside any container, with its idle share under proportional
    unattributed_gib_hours: float
    platform: float  # idle charged to the platform (all idle under platform; unused cards under proportional)
    total_gpu_cost: float  # every card × price × time over the range
    gpu_hours: float  # card-hours seen (a MIG card counts once)
    timeline: tuple[TimePoint, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def accounted(self) -> float:
        """Sum of every place cost landed; equals ``total_gpu_cost`` up to rounding."""
        groups = sum(group.total + group.overreach for group in self.groups)
        return groups + self.unattributed + self.platform


PriceLookup = Callable[[str, str], "float | None"]


# A "party" is who a share of a card's cost is booked to: ("usage", group), ("overreach", (owner, node, gpu)),
# ("unattributed",). Idle is spread over parties in proportion to what each was booked on the card.
Party = tuple


def card_models(devices: Iterable[Device]) -> dict[tuple[str, str], str]:
    """The model to price each card by: the card's own series if the auditor exported it, else a slice's."""
    models: dict[tuple[str, str], str] = {}
    for device in devices:
        if not device.parent_uuid:
            models[device.card] = device.model
    for device in devices:
        models.setdefault(device.card, device.model)
    return models


def compute_bill(
    intervals: Iterable[Interval],
    price_per_hour: PriceLookup,
    idle_policy: IdlePolicy,
    currency: str = "USD",
) -> Bill:
    intervals = tuple(intervals)
    usage: dict[str, float] = defaultdict(float)
    memory_gib_hours: dict[str, float] = defaultdict(float)
    request: dict[str, float] = defaultdict(float)
    requested_hours: dict[str, float] = defaultdict(float)
    overreach_cost: dict[tuple, float] = defaultdict(float)
    overreach_gib_hours: dict[tuple, float] = defaultdict(float)
    unattributed = 0.0
    unattributed_gib_hours = 0.0
    platform = 0.0
    total = 0.0
    gpu_hours = 0.0
    card_idle: dict[tuple[str, str], float] = defaultdict(float)
    card_parties: dict[tuple[str, str], dict[Party, float]] = defaultdict(lambda: defaultdict(float))
    unpriced: set[tuple[str, str]] = set()
    unknown_devices: set[tuple[str, str]] = set()
    partitioned_cards: set[tuple[str, str]] = set()  # memory booked on a MIG card's own UUID, outside its slices
    timeline: list[TimePoint] = []

    for interval in intervals:
        hours = interval.seconds / 3600.0
        layer: dict[str, float] = defaultdict(float)
        devices = {(device.node, device.uuid): device for device in interval.devices}
        models = card_models(devices.values())
        card_price: dict[tuple[str, str], float] = {}
        for card, model in models.items():
            price = price_per_hour(card[0], model)
            if price is None:
                unpriced.add((card[0], model))
                price = 0.0
            card_price[card] = price

        consumers: dict[tuple[str, str], list[tuple[Party, float, float]]] = defaultdict(list)
        for sample in interval.memory:
            if sample.bytes <= 0:
                continue
            if sample.allocated:
                party: Party = ("usage", sample.owner.group)
            else:
                party = ("overreach", (sample.owner, sample.node, sample.gpu_uuid))
            consumers[(sample.node, sample.gpu_uuid)].append((party, sample.bytes, hours))
        for sample in interval.unattributed:
            if sample.bytes > 0:
                consumers[(sample.node, sample.gpu_uuid)].append((("unattributed",), sample.bytes, hours))

        slices: dict[tuple[str, str], list[Device]] = defaultdict(list)
        for device in devices.values():
            if device.parent_uuid:
                slices[device.card].append(device)

        for card, price in card_price.items():
            card_cost = price * hours
            total += card_cost
            gpu_hours += hours
            if slices.get(card):
                units = [(device, device.share * card_cost) for device in slices[card]]
                covered = sum(device.share for device in slices[card])
                uncovered = max(0.0, 1.0 - covered) * card_cost
                card_idle[card] += uncovered
                layer[IDLE] += uncovered
            else:
                units = [(devices[card], card_cost)]
            for device, unit_cost in units:
                holders = consumers.pop((device.node, device.uuid), [])
                in_use = sum(held for _, held, _ in holders)
                if in_use <= 0:
                    card_idle[card] += unit_cost
                    layer[IDLE] += unit_cost
                    continue
                for party, held, party_hours in holders:
                    cost = unit_cost * held / in_use
                    gib_hours = held / GIB * party_hours
                    card_parties[card][party] += cost
                    if party[0] == "usage":
                        usage[party[1]] += cost
                        memory_gib_hours[party[1]] += gib_hours
                        layer[party[1]] += cost
                    elif party[0] == "overreach":
                        overreach_cost[party[1]] += cost
                        overreach_gib_hours[party[1]] += gib_hours
                        layer[OVERREACH] += cost
                    else:
                        unattributed += cost
                        unattributed_gib_hours += gib_hours
                        layer[UNATTRIBUTED] += cost
        for key in consumers:
            device = devices.get(key)
            if device is not None and slices.get(device.card):
                partitioned_cards.add(key)
            else:
                unknown_devices.add(key)

        for allocation in interval.allocations:
            device = devices.get((allocation.node, allocation.gpu_uuid))
            if device is None:
                unknown_devices.add((allocation.node, allocation.gpu_uuid))
                continue
            share = device.share if device.parent_uuid else 1.0
            group = allocation.owner.group
            requested_hours[group] += allocation.count * share * hours
            request[group] += allocation.count * share * card_price[device.card] * hours
        timeline.append(TimePoint(end=interval.end, costs=dict(layer)))

    idle_share: dict[str, float] = defaultdict(float)
    for card, idle in card_idle.items():
        parties = card_parties.get(card)
        booked = sum(parties.values()) if parties else 0.0
        if idle_policy is IdlePolicy.PLATFORM or booked <= 0:
            platform += idle
            continue
        for party, cost in parties.items():
            portion = idle * cost / booked
            if party[0] == "usage":
                idle_share[party[1]] += portion
            elif party[0] == "overreach":
                overreach_cost[party[1]] += portion
            else:
                unattributed += portion

    overreach_by_group: dict[str, float] = defaultdict(float)
    overreach_hours_by_group: dict[str, float] = defaultdict(float)
    rows = []
    for (owner, node, gpu), cost in overreach_cost.items():
        overreach_by_group[owner.group] += cost
        overreach_hours_by_group[owner.group] += overreach_gib_hours[(owner, node, gpu)]
        rows.append(OverreachRow(owner, node, gpu, overreach_gib_hours[(owner, node, gpu)], cost))
    rows.sort(key=lambda row: (-row.cost, row.owner.namespace, row.owner.pod, row.owner.container, row.gpu_uuid))

    names = set(usage) | set(request) | set(overreach_by_group) | set(idle_share)
    groups = sorted(
        (
            GroupCost(
                group=name,
                usage=usage.get(name, 0.0),
                idle=idle_share.get(name, 0.0),
                overreach=overreach_by_group.get(name, 0.0),
                request=request.get(name, 0.0),
                requested_gpu_hours=requested_hours.get(name, 0.0),
                memory_gib_hours=memory_gib_hours.get(name, 0.0),
                overreach_gib_hours=overreach_hours_by_group.get(name, 0.0),
            )
            for name in names
        ),
        key=lambda group: (-group.total, -group.request, group.group),
    )

    notes = []
    for node, model in sorted(unpriced):
        notes.append(f"no price for GPU model {model!r} on node {node!r}: priced at 0")
    if unknown_devices:
        sample = ", ".join(f"{node}/{gpu}" for node, gpu in sorted(unknown_devices)[:3])
        notes.append(
            f"{len(unknown_devices)} device(s) had memory or allocations but no gpu_fence_gpu_info series "
            f"at the same instant, so they were not priced (e.g. {sample})"
        )
    if partitioned_cards:
        sample = ", ".join(f"{node}/{gpu}" for node, gpu in sorted(partitioned_cards)[:3])
        notes.append(
            f"{len(partitioned_cards)} MIG-partitioned card(s) had memory booked on the card itself, outside any slice "
            f"(processes NVML could not place in a MIG device); a MIG card is priced by its slices, so that memory "
            f"was not priced (e.g. {sample})"
        )
    start = intervals[0].end - intervals[0].seconds if intervals else 0.0
    end = intervals[-1].end if intervals else 0.0
    return Bill(
        idle_policy=idle_policy,
        currency=currency,
        start=start,
        end=end,
        groups=tuple(groups),
        overreach=tuple(rows),
        unattributed=unattributed,
        unattributed_gib_hours=unattributed_gib_hours,
        platform=platform,
        total_gpu_cost=total,
        gpu_hours=gpu_hours,
        timeline=tuple(timeline),
        notes=tuple(notes),
    )
