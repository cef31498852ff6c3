"""The pure join of ``auditor.snapshot.assemble``: PodResources + NVML + /proc findings + the pod list."""

from __future__ import annotations

from gpu_fence.auditor import snapshot as snapshot_module
from gpu_fence.auditor.dra import SliceIndex, SliceView
from gpu_fence.auditor.model import DraResolution, FailureReason, Gpu, GpuProcess, Identity, IdentitySource, SliceState
from gpu_fence.auditor.podresources.allocations import (
    ClaimDevice,
    ContainerAllocation,
    DeviceAllocation,
    DynamicResource,
)
from gpu_fence.auditor.snapshot import DeviceIndex, RuntimeContainer, SnapshotOptions, assemble
from tests.fakes.kubeapi_pods_events import make_pod
from tests.fakes.kubeapi_resourceslices import DraGpu, DraMig, nvidia_slice

G0 = "GPU-00000000-0000-4000-8000-000000000000"
G1 = "GPU-00000001-0000-4000-8000-000000000001"
M0 = "MIG-00000001-0000-4000-8000-000000000010"
CARD1 = Gpu(G1, 1, 1, "H100", 80 << 30, mig_enabled=True)
GPUS = (
    Gpu(G0, 0, 0, "H100", 80 << 30),
    CARD1,
    CARD1.mig_device(
        M0,
        mig_index=0,
        gpu_instance_id=2,
        compute_instance_id=0,
        memory_total_bytes=40 << 30,
        profile="3g.40gb",
        share=3 / 7,
    ),
)
INDEX = DeviceIndex.build(GPUS)
OPTIONS = SnapshotOptions(node="node-a", pod_label_keys=("team",))


def alloc(ns, pod, name, *ids, resource="nvidia.com/gpu", dra=()):
    devices = (DeviceAllocation(resource, tuple(ids)),) if ids else ()
    return ContainerAllocation(ns, pod, name, devices, tuple(dra))


def running(cid, uid, pid, *, minors=(), envs=(), claims=(None, None), limits=(), nested=()):
    return RuntimeContainer(
        cid,
        uid,
        pid,
        frozenset(minors),
        tuple(envs),
        True,
        view_limits=frozenset(limits),
        nested_pod_uids=frozenset(nested),
        claimed_namespace=claims[0],
        claimed_pod=claims[1],
    )


def uses(uid, cid, *uuids, pid=100):
    return [GpuProcess(pid + n, uuid, 1 << 20, pod_uid=uid, container_id=cid) for n, uuid in enumerate(uuids)]


def build(allocations, runtime, pods, processes=(), identity=IdentitySource.KUBERNETES, **extra):
    return assemble(
        OPTIONS,
        now=0.0,
        gpus=GPUS,
        devices=INDEX,
        allocations=allocations,
        runtime={r.container_id: r for r in runtime},
        processes=list(processes),
        pods=None if pods is None else {p["metadata"]["uid"]: p for p in pods},
        identity_source=identity,
        **extra,
    )


def by_name(snapshot):
    return {(c.pod, c.container): c for c in snapshot.containers}


def test_device_ids_resolve_through_the_index_of_the_gpus():
    assert INDEX.normalize("nvidia1/gi2") == M0  # GKE MIG: the card's index and the slice's GPU instance
    assert INDEX.normalize("1:0") == M0  # the toolkit's <gpu>:<mig> form: the slice's position on its card
    assert INDEX.normalize(f"MIG-{G1}/2/0") == M0  # pre-R470: the card's UUID and the GPU instance
    assert INDEX.normalize("0") == G0 and INDEX.normalize("nvidia0/vgpu3") == G0


def test_the_snapshot_carries_the_identity_source_the_notes_and_the_degraded_sources():
    snapshot = build(
        [],
        [],
        None,
        identity=IdentitySource.FALLBACK,
        notes=["NVML: GPU-x: lost"],
        degraded=[FailureReason.NVML, FailureReason.NVML],
    )
    assert snapshot.identity_source is IdentitySource.FALLBACK
    assert snapshot.notes == ("NVML: GPU-x: lost",) and snapshot.degraded == {FailureReason.NVML}
    assert snapshot.gpus == GPUS


