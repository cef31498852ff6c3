"""One cycle's reading (``auditor.collect``): the real host-proc adapter on a real tree, and the other sources as
fakes of their Protocols (``auditor.sources``). The e2e scenarios run the same code against the real adapters."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpu_fence.auditor.collect import SERVICEACCOUNT_NAMESPACE, CollectError, collect
from gpu_fence.auditor.dra import SliceIndex, SliceView
from gpu_fence.auditor.hostproc import HostProc
from gpu_fence.auditor.model import DraResolution, FailureReason, Gpu, Identity, IdentitySource, NvmlReason, SliceState
from gpu_fence.auditor.nvml import NvmlError, NvmlProblem, NvmlProcess, NvmlSnapshot
from gpu_fence.auditor.offered import OfferedReplicas
from gpu_fence.auditor.podresources.allocations import (
    ClaimDevice,
    ContainerAllocation,
    DeviceAllocation,
    DynamicResource,
)
from gpu_fence.auditor.podresources.calls import KubeletFailure
from gpu_fence.auditor.podresources.client import KubeletUnavailable
from gpu_fence.auditor.snapshot import SnapshotOptions
from gpu_fence.auditor.sources import (
    HostProcSource,
    NvmlSource,
    OfferedSource,
    PodResourcesSource,
    PodSource,
    SliceSource,
    Sources,
)
from tests.fakes.hostproc_tree import HostProcTree, cgroup_text, nested_pod_cgroup
from tests.fakes.kubeapi_pods_events import make_pod
from tests.fakes.kubeapi_resourceslices import DraGpu, nvidia_slice

G0 = "GPU-00000000-0000-4000-8000-000000000000"
POD = "11111111-2222-4333-8444-555555555555"
MAIN, SIDE = "a1" * 32, "b2" * 32
OPTIONS = SnapshotOptions(node="node-a")


@dataclass
class Answering:
    """A source whose one call answers ``answer``, or raises ``error``."""

    answer: Any = None
    error: Exception | None = None

    def _call(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.answer

    def close(self) -> None:
        pass


@dataclass
class Kubelet(Answering):
    offers: Sequence[DeviceAllocation] = ()
    offer_error: Exception | None = None
    asked: int = 0

    def list(self) -> Sequence[ContainerAllocation]:
        return self._call()

    def allocatable(self) -> Sequence[DeviceAllocation]:
        self.asked += 1
        if self.offer_error is not None:
            raise self.offer_error
        return self.offers


@dataclass
class Slices:
    view: SliceView

    def close(self) -> None:
        pass


class Driver(Answering):
    def snapshot(self) -> NvmlSnapshot:
        return self._call()


@dataclass
class Pods:
    state: IdentitySource = IdentitySource.KUBERNETES
    pods: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    last_error: str | None = None
    asked: list[tuple[set[str], set[str]]] = field(default_factory=list)

    def ensure(self, pod_uids: Iterable[str], container_ids: Iterable[str] = ()) -> None:
        self.asked.append((set(pod_uids), set(container_ids)))


class Reads(HostProc):
    """The real adapter, counting which reads a cycle makes."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.root_files: list[tuple[int, str]] = []
        self.environ_names: list[tuple[str, ...]] = []

    def read_root_file(self, pid: int, path: str) -> bytes | None:
        self.root_files.append((pid, path))
        return super().read_root_file(pid, path)

    def environ(self, pid: int, *names: str) -> dict[str, str] | None:
        self.environ_names.append(names)
        return super().environ(pid, *names)


@pytest.fixture
def tree(tmp_path: Path) -> HostProcTree:
    """A pod of two containers: ``main`` holds GPU 0 (pid 10 uses it), ``side`` none; pid 30 is a host process."""
    tree = HostProcTree(tmp_path / "proc")
    for name, container_id, pid, minors, environ in (
        ("main", MAIN, 10, [0], {"HOSTNAME": "train", "NVIDIA_VISIBLE_DEVICES": G0}),
        ("side", SIDE, 20, [], {"HOSTNAME": "train", "NVIDIA_VISIBLE_DEVICES": "void"}),
    ):
        rootfs = tree.rootfs(name, gpu_minors=minors, control_nodes=bool(minors))
        (rootfs / SERVICEACCOUNT_NAMESPACE).parent.mkdir(parents=True)
        (rootfs / SERVICEACCOUNT_NAMESPACE).write_text("ml\n")
        tree.add_container_process(pid, POD, container_id, rootfs=rootfs, environ=environ)
    tree.add_process(30, cgroup="0::/system.slice/cuda.service\n")
    return tree


