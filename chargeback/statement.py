"""What every format shows of a :class:`~.bill.Bill`: its rows in cents that add up, to the cent.

The bill is computed in floating point (shares of bytes and of card-hours); a reader checks it in cents. Rounding
each amount on its own leaves rows that miss the total they sit above by a cent or two, so the cents are
apportioned from the top down by the largest remainder method (Hamilton's):

1. The GPU cost of the range, rounded to the cent (half to even), is the TOTAL.
2. Its cents are apportioned over the rows (each group, ``(unattributed)``, ``(platform)``) in proportion to their
   exact totals: each row gets the whole cents of its exact share, and the cents left over go one each to the
   rows with the largest remainders, ties to the row listed first (see :func:`apportion`).
3. Each group's cents are apportioned the same way over its parts: used, held unused, idle share, and used
   without an allocation (overreach).
4. The subtotal of the groups and the TOTAL are sums of the cents above them.

A column that is not part of the total (GPU-hours held, memory, the request-based cost, SM activity) is
apportioned over its rows from its own rounded sum, so it adds up too. The rate per GPU-hour held and the
difference from the request-based cost are computed from their row's rounded figures, so a reader can redo them.
The same apportionment, to a millionth, splits a row's cents over its ledger lines for FOCUS
(:func:`line_costs`), and a group's overreach cents over its overreach rows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import ROUND_HALF_EVEN, Decimal
from enum import Enum

from .bill import PLATFORM, UNATTRIBUTED, Bill, CardCost, Charge, Line, OverreachRow
from .costcentres import UNASSIGNED, CostCentres
from .errors import ChargebackError

CENT = Decimal("0.01")
SUBTOTAL = "all groups"
TOTAL = "TOTAL"
# Remainders are compared to this many decimal places of the unit, so that two sums of the same amounts made in
# another order (the recorded and the raw series' bills) give the same cents.
_REMAINDER_PLACES = 6


class RowKind(Enum):
    GROUP = "group"
    SUBTOTAL = "subtotal"  # the groups summed
    UNATTRIBUTED = Charge.UNATTRIBUTED.value  # memory of processes outside any container
    PLATFORM = Charge.PLATFORM.value  # idle capacity nobody is charged for
    TOTAL = "total"  # every row: the GPU cost of the range


# (key, title) of the bill's table, in the order every format shows them; CSV and JSON use the keys.
COLUMNS = (
    ("group", "group"),
    ("cost_centre", "cost centre"),
    ("requested_gpu_hours", "GPU-h held"),
    ("memory_gib_hours", "memory GiB-h"),
    ("usage_cost", "used"),
    ("reserved_cost", "held, unused"),
    ("idle_cost", "idle share"),
    ("overreach_cost", "used without allocation"),
    ("total_cost", "total"),
    ("effective_rate", "per GPU-h held"),
    ("request_cost", "by request"),
    ("difference", "total - by request"),
    ("sm_active_gpu_hours", "SM-active GPU-h (not billed)"),
)
MONEY = {
    "usage_cost",
    "reserved_cost",
    "idle_cost",
    "overreach_cost",
    "total_cost",
    "effective_rate",
    "request_cost",
    "difference",
}
PARTS = ("usage_cost", "reserved_cost", "idle_cost", "overreach_cost")  # what a row's total is the sum of
# Quantities: in the tables people read, rounded to hundredths that add up like the money; CSV and JSON carry them
# as computed (to a millionth), for tools that sum them further.
QUANTITIES = ("requested_gpu_hours", "memory_gib_hours", "sm_active_gpu_hours")
# Columns only groups have: the TOTAL leaves them to the groups' subtotal.
GROUP_ONLY = ("requested_gpu_hours", "effective_rate", "request_cost", "difference", "sm_active_gpu_hours")

Value = Decimal | str | None


@dataclass(frozen=True)
class Row:
    kind: RowKind
    values: dict[str, Value]
    exact: dict[str, float | None] = field(default_factory=dict)  # the QUANTITIES as computed

    @property
    def name(self) -> str:
        return str(self.values["group"])

    def amount(self, key: str) -> Decimal:
        """A money column this row always has (a group's costs, any row's total); a missing one is a bug here."""
        value = self.values[key]
        if not isinstance(value, Decimal):
            raise TypeError(f"{self.kind.value} row: {key} is an amount, not {value!r}")
        return value


@dataclass(frozen=True)
class OverreachLine:
    """One container's use without an allocation, its cost a share of its group's overreach cents."""

    item: OverreachRow
    gib_hours: Decimal
    cost: Decimal


@dataclass(frozen=True)
class CardLine:
    card: CardCost
    cost: Decimal  # the cards' cents add up to the TOTAL
    unused: Decimal


@dataclass(frozen=True)
class CentreRow:
    """A cost centre and the rows booked to it; its total is the sum of theirs."""

    centre: str
    rows: tuple[str, ...]
    total: Decimal


@dataclass(frozen=True)
class Statement:
    rows: tuple[Row, ...]
    overreach: tuple[OverreachLine, ...]
    cards: tuple[CardLine, ...]
    centres: tuple[CentreRow, ...]  # empty without a cost-centre file
    total: Decimal

    def row(self, kind: RowKind) -> Row:
        return next(row for row in self.rows if row.kind is kind)

    @property
    def groups(self) -> tuple[Row, ...]:
        return tuple(row for row in self.rows if row.kind is RowKind.GROUP)


def cents(amount: float) -> int:
    """``amount`` in whole cents, half to even."""
    return units(amount, 2)


def units(amount: float, places: int) -> int:
    """``amount`` in whole units of ``10 ** -places``, half to even, after taking it to a millionth of the unit:
    the same amount summed in another order (the last bits of a float) rounds the same way."""
    snapped = Decimal(repr(round(amount * 10**places, _REMAINDER_PLACES)))
    return int(snapped.to_integral_value(ROUND_HALF_EVEN))


def apportion(amounts: Sequence[float], total: int) -> list[int]:
    """``total`` whole units split over ``amounts`` in proportion, by the largest remainder method: each gets the
    whole units of its exact share, and the units left over go one each to the largest remainders, ties to the
    earlier. Every share is within one unit of its exact share, and the shares add up to ``total``. Negative
    amounts (the last bits of a float sum that should be 0) count as 0."""
    weights = [max(0.0, amount) for amount in amounts]
    whole = math.fsum(weights)
    if not weights:
        return []
    if whole <= 0:
        return [total] + [0] * (len(weights) - 1)  # nothing to weigh by: the first takes it (total is 0 here)
    shares = [round(weight * total / whole, _REMAINDER_PLACES) for weight in weights]
    floors = [math.floor(share) for share in shares]
    left = total - sum(floors)
    order = sorted(range(len(shares)), key=lambda index: (-(shares[index] - floors[index]), index))
    for index in order[: max(0, left)]:
        floors[index] += 1
    return floors


def _money(count: int, places: int = 2) -> Decimal:
    """``count`` units of ``10 ** -places`` as a decimal amount with those places (``12345`` → ``123.45``)."""
    return Decimal(count).scaleb(-places)


def _spread(amounts: Sequence[float | None], places: int = 2) -> list[Decimal | None]:
    """Amounts (None: unknown) rounded so that the known ones add up to their rounded sum."""
    known = [index for index, amount in enumerate(amounts) if amount is not None]
    exact = [float(amounts[index]) for index in known]  # type: ignore[arg-type]
    shares = apportion(exact, units(math.fsum(exact), places)) if exact else []
    result: list[Decimal | None] = [None] * len(amounts)
    for index, share in zip(known, shares, strict=True):
        result[index] = _money(share, places)
    return result


def _sum(values: Sequence[Value]) -> Decimal | None:
    known = [value for value in values if isinstance(value, Decimal)]
    return sum(known, Decimal("0.00")) if known else None


def _rate(total: Value, held: Value) -> Decimal | None:
    if not isinstance(total, Decimal) or not isinstance(held, Decimal) or held <= 0:
        return None
    return (total / held).quantize(CENT, ROUND_HALF_EVEN)


def _group_rows(bill: Bill, row_cents: Sequence[int], centres: CostCentres) -> list[Row]:
    groups = bill.groups
    held = _spread([group.requested_gpu_hours for group in groups])
    memory = _spread([group.memory_gib_hours for group in groups] + [bill.unattributed_gib_hours])
    request = _spread([group.request for group in groups])
    active = _spread([group.sm_active_gpu_hours for group in groups])
    rows = []
    for index, group in enumerate(groups):
        parts = apportion([group.usage, group.reserved, group.idle, group.overreach], row_cents[index])
        total = _money(row_cents[index])
        asked = request[index]
        values: dict[str, Value] = {
            "group": group.group,
            "cost_centre": centres.of(group.group) if centres.given else None,
            "requested_gpu_hours": held[index],
            "memory_gib_hours": memory[index],
            **{key: _money(part) for key, part in zip(PARTS, parts, strict=True)},
            "total_cost": total,
            "effective_rate": _rate(total, held[index]),
            "request_cost": asked,
            "difference": total - asked if asked is not None else None,
            "sm_active_gpu_hours": active[index],
        }
        exact = {
            "requested_gpu_hours": group.requested_gpu_hours,
            "memory_gib_hours": group.memory_gib_hours,
            "sm_active_gpu_hours": group.sm_active_gpu_hours,
        }
        rows.append(Row(RowKind.GROUP, values, exact))
    empty: dict[str, Value] = dict.fromkeys(key for key, _ in COLUMNS)
    unattributed = _money(row_cents[len(groups)])
    platform = _money(row_cents[len(groups) + 1])
    rows.append(
        Row(
            RowKind.UNATTRIBUTED,
            {
                **empty,
                "group": UNATTRIBUTED,
                "cost_centre": centres.unattributed,
                "memory_gib_hours": memory[len(groups)],
                "usage_cost": unattributed,
                "total_cost": unattributed,
            },
            {"requested_gpu_hours": None, "memory_gib_hours": bill.unattributed_gib_hours, "sm_active_gpu_hours": None},
        )
    )
    rows.append(
        Row(
            RowKind.PLATFORM,
            {
                **empty,
                "group": PLATFORM,
                "cost_centre": centres.platform,
                "idle_cost": platform,
                "total_cost": platform,
            },
            dict.fromkeys(QUANTITIES),
        )
    )
    return rows


def _totals(rows: list[Row]) -> tuple[Row, Row]:
    """The groups' subtotal and the TOTAL, each a sum of the rows above it."""
    groups = [row for row in rows if row.kind is RowKind.GROUP]
    others = [row for row in rows if row.kind is not RowKind.GROUP]
    numeric = [key for key, _ in COLUMNS if key not in ("group", "cost_centre")]
    subtotal: dict[str, Value] = {"group": SUBTOTAL, "cost_centre": None}
    for key in numeric:
        found = _sum([row.values[key] for row in groups])
        subtotal[key] = Decimal("0.00") if found is None and key != "sm_active_gpu_hours" else found
    subtotal["effective_rate"] = _rate(subtotal["total_cost"], subtotal["requested_gpu_hours"])
    total: dict[str, Value] = {"group": TOTAL, "cost_centre": None}
    for key in numeric:
        total[key] = None if key in GROUP_ONLY else _sum([subtotal[key], *(row.values[key] for row in others)])
    sub_exact = {key: _fsum([row.exact[key] for row in groups]) for key in QUANTITIES}
    total_exact = {
        key: None if key in GROUP_ONLY else _fsum([sub_exact[key], *(row.exact[key] for row in others)])
        for key in QUANTITIES
    }
    return Row(RowKind.SUBTOTAL, subtotal, sub_exact), Row(RowKind.TOTAL, total, total_exact)


