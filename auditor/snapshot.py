"""Join what the sources said into one ``NodeSnapshot``: the kubelet's allocations, NVML's devices and processes,
what host /proc shows of each container, and the node's pod list. Pure: ``auditor.collect`` does the reading and
hands plain values to ``assemble``, which joins them into containers and processes.

How a container is named (``Identity`` in the report). Names and exemptions rest on what the kubelet, the runtime
and the API say, never on what a container wrote: everything in its root and its environment is its own to write.

1. **kubernetes**: the runtime container id from the process's cgroup matches a ``containerID`` in the node's pod
   list; the pod's namespace/name/container name then match the kubelet's PodResources entry.
2. **fallback** (no pod list names it: the API is down, never answered, or the pod is newer than the last list): a
   running container whose processes use GPUs takes the names of the one PodResources container that holds every
   GPU they use, when no other running container could be that one either. NVML sees a process on a GPU only where
   the device cgroup the runtime made lets it open that GPU, so the evidence is the kernel's, not the container's.
3. **uid**: only the cgroup's pod uid and container id are known (and the pod's names, when the pod list knows the
   pod). Without a fresh pod list such a container may be any kubelet container no running one was tied to, so
   the GPUs those hold are its ``unconfirmed_allocations``. What its files claim it is, is shown as a claim. It is
   reported only when it matters (a GPU process, a GPU device node, a bound met while reading it), so sandbox
   (pause) containers do not flood the report.
4. **kubelet**: a PodResources container with no running process tied to it (not started yet, exited, or, without
   the API, not told apart from others).

Allocations: device-plugin ids through ``auditor.deviceids``; DRA devices of GPU drivers through the node's
ResourceSlices (``auditor.dra``), by their ``uuid`` attribute only.

Visibility: ``/dev/nvidia<minor>`` nodes in the views of the container's processes → the physical GPU with that NVML
minor. A MIG device has no node of its own (it is reached through its card's node plus ``nvidia-caps`` nodes, which
are not read), so visibility is reported per card; the audit lets a container that holds a slice see its card.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_fence import kai
from gpu_fence.vocabulary import DEFAULT_GPU_RESOURCE_SET, kai_fraction_container

from .deviceids import normalize_device_id
from .dra import DEFAULT_GPU_DRIVERS, SliceView, claimed_devices, slice_note
from .model import (
    ActivityUnknown,
    ClaimedDevice,
    Container,
    ContainerRef,
    FailureReason,
    Gpu,
    GpuProcess,
    Identity,
    IdentitySource,
    NodeSnapshot,
    NvmlReason,
    ViewLimit,
)
from .offered import count_offered
from .podresources.allocations import ContainerAllocation, DeviceAllocation
from .pods import containers_by_id, kai_gpu_groups, pod_labels


@dataclass(frozen=True)
class SnapshotOptions:
    node: str
    pod_label_keys: tuple[str, ...] = ()
    kai_reservation_namespace: str = kai.DEFAULT_RESERVATION_NAMESPACE
    kai_scheduler_names: tuple[str, ...] = kai.DEFAULT_SCHEDULER_NAMES
    gpu_dra_drivers: frozenset[str] = frozenset(DEFAULT_GPU_DRIVERS)


@dataclass(frozen=True)
class RuntimeContainer:
    """A container found on the host: its id, its lowest live pid, and what its processes show (see ``Container``
    for the fields it shares)."""

    container_id: str
    pod_uid: str
    pid: int
    visible_minors: frozenset[int] | None
    visible_devices_envs: tuple[str, ...] = ()
    env_read: bool = False
    view_limits: frozenset[ViewLimit] = frozenset()
    nested_pod_uids: frozenset[str] = frozenset()
    claimed_namespace: str | None = None
    claimed_pod: str | None = None


@dataclass
class _Draft:
    ref: ContainerRef
    allocated: tuple[str, ...] = ()
    unresolved: tuple[str, ...] = ()
    dra: tuple[ClaimedDevice, ...] = ()
    runtime: RuntimeContainer | None = None
    kai_groups: frozenset[str] = frozenset()
    labels: tuple[tuple[str, str], ...] = ()
    identity: Identity = Identity.KUBELET
    in_kubelet: bool = False
    spec_field: str | None = None
    unconfirmed: frozenset[str] = frozenset()


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
    activity_unknown: Sequence[tuple[str, ActivityUnknown]] = (),
    unlisted: Sequence[tuple[str, NvmlReason]] = (),
    slices: SliceView | None = None,
    offered: Sequence[DeviceAllocation] | None = None,
) -> NodeSnapshot:
    """Join the sources into a ``NodeSnapshot``.

    ``processes`` are NVML's, each with the cgroup identity of its pid; ``pods`` the cached pod list by uid (None
    when the API never answered); ``notes`` and ``degraded`` what the cycle read only in part; ``activity_devices``
    the devices whose per-process activity NVML reported, ``activity_unknown`` why it is unknown on the others;
    ``unlisted`` the devices (UUID, reason) whose processes NVML could not list; ``slices`` the node's
    ResourceSlices (None: not read); ``offered`` the latest GetAllocatableResources answer (None: unknown).
    """
    slices = slices or SliceView()
    notes, degraded = list(notes), set(degraded)
    drafts: dict[tuple[str | None, str | None, str | None], _Draft] = {}
    by_id: dict[str, _Draft] = {}
    for allocation in allocations:
        allocated, unresolved, dra = normalize_allocation(allocation, devices, slices, options.gpu_dra_drivers)
        draft = _Draft(
            ContainerRef(allocation.namespace, allocation.pod, allocation.container),
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
                named = _Draft(ContainerRef(namespace, name, container_name))
                drafts[(namespace, name, container_name)] = named
            named.ref, named.labels = named.ref.with_ids(uid, container_id), chosen
            named.identity, named.spec_field = Identity.KUBERNETES, spec_field
            if namespace == options.kai_reservation_namespace or container_name == fraction:
                named.kai_groups = groups
            named.runtime = runtime.get(container_id)
            by_id[container_id] = named

    # 2. without a fresh pod list, tie running containers the API did not name to kubelet containers by what the
    #    kernel lets them use; 3. what is left is known by uid.
    cards = {gpu.minor: gpu.uuid for gpu in gpus if not gpu.is_mig and gpu.minor is not None}
    parents = {gpu.uuid: gpu.parent_uuid for gpu in gpus if gpu.parent_uuid}
    unnamed = {cid: found for cid, found in runtime.items() if cid not in by_id and found.pod_uid not in (pods or {})}
    fresh = identity_source is IdentitySource.KUBERNETES
    if not fresh and unnamed:
        holders = [d for d in drafts.values() if d.ref.namespace != options.kai_reservation_namespace]
        for container_id, draft in _tie_by_use(unnamed, processes, holders, parents).items():
            found = unnamed[container_id]
            draft.identity = Identity.FALLBACK
            draft.ref, draft.runtime = draft.ref.with_ids(found.pod_uid, container_id), found
            by_id[container_id] = draft

    #    Reported (by uid) only when it holds a GPU process or a GPU device node, or could not be read whole.
    process_containers = {process.container_id for process in processes if process.container_id}
    untied = _untied_holdings(drafts.values(), runtime, pods, parents) if not fresh else {}
    for container_id, found in runtime.items():
        if container_id in by_id:
            continue
        if not found.visible_minors and not found.view_limits and container_id not in process_containers:
            continue
        metadata = ((pods or {}).get(found.pod_uid) or {}).get("metadata") or {}
        namespace, name = metadata.get("namespace"), metadata.get("name")
        draft = _Draft(ContainerRef(namespace, name, None, found.pod_uid, container_id), identity=Identity.UID)
        draft.runtime = found
        draft.unconfirmed = untied.get((namespace, name) if metadata else None, frozenset())
        drafts[(namespace or "", name or "", container_id)] = draft
        by_id[container_id] = draft

    containers = tuple(_freeze(draft, cards) for draft in drafts.values())
    nested = _nested_note(containers)
    return NodeSnapshot(
        options.node,
        now,
        tuple(gpus),
        containers,
        tuple(processes),
        identity_source,
        (*notes, *nested),
        frozenset(degraded),
        activity_devices=frozenset(activity_devices),
        activity_unknown=tuple(activity_unknown),
        unlisted=tuple(unlisted),
        dra_slices=slices.state,
        offered_replicas=None if offered is None else count_offered(offered, devices.normalize),
    )


def _holds(draft: _Draft, parents: Mapping[str, str]) -> frozenset[str]:
    """What a kubelet container may use: its allocation, and the cards of its MIG slices (NVML may show a slice's
    process on its card too)."""
    return frozenset(draft.allocated) | {parents[uuid] for uuid in draft.allocated if uuid in parents}


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


def _tie_by_use(
    unnamed: Mapping[str, RuntimeContainer],
    processes: Iterable[GpuProcess],
    drafts: Iterable[_Draft],
    parents: Mapping[str, str],
) -> dict[str, _Draft]:
    """Running container id → the kubelet container it is, where its GPU use tells: that kubelet container alone
    holds every GPU the container's processes use, and no other running container could be it.

    Never a container's own files or environment: those it writes. A container that uses no GPU, or shares what it
    uses with another holder (time-slicing, MPS), stays known by uid. ``drafts`` leaves out KAI's reservation pods:
    they hold the GPU their fraction pods use, and never use it themselves.
    """
    used: dict[str, set[str]] = defaultdict(set)
    for process in processes:
        if process.container_id is not None and process.container_id in unnamed:
            used[process.container_id].add(process.gpu_uuid)
    holds: dict[int, frozenset[str]] = {}
    holders: dict[str, list[_Draft]] = defaultdict(list)  # GPU → untied kubelet containers that may use it
    for draft in drafts:
        if draft.in_kubelet and draft.ref.container_id is None and draft.allocated:
            holds[id(draft)] = _holds(draft, parents)
            for uuid in holds[id(draft)]:
                holders[uuid].append(draft)
    picks: dict[str, _Draft] = {}
    picked_by: dict[int, int] = defaultdict(int)
    for container_id, uuids in used.items():
        candidates: list[_Draft] = []
        for draft in holders.get(min(uuids, key=lambda uuid: len(holders.get(uuid, ()))), ()):
            if uuids <= holds[id(draft)]:
                candidates.append(draft)
                if len(candidates) > 1:
                    break  # two could be it: neither is taken (and a GPU shared by hundreds costs two checks)
        if len(candidates) == 1:
            picks[container_id] = candidates[0]
            picked_by[id(candidates[0])] += 1
    return {container_id: draft for container_id, draft in picks.items() if picked_by[id(draft)] == 1}


def _untied_holdings(
    drafts: Iterable[_Draft],
    runtime: Mapping[str, RuntimeContainer],
    pods: Mapping[str, Mapping[str, Any]] | None,
    parents: Mapping[str, str],
) -> dict[tuple[str | None, str | None] | None, frozenset[str]]:
    """What the kubelet containers that no running container is tied to hold: by (namespace, pod) for the pods the
    pod list knows, and under None together for the rest (a container of a pod no list knows may be any of those)."""
    known = {
        ((pod.get("metadata") or {}).get("namespace"), (pod.get("metadata") or {}).get("name"))
        for pod in (pods or {}).values()
    }
    held: dict[tuple[str | None, str | None] | None, set[str]] = defaultdict(set)
    for draft in drafts:
        if not draft.in_kubelet or not draft.allocated:
            continue
        if draft.ref.container_id is not None and draft.ref.container_id in runtime:
            continue  # tied to a running container
        pod = (draft.ref.namespace, draft.ref.pod)
        held[pod if pod in known else None].update(_holds(draft, parents))
    return {pod: frozenset(uuids) for pod, uuids in held.items()}


def _nested_note(containers: Iterable[Container]) -> tuple[str, ...]:
    """One note for the containers whose processes sit in cgroups, made below their own, that name another pod: they
    are counted as the outer container's, which the kubelet made, and said here (a few by name, all by number)."""
    nesting = [c for c in containers if c.nested_pod_uids]
    if not nesting:
        return ()
    shown = "; ".join(
        f"{c.describe()} names pod {', '.join(sorted(c.nested_pod_uids))}"
        for c in sorted(nesting, key=lambda c: c.container_id or "")[:3]
    )
    more = f" and {len(nesting) - 3} more" if len(nesting) > 3 else ""
    return (
        f"{len(nesting)} container{'s' if len(nesting) > 1 else ''} with processes in cgroups made below their own "
        f"that name another pod (counted as the outer container's): {shown}{more}",
    )


