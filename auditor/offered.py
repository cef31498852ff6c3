"""Replicas the device plugins offer per GPU or MIG device: what ``gpu_fence_gpu_offered_replicas`` exports, for
the bill's held share (ids held ÷ ids offered).

They come from the kubelet's PodResources ``GetAllocatableResources``: every healthy id each device plugin
advertises (``GPU-<uuid>::<n>`` per time-slicing or MPS replica, ``MIG-<uuid>`` per MIG device). Offers change only
when a plugin is reconfigured or a device turns unhealthy, so :class:`OfferedReplicas` asks at start and then every
``interval`` seconds, never every cycle: the cycle's one ``List`` stays the only call the kubelet's shared rate limit
sees each cycle. :func:`count_offered` (pure) turns an answer into UUID → ids offered with the cycle's device index.

Where the call fails the count is unknown, not the last one: the metric is absent until an answer comes (the next
cycle after ``retry_after`` seconds); where the kubelet lacks the call it is asked again only every ``interval``.
"""

# ruff: noqa: PLC0415  (the client's error type is imported where caught: gRPC stays out of --help)
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from gpu_fence.vocabulary import DEFAULT_GPU_RESOURCE_SET

from .podresources.allocations import DeviceAllocation
from .podresources.calls import KubeletFailure

if TYPE_CHECKING:
    from .sources import PodResourcesSource

#: Seconds between two GetAllocatableResources calls (``--allocatable-interval``).
DEFAULT_INTERVAL = 300.0
#: Seconds before asking again after a failed call.
RETRY_AFTER = 60.0


class OfferedReplicas:
    """The latest GetAllocatableResources answer, asked for when due. Not thread-safe: one cycle at a time."""

    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL,
        *,
        retry_after: float = RETRY_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval = interval
        self.retry_after = min(retry_after, interval)
        self._clock = clock
        self._asked_at: float | None = None
        self._wait = 0.0
        self._answer: tuple[DeviceAllocation, ...] | None = None
        #: why the latest call gave no answer (the client's message); None after an answer
        self.last_error: str | None = None

    def read(self, kubelet: PodResourcesSource) -> tuple[DeviceAllocation, ...] | None:
        """The latest answer, asking ``kubelet`` first when due; None before the first answer or after a failure."""
        from .podresources.client import KubeletUnavailable

        now = self._clock()
        if self._asked_at is not None and now - self._asked_at < self._wait:
            return self._answer
        self._asked_at = now
        try:
            self._answer = tuple(kubelet.allocatable())
        except KubeletUnavailable as error:
            self._answer = None
            self.last_error = str(error)
            self._wait = self.interval if error.reason is KubeletFailure.UNIMPLEMENTED else self.retry_after
        else:
            self.last_error = None
            self._wait = self.interval
        return self._answer


def count_offered(
    devices: Iterable[DeviceAllocation], normalize: Callable[[str], str | None]
) -> tuple[tuple[str, int], ...]:
    """UUID → distinct ids offered for it, over the GPU resources (``normalize``: the cycle's id → UUID).

    Distinct (resource, id) pairs count: the kubelet repeats an id once per NUMA node it sits on. An id that names
    no GPU is left out, as it is from allocations.
    """
    offered = {
        (group.resource_name, raw)
        for group in devices
        if DEFAULT_GPU_RESOURCE_SET.matches(group.resource_name)
        for raw in group.device_ids
    }
    counts: Counter[str] = Counter()
    for _, raw in offered:
        uuid = normalize(raw)
        if uuid is not None:
            counts[uuid] += 1
    return tuple(sorted(counts.items()))
