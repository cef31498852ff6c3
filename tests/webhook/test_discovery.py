"""Finding pod specs in objects (``webhook.discovery``) and locating them in YAML (``webhook.sources``)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.webhook.discovery import (
    DiscoveryError,
    EmbeddedManifest,
    PodSpecSite,
    container_index,
    find_embedded_manifests,
    find_pod_specs,
    format_path,
    is_kubernetes_object,
    iter_objects,
    object_name,
    object_namespace,
    pod_for_site,
)
from gpu_fence.webhook.sources import SourceError, is_excluded, parse_documents

CONTAINERS = [{"name": "main", "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"}]


def template(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": CONTAINERS, **spec}}


def paths(obj: Any) -> list[str]:
    return [format_path(site.path) for site in find_pod_specs(obj)]


# --- the shapes Kubernetes and its operators use ------------------------------------------------------------


def test_pod_is_found_at_the_object_itself() -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": CONTAINERS}}
    [site] = find_pod_specs(pod)
    assert site.path == ()
    assert site.spec_path == ("spec",)
    assert site.spec == pod["spec"]


def test_builtin_workloads_podtemplate_and_cronjob() -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "spec": {"replicas": 2, "template": template()}}
    podtemplate = {"apiVersion": "v1", "kind": "PodTemplate", "template": template()}
    cronjob = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template()}}},
    }
    assert paths(deployment) == ["spec.template"]
    assert paths(podtemplate) == ["template"]
    assert paths(cronjob) == ["spec.jobTemplate.spec.template"]


def test_custom_resources_with_several_templates_in_document_order() -> None:
    raycluster = {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "spec": {
            "headGroupSpec": {"template": template()},
            "workerGroupSpecs": [
                {"groupName": "a", "template": template()},
                {"groupName": "b", "template": template()},
            ],
        },
    }
    pytorchjob = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "spec": {"pytorchReplicaSpecs": {"Master": {"template": template()}, "Worker": {"template": template()}}},
    }
    assert paths(raycluster) == [
        "spec.headGroupSpec.template",
        "spec.workerGroupSpecs[0].template",
        "spec.workerGroupSpecs[1].template",
    ]
    assert paths(pytorchjob) == ["spec.pytorchReplicaSpecs.Master.template", "spec.pytorchReplicaSpecs.Worker.template"]


def test_inline_pod_spec_without_template_wrapper() -> None:
    # KServe-style: the predictor *is* a pod spec (containers directly under it).
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "spec": {"predictor": {"containers": CONTAINERS, "nodeSelector": {"gpu": "yes"}}},
    }
    [site] = find_pod_specs(isvc)
    assert site.path == site.spec_path == ("spec", "predictor")
    assert site.metadata == {}


@pytest.mark.parametrize(
    "containers",
    [
        [],  # an empty list is no pod spec
        ["main"],  # strings, not container objects
        [{"resources": {}}],  # objects with neither name nor image
        "main",
        None,
    ],
)
def test_things_that_only_look_like_pod_specs_are_ignored(containers: Any) -> None:
    assert find_pod_specs({"kind": "X", "apiVersion": "v1", "spec": {"containers": containers}}) == []
    assert find_pod_specs({"spec": {"template": {"spec": {"containers": containers}}}}) == []


def test_walk_does_not_descend_into_a_found_pod_spec() -> None:
    # A pod spec whose container happens to hold something template-shaped is still one pod spec.
    odd = template()
    odd["spec"]["containers"] = [{"name": "main", "image": "x", "extra": {"template": template()}}]
    assert paths({"spec": {"template": odd}}) == ["spec.template"]


def test_a_pod_spec_beside_the_fields_of_another_is_found() -> None:
    # KServe: an InferenceService's custom predictor (an inline pod spec) with the workers' pod spec beside its fields,
    # and a ServingRuntime whose spec is a pod spec holding the workers' one
    gpu = [{"name": "worker-container", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}]
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "spec": {"predictor": {"containers": CONTAINERS, "workerSpec": {"tensorParallelSize": 2, "containers": gpu}}},
    }
    runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": "vllm"},
        "spec": {"containers": CONTAINERS, "workerSpec": {"containers": gpu}, "volumes": []},
    }
    assert paths(isvc) == ["spec.predictor", "spec.predictor.workerSpec"]
    assert paths(runtime) == ["", "spec.workerSpec"]
    [_, worker] = find_pod_specs(runtime)
    assert worker.spec["containers"] == gpu
    assert worker.container_path("worker-container") == ("spec", "workerSpec", "containers", 0)


def test_a_pod_spec_shared_through_an_alias_is_found_as_a_template_and_inline() -> None:
    shared = {"containers": CONTAINERS}
    obj = {"spec": {"template": {"spec": shared}, "predictor": shared, "again": {"template": {"spec": shared}}}}
    assert paths(obj) == ["spec.template", "spec.predictor", "spec.again.template"]


def test_recursive_aliases_do_not_loop() -> None:
    loop: list[Any] = []
    loop.append(loop)
    looped: dict[str, Any] = {"spec": {"template": template()}}
    looped["self"] = looped
    assert find_pod_specs({"a": loop}) == []
    assert paths(looped) == ["spec.template"]


def test_alias_explosion_without_pod_specs_is_walked_once_per_value() -> None:
    # "Billion laughs": 40 levels of shared lists, 2**40 paths; each shared value is walked only once.
    level: Any = ["lol"]
    for _ in range(40):
        level = [level, level]
    assert find_pod_specs({"spec": level}, node_budget=1000) == []


def test_alias_explosion_of_pod_templates_stops_at_the_budget() -> None:
    level: Any = [template()]
    for _ in range(30):
        level = [level, level]
    with pytest.raises(DiscoveryError, match="more than 1000"):
        find_pod_specs({"spec": level}, node_budget=1000)


def test_a_template_reused_through_a_yaml_anchor_is_reported_at_each_path() -> None:
    [document] = parse_documents(
        "spec:\n  head: &tpl\n    spec:\n      containers: [{name: a, image: x}]\n  workers: [*tpl, *tpl]\n", "x"
    )
    assert paths(document.data) == ["spec.head", "spec.workers[0]", "spec.workers[1]"]


def test_deep_nesting_needs_no_recursion() -> None:
    deep: Any = template()
    expected: list[str | int] = []
    for depth in range(5000):
        key = f"k{depth % 7}"
        deep = {key: deep}
        expected.insert(0, key)
    [site] = find_pod_specs(deep)
    assert list(site.path) == expected


# --- the property: a pod spec anywhere is found, with its path ----------------------------------------------

# Keys of filler objects never spell the markers the walk looks for, so fillers hold no pod spec of their own.
_keys = st.text(alphabet="abcdefgxyz-_.0123456789", min_size=1, max_size=8)
_scalars = st.none() | st.booleans() | st.integers() | st.text(max_size=10)
_fillers = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=3),
    max_leaves=12,
)
_segments = st.lists(
    st.one_of(_keys.map(lambda k: ("key", k)), st.integers(0, 3).map(lambda i: ("index", i))), max_size=6
)


def _embed(segments: list[tuple[str, Any]], payload: Any, data: st.DataObject) -> Any:
    value = payload
    for kind, segment in reversed(segments):
        if kind == "key":
            value = {**data.draw(st.dictionaries(_keys, _fillers, max_size=3)), segment: value}
        else:
            before = data.draw(st.lists(_fillers, min_size=segment, max_size=segment))
            after = data.draw(st.lists(_fillers, max_size=2))
            value = [*before, value, *after]
    return value


@settings(max_examples=150, deadline=None)
@given(segments=_segments, inline=st.booleans(), data=st.data())
def test_a_pod_spec_nested_at_a_random_path_is_found_with_that_path(
    segments: list[tuple[str, Any]], inline: bool, data: st.DataObject
) -> None:
    payload = {"containers": CONTAINERS} if inline else template()
    obj = _embed(segments, payload, data)
    expected = tuple(segment for _, segment in segments)
    sites = find_pod_specs(obj)
    assert [site.path for site in sites] == [expected]
    assert sites[0].spec_path == (expected if inline else (*expected, "spec"))
    assert sites[0].spec["containers"] == CONTAINERS


@settings(max_examples=100, deadline=None)
@given(_fillers)
def test_objects_without_pod_specs_yield_nothing(filler: Any) -> None:
    assert find_pod_specs(filler) == []


# --- helpers around the walk --------------------------------------------------------------------------------


def test_format_path() -> None:
    assert format_path(()) == ""
    assert format_path(("spec", "workerGroupSpecs", 0, "template")) == "spec.workerGroupSpecs[0].template"
    assert format_path(("items", 3)) == "items[3]"
    assert format_path(("spec", "odd.key", "x")) == 'spec["odd.key"].x'
    assert format_path(('q"uote',)) == '["q\\"uote"]'


def test_is_kubernetes_object_and_lists() -> None:
    assert is_kubernetes_object({"apiVersion": "v1", "kind": "Pod"})
    assert not is_kubernetes_object({"kind": "Pod"})
    assert not is_kubernetes_object({"apiVersion": "v1", "kind": ""})
    assert not is_kubernetes_object(["apiVersion", "kind"])
    podlist = {
        "apiVersion": "v1",
        "kind": "PodList",
        "items": [
            {"apiVersion": "v1", "kind": "Pod"},
            {"name": "not an object"},
            {"apiVersion": "v1", "kind": "List", "items": [{"apiVersion": "apps/v1", "kind": "Deployment"}]},
        ],
    }
    found = list(iter_objects(podlist))
    assert [path for path, _ in found] == [("items", 0), ("items", 1), ("items", 2, "items", 0)]
    assert [obj["kind"] if obj else None for _, obj in found] == ["Pod", None, "Deployment"]
    # A kind ending in "List" without items is an ordinary object (e.g. a custom "AllowList" resource).
    allowlist = {"apiVersion": "example.com/v1", "kind": "AllowList", "spec": {}}
    assert list(iter_objects(allowlist)) == [((), allowlist)]


def test_namespace_and_name() -> None:
    assert object_namespace({"metadata": {"namespace": "ml"}}, "default") == "ml"
    assert object_namespace({"metadata": {"namespace": ""}}, "fallback") == "fallback"
    assert object_namespace({"metadata": None}, "fallback") == "fallback"
    assert object_name({"metadata": {"name": "a"}}) == "a"
    assert object_name({"metadata": {"generateName": "job-"}}) == "job-*"
    assert object_name({}) == ""


def test_pod_for_site_uses_template_metadata_and_owner_namespace() -> None:
    owner = {"kind": "Deployment", "metadata": {"name": "web", "namespace": "ignored-here"}}
    tpl = template()
    tpl["metadata"]["annotations"] = {"cdi.k8s.io/x": "nvidia.com/gpu=all"}
    site = PodSpecSite(("spec", "template"), ("spec", "template", "spec"), tpl["spec"], tpl["metadata"])
    pod = pod_for_site(site, owner, "team-a")
    assert pod["kind"] == "Pod"
    assert pod["metadata"] == {
        "labels": {"app": "x"},
        "annotations": tpl["metadata"]["annotations"],
        "namespace": "team-a",
        "name": "web",
    }
    assert pod["spec"] == tpl["spec"] == template()["spec"]
    assert "namespace" not in tpl["metadata"]  # the input is not modified


def test_container_index_covers_every_container_kind() -> None:
    spec = {
        "initContainers": [{"name": "init"}],
        "containers": [{"name": "a"}, {"name": "b"}],
        "ephemeralContainers": [{"name": "debug"}],
    }
    assert container_index(spec, "init") == ("initContainers", 0)
    assert container_index(spec, "b") == ("containers", 1)
    assert container_index(spec, "debug") == ("ephemeralContainers", 0)
    assert container_index(spec, "missing") is None
    assert container_index(spec, None) is None


# --- sources: documents and lines ---------------------------------------------------------------------------

STREAM = """\
# leading comment
---
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Pod
    metadata: {name: first}
  - apiVersion: v1
    kind: Pod
    metadata:
      name: second
