"""The auditor's values: what one node looks like in one cycle, and what the audit says about it.

Everything here is a frozen dataclass or an enum: ``auditor.collect`` reads the sources (PodResources, NVML, host
/proc, the Kubernetes API), ``auditor.snapshot`` joins what they say into a ``NodeSnapshot``, and the pure
``auditor.audit`` reads it. No I/O, no library imports: a test can write a whole node by hand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from enum import Enum, StrEnum

from gpu_fence import kai


class Identity(Enum):
    """How a container's names were learnt; the report says so, because the fallbacks can be wrong."""

    KUBERNETES = "kubernetes"  # pod uid + container id matched through the Kubernetes API (or its cache)
    FALLBACK = "fallback"  # API unavailable: the PodResources container that alone holds the GPUs its processes use
    UID = "uid"  # only the cgroup's pod uid and container id are known (what it claims is shown, not believed)
    KUBELET = "kubelet"  # only the kubelet's PodResources entry is known (no running process was found)


class IdentitySource(Enum):
    """Where one cycle's container names came from: the report's ``summary.identity``."""

    KUBERNETES = "kubernetes"  # the node's pod list, fresh
    KUBERNETES_STALE = "kubernetes-stale"  # the last pod list, kept while the API does not answer
    FALLBACK = "fallback"  # no pod list (API not used, or it never answered): PodResources and the containers' files


class FailureReason(Enum):
    """Why a cycle failed, or which source it ran without in part: the ``reason`` label of
    ``gpu_fence_audit_cycle_failures_total`` (in this order, the order its series are exported in)."""

    KUBELET = "kubelet"
    NVML = "nvml"
    KUBERNETES_API = "kubernetes-api"
    PROC = "proc"
    INTERNAL = "internal"


class NvmlReason(StrEnum):
    """Why NVML could not be used, or could not read a device or a process list (``auditor.nvml``): an ``NvmlError``'s
    or ``NvmlProblem``'s ``reason``, and the ``reason`` of ``gpu_fence_gpu_processes_unknown`` (``docs/nvml.md``). A
    ``StrEnum``: a member is the label value itself."""

    LIBRARY_MISSING = "library-missing"
    DRIVER_NOT_LOADED = "driver-not-loaded"
    NO_PERMISSION = "no-permission"
    GPU_LOST = "gpu-lost"
    NOT_SUPPORTED = "not-supported"
    UNKNOWN = "unknown"


class SliceState(Enum):
    """What the auditor holds of its node's ResourceSlices, through which DRA devices resolve to UUIDs: the report's
    ``summary.dra_slices`` and the state of ``gpu_fence_dra_slices_state``."""

    FRESH = "fresh"  # listed, and (``run``) the watch is up
    STALE = "stale"  # the last good list, kept while the API does not answer
    NONE = "none"  # never listed: the API has not answered, or refused (RBAC)
    NOT_SERVED = "not-served"  # the cluster serves no resource.k8s.io version the auditor reads
    UNUSED = "unused"  # the Kubernetes API is not used (--no-kubernetes)


class DraResolution(Enum):
    """How one DRA device of a GPU driver became a UUID, or why it did not: a metric label and a report field."""

    RESOLVED = "resolved"  # the device's ``uuid`` attribute in this node's ResourceSlice
    NO_SLICE = "no-slice"  # no ResourceSlice of this node describes (driver, pool, device)
    NO_UUID = "no-uuid"  # a slice describes it without a ``uuid`` attribute (NVIDIA's dynamic MIG devices)
    SLICES_UNAVAILABLE = "slices-unavailable"  # the auditor holds no slices (see ``SliceState``)
    NO_DEVICE_NAME = "no-device-name"  # the kubelet sent CDI names only (before 1.31): no device to look up


class FindingKind(Enum):
    USED_UNALLOCATED = "used-unallocated"
    VISIBLE_UNALLOCATED = "visible-unallocated"
    UNATTRIBUTED_PROCESS = "unattributed-process"
    ENV_MISMATCH = "env-mismatch"
    INCOMPLETE_VIEW = "incomplete-view"


class ActivityUnknown(Enum):
    """Why a device's per-process activity is unknown this cycle: the ``reason`` of ``gpu_fence_gpu_activity_unknown``
    and of a report row's ``gpu_activity_unknown`` (``docs/metrics.md``)."""

    MIG = "mig"  # a MIG device or a MIG-enabled card: nvml.h says per-process utilisation is not supported there
    #: MPS clients on the GPU (NVML's MPS process list is not empty): the driver reports their work under the MPS
    #: server's pid (H200, driver 580.159.04), so no process's samples there can be told to be its own
    MPS = "mps"
    NOT_SUPPORTED = "not-supported"  # the driver has neither utilisation call, or answers NOT_SUPPORTED
    ERROR = "error"  # the call failed this cycle, returned a value above 100%, or the MPS list could not be read


