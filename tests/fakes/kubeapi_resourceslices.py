"""ResourceSlices as the API server serves them, for the Kubernetes API fake (``kubeapi_pods_events.FakeKubeApi``
routes ``/apis/resource.k8s.io`` here), and the slices NVIDIA's DRA driver publishes.

Serving (``FakeResourceSlices``):

- discovery, ``GET /apis/resource.k8s.io``: an ``APIGroup`` listing the versions in ``served`` (404 when empty, as
  a cluster without DRA answers);
- ``GET /apis/resource.k8s.io/<version>/resourceslices``: the list (``fieldSelector=spec.nodeName=NODE``) with the
  store's ``resourceVersion``; with ``watch=1``, a chunked stream of the events after ``resourceVersion``, held open
  for new ones until ``timeoutSeconds``, the API going down or the fake stopping; a version older than the last
  ``compact()`` gets an ``ERROR`` event with a 410 ``Status``, as the API server's watch cache answers;
- slices are stored in the v1 shape and served in the version asked: v1beta1 nests a device's fields under
  ``basic`` (``k8s.io/api/resource/v1beta1/types.go`` ``Device.Basic``); v1beta2 is v1's shape;
- ``forbidden = True`` answers 403, as an auditor whose RBAC lacks ``resourceslices`` gets.

Publishing (``nvidia_slice``): the one slice NVIDIA's DRA driver (``gpu.nvidia.com``, pool = node name) publishes
for a node without dynamic MIG, with the device names and attributes of a driver ``release`` (from the driver's
``cmd/gpu-kubelet-plugin/deviceinfo.go`` and ``mig.go`` at each tag; github.com/NVIDIA/k8s-dra-driver-gpu):

| release | GPU | MIG device | index/minor attributes |
|---|---|---|---|
| ``v25.2`` (before v25.3.0-rc.5) | ``gpu-<index>`` | ``gpu-<parent index>-mig-<GI profile>-<start>-<size>`` | yes |
| ``v25.3`` | ``gpu-<minor>`` | ``gpu-<parent minor>-mig-<GI profile>-<start>-<size>`` | yes |
| ``v25.8`` | ``gpu-<minor>`` | as v25.3 | removed |
| ``v25.12``, v0.4.0 | ``gpu-<minor>`` | ``gpu-<parent minor>-mig-<profile, no dots>-<GI profile>-<start>`` | removed |

A MIG-enabled card is not published itself; only its MIG devices are (``nvlib.go``).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler
from typing import Any

GROUP = "resource.k8s.io"
VERSIONS = ("v1", "v1beta2", "v1beta1")
RELEASES = ("v25.2", "v25.3", "v25.8", "v25.12")
DRIVER = "gpu.nvidia.com"
#: GPU-instance profile ids of H100 80GB profiles (NVML's ``NVML_GPU_INSTANCE_PROFILE_*`` as the driver reads them).
GI_PROFILE_IDS = {"1g.10gb": 19, "1g.20gb": 15, "2g.20gb": 14, "3g.40gb": 9, "4g.40gb": 5, "7g.80gb": 0}


@dataclass(frozen=True)
class DraGpu:
    """A full GPU as the driver sees it (NVML index, minor, UUID)."""

    index: int
    minor: int
    uuid: str
    product: str = "NVIDIA H100 80GB HBM3"
    memory: str = "80Gi"


@dataclass(frozen=True)
class DraMig:
    """A static MIG device: its parent card, its UUID, its profile and placement."""

    parent: DraGpu
    uuid: str
    profile: str = "1g.10gb"
    placement_start: int = 0
    placement_size: int = 1


def gpu_name(gpu: DraGpu, release: str) -> str:
    return f"gpu-{gpu.index if release == 'v25.2' else gpu.minor}"


def mig_name(mig: DraMig, release: str) -> str:
    profile_id = GI_PROFILE_IDS[mig.profile]
    if release == "v25.12":
        return f"gpu-{mig.parent.minor}-mig-{mig.profile.replace('.', '').lower()}-{profile_id}-{mig.placement_start}"
    parent = mig.parent.index if release == "v25.2" else mig.parent.minor
    return f"gpu-{parent}-mig-{profile_id}-{mig.placement_start}-{mig.placement_size}"


def _common(product: str) -> dict[str, Any]:
    return {
        "productName": {"string": product},
        "brand": {"string": "Nvidia"},
        "architecture": {"string": "Hopper"},
        "cudaComputeCapability": {"version": "9.0.0"},
        "driverVersion": {"version": "580.95.5"},
        "cudaDriverVersion": {"version": "13.0.0"},
    }


def gpu_device(gpu: DraGpu, release: str) -> dict[str, Any]:
    attributes = {"type": {"string": "gpu"}, "uuid": {"string": gpu.uuid}, **_common(gpu.product)}
    attributes["resource.kubernetes.io/pciBusID"] = {"string": f"0000:{0x18 + gpu.index:02x}:00.0"}
    if release in ("v25.2", "v25.3"):
        attributes |= {"index": {"int": gpu.index}, "minor": {"int": gpu.minor}}
    return {"name": gpu_name(gpu, release), "attributes": attributes, "capacity": {"memory": {"value": gpu.memory}}}


def mig_device(mig: DraMig, release: str) -> dict[str, Any]:
    attributes = {
        "type": {"string": "mig"},
        "uuid": {"string": mig.uuid},
        "parentUUID": {"string": mig.parent.uuid},
        "profile": {"string": mig.profile},
        **_common(mig.parent.product),
    }
    if release in ("v25.2", "v25.3"):
        attributes |= {"index": {"int": mig.placement_start}, "parentIndex": {"int": mig.parent.index}}
    capacity: dict[str, Any] = {
        "multiprocessors": {"value": "16"},
        "copyEngines": {"value": "1"},
        "memory": {"value": "9856Mi"},
    }
    for slot in range(mig.placement_start, mig.placement_start + mig.placement_size):
        capacity[f"memorySlice{slot}"] = {"value": "1"}
    return {"name": mig_name(mig, release), "attributes": attributes, "capacity": capacity}


def nvidia_slice(
    node: str,
    gpus: Sequence[DraGpu],
    migs: Sequence[DraMig] = (),
    *,
    release: str = "v25.12",
    generation: int = 1,
    name: str | None = None,
) -> dict[str, Any]:
    """The v1 ResourceSlice NVIDIA's driver publishes for ``node``: every card not in MIG mode, every MIG device."""
    if release not in RELEASES:
        raise ValueError(f"release must be one of {', '.join(RELEASES)}, got {release!r}")
    mig_parents = {mig.parent.uuid for mig in migs}
    devices = [gpu_device(gpu, release) for gpu in gpus if gpu.uuid not in mig_parents]
    devices += [mig_device(mig, release) for mig in migs]
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": {
            "name": name or f"{node}-{DRIVER}-x7k2p",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": f"uid-node-{node}"}],
        },
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def compute_domain_slice(node: str) -> dict[str, Any]:
    """What NVIDIA's ``compute-domain.nvidia.com`` driver publishes: IMEX channels, no GPUs."""
    return {
        "apiVersion": f"{GROUP}/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-compute-domain.nvidia.com-9qz4t"},
        "spec": {
            "driver": "compute-domain.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [
                {"name": "channel-0", "attributes": {"type": {"string": "channel"}, "id": {"int": 0}}},
                {"name": "daemon-0", "attributes": {"type": {"string": "daemon"}, "id": {"int": 0}}},
            ],
        },
    }


