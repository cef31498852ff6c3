"""Finding every pod spec inside Kubernetes objects, wherever it is embedded.

Admission only ever sees Pods, but manifests hold pod specs in many places: a Pod itself, a PodTemplate's
``template``, the built-in workloads' ``spec.template``, a CronJob's ``spec.jobTemplate.spec.template``, and
custom resources that embed templates anywhere (RayCluster ``spec.workerGroupSpecs[0].template``, TrainJob
runtimes, Volcano Job ``spec.tasks[0].template``, PyTorchJob ``spec.pytorchReplicaSpecs.Worker.template``,
...). Rather than a list of kinds that is always one operator behind, a pod spec is recognised by its
shape: an object whose ``spec.containers`` (a *pod template*), or whose own ``containers`` (an inline pod
spec, as in KServe predictors), is a list of container objects, i.e. objects with a ``name`` or ``image``.
The one shape that is not a pod spec at all, an Argo Workflows template (one ``container`` or ``script``
plus ``sidecars``), is assembled into the pod Argo will run (:func:`find_argo_pod_specs`).

Pure functions over plain data; no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_fence.vocabulary import CONTAINER_FIELDS, iter_containers

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
    #: For pod specs assembled from another shape (Argo templates): where each container really is,
    #: relative to the object, since ``spec_path`` then leads to no ``containers`` list.
    container_paths: Mapping[str, Path] | None = None

    def container_path(self, name: str | None) -> Path | None:
        """Path from the object to the named container, or None when there is no such container."""
        if self.container_paths is not None:
            return self.container_paths.get(name) if name is not None else None
        located = container_index(self.spec, name)
        return None if located is None else (*self.spec_path, *located)


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

    Argo Workflows templates follow the generic ones. Within a pod spec found, every field but the container lists is
    walked on: pod specs do not nest in Kubernetes, but custom resources put a second one beside the fields of the
    first (KServe's ``workerSpec`` in a ServingRuntime or an InferenceService predictor). Values that contain
    themselves (recursive YAML aliases) are skipped. A value reached again through a YAML alias is walked again only
    if it held a pod spec the first time (each path to a pod spec is a pod spec to report); past ``node_budget``
    objects and lists visited it raises :class:`DiscoveryError`.
    """
    sites: list[PodSpecSite] = []
    visited = 0
    barren: set[int] = set()  # ids of values already walked that held no pod spec
    # Explicit stacks instead of recursion: document order is kept and deeply nested YAML cannot overflow.
    # Frame i: the iterator over a value's children, the value's path and id, len(sites) on entry, and whether the
    # value may be marked barren (not the fields beside a pod spec's containers: the pod spec itself is one).
    iterators: list[Iterator[tuple[PathSegment, Any]]] = []
    frame_paths: list[Path] = []
    frame_ids: list[int] = []
    frame_sites: list[int] = []
    frame_markable: list[bool] = []

    def push(path: Path, value: Any, children: Iterator[tuple[PathSegment, Any]], before: int, markable: bool) -> None:
        iterators.append(children)
        frame_paths.append(path)
        frame_ids.append(id(value))
        frame_sites.append(before)
        frame_markable.append(markable)

    def enter(path: Path, value: Mapping[str, Any] | list[Any]) -> None:
        nonlocal visited
        identity = id(value)
        if identity in barren or identity in frame_ids:
            return
        visited += 1
        if visited > node_budget:
            raise DiscoveryError(f"object expands to more than {node_budget} values (YAML aliases?)")
        if not isinstance(value, Mapping):
            push(path, value, enumerate(value), len(sites), True)
            return
        site = _site_at(path, value)
        if site is None:
            push(path, value, iter(value.items()), len(sites), True)
            return
        sites.append(site)
        if site.spec is value:  # an inline pod spec
            push(path, value, _beside_containers(value), len(sites) - 1, True)
            return
        push(path, value, ((k, v) for k, v in value.items() if k not in ("metadata", "spec")), len(sites) - 1, True)
        if id(site.spec) not in frame_ids:
            push(site.spec_path, site.spec, _beside_containers(site.spec), len(sites), False)

    if isinstance(obj, Mapping | list):
        enter((), obj)
    while iterators:
        step = next(iterators[-1], None)
        if step is None:
            iterators.pop()
            frame_paths.pop()
            identity = frame_ids.pop()
            held_none = frame_sites.pop() == len(sites)
            if frame_markable.pop() and held_none:
                barren.add(identity)
            continue
        segment, value = step
        if isinstance(value, Mapping | list) and isinstance(segment, str | int):
            enter((*frame_paths[-1], segment), value)
    if isinstance(obj, Mapping):
        sites.extend(find_argo_pod_specs(obj))
    return sites


def _beside_containers(spec: Mapping[str, Any]) -> Iterator[tuple[PathSegment, Any]]:
    return ((key, value) for key, value in spec.items() if key not in CONTAINER_FIELDS)


#: Argo Workflows kinds, and where each keeps its list of templates.
ARGO_TEMPLATE_LISTS = {
    "Workflow": ("spec", "templates"),
    "WorkflowTemplate": ("spec", "templates"),
    "ClusterWorkflowTemplate": ("spec", "templates"),
    "CronWorkflow": ("spec", "workflowSpec", "templates"),
}