def test_api_names_containers_and_normalises_allocations():
    pods = [make_pod("ml", "train", "uid-1", "node-a", [("main", "c1"), ("side", "c2")], labels={"team": "a"})]
    snapshot = build(
        [
            alloc("ml", "train", "main", f"{G0}::3", "nvidia1/gi2", resource="nvidia.com/gpu.shared"),
            alloc("ml", "train", "side"),
        ],
        [running("c1", "uid-1", 10, minors=[0]), running("c2", "uid-1", 11), running("pause", "uid-1", 9)],
        pods,
    )
    containers = by_name(snapshot)
    main = containers[("train", "main")]
    assert main.allocated == (G0, M0) and main.identity is Identity.KUBERNETES
    assert main.visible == {G0} and main.labels == (("team", "a"),) and main.pid == 10
    assert containers[("train", "side")].container_id == "c2"
    assert len(snapshot.containers) == 2  # the sandbox (pause) container of a known pod is not a row


def dra_claim(*devices: str, name="claim", driver="gpu.nvidia.com"):
    return DynamicResource(
        name, "ml", tuple(ClaimDevice(driver, "node-a", d, (f"k8s.gpu.nvidia.com/claim=u-{d}",)) for d in devices)
    )


# minors are not indices: gpu-0 is the card of minor 0 (index 0 here); the slice gives each UUID
SLICES = SliceView(
    SliceState.FRESH,
    SliceIndex.build(
        [
            nvidia_slice(
                "node-a",
                [DraGpu(0, 0, G0), DraGpu(1, 1, G1)],
                [DraMig(DraGpu(1, 1, G1), M0, "3g.40gb", 0, 4)],
            )
        ],
        ["gpu.nvidia.com"],
    ),
)


def test_dra_devices_resolve_through_the_slices_by_their_uuid_attribute():
    allocations = [alloc("ml", "p", "c", dra=[dra_claim("gpu-0", "gpu-1-mig-3g40gb-9-0")])]
    (container,) = build(allocations, [], [], slices=SLICES).containers
    assert container.allocated == (G0, M0) and container.unresolved_allocations == ()
    assert [(d.device, d.uuid, d.resolution) for d in container.dra_devices] == [
        ("gpu-0", G0, DraResolution.RESOLVED),
        ("gpu-1-mig-3g40gb-9-0", M0, DraResolution.RESOLVED),
    ]


def test_unresolvable_ids_and_dra_devices_are_kept_as_unresolved():
    claim = DynamicResource(
        "claim",
        "ml",
        (
            ClaimDevice("gpu.nvidia.com", "node-a", "gpu-0", ()),
            ClaimDevice("gpu.nvidia.com", "node-a", "gpu-7", ()),
            ClaimDevice("nic.example.com", "node-a", "eth1", ()),
        ),
    )
    snapshot = build([alloc("ml", "p", "c", "weird-id", dra=[claim])], [], [], slices=SLICES)
    container = snapshot.containers[0]
    assert container.allocated == (G0,) and container.identity is Identity.KUBELET
    assert container.unresolved_allocations == ("nvidia.com/gpu:weird-id",)
    assert [(d.device, d.resolution) for d in container.dra_devices] == [
        ("gpu-0", DraResolution.RESOLVED),
        ("gpu-7", DraResolution.NO_SLICE),  # never guessed from its name; the NIC is not ours at all
    ]
    assert snapshot.notes == () and snapshot.dra_slices is SliceState.FRESH


def test_without_slices_a_claim_is_shown_unresolved_and_the_cycle_says_so():
    down = SliceView(SliceState.NONE, last_error="HTTP 503 Service Unavailable")
    snapshot = build([alloc("ml", "p", "c", dra=[dra_claim("gpu-0")])], [], [], slices=down)
    (device,) = snapshot.containers[0].dra_devices
    assert (device.resolution, device.uuid, device.cdi_devices) == (
        DraResolution.SLICES_UNAVAILABLE,
        None,
        ("k8s.gpu.nvidia.com/claim=u-gpu-0",),
    )
    assert snapshot.containers[0].allocated == ()
    assert snapshot.degraded == {FailureReason.KUBERNETES_API} and "HTTP 503" in snapshot.notes[0]
    assert snapshot.dra_slices is SliceState.NONE