def in_version(obj: dict[str, Any], version: str) -> dict[str, Any]:
    """A stored (v1) slice as the API server converts it for ``version``."""
    served = copy.deepcopy(obj)
    served["apiVersion"] = f"{GROUP}/{version}"
    if version == "v1beta1":
        served["spec"]["devices"] = [
            {"name": device["name"], "basic": {k: v for k, v in device.items() if k != "name"}}
            for device in served["spec"].get("devices", [])
        ]
    return served


class FakeResourceSlices:
    """The ResourceSlice store and its endpoints; ``is_down`` says whether the API server is failing (whoever changes
    what it says calls ``wake()``, so that open watches see it)."""

    def __init__(self, is_down: Callable[[], bool] = lambda: False) -> None:
        self.served: tuple[str, ...] = VERSIONS
        self.forbidden = False
        self._is_down = is_down
        self._condition = threading.Condition()
        self._slices: dict[str, dict[str, Any]] = {}
        self._events: list[tuple[int, str, dict[str, Any]]] = []
        self._version = 100
        self._compacted = 0  # watches from a version at or below this get 410
        self._stopped = False
        self.watches_open = 0

    # --- the store -------------------------------------------------------------------------------------------------

    def put(self, obj: dict[str, Any]) -> None:
        """Create or replace a slice (an ADDED or MODIFIED event)."""
        with self._condition:
            name = obj["metadata"]["name"]
            kind = "MODIFIED" if name in self._slices else "ADDED"
            self._record(kind, copy.deepcopy(obj))

    def delete(self, name: str) -> None:
        with self._condition:
            self._record("DELETED", self._slices[name])

    def compact(self) -> None:
        """Forget every event so far, as etcd compaction does: watches from an older version get 410."""
        with self._condition:
            self._compacted = self._version
            self._events.clear()
            self._condition.notify_all()

    def stop(self) -> None:
        """End every open watch (the server is going away)."""
        with self._condition:
            self._stopped = True
            self._condition.notify_all()

    def wake(self) -> None:
        """Open watches look again at what ends them (``is_down`` changed)."""
        with self._condition:
            self._condition.notify_all()

    def _record(self, kind: str, obj: dict[str, Any]) -> None:
        self._version += 1
        obj["metadata"]["resourceVersion"] = str(self._version)
        if kind == "DELETED":
            self._slices.pop(obj["metadata"]["name"], None)
        else:
            self._slices[obj["metadata"]["name"]] = obj
        self._events.append((self._version, kind, copy.deepcopy(obj)))
        self._condition.notify_all()

    # --- serving -----------------------------------------------------------------------------------------------------

    def handle(self, handler: BaseHTTPRequestHandler, path: str, query: dict[str, list[str]], send: Callable) -> None:
        """Answer one GET under ``/apis/resource.k8s.io``; ``send(handler, code, body)`` writes a JSON answer."""
        segments = [s for s in path.split("/") if s]
        if self.forbidden:
            message = 'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:gpu-fence:auditor"'
            return send(handler, 403, _status(403, "Forbidden", message))
        if segments == ["apis", GROUP]:
            if not self.served:
                return send(handler, 404, _status(404, "NotFound", "the server could not find the requested resource"))
            versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in self.served]
            body = {"kind": "APIGroup", "apiVersion": "v1", "name": GROUP, "versions": versions}
            return send(handler, 200, body | {"preferredVersion": versions[0]})
        if len(segments) != 4 or segments[3] != "resourceslices" or segments[2] not in self.served:
            return send(handler, 404, _status(404, "NotFound", "the server could not find the requested resource"))
        version = segments[2]
        selector = query.get("fieldSelector", [""])[0]
        node = selector.removeprefix("spec.nodeName=") if selector.startswith("spec.nodeName=") else None
        if query.get("watch", ["false"])[0] in ("1", "true"):
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            timeout = float(query.get("timeoutSeconds", ["1800"])[0])
            return self._watch(handler, version, node, since, timeout)
        with self._condition:
            items = [in_version(obj, version) for obj in self._slices.values() if _on(obj, node)]
            listed = str(self._version)
        kind = {"kind": "ResourceSliceList", "apiVersion": f"{GROUP}/{version}"}
        return send(handler, 200, kind | {"metadata": {"resourceVersion": listed}, "items": items})

    def _watch(self, handler: BaseHTTPRequestHandler, version: str, node: str | None, since: int, limit: float) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        deadline = time.monotonic() + limit
        sent = since
        with self._condition:
            self.watches_open += 1
        try:
            if since <= self._compacted:
                gone = {"type": "ERROR", "object": _status(410, "Expired", f"too old resource version: {since}")}
                _chunk(handler, gone)
            while since > self._compacted:
                with self._condition:
                    # woken by a new event, a compaction, the API going down or the fake stopping; else the deadline
                    self._condition.wait_for(
                        lambda after=sent: self._newer(after) or self._ended(since),
                        timeout=max(0.0, deadline - time.monotonic()),
                    )
                    pending = self._newer(sent)
                    if not pending and (self._ended(since) or time.monotonic() >= deadline):
                        break
                for number, kind, obj in pending:
                    sent = number
                    if _on(obj, node):
                        _chunk(handler, {"type": kind, "object": in_version(obj, version)})
            handler.wfile.write(b"0\r\n\r\n")
            handler.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client closed the watch
        finally:
            with self._condition:
                self.watches_open -= 1

    def _newer(self, sent: int) -> list[tuple[int, str, dict[str, Any]]]:
        """The events after ``sent`` (under the lock)."""
        return [event for event in self._events if event[0] > sent]

    def _ended(self, since: int) -> bool:
        """Whether a watch from ``since`` is over: the fake stopped, the API is down, or compaction passed it (under
        the lock)."""
        return self._stopped or self._is_down() or since <= self._compacted


def _on(obj: dict[str, Any], node: str | None) -> bool:
    return node is None or obj["spec"].get("nodeName") == node


def _chunk(handler: BaseHTTPRequestHandler, event: dict[str, Any]) -> None:
    data = json.dumps(event).encode() + b"\n"
    handler.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
    handler.wfile.flush()


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "reason": reason} | {
        "code": code
    }
