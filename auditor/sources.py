"""The sources one audit cycle reads, as ``auditor.collect`` sees them: one small Protocol each.

The real adapters satisfy them (``podresources.client.PodResourcesClient``, ``nvml.Nvml``, ``hostproc.HostProc``,
``kube.PodCache``, ``resourceslices.ResourceSliceCache``, ``offered.OfferedReplicas``); so can a test's fakes. Each
Protocol holds only what a cycle calls, and says what its implementation must raise or return when its source
fails, so that collection never needs to know which adapter it holds. A new source is one more Protocol here, one
more field of :class:`Sources` and its reads in ``auditor.collect``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from .cgroups import CgroupIdentity
    from .dra import SliceView
    from .hostproc import ContainerSight, ProcScan
    from .model import IdentitySource
    from .nvml import NvmlSnapshot
    from .podresources.allocations import ContainerAllocation, DeviceAllocation

__all__ = [
    "HostProcSource",
    "NvmlSource",
    "OfferedSource",
    "PodResourcesSource",
    "PodSource",
    "SliceSource",
    "Sources",
]


@runtime_checkable
class PodResourcesSource(Protocol):
    """The kubelet's allocations (PodResources ``List``): one call per cycle, never retried inside it."""

    def list(self) -> Sequence[ContainerAllocation]:
        """Every container the kubelet knows on the node; raises ``KubeletUnavailable`` when it cannot answer."""
        ...

    def allocatable(self) -> Sequence[DeviceAllocation]:
        """Every device id the device plugins offer (GetAllocatableResources); raises ``KubeletUnavailable`` as
        ``list`` does. Asked every few minutes through an ``OfferedSource``, never by the cycle itself."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class NvmlSource(Protocol):
    """The node's GPUs, MIG devices and GPU processes (NVML), opened before the first cycle."""

    def snapshot(self) -> NvmlSnapshot:
        """Now; a device that fails is a problem in the snapshot; raises ``NvmlError`` when none can be read."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class HostProcSource(Protocol):
    """The host's processes under ``root`` (host /proc): the contract of each read is ``hostproc.HostProc``'s."""

    @property
    def root(self) -> str: ...

    def scan(self) -> ProcScan:
        """Every container's live pids and every pid's place; raises ``OSError`` only when the root cannot be listed."""
        ...

    def identity(self, pid: int) -> CgroupIdentity | None: ...

    def exists(self, pid: int) -> bool: ...

    def inspect(self, pids: Sequence[int]) -> ContainerSight:
        """What one container's processes show, judged over all of them, bounded."""
        ...

    def environ(self, pid: int, *names: str) -> Mapping[str, str] | None: ...

    def read_root_file(self, pid: int, path: str) -> bytes | None: ...


@runtime_checkable
class PodSource(Protocol):
    """The node's pods by uid, from the Kubernetes API, cached across cycles. Never raises: an API that does not
    answer shows as ``state`` and ``last_error``."""

    @property
    def state(self) -> IdentitySource:
        """The names it can give: a fresh list, a stale one, or none (``FALLBACK``: it never answered)."""
        ...

    @property
    def pods(self) -> Mapping[str, Mapping[str, Any]]: ...

    @property
    def last_error(self) -> str | None: ...

    def ensure(self, pod_uids: Iterable[str], container_ids: Iterable[str] = ()) -> None:
        """Relist when due, or early when a uid or container id is unknown to the cache."""
        ...


@runtime_checkable
class SliceSource(Protocol):
    """The node's ResourceSlices (the Kubernetes API), kept current in the background. Never raises and never
    blocks a cycle: a cycle reads the latest ``view``, whose ``state`` says how current it is."""

    @property
    def view(self) -> SliceView: ...

    def close(self) -> None: ...


@runtime_checkable
class OfferedSource(Protocol):
    """The device ids the device plugins offer, asked of the kubelet when due (every few minutes)."""

    #: why the latest ask gave no answer; None after an answer (or before the first ask)
    last_error: str | None

    def read(self, kubelet: PodResourcesSource) -> Sequence[DeviceAllocation] | None:
        """The latest answer, asking ``kubelet`` first when due; None while unknown. Never raises."""
        ...


@dataclass(frozen=True)
class Sources:
    """What one cycle reads; ``pods`` and ``slices`` are None when the Kubernetes API is not used
    (``--no-kubernetes``), ``offered`` when the offered replicas are not read."""

    podresources: PodResourcesSource
    nvml: NvmlSource
    hostproc: HostProcSource
    pods: PodSource | None = None
    slices: SliceSource | None = None
    offered: OfferedSource | None = None
