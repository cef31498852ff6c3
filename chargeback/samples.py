r"""What a source gives the bill for one evaluation instant: the auditor's series as values, pure.

``raw.py`` turns Prometheus' answers into :class:`Interval`\ s (``demo.py``'s fleet answers the same queries), and
``ledger.py`` splits them; each value names the series it comes from (``gpu_fence.metric_names``).
"""

from __future__ import annotations

from dataclasses import dataclass


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
class Offered:
    """``gpu_fence_gpu_offered_replicas`` at one instant: device ids the device plugin offers for that device."""

    node: str
    gpu_uuid: str
    replicas: float


@dataclass(frozen=True)
class SmActivity:
    """A container's SM activity on a GPU at an instant (gpu_fence_container_gpu_sm_activity_ratio, 0-1): shown
    beside the bill, never billed."""

    node: str
    gpu_uuid: str
    owner: ContainerRef
    ratio: float


@dataclass(frozen=True)
class Interval:
    """Everything the source returned for one evaluation instant ``end``, standing for ``seconds`` before it."""

    end: float
    seconds: float
    devices: tuple[Device, ...] = ()
    memory: tuple[Memory, ...] = ()
    allocations: tuple[Allocation, ...] = ()
    unattributed: tuple[Unattributed, ...] = ()
    offered: tuple[Offered, ...] = ()
    activity: tuple[SmActivity, ...] = ()
