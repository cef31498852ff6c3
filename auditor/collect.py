"""One cycle's reading: every source once, handed to the pure join (``auditor.snapshot.assemble``).

In order: one kubelet ``List`` (and, every few minutes, ``GetAllocatableResources`` through ``sources.offered``);
the ResourceSlices the background watch holds (the cycle itself makes no request for them); one NVML snapshot; one
incremental scan of host /proc, which places each GPU process's host pid in its container (a pid the scan did not
find in a pod is read again); the pod cache (relisted when due, or early when it meets a pod or container it does
not know); and what every container's processes show, judged over all of them (GPU device nodes,
``NVIDIA_VISIBLE_DEVICES``). Without a fresh pod list a container that touches a GPU is also asked what it claims to
be (its ``HOSTNAME`` and service-account namespace file): a claim is shown as such, never used to name or exempt it.
The sources are the Protocols of ``auditor.sources``.

A source that cannot be read at all fails the cycle with a ``CollectError`` naming it; one read in part (a GPU
NVML lost, the API server down) leaves a note in the snapshot and the source among its ``degraded``.
"""

# ruff: noqa: PLC0415  (the adapters' error types are imported where caught: NVML and gRPC stay out of --help)
from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .model import FailureReason, GpuProcess, IdentitySource, NodeSnapshot
from .snapshot import DeviceIndex, RuntimeContainer, SnapshotOptions, assemble
from .sources import HostProcSource, PodSource, Sources

if TYPE_CHECKING:
    from .cgroups import CgroupIdentity
    from .hostproc import ProcScan
    from .nvml import NvmlProcess
    from .podresources.allocations import DeviceAllocation

#: The pod's namespace as its service account sees it, in the container's root: what a container claims as its
#: namespace (it can write anything there).
SERVICEACCOUNT_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: Set by the runtime to the pod name (unless the pod sets ``hostname``): what a container claims as its pod name.
HOSTNAME_ENV = "HOSTNAME"
#: What a claim must look like to be shown: a DNS-1123 subdomain (pod names; a namespace is a label, which fits).
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


#: How containers are named without a pod list (``auditor.snapshot``), as the notes say it.
FALLBACK_NAMES = "names from PodResources, tied to running containers by their GPU use; other containers by uid"


class CollectError(Exception):
    """A cycle could not be audited: ``source`` is the one that failed, ``reason`` says what to fix."""

    def __init__(self, source: FailureReason, reason: str) -> None:
        super().__init__(reason)
        self.source = source
        self.reason = reason


def collect(sources: Sources, options: SnapshotOptions, *, clock: Callable[[], float] = time.time) -> NodeSnapshot:
    """Read every source once and assemble the snapshot; raises ``CollectError`` when the cycle cannot be audited."""
    from .nvml import NvmlError
    from .podresources.client import KubeletUnavailable

    now = clock()
    notes: list[str] = []
    degraded: set[FailureReason] = set()
    try:
        allocations = sources.podresources.list()
    except KubeletUnavailable as error:
        raise CollectError(FailureReason.KUBELET, f"kubelet PodResources API unavailable: {error}") from error
    offered = offered_devices(sources, notes)
    slices = sources.slices.view if sources.slices is not None else None
    try:
        nvml = sources.nvml.snapshot()
    except NvmlError as error:
        raise CollectError(FailureReason.NVML, str(error)) from error
    if nvml.problems:
        degraded.add(FailureReason.NVML)
        notes.extend(f"NVML: {problem.device or 'node'}: {problem.message}" for problem in nvml.problems)
    try:
        scan = sources.hostproc.scan()
        processes = identify_processes(sources.hostproc, scan, nvml.processes)
        identity_source, pods = pod_list(sources.pods, processes, notes, degraded)
        runtime = inspect_runtime_containers(
            sources.hostproc, scan, processes, with_claims=identity_source is not IdentitySource.KUBERNETES
        )
    except OSError as error:
        raise CollectError(FailureReason.PROC, f"cannot read host /proc at {sources.hostproc.root}: {error}") from error
    return assemble(
        options,
        now=now,
        gpus=nvml.devices,
        devices=DeviceIndex.build(nvml.devices),
        allocations=allocations,
        runtime=runtime,
        processes=processes,
        pods=pods,
        identity_source=identity_source,
        notes=notes,
        degraded=degraded,
        activity_devices=nvml.activity_devices,
        activity_unknown=nvml.activity_unknown,
        unlisted=nvml.unlisted,
        slices=slices,
        offered=offered,
    )


