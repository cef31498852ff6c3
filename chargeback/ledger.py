"""The bill's method, pure: samples of the auditor's metrics at evenly spaced instants → a bill per group.

No I/O, no clock. ``raw.py`` (or ``recorded.py``, with the recording rules' sums) feeds the :class:`Ledger`, which
sums what it booked into the :class:`~.bill.Bill` of ``bill.py``; this module only does arithmetic, in the order
``docs/chargeback.md`` states it:

1. Each evaluation instant stands for the ``seconds`` before it (one query step).
2. A card (a physical GPU) costs ``price per hour × seconds / 3600`` in that interval. A card partitioned by MIG
   is split into its slices by ``gpu_fence_gpu_share_ratio``; the share no slice covers is idle. A GPU or slice
   is a *unit*.
3. Method ``holder`` (the default): what an allocation blocks, its holder pays. A holder of a unit that has no
   memory on it pays ``ids it holds / replicas offered`` of the unit (``reserved``; the replicas the device
   plugin offers come from ``gpu_fence_gpu_offered_replicas``, and when that is missing the holders are taken to
   hold every replica). The rest of the unit is split by bytes among everything holding memory on it:
   containers with an allocation (their group's usage), containers without one (overreach, a column of theirs) and
   processes outside any container (the unattributed row). With no memory on it, the rest is idle: capacity
   nobody holds. Method ``usage``: holders pay only through memory, so a held unit with no memory is idle.
   Overreach is paid by the group of the container that used the capacity without an allocation: a column of its
   own, inside that group's total, so that every unit of cost sits in a row.
4. Idle, ``platform``: all of it goes to the platform row. ``proportional``: each card's idle over the whole range
   is spread over the parties booked on that card in the range, in proportion to what they were booked on it; a
   card nobody was booked on has nobody to spread to, so its idle goes to the platform row.
5. Beside it, the request-based figure: allocated ids × the device's share of a card × price × hours.

Every unit of GPU cost lands in exactly one :class:`Line` of the ledger (a group's usage, reserved or idle share,
an overreach row, the unattributed row, the platform row), so the lines add up to the cost of all cards over the
range; the per-group figures, the overreach rows and the per-card breakdown are sums over those lines.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpu_fence import metric_names

from .bill import (
    IDLE,
    OVERREACH,
    UNATTRIBUTED,
    Bill,
    CardCost,
    Charge,
    GroupCost,
    IdlePolicy,
    Line,
    Method,
    OverreachRow,
    TimePoint,
)
from .prices import card_model
from .samples import ContainerRef, Device, Interval

GIB = 1 << 30
# A MIG card's share in no slice below this is the rounding of its slices' ratios (3/7 + 2/7 + 2/7), not capacity.
ROUNDING = 1e-9


PriceLookup = Callable[[str, str], "float | None"]


# The hot path keys dicts by these on every interval: NamedTuples hash and compare at C speed, where a frozen
# dataclass (ContainerRef included) runs a Python __hash__ each time.
class _Who(NamedTuple):
    """A container, as the split keys it."""

    namespace: str
    pod: str
    container: str
    group: str


class Party(NamedTuple):
    """Who a share of a unit is booked to; idle is spread over parties in proportion to what each was booked.
    ``pod``/``container`` are set for overreach only (each offending container is a row of its own); the
    unattributed and platform rows have neither group nor namespace."""

    charge: Charge
    group: str = ""
    namespace: str = ""
    pod: str = ""
    container: str = ""

    @classmethod
    def of(cls, charge: Charge, who: _Who) -> Party:
        if charge is Charge.OVERREACH:
            return cls(charge, who.group, who.namespace, who.pod, who.container)
        return cls(charge, who.group, who.namespace)


_UNATTRIBUTED = Party(Charge.UNATTRIBUTED)
UNATTRIBUTED_PARTY = _UNATTRIBUTED


@dataclass(frozen=True)
class _Owner:
    """A container's key and its parties, made once per ContainerRef object."""

    who: _Who
    usage: Party
    overreach: Party


