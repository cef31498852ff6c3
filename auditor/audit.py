"""The audit: one node snapshot in, per-container rows and findings out. Pure: no I/O, no clock, no globals.

Read top to bottom: what each container is *entitled* to (kubelet allocation, resolved DRA devices, the GPU
of its KAI reservation pod), then per container what it uses and sees against that entitlement, then the
processes that belong to no container. Each finding kind is one small function named after it.

Rules that are easy to get wrong, decided once here:
- a time-slicing / MPS replica (``GPU-x::3``) is an allocation of ``GPU-x`` (the snapshot already strips it); so is
  a DRA device shared by several containers or pods (one claim used by many, or consumable capacity): each holder
  is entitled to it and metered by its own processes' memory;
- a MIG device is neither its parent card nor a sibling slice: a process on a MIG device is
  ``used-unallocated`` unless that very MIG device is allocated;
- holding a MIG slice makes the parent card's ``/dev/nvidia<minor>`` legitimately visible (CUDA needs it; the
  slice itself is gated by ``nvidia-caps`` nodes), and NVML's aggregate view of the parent is not extra use;
- a container known by uid only, without a fresh pod list, may be any kubelet container nothing was tied to: the
  GPUs those hold (``unconfirmed_allocations``) are not called overreach for it; every other GPU is;
- a container the auditor could not read whole (a bound met, ``view_limits``) is reported, never passed as clean;
- exempt namespaces get rows (metering) but never findings; a namespace is what the API or the kubelet says, never
  what a container claims.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping

from gpu_fence.vocabulary import DeviceIdForm, Visibility, classify_device_id, parse_visible_devices

from .model import (
    IDLE,
    Activity,
    ActivityUnknown,
    AuditPolicy,
    AuditResult,
    Container,
    ContainerRef,
    Finding,
    FindingKind,
    Gpu,
    GpuProcess,
    NodeSnapshot,
    Row,
    ViewLimit,
)

_KIND_ORDER = {kind: position for position, kind in enumerate(FindingKind)}


def audit(snapshot: NodeSnapshot, policy: AuditPolicy | None = None) -> AuditResult:
    policy = policy or AuditPolicy()
    gpus = {gpu.uuid: gpu for gpu in snapshot.gpus}
    reservations = kai_reservation_gpus(snapshot.containers, policy)
    processes_by_container: dict[str, list[GpuProcess]] = defaultdict(list)
    known_ids = {c.container_id for c in snapshot.containers if c.container_id}
    unattributed: list[GpuProcess] = []
    for process in snapshot.processes:
        if process.container_id and process.container_id in known_ids:
            processes_by_container[process.container_id].append(process)
        else:
            unattributed.append(process)

    rows: list[Row] = []
    findings: list[Finding] = []
    unknown_activity = dict(snapshot.activity_unknown)
    for container in snapshot.containers:
        entitled = entitlement(container, reservations)
        processes = processes_by_container.get(container.container_id or "", []) if container.container_id else []
        exempt = container.namespace in policy.exempt_namespaces
        rows.append(
            _row(
                container,
                entitled,
                processes,
                exempt,
                activity_devices=snapshot.activity_devices,
                unknown_activity=unknown_activity,
            )
        )
        if exempt:
            continue
        possible = entitled | container.unconfirmed_allocations
        allowed = possible | _parents(possible, gpus)
        findings.extend(used_unallocated(container, processes, allowed, gpus))
        findings.extend(visible_unallocated(container, allowed, gpus))
        findings.extend(env_mismatch(container, possible, gpus))
        findings.extend(incomplete_view(container))
    pods = {c.pod_uid: f"{c.namespace}/{c.pod}" for c in snapshot.containers if c.pod_uid and c.pod}
    findings.extend(unattributed_process(process, gpus, pods) for process in unattributed)

    unattributed_memory: Counter[str] = Counter()
    unknown_memory: Counter[str] = Counter()
    for process in unattributed:
        unattributed_memory[process.gpu_uuid] += process.used_memory_bytes or 0
        if process.used_memory_bytes is None:
            unknown_memory[process.gpu_uuid] += 1
    rows.sort(key=lambda r: (r.ref.namespace or "", r.ref.pod or "", r.ref.container or "", r.ref.container_id or ""))
    findings.sort(key=_finding_order)
    return AuditResult(
        tuple(rows),
        tuple(findings),
        tuple(sorted(unattributed_memory.items())),
        tuple(sorted(unknown_memory.items())),
    )


# --- entitlement -------------------------------------------------------------------------------------------


def kai_reservation_gpus(containers: Iterable[Container], policy: AuditPolicy) -> dict[str, frozenset[str]]:
    """GPU group → GPUs held by KAI reservation pods of that group on this node.

    KAI gives a fractional pod no allocation of its own: a reservation pod in ``kai-resource-reservation``
    holds the ``nvidia.com/gpu`` and carries the group label (``runai-gpu-group``) that the binder also puts
    on every fraction pod sharing that GPU. The snapshot puts the groups on the reservation pod's container
    and on the fraction pod's fraction container; this joins them.
    """
    groups: dict[str, set[str]] = defaultdict(set)
    for container in containers:
        if container.namespace == policy.kai_reservation_namespace:
            for group in container.kai_gpu_groups:
                groups[group].update(container.allocated)
    return {group: frozenset(uuids) for group, uuids in groups.items()}


def entitlement(container: Container, reservations: Mapping[str, frozenset[str]]) -> frozenset[str]:
    """The GPU/MIG UUIDs a container may see and use."""
    entitled = set(container.allocated)
    for group in container.kai_gpu_groups:
        entitled.update(reservations.get(group, ()))
    return frozenset(entitled)


def _parents(uuids: Iterable[str], gpus: Mapping[str, Gpu]) -> frozenset[str]:
    return frozenset(gpus[u].parent_uuid for u in uuids if u in gpus and gpus[u].parent_uuid)  # type: ignore[misc]


# --- one function per finding kind ------------------------------------------------------------------------


def used_unallocated(
    container: Container, processes: Iterable[GpuProcess], allowed: frozenset[str], gpus: Mapping[str, Gpu]
) -> list[Finding]:
    """A process of the container uses a GPU the container was not allocated: metering is skewed by its bytes."""
    found = []
    unmapped = ""
    ids = [*container.unresolved_allocations, *(d.describe() for d in container.dra_devices if d.uuid is None)]
    if ids:
        # A DRA device or plugin id we could not map may be this very GPU: say so rather than stay silent.
        unmapped = f" (its allocation also holds ids not mapped to a GPU: {', '.join(ids)})"
    for process in processes:
        if process.gpu_uuid in allowed:
            continue
        size = _bytes_text(process.used_memory_bytes)
        found.append(
            _finding(
                FindingKind.USED_UNALLOCATED,
                container,
                process.gpu_uuid,
                pid=process.pid,
                memory_bytes=process.used_memory_bytes,
                message=(
                    f"process {process.pid} uses {size} on {_describe(process.gpu_uuid, gpus)}, which the container "
                    f"was not allocated{unmapped}; request the GPU (nvidia.com/gpu) or set NVIDIA_VISIBLE_DEVICES=void"
                ),
            )
        )
    return found


def visible_unallocated(container: Container, allowed: frozenset[str], gpus: Mapping[str, Gpu]) -> list[Finding]:
    """The container can open a GPU device node it was not allocated (privileged, hostPath /dev, env in image)."""
    if container.visible is None:
        return []
    return [
        _finding(
            FindingKind.VISIBLE_UNALLOCATED,
            container,
            uuid,
            message=(
                f"{_device_node(uuid, gpus)} ({_describe(uuid, gpus)}) is present in the container, which was not "
                "allocated it; look for privileged: true, a hostPath /dev mount or NVIDIA_VISIBLE_DEVICES in the image"
            ),
        )
        for uuid in sorted(container.visible - allowed)
    ]


def env_mismatch(container: Container, entitled: frozenset[str], gpus: Mapping[str, Gpu]) -> list[Finding]:
    """The ``NVIDIA_VISIBLE_DEVICES`` of some process of the container names more than its allocation (indexes
    mapped to UUIDs). Every process counts: one that re-execs with ``void`` does not clear its siblings."""
    offending = [(value, named_devices(value, gpus) - entitled) for value in container.visible_devices_envs]
    offending = [(value, extra) for value, extra in offending if extra]
    if not offending:
        return []
    extra = sorted(frozenset().union(*(names for _, names in offending)))
    shown = ", ".join(extra[:4]) + (f" and {len(extra) - 4} more" if len(extra) > 4 else "")
    values = " and ".join(f"NVIDIA_VISIBLE_DEVICES={value!r}" for value, _ in offending[:2])
    if len(offending) > 2:
        values += f" and {len(offending) - 2} more values"
    processes = "" if len(container.visible_devices_envs) == len(offending) else " (in some of its processes)"
    return [
        _finding(
            FindingKind.ENV_MISMATCH,
            container,
            extra[0] if len(extra) == 1 else None,
            message=(
                f"{values}{processes} name{'s' if len(offending) == 1 else ''} {shown} beyond the container's "
                "allocation; let the device plugin set it (request nvidia.com/gpu) or set it to void"
            ),
        )
    ]


#: What each bound means, in a finding's words (``auditor.hostproc`` holds the numbers).
_LIMIT_TEXT = {
    ViewLimit.PROCESSES: "it has more processes than the auditor judges per container",
    ViewLimit.VIEWS: "its processes show more distinct root file systems or mount namespaces than the auditor lists",
    ViewLimit.UNSTABLE: "its processes kept changing their root or mount namespace while the auditor read them",
    ViewLimit.DEV_ENTRIES: "its /dev holds more entries than the auditor reads",
    ViewLimit.ENV_VALUES: "its processes set more distinct NVIDIA_VISIBLE_DEVICES values than the auditor keeps",
}


def incomplete_view(container: Container) -> list[Finding]:
    """The auditor met a bound reading the container's processes: what lay past it was not judged, so the container
    is reported rather than passed as clean (a bound must not be a place to hide a GPU)."""
    if not container.view_limits:
        return []
    reasons = "; ".join(_LIMIT_TEXT[limit] for limit in ViewLimit if limit in container.view_limits)
    return [
        _finding(
            FindingKind.INCOMPLETE_VIEW,
            container,
            None,
            message=(
                f"the auditor could not judge everything the container can see: {reasons}; what it read is "
                "reported, the rest is unknown: look for a flooded /dev, chroots or private mount namespaces"
            ),
        )
    ]


def unattributed_process(
    process: GpuProcess, gpus: Mapping[str, Gpu], pods: Mapping[str, str] | None = None
) -> Finding:
    """A GPU process outside every known container: a host process, an unknown cgroup, or one that just exited.

    ``pods`` (pod uid → ``namespace/name`` of the node's known pods) names the pod whose cgroup holds the process.
    """
    pod_name = (pods or {}).get(process.pod_uid or "")
    pod = f"pod {pod_name} (uid {process.pod_uid})" if pod_name else f"pod uid {process.pod_uid}"
    elsewhere = "" if pod_name else " (no pod with that uid is known on this node)"
    if process.identity_error:
        why = f"its identity could not be read ({process.identity_error})"
    elif process.pod_uid and not process.container_id:
        # A process placed in the pod-level cgroup itself (by a runtime hook, or moved there by hand).
        why = f"it is in the cgroup of {pod} but in none of its containers{elsewhere}"
    elif process.pod_uid:
        why = f"its cgroup names container {process.container_id} of {pod}, which is not a container on this node"
    elif process.container_id:
        why = f"its cgroup names container {process.container_id} of no Kubernetes pod"
    else:
        why = "it runs outside any Kubernetes pod (a host process)"
    return Finding(
        FindingKind.UNATTRIBUTED_PROCESS,
        ContainerRef(None, None, None, process.pod_uid, process.container_id),
        process.gpu_uuid,
        pid=process.pid,
        memory_bytes=process.used_memory_bytes,
        message=(
            f"process {process.pid} uses {_bytes_text(process.used_memory_bytes)} on "
            f"{_describe(process.gpu_uuid, gpus)} and {why}"
        ),
    )


# --- NVIDIA_VISIBLE_DEVICES → UUIDs ------------------------------------------------------------------------


def leaf_devices(gpus: Mapping[str, Gpu]) -> frozenset[str]:
    """Devices a workload can compute on: full cards not in MIG mode, and MIG devices."""
    return frozenset(uuid for uuid, gpu in gpus.items() if gpu.is_mig or not gpu.mig_enabled)


def named_devices(value: str, gpus: Mapping[str, Gpu]) -> frozenset[str]:
    """The node's GPU/MIG UUIDs a ``NVIDIA_VISIBLE_DEVICES`` value names, parsed exactly as the toolkit does.

    ``all`` names every leaf device; ``void``/``none``/empty name nothing. Entries that name no device of this
    node (a UUID of another node, an unknown form, the volume-mount marker whose list lives in mounts we do
    not read) name nothing: the toolkit would refuse them or the mounts decide.
    """
    parsed = parse_visible_devices(value)
    if parsed.visibility is Visibility.ALL:
        return leaf_devices(gpus)
    if parsed.visibility is not Visibility.LIST:
        return frozenset()
    named: set[str] = set()
    for entry in parsed.devices:
        named.update(_resolve_entry(entry, gpus))
    return frozenset(named)


def _resolve_entry(entry: str, gpus: Mapping[str, Gpu]) -> frozenset[str]:
    form = classify_device_id(entry)
    if form is DeviceIdForm.CDI_NAME:
        device = entry.split("=", 1)[1]
        return leaf_devices(gpus) if device == "all" else _resolve_entry(device, gpus)
    if form in (DeviceIdForm.GPU_UUID, DeviceIdForm.MIG_UUID):
        return frozenset({entry}) if entry in gpus else frozenset()
    if form is DeviceIdForm.INDEX:
        index = int(entry)
        return frozenset(u for u, g in gpus.items() if not g.is_mig and g.index == index)
    if form is DeviceIdForm.MIG_INDEX:
        card, slot = (int(part) for part in entry.split(":"))
        return frozenset(u for u, g in gpus.items() if g.is_mig and g.index == card and g.mig_index == slot)
    if form is DeviceIdForm.MIG_LEGACY:
        # ``MIG-<card uuid>/<gi>/<ci>`` (drivers before R470) names a slice, never its card. Those drivers' NVML
        # reports the slice's UUID in this very form; otherwise find the slice by card and GPU instance.
        if entry in gpus:
            return frozenset({entry})
        parts = entry[len("MIG-") :].split("/")
        if len(parts) != 3 or not parts[1].isdigit():
            return frozenset()
        parent, gi = parts[0], int(parts[1])
        return frozenset(u for u, g in gpus.items() if g.parent_uuid == parent and g.gpu_instance_id == gi)
    return frozenset()


# --- rows and helpers --------------------------------------------------------------------------------------


def _row(
    container: Container,
    entitled: frozenset[str],
    processes: list[GpuProcess],
    exempt: bool,
    *,
    activity_devices: frozenset[str],
    unknown_activity: Mapping[str, ActivityUnknown],
) -> Row:
    memory: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    busy: dict[str, list[Activity]] = defaultdict(list)
    for process in processes:
        memory[process.gpu_uuid] += process.used_memory_bytes or 0
        if process.used_memory_bytes is None:
            unknown[process.gpu_uuid] += 1  # NVML gave no size: counted, so that a 0 is not read as "idle"
        if process.activity is not None:
            busy[process.gpu_uuid].append(process.activity)
    # Activity where NVML samples it: on every device the container uses, and at 0 on one it holds without a
    # process there (an idle reservation is the point of the signal).
    activity = {uuid: IDLE for uuid in entitled if uuid in activity_devices}
    activity.update((uuid, Activity.total(found)) for uuid, found in busy.items())
    # Where it is unknown (MIG, MPS, an error), the row says why, on every device the container uses or holds.
    unsampled = {uuid: unknown_activity[uuid] for uuid in (*entitled, *memory) if uuid in unknown_activity}
    return Row(
        ref=container.ref,
        allocated=tuple(sorted(entitled)),
        allocation_counts=tuple(sorted(Counter(container.allocated).items())),
        visible=None if container.visible is None else tuple(sorted(container.visible)),
        used=tuple(sorted({p.gpu_uuid for p in processes})),
        memory_bytes=tuple(sorted(memory.items())),
        exempt=exempt,
        identity=container.identity,
        labels=container.labels,
        unknown_memory_processes=tuple(sorted(unknown.items())),
        activity=tuple(sorted(activity.items())),
        activity_unknown=tuple(sorted(unsampled.items())),
        unconfirmed_allocations=_sorted(container.unconfirmed_allocations - entitled),
        claimed_namespace=container.claimed_namespace,
        claimed_pod=container.claimed_pod,
        view_limits=tuple(limit for limit in ViewLimit if limit in container.view_limits)
        if container.view_limits
        else (),
        nested_pod_uids=_sorted(container.nested_pod_uids),
        dra_devices=container.dra_devices,
    )


def _sorted(uuids: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(uuids)) if uuids else ()


def _finding(
    kind: FindingKind,
    container: Container,
    gpu: str | None,
    *,
    pid: int | None = None,
    memory_bytes: int | None = None,
    message: str,
) -> Finding:
    return Finding(
        kind,
        container.ref,
        gpu,
        pid=pid,
        memory_bytes=memory_bytes,
        message=message,
        container_field=container.spec_field,
    )


def _finding_order(finding: Finding) -> tuple[int, str, str, str, str, int]:
    ref = finding.ref
    return (
        _KIND_ORDER[finding.kind],
        ref.namespace or "",
        ref.pod or "",
        ref.container or "",
        finding.gpu or "",
        finding.pid or 0,
    )


def _describe(uuid: str, gpus: Mapping[str, Gpu]) -> str:
    gpu = gpus.get(uuid)
    if gpu is None:
        return uuid
    if gpu.is_mig:
        return f"MIG device {gpu.index}:{gpu.mig_index} {uuid}"
    return f"GPU {gpu.index} {uuid}"


def _device_node(uuid: str, gpus: Mapping[str, Gpu]) -> str:
    gpu = gpus.get(uuid)
    return f"/dev/nvidia{gpu.minor}" if gpu is not None and gpu.minor is not None else "a GPU device node"


def _bytes_text(size: int | None) -> str:
    if size is None:
        return "an unknown amount of memory"
    return f"{size} bytes ({size / 2**20:.0f} MiB)"