def offered_devices(sources: Sources, notes: list[str]) -> Sequence[DeviceAllocation] | None:
    """The device plugins' offer (asked of the kubelet only when due), and a note while it is unknown."""
    if sources.offered is None:
        return None
    offered = sources.offered.read(sources.podresources)
    if offered is None and sources.offered.last_error:
        notes.append(
            f"offered replicas unknown (gpu_fence_gpu_offered_replicas not exported): {sources.offered.last_error}"
        )
    return offered


def identify_processes(
    hostproc: HostProcSource, scan: ProcScan, nvml_processes: Iterable[NvmlProcess]
) -> list[GpuProcess]:
    """NVML's processes with the cgroup identity of their host pid (or why it could not be read).

    The scan ran after NVML's snapshot, so where it placed a pid in a pod that is where the process is; a pid it did
    not (a host process, one outside any pod when it was last read) is read again.
    """
    read: dict[int, CgroupIdentity | None] = {}
    found = []
    for process in nvml_processes:
        pid = process.pid
        identity = scan.placed.get(pid)
        if identity is None:
            if pid not in read:
                read[pid] = hostproc.identity(pid)
            identity = read[pid]
        error = None
        if identity is None and not hostproc.exists(pid):
            error = "the process exited before its cgroup could be read"
        found.append(
            GpuProcess(
                pid,
                process.device_uuid,
                process.used_memory_bytes,
                pod_uid=identity.pod_uid if identity else None,
                container_id=identity.container_id if identity else None,
                identity_error=error,
                activity=process.activity,
            )
        )
    return found


def pod_list(
    pods: PodSource | None, processes: Iterable[GpuProcess], notes: list[str], degraded: set[FailureReason]
) -> tuple[IdentitySource, Mapping[str, Mapping[str, Any]] | None]:
    """Where this cycle's names come from, and the pod list by uid when there is one (None: fall back).

    Asks the cache to relist early for a GPU process of a pod or container it does not know; says in ``notes``
    (and ``degraded``) when the API did not answer.
    """
    if pods is None:
        notes.append(f"Kubernetes API not used: {FALLBACK_NAMES}")
        return IdentitySource.FALLBACK, None
    processes = list(processes)
    pods.ensure(
        {process.pod_uid for process in processes if process.pod_uid},
        {process.container_id for process in processes if process.container_id},
    )
    state = pods.state
    listed = pods.pods if state is not IdentitySource.FALLBACK else None
    if pods.last_error:
        degraded.add(FailureReason.KUBERNETES_API)
        when = "stale pod list in use" if listed is not None else FALLBACK_NAMES
        notes.append(f"Kubernetes API unavailable ({pods.last_error}): {when}")
    return state, listed


def inspect_runtime_containers(
    hostproc: HostProcSource, scan: ProcScan, processes: Iterable[GpuProcess], *, with_claims: bool
) -> dict[str, RuntimeContainer]:
    """Every container with a process on the host, and what its processes show (``HostProc.inspect``).

    ``with_claims``: also read what a container that touches a GPU claims to be, for a report without a pod list.
    """
    found: dict[str, RuntimeContainer] = {}
    on_gpus = {process.container_id for process in processes if process.container_id}
    placed = scan.placed
    for container_id, pids in scan.containers.items():
        sight = hostproc.inspect(pids)
        if not sight.processes:
            continue  # every process exited since the scan
        claimed_namespace = claimed_pod = None
        if with_claims and (sight.minors or sight.limits or container_id in on_gpus):
            env = hostproc.environ(pids[0], HOSTNAME_ENV)
            claimed_pod = _claim(env.get(HOSTNAME_ENV) if env is not None else None)
            claimed_namespace = _claim(_text(hostproc.read_root_file(pids[0], SERVICEACCOUNT_NAMESPACE)))
        found[container_id] = RuntimeContainer(
            container_id=container_id,
            pod_uid=placed[pids[0]].pod_uid,
            pid=pids[0],
            visible_minors=sight.minors,
            visible_devices_envs=sight.visible_devices,
            env_read=sight.env_read,
            view_limits=sight.limits,
            nested_pod_uids=scan.nested.get(container_id, frozenset()),
            claimed_namespace=claimed_namespace,
            claimed_pod=claimed_pod,
        )
    return found


def _text(data: bytes | None) -> str | None:
    """A small file's text, stripped; None when it could not be read or holds only whitespace."""
    if data is None:
        return None
    return data.decode("utf-8", errors="replace").strip() or None


def _claim(text: str | None) -> str | None:
    """A name a container claims, when it has the shape of one; None for anything else (a claim is shown, and a
    container can write anything)."""
    return text if text is not None and _CLAIM.match(text) else None