class _Owners:
    """The sources reuse one ContainerRef per series; work out its key and parties once per object, not per sample."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[ContainerRef, _Owner]] = {}  # the entry keeps the object alive: ids stay unique

    def of(self, ref: ContainerRef) -> _Owner:
        found = self._by_id.get(id(ref))
        if found is None or found[0] is not ref:
            who = _Who(ref.namespace, ref.pod, ref.container, ref.group)
            found = self._by_id[id(ref)] = (
                ref,
                _Owner(who, Party.of(Charge.USAGE, who), Party.of(Charge.OVERREACH, who)),
            )
        return found[1]


class _User(NamedTuple):
    """Memory on a unit in one interval: who holds it (None for processes outside any container) and how much."""

    party: Party
    who: _Who | None
    bytes: float


class Booking(NamedTuple):
    """A share of a unit: to whom (``who`` is None for the unattributed row), as what, how many card-hours, with
    how many bytes of memory behind it (0 for a reservation)."""

    party: Party
    who: _Who | None
    card_hours: float
    bytes: float


class _Split(NamedTuple):
    bookings: list[Booking]
    idle: float
    offered_missing: bool  # a holder paid a reserved share with the offered replicas unknown
    over_held: bool  # more ids held than the device plugin offers


def split_unit(
    amount: float,
    holders: Mapping[_Who, float],
    offered: float | None,
    users: Sequence[_User],
    method: Method,
) -> _Split:
    """One unit in one interval: who pays which part of its ``amount`` (card-hours), and what is left idle.

    The heart of the method; linear in ``amount``, so splitting card-hours and pricing them is splitting cost.
    ``rules.py`` writes the same steps in PromQL.
    """
    bookings: list[Booking] = []
    offered_missing = over_held = False
    reserved = 0.0
    if method is Method.HOLDER and holders:
        using = {user.who for user in users}
        idle_holders = [(who, ids) for who, ids in holders.items() if who not in using]
        if idle_holders:
            held = sum(holders.values())
            known = offered if offered is not None and offered > 0 else None
            # Missing offered count: take the holders to hold every replica (exact for an unshared GPU).
            replicas = held if known is None else known
            offered_missing = known is None
            over_held = known is not None and held > known
            for who, ids in idle_holders:
                share = amount * ids / max(replicas, held)
                reserved += share
                bookings.append(Booking(Party.of(Charge.RESERVED, who), who, share, 0.0))
    rest = max(0.0, amount - reserved)
    in_use = sum(user.bytes for user in users)
    if in_use <= 0:
        return _Split(bookings, rest, offered_missing, over_held)
    for user in users:
        bookings.append(Booking(user.party, user.who, rest * user.bytes / in_use, user.bytes))
    return _Split(bookings, 0.0, offered_missing, over_held)


def card_models(devices: Iterable[Device]) -> dict[tuple[str, str], str]:
    """The model to price each card by: the card's own series if the auditor exported it, else a slice's model
    without its MIG profile (``NVIDIA A100-SXM4-40GB MIG 3g.20gb`` is a slice of an ``NVIDIA A100-SXM4-40GB``)."""
    models: dict[tuple[str, str], str] = {}
    for device in devices:
        if not device.parent_uuid:
            models[device.card] = device.model
    for device in devices:
        models.setdefault(device.card, card_model(device.model))
    return models


def _sample(items: Iterable[tuple[str, str]], limit: int = 3) -> str:
    return ", ".join(f"{node}/{gpu}" for node, gpu in sorted(items)[:limit])


class UnitSplit(NamedTuple):
    """One unit's split in one interval, as the recording rules record it."""

    device: Device
    card_uuid: str
    hours: float  # the unit's card-hours in the interval
    split: _Split


class IntervalSplit(NamedTuple):
    """Everything one interval books, before prices: the units' splits, MIG capacity in no slice, and the notes'
    raw material. ``cards`` maps each card present to the model it is priced by."""

    cards: Mapping[tuple[str, str], str]
    units: list[UnitSplit]
    uncovered: Mapping[tuple[str, str], float]  # card → card-hours no slice covers
    unplaced: set[tuple[str, str]]  # memory on devices that are not units: unknown, or a partitioned card
    partitioned: set[tuple[str, str]]
    unknown_allocations: set[tuple[str, str]]


