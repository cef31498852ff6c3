"""Join what the sources said into one ``NodeSnapshot``: the kubelet's allocations, NVML's devices and processes,
what host /proc shows of each container, and the node's pod list. Pure: ``auditor.collect`` does the reading and
hands plain values to ``assemble``, which joins them into containers and processes.

How a container is named (``Identity`` in the report):
1. **kubernetes**: the runtime container id from the process's cgroup matches a ``containerID`` in the node's pod
   list; the pod's namespace/name/container name then match the kubelet's PodResources entry.
2. **fallback** (API down or never answered): the container's ``HOSTNAME`` (the pod name, unless the pod sets
   ``hostname``) and its service-account namespace file under ``/proc/<pid>/root`` name the pod; the container is
   the pod's only unclaimed PodResources container, or the one whose ``NVIDIA_VISIBLE_DEVICES`` lists exactly
   its allocated UUIDs (what the device plugin injects).
3. **uid**: only the cgroup's pod uid and container id are known; such a container is reported only when it
   matters (it has a GPU process or a GPU device node), so sandbox (pause) containers do not flood the report.
4. **kubelet**: a PodResources container with no running process found (not started yet, or exited).

Allocations: device-plugin ids through ``auditor.deviceids``; DRA devices of GPU drivers through the node's
ResourceSlices (``auditor.dra``), by their ``uuid`` attribute only.

Visibility: ``/dev/nvidia<minor>`` nodes in one live process's root → the physical GPU with that NVML minor.
A MIG device has no node of its own (it is reached through its card's node plus ``nvidia-caps`` nodes, which are
not read), so visibility is reported per card; the audit lets a container that holds a slice see its card.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_fence import kai
from gpu_fence.vocabulary import DEFAULT_GPU_RESOURCE_SET, kai_fraction_container, parse_visible_devices

from .deviceids import normalize_device_id
from .dra import DEFAULT_GPU_DRIVERS, SliceView, claimed_devices, slice_note
from .kube import containers_by_id, kai_gpu_groups, pod_labels
from .model import (
    ClaimedDevice,
    Container,
    FailureReason,
    Gpu,
    GpuProcess,
    Identity,
    IdentitySource,
    NodeSnapshot,
)
from .offered import count_offered
from .podresources.allocations import ContainerAllocation, DeviceAllocation


@dataclass(frozen=True)
class SnapshotOptions:
    node: str
    pod_label_keys: tuple[str, ...] = ()
    kai_reservation_namespace: str = kai.DEFAULT_RESERVATION_NAMESPACE
    kai_scheduler_names: tuple[str, ...] = kai.DEFAULT_SCHEDULER_NAMES
    gpu_dra_drivers: frozenset[str] = frozenset(DEFAULT_GPU_DRIVERS)


@dataclass(frozen=True)
class RuntimeContainer:
    """A container found on the host: its id, one live pid, and what that process shows."""

    container_id: str
    pod_uid: str
    pid: int
    visible_minors: frozenset[int] | None
    visible_devices_env: str | None
    env_read: bool
    hostname: str | None = None
    namespace_file: str | None = None


@dataclass
class _Draft:
    namespace: str | None
    pod: str | None
    container: str | None
    pod_uid: str | None = None
    container_id: str | None = None
    allocated: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()
    dra: tuple[ClaimedDevice, ...] = ()
    runtime: RuntimeContainer | None = None
    kai_groups: frozenset[str] = frozenset()
    labels: tuple[tuple[str, str], ...] = ()
    identity: Identity = Identity.KUBELET
    in_kubelet: bool = False
    spec_field: str | None = None


# --- device ids → UUIDs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceIndex:
    """The lookups device-id normalisation needs, built once per cycle from NVML's devices."""

    gpus_by_index: Mapping[int, str]
    migs_by_instance: Mapping[tuple[int, int], str]
    migs_by_position: Mapping[tuple[int, int], str]
    uuids: frozenset[str]

    @classmethod
    def build(cls, devices: Iterable[Gpu]) -> DeviceIndex:
        devices = list(devices)
        cards = {d.uuid: d for d in devices if not d.parent_uuid}
        by_instance: dict[tuple[int, int], str] = {}
        by_position: dict[tuple[int, int], str] = {}
        for device in devices:
            parent = cards.get(device.parent_uuid) if device.parent_uuid else None
            if parent is None:
                continue
            if device.gpu_instance_id is not None:
                by_instance[(parent.index, device.gpu_instance_id)] = device.uuid
            if device.mig_index is not None:
                by_position[(parent.index, device.mig_index)] = device.uuid
        return cls(
            {d.index: d.uuid for d in cards.values()},
            by_instance,
            by_position,
            frozenset(d.uuid for d in devices),
        )

    def normalize(self, raw: str) -> str | None:
        return normalize_device_id(
            raw, self.gpus_by_index, self.migs_by_instance, migs_by_position=self.migs_by_position
        )


