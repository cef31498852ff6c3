"""Turn the device ids a kubelet reports into the NVML UUIDs the auditor joins on.

Device plugins do not agree on ids (NVIDIA's k8s-device-plugin, GKE's plugin; dcgm-exporter's
``kubernetes.go`` handles the same forms):

- NVIDIA's plugin reports NVML UUIDs, ``GPU-<uuid>`` or ``MIG-<uuid>`` (R470+ drivers), and with time-slicing
  or MPS one id per replica, ``<uuid>::<n>``. Several containers holding replicas of one GPU is legitimate
  sharing, so the replica number is dropped: the allocation is of the GPU.
- Drivers before R470 named MIG devices ``MIG-GPU-<parent uuid>/<gi>/<ci>``.
- GKE's plugin reports ``nvidia<index>``, ``nvidia<index>/vgpu<n>`` (time-sharing), ``nvidia<index>/gi<gi>``
  and ``nvidia<index>/gi<gi>/vgpu<n>`` (MIG, possibly time-shared).
- Index forms, ``<index>`` and ``<gpu index>:<MIG device index>``, as the toolkit reads them.

Pure: the NVML facts come in as mappings, built by the NVML adapter each cycle.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_fence.vocabulary import DeviceIdForm, classify_device_id

_REPLICA = re.compile(r"^(?P<id>.+)::(?P<replica>[0-9]+)$")
_GKE = re.compile(r"^nvidia(?P<gpu>[0-9]+)(?:/gi(?P<gi>[0-9]+))?(?:/vgpu(?P<replica>[0-9]+))?$")
_MIG_LEGACY = re.compile(r"^MIG-(?P<parent>GPU-[^/\s]+)/(?P<gi>[0-9]+)/(?P<ci>[0-9]+)$")
_UUID_BODY = re.compile(r"^(?:GPU|MIG)-[^/\s:]+$")


@dataclass(frozen=True)
class DeviceRef:
    """What one kubelet device id says about the device it names, before any NVML lookup.

    Exactly one way of naming is filled: ``uuid`` (GPU or MIG UUID); ``parent_uuid`` + ``gpu_instance`` (legacy
    MIG); ``gpu_index`` alone (a whole GPU), with ``gpu_instance`` (a GKE MIG slice) or with ``mig_position``
    (the toolkit's ``<gpu>:<mig>`` index form). ``replica`` is the time-slicing/MPS replica, when the id has one.
    """

    raw: str
    uuid: str | None = None
    parent_uuid: str | None = None
    gpu_index: int | None = None
    gpu_instance: int | None = None
    mig_position: int | None = None
    replica: int | None = None

    @property
    def is_mig(self) -> bool:
        return self.gpu_instance is not None or self.mig_position is not None or (self.uuid or "").startswith("MIG-")


def parse_device_id(raw: str) -> DeviceRef | None:
    """Read a kubelet device id; None for a form no GPU plugin we know produces (a clear "cannot map")."""
    entry = raw.strip()
    replica: int | None = None
    annotated = _REPLICA.match(entry)
    if annotated:
        entry, replica = annotated["id"], int(annotated["replica"])

    gke = _GKE.match(entry)
    if gke:
        if replica is not None:  # "::n" is NVIDIA's replica syntax; GKE writes replicas as /vgpu<n>
            return None
        gi = gke["gi"]
        return DeviceRef(
            raw,
            gpu_index=int(gke["gpu"]),
            gpu_instance=int(gi) if gi is not None else None,
            replica=int(gke["replica"]) if gke["replica"] is not None else None,
        )

    form = classify_device_id(entry)
    if form is DeviceIdForm.MIG_LEGACY:
        legacy = _MIG_LEGACY.match(entry)
        if not legacy:
            return None
        return DeviceRef(raw, parent_uuid=legacy["parent"], gpu_instance=int(legacy["gi"]), replica=replica)
    if form in (DeviceIdForm.GPU_UUID, DeviceIdForm.MIG_UUID):
        return DeviceRef(raw, uuid=entry, replica=replica) if _UUID_BODY.match(entry) else None
    if form is DeviceIdForm.INDEX:
        return DeviceRef(raw, gpu_index=int(entry), replica=replica)
    if form is DeviceIdForm.MIG_INDEX:
        gpu, position = entry.split(":")
        return DeviceRef(raw, gpu_index=int(gpu), mig_position=int(position), replica=replica)
    return None


def normalize_device_id(
    raw: str,
    gpus_by_index: Mapping[int, str],
    migs_by_index: Mapping[tuple[int, int], str],
    *,
    migs_by_position: Mapping[tuple[int, int], str] | None = None,
) -> str | None:
    """The NVML UUID (``GPU-…`` or ``MIG-…``) a kubelet device id refers to, or None when it cannot be mapped.

    - ``gpus_by_index``: NVML index of a GPU → its ``GPU-`` UUID.
    - ``migs_by_index``: ``(NVML index of the parent GPU, GPU-instance id)`` → the ``MIG-`` UUID of the MIG device
      in that GPU instance (``nvmlDeviceGetGpuInstanceId`` of the MIG handle). Both NVIDIA's and GKE's plugins
      create one compute instance per GPU instance, so the GPU instance names the slice; this is also how
      dcgm-exporter keys MIG devices (``<gpu>-<gi>``).
    - ``migs_by_position``: ``(NVML index of the parent GPU, MIG device index)`` → ``MIG-`` UUID, the index that
      ``nvmlDeviceGetMigDeviceHandleByIndex`` takes; needed only for the toolkit's ``<gpu>:<mig>`` form.

    UUIDs are returned as reported, even when this node's NVML does not list them: whether an allocation names
    a real device is the audit's question, not the parser's.
    """
    ref = parse_device_id(raw)
    if ref is None:
        return None
    if ref.uuid is not None:
        return ref.uuid
    if ref.parent_uuid is not None:
        parent_index = next((index for index, uuid in gpus_by_index.items() if uuid == ref.parent_uuid), None)
        if parent_index is None or ref.gpu_instance is None:
            return None
        return migs_by_index.get((parent_index, ref.gpu_instance))
    if ref.gpu_index is None:
        return None
    if ref.gpu_instance is not None:
        return migs_by_index.get((ref.gpu_index, ref.gpu_instance))
    if ref.mig_position is not None:
        return (migs_by_position or {}).get((ref.gpu_index, ref.mig_position))
    return gpus_by_index.get(ref.gpu_index)