---
---
replicaCount: 3
"""


def test_documents_start_lines_and_empty_documents_dropped() -> None:
    documents = parse_documents(STREAM, "stream.yaml")
    assert [document.line for document in documents] == [3, 15]
    assert documents[1].data == {"replicaCount": 3}
    first = documents[0]
    assert first.line_of(("items", 0)) == 6
    assert first.line_of(("items", 1)) == 9
    assert first.line_of(("items", 1, "metadata", "name")) == 12  # a mapping entry: the line of its key
    assert first.line_of(("items", 7)) == 3  # absent: the document's own line
    assert first.line_of(("nope",), 99) == 99


def test_json_with_tabs_falls_back_to_the_json_parser() -> None:
    text = '{\n\t"apiVersion": "v1",\n\t"kind": "Pod"\n}\n'
    [document] = parse_documents(text, "pod.json")
    assert document.data == {"apiVersion": "v1", "kind": "Pod"}
    assert document.line == 1


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("apiVersion: v1\nkind: Pod\nmetadata: {name: [unclosed\n", 4),
        ("a: 1\n b: 2\n", 2),
    ],
)
def test_unparseable_yaml_names_file_and_line(text: str, line: int) -> None:
    with pytest.raises(SourceError, match=rf"^bad\.yaml:{line}: YAML does not parse: "):
        parse_documents(text, "bad.yaml")


# --- Argo Workflows -----------------------------------------------------------------------------------------


def test_argo_cron_workflow_pod_is_assembled_like_the_controller_does() -> None:
    cron = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "CronWorkflow",
        "spec": {
            "schedule": "0 * * * *",
            "workflowSpec": {
                "serviceAccountName": "runner",
                "podMetadata": {"annotations": {"a": "workflow"}, "labels": {"team": "ml"}},
                "volumes": [{"name": "shared", "emptyDir": {}}],
                "templates": [
                    {"name": "dag", "dag": {"tasks": []}},
                    {
                        "name": "work",
                        "metadata": {"annotations": {"a": "template"}},
                        "container": {"name": "ignored", "image": "x"},
                        "initContainers": [{"name": "init", "image": "y"}],
                        "sidecars": [{"name": "side", "image": "z"}],
                        "volumes": [{"name": "own", "emptyDir": {}}],
                    },
                ],
            },
        },
    }
    [site] = find_pod_specs(cron)
    assert site.path == ("spec", "workflowSpec", "templates", 1)
    assert [c["name"] for c in site.spec["containers"]] == ["main", "side"]
    assert [c["name"] for c in site.spec["initContainers"]] == ["init"]
    assert [v["name"] for v in site.spec["volumes"]] == ["shared", "own"]
    assert site.spec["serviceAccountName"] == "runner"
    assert site.metadata == {"annotations": {"a": "template"}, "labels": {"team": "ml"}}
    assert site.container_path("main") == (*site.path, "container")
    assert site.container_path("init") == (*site.path, "initContainers", 0)
    assert site.container_path("side") == (*site.path, "sidecars", 0)
    assert site.container_path("nope") is None


def test_argo_container_set_is_found_by_shape_and_other_groups_are_not_argo() -> None:
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "WorkflowTemplate",
        "spec": {"templates": [{"name": "set", "containerSet": {"containers": [{"name": "a", "image": "x"}]}}]},
    }
    assert paths(workflow) == ["spec.templates[0].containerSet"]
    impostor = {
        "apiVersion": "example.com/v1",
        "kind": "Workflow",
        "spec": {"templates": [{"container": {"image": "x"}}]},
    }
    assert find_pod_specs(impostor) == []


def test_site_container_path_for_ordinary_pod_specs() -> None:
    [site] = find_pod_specs({"spec": {"template": template()}})
    assert site.container_path("main") == ("spec", "template", "spec", "containers", 0)
    assert site.container_path(None) is None


def test_argo_resource_manifests_are_found_wherever_a_template_is_written() -> None:
    pod = "apiVersion: v1\nkind: Pod\n"
    shared = {"action": "apply", "manifest": pod}
    workflow = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "CronWorkflow",
        "spec": {
            "workflowSpec": {
                "templates": [
                    {"name": "a", "resource": {"action": "create", "manifest": pod}},
                    {"name": "b", "dag": {"tasks": [{"name": "t", "inline": {"resource": shared}}]}},
                    {"name": "c", "resource": {"action": "patch", "manifest": "spec: {}"}},
                    {"name": "d", "resource": {"action": "create", "manifestFrom": {"artifact": {"name": "m"}}}},
                    {"name": "e", "resource": shared},  # the same value again (a YAML alias): once
                ]
            }
        },
    }
    found = find_embedded_manifests(workflow)
    assert found == [
        EmbeddedManifest(("spec", "workflowSpec", "templates", 0, "resource", "manifest"), pod, "create"),
        EmbeddedManifest(
            ("spec", "workflowSpec", "templates", 1, "dag", "tasks", 0, "inline", "resource", "manifest"), pod, "apply"
        ),
        EmbeddedManifest(("spec", "workflowSpec", "templates", 2, "resource", "manifest"), "spec: {}", "patch"),
    ]
    assert [manifest.creates_objects for manifest in found] == [True, True, False]


def test_resource_manifests_are_read_only_where_the_kind_says_so() -> None:
    template = {"templates": [{"resource": {"action": "create", "manifest": "kind: Pod"}}]}
    assert find_embedded_manifests({"apiVersion": "example.com/v1", "kind": "Workflow", "spec": template}) == []
    assert find_embedded_manifests({"apiVersion": "argoproj.io/v1alpha1", "kind": "Sensor", "spec": template}) == []


@pytest.mark.parametrize(
    ("path", "patterns", "excluded"),
    [
        ("deploy/charts/app/values.yaml", ["charts"], True),  # a name anywhere in the path
        ("deploy/charts.yaml", ["charts"], False),
        ("./deploy/app.tmpl.yaml", ["*.tmpl.yaml"], True),
        ("deploy/legacy/a.yaml", ["deploy/legacy"], True),  # a directory above it matches
        ("deploy/legacy", ["deploy/legacy"], True),
        ("/repo/deploy/legacy", ["deploy/legacy"], True),  # any end of the path after a /
        ("/repo/mydeploy/legacy", ["deploy/legacy"], False),
        ("deploy/a/b/old.yaml", ["deploy/*/old.yaml"], True),  # * crosses /
        ("deploy/legacy/", ["./deploy/legacy/"], True),  # both normalised
        ("deploy/app.yaml", [], False),
    ],
)
def test_exclude_globs(path: str, patterns: list[str], excluded: bool) -> None:
    assert is_excluded(path, [os.path.normpath(pattern) for pattern in patterns]) is excluded
