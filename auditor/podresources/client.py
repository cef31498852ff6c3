"""Client of the kubelet PodResources API (v1): which devices the kubelet allocated to each container.

The kubelet serves it without authentication on a unix socket, ``<kubelet root-dir>/pod-resources/kubelet.sock``,
and rate-limits all its callers together (100 QPS, burst 10), so every public method makes exactly one RPC and
never retries; the caller's next cycle is the retry.

Answers are the plain values of ``allocations``. Errors come out as :class:`KubeletUnavailable` with a short
machine-readable ``reason`` (a ``KubeletFailure``, fit for a metric label) and a message that says what to fix.
Nothing happens at import or construction: the channel is opened by the first call.
"""

from __future__ import annotations

import builtins
import collections
import os
import re
import socket
import stat
from collections.abc import Iterable
from typing import Any

import grpc

from . import DEFAULT_SOCKET
from .allocations import ClaimDevice, ContainerAllocation, DeviceAllocation, DynamicResource
from .calls import KubeletFailure, KubeletMethod
from .v1 import api_pb2, api_pb2_grpc

#: A dense node's List answer is well under 1 MiB; allow what other PodResources clients (NFD) allow.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024


# Kubelets before 1.34 answer Get with UNKNOWN "PodResources API Get method disabled" when the
# KubeletPodResourcesGet gate is off, and 1.21-1.22 GetAllocatableResources with "Pod Resources API
# GetAllocatableResources disabled" when KubeletPodResourcesGetAllocatable is off; a method older than the kubelet
# does not exist (UNIMPLEMENTED).
_DISABLED = re.compile(r"(method|GetAllocatableResources) disabled", re.IGNORECASE)
#: Why a method may be missing, for the message of an UNIMPLEMENTED answer.
_NEEDS = {
    KubeletMethod.GET: "Get needs Kubernetes 1.27+ with the KubeletPodResourcesGet feature gate "
    "(on by default from 1.34)",
    KubeletMethod.GET_ALLOCATABLE_RESOURCES: "GetAllocatableResources needs Kubernetes 1.21+ with the "
    "KubeletPodResourcesGetAllocatable feature gate (on by default from 1.23)",
}
_POD_NOT_FOUND = re.compile(r"^pod .* not found$")


