"""Finding every pod spec inside Kubernetes objects, wherever it is embedded.

Admission only ever sees Pods, but manifests hold pod specs in many places: a Pod itself, a PodTemplate's
``template``, the built-in workloads' ``spec.template``, a CronJob's ``spec.jobTemplate.spec.template``, and
custom resources that embed templates anywhere (RayCluster ``spec.workerGroupSpecs[0].template``, TrainJob
runtimes, Volcano Job ``spec.tasks[0].template``, PyTorchJob ``spec.pytorchReplicaSpecs.Worker.template``,
...). Rather than a list of kinds that is always one operator behind, a pod spec is recognised by its
shape: an object whose ``spec.containers`` (a *pod template*), or whose own ``containers`` (an inline pod
spec, as in KServe predictors), is a list of container objects, i.e. objects with a ``name`` or ``image``.

Pure functions over plain data; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_fence.vocabulary import CONTAINER_FIELDS

PathSegment = str | int
Path = tuple[PathSegment, ...]

#: How many values one object may expand to. YAML aliases can make a small file expand exponentially
#: ("billion laughs"); the walk stops with :class:`DiscoveryError` instead of running for hours.
DEFAULT_NODE_BUDGET = 1_000_000

_IDENTIFIER = re.compile(r"^[A-Za-z_$][A-Za-z0-9_$-]*$")


class DiscoveryError(Exception):
    """An object could not be walked (too large once aliases are expanded)."""


@dataclass(frozen=True)
class PodSpecSite:
    """One pod spec found inside an object.

    ``path`` leads from the object to the pod template (the mapping holding ``metadata`` and ``spec``), or
    to the pod spec itself when it is inline; ``spec_path`` always leads to the pod spec (the mapping
    holding ``containers``). ``metadata`` is the template's metadata (labels, annotations), empty for an
    inline pod spec.
    """

    path: Path
    spec_path: Path
    spec: Mapping[str, Any]
    metadata: Mapping[str, Any] = field(default_factory=dict)


def is_kubernetes_object(document: Any) -> bool:
    """True for a mapping with a non-empty string ``apiVersion`` and ``kind`` (Helm values are not)."""
    return (
        isinstance(document, Mapping)
        and isinstance(document.get("apiVersion"), str)
        and bool(document["apiVersion"])
        and isinstance(document.get("kind"), str)
        and bool(document["kind"])
    )


def is_list(obj: Mapping[str, Any]) -> bool:
    """True for ``List`` and ``<Kind>List`` objects (``kubectl get -o yaml`` output) that carry ``items``."""
    kind = obj.get("kind")
    return isinstance(kind, str) and kind.endswith("List") and isinstance(obj.get("items"), list)


def iter_objects(document: Any) -> Iterator[tuple[Path, Mapping[str, Any] | None]]:
    """Yield ``(path, object)`` for each Kubernetes object in a document, expanding Lists (nested too).

    An entry that is not a Kubernetes object is yielded with ``None`` so that the caller can count it
    as skipped; a List itself is not yielded.
    """
    if not is_kubernetes_object(document):
        yield (), None
        return
    if not is_list(document):
        yield (), document
        return
    for index, item in enumerate(document["items"]):
        for path, obj in iter_objects(item):
            yield ("items", index, *path), obj


def _is_container_list(value: Any) -> bool:
    if not isinstance(value, list) or not value:
        return False
    if not all(isinstance(item, Mapping) for item in value):
        return False
    return any(isinstance(item.get("name"), str) or isinstance(item.get("image"), str) for item in value)


def _site_at(path: Path, value: Mapping[str, Any]) -> PodSpecSite | None:
    spec = value.get("spec")
    if isinstance(spec, Mapping) and _is_container_list(spec.get("containers")):
        metadata = value.get("metadata")
        return PodSpecSite(path, (*path, "spec"), spec, metadata if isinstance(metadata, Mapping) else {})
    if _is_container_list(value.get("containers")):
        return PodSpecSite(path, path, value)
    return None


def find_pod_specs(obj: Any, *, node_budget: int = DEFAULT_NODE_BUDGET) -> list[PodSpecSite]:
    """Every pod spec in ``obj``, in document order, each with the path where it was found.

    The walk does not descend into a pod spec it found (pod specs do not nest) and skips values that
    contain themselves (recursive YAML aliases). A value reached again through a YAML alias is walked again
    only if it held a pod spec the first time (each path to a pod spec is a pod spec to report); past
    ``node_budget`` objects and lists visited it raises :class:`DiscoveryError`.
    """
    sites: list[PodSpecSite] = []
    visited = 0
    barren: set[int] = set()  # ids of values already walked that held no pod spec
    # Explicit stacks instead of recursion: document order is kept and deeply nested YAML cannot overflow.
    # Frame i: the iterator over a value's children, the value's path and id, and len(sites) on entry.
    iterators: list[Iterator[tuple[PathSegment, Any]]] = []
    frame_paths: list[Path] = []
    frame_ids: list[int] = []
    frame_sites: list[int] = []

    def enter(path: Path, value: Mapping[str, Any] | list[Any]) -> None:
        nonlocal visited
        identity = id(value)
        if identity in barren or identity in frame_ids:
            return
        visited += 1
        if visited > node_budget:
            raise DiscoveryError(f"object expands to more than {node_budget} values (YAML aliases?)")
        if isinstance(value, Mapping):
            site = _site_at(path, value)
            if site is not None:
                sites.append(site)
                return
            iterators.append(iter(value.items()))
        else:
            iterators.append(enumerate(value))
        frame_paths.append(path)
        frame_ids.append(identity)
        frame_sites.append(len(sites))

    if isinstance(obj, Mapping | list):
        enter((), obj)
    while iterators:
        step = next(iterators[-1], None)
        if step is None:
            iterators.pop()
            frame_paths.pop()
            identity = frame_ids.pop()
            if frame_sites.pop() == len(sites):
                barren.add(identity)
            continue
        segment, value = step
        if isinstance(value, Mapping | list) and isinstance(segment, str | int):
            enter((*frame_paths[-1], segment), value)
    return sites


def format_path(path: Sequence[PathSegment]) -> str:
    """Render a path the way people write it: ``spec.workerGroupSpecs[0].template``.

    Keys that are not plain identifiers are quoted, ``spec["weird.key"]``; the object itself is ``""``.
    """
    out: list[str] = []
    for segment in path:
        if isinstance(segment, int):
            out.append(f"[{segment}]")
        elif _IDENTIFIER.match(segment):
            out.append(f".{segment}" if out else segment)
        else:
            escaped = segment.replace("\\", "\\\\").replace('"', '\\"')
            out.append(f'["{escaped}"]')
    return "".join(out)


def object_namespace(obj: Mapping[str, Any], default: str) -> str:
    """The object's own ``metadata.namespace``, else ``default`` (as ``kubectl apply -n`` would place it)."""
    metadata = obj.get("metadata")
    if isinstance(metadata, Mapping):
        namespace = metadata.get("namespace")
        if isinstance(namespace, str) and namespace:
            return namespace
    return default