ALLOCATIONS = (
    ContainerAllocation("ml", "train", "main", (DeviceAllocation("nvidia.com/gpu", (G0,)),), ()),
    ContainerAllocation("ml", "train", "side", (), ()),
)
PROCESSES = (NvmlProcess(10, G0, 1 << 30, "compute"), NvmlProcess(30, G0, 1 << 20, "compute"))


def sources(
    hostproc: HostProcSource,
    *,
    kubelet: PodResourcesSource | None = None,
    driver: NvmlSource | None = None,
    pods: PodSource | None = None,
    slices: SliceSource | None = None,
    offered: OfferedSource | None = None,
) -> Sources:
    driver = driver or Driver(NvmlSnapshot((Gpu(G0, 0, 0, "H100"),), PROCESSES, ()))
    return Sources(kubelet or Kubelet(ALLOCATIONS), driver, hostproc, pods, slices, offered)


def named(snapshot) -> dict[str | None, Any]:
    return {container.container: container for container in snapshot.containers}


def test_a_fresh_pod_list_names_containers_and_no_fallback_file_is_read(tree):
    hostproc = Reads(str(tree))
    pods = Pods(pods={POD: make_pod("ml", "train", POD, "node-a", [("main", MAIN), ("side", SIDE)])})
    snapshot = collect(sources(hostproc, pods=pods), OPTIONS, clock=lambda: 5.0)
    assert snapshot.time == 5.0 and snapshot.identity_source is IdentitySource.KUBERNETES
    assert snapshot.notes == () and snapshot.degraded == frozenset()
    main = named(snapshot)["main"]
    assert main.identity is Identity.KUBERNETES and main.allocated == (G0,) and main.visible == {G0}
    assert main.visible_devices_envs == (G0,) and main.env_read and main.pid == 10
    assert hostproc.root_files == [] and set(hostproc.environ_names) == {("NVIDIA_VISIBLE_DEVICES",)}
    assert pods.asked == [({POD}, {MAIN})]  # the GPU processes' pod and container, to relist early for new ones
    by_pid = {process.pid: process for process in snapshot.processes}
    assert by_pid[10].container_id == MAIN and by_pid[30].container_id is None and by_pid[30].identity_error is None


def test_without_the_api_containers_are_named_by_the_kubelet_and_their_gpu_use(tree):
    hostproc = Reads(str(tree))
    snapshot = collect(sources(hostproc), OPTIONS)
    assert snapshot.identity_source is IdentitySource.FALLBACK and snapshot.degraded == frozenset()
    assert snapshot.notes == (
        "Kubernetes API not used: names from PodResources, tied to running containers by their GPU use; "
        "other containers by uid",
    )
    assert {name: (c.identity, c.container_id) for name, c in named(snapshot).items()} == {
        "main": (Identity.FALLBACK, MAIN),  # pid 10 uses G0, which the kubelet gave ml/train/main alone
        "side": (Identity.KUBELET, None),  # touches no GPU: nothing tells which running container it is
    }
    # Only a container that touches a GPU is asked what it claims to be (the report shows it if it stays unnamed).
    assert hostproc.root_files == [(10, SERVICEACCOUNT_NAMESPACE)]
    assert sorted(set(hostproc.environ_names)) == [("HOSTNAME",), ("NVIDIA_VISIBLE_DEVICES",)]


def test_environments_are_read_once_per_process(tree):
    hostproc = Reads(str(tree))
    pods = Pods(pods={POD: make_pod("ml", "train", POD, "node-a", [("main", MAIN), ("side", SIDE)])})
    for _ in range(3):
        collect(sources(hostproc, pods=pods), OPTIONS)
    assert hostproc.environ_names == [("NVIDIA_VISIBLE_DEVICES",)] * 2  # pids 10 and 20, in the first cycle


