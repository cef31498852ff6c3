"""The PodResources client against a real gRPC server on a unix socket (the fake kubelet)."""

from __future__ import annotations

import collections
import json
import os
import socket
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from gpu_fence.auditor.podresources.calls import KubeletFailure
from gpu_fence.auditor.podresources.client import (
    ClaimDevice,
    ContainerAllocation,
    DeviceAllocation,
    DynamicResource,
    KubeletUnavailable,
    PodResourcesClient,
)
from gpu_fence.auditor.podresources.v1 import api_pb2
from tests.fakes.podresources_server import (
    GET_ABSENT,
    GET_DISABLED,
    FakeKubelet,
    claim,
    claim_device,
    container,
    offered,
    pod,
)
from tests.fakes.processes import run_captured

GPU0 = "GPU-8f2c1d3e-0000-4a5b-9c8d-111111111111"
GPU1 = "GPU-8f2c1d3e-0000-4a5b-9c8d-222222222222"
MIG = "MIG-2ce7a541-aaaa-5bbb-8ccc-333333333333"

NODE = [
    pod(
        "trainer",
        "ml",
        container("main", {"nvidia.com/gpu": [GPU0, GPU1]}),
        container("sidecar"),  # no devices: still listed, the baseline for spotting overreach
    ),
    pod(
        "shared",
        "ml",
        container("a", {"nvidia.com/gpu.shared": [f"{GPU0}::3"]}),
        container("b", {"nvidia.com/mig-1g.5gb": [f"{MIG}::1"], "example.com/nic": ["nic0"]}),
    ),
    pod("gke", "team-x", container("c", {"nvidia.com/gpu": ["nvidia0/vgpu1", "nvidia1/gi0/vgpu0"]})),
    pod(
        "dra",
        "team-y",
        container(
            "c",
            dynamic=[
                claim(
                    "gpu-claim",
                    "team-y",
                    claim_device("gpu.nvidia.com", "node-1", "gpu-0", ["nvidia.com/gpu=gpu-0"], share_id="s-1"),
                    claim_device(cdi=["nvidia.com/gpu=legacy"]),  # a 1.27-1.30 kubelet sends CDI names only
                )
            ],
        ),
    ),
]


@pytest.fixture
def socket_path(tmp_path: Path) -> Path:
    return tmp_path / "pod-resources" / "kubelet.sock"


@pytest.fixture
def kubelet(socket_path: Path) -> Iterator[FakeKubelet]:
    with FakeKubelet(socket_path, pods=NODE) as fake:
        yield fake


@pytest.fixture
def client(socket_path: Path) -> Iterator[PodResourcesClient]:
    with PodResourcesClient(str(socket_path), timeout=2.0) as instance:
        yield instance


