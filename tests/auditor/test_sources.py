"""The real adapters satisfy the Protocols that collection depends on: every member there, with a signature that
accepts each call the Protocol allows (a static type checker says the same; this holds without one)."""

from __future__ import annotations

import inspect

import pytest

from gpu_fence.auditor import sources
from gpu_fence.auditor.hostproc import HostProc
from gpu_fence.auditor.kube import PodCache
from gpu_fence.auditor.nvml import Nvml
from gpu_fence.auditor.offered import OfferedReplicas
from gpu_fence.auditor.podresources.client import PodResourcesClient
from gpu_fence.auditor.resourceslices import ResourceSliceCache

ADAPTERS = [
    (sources.PodResourcesSource, PodResourcesClient("/nonexistent/kubelet.sock")),  # constructing one opens nothing
    (sources.NvmlSource, Nvml("/nonexistent/libnvidia-ml.so.1")),
    (sources.HostProcSource, HostProc("/nonexistent/proc")),
    (sources.PodSource, PodCache(object(), "node-a")),
    (sources.SliceSource, ResourceSliceCache(object(), "node-a")),  # nor does this one: it lists on sync() or start()
    (sources.OfferedSource, OfferedReplicas()),
]


def members(protocol: type) -> dict[str, object]:
    own = {}
    for klass in reversed(protocol.__mro__[:-1]):
        if klass.__name__ not in ("Protocol", "Generic"):
            own.update({k: v for k, v in vars(klass).items() if not k.startswith("_")})
    return own


def accepts(adapter_function: object, protocol_function: object) -> bool:
    """Every parameter of the Protocol's method is the adapter's, of the same kind; the adapter's others have
    defaults."""
    wanted = inspect.signature(protocol_function).parameters  # type: ignore[arg-type]
    given = inspect.signature(adapter_function).parameters  # type: ignore[arg-type]
    for name, parameter in wanted.items():
        if name not in given or given[name].kind != parameter.kind:
            return False
    extra = [p for name, p in given.items() if name not in wanted]
    return all(p.default is not inspect.Parameter.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in extra)


@pytest.mark.parametrize(("protocol", "adapter"), ADAPTERS, ids=lambda item: getattr(item, "__name__", ""))
def test_each_real_adapter_satisfies_its_protocol(protocol: type, adapter: object) -> None:
    assert isinstance(adapter, protocol)
    for name, member in members(protocol).items():
        if isinstance(member, property):
            assert isinstance(inspect.getattr_static(type(adapter), name, None), property) or name in vars(adapter)
        elif callable(member):
            assert accepts(getattr(type(adapter), name), member), f"{type(adapter).__name__}.{name}"


def test_an_object_lacking_a_member_is_no_source() -> None:
    class Partial:
        def list(self) -> list:
            return []

    assert not isinstance(Partial(), sources.PodResourcesSource)  # no close()
    assert not isinstance(Partial(), sources.NvmlSource)