def find_argo_pod_specs(obj: Mapping[str, Any]) -> list[PodSpecSite]:
    """The pods an Argo workflow will run, one per ``container`` or ``script`` template.

    Argo templates are not pod specs: a template holds one main container (named ``main``), its
    ``sidecars`` and ``initContainers``, and takes volumes and pod metadata from the workflow as well.
    The pod is assembled the way the Argo controller assembles it, as far as the manifest shows
    (``podSpecPatch`` cannot be seen into). ``containerSet`` templates hold a real container list and
    are found by the generic walk.
    """
    api_version = obj.get("apiVersion")
    lists = ARGO_TEMPLATE_LISTS.get(str(obj.get("kind")))
    if lists is None or not isinstance(api_version, str) or not api_version.startswith("argoproj.io/"):
        return []
    workflow_spec = _dig(obj, lists[:-1])
    templates = workflow_spec.get(lists[-1])
    if not isinstance(templates, list):
        return []
    sites: list[PodSpecSite] = []
    for index, template in enumerate(templates):
        if not isinstance(template, Mapping):
            continue
        site = _argo_site((*lists, index), template, workflow_spec)
        if site is not None:
            sites.append(site)
    return sites


#: What Argo's executor does with a resource template's ``manifest``: ``kubectl <action> -f manifest -o json``
#: (``workflow/executor/resource.go``, ``ExecResource``). These actions create or replace the objects it holds.
ARGO_OBJECT_ACTIONS = frozenset({"create", "apply", "replace"})


@dataclass(frozen=True)
class EmbeddedManifest:
    """A manifest held as a string inside an object, whose objects a controller creates: the ``manifest`` of an Argo
    Workflows ``resource`` template. ``path`` leads to the string; ``action`` is the template's."""

    path: Path
    text: str
    action: str

    @property
    def creates_objects(self) -> bool:
        """True when the manifest is sent as objects; ``patch`` sends it as a patch of another, ``delete`` and
        ``get`` create nothing."""
        return self.action in ARGO_OBJECT_ACTIONS


def find_embedded_manifests(obj: Mapping[str, Any]) -> list[EmbeddedManifest]:
    """The ``resource`` templates' manifests of an Argo workflow (``argoproj.io`` Workflow, WorkflowTemplate,
    ClusterWorkflowTemplate, CronWorkflow), wherever a template is written (``spec.templates``, inline templates of
    steps and DAG tasks), in document order; each value once, however many aliases lead to it."""
    api_version = obj.get("apiVersion")
    if str(obj.get("kind")) not in ARGO_TEMPLATE_LISTS or not str(api_version).startswith("argoproj.io/"):
        return []
    found: list[EmbeddedManifest] = []
    seen: set[int] = set()
    stack: list[tuple[Path, Any]] = [((), obj)]
    while stack:
        path, value = stack.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        if isinstance(value, Mapping):
            resource = value.get("resource")
            if isinstance(resource, Mapping) and isinstance(resource.get("manifest"), str) and id(resource) not in seen:
                seen.add(id(resource))
                action = resource.get("action")
                found.append(EmbeddedManifest((*path, "resource", "manifest"), resource["manifest"], str(action or "")))
            children: list[tuple[PathSegment, Any]] = list(value.items())
        elif isinstance(value, list):
            children = list(enumerate(value))
        else:
            continue
        stack.extend(((*path, key), child) for key, child in reversed(children) if isinstance(child, Mapping | list))
    return found


def _dig(value: Mapping[str, Any], path: Sequence[str]) -> Mapping[str, Any]:
    for key in path:
        child = value.get(key)
        if not isinstance(child, Mapping):
            return {}
        value = child
    return value


def _argo_site(path: Path, template: Mapping[str, Any], workflow_spec: Mapping[str, Any]) -> PodSpecSite | None:
    key = "container" if isinstance(template.get("container"), Mapping) else "script"
    main = template.get(key)
    if not isinstance(main, Mapping):
        return None
    containers: list[Mapping[str, Any]] = [{**main, "name": "main"}]  # Argo names the main container "main"
    init_containers: list[Mapping[str, Any]] = []
    container_paths: dict[str, Path] = {"main": (*path, key)}
    for field_name, target in (("sidecars", containers), ("initContainers", init_containers)):
        entries = template.get(field_name)
        if not isinstance(entries, list):
            continue
        for position, entry in enumerate(entries):
            if isinstance(entry, Mapping):
                target.append(entry)
                if isinstance(entry.get("name"), str):
                    container_paths[entry["name"]] = (*path, field_name, position)
    spec: dict[str, Any] = {"containers": containers}
    if init_containers:
        spec["initContainers"] = init_containers
    volumes = [
        volume
        for source in (workflow_spec.get("volumes"), template.get("volumes"))
        if isinstance(source, list)
        for volume in source
    ]
    if volumes:
        spec["volumes"] = volumes
    for setting in ("serviceAccountName", "schedulerName", "securityContext", "hostNetwork"):
        value = template.get(setting, workflow_spec.get(setting))
        if value is not None:
            spec[setting] = value
    metadata: dict[str, Any] = {}
    for source in (_dig(workflow_spec, ("podMetadata",)), _dig(template, ("metadata",))):
        for part in ("labels", "annotations"):
            if isinstance(source.get(part), Mapping):
                metadata[part] = {**metadata.get(part, {}), **source[part]}
    return PodSpecSite(path, path, spec, metadata, container_paths)


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
    for field_name, index, container in iter_containers(spec):
        if container.get("name") == name:
            return field_name, index
    return None
