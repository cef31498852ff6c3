"""How a bill was made, carried by every format so that a reader can reproduce it or challenge it.

The method, idle policy, currency and range live on the :class:`~.bill.Bill` itself (the computation decided
them); this holds the rest: when, by which gpu-fence, from where, at what resolution, grouped how, at what prices,
and (with ``--cost-centres``) which cost centre each row belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from .costcentres import CostCentres
from .prices import AppliedPrice


class Series(Enum):
    """What the per-interval split was computed from."""

    RECORDED = "recorded"  # the chargeback recording rules' series, summed in Prometheus (recorded.py)
    RAW = "raw"  # the auditor's own series, split here interval by interval (raw.py)

    @property
    def described(self) -> str:
        return "the recording rules' series" if self is Series.RECORDED else "the auditor's raw series"


@dataclass(frozen=True)
class Provenance:
    generated_at: float  # unix seconds
    version: str  # of gpu-fence
    source: str  # the Prometheus URL, or the bundled demo fleet
    step: float  # seconds per interval
    group_by: str  # namespace | label:KEY
    prices: tuple[AppliedPrice, ...] = ()
    series: Series = Series.RAW
    hourly_sums: int = 0  # of a recorded bill: the hours it summed from the rules' hourly sums
    cost_centres: CostCentres = field(default_factory=CostCentres)  # each row's cost centre (--cost-centres)

    @property
    def split_from(self) -> str:
        """What the split was computed from, in words."""
        if self.hourly_sums:
            return f"{self.series.described} ({self.hourly_sums} whole hours from their hourly sums)"
        return self.series.described
