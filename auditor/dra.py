"""DRA devices to GPU and MIG UUIDs, through the node's ResourceSlices. Pure: ``auditor.resourceslices`` lists and
watches the slices and hands their JSON here; ``auditor.snapshot`` resolves each claimed device with the index.

The kubelet's PodResources API names a DRA device only by (driver, pool, device) and its CDI device names; the
driver that published it put its UUID in the device's ``uuid`` attribute in a ResourceSlice of the node. Names are
never parsed: NVIDIA's driver (``gpu.nvidia.com``) has named a GPU ``gpu-<index>``, then ``gpu-<minor>``, and a MIG
device in three forms across releases, and dropped its ``index`` and ``minor`` attributes; only ``uuid`` stayed.

Shapes read (``k8s.io/api/resource/{v1,v1beta2,v1beta1}/types.go``): ``spec.driver``, ``spec.pool.{name,
generation}``, ``spec.devices[].name`` and ``.attributes``; v1beta1 nests a device's attributes under ``basic``.
An attribute is a one-key union (``string``, ``int``, ``bool``, ``version``) and its name may carry the driver's
domain (``gpu.nvidia.com/uuid`` is ``uuid`` of driver ``gpu.nvidia.com``). Of a pool, only the slices of its
highest generation count, as the API's ``ResourcePool.generation`` prescribes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .model import ClaimedDevice, DraResolution, SliceState
from .podresources.allocations import ClaimDevice, DynamicResource

#: The DRA drivers whose devices are GPUs (``--dra-gpu-driver``): NVIDIA's DRA driver publishes GPUs and MIG devices
#: as ``gpu.nvidia.com`` (its ``compute-domain.nvidia.com`` devices are IMEX channels, not GPUs).
DEFAULT_GPU_DRIVERS = ("gpu.nvidia.com",)
#: The API versions read, newest first: v1 from Kubernetes 1.34, v1beta2 from 1.33, v1beta1 from 1.32.
API_VERSIONS = ("v1", "v1beta2", "v1beta1")
GROUP = "resource.k8s.io"

DeviceKey = tuple[str, str, str]  # (driver, pool, device)


@dataclass(frozen=True)
class SliceDevice:
    """A device as a ResourceSlice of a GPU driver describes it: the attributes the auditor reads."""

    driver: str
    pool: str
    name: str
    uuid: str | None
    parent_uuid: str | None = None
    profile: str | None = None


@dataclass(frozen=True)
class SliceIndex:
    """(driver, pool, device) → the device, over the highest generation of every pool of the GPU drivers."""

    devices: Mapping[DeviceKey, SliceDevice] = field(default_factory=dict)

    @classmethod
    def build(cls, slices: Iterable[Mapping[str, Any]], drivers: Iterable[str]) -> SliceIndex:
        """Index ``slices`` (ResourceSlice objects in any version read); other drivers' slices are not ours."""
        wanted = frozenset(drivers)
        newest: dict[tuple[str, str], int] = {}
        kept: list[tuple[str, str, int, Mapping[str, Any]]] = []
        for obj in slices:
            spec = obj.get("spec") if isinstance(obj, Mapping) else None
            if not isinstance(spec, Mapping) or spec.get("driver") not in wanted:
                continue
            pool = spec.get("pool")
            pool = pool if isinstance(pool, Mapping) else {}
            name, generation = pool.get("name"), pool.get("generation", 0)
            if not isinstance(name, str) or not isinstance(generation, int):
                continue
            driver = str(spec["driver"])
            newest[(driver, name)] = max(generation, newest.get((driver, name), generation))
            kept.append((driver, name, generation, spec))
        devices: dict[DeviceKey, SliceDevice] = {}
        for driver, pool, generation, spec in kept:
            if generation != newest[(driver, pool)]:
                continue  # an older generation the driver is replacing: the API says to ignore it
            for device in spec.get("devices") or ():
                found = _device(driver, pool, device)
                if found is not None:
                    devices.setdefault((driver, pool, found.name), found)
        return cls(devices)

    def get(self, driver: str, pool: str, device: str) -> SliceDevice | None:
        return self.devices.get((driver, pool, device))