def split_interval(interval: Interval, method: Method, owners: _Owners | None = None) -> IntervalSplit:
    """Split every unit of one interval (in card-hours): steps 2 and 3 of the module's docstring."""
    known = owners or _Owners()
    hours = interval.seconds / 3600.0
    devices = {(device.node, device.uuid): device for device in interval.devices}
    models = card_models(devices.values())
    users: dict[tuple[str, str], list[_User]] = defaultdict(list)
    for sample in interval.memory:
        if sample.bytes > 0:
            owner = known.of(sample.owner)
            party = owner.usage if sample.allocated else owner.overreach
            users[(sample.node, sample.gpu_uuid)].append(_User(party, owner.who, sample.bytes))
    for stray in interval.unattributed:
        if stray.bytes > 0:
            users[(stray.node, stray.gpu_uuid)].append(_User(_UNATTRIBUTED, None, stray.bytes))
    holders: dict[tuple[str, str], dict[_Who, float]] = defaultdict(lambda: defaultdict(float))
    if method is Method.HOLDER:  # the usage method never asks who holds a unit
        for allocation in interval.allocations:
            who = known.of(allocation.owner).who
            holders[(allocation.node, allocation.gpu_uuid)][who] += allocation.count
    offered = {(item.node, item.gpu_uuid): item.replicas for item in interval.offered}

    slices: dict[tuple[str, str], list[Device]] = defaultdict(list)
    for device in devices.values():
        if device.parent_uuid:
            slices[device.card].append(device)
    units: list[UnitSplit] = []
    uncovered: dict[tuple[str, str], float] = {}
    for card in models:
        if slices.get(card):
            pieces = [(device, device.share * hours) for device in slices[card]]
            free = 1.0 - sum(device.share for device in slices[card])
            uncovered[card] = free * hours if free > ROUNDING else 0.0
        else:
            pieces = [(devices[card], hours)]
        for device, unit_hours in pieces:
            key = (device.node, device.uuid)
            split = split_unit(unit_hours, holders.get(key, {}), offered.get(key), users.pop(key, []), method)
            units.append(UnitSplit(device, card[1], unit_hours, split))
    partitioned = {key for key in users if key in devices and slices.get(devices[key].card)}
    unknown = {(item.node, item.gpu_uuid) for item in interval.allocations} - devices.keys()
    return IntervalSplit(models, units, uncovered, set(users) - partitioned, partitioned, unknown)


@dataclass(slots=True)
class _CardSums:
    """One card's running sums in a ledger: the model it is priced by, its price, and its hours and cost so far."""

    model: str
    price: float
    hours: float = 0.0
    cost: float = 0.0