def _fsum(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return math.fsum(known) if known else None


def statement(bill: Bill, centres: CostCentres | None = None) -> Statement:
    """The bill's rows, overreach rows, cards and cost centres, in cents that add up (the module's docstring)."""
    centres = centres or CostCentres()
    total = cents(bill.total_gpu_cost)
    exact = [group.total for group in bill.groups] + [bill.unattributed, bill.platform]
    # Apportioning would hide a cost that is in no row (it shares the rounded total out whatever the rows hold):
    # refuse a bill whose rows do not hold the cards' cost, beyond the last bits of a float sum.
    if abs(math.fsum(exact) - bill.total_gpu_cost) > 1e-6 * max(1.0, bill.total_gpu_cost):
        raise ChargebackError(
            f"internal error: the bill's rows add up to {math.fsum(exact):.6f}, its cards cost "
            f"{bill.total_gpu_cost:.6f}; please report it with the command that made it"
        )
    row_cents = apportion(exact, total)
    rows = _group_rows(bill, row_cents, centres)
    subtotal, grand = _totals(rows)
    *groups, unattributed, platform = rows
    ordered = (*groups, subtotal, unattributed, platform, grand)
    overreach_cents = {
        group.group: int(row.amount("overreach_cost").scaleb(2)) for group, row in zip(bill.groups, groups, strict=True)
    }
    return Statement(
        rows=ordered,
        overreach=_overreach(bill, overreach_cents),
        cards=_cards(bill, total),
        centres=_centres(ordered, centres),
        total=_money(total),
    )


def _overreach(bill: Bill, group_cents: dict[str, int]) -> tuple[OverreachLine, ...]:
    """The overreach rows, each group's cents apportioned over its rows."""
    by_group: dict[str, list[int]] = defaultdict(list)
    for index, item in enumerate(bill.overreach):
        by_group[item.owner.group].append(index)
    costs: dict[int, int] = {}
    for group, indexes in by_group.items():
        shares = apportion([bill.overreach[index].cost for index in indexes], group_cents.get(group, 0))
        costs.update(zip(indexes, shares, strict=True))
    return tuple(
        OverreachLine(item, Decimal(repr(round(item.gib_hours, 1))), _money(costs[index]))
        for index, item in enumerate(bill.overreach)
    )


def _cards(bill: Bill, total: int) -> tuple[CardLine, ...]:
    costs = apportion([card.cost for card in bill.cards], total)
    unused = apportion([card.unused for card in bill.cards], cents(math.fsum(card.unused for card in bill.cards)))
    return tuple(
        CardLine(card, _money(cost), _money(free)) for card, cost, free in zip(bill.cards, costs, unused, strict=True)
    )


def _centres(rows: Sequence[Row], centres: CostCentres) -> tuple[CentreRow, ...]:
    if not centres.given:
        return ()
    booked: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.kind in (RowKind.GROUP, RowKind.UNATTRIBUTED, RowKind.PLATFORM):
            booked[str(row.values["cost_centre"] or UNASSIGNED)].append(row)
    ordered = sorted(booked.items(), key=lambda item: (item[0] == UNASSIGNED, item[0]))
    return tuple(
        CentreRow(centre, tuple(row.name for row in members), _sum([row.values["total_cost"] for row in members]))  # type: ignore[arg-type]
        for centre, members in ordered
    )


def row_of(line: Line) -> str:
    """The row of the bill a ledger line is booked in: its group, ``(unattributed)`` or ``(platform)``."""
    if line.charge is Charge.UNATTRIBUTED:
        return UNATTRIBUTED
    if line.charge is Charge.PLATFORM:
        return PLATFORM
    return line.group


MICRO = 6


def line_costs(bill: Bill, shown: Statement, keep: Callable[[Line], bool] = lambda line: True) -> list[Decimal]:
    """The cost of each of ``bill.lines`` that ``keep`` keeps, to a millionth, each row's cents apportioned over its
    lines in proportion to their exact costs: the lines of a row add up to the row, to the cent."""
    kept = [line for line in bill.lines if keep(line)]
    row_total = {row.name: row.values["total_cost"] for row in shown.rows}
    by_row: dict[str, list[int]] = defaultdict(list)
    for index, line in enumerate(kept):
        by_row[row_of(line)].append(index)
    result = [Decimal(0)] * len(kept)
    for name, indexes in by_row.items():
        target = row_total.get(name)
        whole = int(target.scaleb(MICRO)) if isinstance(target, Decimal) else 0
        for index, share in zip(indexes, apportion([kept[i].cost for i in indexes], whole), strict=True):
            result[index] = _money(share, MICRO)
    return result