def test_stale_slices_still_resolve_and_degrade_the_cycle():
    stale = SliceView(SliceState.STALE, SLICES.index, "HTTP 503")
    snapshot = build([alloc("ml", "p", "c", dra=[dra_claim("gpu-1-mig-3g40gb-9-0")])], [], [], slices=stale)
    assert snapshot.containers[0].allocated == (M0,)
    assert snapshot.degraded == {FailureReason.KUBERNETES_API} and "last good list" in snapshot.notes[0]


def test_a_slice_uuid_nvml_does_not_list_is_allocated_and_noted():
    elsewhere = SliceView(
        SliceState.FRESH, SliceIndex.build([nvidia_slice("node-a", [DraGpu(5, 5, "GPU-gone")])], ["gpu.nvidia.com"])
    )
    snapshot = build([alloc("ml", "p", "c", dra=[dra_claim("gpu-5")])], [], [], slices=elsewhere)
    assert snapshot.containers[0].allocated == ("GPU-gone",)
    assert snapshot.notes == ("DRA: ResourceSlices name UUIDs NVML does not list on this node: GPU-gone",)
    assert snapshot.degraded == frozenset()


def test_offered_replicas_count_distinct_ids_per_uuid():
    offered = [
        DeviceAllocation("nvidia.com/gpu.shared", (f"{G0}::0",)),
        DeviceAllocation("nvidia.com/gpu.shared", (f"{G0}::0",)),  # the same id on a second NUMA node
        DeviceAllocation("nvidia.com/gpu.shared", (f"{G0}::1", f"{G0}::2")),
        DeviceAllocation("nvidia.com/mig-3g.40gb", (M0,)),
        DeviceAllocation("example.com/nic", ("nic0",)),
        DeviceAllocation("nvidia.com/gpu", ("not-a-gpu",)),
    ]
    assert build([], [], [], offered=offered).offered_replicas == ((G0, 3), (M0, 1))
    assert build([], [], []).offered_replicas is None


def test_fallback_ties_a_container_to_the_one_kubelet_container_that_holds_what_it_uses():
    allocations = [alloc("ml", "train", "main", G0), alloc("ml", "train", "logger"), alloc("ml", "small", "m", M0)]
    runtime = [
        running("c1", "uid-1", 10, minors=[0], claims=("ml", "train")),
        running("c2", "uid-1", 11),
        running("c3", "uid-2", 12, minors=[1]),
    ]
    processes = uses("uid-1", "c1", G0) + uses("uid-2", "c3", M0, G1, pid=200)  # a slice's process shows on its card
    containers = by_name(build(allocations, runtime, None, processes, identity=IdentitySource.FALLBACK))
    main = containers[("train", "main")]
    assert (main.identity, main.container_id, main.pod_uid) == (Identity.FALLBACK, "c1", "uid-1")
    assert main.claimed_namespace is None  # tied by what the kernel let it use: its claims are not needed
    assert (containers[("small", "m")].identity, containers[("small", "m")].container_id) == (Identity.FALLBACK, "c3")
    logger = containers[("train", "logger")]  # no GPU use tells which container it is: the kubelet's row stays
    assert (logger.identity, logger.container_id) == (Identity.KUBELET, None)


def test_fallback_never_names_or_exempts_a_container_on_its_own_claims():
    """A container that writes kube-system into its namespace file and the name of a real pod into HOSTNAME stays
    known by uid: its claims are shown as claims, and the kubelet's pod of that name keeps its own row."""
    allocations = [alloc("kube-system", "coredns-1", "coredns"), alloc("ml", "train", "main", G0)]
    runtime = [running("evil", "uid-9", 10, minors=[1], claims=("kube-system", "coredns-1"))]
    snapshot = build(allocations, runtime, None, uses("uid-9", "evil", G1), identity=IdentitySource.FALLBACK)
    evil = next(c for c in snapshot.containers if c.container_id == "evil")
    assert (evil.identity, evil.namespace, evil.pod, evil.container) == (Identity.UID, None, None, None)
    assert (evil.claimed_namespace, evil.claimed_pod) == ("kube-system", "coredns-1")
    assert evil.unconfirmed_allocations == {G0}  # it could be ml/train/main, which nothing was tied to: not G1
    coredns = by_name(snapshot)[("coredns-1", "coredns")]
    assert (coredns.identity, coredns.container_id) == (Identity.KUBELET, None)


