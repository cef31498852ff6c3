"""Pure cost computation: hand-checked cases and properties over generated clusters."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.chargeback.bill import IDLE, OVERREACH, UNATTRIBUTED, Charge, IdlePolicy, Method
from gpu_fence.chargeback.ledger import compute_bill
from gpu_fence.chargeback.samples import (
    Allocation,
    ContainerRef,
    Device,
    Interval,
    Memory,
    Offered,
    SmActivity,
    Unattributed,
)

GIB = 1 << 30
HOUR = 3600.0


def flat(price: float):
    return lambda node, model: price


def owner(namespace: str, pod: str = "p", container: str = "c", group: str | None = None) -> ContainerRef:
    return ContainerRef(namespace, pod, container, group or namespace)


def by_group(bill):
    return {group.group: group for group in bill.groups}


def first_hour(*devices: Device, **parts) -> Interval:
    """The interval of the first hour over ``devices``; ``parts`` are its memory, allocations and offers."""
    return Interval(end=HOUR, seconds=HOUR, devices=devices, **parts)


def test_time_sliced_gpu_split_by_memory_and_request_cost_beside_it():
    gpu = Device("n1", "GPU-a", "", "H100")
    a, b = owner("team-a"), owner("team-b")
    interval = first_hour(
        gpu,
        memory=(Memory("n1", "GPU-a", a, True, 3 * GIB), Memory("n1", "GPU-a", b, True, 1 * GIB)),
        allocations=(Allocation("n1", "GPU-a", a, 1), Allocation("n1", "GPU-a", b, 1)),
    )
    bill = compute_bill([interval], flat(4.0), IdlePolicy.PLATFORM)
    groups = by_group(bill)
    # One card-hour at 4.00 split 3:1 by memory.
    assert math.isclose(groups["team-a"].usage, 3.0)
    assert math.isclose(groups["team-b"].usage, 1.0)
    # Request-based tools charge each replica as a whole GPU: 1 × 1 h × 4.00 each, 8.00 for a 4.00 card.
    assert math.isclose(groups["team-a"].request, 4.0)
    assert math.isclose(groups["team-b"].difference, 1.0 - 4.0)
    assert math.isclose(groups["team-a"].memory_gib_hours, 3.0)
    assert math.isclose(bill.total_gpu_cost, 4.0)
    assert bill.platform == 0.0


def a100_split(**parts) -> Interval:
    """An hour of an A100 split into a 3g slice (MIG-3) and a 2g slice (MIG-2): 2/7 of the card is in no slice."""
    card = Device("n1", "GPU-m", "", "A100")
    s3 = Device("n1", "MIG-3", "GPU-m", "A100 MIG 3g.40gb", 3 / 7)
    s2 = Device("n1", "MIG-2", "GPU-m", "A100 MIG 2g.20gb", 2 / 7)
    return first_hour(card, s3, s2, **parts)


def test_mig_slices_priced_by_share_and_uncovered_share_is_idle():
    x, y = owner("x"), owner("y")
    interval = a100_split(
        memory=(Memory("n1", "MIG-3", x, True, 1 * GIB), Memory("n1", "MIG-2", y, True, 5 * GIB)),
        allocations=(Allocation("n1", "MIG-3", x, 1),),
    )
    prices = {"A100": 7.0}
    bill = compute_bill([interval], lambda node, model: prices.get(model), IdlePolicy.PLATFORM)
    groups = by_group(bill)
    assert math.isclose(groups["x"].usage, 3.0)  # 3/7 of 7.00
    assert math.isclose(groups["y"].usage, 2.0)  # 2/7 of 7.00
    assert math.isclose(bill.platform, 2.0)  # 2/7 of the card is in no slice
    assert math.isclose(groups["x"].request, 3.0)
    assert math.isclose(groups["x"].requested_gpu_hours, 3 / 7)
    assert bill.notes == ()
    # proportional: the card's 2.00 idle goes 3:2 to x and y
    groups = by_group(compute_bill([interval], lambda node, model: prices.get(model), IdlePolicy.PROPORTIONAL))
    assert math.isclose(groups["x"].idle, 1.2)
    assert math.isclose(groups["y"].idle, 0.8)


def test_overreach_is_charged_to_its_user_not_to_the_allocated_user():
    gpu = Device("n1", "GPU-a", "", "H100")
    legit, rogue = owner("legit"), owner("rogue", pod="miner")
    interval = first_hour(
        gpu,
        memory=(Memory("n1", "GPU-a", legit, True, 1 * GIB), Memory("n1", "GPU-a", rogue, False, 1 * GIB)),
    )
    bill = compute_bill([interval], flat(2.0), IdlePolicy.PLATFORM)
    groups = by_group(bill)
    assert math.isclose(groups["legit"].total, 1.0)
    assert math.isclose(groups["rogue"].overreach, 1.0)
    assert math.isclose(groups["rogue"].total, 1.0)  # the party that used the capacity without an allocation pays
    assert [row.owner.pod for row in bill.overreach] == ["miner"]
    assert math.isclose(bill.overreach[0].gib_hours, 1.0)


def test_unused_card_goes_to_platform_under_both_policies_and_unattributed_has_its_row():
    used = Device("n1", "GPU-a", "", "H100")
    unused = Device("n1", "GPU-b", "", "H100")
    a = owner("a")
    intervals = [
        first_hour(
            used,
            unused,
            memory=(Memory("n1", "GPU-a", a, True, GIB),),
            unattributed=(Unattributed("n1", "GPU-a", GIB),),
        ),
        Interval(end=2 * HOUR, seconds=HOUR, devices=(used, unused)),
    ]
    for policy in IdlePolicy:
        bill = compute_bill(intervals, flat(1.0), policy)
        assert math.isclose(bill.total_gpu_cost, 4.0)
        if policy is IdlePolicy.PLATFORM:
            assert math.isclose(bill.platform, 3.0)
            assert math.isclose(bill.unattributed, 0.5)
        else:
            # GPU-b: nobody to spread to → platform (2.00). GPU-a's idle hour (1.00) splits 1:1 with unattributed.
            assert math.isclose(bill.platform, 2.0)
            assert math.isclose(by_group(bill)["a"].idle, 0.5)
            assert math.isclose(bill.unattributed, 1.0)
        assert [point.costs.get(IDLE, 0.0) for point in bill.timeline] == [1.0, 2.0]
        assert bill.timeline[0].costs[UNATTRIBUTED] == 0.5


def test_missing_price_and_unknown_device_are_noted_not_crashed():
    a = owner("a")
    interval = Interval(
        end=60,
        seconds=60,
        devices=(Device("n1", "GPU-a", "", "T4"),),
        memory=(Memory("n1", "GPU-zz", a, True, GIB),),
        allocations=(Allocation("n1", "GPU-zz", a, 1),),
    )
    bill = compute_bill([interval], lambda node, model: None, IdlePolicy.PLATFORM)
    assert any("'T4'" in note for note in bill.notes)
    assert any("GPU-zz" in note for note in bill.notes)
    assert bill.total_gpu_cost == 0.0


def test_empty_input_is_an_empty_bill():
    bill = compute_bill([], flat(1.0), IdlePolicy.PROPORTIONAL)
    assert bill.groups == () and bill.total_gpu_cost == 0.0 and bill.accounted == 0.0


def test_holder_with_memory_shares_by_bytes_idle_holder_pays_its_replicas():
    # A card offered as 4 replicas at 4.00/h: a holds 1 and uses 3 GiB, b holds 1 and uses 1 GiB, c holds 1 and
    # uses none. c pays its replica (1/4 of the card); a and b split the rest 3:1 by memory; nothing is idle.
    gpu = Device("n1", "GPU-a", "", "H100")
    a, b, c = owner("a"), owner("b"), owner("c")
    interval = first_hour(
        gpu,
        memory=(Memory("n1", "GPU-a", a, True, 3 * GIB), Memory("n1", "GPU-a", b, True, 1 * GIB)),
        allocations=tuple(Allocation("n1", "GPU-a", who, 1) for who in (a, b, c)),
        offered=(Offered("n1", "GPU-a", 4),),
    )
    groups = by_group(bill := compute_bill([interval], flat(4.0), IdlePolicy.PLATFORM))
    assert bill.method is Method.HOLDER
    assert math.isclose(groups["c"].reserved, 1.0) and groups["c"].usage == 0.0
    assert math.isclose(groups["a"].usage, 2.25) and math.isclose(groups["b"].usage, 0.75)
    assert bill.platform == 0.0 and bill.notes == ()
    # The same hour under the usage method: c pays nothing, a and b split the whole card 3:1.
    groups = by_group(compute_bill([interval], flat(4.0), IdlePolicy.PLATFORM, method=Method.USAGE))
    assert groups["c"].total == 0.0
    assert math.isclose(groups["a"].usage, 3.0) and math.isclose(groups["b"].usage, 1.0)


def test_idle_holders_leave_unheld_replicas_idle_and_a_missing_offer_counts_them_all_held():
    gpu = Device("n1", "GPU-a", "", "H100")
    a = owner("a")
    held = first_hour(gpu, allocations=(Allocation("n1", "GPU-a", a, 2),))
    offered = dataclasses.replace(held, offered=(Offered("n1", "GPU-a", 8),))
    bill = compute_bill([offered], flat(4.0), IdlePolicy.PLATFORM)
    assert math.isclose(by_group(bill)["a"].reserved, 1.0)  # 2 of 8 replicas
    assert math.isclose(bill.platform, 3.0)
    assert bill.cards[0].unused == bill.platform
    bill = compute_bill([held], flat(4.0), IdlePolicy.PLATFORM)
    assert math.isclose(by_group(bill)["a"].reserved, 4.0)  # offered unknown: the 2 ids held are all there are
    [note] = bill.notes
    assert "gpu_fence_gpu_offered_replicas" in note and "n1/GPU-a" in note
    # More ids held than offered (a stale offer): charged by the ids held, never more than the card, with a note.
    stale = dataclasses.replace(held, offered=(Offered("n1", "GPU-a", 1),))
    bill = compute_bill([stale], flat(4.0), IdlePolicy.PLATFORM)
    assert math.isclose(by_group(bill)["a"].reserved, 4.0)
    assert any("more allocation ids held" in note for note in bill.notes)


def test_overreach_on_a_device_its_holder_reserved_costs_nothing_more():
    # The holder blocked the whole GPU and pays it; the memory of a container without an allocation there is
    # listed as overreach with its GiB-hours, at no extra cost (the card was paid for once).
    gpu = Device("n1", "GPU-a", "", "H100")
    holder, rogue = owner("holder"), owner("rogue", pod="miner")
    interval = first_hour(
        gpu,
        memory=(Memory("n1", "GPU-a", rogue, False, 2 * GIB),),
        allocations=(Allocation("n1", "GPU-a", holder, 1),),
        offered=(Offered("n1", "GPU-a", 1),),
    )
    bill = compute_bill([interval], flat(2.0), IdlePolicy.PLATFORM)
    assert math.isclose(by_group(bill)["holder"].reserved, 2.0)
    [row] = bill.overreach
    assert row.cost == 0.0 and math.isclose(row.gib_hours, 2.0)
    usage = compute_bill([interval], flat(2.0), IdlePolicy.PLATFORM, method=Method.USAGE)
    assert math.isclose(usage.overreach[0].cost, 2.0) and by_group(usage)["holder"].total == 0.0


def test_ledger_lines_name_the_device_and_add_up():
    x, y = owner("x"), owner("y")
    interval = a100_split(
        memory=(Memory("n1", "MIG-3", x, True, GIB),),
        allocations=(Allocation("n1", "MIG-3", x, 1), Allocation("n1", "MIG-2", y, 1)),
        offered=(Offered("n1", "MIG-3", 1), Offered("n1", "MIG-2", 1)),
    )
    bill = compute_bill([interval], flat(7.0), IdlePolicy.PLATFORM)
    lines = {(line.device_uuid, line.charge): line for line in bill.lines}
    assert math.isclose(lines[("MIG-3", Charge.USAGE)].cost, 3.0)
    assert math.isclose(lines[("MIG-3", Charge.USAGE)].card_hours, 3 / 7)
    assert math.isclose(lines[("MIG-2", Charge.RESERVED)].cost, 2.0)
    assert math.isclose(lines[("GPU-m", Charge.PLATFORM)].cost, 2.0)  # 2/7 of the card is in no slice
    assert {line.card_uuid for line in bill.lines} == {"GPU-m"}
    assert math.isclose(sum(line.cost for line in bill.lines), bill.total_gpu_cost)


# --- properties -------------------------------------------------------------------------------------------------

NAMESPACES = ["a", "b", "c"]


@st.composite
def clusters(draw):
    cards = []
    for index in range(draw(st.integers(1, 3))):
        uuid = f"GPU-{index}"
        cards.append(Device("n1", uuid, "", draw(st.sampled_from(["H100", "A100"]))))
        if draw(st.booleans()):  # MIG: slices with shares summing to at most 1
            remaining = 7
            for slot in range(draw(st.integers(1, 3))):
                size = draw(st.integers(1, max(1, remaining)))
                if size > remaining:
                    break
                remaining -= size
                cards.append(Device("n1", f"MIG-{index}-{slot}", uuid, "A100 MIG", size / 7))
    leaves = [d for d in cards if d.parent_uuid or not any(c.parent_uuid == d.uuid for c in cards)]
    # Replicas the device plugin offers per device: sometimes unknown, sometimes fewer than a cluster holds.
    offers = {device.uuid: draw(st.sampled_from([None, 1, 2, 4])) for device in leaves}
    intervals = []
    for step in range(draw(st.integers(1, 4))):
        memory, unattributed, allocations = [], [], []
        for device in leaves:
            for namespace in draw(st.lists(st.sampled_from(NAMESPACES), max_size=3, unique=True)):
                ref = owner(namespace, pod=f"p{step % 2}")
                gib = draw(st.integers(0, 8))
                if gib or draw(st.booleans()):
                    memory.append(Memory("n1", device.uuid, ref, draw(st.booleans()), gib * GIB))
                if draw(st.booleans()):
                    allocations.append(Allocation("n1", device.uuid, ref, draw(st.integers(1, 3))))
            if draw(st.booleans()):
                unattributed.append(Unattributed("n1", device.uuid, draw(st.integers(0, 4)) * GIB))
        intervals.append(
            Interval(
                end=(step + 1) * 60.0,
                seconds=60.0,
                devices=tuple(cards),
                memory=tuple(memory),
                allocations=tuple(allocations),
                unattributed=tuple(unattributed),
                offered=tuple(Offered("n1", uuid, count) for uuid, count in offers.items() if count is not None),
            )
        )
    return intervals


def price(node: str, model: str) -> float:
    return {"H100": 4.0, "A100": 3.0}[model.removesuffix(" MIG")]


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_every_cost_lands_somewhere_exactly_once(intervals):
    for method in Method:
        for policy in IdlePolicy:
            bill = compute_bill(intervals, price, policy, method=method)
            assert math.isclose(bill.accounted, bill.total_gpu_cost, rel_tol=1e-9, abs_tol=1e-9)
            # The ledger is where it landed: its lines add up to the same total, none negative, and the groups'
            # figures are sums over them.
            assert math.isclose(sum(line.cost for line in bill.lines), bill.total_gpu_cost, abs_tol=1e-9)
            assert all(line.cost >= 0 and line.card_hours >= 0 for line in bill.lines)
            for group in bill.groups:
                mine = [line for line in bill.lines if line.group == group.group]
                billed = [line for line in mine if line.charge not in (Charge.UNATTRIBUTED, Charge.PLATFORM)]
                assert math.isclose(sum(line.cost for line in billed), group.total, abs_tol=1e-9)
            assert math.isclose(sum(card.cost for card in bill.cards), bill.total_gpu_cost, abs_tol=1e-9)
            for point in bill.timeline:
                assert all(cost >= 0 for cost in point.costs.values())
            if method is Method.USAGE:
                assert all(group.reserved == 0.0 for group in bill.groups)


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_idle_policies_differ_only_in_who_pays_for_idle(intervals):
    for method in Method:
        spread = compute_bill(intervals, price, IdlePolicy.PROPORTIONAL, method=method)
        platform = compute_bill(intervals, price, IdlePolicy.PLATFORM, method=method)
        assert math.isclose(spread.accounted, platform.accounted, rel_tol=1e-9, abs_tol=1e-9)
        assert spread.platform <= platform.platform + 1e-9
        usage = {group.group: group.usage for group in platform.groups}
        for group in spread.groups:
            assert math.isclose(group.usage, usage.get(group.group, 0.0), abs_tol=1e-9)
            assert math.isclose(group.reserved, by_group(platform)[group.group].reserved, abs_tol=1e-9)
            assert math.isclose(group.request, by_group(platform)[group.group].request, abs_tol=1e-9)
        assert all(group.idle == 0.0 for group in platform.groups)
        overreach = sum(p.costs.get(OVERREACH, 0.0) for p in platform.timeline)
        assert overreach <= sum(g.overreach for g in spread.groups) + 1e-9


@settings(max_examples=150, deadline=None)
@given(clusters())
def test_holders_pay_for_what_they_block_and_never_more_than_requests_charge(intervals):
    holder = compute_bill(intervals, price, IdlePolicy.PLATFORM, method=Method.HOLDER)
    usage = compute_bill(intervals, price, IdlePolicy.PLATFORM, method=Method.USAGE)
    # Reservations only move cost out of idle: the platform pays no more than under usage, requests are equal.
    assert holder.platform <= usage.platform + 1e-9
    assert {g.group: round(g.request, 9) for g in holder.groups if g.request} == {
        g.group: round(g.request, 9) for g in usage.groups if g.request
    }
    # A reservation never costs more than what a request-based tool charges for the same ids.
    for group in holder.groups:
        assert group.reserved <= group.request + 1e-9
    # With nothing held, the two methods are the same bill.
    if not any(interval.allocations for interval in intervals):
        assert holder.groups == usage.groups and math.isclose(holder.platform, usage.platform)


def test_memory_on_a_mig_partitioned_card_itself_is_noted_as_such():
    # The auditor books a process NVML could not place in a slice on the card's own UUID. The card is priced by
    # its slices, so that memory is not priced, and the note must say why (the card's info series does exist).
    card = Device("n1", "GPU-m", "", "A100")
    s3 = Device("n1", "MIG-3", "GPU-m", "A100 MIG 3g.40gb", 3 / 7)
    x = owner("x")
    interval = first_hour(
        card,
        s3,
        memory=(Memory("n1", "MIG-3", x, True, GIB), Memory("n1", "GPU-m", x, True, GIB)),
    )
    bill = compute_bill([interval], flat(7.0), IdlePolicy.PLATFORM)
    assert math.isclose(by_group(bill)["x"].usage, 3.0)
    assert not any("no gpu_fence_gpu_info" in note for note in bill.notes), bill.notes
    [note] = bill.notes
    assert "n1/GPU-m" in note and "MIG" in note and "outside any slice" in note


@settings(max_examples=100, deadline=None)
@given(clusters(), st.floats(min_value=0.0, max_value=1.0))
def test_sm_activity_is_shown_and_never_moves_a_cost(intervals, ratio):
    """Every memory holder gets an activity sample: each group's figure is Σ ratio × hours of its samples, and every
    cost is what it is without them."""
    busy = [
        dataclasses.replace(
            interval,
            activity=tuple(SmActivity(m.node, m.gpu_uuid, m.owner, ratio) for m in interval.memory),
        )
        for interval in intervals
    ]
    for method in Method:
        plain, shown = (
            compute_bill(given_, price, IdlePolicy.PROPORTIONAL, method=method) for given_ in (intervals, busy)
        )
        costs = {g.group: (g.usage, g.reserved, g.idle, g.overreach, g.request) for g in plain.groups}
        # a group seen only in activity is listed, at no cost
        assert {g.group: (g.usage, g.reserved, g.idle, g.overreach, g.request) for g in shown.groups} == {
            **dict.fromkeys((g.group for g in shown.groups), (0.0,) * 5),
            **costs,
        }
        assert shown.lines == plain.lines and shown.platform == plain.platform
        assert all(group.sm_active_gpu_hours is None for group in plain.groups)
        for group in shown.groups:
            samples = [
                interval.seconds / HOUR
                for interval in busy
                for sample in interval.activity
                if sample.owner.group == group.group
            ]
            expected = ratio * sum(samples) if samples else None
            assert group.sm_active_gpu_hours == (None if expected is None else pytest.approx(expected))