def normalize_allocation(
    allocation: ContainerAllocation, devices: DeviceIndex, slices: SliceView, gpu_drivers: frozenset[str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[ClaimedDevice, ...]]:
    """(allocated UUIDs, one per id or DRA device; unresolved device-plugin ids; DRA devices of GPU drivers) of one
    PodResources container. Devices of other DRA drivers (NICs, FPGAs, IMEX channels) are not ours to count."""
    allocated: list[str] = []
    unresolved: list[str] = []
    for group in allocation.devices:
        if not DEFAULT_GPU_RESOURCE_SET.matches(group.resource_name):
            continue
        for raw in group.device_ids:
            uuid = devices.normalize(raw)
            if uuid:
                allocated.append(uuid)
            else:
                unresolved.append(f"{group.resource_name}:{raw}")
    dra = tuple(
        device for claim in allocation.dynamic_resources for device in claimed_devices(claim, slices, gpu_drivers)
    )
    allocated.extend(device.uuid for device in dra if device.uuid is not None)
    return tuple(allocated), tuple(unresolved), dra


# --- the join (pure) ---------------------------------------------------------------------------------------


def assemble(
    options: SnapshotOptions,
    *,
    now: float,
    gpus: Sequence[Gpu],
    devices: DeviceIndex,
    allocations: Sequence[ContainerAllocation],
    runtime: Mapping[str, RuntimeContainer],
    processes: Sequence[GpuProcess],
    pods: Mapping[str, Mapping[str, Any]] | None,
    identity_source: IdentitySource,
    notes: Sequence[str] = (),
    degraded: Iterable[FailureReason] = (),
    activity_devices: Iterable[str] = (),
    slices: SliceView | None = None,
    offered: Sequence[DeviceAllocation] | None = None,
) -> NodeSnapshot:
    """Join the sources into a ``NodeSnapshot``.

    ``processes`` are NVML's, each with the cgroup identity of its pid; ``pods`` the cached pod list by uid (None
    when the API never answered); ``notes`` and ``degraded`` what the cycle read only in part; ``activity_devices``
    the devices whose per-process activity NVML reported; ``slices`` the node's ResourceSlices (None: not read);
    ``offered`` the latest GetAllocatableResources answer (None: unknown).
    """
    slices = slices or SliceView()
    notes, degraded = list(notes), set(degraded)
    drafts: dict[tuple[str | None, str | None, str | None], _Draft] = {}
    by_id: dict[str, _Draft] = {}
    for allocation in allocations:
        allocated, unresolved, dra = normalize_allocation(allocation, devices, slices, options.gpu_dra_drivers)
        draft = _Draft(
            allocation.namespace,
            allocation.pod,
            allocation.container,
            allocated=allocated,
            unresolved=unresolved,
            dra=dra,
            in_kubelet=True,
        )
        drafts[(allocation.namespace, allocation.pod, allocation.container)] = draft
    _note_dra(drafts.values(), slices, devices, notes, degraded)

    # 1. the API names containers by id
    for uid, pod in (pods or {}).items():
        metadata = pod.get("metadata") or {}
        namespace, name = metadata.get("namespace"), metadata.get("name")
        labels = pod_labels(pod)
        chosen = tuple((key, labels[key]) for key in options.pod_label_keys if key in labels)
        groups = kai_gpu_groups(pod)
        fraction = kai_fraction_container(pod, options.kai_scheduler_names) if groups else None
        for container_id, (container_name, spec_field) in containers_by_id(pod).items():
            named = drafts.get((namespace, name, container_name))
            if named is None:
                if container_id not in runtime:
                    continue  # not running and not in PodResources (a finished init container)
                named = _Draft(namespace, name, container_name)
                drafts[(namespace, name, container_name)] = named
            named.pod_uid, named.container_id, named.labels = uid, container_id, chosen
            named.identity, named.spec_field = Identity.KUBERNETES, spec_field
            if namespace == options.kai_reservation_namespace or container_name == fraction:
                named.kai_groups = groups
            named.runtime = runtime.get(container_id)
            by_id[container_id] = named

    # 2. runtime containers the API did not name: fall back to the container's own files, matching first by
    #    evidence (its NVIDIA_VISIBLE_DEVICES or its GPU nodes equal an allocation), then by elimination.
    unnamed = [found for cid, found in runtime.items() if cid not in by_id and found.pod_uid not in (pods or {})]
    cards = {gpu.minor: gpu.uuid for gpu in gpus if not gpu.is_mig and gpu.minor is not None}
    if identity_source is not IdentitySource.KUBERNETES and unnamed:
        # Candidates by pod, built once: matching each unnamed container against every kubelet container would be
        # quadratic on a dense node.
        unclaimed: dict[tuple[str | None, str | None], list[_Draft]] = defaultdict(list)
        for (namespace, pod_name, _), draft in drafts.items():
            if draft.in_kubelet and draft.container_id is None:
                unclaimed[(namespace, pod_name)].append(draft)
        for by_evidence in (True, False):
            for found in unnamed:
                if found.container_id in by_id:
                    continue
                matched = _fallback_match(found, unclaimed, devices, cards, by_evidence=by_evidence)
                if matched is not None:
                    matched.identity = Identity.FALLBACK
                    matched.pod_uid, matched.container_id, matched.runtime = found.pod_uid, found.container_id, found
                    by_id[found.container_id] = matched

    # 3. what is still unnamed: a sandbox (pause) container, a pod newer than the list, one the API never showed.
    #    Reported (by uid) only when it holds a GPU process or a GPU device node.
    process_containers = {process.container_id for process in processes if process.container_id}
    for container_id, found in runtime.items():
        if container_id in by_id or (not found.visible_minors and container_id not in process_containers):
            continue
        metadata = ((pods or {}).get(found.pod_uid) or {}).get("metadata") or {}
        namespace = metadata.get("namespace", found.namespace_file)
        name = metadata.get("name", found.hostname)
        draft = _Draft(namespace, name, None, identity=Identity.UID)
        draft.pod_uid, draft.container_id, draft.runtime = found.pod_uid, container_id, found
        drafts[(namespace or "", name or "", container_id)] = draft
        by_id[container_id] = draft

    containers = tuple(_freeze(draft, cards) for draft in drafts.values())
    return NodeSnapshot(
        options.node,
        now,
        tuple(gpus),
        containers,
        tuple(processes),
        identity_source,
        tuple(notes),
        frozenset(degraded),
        activity_devices=frozenset(activity_devices),
        dra_slices=slices.state,
        offered_replicas=None if offered is None else count_offered(offered, devices.normalize),
    )


def _note_dra(
    drafts: Iterable[_Draft], slices: SliceView, devices: DeviceIndex, notes: list[str], degraded: set[FailureReason]
) -> None:
    """Say what the slices could not tell this cycle: an API that did not answer (a degraded source), a slice UUID
    this node's NVML does not list (a driver and NVML that disagree)."""
    claimed = [device for draft in drafts for device in draft.dra]
    note = slice_note(slices, claimed=bool(claimed))
    if note is not None:
        notes.append(note)
        if slices.last_error is not None:
            degraded.add(FailureReason.KUBERNETES_API)
    unknown = sorted({d.uuid for d in claimed if d.uuid is not None and d.uuid not in devices.uuids})
    if unknown:
        notes.append(f"DRA: ResourceSlices name UUIDs NVML does not list on this node: {', '.join(unknown)}")


def _fallback_match(
    found: RuntimeContainer,
    unclaimed: Mapping[tuple[str | None, str | None], list[_Draft]],
    devices: DeviceIndex,
    cards: Mapping[int, str],
    *,
    by_evidence: bool,
) -> _Draft | None:
    """Without the API: the PodResources container this runtime container most likely is, or None.

    ``unclaimed`` holds the kubelet's containers by (namespace, pod) that no runtime container had claimed
    when the fallback started; those claimed since have a container id.
    """
    if not found.namespace_file or not found.hostname:
        return None
    candidates = [d for d in unclaimed.get((found.namespace_file, found.hostname), ()) if d.container_id is None]
    if not by_evidence:
        return candidates[0] if len(candidates) == 1 else None
    named = {devices.normalize(entry) for entry in parse_visible_devices(found.visible_devices_env).devices}
    visible = {cards[minor] for minor in found.visible_minors or () if minor in cards}
    matching = [d for d in candidates if d.allocated and set(d.allocated) in (named, visible)]
    return matching[0] if len(matching) == 1 else None


def _freeze(draft: _Draft, cards: Mapping[int, str]) -> Container:
    """The frozen container; ``cards`` maps a card's minor to its UUID (built once per cycle)."""
    found = draft.runtime
    visible = None
    env, env_read = None, False
    if found is not None:
        if found.visible_minors is not None:
            visible = frozenset(cards[minor] for minor in found.visible_minors if minor in cards)
        env, env_read = found.visible_devices_env, found.env_read
    return Container(
        namespace=draft.namespace,
        pod=draft.pod,
        container=draft.container,
        pod_uid=draft.pod_uid,
        container_id=draft.container_id,
        allocated=draft.allocated,
        unresolved_allocations=draft.unresolved,
        dra_devices=draft.dra,
        visible=visible,
        visible_devices_env=env,
        env_read=env_read,
        kai_gpu_groups=draft.kai_groups,
        labels=draft.labels,
        identity=draft.identity,
        pid=found.pid if found is not None else None,
        spec_field=draft.spec_field,
    )
