"""The offered replicas (``auditor.offered``): when the kubelet is asked, through the real PodResources client and
gRPC server, and how its answer becomes UUID → ids offered."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from gpu_fence.auditor.model import Gpu
from gpu_fence.auditor.offered import OfferedReplicas, count_offered
from gpu_fence.auditor.podresources.allocations import DeviceAllocation
from gpu_fence.auditor.podresources.client import PodResourcesClient
from gpu_fence.auditor.snapshot import DeviceIndex
from tests.fakes.podresources_server import GET_DISABLED, FakeKubelet, offered

G0 = "GPU-8f2c1d3e-0000-4a5b-9c8d-111111111111"
G1 = "GPU-8f2c1d3e-0000-4a5b-9c8d-222222222222"
MIG = "MIG-2ce7a541-aaaa-5bbb-8ccc-333333333333"
CARD1 = Gpu(G1, 1, 1, "H100", mig_enabled=True)
INDEX = DeviceIndex.build(
    [
        Gpu(G0, 0, 0, "H100"),
        CARD1,
        CARD1.mig_device(
            MIG, mig_index=0, gpu_instance_id=3, compute_instance_id=0, memory_total_bytes=0, profile="", share=1
        ),
    ]
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def kubelet(tmp_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(tmp_path / "pod-resources" / "kubelet.sock") as fake:
        fake.allocatable = offered("nvidia.com/gpu.shared", [f"{G0}::{n}" for n in range(3)])
        yield fake


@pytest.fixture
def client(kubelet: FakeKubelet) -> Iterator[PodResourcesClient]:
    with PodResourcesClient(str(kubelet.socket_path), timeout=2.0) as instance:
        yield instance


def test_asked_at_start_then_once_per_interval(kubelet, client):
    clock = Clock()
    replicas = OfferedReplicas(300, clock=clock)
    for _ in range(5):
        answer = replicas.read(client)
        clock.now += 59
    assert answer is not None and count_offered(answer, INDEX.normalize) == ((G0, 3),)
    assert kubelet.calls["GetAllocatableResources"] == 1
    kubelet.allocatable = offered("nvidia.com/gpu.shared", [f"{G0}::{n}" for n in range(4)])
    clock.now = 300
    assert count_offered(replicas.read(client) or (), INDEX.normalize) == ((G0, 4),)
    assert kubelet.calls["GetAllocatableResources"] == 2


def test_a_failed_call_is_unknown_and_asked_again_sooner_than_a_missing_one(kubelet, client):
    clock = Clock()
    replicas = OfferedReplicas(300, retry_after=60, clock=clock)
    assert replicas.read(client) is not None
    clock.now = 300
    kubelet.fail_with = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
    assert replicas.read(client) is None and "rate-limited" in (replicas.last_error or "")
    kubelet.fail_with = None
    clock.now = 330
    assert replicas.read(client) is None  # within the retry delay: not asked
    clock.now = 360
    assert replicas.read(client) is not None and replicas.last_error is None
    assert kubelet.calls["GetAllocatableResources"] == 3

    kubelet.allocatable_mode = GET_DISABLED  # a 1.21-1.22 kubelet with the gate off
    clock.now = 660
    assert replicas.read(client) is None and "KubeletPodResourcesGetAllocatable" in (replicas.last_error or "")
    clock.now = 900
    replicas.read(client)
    assert kubelet.calls["GetAllocatableResources"] == 4  # not served: asked again only after the whole interval
    assert client.failures == {
        ("GetAllocatableResources", "rate-limited"): 1,
        ("GetAllocatableResources", "unimplemented"): 1,
    }


def test_every_id_form_counts_under_the_uuid_it_names():
    answer = [
        DeviceAllocation("nvidia.com/gpu", ("nvidia0/vgpu0", "nvidia0/vgpu1")),  # GKE time-sharing
        DeviceAllocation("nvidia.com/mig-1g.10gb", (f"{MIG}::0", f"{MIG}::1")),  # a replicated MIG device
        DeviceAllocation("nvidia.com/mig-1g.10gb", ("nvidia1/gi3/vgpu2",)),  # the same slice, GKE's form
        DeviceAllocation("example.com/fpga", (G1,)),  # not a GPU resource: not counted
    ]
    assert count_offered(answer, INDEX.normalize) == ((G0, 2), (MIG, 3))
    assert count_offered([], INDEX.normalize) == ()