def test_fallback_does_not_guess_between_holders_of_a_shared_gpu():
    allocations = [
        alloc("ml", "a", "main", f"{G0}::0", resource="nvidia.com/gpu.shared"),
        alloc("ml", "b", "main", f"{G0}::1", resource="nvidia.com/gpu.shared"),
        alloc("ml", "c", "main", G1),
    ]
    runtime = [running("ca", "uid-a", 10, minors=[0]), running("cb", "uid-b", 11, minors=[0])]
    processes = uses("uid-a", "ca", G0) + uses("uid-b", "cb", G0, pid=200)
    snapshot = build(allocations, runtime, None, processes, identity=IdentitySource.FALLBACK)
    by_id = {c.container_id: c for c in snapshot.containers if c.container_id}
    assert {c.identity for c in by_id.values()} == {Identity.UID}
    assert by_id["ca"].unconfirmed_allocations == {G0, G1}  # any untied holder's GPUs: which one it is is not known


def test_fallback_ties_nobody_when_two_running_containers_could_be_the_holder():
    """Two containers use what one kubelet container holds (one of them without an allocation of its own): neither
    takes its names."""
    allocations = [alloc("ml", "train", "main", G0)]
    runtime = [running("c1", "uid-1", 10, minors=[0]), running("c2", "uid-2", 11, minors=[0])]
    processes = uses("uid-1", "c1", G0) + uses("uid-2", "c2", G0, pid=200)
    snapshot = build(allocations, runtime, None, processes, identity=IdentitySource.FALLBACK)
    assert sorted((c.identity, c.container_id) for c in snapshot.containers if c.container_id) == [
        (Identity.UID, "c1"),
        (Identity.UID, "c2"),
    ]


def test_fallback_never_ties_a_fraction_pod_to_the_kai_reservation_that_holds_its_gpu():
    allocations = [alloc("kai-resource-reservation", "res", "resource-reservation", G1), alloc("team", "f", "main")]
    runtime = [running("f1", "uid-f", 10, minors=[1])]
    snapshot = build(allocations, runtime, None, uses("uid-f", "f1", G1), identity=IdentitySource.FALLBACK)
    fraction = next(c for c in snapshot.containers if c.container_id == "f1")
    assert fraction.identity is Identity.UID and fraction.unconfirmed_allocations == {G1}


def test_a_stale_list_names_the_pod_of_a_restarted_container_and_keeps_its_allocation_unconfirmed():
    """The API is down; the container restarted since the last list (a new id): the pod is known by uid, the container
    not, and what that pod's untied kubelet containers hold is unconfirmed for it, nothing else."""
    pods = [make_pod("ml", "train", "uid-1", "node-a", [("main", "old-id"), ("side", "c2")])]
    allocations = [alloc("ml", "train", "main", G0), alloc("ml", "train", "side"), alloc("ml", "other", "main", G1)]
    runtime = [running("new-id", "uid-1", 10, minors=[0]), running("c2", "uid-1", 11)]
    snapshot = build(allocations, runtime, pods, uses("uid-1", "new-id", G0), identity=IdentitySource.KUBERNETES_STALE)
    restarted = next(c for c in snapshot.containers if c.container_id == "new-id")
    assert (restarted.identity, restarted.namespace, restarted.pod) == (Identity.UID, "ml", "train")
    assert restarted.unconfirmed_allocations == {G0}
    fresh = build(allocations, runtime, pods, uses("uid-1", "new-id", G0), identity=IdentitySource.KUBERNETES)
    assert next(c for c in fresh.containers if c.container_id == "new-id").unconfirmed_allocations == frozenset()


def test_fallback_matching_stays_linear_in_the_containers(monkeypatch):
    """Without the API a dense node has hundreds of unnamed containers, many sharing one GPU; matching each against
    every PodResources container is quadratic (tens of ms at 440 containers). Work is counted, not timed: reads of a
    draft's ``in_kubelet`` stay linear in the containers. A private contract is the point here (the fallback's
    cost), so the test counts on the join's private draft rather than on its answer, which a quadratic join gives
    too."""
    reads = [0]

    class CountingDraft(snapshot_module._Draft):
        def __getattribute__(self, name):
            if name == "in_kubelet":
                reads[0] += 1
            return super().__getattribute__(name)

    monkeypatch.setattr(snapshot_module, "_Draft", CountingDraft)
    pods = 100
    allocations = [
        alloc("ml", f"p{i}", name, *([f"{G0}::{i}"] if name == "main" else []), resource="nvidia.com/gpu.shared")
        for i in range(pods)
        for name in ("main", "side")
    ]
    runtime = [
        running(f"c{i}-{name}", f"uid-{i}", 10 * i + k, minors=[0] if name == "main" else [])
        for i in range(pods)
        for k, name in enumerate(("main", "side"))
    ]
    processes = [process for i in range(pods) for process in uses(f"uid-{i}", f"c{i}-main", G0, pid=1000 + i)]
    containers = build(allocations, runtime, None, processes, identity=IdentitySource.FALLBACK).containers
    assert sum(c.identity is Identity.FALLBACK for c in containers) == 0  # a hundred holders each: no guess
    assert reads[0] <= 10 * len(allocations)