class ViewLimit(Enum):
    """A bound the auditor met reading a container's processes (``auditor.hostproc``): what lay past it was not
    judged, so the container is reported (``incomplete-view``) rather than passed as clean."""

    PROCESSES = "processes"  # more processes than are judged per container and cycle
    VIEWS = "views"  # more distinct (mount namespace, root) views than are listed
    UNSTABLE = "unstable"  # processes that changed their root or mount namespace while it was read, again and again
    DEV_ENTRIES = "dev-entries"  # a /dev with more entries than are read
    ENV_VALUES = "env-values"  # more distinct NVIDIA_VISIBLE_DEVICES values than are kept


@dataclass(frozen=True)
class Gpu:
    """A physical GPU or a MIG device, as NVML reports it.

    ``index`` and ``minor`` are those of the physical card (for a MIG device: of its parent), because
    ``NVIDIA_VISIBLE_DEVICES`` indexes and ``/dev/nvidia<minor>`` nodes name cards, never slices.
    """

    uuid: str
    index: int
    minor: int | None
    model: str = ""
    memory_total_bytes: int | None = 0  # None: NVML could not read it (unknown, never reported as 0)
    parent_uuid: str | None = None  # set for a MIG device
    mig_index: int | None = None  # position of a MIG device on its card ("<index>:<mig_index>")
    gpu_instance_id: int | None = None  # a MIG device's GPU instance (the "<gi>" of "MIG-GPU-<card>/<gi>/<ci>")
    mig_enabled: bool = False  # a physical card in MIG mode: its compute lives in its MIG devices
    profile: str = ""  # MIG profile, e.g. "3g.40gb"
    share: float | None = 1.0  # share of the physical card this device stands for (docs/metrics.md); None: unknown
    compute_instance_id: int | None = None  # a MIG device's compute instance (NVML places processes by GI and CI)

    @property
    def is_mig(self) -> bool:
        return self.parent_uuid is not None

    def mig_device(
        self,
        uuid: str,
        *,
        mig_index: int,
        gpu_instance_id: int,
        compute_instance_id: int,
        memory_total_bytes: int | None,
        profile: str,
        share: float | None,
        model: str | None = None,
    ) -> Gpu:
        """A MIG device of this card. The one place a MIG device is given its card's index and minor (see above);
        its model is the card's unless NVML names it otherwise."""
        return Gpu(
            uuid=uuid,
            index=self.index,
            minor=self.minor,
            model=self.model if model is None else model,
            memory_total_bytes=memory_total_bytes,
            parent_uuid=self.uuid,
            mig_index=mig_index,
            gpu_instance_id=gpu_instance_id,
            profile=profile,
            share=share,
            compute_instance_id=compute_instance_id,
        )


@dataclass(frozen=True, slots=True)
class Activity:
    """How busy a GPU's engines kept a process's work (or the sum over a container's processes): each a share of
    time from 0 to 1, from NVML's per-process utilisation samples since the previous cycle (``docs/metrics.md``).

    An operational signal, never a billing basis: samples, not accounting; and under MPS the driver reports the
    clients' work under the MPS server's pid, so there a process's activity is unknown (``ActivityUnknown.MPS``).
    """

    sm: float = 0.0
    memory_controller: float = 0.0
    encoder: float = 0.0
    decoder: float = 0.0

    @staticmethod
    def total(activities: Iterable[Activity]) -> Activity:
        """Their sum, each engine capped at 1: one container cannot keep an engine busier than all the time."""
        sm = memory_controller = encoder = decoder = 0.0
        for activity in activities:
            sm += activity.sm
            memory_controller += activity.memory_controller
            encoder += activity.encoder
            decoder += activity.decoder
        return Activity(min(1.0, sm), min(1.0, memory_controller), min(1.0, encoder), min(1.0, decoder))


#: A process NVML sampled no activity for on a device it does sample (nvml.h returns samples only for processes
#: with "some non-zero utilization during the last sample period").
IDLE = Activity()


@dataclass(frozen=True)
class GpuProcess:
    """A process NVML lists on a GPU or MIG device, with the cgroup identity read from host /proc.

    ``pod_uid``/``container_id`` are None for host processes, and ``identity_error`` says why when the
    identity could not be read at all (the process exited between the NVML query and the /proc read).
    """

    pid: int
    gpu_uuid: str
    used_memory_bytes: int | None
    pod_uid: str | None = None
    container_id: str | None = None
    identity_error: str | None = None
    activity: Activity | None = None  # None: unknown (the device's ``ActivityUnknown`` in the snapshot says why)


