"""What the kubelet allocated, as the PodResources client returns it: plain frozen values, no gRPC.

The client builds them from the proto messages; the pure join (``auditor.snapshot``) and the tests read and write
them without importing gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DeviceAllocation:
    """Devices of one extended resource, ids exactly as the kubelet reports them (see ``auditor.deviceids``)."""

    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True)
class ClaimDevice:
    """One device of a DRA claim. ``driver_name``/``pool_name``/``device_name`` are sent from 1.31, ``share_id``
    from 1.35 (None when the kubelet did not send it); ``cdi_devices`` are fully qualified CDI names."""

    driver_name: str
    pool_name: str
    device_name: str
    cdi_devices: tuple[str, ...]
    share_id: str | None = None


@dataclass(frozen=True)
class DynamicResource:
    """A DRA claim allocated to a container: its name and its devices, exactly as the kubelet reports them (which
    device each is, and its UUID, is in the node's ResourceSlices: ``auditor.dra``)."""

    claim_name: str
    claim_namespace: str
    claim_devices: tuple[ClaimDevice, ...] = ()


@dataclass(frozen=True)
class ContainerAllocation:
    """What the kubelet allocated to one container; containers with nothing allocated are listed too."""

    namespace: str
    pod: str
    container: str
    devices: tuple[DeviceAllocation, ...]
    dynamic_resources: tuple[DynamicResource, ...]
