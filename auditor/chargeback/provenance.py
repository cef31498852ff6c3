"""How a bill was made, carried by every format so that a reader can reproduce it or challenge it.

The method, idle policy, currency and range live on the :class:`~.compute.Bill` itself (the computation decided
them); this holds the rest: when, by which gpu-fence, from where, at what resolution, grouped how, at what prices.
"""

from __future__ import annotations

from dataclasses import dataclass

from .prices import AppliedPrice


@dataclass(frozen=True)
class Provenance:
    generated_at: float  # unix seconds
    version: str  # of gpu-fence
    source: str  # the Prometheus URL, or the bundled demo fleet
    step: float  # seconds per interval
    group_by: str  # namespace | label:KEY
    prices: tuple[AppliedPrice, ...] = ()