@dataclass(frozen=True)
class ClaimedDevice:
    """One device of a GPU driver that a DRA claim gives a container, as the kubelet names it, with the UUID its
    ResourceSlice gives it (``uuid`` is None unless ``resolution`` is ``RESOLVED``)."""

    claim_namespace: str
    claim_name: str
    driver: str
    pool: str
    device: str
    cdi_devices: tuple[str, ...]
    resolution: DraResolution
    uuid: str | None = None
    share_id: str | None = None  # consumable capacity (1.35+): one of several allocations of a shared device

    def describe(self) -> str:
        """``claim ns/name: driver/pool/device`` (or its CDI names when the kubelet sent no device name)."""
        named = f"{self.driver}/{self.pool}/{self.device}" if self.device else ", ".join(self.cdi_devices) or "?"
        return f"claim {self.claim_namespace}/{self.claim_name}: {named}"


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """Which container: the names the kubelet or the API give it (namespace, pod, container) and the ids of its
    cgroup (pod uid, container id), each None where no source said it. The one identity a ``Container``, its audited
    ``Row`` and its ``Finding``s carry."""

    namespace: str | None
    pod: str | None
    container: str | None
    pod_uid: str | None = None
    container_id: str | None = None

    def with_ids(self, pod_uid: str | None, container_id: str | None) -> ContainerRef:
        """These names, with the ids of the cgroup that a source tied them to."""
        return ContainerRef(self.namespace, self.pod, self.container, pod_uid, container_id)

    def describe(self) -> str:
        """``namespace/pod/container`` (the container id's first 12 characters where the container has no name), or
        ``container <id>`` where no pod names it."""
        if self.namespace is None and self.pod is None:
            return f"container {self.container_id[:12]}" if self.container_id else "(no container)"
        name = self.container if self.container is not None else (self.container_id or "?")[:12]
        return f"{self.namespace}/{self.pod}/{name}"


@dataclass(frozen=True)
class Container(ContainerRef):
    """One container of the node, joined from every source that knows it: its identity (the fields of
    ``ContainerRef``, first; ``ref`` is that identity alone) and what the sources say about it.

    ``allocated`` holds one GPU/MIG UUID per kubelet allocation id (a time-slicing replica ``GPU-x::3``
    becomes ``GPU-x``; two replicas of one card appear twice). ``visible`` is the union over the views of all its
    processes, None when none could be inspected; ``visible_devices_envs`` every distinct value of the variable its
    processes set (empty when none sets it or none could be read: ``env_read`` tells which).

    ``unconfirmed_allocations``: for a container known by uid only, without a fresh pod list, the GPUs held by
    kubelet containers that no running container was tied to: it may be one of them, so using them is not called
    overreach, and not called allowed either (the report lists them apart). ``claimed_namespace`` and
    ``claimed_pod``: what the container's own files say it is (its service-account namespace file, its
    ``HOSTNAME``), shown and never believed. ``view_limits``: bounds met reading its processes (``ViewLimit``).
    ``nested_pod_uids``: other pods named in cgroups its processes sit in below its own.
    """

    allocated: tuple[str, ...] = ()
    unresolved_allocations: tuple[str, ...] = ()  # device-plugin ids that name no GPU (``resource:id``)
    #: every device of a GPU driver its DRA claims give it, resolved or not (resolved ones are also in ``allocated``)
    dra_devices: tuple[ClaimedDevice, ...] = ()
    visible: frozenset[str] | None = None
    visible_devices_envs: tuple[str, ...] = ()
    env_read: bool = False
    kai_gpu_groups: frozenset[str] = frozenset()  # set only on the fraction container of a KAI fractional pod
    labels: tuple[tuple[str, str], ...] = ()
    identity: Identity = Identity.KUBERNETES
    pid: int | None = None  # its lowest live pid
    # the pod spec list the container is in ("containers", "initContainers", "ephemeralContainers"); None when
    # only PodResources and /proc named it
    spec_field: str | None = None
    unconfirmed_allocations: frozenset[str] = frozenset()
    claimed_namespace: str | None = None
    claimed_pod: str | None = None
    view_limits: frozenset[ViewLimit] = frozenset()
    nested_pod_uids: frozenset[str] = frozenset()

    @property
    def ref(self) -> ContainerRef:
        """The container's identity as a value of its own, for the row and the findings about it."""
        return ContainerRef(self.namespace, self.pod, self.container, self.pod_uid, self.container_id)


