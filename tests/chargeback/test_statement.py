"""The bill's rows in cents that add up (statement.py): the largest remainder method, and a statement whose every
column adds up to the rows below it, whatever amounts the bill holds."""

from __future__ import annotations

import dataclasses
import math
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.chargeback.bill import Bill, CardCost, Charge, GroupCost, IdlePolicy, Line, Method, OverreachRow
from gpu_fence.chargeback.costcentres import UNASSIGNED, CostCentres
from gpu_fence.chargeback.errors import ChargebackError
from gpu_fence.chargeback.samples import ContainerRef
from gpu_fence.chargeback.statement import (
    PARTS,
    RowKind,
    apportion,
    cents,
    line_costs,
    statement,
)

amounts = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)


@given(st.lists(amounts, min_size=1, max_size=30), st.integers(min_value=0, max_value=10**9))
def test_apportion_adds_up_and_stays_within_a_unit_of_each_share(values, total):
    shares = apportion(values, total)
    assert sum(shares) == total and all(share >= 0 for share in shares)
    whole = math.fsum(values)
    if whole > 0:
        for value, share in zip(values, shares, strict=True):
            assert abs(share - value * total / whole) < 1 + 1e-6


def test_apportion_gives_the_cents_left_to_the_largest_remainders_ties_to_the_first():
    # Three equal thirds of a dollar: 33 cents each and one left, to the first of the tied.
    assert apportion([1.0, 1.0, 1.0], 100) == [34, 33, 33]
    # 0.9375, 1.25 and 1.3125 of 3.50: 93.75, 125 and 131.25 cents: the one cent left goes to .75.
    assert apportion([0.9375, 1.25, 1.3125], 350) == [94, 125, 131]
    # A zero never takes a cent, and amounts that sum to nothing share nothing.
    assert apportion([0.0, 0.004, 0.006], 1) == [0, 0, 1]
    assert apportion([0.0, 0.0], 0) == [0, 0]
    assert apportion([], 0) == []
    # The same amounts summed in another order (the last bits of a float differ) give the same cents.
    assert apportion([0.1 + 0.2, 0.3], 60) == apportion([0.3, 0.3], 60) == [30, 30]


def test_cents_rounds_half_to_even():
    assert (cents(0.125), cents(0.135), cents(545.999999999), cents(2.0)) == (12, 14, 54600, 200)


def group(name: str, parts: tuple[float, float, float, float], request: float, held: float) -> GroupCost:
    usage, reserved, idle, overreach = parts
    return GroupCost(
        group=name,
        usage=usage,
        reserved=reserved,
        idle=idle,
        overreach=overreach,
        request=request,
        requested_gpu_hours=held,
        memory_gib_hours=usage * 7,
    )


@st.composite
def bills(draw) -> Bill:
    count = draw(st.integers(min_value=0, max_value=12))
    groups = tuple(
        group(
            f"g{index}",
            tuple(draw(amounts) for _ in range(4)),  # type: ignore[arg-type]
            draw(amounts),
            draw(amounts),
        )
        for index in range(count)
    )
    unattributed, platform = draw(amounts), draw(amounts)
    total = math.fsum([*(g.total for g in groups), unattributed, platform])  # what rows_bill makes the cards cost
    overreach = tuple(
        OverreachRow(ContainerRef(g.group, f"p{k}", "c", g.group), "n", f"GPU-{k}", 1.0, g.overreach / 3)
        for g in groups
        for k in range(3)
    )
    cards = (
        CardCost("n", "GPU-0", "m", 1.0, 1.0, total * 0.25, 0.0),
        CardCost("n", "GPU-1", "m", 1.0, 1.0, total * 0.75, platform),
    )
    return rows_bill(groups, unattributed, platform, overreach=overreach, cards=cards)