@dataclass(frozen=True)
class SliceView:
    """What a cycle knows of the node's slices: the index, and how current it is."""

    state: SliceState = SliceState.UNUSED
    index: SliceIndex = field(default_factory=SliceIndex)
    last_error: str | None = None
    version: str | None = None  # the resource.k8s.io version read


def _device(driver: str, pool: str, device: Any) -> SliceDevice | None:
    if not isinstance(device, Mapping) or not isinstance(device.get("name"), str):
        return None
    basic = device.get("basic")
    body = basic if isinstance(basic, Mapping) else device  # v1beta1 nests it
    attributes = body.get("attributes")
    attributes = attributes if isinstance(attributes, Mapping) else {}

    def text(name: str) -> str | None:
        value = attributes.get(name, attributes.get(f"{driver}/{name}"))
        found = value.get("string") if isinstance(value, Mapping) else None
        return found if isinstance(found, str) and found else None

    return SliceDevice(driver, pool, device["name"], text("uuid"), text("parentUUID"), text("profile"))


# --- claims → UUIDs (pure) ---------------------------------------------------------------------------------------


def claimed_devices(claim: DynamicResource, view: SliceView, gpu_drivers: frozenset[str]) -> tuple[ClaimedDevice, ...]:
    """The claim's devices of GPU drivers, each resolved through the slices or said why not. A device without a
    driver name (a kubelet before 1.31) may be a GPU: it is kept, unresolved, rather than dropped."""
    return tuple(
        resolve(claim, device, view)
        for device in claim.claim_devices
        if not device.driver_name or device.driver_name in gpu_drivers
    )


def resolve(claim: DynamicResource, device: ClaimDevice, view: SliceView) -> ClaimedDevice:
    """One claimed device → its ``uuid`` attribute, or the reason it has none."""
    found = None
    if not device.device_name:
        resolution = DraResolution.NO_DEVICE_NAME
    elif view.state in (SliceState.FRESH, SliceState.STALE):
        found = view.index.get(device.driver_name, device.pool_name, device.device_name)
        if found is None:
            resolution = DraResolution.NO_SLICE
        else:
            resolution = DraResolution.RESOLVED if found.uuid else DraResolution.NO_UUID
    else:
        resolution = DraResolution.SLICES_UNAVAILABLE
    return ClaimedDevice(
        claim_namespace=claim.claim_namespace,
        claim_name=claim.claim_name,
        driver=device.driver_name,
        pool=device.pool_name,
        device=device.device_name,
        cdi_devices=device.cdi_devices,
        resolution=resolution,
        uuid=found.uuid if found is not None and resolution is DraResolution.RESOLVED else None,
        share_id=device.share_id,
    )


def slice_note(view: SliceView, *, claimed: bool) -> str | None:
    """What the report says of the slices this cycle; None when there is nothing to say. ``claimed``: some
    container holds a device of a GPU driver (only then do an unused or unserved API matter)."""
    if view.state is SliceState.STALE:
        return f"ResourceSlices: API unavailable ({view.last_error}): DRA devices resolved with the last good list"
    if view.state is SliceState.NONE:
        return (
            f"ResourceSlices unavailable ({view.last_error}): DRA devices of GPU drivers are reported unresolved, "
            "with their claim and CDI names"
        )
    if claimed and view.state is SliceState.NOT_SERVED:
        return (
            f"ResourceSlices: the cluster serves no {GROUP} version the auditor reads ({', '.join(API_VERSIONS)}): "
            "DRA devices of GPU drivers are reported unresolved"
        )
    if claimed and view.state is SliceState.UNUSED:
        return "ResourceSlices not read (--no-kubernetes): DRA devices of GPU drivers are reported unresolved"
    return None
