"""The bill's model: what the ledger (``ledger.py``) sums to and every format reads, pure.

The method and idle policy it was made with, the lines every unit of cost landed in (:class:`Line`, each with its
:class:`Charge`), the per-group figures, the overreach rows, the cards and the timeline; with
``--compare-device-metrics``, the comparison beside it (``comparison.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum

from .comparison import DeviceMetricBill
from .samples import ContainerRef


class IdlePolicy(Enum):
    PROPORTIONAL = "proportional"
    PLATFORM = "platform"


class Method(Enum):
    HOLDER = "holder"  # what an allocation blocks, its holder pays; memory splits what is in use
    USAGE = "usage"  # memory alone: a held unit with no memory in use is idle


class Charge(StrEnum):
    """What a line of the ledger pays for. A ``StrEnum`` so that the ledger's keys (``ledger.Party``), which hold one,
    hash at C speed on the hot path; the label values and every format read ``.value``."""

    USAGE = "usage"  # a byte share of a unit, with an allocation on it
    RESERVED = "reserved"  # a held unit with none of the holder's memory on it (method holder)
    IDLE_SHARE = "idle-share"  # a card's idle, spread over the groups booked on it (--idle proportional)
    OVERREACH = "overreach"  # a byte share (and its idle share) without an allocation: in the user's group total
    UNATTRIBUTED = "unattributed"  # memory of processes outside any container, with its idle share
    PLATFORM = "platform"  # idle nobody is charged for


@dataclass(frozen=True)
class Line:
    """One place cost landed: a charge on one GPU or MIG device for one group and namespace.

    ``group``/``namespace`` are empty for the unattributed and platform rows; an overreach line also names the
    offending ``pod`` and ``container``. Idle spread by ``--idle proportional`` is booked on the device where the
    share it follows was booked.
    """

    node: str
    device_uuid: str
    card_uuid: str
    model: str  # the card's model, as priced
    charge: Charge
    group: str
    namespace: str
    pod: str
    container: str
    cost: float
    gib_hours: float
    card_hours: float  # the share of a card's hours this line pays for: cost = card_hours × the card's price


@dataclass(frozen=True)
class GroupCost:
    group: str
    usage: float = 0.0  # memory share of the cost of the GPUs it used, with an allocation
    reserved: float = 0.0  # units it held with none of its memory on them (method holder): "reserved, unused"
    idle: float = 0.0  # its share of idle capacity (proportional policy only)
    overreach: float = 0.0  # memory share where it had NO allocation: part of its total, shown as a column of its own
    request: float = 0.0  # what a request-based tool charges: allocated GPUs × hours × price
    requested_gpu_hours: float = 0.0
    memory_gib_hours: float = 0.0
    overreach_gib_hours: float = 0.0
    #: not billed: Σ over instants of its containers' SM activity ratios × hours, on every GPU they ran on; None
    #: when no device it used was sampled (MIG, an auditor without the gauge): unknown, not idle
    sm_active_gpu_hours: float | None = None

    @property
    def total(self) -> float:
        """What this group is billed: what it used, held and its idle share, and what it used without an
        allocation (overreach), so that every unit of cost is in some row."""
        return self.usage + self.reserved + self.idle + self.overreach

    @property
    def difference(self) -> float:
        """Billed minus request-based: negative when requests overstate what the group is billed."""
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
class CardCost:
    """One physical card over the range: what it cost, and how much of that nobody held or used."""

    node: str
    uuid: str
    model: str
    price_per_hour: float
    hours: float
    cost: float
    unused: float  # idle before --idle decides who pays it: unheld capacity with no memory, MIG space in no slice


@dataclass(frozen=True)
class TimePoint:
    """Cost booked in ``(start, end]`` (one interval, or several merged), by layer: group names, plus
    ``OVERREACH``, ``UNATTRIBUTED``, ``IDLE``."""

    end: float
    costs: Mapping[str, float]
    start: float


# The rows and chart layers that are no group: named after their charge, in parentheses, so that no group name (a
# namespace or a label value, which cannot hold them) is mistaken for one.
OVERREACH = f"({Charge.OVERREACH.value})"
UNATTRIBUTED = f"({Charge.UNATTRIBUTED.value})"
PLATFORM = f"({Charge.PLATFORM.value})"
IDLE = "(idle)"


@dataclass(frozen=True)
class Bill:
    method: Method
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
    cards: tuple[CardCost, ...] = ()
    lines: tuple[Line, ...] = ()
    timeline: tuple[TimePoint, ...] = ()
    notes: tuple[str, ...] = field(default=())
    #: with --compare-device-metrics, the bills dcgm-exporter's per-pod series would make, beside this one
    comparison: DeviceMetricBill | None = None

    @property
    def accounted(self) -> float:
        """Sum of every place cost landed; equals ``total_gpu_cost`` up to rounding."""
        return sum(group.total for group in self.groups) + self.unattributed + self.platform