def object_name(obj: Mapping[str, Any]) -> str:
    """``metadata.name``, else ``generateName`` followed by ``*``, else an empty string."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, Mapping):
        return ""
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return name
    generate = metadata.get("generateName")
    if isinstance(generate, str) and generate:
        return f"{generate}*"
    return ""


def pod_for_site(site: PodSpecSite, owner: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The Pod that the API server would see for this pod spec, for the policy to evaluate.

    For a Pod the object itself is used; for a template its own metadata (the annotations and labels
    the pods will carry) in the owner's namespace. The inputs are not modified.
    """
    if not site.path and owner.get("kind") == "Pod":
        metadata = owner.get("metadata")
        source_metadata: Mapping[str, Any] = metadata if isinstance(metadata, Mapping) else {}
    else:
        source_metadata = site.metadata
    pod_metadata = dict(source_metadata)
    pod_metadata["namespace"] = namespace
    if not isinstance(pod_metadata.get("name"), str) or not pod_metadata.get("name"):
        pod_metadata["name"] = object_name(owner)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": pod_metadata, "spec": site.spec}


def container_index(spec: Mapping[str, Any], name: str | None) -> tuple[str, int] | None:
    """``(field, index)`` of the named container in a pod spec (init, regular, ephemeral), or None."""
    if name is None:
        return None
    for field_name in CONTAINER_FIELDS:
        containers = spec.get(field_name)
        if isinstance(containers, list):
            for index, container in enumerate(containers):
                if isinstance(container, Mapping) and container.get("name") == name:
                    return field_name, index
    return None