def test_nested_pod_cgroups_are_counted_as_the_outer_container_and_said_in_a_note():
    pods = [make_pod("ml", "train", "uid-1", "node-a", [("main", "c1")])]
    snapshot = build([alloc("ml", "train", "main", G0)], [running("c1", "uid-1", 10, nested=["uid-victim"])], pods)
    main = by_name(snapshot)[("train", "main")]
    assert main.nested_pod_uids == {"uid-victim"}
    assert snapshot.notes == (
        "1 container with processes in cgroups made below their own that name another pod (counted as the outer "
        "container's): ml/train/main names pod uid-victim",
    )


def test_unnamed_containers_are_rows_only_when_they_touch_a_gpu():
    runtime = [running("c1", "uid-9", 10, minors=[0]), running("c2", "uid-9", 11), running("c3", "uid-9", 12)]
    processes = [GpuProcess(12, G0, 1 << 20, pod_uid="uid-9", container_id="c3")]
    snapshot = build([], runtime, None, processes, identity=IdentitySource.FALLBACK)
    assert sorted(c.container_id for c in snapshot.containers) == ["c1", "c3"]
    assert {c.identity for c in snapshot.containers} == {Identity.UID}
    assert snapshot.processes[0].container_id == "c3"


def test_kai_groups_go_to_the_reservation_and_the_fraction_container_only():
    reservation = make_pod(
        "kai-resource-reservation",
        "res",
        "uid-r",
        "node-a",
        [("resource-reservation", "r1")],
        labels={"runai-gpu-group": "g"},
    )
    fraction = make_pod(
        "team",
        "frac",
        "uid-f",
        "node-a",
        [("init", "f0"), ("main", "f1")],
        labels={"runai-gpu-group": "g"},
        annotations={"gpu-fraction": "0.5", "gpu-fraction-container-name": "main"},
        scheduler_name="kai-scheduler",
    )
    snapshot = build(
        [
            alloc("kai-resource-reservation", "res", "resource-reservation", G0),
            alloc("team", "frac", "init"),
            alloc("team", "frac", "main"),
        ],
        [running("r1", "uid-r", 1), running("f0", "uid-f", 2), running("f1", "uid-f", 3)],
        [reservation, fraction],
    )
    groups = {(c.pod, c.container): c.kai_gpu_groups for c in snapshot.containers}
    assert groups == {("res", "resource-reservation"): {"g"}, ("frac", "init"): frozenset(), ("frac", "main"): {"g"}}


def test_the_pod_list_tells_init_and_ephemeral_containers_from_regular_ones():
    pod = make_pod("ml", "train", "uid-1", "node-a", [("main", "c1")])
    pod["status"]["initContainerStatuses"] = [{"name": "proxy", "containerID": "containerd://c2"}]
    pod["status"]["ephemeralContainerStatuses"] = [{"name": "debugger", "containerID": "containerd://c3"}]
    snapshot = build(
        [alloc("ml", "train", "main"), alloc("ml", "train", "proxy")],
        [running("c1", "uid-1", 10), running("c2", "uid-1", 11), running("c3", "uid-1", 12)],
        [pod],
    )
    containers = by_name(snapshot)
    assert containers[("train", "main")].spec_field == "containers"
    assert containers[("train", "proxy")].spec_field == "initContainers"
    assert containers[("train", "debugger")].spec_field == "ephemeralContainers"
    fallback = build(
        [alloc("ml", "train", "main", G0)],
        [running("c1", "uid-1", 10, minors=[0])],
        None,
        uses("uid-1", "c1", G0),
        identity=IdentitySource.FALLBACK,
    )
    assert by_name(fallback)[("train", "main")].spec_field is None  # PodResources does not say which list