def test_an_api_that_stops_answering_degrades_the_cycle_with_its_stale_list(tree):
    stale = Pods(
        state=IdentitySource.KUBERNETES_STALE,
        pods={POD: make_pod("ml", "train", POD, "node-a", [("main", MAIN), ("side", SIDE)])},
        last_error="HTTP 503 Service Unavailable",
    )
    snapshot = collect(sources(HostProc(str(tree)), pods=stale), OPTIONS)
    assert snapshot.identity_source is IdentitySource.KUBERNETES_STALE
    assert snapshot.degraded == {FailureReason.KUBERNETES_API}
    assert snapshot.notes == ("Kubernetes API unavailable (HTTP 503 Service Unavailable): stale pod list in use",)
    assert named(snapshot)["main"].identity is Identity.KUBERNETES

    never = Pods(state=IdentitySource.FALLBACK, pods={}, last_error="ConnectionRefusedError: refused")
    snapshot = collect(sources(HostProc(str(tree)), pods=never), OPTIONS)
    assert snapshot.identity_source is IdentitySource.FALLBACK
    assert snapshot.degraded == {FailureReason.KUBERNETES_API}
    assert snapshot.notes == (
        "Kubernetes API unavailable (ConnectionRefusedError: refused): names from PodResources, tied to running "
        "containers by their GPU use; other containers by uid",
    )
    assert named(snapshot)["main"].identity is Identity.FALLBACK


def test_an_nvml_problem_degrades_the_cycle_and_says_where(tree):
    problems = (
        NvmlProblem(G0, NvmlReason.GPU_LOST, "GPU 1 left out of this snapshot: lost"),
        NvmlProblem(None, NvmlReason.UNKNOWN, "could not count"),
    )
    driver = Driver(NvmlSnapshot((Gpu(G0, 0, 0, "H100"),), PROCESSES, problems))
    snapshot = collect(sources(HostProc(str(tree)), driver=driver, pods=Pods()), OPTIONS)
    assert snapshot.degraded == {FailureReason.NVML}
    assert snapshot.notes == (f"NVML: {G0}: GPU 1 left out of this snapshot: lost", "NVML: node: could not count")


def test_a_device_nvml_could_not_list_reaches_the_snapshot_with_its_reason(tree):
    """What the metrics leave absent (not 0) and count: the cycle must carry it from NVML's snapshot."""
    problems = (NvmlProblem(G0, NvmlReason.NO_PERMISSION, "could not list compute processes: no permission"),)
    driver = Driver(
        NvmlSnapshot((Gpu(G0, 0, 0, "H100"),), PROCESSES, problems, unlisted=((G0, NvmlReason.NO_PERMISSION),))
    )
    snapshot = collect(sources(HostProc(str(tree)), driver=driver, pods=Pods()), OPTIONS)
    assert snapshot.unlisted == ((G0, "no-permission"),)
    assert snapshot.degraded == {FailureReason.NVML}


def test_a_gpu_process_that_exited_says_why_it_has_no_container(tree):
    driver = Driver(NvmlSnapshot((Gpu(G0, 0, 0, "H100"),), (NvmlProcess(99, G0, 1 << 20, "compute"),), ()))
    (process,) = collect(sources(HostProc(str(tree)), driver=driver, pods=Pods()), OPTIONS).processes
    assert process.container_id is None
    assert process.identity_error == "the process exited before its cgroup could be read"


@pytest.mark.parametrize(
    ("broken", "source", "reason"),
    [
        (
            {
                "kubelet": Kubelet(
                    error=KubeletUnavailable(KubeletFailure.CONNECTION_REFUSED, "connection refused on kubelet.sock")
                )
            },
            FailureReason.KUBELET,
            "kubelet PodResources API unavailable: connection refused on kubelet.sock",
        ),
        (
            {"driver": Driver(error=NvmlError(NvmlReason.DRIVER_NOT_LOADED, "the NVIDIA kernel driver is not loaded"))},
            FailureReason.NVML,
            "the NVIDIA kernel driver is not loaded",
        ),
    ],
)
def test_a_source_that_cannot_answer_fails_the_cycle_naming_it(tree, broken, source, reason):
    with pytest.raises(CollectError) as raised:
        collect(sources(HostProc(str(tree)), **broken), OPTIONS)
    assert (raised.value.source, raised.value.reason) == (source, reason)


def test_a_proc_root_that_cannot_be_listed_fails_the_cycle_naming_it(tmp_path):
    missing = tmp_path / "not-mounted"
    with pytest.raises(CollectError) as raised:
        collect(sources(HostProc(str(missing))), OPTIONS)
    assert raised.value.source is FailureReason.PROC
    assert raised.value.reason.startswith(f"cannot read host /proc at {missing}: ")