class Ledger:
    """The running sums of a bill: every booking, idle amount, request and card, interval by interval
    (:meth:`add`) or as sums some other evaluation made (:meth:`book` and friends, ``recorded.py``), until
    :meth:`bill` spreads idle and writes the report. Amounts are kept in card-hours beside their cost, so a line's
    quantity stays known even at a price of 0."""

    def __init__(self, price_per_hour: PriceLookup, method: Method) -> None:
        self.price_per_hour = price_per_hour
        self.method = method
        # (node, device, card, party) → [cost, GiB-hours, card-hours]
        self.booked: dict[tuple[str, str, str, Party], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
        self.idle: dict[Where, list[float]] = defaultdict(lambda: [0.0, 0.0])  # → [cost, card-hours]
        self.request: dict[str, float] = defaultdict(float)
        self.requested_hours: dict[str, float] = defaultdict(float)
        self.cards: dict[tuple[str, str], _CardSums] = {}
        self.timeline: list[TimePoint] = []
        self.unpriced: set[tuple[str, str]] = set()
        self.unknown_devices: set[tuple[str, str]] = set()
        self.partitioned_cards: set[tuple[str, str]] = set()  # memory on a MIG card's own UUID, outside its slices
        self.offered_missing: set[tuple[str, str]] = set()
        self.over_held: set[tuple[str, str]] = set()
        self.active: dict[str, float] = defaultdict(float)  # group → SM-active GPU-hours (not billed)
        self.start: float | None = None
        self.end: float | None = None
        self._owners = _Owners()

    def cover(self, start: float, end: float) -> None:
        """Widen the billed range to include ``(start, end]``."""
        self.start = start if self.start is None else min(self.start, start)
        self.end = end if self.end is None else max(self.end, end)

    def card(self, node: str, card: str, model: str, hours: float) -> float:
        """A card present for ``hours``; returns its price (0, with a note, when the price list has none)."""
        row = self.cards.get((node, card))
        if row is None:
            price = self.price_per_hour(node, model)
            if price is None:
                self.unpriced.add((node, model))
                price = 0.0
            row = self.cards[(node, card)] = _CardSums(model, price)
        row.hours += hours
        row.cost += row.price * hours
        return row.price

    def price_of(self, node: str, card: str) -> float:
        row = self.cards.get((node, card))
        return 0.0 if row is None else row.price

    def book(self, where: Where, party: Party, card_hours: float, gib_hours: float = 0.0) -> float:
        """``card_hours`` of a card booked to ``party`` on a device (``where``: node, device, card), priced as
        that card; returns the cost."""
        node, device, card = where
        entry = self.booked[(node, device, card, party)]
        cost = card_hours * self.price_of(node, card)
        entry[0] += cost
        entry[1] += gib_hours
        entry[2] += card_hours
        return cost

    def book_idle(self, where: Where, card_hours: float) -> float:
        cost = card_hours * self.price_of(where[0], where[2])
        _add(self.idle[where], cost, card_hours)
        return cost

    def book_request(self, node: str, card: str, group: str, card_hours: float) -> None:
        self.requested_hours[group] += card_hours
        self.request[group] += card_hours * self.price_of(node, card)

    def book_active(self, group: str, gpu_hours: float) -> None:
        """SM-active GPU-hours of a group, shown beside its cost and never billed."""
        self.active[group] += gpu_hours

    def add(self, interval: Interval) -> None:
        """Split one interval and book it."""
        self.cover(interval.end - interval.seconds, interval.end)
        hours = interval.seconds / 3600.0
        for sample in interval.activity:
            self.book_active(sample.owner.group, min(1.0, sample.ratio) * hours)
        split = split_interval(interval, self.method, self._owners)
        layer: dict[str, float] = defaultdict(float)
        for (node, card), model in split.cards.items():
            self.card(node, card, model, hours)
        for (node, card), uncovered in split.uncovered.items():
            layer[IDLE] += self.book_idle((node, card, card), uncovered)
        for unit in split.units:
            key = (unit.device.node, unit.device.uuid)
            if unit.split.offered_missing:
                self.offered_missing.add(key)
            if unit.split.over_held:
                self.over_held.add(key)
            where = (key[0], key[1], unit.card_uuid)
            layer[IDLE] += self.book_idle(where, unit.split.idle)
            for booking in unit.split.bookings:
                cost = self.book(where, booking.party, booking.card_hours, booking.bytes / GIB * hours)
                layer[_layer(booking.party)] += cost
        self.partitioned_cards |= split.partitioned
        self.unknown_devices |= split.unplaced | split.unknown_allocations
        devices = {(device.node, device.uuid): device for device in interval.devices}
        for allocation in interval.allocations:
            device = devices.get((allocation.node, allocation.gpu_uuid))
            if device is not None:
                share = device.share if device.parent_uuid else 1.0
                self.book_request(device.node, device.card[1], allocation.owner.group, allocation.count * share * hours)
        self.timeline.append(TimePoint(end=interval.end, costs=nonzero(layer), start=interval.end - interval.seconds))

    def bill(self, idle_policy: IdlePolicy, currency: str = "USD", notes: Sequence[str] = ()) -> Bill:
        model_of = {card: row.model for card, row in self.cards.items()}
        entries: list[Entry] = [
            ((node, device, card), party, amounts) for (node, device, card, party), amounts in self.booked.items()
        ]
        entries += _idle_entries(self.idle, self.booked, idle_policy)
        lines = _merged_lines(entries, model_of)
        unused: dict[tuple[str, str], float] = defaultdict(float)
        for (node, _device, card), (cost, _hours) in self.idle.items():
            unused[(node, card)] += cost
        cards = tuple(
            CardCost(node, uuid, row.model, row.price, row.hours, row.cost, unused[(node, uuid)])
            for (node, uuid), row in sorted(self.cards.items())
        )
        return _bill(
            (self.start or 0.0, self.end or 0.0),
            lines,
            cards,
            request=self.request,
            requested_hours=self.requested_hours,
            active=self.active,
            timeline=sorted(self.timeline, key=lambda point: point.end),
            method=self.method,
            idle_policy=idle_policy,
            currency=currency,
            notes=[*notes, *self.notes()],
        )

    def notes(self) -> list[str]:
        return _notes(self.unpriced, self.unknown_devices, self.partitioned_cards, self.offered_missing, self.over_held)


def compute_bill(
    intervals: Iterable[Interval],
    price_per_hour: PriceLookup,
    idle_policy: IdlePolicy,
    currency: str = "USD",
    method: Method = Method.HOLDER,
) -> Bill:
    ledger = Ledger(price_per_hour, method)
    for interval in intervals:
        ledger.add(interval)
    return ledger.bill(idle_policy, currency)


def nonzero(costs: Mapping[str, float]) -> dict[str, float]:
    """A timeline point's layers that cost something (a chart draws nothing for the rest)."""
    return {name: cost for name, cost in costs.items() if cost}


def _add(amounts: list[float], *values: float) -> None:
    for index, value in enumerate(values):
        amounts[index] += value


def _layer(party: Party) -> str:
    if party.charge is Charge.OVERREACH:
        return OVERREACH
    if party.charge is Charge.UNATTRIBUTED:
        return UNATTRIBUTED
    return party.group


Where = tuple[str, str, str]  # (node, device, card)
Entry = tuple[Where, Party, Sequence[float]]  # amounts: [cost, GiB-hours, card-hours]


def _idle_entries(
    idle_at: Mapping[Where, Sequence[float]],
    ledger: Mapping[tuple[str, str, str, Party], Sequence[float]],
    idle_policy: IdlePolicy,
) -> list[Entry]:
    """Idle to the platform, or (proportional) spread per card over what was booked on it, in card-hours booked."""
    booked: dict[tuple[str, str], dict[tuple[str, Party], float]] = defaultdict(lambda: defaultdict(float))
    for (node, device, card, party), (_cost, _gib, card_hours) in ledger.items():
        booked[(node, card)][(device, party)] += card_hours
    card_idle: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    entries: list[Entry] = []
    for (node, device, card), (cost, hours) in idle_at.items():
        if hours <= 0:
            continue
        parties = booked.get((node, card))
        if idle_policy is IdlePolicy.PLATFORM or not parties or sum(parties.values()) <= 0:
            entries.append(((node, device, card), Party(Charge.PLATFORM), (cost, 0.0, hours)))
        else:
            _add(card_idle[(node, card)], cost, hours)
    for (node, card), (cost, hours) in card_idle.items():
        parties = booked[(node, card)]
        total = sum(parties.values())
        for (device, party), weight in parties.items():
            # The idle share keeps the party's kind where that kind has a column or row of its own (overreach,
            # unattributed).
            apart = party.charge in (Charge.OVERREACH, Charge.UNATTRIBUTED)
            share = party if apart else _idle_party(party)
            entries.append(((node, device, card), share, (cost * weight / total, 0.0, hours * weight / total)))
    return entries


def _merged_lines(entries: Iterable[Entry], model_of: Mapping[tuple[str, str], str]) -> list[Line]:
    """One line per (device, party): an overreach row's idle share joins its memory share."""
    merged: dict[tuple[Where, Party], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for where, party, amounts in entries:
        _add(merged[(where, party)], *amounts)
    lines = []
    for ((node, device, card), party), (cost, gib_hours, card_hours) in merged.items():
        lines.append(
            Line(
                node=node,
                device_uuid=device,
                card_uuid=card,
                model=model_of[(node, card)],
                charge=party.charge,
                group=party.group,
                namespace=party.namespace,
                pod=party.pod,
                container=party.container,
                cost=cost,
                gib_hours=gib_hours,
                card_hours=card_hours,
            )
        )
    lines.sort(key=lambda line: (line.node, line.card_uuid, line.device_uuid, line.charge.value, line.group))
    return lines


def _rank(amount: float) -> float:
    """An amount as rows are ordered by it: to a millionth, so that sums made in another order (the recorded and
    the raw series' bills) order equal amounts the same way, by name."""
    return round(amount, 6)


def _idle_party(party: Party) -> Party:
    return Party(Charge.IDLE_SHARE, party.group, party.namespace)


_GROUP_FIELD = {Charge.USAGE: "usage", Charge.RESERVED: "reserved", Charge.IDLE_SHARE: "idle"}


def _bill(
    span: tuple[float, float],
    lines: Sequence[Line],
    cards: tuple[CardCost, ...],
    *,
    request: Mapping[str, float],
    requested_hours: Mapping[str, float],
    timeline: Sequence[TimePoint],
    method: Method,
    idle_policy: IdlePolicy,
    currency: str,
    notes: list[str],
    active: Mapping[str, float] | None = None,
) -> Bill:
    """Sum the ledger into the per-group figures, the overreach rows and the special rows."""
    by_group: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    overreach: dict[tuple[ContainerRef, str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    unattributed = unattributed_gib_hours = platform = 0.0
    for line in lines:
        if line.charge is Charge.OVERREACH:
            owner = ContainerRef(line.namespace, line.pod, line.container, line.group)
            entry = overreach[(owner, line.node, line.device_uuid)]
            entry[0] += line.cost
            entry[1] += line.gib_hours
            by_group[line.group]["overreach"] += line.cost
            by_group[line.group]["overreach_gib_hours"] += line.gib_hours
        elif line.charge is Charge.UNATTRIBUTED:
            unattributed += line.cost
            unattributed_gib_hours += line.gib_hours
        elif line.charge is Charge.PLATFORM:
            platform += line.cost
        else:
            by_group[line.group][_GROUP_FIELD[line.charge]] += line.cost
            if line.charge is Charge.USAGE:
                by_group[line.group]["memory_gib_hours"] += line.gib_hours
    for name in request:
        by_group[name]["request"] += request[name]
        by_group[name]["requested_gpu_hours"] += requested_hours[name]
    active = active or {}
    for name in active:  # a group seen only in activity (an allocation-less container on a sampled GPU) is listed
        by_group.setdefault(name, defaultdict(float))
    groups = sorted(
        (GroupCost(group=name, sm_active_gpu_hours=active.get(name), **figures) for name, figures in by_group.items()),
        key=lambda group: (-_rank(group.total), -_rank(group.request), group.group),
    )
    rows = sorted(
        (
            OverreachRow(owner, node, gpu, gib_hours, cost)
            for (owner, node, gpu), (cost, gib_hours) in overreach.items()
        ),
        key=lambda row: (-_rank(row.cost), row.owner.namespace, row.owner.pod, row.owner.container, row.gpu_uuid),
    )
    start, end = span
    return Bill(
        method=method,
        idle_policy=idle_policy,
        currency=currency,
        start=start,
        end=end,
        groups=tuple(groups),
        overreach=tuple(rows),
        unattributed=unattributed,
        unattributed_gib_hours=unattributed_gib_hours,
        platform=platform,
        total_gpu_cost=sum(card.cost for card in cards),
        gpu_hours=sum(card.hours for card in cards),
        cards=cards,
        lines=tuple(lines),
        timeline=tuple(timeline),
        notes=tuple(notes),
    )


def _notes(
    unpriced: set[tuple[str, str]],
    unknown_devices: set[tuple[str, str]],
    partitioned_cards: set[tuple[str, str]],
    offered_missing: set[tuple[str, str]],
    over_held: set[tuple[str, str]],
) -> list[str]:
    notes = [f"no price for GPU model {model!r} on node {node!r}: priced at 0" for node, model in sorted(unpriced)]
    if unknown_devices:
        notes.append(
            f"{len(unknown_devices)} device(s) had memory or allocations but no {metric_names.GPU_INFO} series "
            f"at the same instant, so they were not priced (e.g. {_sample(unknown_devices)})"
        )
    if partitioned_cards:
        notes.append(
            f"{len(partitioned_cards)} MIG-partitioned card(s) had memory booked on the card itself, outside any slice "
            f"(processes NVML could not place in a MIG device); a MIG card is priced by its slices, so that memory "
            f"was not priced (e.g. {_sample(partitioned_cards)})"
        )
    if offered_missing:
        notes.append(
            f"{len(offered_missing)} device(s) were held with no memory in use but had no "
            f"{metric_names.GPU_OFFERED_REPLICAS} series, so their holders were charged as holding every replica "
            f"(exact for an unshared GPU; a shared one may be overcharged) (e.g. {_sample(offered_missing)})"
        )
    if over_held:
        notes.append(
            f"{len(over_held)} device(s) had more allocation ids held than {metric_names.GPU_OFFERED_REPLICAS} offers; "
            f"their holders were charged by the ids held (e.g. {_sample(over_held)})"
        )
    return notes