@settings(max_examples=200, deadline=None)
@given(bills())
def test_every_column_adds_up_to_the_rows_it_sits_under(bill: Bill):
    shown = statement(bill)
    rows = {row.kind: row for row in shown.rows if row.kind is not RowKind.GROUP}
    groups = shown.groups
    assert [row.name for row in groups] == [g.group for g in bill.groups]
    total = rows[RowKind.TOTAL].values
    # The TOTAL is the GPU cost of the range, to the cent, and the headline.
    assert total["total_cost"] == shown.total == Decimal(cents(bill.total_gpu_cost)).scaleb(-2)
    for key in (*PARTS, "total_cost", "request_cost", "requested_gpu_hours", "memory_gib_hours", "difference"):
        assert rows[RowKind.SUBTOTAL].values[key] == sum((row.values[key] for row in groups), Decimal("0.00")), key
    for key in (*PARTS, "total_cost", "memory_gib_hours"):
        below = [rows[kind].values[key] for kind in (RowKind.SUBTOTAL, RowKind.UNATTRIBUTED, RowKind.PLATFORM)]
        assert total[key] == sum((value for value in below if value is not None), Decimal("0.00")), key
    for row in (*groups, rows[RowKind.SUBTOTAL]):
        values = row.values
        assert values["total_cost"] == sum(values[key] for key in PARTS)  # type: ignore[misc]
        assert values["difference"] == values["total_cost"] - values["request_cost"]  # type: ignore[operator]
        held = values["requested_gpu_hours"]
        if held:
            assert abs(values["effective_rate"] - values["total_cost"] / held) <= Decimal("0.005")  # type: ignore[operator]
        else:
            assert values["effective_rate"] is None
    # Each rounded figure is within a cent of the exact one.
    for row, exact in zip(groups, bill.groups, strict=True):
        assert abs(float(row.values["total_cost"]) - exact.total) < 0.01 + 1e-6  # type: ignore[arg-type]
    # The overreach rows of a group add up to its column; the cards to the TOTAL.
    for row in groups:
        mine = [line.cost for line in shown.overreach if line.item.owner.group == row.name]
        assert sum(mine, Decimal("0.00")) == row.values["overreach_cost"]
    assert sum((card.cost for card in shown.cards), Decimal("0.00")) == shown.total


def rows_bill(groups: tuple[GroupCost, ...], unattributed: float, platform: float, **fields) -> Bill:
    """A bill of these rows, whose cards cost what the rows add up to."""
    total = math.fsum([*(group.total for group in groups), unattributed, platform])
    return Bill(
        method=Method.HOLDER,
        idle_policy=IdlePolicy.PLATFORM,
        currency="USD",
        start=0.0,
        end=3600.0,
        groups=groups,
        unattributed=unattributed,
        unattributed_gib_hours=0.0,
        platform=platform,
        total_gpu_cost=total,
        gpu_hours=1.0,
        **{"overreach": (), **fields},
    )


def test_a_bill_whose_rows_miss_some_of_its_cost_is_refused():
    bill = rows_bill((GroupCost("a", usage=1.0),), 0.0, 0.0)
    with pytest.raises(ChargebackError, match=r"rows add up to 1\.000000, its cards cost 1\.310000"):
        statement(dataclasses.replace(bill, total_gpu_cost=1.31))


def test_ledger_lines_add_up_to_their_row_to_a_millionth():
    def line(group: str, charge: Charge, cost: float) -> Line:
        return Line("n", "GPU-0", "GPU-0", "m", charge, group, group, "", "", cost, 0.0, cost)

    lines = (
        line("a", Charge.USAGE, 1 / 3),
        line("a", Charge.RESERVED, 1 / 3),
        line("a", Charge.OVERREACH, 1 / 3),
        line("", Charge.PLATFORM, 2 / 3),
        line("", Charge.UNATTRIBUTED, 0.004),
    )
    bill = rows_bill((GroupCost("a", usage=1 / 3, reserved=1 / 3, overreach=1 / 3),), 0.004, 2 / 3, lines=lines)
    shown = statement(bill)
    costs = line_costs(bill, shown)
    assert costs[:3] == [Decimal("0.333334"), Decimal("0.333333"), Decimal("0.333333")]  # 1.00, the row
    assert costs[3] == Decimal("0.670000") and costs[4] == Decimal("0.000000")  # 0.67 and 0.00, their rows
    assert sum(costs) == shown.total == Decimal("1.67")


def test_cost_centres_sum_their_rows_and_the_rest_is_unassigned():
    bill = rows_bill(
        (GroupCost("ml-a", usage=1.0), GroupCost("ml-b", usage=2.0), GroupCost("web", usage=0.5)), 0.25, 4.0
    )
    centres = CostCentres(groups=(("ml-*", "4100 Research"),), platform="9000 IT", file="centres.yaml")
    shown = statement(bill, centres)
    assert {row.name: row.values["cost_centre"] for row in shown.rows} == {
        "ml-a": "4100 Research",
        "ml-b": "4100 Research",
        "web": None,
        "all groups": None,
        "(unattributed)": None,
        "(platform)": "9000 IT",
        "TOTAL": None,
    }
    totals = {row.centre: (row.rows, row.total) for row in shown.centres}
    assert totals == {
        "4100 Research": (("ml-a", "ml-b"), Decimal("3.00")),
        "9000 IT": (("(platform)",), Decimal("4.00")),
        UNASSIGNED: (("web", "(unattributed)"), Decimal("0.75")),
    }
    assert sum(total for _rows, total in totals.values()) == shown.total
