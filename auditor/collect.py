"""One cycle's reading: every source once, handed to the pure join (``auditor.snapshot.assemble``).

In order: one kubelet ``List`` (and, every few minutes, ``GetAllocatableResources`` through ``sources.offered``);
the ResourceSlices the background watch holds (the cycle itself makes no request for them); one NVML snapshot; the
cgroup identity of each GPU process's host pid; the pod cache (relisted when due, or early when it meets a pod or
container it does not know); one incremental scan of host /proc with what one live process per container shows (its
GPU device nodes, its environment and, without a fresh pod list, the files that name its pod). The sources are the
Protocols of ``auditor.sources``.

A source that cannot be read at all fails the cycle with a ``CollectError`` naming it; one read in part (a GPU
NVML lost, the API server down) leaves a note in the snapshot and the source among its ``degraded``.
"""

# ruff: noqa: PLC0415  (the adapters' error types are imported where caught: NVML and gRPC stay out of --help)
from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpu_fence.vocabulary import VISIBLE_DEVICES_ENV

from .model import FailureReason, GpuProcess, IdentitySource, NodeSnapshot
from .snapshot import DeviceIndex, RuntimeContainer, SnapshotOptions, assemble
from .sources import HostProcSource, PodSource, Sources

if TYPE_CHECKING:
    from .nvml import NvmlProcess
    from .podresources.allocations import DeviceAllocation

#: The pod's namespace as its service account sees it, in the container's root: the fallback's pod namespace.
SERVICEACCOUNT_NAMESPACE = "var/run/secrets/kubernetes.io/serviceaccount/namespace"
#: Set by the runtime to the pod name (unless the pod sets ``hostname``): the fallback's pod name.
HOSTNAME_ENV = "HOSTNAME"


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
        processes = identify_processes(sources.hostproc, nvml.processes)
        identity_source, pods = pod_list(sources.pods, processes, notes, degraded)
        runtime = inspect_runtime_containers(
            sources.hostproc, with_fallback_names=identity_source is not IdentitySource.KUBERNETES
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


def identify_processes(hostproc: HostProcSource, nvml_processes: Iterable[NvmlProcess]) -> list[GpuProcess]:
    """NVML's processes with the cgroup identity of their host pid (or why it could not be read)."""
    nvml_processes = list(nvml_processes)
    identities = hostproc.identities({p.pid for p in nvml_processes})
    found = []
    for process in nvml_processes:
        identity = identities.get(process.pid)
        error = None
        if identity is None and not hostproc.exists(process.pid):
            error = "the process exited before its cgroup could be read"
        found.append(
            GpuProcess(
                process.pid,
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
        notes.append(
            "Kubernetes API not used: names from PodResources and each container's HOSTNAME and "
            "service-account namespace file"
        )
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
        when = "stale pod list in use" if listed is not None else "names from PodResources and /proc"
        notes.append(f"Kubernetes API unavailable ({pods.last_error}): {when}")
    return state, listed


def inspect_runtime_containers(hostproc: HostProcSource, *, with_fallback_names: bool) -> dict[str, RuntimeContainer]:
    """One live pid per container (incremental scan) and what it shows: GPU nodes, env, and fallback names."""
    found: dict[str, RuntimeContainer] = {}
    pids = hostproc.container_pids()
    identities = hostproc.identities(pids.values())
    names = (VISIBLE_DEVICES_ENV, HOSTNAME_ENV) if with_fallback_names else (VISIBLE_DEVICES_ENV,)
    for container_id, pid in pids.items():
        identity = identities.get(pid)
        if identity is None:
            continue  # exited since the scan
        env = hostproc.environ(pid, *names)
        hostname = namespace = None
        if with_fallback_names:
            hostname = env.get(HOSTNAME_ENV) if env is not None else None
            namespace = _text(hostproc.read_root_file(pid, SERVICEACCOUNT_NAMESPACE))
        found[container_id] = RuntimeContainer(
            container_id=container_id,
            pod_uid=identity.pod_uid,
            pid=pid,
            visible_minors=hostproc.visible_minors(pid),
            visible_devices_env=env.get(VISIBLE_DEVICES_ENV) if env is not None else None,
            env_read=env is not None,
            hostname=hostname,
            namespace_file=namespace,
        )
    return found


def _text(data: bytes | None) -> str | None:
    """A small file's text, stripped; None when it could not be read or holds only whitespace."""
    if data is None:
        return None
    return data.decode("utf-8", errors="replace").strip() or None