def _freeze(draft: _Draft, cards: Mapping[int, str]) -> Container:
    """The frozen container; ``cards`` maps a card's minor to its UUID (built once per cycle)."""
    found = draft.runtime
    visible = None
    if found is not None and found.visible_minors is not None:
        visible = frozenset(cards[minor] for minor in found.visible_minors if minor in cards)
    ref = draft.ref
    return Container(
        ref.namespace,
        ref.pod,
        ref.container,
        ref.pod_uid,
        ref.container_id,
        allocated=draft.allocated,
        unresolved_allocations=draft.unresolved,
        dra_devices=draft.dra,
        visible=visible,
        visible_devices_envs=found.visible_devices_envs if found is not None else (),
        env_read=found.env_read if found is not None else False,
        kai_gpu_groups=draft.kai_groups,
        labels=draft.labels,
        identity=draft.identity,
        pid=found.pid if found is not None else None,
        spec_field=draft.spec_field,
        unconfirmed_allocations=draft.unconfirmed,
        claimed_namespace=found.claimed_namespace if found is not None and draft.identity is Identity.UID else None,
        claimed_pod=found.claimed_pod if found is not None and draft.identity is Identity.UID else None,
        view_limits=found.view_limits if found is not None else frozenset(),
        nested_pod_uids=found.nested_pod_uids if found is not None else frozenset(),
    )