def test_a_gpu_process_behind_a_pid_reused_since_the_last_cycle_is_placed_by_this_cycles_scan(tree):
    """The scan runs after NVML's snapshot: a pid the last cycle placed in ``main`` and now held by a process of
    another pod is billed to that pod, not to ``main``."""
    hostproc = HostProc(str(tree), recheck_scans=0)
    pods = Pods(pods={POD: make_pod("ml", "train", POD, "node-a", [("main", MAIN), ("side", SIDE)])})
    collect(sources(hostproc, pods=pods), OPTIONS)
    other = "99999999-2222-4333-8444-555555555555"
    tree.add_process(10, cgroup=cgroup_text(other, "c3" * 32), reusing=True)
    by_pid = {p.pid: p for p in collect(sources(hostproc, pods=pods), OPTIONS).processes}
    assert (by_pid[10].pod_uid, by_pid[10].container_id) == (other, "c3" * 32)


def test_claims_are_read_without_a_pod_list_and_shown_only_when_shaped_like_names(tree):
    """``side`` claims a namespace that is no name (a container can write anything there): no claim is shown; the
    report never carries what is not even a name."""
    (tree.root / "_rootfs" / "side" / SERVICEACCOUNT_NAMESPACE).write_text("<script>alert(1)</script>\n")
    driver = Driver(NvmlSnapshot((Gpu(G0, 0, 0, "H100"),), (NvmlProcess(20, G0, 1 << 20, "compute"),), ()))
    kubelet = Kubelet((ContainerAllocation("ml", "train", "side", (), ()),))
    snapshot = collect(sources(HostProc(str(tree)), driver=driver, kubelet=kubelet), OPTIONS)
    side = next(c for c in snapshot.containers if c.container_id == SIDE)
    assert side.identity is Identity.UID and (side.claimed_namespace, side.claimed_pod) == (None, "train")


def test_a_process_in_a_nested_cgroup_naming_another_pod_is_counted_and_noted(tree):
    victim = "77777777-2222-4333-8444-555555555555"
    tree.write_cgroup(10, cgroup_text(POD, MAIN, below=nested_pod_cgroup(victim, "d4" * 32)))
    pods = Pods(pods={POD: make_pod("ml", "train", POD, "node-a", [("main", MAIN), ("side", SIDE)])})
    snapshot = collect(sources(HostProc(str(tree)), pods=pods), OPTIONS)
    main = named(snapshot)["main"]
    assert main.nested_pod_uids == {victim}
    assert {p.pid: p.container_id for p in snapshot.processes}[10] == MAIN
    assert any(victim in note and "ml/train/main" in note for note in snapshot.notes)


def test_the_offer_is_asked_of_the_cycles_kubelet_only_when_due(tree):
    now = [0.0]
    kubelet = Kubelet(ALLOCATIONS, offers=(DeviceAllocation("nvidia.com/gpu.shared", (f"{G0}::0", f"{G0}::1")),))
    offered = OfferedReplicas(300, clock=lambda: now[0])
    for _ in range(3):  # at start, then not again within the interval
        snapshot = collect(sources(HostProc(str(tree)), kubelet=kubelet, pods=Pods(), offered=offered), OPTIONS)
        assert snapshot.offered_replicas == ((G0, 2),) and snapshot.notes == ()
        now[0] += 100
    assert kubelet.asked == 1
    kubelet.offer_error = KubeletUnavailable(
        KubeletFailure.TIMEOUT, "kubelet PodResources GetAllocatableResources: timeout"
    )
    snapshot = collect(sources(HostProc(str(tree)), kubelet=kubelet, pods=Pods(), offered=offered), OPTIONS)
    assert kubelet.asked == 2 and snapshot.offered_replicas is None  # unknown, not the last answer
    assert snapshot.notes == (
        "offered replicas unknown (gpu_fence_gpu_offered_replicas not exported): "
        "kubelet PodResources GetAllocatableResources: timeout",
    )
    assert snapshot.degraded == frozenset()  # the audit itself lost nothing


def test_claims_resolve_with_the_slices_the_watch_holds_and_the_cycle_makes_no_request(tree):
    claim = DynamicResource("gpu", "ml", (ClaimDevice("gpu.nvidia.com", "node-a", "gpu-4", ()),))
    kubelet = Kubelet((ContainerAllocation("ml", "train", "main", (), (claim,)), ALLOCATIONS[1]))
    index = SliceIndex.build([nvidia_slice("node-a", [DraGpu(0, 4, G0)])], ["gpu.nvidia.com"])
    slices = Slices(SliceView(SliceState.FRESH, index))
    snapshot = collect(sources(HostProc(str(tree)), kubelet=kubelet, pods=Pods(), slices=slices), OPTIONS)
    main = named(snapshot)["main"]
    assert main.allocated == (G0,) and main.dra_devices[0].resolution is DraResolution.RESOLVED
    assert snapshot.dra_slices is SliceState.FRESH and snapshot.degraded == frozenset()