@dataclass(frozen=True)
class NodeSnapshot:
    """Everything the audit needs about one node at one moment."""

    node: str
    time: float  # unix seconds, when the cycle started
    gpus: tuple[Gpu, ...]
    containers: tuple[Container, ...]
    processes: tuple[GpuProcess, ...]
    identity_source: IdentitySource = IdentitySource.KUBERNETES
    notes: tuple[str, ...] = ()  # degraded conditions worth saying in the report (GPU lost, API down, ...)
    #: the sources this cycle ran without in part (a GPU unreadable, the API down): each counts as a failure cause
    degraded: frozenset[FailureReason] = frozenset()
    #: the devices whose per-process activity NVML reported this cycle; elsewhere activity is unknown, not zero
    activity_devices: frozenset[str] = frozenset()
    #: (GPU or MIG device UUID, why) for the devices NVML lists whose per-process activity is unknown this cycle
    activity_unknown: tuple[tuple[str, ActivityUnknown], ...] = ()
    #: (GPU or MIG device UUID, NVML's reason) for the devices whose processes NVML could not list this cycle:
    #: what runs there is unknown, so their unattributed memory is too
    unlisted: tuple[tuple[str, NvmlReason], ...] = ()
    dra_slices: SliceState = SliceState.UNUSED
    #: UUID → allocation ids the device plugins offer for it (GetAllocatableResources); None when unknown
    offered_replicas: tuple[tuple[str, int], ...] | None = None

    def with_degraded(self, reason: FailureReason, note: str) -> NodeSnapshot:
        """This snapshot with one more source it ran without in part, and the note that says so."""
        return replace(self, degraded=self.degraded | {reason}, notes=(*self.notes, note))


@dataclass(frozen=True)
class AuditPolicy:
    """Settings of the audit itself (the flags that change verdicts, not where data comes from)."""

    exempt_namespaces: frozenset[str] = frozenset()
    kai_reservation_namespace: str = kai.DEFAULT_RESERVATION_NAMESPACE


@dataclass(frozen=True)
class Row:
    """The audited state of one container: the metering record."""

    ref: ContainerRef
    allocated: tuple[str, ...]  # distinct UUIDs the container may use (kubelet, DRA, KAI reservation)
    allocation_counts: tuple[tuple[str, int], ...]  # UUID → allocation ids held (replicas count 1 each)
    visible: tuple[str, ...] | None
    used: tuple[str, ...]
    memory_bytes: tuple[tuple[str, int], ...]  # UUID → bytes used by the container's processes (known sizes only)
    exempt: bool = False
    identity: Identity = Identity.KUBERNETES
    labels: tuple[tuple[str, str], ...] = ()
    # UUID → processes whose memory NVML did not report: their bytes are missing from memory_bytes, not zero
    unknown_memory_processes: tuple[tuple[str, int], ...] = ()
    # UUID → the activity of the container's processes there, on each device it uses or holds that NVML samples
    activity: tuple[tuple[str, Activity], ...] = ()
    # UUID → why the activity is unknown, on each device it uses or holds where it is (never a 0 in ``activity``)
    activity_unknown: tuple[tuple[str, ActivityUnknown], ...] = ()
    unconfirmed_allocations: tuple[str, ...] = ()  # see Container
    claimed_namespace: str | None = None
    claimed_pod: str | None = None
    view_limits: tuple[ViewLimit, ...] = ()
    nested_pod_uids: tuple[str, ...] = ()
    dra_devices: tuple[ClaimedDevice, ...] = ()  # the container's DRA devices of GPU drivers (Container.dra_devices)


@dataclass(frozen=True)
class Finding:
    """What the audit found wrong, about a container (``ref``) or about a process outside every known container
    (``ref`` then holds only the pod uid and container id its cgroup names, if any)."""

    kind: FindingKind
    ref: ContainerRef
    gpu: str | None
    pid: int | None = None
    memory_bytes: int | None = None
    message: str = ""
    container_field: str | None = None  # the container's pod spec list (see Container.spec_field)


@dataclass(frozen=True)
class AuditResult:
    rows: tuple[Row, ...]
    findings: tuple[Finding, ...]
    unattributed_memory_bytes: tuple[tuple[str, int], ...] = field(default=())  # GPU UUID → bytes (known sizes)
    #: GPU UUID → unattributed processes there whose memory NVML did not report (missing from the bytes, not zero)
    unattributed_unknown_memory: tuple[tuple[str, int], ...] = field(default=())
