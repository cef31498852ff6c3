"""What ``--compare-device-metrics`` puts beside a bill: the bills dcgm-exporter's per-pod series would make, per group.

Values only: ``devicemetrics.py`` makes them, ``bill.py`` carries them, the formats show them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceMetricGroup:
    group: str
    gpu_fence: float  # the group's total in this bill (0 when it has none)
    device_hours: float
    utilisation: float


@dataclass(frozen=True)
class DeviceMetricBill:
    """Both device-metric bills per group, beside this bill's totals; ``real_cost`` is what the cards cost."""

    groups: tuple[DeviceMetricGroup, ...]
    gpu_fence_rest: float  # this bill's cost outside any group's total: unattributed and platform
    real_cost: float
    notes: tuple[str, ...] = ()

    @property
    def device_hours_total(self) -> float:
        return sum(group.device_hours for group in self.groups)

    @property
    def utilisation_total(self) -> float:
        return sum(group.utilisation for group in self.groups)

    @property
    def gpu_fence_total(self) -> float:
        return sum(group.gpu_fence for group in self.groups) + self.gpu_fence_rest