def test_list_returns_every_container_with_raw_ids(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    allocations = client.list()
    assert allocations[:2] == [
        ContainerAllocation("ml", "trainer", "main", (DeviceAllocation("nvidia.com/gpu", (GPU0, GPU1)),), ()),
        ContainerAllocation("ml", "trainer", "sidecar", (), ()),
    ]
    by_key = {(a.namespace, a.pod, a.container): a for a in allocations}
    assert len(by_key) == 6
    assert by_key["ml", "shared", "a"].devices == (DeviceAllocation("nvidia.com/gpu.shared", (f"{GPU0}::3",)),)
    assert by_key["ml", "shared", "b"].devices == (
        DeviceAllocation("nvidia.com/mig-1g.5gb", (f"{MIG}::1",)),
        DeviceAllocation("example.com/nic", ("nic0",)),
    )
    assert by_key["team-x", "gke", "c"].devices[0].device_ids == ("nvidia0/vgpu1", "nvidia1/gi0/vgpu0")


def test_list_keeps_dynamic_resources(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    (allocation,) = [a for a in client.list() if a.pod == "dra"]
    assert allocation.devices == ()
    assert allocation.dynamic_resources == (
        DynamicResource(
            claim_name="gpu-claim",
            claim_namespace="team-y",
            claim_devices=(
                ClaimDevice("gpu.nvidia.com", "node-1", "gpu-0", ("nvidia.com/gpu=gpu-0",), share_id="s-1"),
                ClaimDevice("", "", "", ("nvidia.com/gpu=legacy",), share_id=None),
            ),
        ),
    )


def test_each_list_is_exactly_one_rpc(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    for _ in range(3):
        client.list()
    assert kubelet.calls == {"List": 3}
    assert client.calls == {"List": 3}


def test_empty_node(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    kubelet.pods = []
    assert client.list() == []


def test_allocatable(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    kubelet.allocatable = [
        api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU0, GPU1]),
        api_pb2.ContainerDevices(resource_name="nvidia.com/mig-1g.5gb", device_ids=[MIG]),
    ]
    assert client.allocatable() == [
        DeviceAllocation("nvidia.com/gpu", (GPU0, GPU1)),
        DeviceAllocation("nvidia.com/mig-1g.5gb", (MIG,)),
    ]
    assert kubelet.calls == {"GetAllocatableResources": 1}


def test_allocatable_in_the_kubelets_shape_keeps_every_entry(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    kubelet.allocatable = offered("nvidia.com/gpu.shared", [f"{GPU0}::0", f"{GPU0}::1"], numa_nodes=(0, 1))
    assert client.allocatable() == [DeviceAllocation("nvidia.com/gpu.shared", (f"{GPU0}::{n}",)) for n in (0, 0, 1, 1)]


@pytest.mark.parametrize("mode", [GET_DISABLED, GET_ABSENT])
def test_allocatable_where_the_kubelet_lacks_it(kubelet: FakeKubelet, client: PodResourcesClient, mode: str) -> None:
    kubelet.allocatable_mode = mode
    with pytest.raises(KubeletUnavailable) as raised:
        client.allocatable()
    assert raised.value.reason == KubeletFailure.UNIMPLEMENTED
    assert "KubeletPodResourcesGetAllocatable" in str(raised.value)
    assert client.failures == {("GetAllocatableResources", KubeletFailure.UNIMPLEMENTED): 1}
    assert client.list()  # List still works on the same channel
    assert client.calls == {"GetAllocatableResources": 1, "List": 1}


def test_allocatable_fails_as_list_does_and_each_failure_is_counted(socket_path: Path) -> None:
    calls, failures = collections.Counter(), collections.Counter()
    with PodResourcesClient(str(socket_path), timeout=1.0, calls=calls, failures=failures) as client:
        for method in (client.allocatable, client.list):
            with pytest.raises(KubeletUnavailable) as raised:
                method()
            assert raised.value.reason == KubeletFailure.SOCKET_MISSING
    assert failures == {
        ("GetAllocatableResources", KubeletFailure.SOCKET_MISSING): 1,
        ("List", KubeletFailure.SOCKET_MISSING): 1,
    }
    assert calls == {"GetAllocatableResources": 1, "List": 1}


def test_get_one_pod(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    assert client.get("ml", "shared") == [a for a in client.list() if a.pod == "shared"]
    assert kubelet.calls["Get"] == 1


def test_get_unknown_pod_is_empty(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    assert client.get("ml", "nope") == []
    assert client.get("other", "trainer") == []


@pytest.mark.parametrize("mode", [GET_DISABLED, GET_ABSENT])
def test_get_where_the_kubelet_lacks_it(kubelet: FakeKubelet, client: PodResourcesClient, mode: str) -> None:
    kubelet.get_mode = mode
    with pytest.raises(KubeletUnavailable) as raised:
        client.get("ml", "trainer")
    assert raised.value.reason == KubeletFailure.UNIMPLEMENTED
    assert "KubeletPodResourcesGet" in str(raised.value)
    assert client.list()  # List still works on the same channel


def test_kubelet_restart_between_two_lists(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    assert len(client.list()) == 6
    kubelet.restart()
    kubelet.pods = NODE[:1]
    assert len(client.list()) == 2
    assert kubelet.calls["List"] == 2


def test_kubelet_down_then_back(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    client.list()
    kubelet.stop()
    with pytest.raises(KubeletUnavailable) as raised:
        client.list()
    assert raised.value.reason == KubeletFailure.SOCKET_MISSING
    kubelet.start()
    # works at once: the failed channel was dropped, so no reconnect backoff stands in the way
    assert len(client.list()) == 6
    assert client.calls == {"List": 3}
    assert kubelet.calls == {"List": 2}


def test_socket_missing_names_the_path_and_the_mount(socket_path: Path, client: PodResourcesClient) -> None:
    with pytest.raises(KubeletUnavailable) as raised:
        client.list()
    assert raised.value.reason == KubeletFailure.SOCKET_MISSING
    message = str(raised.value)
    assert str(socket_path) in message
    assert f"mount the host directory {socket_path.parent}" in message
    assert client.calls == {"List": 1}  # never retried: the next cycle is the retry


def test_stale_socket_file_is_connection_refused(socket_path: Path, client: PodResourcesClient) -> None:
    socket_path.parent.mkdir(parents=True)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(socket_path))
    stale.close()  # the file stays; nothing listens, as after a kubelet crash
    with pytest.raises(KubeletUnavailable) as raised:
        client.list()
    assert raised.value.reason == KubeletFailure.CONNECTION_REFUSED
    assert "kubelet is down" in str(raised.value)


def test_a_file_that_is_not_a_socket(socket_path: Path, client: PodResourcesClient) -> None:
    socket_path.parent.mkdir(parents=True)
    socket_path.write_text("")
    with pytest.raises(KubeletUnavailable) as raised:
        client.list()
    assert raised.value.reason == KubeletFailure.UNAVAILABLE
    assert "is not a socket" in str(raised.value)


def test_timeout(kubelet: FakeKubelet, socket_path: Path) -> None:
    kubelet.hang = True
    with PodResourcesClient(str(socket_path), timeout=0.2) as impatient, pytest.raises(KubeletUnavailable) as raised:
        impatient.list()
    assert raised.value.reason == KubeletFailure.TIMEOUT
    assert "timeout" in str(raised.value)
    assert "0.2 s" in str(raised.value)


def test_rate_limited(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    kubelet.fail_with = (grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
    with pytest.raises(KubeletUnavailable) as raised:
        client.list()
    assert raised.value.reason == KubeletFailure.RATE_LIMITED
    assert kubelet.calls == {"List": 1}  # never retried: the limit is shared with other agents


def test_other_server_errors_are_named(kubelet: FakeKubelet, client: PodResourcesClient) -> None:
    kubelet.fail_with = (grpc.StatusCode.INTERNAL, "boom")
    with pytest.raises(KubeletUnavailable, match="INTERNAL: boom") as raised:
        client.list()
    assert raised.value.reason == "error"


def test_a_server_without_our_service_is_unimplemented(socket_path: Path, client: PodResourcesClient) -> None:
    """What a kubelet before 1.20 (v1alpha1 only) or a wrongly packaged proto would meet."""
    socket_path.parent.mkdir(parents=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        with pytest.raises(KubeletUnavailable) as raised:
            client.list()
    finally:
        server.stop(grace=None).wait(timeout=10)
    assert raised.value.reason == KubeletFailure.UNIMPLEMENTED


def test_construction_connects_to_nothing(socket_path: Path) -> None:
    client = PodResourcesClient(str(socket_path))
    assert client.calls == {}
    assert client.target == f"unix://{socket_path}"
    client.close()


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="timeout"):
        PodResourcesClient("/nowhere.sock", timeout=0)


UNPRIVILEGED_CLIENT = """
import json, sys
from gpu_fence.auditor.podresources.client import KubeletUnavailable, PodResourcesClient
try:
    PodResourcesClient(sys.argv[1], timeout=5).list()
except KubeletUnavailable as error:
    print(json.dumps({"reason": error.reason, "message": str(error)}))
"""


def test_permission_denied_on_the_socket(kubelet: FakeKubelet, socket_path: Path) -> None:
    """A client without root meets a root-owned socket (the kubelet's is 0660 root:root)."""
    socket_path.chmod(0)
    command = [sys.executable, "-c", UNPRIVILEGED_CLIENT, str(socket_path)]
    if os.geteuid() == 0:  # root connects regardless of mode through CAP_DAC_OVERRIDE: run without it
        command = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *command]
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2]), "GRPC_VERBOSITY": "NONE"}
    result = run_captured(command, timeout=60, env=env)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["reason"] == KubeletFailure.PERMISSION_DENIED
    assert "must run as root" in outcome["message"]
    assert kubelet.calls == {}