class KubeletUnavailable(Exception):
    """The kubelet's PodResources API could not answer, and why (``reason``)."""

    def __init__(self, reason: KubeletFailure, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _device_allocations(messages: Iterable[api_pb2.ContainerDevices]) -> tuple[DeviceAllocation, ...]:
    return tuple(DeviceAllocation(message.resource_name, tuple(message.device_ids)) for message in messages)


def _dynamic_resource(message: api_pb2.DynamicResource) -> DynamicResource:
    claim_devices = tuple(
        ClaimDevice(
            driver_name=resource.driver_name,
            pool_name=resource.pool_name,
            device_name=resource.device_name,
            cdi_devices=tuple(device.name for device in resource.cdi_devices),
            share_id=resource.share_id if resource.HasField("share_id") else None,
        )
        for resource in message.claim_resources
    )
    return DynamicResource(message.claim_name, message.claim_namespace, claim_devices)


def _container_allocations(pod: api_pb2.PodResources) -> list[ContainerAllocation]:
    return [
        ContainerAllocation(
            namespace=pod.namespace,
            pod=pod.name,
            container=container.name,
            devices=_device_allocations(container.devices),
            dynamic_resources=tuple(_dynamic_resource(resource) for resource in container.dynamic_resources),
        )
        for container in pod.containers
    ]


class PodResourcesClient:
    """One kubelet's PodResources API over its unix socket. Not thread-safe: one auditor cycle at a time."""

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout: float = 5.0,
        calls: collections.Counter[KubeletMethod] | None = None,
        failures: collections.Counter[tuple[KubeletMethod, KubeletFailure]] | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.socket_path = socket_path
        self.timeout = timeout
        #: RPCs made (failed ones too), by method. Pass ``calls`` to
        #: keep counting in one Counter across the clients a long-running caller rebuilds after kubelet restarts.
        self.calls: collections.Counter[KubeletMethod] = calls if calls is not None else collections.Counter()
        #: RPCs that raised ``KubeletUnavailable``, by (method, reason); shared the same way through ``failures``.
        self.failures: collections.Counter[tuple[KubeletMethod, KubeletFailure]] = (
            failures if failures is not None else collections.Counter()
        )
        self._channel: grpc.Channel | None = None
        self._stub: api_pb2_grpc.PodResourcesListerStub | None = None

    @property
    def target(self) -> str:
        return f"unix://{os.path.abspath(self.socket_path)}"

    def list(self) -> builtins.list[ContainerAllocation]:
        """Every container of every pod the kubelet knows on this node, with its allocation (one List RPC)."""
        response = self._call(KubeletMethod.LIST, api_pb2.ListPodResourcesRequest())
        return [allocation for pod in response.pod_resources for allocation in _container_allocations(pod)]

    def allocatable(self) -> builtins.list[DeviceAllocation]:
        """Every healthy device the node's device plugins offer, ids as advertised (one GetAllocatableResources RPC).

        The kubelet sends one entry per id and NUMA node, so an id on two NUMA nodes comes twice. DRA devices are not
        in the answer. Raises ``KubeletUnavailable`` as :meth:`list` does, with reason ``KubeletFailure.UNIMPLEMENTED``
        where the kubelet lacks the method or has it disabled.
        """
        response = self._call(KubeletMethod.GET_ALLOCATABLE_RESOURCES, api_pb2.AllocatableResourcesRequest())
        return list(_device_allocations(response.devices))

    def get(self, namespace: str, pod: str) -> builtins.list[ContainerAllocation]:
        """One pod's containers (one Get RPC); empty when the kubelet does not know the pod.

        Raises ``KubeletUnavailable`` (``KubeletFailure.UNIMPLEMENTED``) where the kubelet lacks Get (before 1.27) or
        has it disabled (the KubeletPodResourcesGet gate, off by default before 1.34): use :meth:`list` there.
        """
        request = api_pb2.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        try:
            response = self._call(KubeletMethod.GET, request)
        except _NotFound:
            return []
        return _container_allocations(response.pod_resources)

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = self._stub = None

    def __enter__(self) -> PodResourcesClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _ensure_stub(self) -> api_pb2_grpc.PodResourcesListerStub:
        if self._stub is None:
            self._channel = grpc.insecure_channel(
                self.target,
                options=[
                    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                    ("grpc.enable_retries", 0),  # retries are ours to decide: the kubelet's rate limit is shared
                ],
            )
            # grpcio-tools writes the stub class without annotations (api_pb2 alone has a .pyi)
            self._stub = api_pb2_grpc.PodResourcesListerStub(self._channel)  # type: ignore[no-untyped-call]
        return self._stub

    def _call(self, method: KubeletMethod, request: Any) -> Any:
        self.calls[method] += 1
        try:
            return getattr(self._ensure_stub(), method)(request, timeout=self.timeout)
        except grpc.RpcError as error:
            code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
            if code == grpc.StatusCode.UNAVAILABLE:
                # Start the next call on a new channel: one that failed to connect waits out a reconnect backoff
                # (fast-failing meanwhile), and a restarted kubelet listens on a new socket inode.
                self.close()
            translated = self._translate(method, code, error)
            if isinstance(translated, KubeletUnavailable):
                self.failures[(method, translated.reason)] += 1
            raise translated from None

    def _translate(self, method: KubeletMethod, code: grpc.StatusCode, error: grpc.RpcError) -> Exception:
        details = (error.details() if isinstance(error, grpc.Call) else None) or str(code)
        where = f"kubelet PodResources {method} on {self.target}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return KubeletUnavailable(KubeletFailure.TIMEOUT, f"{where}: timeout, no answer within {self.timeout:g} s")
        if code == grpc.StatusCode.UNAVAILABLE:
            return self._diagnose_unavailable(where, details)
        if code == grpc.StatusCode.UNIMPLEMENTED or (code == grpc.StatusCode.UNKNOWN and _DISABLED.search(details)):
            needs = _NEEDS.get(method)
            return KubeletUnavailable(
                KubeletFailure.UNIMPLEMENTED,
                f"{where}: not served by this kubelet ({details})" + (f"; {needs}" if needs else ""),
            )
        if code == grpc.StatusCode.UNKNOWN and method is KubeletMethod.GET and _POD_NOT_FOUND.match(details):
            return _NotFound(details)
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return KubeletUnavailable(
                KubeletFailure.RATE_LIMITED,
                f"{where}: rate-limited by the kubelet ({details}); other agents share its 100 QPS",
            )
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return KubeletUnavailable(KubeletFailure.PERMISSION_DENIED, f"{where}: permission denied ({details})")
        return KubeletUnavailable(KubeletFailure.ERROR, f"{where}: {code.name}: {details}")

    def _diagnose_unavailable(self, where: str, details: str) -> KubeletUnavailable:
        """Name the cause of an UNAVAILABLE by looking at the socket itself: gRPC's text varies by version."""
        path = os.path.abspath(self.socket_path)
        directory = os.path.dirname(path)
        if not os.path.lexists(path):
            return KubeletUnavailable(
                KubeletFailure.SOCKET_MISSING,
                f"{where}: socket {path} does not exist; mount the host directory {directory} into the auditor "
                "(the directory, not the socket file, so a restarted kubelet's new socket is seen) and check the "
                "kubelet's --root-dir",
            )
        try:
            is_socket = stat.S_ISSOCK(os.stat(path).st_mode)
        except OSError:
            is_socket = True  # unreadable or gone since: let the connection attempt name the problem
        if not is_socket:
            return KubeletUnavailable(
                KubeletFailure.UNAVAILABLE,
                f"{where}: {path} is not a socket; point the auditor at the kubelet's pod-resources socket",
            )
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(min(self.timeout, 1.0))
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            return KubeletUnavailable(
                KubeletFailure.CONNECTION_REFUSED,
                f"{where}: connection refused on {path}; the kubelet is down or restarting",
            )
        except PermissionError:
            return KubeletUnavailable(
                KubeletFailure.PERMISSION_DENIED,
                f"{where}: permission denied on {path}; the auditor must run as root to use it",
            )
        except OSError as error:
            return KubeletUnavailable(
                KubeletFailure.UNAVAILABLE, f"{where}: cannot connect to {path}: {error.strerror or error}"
            )
        finally:
            probe.close()
        return KubeletUnavailable(KubeletFailure.UNAVAILABLE, f"{where}: unavailable ({details})")


class _NotFound(Exception):
    """Get for a pod the kubelet does not know: an answer, not an outage."""
