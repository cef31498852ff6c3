"""What counts as a GPU request, and what a ``NVIDIA_VISIBLE_DEVICES`` value means.

This is the one home of both facts; the webhook's policy and the auditor's audit import them from here so
that the two deployables can never disagree about them. Semantics follow the NVIDIA Container Toolkit
(``internal/config/image/cuda_image.go``: ``VisibleDevices`` / ``devicesFromEnvvars``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from enum import Enum
from typing import Any, TypeGuard

from .kai import FRACTION_ANNOTATIONS, FRACTION_CONTAINER_ANNOTATION

VISIBLE_DEVICES_ENV = "NVIDIA_VISIBLE_DEVICES"
MIG_CONTROL_ENVS = ("NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES")
#: IMEX channels a container asks the toolkit for (``ImexChannelRequests`` in ``cuda_image.go``), honoured under
#: the same privilege rule as the device list; the device plugin or the DRA driver sets it from an allocation.
IMEX_CHANNELS_ENV = "NVIDIA_IMEX_CHANNELS"
#: The toolkit's feature-gated device requests, each with the devices it injects: set to ``enabled`` on a container
#: that gets any device, it adds those devices of the whole node, which no allocation chose (``gatedDevices`` in
#: ``internal/modifier/cdi.go`` in jit-cdi mode; ``newFeatureGatedModifier`` in ``internal/modifier/gated.go`` in
#: legacy and csv modes; the discoverers in ``internal/discover/{nvswitch,gds,mofed,gdrcopy}.go``).
GATED_DEVICE_ENVS: Mapping[str, str] = {
    "NVIDIA_NVSWITCH": "every NVSwitch device of the node (/dev/nvidia-nvswitchctl, /dev/nvidia-nvswitch*)",
    "NVIDIA_GDS": "the node's GPUDirect Storage devices (/dev/nvidia-fs*) and its /run/udev",
    "NVIDIA_MOFED": "every InfiniBand verbs device of the node (/dev/infiniband/uverbs*, /dev/infiniband/rdma_cm)",
    "NVIDIA_GDRCOPY": "the node's GDRCopy device (/dev/gdrdrv)",
}

#: Where the toolkit reads a device list from mounts instead of the env (``requestsFromMounts`` in
#: ``cuda_image.go``, with ``accept-nvidia-visible-devices-as-volume-mounts``): a ``/dev/null`` mounted at a
#: destination that starts with one of these names the devices after the prefix, with no "/" boundary. The device
#: plugin's volume-mounts strategy sets ``NVIDIA_VISIBLE_DEVICES`` to the first as a marker.
DEVICE_LIST_MOUNT_PREFIXES = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")

#: Default resource names that mean "this container was allocated an NVIDIA GPU". A trailing ``*`` is a
#: prefix match: ``nvidia.com/gpu.*`` covers renamed time-slicing resources such as ``nvidia.com/gpu.shared``.
DEFAULT_GPU_RESOURCES: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/gpu.*", "nvidia.com/mig-*")

#: Where each kind of container lives in a pod spec, in the order the kubelet starts them.
CONTAINER_FIELDS = ("initContainers", "containers", "ephemeralContainers")


@dataclass(frozen=True)
class GpuResources:
    """A compiled set of resource names that count as GPU requests (exact names and ``prefix*`` patterns)."""

    exact: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def from_patterns(cls, patterns: Iterable[str]) -> GpuResources:
        exact: set[str] = set()
        prefixes: list[str] = []
        for pattern in patterns:
            if pattern.endswith("*"):
                prefixes.append(pattern[:-1])
            else:
                exact.add(pattern)
        return cls(frozenset(exact), tuple(prefixes))

    def matches(self, resource_name: str) -> bool:
        return resource_name in self.exact or resource_name.startswith(self.prefixes)

    def requested_in(self, amounts: Mapping[Any, Any]) -> bool:
        """True when ``amounts`` (a container's ``limits`` or ``requests``) gives one of these resources a positive
        quantity. :meth:`matches` inlined: this runs for every resource of every container admitted."""
        exact, prefixes = self.exact, self.prefixes
        for name, quantity in amounts.items():
            if (
                isinstance(name, str)
                and (name in exact or name.startswith(prefixes))
                and quantity_is_positive(quantity)
            ):
                return True
        return False


DEFAULT_GPU_RESOURCE_SET = GpuResources.from_patterns(DEFAULT_GPU_RESOURCES)

_QUANTITY = re.compile(r"^([+-]?[0-9.]+)([eE][+-]?[0-9]+|[numkMGTPE]i?|Ki)?$")


def quantity_is_positive(quantity: Any) -> bool:
    """True when a Kubernetes resource quantity is greater than zero.

    ``nvidia.com/gpu: 0`` is no request. A value that is not a valid quantity is treated as no request: the
    API server rejects such pods before admission, and for the offline check "no GPU" is the safe reading
    (the container gets pinned rather than trusted).
    """
    if isinstance(quantity, bool):
        return False
    if isinstance(quantity, int | float):
        return quantity > 0
    if not isinstance(quantity, str):
        return False
    match = _QUANTITY.match(quantity.strip())
    if match is None:
        return False
    try:
        return Decimal(match.group(1)) > 0
    except InvalidOperation:
        return False


def iter_containers(pod_spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    """Yield ``(field, index, container)`` for every init, regular and ephemeral container of a pod spec.

    Entries that are not objects are skipped: the caller's validation reports malformed specs, and the
    vocabulary never raises on input it did not choose.
    """
    for field in CONTAINER_FIELDS:
        containers = pod_spec.get(field)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if _is_mapping(container):
                yield field, index, container


def _is_mapping(value: Any) -> TypeGuard[Mapping[str, Any]]:
    """``isinstance(value, Mapping)``, answered by the cheap concrete test for the dicts that JSON and YAML decoders
    produce; the ABC check (several times slower) runs only for other types."""
    return isinstance(value, dict) or (value is not None and isinstance(value, Mapping))


def requests_gpu_resource(container: Mapping[str, Any], resources: GpuResources = DEFAULT_GPU_RESOURCE_SET) -> bool:
    """True when the container asks for a GPU through an extended resource or a DRA claim."""
    return requests_device_plugin_gpu(container, resources) or has_resource_claims(container)


def requests_device_plugin_gpu(
    container: Mapping[str, Any], resources: GpuResources = DEFAULT_GPU_RESOURCE_SET
) -> bool:
    """True when the container requests one of these extended resources, which a device plugin allocates (and
    hands over, under its default strategy, through ``NVIDIA_VISIBLE_DEVICES``)."""
    spec = container.get("resources")
    if not (isinstance(spec, dict) or _is_mapping(spec)):  # the dict test inline: once per container admitted
        return False
    for section in ("limits", "requests"):
        amounts = spec.get(section)
        if amounts and (isinstance(amounts, dict) or _is_mapping(amounts)) and resources.requested_in(amounts):
            return True
    return False


def has_resource_claims(container: Mapping[str, Any]) -> bool:
    """True when the container lists DRA claims (``resources.claims``), of whatever device class."""
    spec = container.get("resources")
    if not (isinstance(spec, dict) or _is_mapping(spec)):
        return False
    claims = spec.get("claims")
    return isinstance(claims, list) and len(claims) > 0


def kai_fraction_container(pod: Mapping[str, Any], kai_scheduler_names: Iterable[str]) -> str | None:
    """Name of the container that holds a KAI fractional GPU, or None when the pod is not one.

    The annotations alone are pod-controlled, so they count only when the pod is scheduled by a configured
    KAI scheduler (which then really reserves the fraction); the auditor catches abuse at runtime.
    """
    metadata = pod.get("metadata")
    spec = pod.get("spec")
    if not _is_mapping(metadata) or not _is_mapping(spec):
        return None
    annotations = metadata.get("annotations")
    if not _is_mapping(annotations):
        return None
    for key in FRACTION_ANNOTATIONS:  # a loop, not any() over a generator: asked of every pod
        if key in annotations:
            break
    else:
        return None
    scheduler = spec.get("schedulerName")
    if not isinstance(scheduler, str) or scheduler not in set(kai_scheduler_names):
        return None
    named = annotations.get(FRACTION_CONTAINER_ANNOTATION)
    if isinstance(named, str) and named:
        return named
    containers = spec.get("containers")
    if isinstance(containers, list) and containers and _is_mapping(containers[0]):
        name = containers[0].get("name")
        return name if isinstance(name, str) else None
    return None


class Visibility(Enum):
    """What the toolkit injects for a ``NVIDIA_VISIBLE_DEVICES`` value."""

    UNSET = "unset"  # variable absent: void, except legacy CUDA images where it means all
    VOID = "void"  # no GPUs, no driver libraries
    NONE = "none"  # no GPUs, driver libraries injected
    ALL = "all"  # every GPU of the node
    LIST = "list"  # the listed devices (indexes, UUIDs, MIG ids, CDI names)


#: The visibilities that expose no GPU, built once: an enum member looked up on its class costs a metaclass call
#: (CPython 3.11), and this is asked for every value admitted.
_NO_GPU = (Visibility.VOID, Visibility.NONE)


@dataclass(frozen=True)
class VisibleDevices:
    visibility: Visibility
    devices: tuple[str, ...] = ()

    @property
    def grants_no_gpu(self) -> bool:
        """True for values that expose no GPU on any image (``void``/``none``); UNSET is not safe."""
        return self.visibility in _NO_GPU


def parse_visible_devices(value: str | None) -> VisibleDevices:
    """Parse a ``NVIDIA_VISIBLE_DEVICES`` value exactly as the NVIDIA Container Toolkit does.

    Case-sensitive; entries are comma-separated, trimmed, empty ones skipped; ``void`` anywhere wins; else
    the first of ``all``/``none`` decides; an empty list is void. ``VOID`` is therefore a device named
    ``VOID``, not void.
    """
    if value is None:
        return _UNSET
    keyword = _KEYWORDS.get(value)
    if keyword is not None:  # the common case, a bare "void" (the webhook's pin), "none" or "all"
        return keyword
    entries = [entry.strip() for entry in value.split(",")]
    entries = [entry for entry in entries if entry]
    if not entries or "void" in entries:
        return _KEYWORDS["void"]
    for entry in entries:
        if entry in ("all", "none"):
            return _KEYWORDS[entry]
    return VisibleDevices(Visibility.LIST, tuple(entries))


# The answers without devices, built once (the values are frozen): the admission policy parses a pinned "void"
# for every container of every pod.
_UNSET = VisibleDevices(Visibility.UNSET)
_KEYWORDS = {
    "void": VisibleDevices(Visibility.VOID),
    "none": VisibleDevices(Visibility.NONE),
    "all": VisibleDevices(Visibility.ALL),
}


class DeviceIdForm(Enum):
    """The forms a device entry of ``NVIDIA_VISIBLE_DEVICES`` can take."""

    INDEX = "index"  # "0"
    GPU_UUID = "gpu-uuid"  # "GPU-<uuid>"
    MIG_UUID = "mig-uuid"  # "MIG-<uuid>" (R470+)
    MIG_LEGACY = "mig-legacy"  # "MIG-GPU-<uuid>/<gi>/<ci>"
    MIG_INDEX = "mig-index"  # "<gpu>:<mig>"
    CDI_NAME = "cdi-name"  # "nvidia.com/gpu=<id>"
    MOUNT_MARKER = "mount-marker"  # "/var/run/nvidia-container-devices": the list comes from mounts
    UNKNOWN = "unknown"


_INDEX = re.compile(r"^[0-9]+$")
_MIG_INDEX = re.compile(r"^[0-9]+:[0-9]+$")


def classify_device_id(entry: str) -> DeviceIdForm:
    if _INDEX.match(entry):
        return DeviceIdForm.INDEX
    if entry.startswith("MIG-GPU-"):
        return DeviceIdForm.MIG_LEGACY
    if entry.startswith("MIG-"):
        return DeviceIdForm.MIG_UUID
    if entry.startswith("GPU-"):
        return DeviceIdForm.GPU_UUID
    if _MIG_INDEX.match(entry):
        return DeviceIdForm.MIG_INDEX
    if "=" in entry and "/" in entry.split("=", 1)[0]:
        return DeviceIdForm.CDI_NAME
    if entry.startswith(DEVICE_LIST_MOUNT_PREFIXES):
        return DeviceIdForm.MOUNT_MARKER
    return DeviceIdForm.UNKNOWN
