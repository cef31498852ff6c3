"""A fake kubelet PodResources endpoint: a real gRPC server on a unix socket, serving our v1 proto.

Configure it per test by assigning ``pods``, ``allocatable`` (build it with :func:`offered`, in the kubelet's
shape), ``get_mode``, ``allocatable_mode``, ``fail_with`` or ``hang``; read ``calls`` to see how many RPCs arrived,
by method name. ``restart()`` stops the server and serves again on the same
path with a new socket file (a new inode), as a kubelet restart does.
"""

from __future__ import annotations

import collections
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from pathlib import Path

import grpc

from gpu_fence.auditor.podresources.v1 import api_pb2, api_pb2_grpc

#: How the fake answers Get (and GetAllocatableResources, through ``allocatable_mode``): like a kubelet that serves
#: it, like one with its feature gate off (Get before 1.34, GetAllocatableResources on 1.21-1.22), or like one older
#: than the method (Get before 1.27, GetAllocatableResources before 1.21).
GET_ENABLED = "enabled"
GET_DISABLED = "disabled"
GET_ABSENT = "absent"


def offered(resource: str, ids: Sequence[str], numa_nodes: Sequence[int] = (0,)) -> list[api_pb2.ContainerDevices]:
    """GetAllocatableResources' devices for one resource as the kubelet sends them (``pkg/kubelet/cm``
    ``containerDevicesFromResourceDeviceInstances``): one entry per id and NUMA node, so an id on two NUMA nodes
    comes twice."""
    return [
        api_pb2.ContainerDevices(
            resource_name=resource,
            device_ids=[device_id],
            topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=node)]),
        )
        for device_id in ids
        for node in numa_nodes
    ]


def container(
    name: str,
    devices: Mapping[str, Sequence[str]] | None = None,
    dynamic: Iterable[api_pb2.DynamicResource] = (),
) -> api_pb2.ContainerResources:
    """A container with ``{resource name: [device ids]}`` allocated, and DRA claims."""
    return api_pb2.ContainerResources(
        name=name,
        devices=[
            api_pb2.ContainerDevices(resource_name=resource, device_ids=list(ids))
            for resource, ids in (devices or {}).items()
        ],
        dynamic_resources=list(dynamic),
    )


def pod(name: str, namespace: str, *containers: api_pb2.ContainerResources) -> api_pb2.PodResources:
    return api_pb2.PodResources(name=name, namespace=namespace, containers=list(containers))


def claim(claim_name: str, claim_namespace: str, *resources: api_pb2.ClaimResource) -> api_pb2.DynamicResource:
    return api_pb2.DynamicResource(claim_name=claim_name, claim_namespace=claim_namespace, claim_resources=resources)


def claim_device(
    driver: str = "", pool: str = "", device: str = "", cdi: Sequence[str] = (), share_id: str | None = None
) -> api_pb2.ClaimResource:
    resource = api_pb2.ClaimResource(
        driver_name=driver, pool_name=pool, device_name=device, cdi_devices=[api_pb2.CDIDevice(name=n) for n in cdi]
    )
    if share_id is not None:
        resource.share_id = share_id
    return resource


class _Servicer(api_pb2_grpc.PodResourcesListerServicer):
    def __init__(self, fake: FakeKubelet) -> None:
        self.fake = fake

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        fake = self.fake
        with fake.lock:
            fake.calls[method] += 1
        if fake.hang:
            # Hold the call until the client gives up (its deadline cancels the RPC) or the server stops.
            ended = threading.Event()

            def on_end() -> None:
                ended.set()
                fake.released.wake()

            context.add_callback(on_end)
            fake.released.wait_until(ended.is_set)
        if fake.fail_with is not None:
            code, details = fake.fail_with
            context.abort(code, details)

    def List(self, request, context):  # gRPC method names, as generated
        self._enter("List", context)
        return api_pb2.ListPodResourcesResponse(pod_resources=self.fake.pods)

    def GetAllocatableResources(self, request, context):
        self._enter("GetAllocatableResources", context)
        if self.fake.allocatable_mode == GET_ABSENT:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        if self.fake.allocatable_mode == GET_DISABLED:  # what 1.21-1.22 answer with the gate off
            context.abort(grpc.StatusCode.UNKNOWN, "Pod Resources API GetAllocatableResources disabled")
        return api_pb2.AllocatableResourcesResponse(devices=self.fake.allocatable)

    def Get(self, request, context):
        self._enter("Get", context)
        if self.fake.get_mode == GET_ABSENT:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not implemented!")
        if self.fake.get_mode == GET_DISABLED:  # exactly what a kubelet with the gate off answers
            context.abort(grpc.StatusCode.UNKNOWN, "PodResources API Get method disabled")
        for candidate in self.fake.pods:
            if candidate.name == request.pod_name and candidate.namespace == request.pod_namespace:
                return api_pb2.GetPodResourcesResponse(pod_resources=candidate)
        context.abort(grpc.StatusCode.UNKNOWN, f"pod {request.pod_name} in namespace {request.pod_namespace} not found")


class _Release:
    """Lets the test release every held call at once (at stop), without sleeping."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._released = False

    def wait_until(self, predicate: Callable[[], bool], limit: float = 30.0) -> None:
        with self._condition:
            self._condition.wait_for(lambda: self._released or predicate(), timeout=limit)

    def wake(self) -> None:
        with self._condition:
            self._condition.notify_all()

    def release(self) -> None:
        with self._condition:
            self._released = True
            self._condition.notify_all()

    def reset(self) -> None:
        with self._condition:
            self._released = False


class FakeKubelet:
    """Serves PodResources v1 on ``socket_path`` while started; use as a context manager."""

    def __init__(
        self,
        socket_path: str | os.PathLike[str],
        pods: Iterable[api_pb2.PodResources] = (),
        allocatable: Iterable[api_pb2.ContainerDevices] = (),
    ) -> None:
        self.socket_path = Path(socket_path)
        self.pods = list(pods)
        self.allocatable = list(allocatable)
        self.get_mode = GET_ENABLED
        self.allocatable_mode = GET_ENABLED
        #: (status code, details) every call is aborted with, as a kubelet that rate-limits or fails does.
        self.fail_with: tuple[grpc.StatusCode, str] | None = None
        #: Hold every call without answering, until the caller's deadline passes.
        self.hang = False
        self.calls: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
        self.released = _Release()
        self._server: grpc.Server | None = None

    def start(self) -> FakeKubelet:
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        self.released.reset()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="fake-kubelet"))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{self.socket_path.resolve()}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket file, as a kubelet does on shutdown."""
        if self._server is not None:
            self.released.release()
            self._server.stop(grace=None).wait(timeout=10)
            self._server = None
        self.socket_path.unlink(missing_ok=True)

    def restart(self) -> None:
        """Stop, then serve again on the same path: a new socket inode, as after a kubelet restart."""
        self.stop()
        self.start()

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
