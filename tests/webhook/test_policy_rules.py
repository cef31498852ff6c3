"""One group per rule of webhook.policy: what triggers it, what does not, and what the message says."""

from __future__ import annotations

import pytest

from gpu_fence.vocabulary import parse_visible_devices
from gpu_fence.webhook.config import HostPathEntry, PolicyConfig, Switch
from gpu_fence.webhook.policy import RULES, Violation, evaluate, mutate, validate, validate_update
from tests.fakes.pods import (
    KAI_PREFIX,
    NVD,
    VISIBLE_DEVICES_EDGE_VALUES,
    apply_patch,
    as_kai_leaves_it,
    container,
    env,
    gpu_container,
    host_path_pod,
    kai_fraction_pod,
    kai_reference,
    pod,
)


def broken(document, config, **kwargs) -> list[tuple[str, str | None]]:
    return [(v.rule, v.container) for v in validate(document, config, **kwargs).violations]


def only_rule(document, config, rule: str) -> list[Violation]:
    return [v for v in validate(document, config).violations if v.rule == rule]


def test_rule_table_matches_the_design():
    assert [rule.id for rule in RULES] == [
        "unpinned-container",
        "visible-devices-env",
        "visible-devices-none",
        "gpu-env-from",
        "privileged",
        "sys-admin-capability",
        "added-capability",
        "host-pid",
        "device-list-mount",
        "cdi-annotation",
        "runtime-annotation",
        "host-device-path",
        "host-path",
        "mig-control-env",
        "imex-channels-env",
        "bound-gpu-pod",
        "kai-annotation-update",
        "gated-device-env",
        "volume-type",
        "host-process",
        "host-ipc",
    ]
    assert all(rule.summary and rule.vectors for rule in RULES)
    vectors = [v for rule in RULES for v in rule.vectors]
    assert len(vectors) == len(set(vectors))


# --- unpinned-container -------------------------------------------------------------------------------------------


def test_a_pinned_pod_passes(config):
    assert broken(pod(container(environment=[env(NVD, "void")])), config) == []


@pytest.mark.parametrize("field", ["containers", "initContainers", "ephemeralContainers"])
def test_every_kind_of_container_must_be_pinned(config, field):
    bare = container("bare")
    document = pod(container("main", environment=[env(NVD, "void")]))
    if field == "containers":
        document["spec"]["containers"].append(bare)
    else:
        document["spec"][field] = [bare]
    assert broken(document, config) == [("unpinned-container", "bare")]


def test_sidecar_init_container_must_be_pinned(config):
    sidecar = container("proxy", restartPolicy="Always")
    document = pod(gpu_container(), init=[sidecar])
    assert broken(document, config) == [("unpinned-container", "proxy")]


def test_none_is_an_accepted_pin(config):
    assert broken(pod(container(environment=[env(NVD, "none")])), config) == []


def test_a_gpu_container_needs_no_pin(config):
    assert broken(pod(gpu_container()), config) == []


def test_zero_gpus_is_no_request(config):
    assert broken(pod(container("zero", gpus=0)), config) == [("unpinned-container", "zero")]
    assert broken(pod(container("zero", gpus="0")), config) == [("unpinned-container", "zero")]


@pytest.mark.parametrize(
    "resource", ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
)
def test_gpu_resources_in_limits_or_requests(config, resource):
    limits = pod(container("c", gpus=1, resource=resource))
    requests = pod(container("c", resources={"requests": {resource: "1"}}))
    assert broken(limits, config) == broken(requests, config) == []


def test_amd_gpus_are_not_nvidia_gpus(config):
    assert broken(pod(container("rocm", gpus=1, resource="amd.com/gpu")), config) == [("unpinned-container", "rocm")]


def test_dra_claims_do_not_spare_the_pin(config):
    """A claim may be for any device class (a NIC, a dummy), so it is no reason to leave the container unpinned;
    NVIDIA's CDI specs set NVIDIA_VISIBLE_DEVICES=void themselves, so the pin costs a GPU claim nothing."""
    claim = container("ctr", resources={"claims": [{"name": "gpu"}]})
    document = pod(claim, resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}])
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("unpinned-container", "ctr")
    assert "DRA claims" in violation.detail and "NVIDIA_VISIBLE_DEVICES=void" in violation.detail
    decision = evaluate(document, config, namespace="default")
    assert decision.verdict == "mutated" and decision.mutation.pinned == ("ctr",)


@pytest.mark.parametrize("value", ["all", "0", "GPU-8e8b5f1c-3c1a-4d0e-9a57-2b1f2d8c9e01"])
def test_a_claim_does_not_license_a_gpu_list(config, value):
    """Before, any claim made the container a GPU container that could set any value: a NIC claim opened all GPUs."""
    nic = container("ctr", resources={"claims": [{"name": "nic"}]}, environment=[env(NVD, value)])
    document = pod(nic, resourceClaims=[{"name": "nic", "resourceClaimTemplateName": "rdma-nic"}])
    assert broken(document, config) == [("visible-devices-env", "ctr")]


def test_a_claim_beside_a_device_plugin_gpu_keeps_the_plugin_s_value(config):
    """A container with a GPU resource is the device plugin's: not pinned, whatever claims it also has."""
    both = gpu_container("ctr", resources={"limits": {"nvidia.com/gpu": 1}, "claims": [{"name": "nic"}]})
    document = pod(both, resourceClaims=[{"name": "nic", "resourceClaimTemplateName": "rdma-nic"}])
    decision = evaluate(document, config, namespace="default")
    assert decision.verdict == "allowed" and decision.mutation.patch == ()


def test_configured_gpu_resources_replace_the_defaults():
    custom = PolicyConfig(gpu_resources=("example.com/accelerator",))
    assert broken(pod(container("c", gpus=1, resource="example.com/accelerator")), custom) == []
    assert broken(pod(container("c", gpus=1)), custom) == [("unpinned-container", "c")]


def test_unreadable_env_cannot_be_pinned(config):
    document = pod(container("weird", env={"NVIDIA_VISIBLE_DEVICES": "void"}))
    [violation] = validate(document, config).violations
    assert violation.rule == "unpinned-container" and violation.container == "weird"
    assert "env that is not a list" in violation.message


@pytest.mark.parametrize("spec_field, value", [("containers", "oops"), ("initContainers", {"a": 1})])
def test_unreadable_container_lists_are_violations(config, spec_field, value):
    document = pod(container(environment=[env(NVD, "void")]))
    document["spec"][spec_field] = value
    [violation] = validate(document, config).violations
    assert violation.rule == "unpinned-container" and f"spec.{spec_field} is not a list" in violation.message


def test_container_entries_that_are_not_objects_are_violations(config):
    document = pod(container(environment=[env(NVD, "void")]))
    document["spec"]["containers"].append("busybox")
    assert broken(document, config) == [("unpinned-container", "containers[1]")]


@pytest.mark.parametrize("document", [None, [], "Pod", 7, {"kind": "Pod"}, {"spec": []}])
def test_objects_that_are_not_pods_are_rejected_with_a_reason(config, document):
    violations = validate(document, config).violations
    assert [v.rule for v in violations] == ["unpinned-container"]
    assert "pin" in violations[0].message


def test_message_names_rule_container_and_fix(config):
    [violation] = validate(pod(container("web")), config).violations
    assert violation.message.startswith('unpinned-container: container "web"')
    assert "NVIDIA_VISIBLE_DEVICES=void" in violation.message and "nvidia.com/gpu" in violation.message


# --- visible-devices-env ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", VISIBLE_DEVICES_EDGE_VALUES)
def test_every_edge_value_on_a_non_gpu_container(config, value):
    """Allowed exactly when the toolkit would expose no GPU (void/none semantics) and no $(...) is involved."""
    violations = only_rule(pod(container("c", environment=[env(NVD, value)])), config, "visible-devices-env")
    expected_ok = parse_visible_devices(value).grants_no_gpu and "$(" not in value
    assert (violations == []) is expected_ok


@pytest.mark.parametrize(
    ("value", "allowed"),
    [
        ("void", True),
        (" void ", True),
        ("0,void", True),
        ("void,0", True),
        ("", True),
        (",", True),
        ("none", True),
        ("none,all", True),
        ("VOID", False),
        ("all", False),
        (" all ", False),
        ("ALL", False),
        ("0,all", False),
        ("all,none", False),
        ("0", False),
        ("0:1", False),
        ("nvidia.com/gpu=all", False),
        ("GPU-8e8b5f1c-3c1a-4d0e-9a57-2b1f2d8c9e01", False),
        ("MIG-GPU-8e8b5f1c-3c1a-4d0e-9a57-2b1f2d8c9e01/1/0", False),
        ("/var/run/nvidia-container-devices", False),
    ],
)
def test_research_edge_cases_spelled_out(config, value, allowed):
    violations = only_rule(pod(container("c", environment=[env(NVD, value)])), config, "visible-devices-env")
    assert (violations == []) is allowed
    if not allowed:
        assert "request nvidia.com/gpu, or remove NVIDIA_VISIBLE_DEVICES" in violations[0].message


@pytest.mark.parametrize("value", ["void", "none", "all", "0", ""])
def test_any_user_value_on_a_gpu_container_is_rejected(config, value):
    document = pod(gpu_container("cuda", environment=[env(NVD, value)]))
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("visible-devices-env", "cuda")
    assert "requests a GPU" in violation.message and "remove NVIDIA_VISIBLE_DEVICES" in violation.message


@pytest.mark.parametrize(
    "source",
    [
        {"configMapKeyRef": {"name": "gpus", "key": "visible"}},
        {"secretKeyRef": {"name": "gpus", "key": "visible"}},
        {"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}},
    ],
)
@pytest.mark.parametrize("gpus", [None, 1])
def test_value_from_is_rejected(config, source, gpus):
    document = pod(container("c", gpus=gpus, environment=[env(NVD, **source)]))
    violations = only_rule(document, config, "visible-devices-env")
    assert len(violations) == 1 and "valueFrom" in violations[0].message


@pytest.mark.parametrize("value", ["$(GPUS)", "void,$(GPUS)", "$$(GPUS)"])
def test_dollar_references_are_rejected(config, value):
    document = pod(container("c", environment=[env("GPUS", "all"), env(NVD, value)]))
    violations = only_rule(document, config, "visible-devices-env")
    assert len(violations) == 1 and "$(...)" in violations[0].message


def test_non_string_value_is_rejected(config):
    document = pod(container("c", environment=[{"name": NVD, "value": 0}]))
    assert [v.rule for v in validate(document, config).violations] == ["visible-devices-env"]


def test_duplicates_are_all_judged_whatever_wins(config):
    """The kubelet keeps the last entry; a safe last entry must not hide an unsafe earlier one, and vice versa."""
    unsafe_last = pod(container("c", environment=[env(NVD, "void"), env(NVD, "all")]))
    unsafe_first = pod(container("c", environment=[env(NVD, "all"), env(NVD, "void")]))
    assert broken(unsafe_last, config) == [("visible-devices-env", "c")]
    assert broken(unsafe_first, config) == [("visible-devices-env", "c")]
    safe = pod(container("c", environment=[env(NVD, "void"), env(NVD, "none")]))
    assert broken(safe, config) == []


def test_aliases_are_judged_like_the_variable():
    aliased = PolicyConfig(visible_devices_aliases=("DOCKER_RESOURCE_GPU",))
    document = pod(container("c", environment=[env(NVD, "void"), env("DOCKER_RESOURCE_GPU", "all")]))
    assert broken(document, aliased) == [("visible-devices-env", "c")]
    assert broken(document, PolicyConfig()) == []
    void_alias = pod(container("c", environment=[env(NVD, "void"), env("DOCKER_RESOURCE_GPU", "void")]))
    assert broken(void_alias, aliased) == []
    on_gpu = pod(gpu_container("g", environment=[env("DOCKER_RESOURCE_GPU", "0")]))
    assert broken(on_gpu, aliased) == [("visible-devices-env", "g")]


def test_other_variables_are_not_this_rule(config):
    document = pod(
        container(
            "c",
            environment=[
                env(NVD, "void"),
                env("CUDA_VISIBLE_DEVICES", "0,1"),
                env("NVIDIA_DRIVER_CAPABILITIES", "all"),
            ],
        )
    )
    assert broken(document, config) == []


# --- KAI fractions ------------------------------------------------------------------------------------------------


def kai_pod(*containers, fraction_container=None, **spec):
    document = kai_fraction_pod(*containers, fraction_container=fraction_container)
    document["spec"].update(spec)
    return as_kai_leaves_it(document)


def test_kai_fraction_container_is_pinned_and_kai_replaces_the_pin(config):
    """gpu-fence pins the fraction container like any other; KAI's webhook drops that entry and appends its own,
    so the pod KAI leaves is allowed, and where KAI's webhook does not run, the container keeps the pin."""
    authored = kai_fraction_pod(container("gpu-workload"), container("sidecar"))
    decision = evaluate(authored, config, namespace="default")
    assert decision.verdict == "mutated" and decision.mutation.pinned == ("gpu-workload", "sidecar")
    after_kai = as_kai_leaves_it(apply_patch(authored, decision.mutation.patch))
    workload = after_kai["spec"]["containers"][0]
    assert [e for e in workload["env"] if e["name"] == NVD] == [kai_reference()]
    assert evaluate(after_kai, config, namespace="default").verdict == "allowed"
    # and gpu-fence called again after KAI (reinvocation) leaves KAI's entry alone
    assert evaluate(as_kai_leaves_it(authored), config, namespace="default").mutation.pinned == ("sidecar",)


def test_kai_named_fraction_container_in_either_list(config):
    regular = kai_pod(
        container("sidecar", environment=[env(NVD, "void")]), container("worker"), fraction_container="worker"
    )
    assert broken(regular, config) == []
    worker = regular["spec"]["containers"][1]
    assert kai_reference(index=1) in worker["env"]
    init = kai_fraction_pod(container("main", environment=[env(NVD, "void")]), fraction_container="loader")
    init["spec"]["initContainers"] = [container("loader")]
    after_kai = as_kai_leaves_it(init)
    assert kai_reference(index=0, init=True) in after_kai["spec"]["initContainers"][0]["env"]
    assert broken(after_kai, config) == []


def test_kai_reference_needs_a_pod_no_one_bound_at_creation(config):
    """spec.nodeName at CREATE: no KAI scheduler or binder ever sees the pod, so nothing fills the ConfigMap, and
    the pod author's ConfigMap of that name is read. KAI's webhook still adds the reference (it matches on the
    scheduler name only); gpu-fence rejects it."""
    document = kai_pod(container("gpu-workload"), nodeName="gpu-node-1")
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("visible-devices-env", "gpu-workload")
    assert "spec.nodeName" in violation.detail
    # as written, with no KAI webhook: the fraction container is pinned like any other and gets nothing
    authored = kai_fraction_pod(container("gpu-workload"))
    authored["spec"]["nodeName"] = "gpu-node-1"
    decision = evaluate(authored, config, namespace="default")
    assert decision.verdict == "mutated" and decision.mutation.pinned == ("gpu-workload",)
    empty = kai_pod(container("gpu-workload"), nodeName="")
    assert broken(empty, config) == []


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "my-gpus"},  # a ConfigMap the author owns
        {"name": f"{KAI_PREFIX}-1"},  # KAI's prefix, another container's index: the binder never fills it
        {"name": f"{KAI_PREFIX}-i0"},  # an init container's
        {"name": f"{KAI_PREFIX}-0-evar"},
        {"key": "RUNAI-VISIBLE-DEVICES"},
        {"key": None},
        {"optional": True},  # an optional reference starts the container even when no ConfigMap exists
    ],
)
def test_kai_reference_only_in_the_exact_shape_kai_writes(config, changes):
    document = kai_pod(container("gpu-workload"))
    entries = document["spec"]["containers"][0]["env"]
    entries[[e["name"] for e in entries].index(NVD)] = kai_reference(**changes)
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("visible-devices-env", "gpu-workload")
    assert "KAI's reference" in violation.detail


@pytest.mark.parametrize(
    "prefix", ["my-gpus", "trainer-AAAAAAA-shared-gpu", "trainer-aeiou12-shared-gpu", "x-shared-gpu"]
)
def test_kai_prefix_annotation_must_have_kai_s_shape(config, prefix):
    document = kai_pod(container("gpu-workload"))
    document["metadata"]["annotations"]["runai/shared-gpu-configmap"] = prefix
    entries = document["spec"]["containers"][0]["env"]
    entries[[e["name"] for e in entries].index(NVD)] = kai_reference(prefix)
    assert broken(document, config) == [("visible-devices-env", "gpu-workload")]


def test_kai_exception_is_only_kai_s_reference_on_the_fraction_container(config):
    secret = {"secretKeyRef": {"name": "s", "key": "k"}}
    document = kai_fraction_pod(container("gpu-workload", environment=[env(NVD, **secret)]))
    assert broken(document, config) == [("visible-devices-env", "gpu-workload")]
    sidecar = kai_pod(container("gpu-workload"), container("sidecar", environment=[kai_reference(index=1)]))
    assert broken(sidecar, config) == [("visible-devices-env", "sidecar")]
    literal = kai_fraction_pod(container("gpu-workload", environment=[env(NVD, "all")]))
    assert broken(literal, config) == [("visible-devices-env", "gpu-workload")]
    both = dict(kai_reference())
    both["value"] = "all"
    with_value = kai_pod(container("gpu-workload"))
    with_value["spec"]["containers"][0]["env"][0] = both
    assert broken(with_value, config) == [("visible-devices-env", "gpu-workload")]


def test_kai_annotations_need_the_kai_scheduler(config):
    document = kai_pod(container("gpu-workload"))
    document["spec"]["schedulerName"] = "default-scheduler"
    assert broken(document, config) == [("visible-devices-env", "gpu-workload")]
    document["spec"]["schedulerName"] = ["kai-scheduler"]  # not a string: no scheduler, no crash
    assert broken(document, config) == [("visible-devices-env", "gpu-workload")]


def test_kai_ephemeral_container_with_the_fraction_name_is_not_a_gpu_container(config):
    document = kai_fraction_pod(container("gpu-workload", environment=[env(NVD, "void")]), fraction_container="debug")
    document["spec"]["ephemeralContainers"] = [container("debug")]
    assert ("unpinned-container", "debug") in broken(document, config)


def test_kai_fraction_pods_get_no_runtime_class_warning(config):
    """KAI's runtimeenforcement plugin sets runtimeClassName nvidia on fraction pods: that is KAI's doing."""
    document = kai_pod(container("gpu-workload"), container("sidecar", environment=[env(NVD, "void")]))
    assert document["spec"]["runtimeClassName"] == "nvidia"
    assert validate(document, config).warnings == ()


def test_kai_fraction_container_with_aliases(config):
    """The alias would override KAI's NVIDIA_VISIBLE_DEVICES, so it is neither pinned nor allowed there; the
    sidecar gets both pins."""
    aliased = PolicyConfig(visible_devices_aliases=("DOCKER_RESOURCE_GPU",))
    authored = kai_fraction_pod(container("gpu-workload"), container("sidecar"))
    decision = evaluate(authored, aliased, namespace="default")
    patched = apply_patch(authored, decision.mutation.patch)
    assert patched["spec"]["containers"][0]["env"] == [env(NVD, "void")]
    assert patched["spec"]["containers"][1]["env"] == [env(NVD, "void"), env("DOCKER_RESOURCE_GPU", "void")]
    after_kai = as_kai_leaves_it(patched)
    assert broken(after_kai, aliased) == []
    after_kai["spec"]["containers"][0]["env"].append(env("DOCKER_RESOURCE_GPU", "void"))
    [violation] = validate(after_kai, aliased).violations
    assert violation.rule == "visible-devices-env" and "instead of KAI's value" in violation.detail


# --- privileged / sys-admin-capability ----------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [None, 1])
def test_privileged_is_rejected_on_gpu_and_non_gpu_containers(config, gpus):
    environment = None if gpus else [env(NVD, "void")]
    document = pod(container("c", gpus=gpus, environment=environment, securityContext={"privileged": True}))
    assert broken(document, config) == [("privileged", "c")]


def test_unprivileged_is_fine(config):
    document = pod(gpu_container("c", securityContext={"privileged": False, "runAsNonRoot": True}))
    assert broken(document, config) == []


@pytest.mark.parametrize("capability", ["SYS_ADMIN", "ALL", "CAP_SYS_ADMIN", "sys_admin", "all", "cap_sys_admin"])
def test_sys_admin_and_all_capabilities(config, capability):
    document = pod(gpu_container("c", securityContext={"capabilities": {"add": ["NET_BIND_SERVICE", capability]}}))
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("sys-admin-capability", "c")
    assert capability in violation.message


def test_dropping_sys_admin_is_fine(config):
    document = pod(
        gpu_container(
            "c", securityContext={"capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL", "SYS_ADMIN"]}}
        )
    )
    assert broken(document, config) == []


# --- device-list-mount --------------------------------------------------------------------------------------------

DEVICE_LIST_MOUNTS = [
    "/var/run/nvidia-container-devices/all",
    "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/all",
    "/var/run/nvidia-container-devicesall",
    "/var/run/../var/run/nvidia-container-devices/0",
    "/run/nvidia-container-devices/all",
    "/var/run/nvidia-container-devices",
    "//var/run/nvidia-container-devices/all",
    "/var/./run//nvidia-container-devices/GPU-1",
    "/tmp/../run/nvidia-container-devices/0",
    "/var/run/nvidia-container-devices/imex/0",
    "/var/run/../run/nvidia-container-devices/0",
    "/data/var/run/nvidia-container-devices/all",
    "var/run/nvidia-container-devices/all",
]


@pytest.mark.parametrize("mount_path", DEVICE_LIST_MOUNTS)
def test_device_list_mounts(config, mount_path):
    document = pod(
        gpu_container("c", volumeMounts=[{"name": "null", "mountPath": mount_path}]),
        volumes=[{"name": "null", "emptyDir": {}}],
    )
    assert broken(document, config) == [("device-list-mount", "c")]


@pytest.mark.parametrize(
    "mount_path",
    [
        "/var/run/nvidia-container",
        "/var/run/nvidia",
        "/run/nvidia-container-device",
        "/var/run/secrets/token",
        "/nvidia-container-device",
    ],
)
def test_other_mounts_are_fine(config, mount_path):
    document = pod(
        gpu_container("c", volumeMounts=[{"name": "v", "mountPath": mount_path}]),
        volumes=[{"name": "v", "emptyDir": {}}],
    )
    assert broken(document, config) == []


# --- cdi-annotation -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "cdi.k8s.io/device-plugin_abc",
        "nvidia.cdi.k8s.io/pod",
        "nvidia.cdi.k8s.io",
        "nvidia.cdi.k8s.io/container.app",
        "nvidia.cdi.k8s.ioextra",
    ],
)
def test_cdi_annotations(config, key):
    document = pod(gpu_container(), annotations={key: "nvidia.com/gpu=all"})
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("cdi-annotation", None)
    assert key in violation.message


@pytest.mark.parametrize("key", ["cdi.k8s.io", "example.com/cdi.k8s.io", "nvidia.com/gpu.present", "gpu-fraction"])
def test_other_annotations_are_fine(config, key):
    assert broken(pod(gpu_container(), annotations={key: "x"}), config) == []


def test_update_judges_the_cdi_annotations_it_adds_or_changes(config):
    before = pod(container(), annotations={"cdi.k8s.io/old": "nvidia.com/gpu=0", "team": "a"})
    after = pod(
        container(),
        annotations={
            "cdi.k8s.io/old": "nvidia.com/gpu=0",
            "team": "b",
            "nvidia.cdi.k8s.io/container.app": "nvidia.com/gpu=all",
        },
    )
    [violation] = validate_update(after, before, config).violations
    assert violation.rule == "cdi-annotation" and "nvidia.cdi.k8s.io/container.app" in violation.message
    changed = pod(container(), annotations={"cdi.k8s.io/old": "nvidia.com/gpu=all"})
    assert [v.rule for v in validate_update(changed, before, config).violations] == ["cdi-annotation"]
    # unchanged annotations and the (immutable) containers are not judged again: the pod is unpinned here
    assert validate_update(before, before, config).violations == ()
    for garbage in (None, [], "x", {"metadata": []}, {"metadata": {"annotations": ["x"]}}):
        assert validate_update(garbage, before, config).violations == ()
        assert [v.rule for v in validate_update(after, garbage, config).violations] == ["cdi-annotation"] * 2


# --- host-device-path ---------------------------------------------------------------------------------------------

REJECTED_HOST_PATHS = [
    "/",
    "//",
    "/dev",
    "/dev/",
    "/dev/nvidia0",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/dri",
    "/dev/dri/renderD128",
    "/dev/char",
    "/dev/char/195:0",
    "/etc",
    "/etc/cdi",
    "/etc/cdi/nvidia.yaml",
    "/var/run/cdi",
    "/run/cdi",
    "/run",
    "/run/nvidia",
    "/run/nvidia/driver",
    "/var/run/nvidia",
    "/var",
    "/var/lib/kubelet",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/pods",
    "/var/lib/kubelet/plugins/gpu.nvidia.com",
    "/var/lib/kubelet/plugins_registry",
    "/var/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/tmp/../dev",
    "/dev/shm/../nvidia0",
    "/./etc//cdi/",
    "dev",
    # the node through procfs and sysfs, the kubelet's static pods, the toolkit, the runtime
    "/proc",
    "/proc/1/root",
    "/proc/self/root/etc",
    "/proc/42/cwd",
    "/proc/sys",
    "/sys",
    "/sys/fs/cgroup",
    "/sys/fs/cgroup/kubepods.slice",
    "/etc/kubernetes/manifests",
    "/etc/nvidia-container-runtime",
    "/etc/nvidia-container-runtime/config.toml",
    "/usr/local/nvidia",
    "/usr/local/nvidia/toolkit/nvidia-container-runtime",
    "/usr",
    "/usr/local",
    "/etc/containerd",
    "/etc/containerd/config.toml",
    "/etc/crio",
    "/var/lib/containerd",
    "/var/lib/containers/storage",
]
NOT_DEVICE_PATHS = [
    "/devices",
    "/dev/shm",
    "/dev/fuse",
    "/dev/log",
    "/dev/infiniband",
    "/data",
    "/etc/os-release",
    "/var/log",
    "/run/nvidia-fabricmanager",
    "/etc/cdi-backup",
    "/opt/nvidia",
    "/procfs",
    "/system",
    "/tmp/nvidia-mps",
]


@pytest.mark.parametrize("path", REJECTED_HOST_PATHS)
def test_host_paths_reaching_devices(config, path):
    [violation] = only_rule(host_path_pod(path), config, "host-device-path")
    assert violation.container is None and '"host"' in violation.message
    assert only_rule(host_path_pod(path), config, "host-path") == []  # one violation per volume, the specific one


@pytest.mark.parametrize("path", NOT_DEVICE_PATHS)
def test_every_other_host_path_needs_an_allowlist_entry(config, path):
    assert only_rule(host_path_pod(path), config, "host-device-path") == []
    [violation] = only_rule(host_path_pod(path), config, "host-path")
    assert violation.container is None and "not on the hostPath allowlist" in violation.message


def test_extra_host_device_paths():
    custom = PolicyConfig(extra_host_device_paths=("/opt/nvidia",))
    assert only_rule(host_path_pod("/opt/nvidia/bin"), custom, "host-device-path")
    assert only_rule(host_path_pod("/opt"), custom, "host-device-path")


RDMA = PolicyConfig(
    host_path_allowlist=(HostPathEntry("/dev/infiniband"), HostPathEntry("/srv/scratch", writable=True))
)


def read_only_host_path_pod(path, *, read_only):
    document = host_path_pod(path)
    document["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = read_only
    return document


def test_an_allowlisted_read_only_entry_admits_read_only_mounts_only():
    assert broken(read_only_host_path_pod("/dev/infiniband", read_only=True), RDMA) == [("unpinned-container", "app")]
    for writable in (host_path_pod("/dev/infiniband"), read_only_host_path_pod("/dev/infiniband", read_only=False)):
        [violation] = only_rule(writable, RDMA, "host-path")
        assert "writable" in violation.message and "readOnly: true" in violation.message


def test_a_writable_entry_admits_writable_mounts():
    assert only_rule(host_path_pod("/srv/scratch"), RDMA, "host-path") == []
    assert only_rule(read_only_host_path_pod("/srv/scratch", read_only=True), RDMA, "host-path") == []


@pytest.mark.parametrize("path", ["/dev/infiniband/uverbs0", "/srv/scratch/link", "/srv", "/dev/infiniband2"])
def test_an_entry_admits_exactly_its_path(path):
    """Not its sub-paths: a sub-path is where a symlink planted through a writable mount points the runtime (which
    resolves hostPath sources on the host) to anywhere on the node. Not its parents either."""
    assert only_rule(read_only_host_path_pod(path, read_only=True), RDMA, "host-path")


@pytest.mark.parametrize("path", ["/dev/infiniband/", "//dev/infiniband", "/dev/./infiniband", "/dev/x/../infiniband"])
def test_entries_match_the_cleaned_path(path):
    assert only_rule(read_only_host_path_pod(path, read_only=True), RDMA, "host-path") == []


def test_every_container_mounting_the_volume_must_be_read_only():
    document = read_only_host_path_pod("/dev/infiniband", read_only=True)
    document["spec"]["initContainers"] = [
        container("init", environment=[env(NVD, "void")], volumeMounts=[{"name": "host", "mountPath": "/ib"}])
    ]
    assert [v.rule for v in validate(document, RDMA).violations if v.rule != "unpinned-container"] == ["host-path"]
    document["spec"]["initContainers"][0]["volumeMounts"][0]["readOnly"] = True
    assert only_rule(document, RDMA, "host-path") == []
    unmounted = pod(
        container(environment=[env(NVD, "void")]), volumes=[{"name": "h", "hostPath": {"path": "/dev/infiniband"}}]
    )
    assert broken(unmounted, RDMA) == []  # a volume no container mounts is written by none


def test_debug_containers_are_judged_on_the_host_paths_they_mount():
    document = read_only_host_path_pod("/dev/infiniband", read_only=True)
    document["spec"]["volumes"].append({"name": "data", "hostPath": {"path": "/data"}})
    document["spec"]["ephemeralContainers"] = [
        container("quiet", environment=[env(NVD, "void")]),
        container("rw", environment=[env(NVD, "void")], volumeMounts=[{"name": "host", "mountPath": "/ib"}]),
        container(
            "data", environment=[env(NVD, "void")], volumeMounts=[{"name": "data", "mountPath": "/d", "readOnly": True}]
        ),
    ]
    assert broken(document, RDMA, only={"quiet"}) == []
    assert broken(document, RDMA, only={"rw"}) == [("host-path", None)]
    assert broken(document, RDMA, only={"data"}) == [("host-path", None)]


# --- added-capability / host-pid ----------------------------------------------------------------------------------

#: Every Linux capability (capabilities(7), linux include/uapi/linux/capability.h, 0 to 40), written out here rather
#: than imported, each on the side docs/policy.md puts it: those that act only on the pod's own files, processes,
#: namespaces and limits, and those that reach a device, the host's files, other processes or kernel state.
WITHIN_THE_POD = (
    "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID", "SETPCAP", "NET_BIND_SERVICE",
    "NET_BROADCAST", "NET_ADMIN", "NET_RAW", "IPC_LOCK", "IPC_OWNER", "SYS_CHROOT", "SYS_PTRACE", "SYS_NICE",
    "SYS_RESOURCE", "MKNOD", "LEASE", "AUDIT_WRITE", "SETFCAP", "CHECKPOINT_RESTORE",
)  # fmt: skip
REACHING = (
    "DAC_READ_SEARCH", "LINUX_IMMUTABLE", "SYS_MODULE", "SYS_RAWIO", "SYS_PACCT", "SYS_BOOT", "SYS_TIME",
    "SYS_TTY_CONFIG", "AUDIT_CONTROL", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG", "WAKE_ALARM", "BLOCK_SUSPEND",
    "AUDIT_READ", "PERFMON", "BPF",
)  # fmt: skip


def caps(*added: str) -> dict:
    return {"capabilities": {"add": list(added)}}


def test_the_two_lists_cover_every_linux_capability_once():
    assert len(WITHIN_THE_POD) + len(REACHING) + 1 == 41  # SYS_ADMIN is sys-admin-capability's
    assert not set(WITHIN_THE_POD) & set(REACHING) and "SYS_ADMIN" not in WITHIN_THE_POD + REACHING


@pytest.mark.parametrize("capability", [*REACHING, "cap_sys_module", "bpf", "MADE_UP"])
def test_capabilities_that_reach_past_the_pod_are_rejected(config, capability):
    document = pod(gpu_container("c", securityContext=caps("CHOWN", capability)))
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("added-capability", "c")
    assert capability in violation.message and "CHOWN" not in violation.message
    assert f'remove "{capability}" from securityContext.capabilities.add' in violation.fix


@pytest.mark.parametrize("capability", [*WITHIN_THE_POD, "ipc_lock", "CAP_NET_ADMIN", "cap_sys_nice"])
@pytest.mark.parametrize("gpus", [True, False])
def test_capabilities_within_the_pod_are_allowed(config, capability, gpus):
    body = gpu_container("c") if gpus else container("c", environment=[env(NVD, "void")])
    body["securityContext"] = {"capabilities": {"add": [capability], "drop": ["ALL"]}}
    assert broken(pod(body), config) == []


def test_one_violation_per_container_names_every_unlisted_capability(config):
    document = pod(gpu_container("c", securityContext=caps("SYS_TIME", "BPF", "SYS_ADMIN", "SYS_NICE")))
    assert broken(document, config) == [("sys-admin-capability", "c"), ("added-capability", "c")]
    [violation] = [v for v in validate(document, config).violations if v.rule == "added-capability"]
    assert '"SYS_TIME", "BPF"' in violation.message and "SYS_ADMIN" not in violation.message
    assert "SYS_NICE" not in violation.message


@pytest.mark.parametrize("capability", ["NET_ADMIN", "NET_RAW", "cap_net_raw"])
@pytest.mark.parametrize("gpus", [True, False])
def test_network_capabilities_with_host_network_reach_the_node(config, capability, gpus):
    body = gpu_container("c") if gpus else container("c", environment=[env(NVD, "void")])
    body["securityContext"] = caps(capability)
    [violation] = validate(pod(body, hostNetwork=True), config).violations
    assert (violation.rule, violation.container) == ("added-capability", "c")
    assert "node's network namespace" in violation.what and "drop hostNetwork" in violation.fix
    assert broken(pod(body, hostNetwork=False), config) == []
    assert broken(pod(body), config) == []


def test_host_network_alone_and_capabilities_that_stay_in_the_pod_are_allowed(config):
    """Multi-node NCCL: hostNetwork with IPC_LOCK and SYS_RESOURCE (locked buffers), SYS_NICE (NUMA)."""
    body = gpu_container("trainer", gpus=8, securityContext=caps("IPC_LOCK", "SYS_RESOURCE", "SYS_NICE"))
    assert broken(pod(body, hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet"), config) == []


def shared(*containers: dict, **spec) -> dict:
    return pod(*containers, shareProcessNamespace=True, **spec)


def debugger(name: str = "debugger", **fields) -> dict:
    return container(name, environment=[env(NVD, "void")], securityContext=caps("SYS_PTRACE"), **fields)


def test_ptrace_in_a_process_namespace_shared_with_a_gpu_container_is_rejected(config):
    document = shared(gpu_container("trainer"), debugger())
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("added-capability", "debugger")
    assert "shareProcessNamespace" in violation.fix
    assert broken(pod(gpu_container("trainer"), debugger()), config) == []  # its own PID namespace: allowed


def test_ptrace_in_a_shared_process_namespace_without_another_gpu_container_is_allowed(config):
    assert broken(shared(container("web", environment=[env(NVD, "void")]), debugger()), config) == []
    profiler = gpu_container("trainer", securityContext=caps("SYS_PTRACE"))
    assert broken(shared(profiler, container("log", environment=[env(NVD, "void")])), config) == []


@pytest.mark.parametrize(
    "sibling",
    [
        container("claims", environment=[env(NVD, "void")], resources={"claims": [{"name": "gpu"}]}),
        gpu_container("init-gpu"),
    ],
    ids=["dra-claim", "gpu-init-container"],
)
def test_any_container_that_gets_a_gpu_counts_as_a_gpu_sibling(config, sibling):
    document = shared(debugger(), init=[sibling]) if sibling["name"] == "init-gpu" else shared(sibling, debugger())
    assert ("added-capability", "debugger") in broken(document, config)


def test_ptrace_next_to_kai_fraction_container_is_rejected(config):
    document = kai_fraction_pod()
    document["spec"]["shareProcessNamespace"] = True
    document["spec"]["containers"].append(debugger())
    assert ("added-capability", "debugger") in broken(apply_patch(document, []), config)


def test_a_debug_container_that_targets_a_gpu_container_may_not_ptrace_it(config):
    document = pod(gpu_container("trainer"), container("web", environment=[env(NVD, "void")]))
    document["spec"]["ephemeralContainers"] = [
        debugger("debug-gpu", targetContainerName="trainer"),
        debugger("debug-web", targetContainerName="web"),
        debugger("debug-alone"),
    ]
    assert broken(document, config, only={"debug-gpu"}) == [("added-capability", "debug-gpu")]
    assert broken(document, config, only={"debug-web"}) == []
    assert broken(document, config, only={"debug-alone"}) == []


def test_a_debug_container_in_a_host_network_pod_may_not_add_net_admin(config):
    document = pod(gpu_container("trainer"), hostNetwork=True)
    document["spec"]["ephemeralContainers"] = [
        container("debug", environment=[env(NVD, "void")], securityContext=caps("NET_ADMIN"))
    ]
    assert broken(document, config, only={"debug"}) == [("added-capability", "debug")]


def test_mesh_init_containers_are_allowed(config):
    """istio-init and linkerd-init add NET_ADMIN and NET_RAW in the pod's own network namespace."""
    istio = container(
        "istio-init", image="docker.io/istio/proxyv2:1.24.2", securityContext=caps("NET_ADMIN", "NET_RAW")
    )
    linkerd = container(
        "linkerd-init", image="cr.l5d.io/linkerd/proxy-init:v2.4.1", securityContext=caps("NET_ADMIN", "NET_RAW")
    )
    for init in (istio, linkerd):
        decision = evaluate(pod(gpu_container("model"), init=[init]), config, namespace="serving")
        assert decision.verdict == "mutated" and decision.validation.violations == ()


def test_the_capability_allowlist_is_configurable_and_the_rejection_names_the_mesh_setting():
    strict = PolicyConfig(allowed_capabilities=("CHOWN",))
    init = container("istio-init", image="docker.io/istio/proxyv2:1.24.2", securityContext=caps("NET_ADMIN", "NET_RAW"))
    [violation] = evaluate(pod(gpu_container(), init=[init]), strict, namespace="shop").validation.violations
    assert violation.rule == "added-capability" and violation.fix == ""
    assert "components.cni.enabled=true" in violation.way_out and "Istio CNI" in violation.message
    widened = PolicyConfig(allowed_capabilities=("SYS_TIME",))
    assert broken(pod(gpu_container(securityContext=caps("SYS_TIME"))), widened) == []


@pytest.mark.parametrize("flag", [True, "true"])
def test_host_pid_is_rejected(config, flag):
    document = pod(gpu_container(), hostPID=flag)
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("host-pid", None) and "hostPID" in violation.message


def test_ptrace_with_host_pid_is_host_pids(config):
    document = pod(gpu_container(securityContext=caps("SYS_PTRACE")), hostPID=True)
    assert broken(document, config) == [("host-pid", None)]


def test_multi_node_training_keeps_host_network_ipc_lock_and_a_memory_backed_dev_shm(config):
    """NCCL over RDMA: hostNetwork, IPC_LOCK to pin memory, /dev/shm as a memory emptyDir; none of them reach GPUs."""
    worker = gpu_container(
        "trainer",
        gpus=8,
        securityContext={"capabilities": {"add": ["IPC_LOCK"]}},
        volumeMounts=[{"name": "dshm", "mountPath": "/dev/shm"}],
    )
    document = pod(
        worker,
        hostNetwork=True,
        dnsPolicy="ClusterFirstWithHostNet",
        hostPID=False,
        volumes=[{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}],
    )
    decision = evaluate(document, config, namespace="default")
    assert decision.verdict == "allowed" and decision.validation.warnings == ()


# --- runtime-annotation -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "key",
    [
        "io.kubernetes.cri-o.Devices",
        "devices.crio.io",
        "devices.crio.io/app",
        "devices.noderesource.dev/container.app",
        "devices.noderesource.dev/pod",
        "devices.noderesource.dev",
        "devices.nri.io/container.app",
        "cdi-devices.noderesource.dev/pod",
        "cdi-devices.nri.io",
        "mounts.noderesource.dev/container.app",
        "mounts.nri.io/pod",
    ],
)
def test_runtime_device_and_mount_annotations(config, key):
    document = pod(gpu_container(), annotations={key: "- path: /dev/nvidia0\n  type: c\n  major: 195\n  minor: 0"})
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("runtime-annotation", None) and key in violation.message


@pytest.mark.parametrize(
    "key", ["io.kubernetes.cri-o.userns-mode", "example.com/devices.crio.io", "sysctl.noderesource.dev/pod"]
)
def test_other_runtime_annotations_are_not_this_rule(config, key):
    assert broken(pod(gpu_container(), annotations={key: "x"}), config) == []


def test_forbidden_annotation_prefixes_are_configurable():
    custom = PolicyConfig(forbidden_annotation_prefixes=("example.com/devices",))
    assert broken(pod(gpu_container(), annotations={"example.com/devices": "/dev/nvidia0"}), custom) == [
        ("runtime-annotation", None)
    ]
    assert broken(pod(gpu_container(), annotations={"devices.crio.io": "/dev/nvidia0"}), custom) == []
    # the CDI prefixes are not part of the list: they stay cdi-annotation's
    assert broken(pod(gpu_container(), annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"}), custom) == [
        ("cdi-annotation", None)
    ]


def test_update_judges_the_runtime_annotations_it_adds_or_changes(config):
    before = pod(container(), annotations={"devices.crio.io": "/dev/fuse"})
    after = pod(container(), annotations={"devices.crio.io": "/dev/nvidia0", "mounts.nri.io/pod": "x"})
    assert sorted(v.rule for v in validate_update(after, before, config).violations) == ["runtime-annotation"] * 2
    assert validate_update(before, before, config).violations == ()


# --- mig-control-env ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"])
def test_mig_control_variables(config, name):
    document = pod(gpu_container("c", environment=[env(name, "all")]))
    assert broken(document, config) == [("mig-control-env", "c")]
    from_config_map = pod(gpu_container("c", environment=[env(name, configMapKeyRef={"name": "m", "key": "k"})]))
    assert broken(from_config_map, config) == [("mig-control-env", "c")]


# --- imex-channels-env --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [None, 1])
def test_imex_channels_set_in_the_pod(config, gpus):
    environment = (
        [env(NVD, "void"), env("NVIDIA_IMEX_CHANNELS", "0")] if gpus is None else [env("NVIDIA_IMEX_CHANNELS", "all")]
    )
    document = pod(container("c", gpus=gpus, environment=environment))
    assert broken(document, config) == [("imex-channels-env", "c")]
    by_reference = pod(
        gpu_container("c", environment=[env("NVIDIA_IMEX_CHANNELS", configMapKeyRef={"name": "m", "key": "k"})])
    )
    assert broken(by_reference, config) == [("imex-channels-env", "c")]


# --- aliases --------------------------------------------------------------------------------------------------------

ALIASED = PolicyConfig(visible_devices_aliases=("DOCKER_RESOURCE_GPU",))


def test_aliases_are_pinned_beside_the_variable():
    """The toolkit reads a present alias instead of NVIDIA_VISIBLE_DEVICES (cuda_image.go visibleEnvVars): a
    pin of the variable alone would be ignored when the image sets the alias."""
    document = pod(container("web"), container("half", environment=[env(NVD, "void")]), gpu_container("cuda"))
    decision = evaluate(document, ALIASED, namespace="default")
    assert decision.verdict == "mutated" and decision.mutation.pinned == ("web", "half")
    patched = apply_patch(document, decision.mutation.patch)
    pins = [env(NVD, "void"), env("DOCKER_RESOURCE_GPU", "void")]
    assert patched["spec"]["containers"][0]["env"] == pins
    assert patched["spec"]["containers"][1]["env"] == pins
    assert "env" not in patched["spec"]["containers"][2]
    [violation] = validate(document, ALIASED).violations[1:]
    assert violation.rule == "unpinned-container" and "DOCKER_RESOURCE_GPU" in violation.detail


# --- warnings -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime_class", ["nvidia", "nvidia-cdi", "nvidia-legacy"])
def test_nvidia_runtime_class_on_a_pod_without_gpu_warns(config, runtime_class):
    document = pod(container(environment=[env(NVD, "void")]), runtimeClassName=runtime_class)
    result = validate(document, config)
    assert result.violations == () and len(result.warnings) == 1
    assert result.warnings[0].rule == "nvidia-runtime-class" and runtime_class in result.warnings[0].message


def test_nvidia_runtime_class_on_a_gpu_pod_is_quiet(config):
    assert validate(pod(gpu_container(), runtimeClassName="nvidia"), config).warnings == ()


def test_gpu_container_with_env_from_warns(config):
    document = pod(gpu_container("cuda", envFrom=[{"configMapRef": {"name": "settings"}}]))
    [warning] = validate(document, config).warnings
    assert (warning.rule, warning.container) == ("gpu-env-from", "cuda") and "envFrom" in warning.message
    assert validate(document, config).violations == ()


def test_gpu_container_with_env_from_is_rejected_when_configured():
    strict = PolicyConfig(env_from_on_gpu_containers=Switch.REJECT)
    document = pod(gpu_container("cuda", envFrom=[{"configMapRef": {"name": "settings"}}]))
    result = validate(document, strict)
    assert [(v.rule, v.container) for v in result.violations] == [("gpu-env-from", "cuda")]
    assert result.warnings == ()
    assert validate(pod(gpu_container("cuda", envFrom=[])), strict).violations == ()


@pytest.mark.parametrize("switch", list(Switch))
def test_env_from_on_pinned_containers_is_covered_by_the_pins(switch):
    """An explicit env entry wins over envFrom, and every name is pinned explicitly: no warning, no rejection."""
    for config in (
        PolicyConfig(env_from_on_gpu_containers=switch),
        PolicyConfig(env_from_on_gpu_containers=switch, visible_devices_aliases=("DOCKER_RESOURCE_GPU",)),
    ):
        pinned = [env(name, "void") for name in config.pin_names]
        document = pod(container(environment=pinned, envFrom=[{"configMapRef": {"name": "s"}}]))
        assert validate(document, config) == validate(pod(container(environment=pinned)), config)


@pytest.mark.parametrize("switch", list(Switch))
def test_kai_s_own_env_from_is_judged_only_where_an_alias_could_hide_in_it(switch):
    document = as_kai_leaves_it(kai_fraction_pod(container("gpu-workload")))
    plain = PolicyConfig(env_from_on_gpu_containers=switch)
    assert validate(document, plain).violations == validate(document, plain).warnings == ()
    aliased = PolicyConfig(env_from_on_gpu_containers=switch, visible_devices_aliases=("DOCKER_RESOURCE_GPU",))
    assert validate(document, aliased).violations == validate(document, aliased).warnings == ()  # KAI's own -evar
    document["spec"]["containers"][0]["envFrom"].append({"secretRef": {"name": "mine"}})
    result = validate(document, aliased)
    found = [v.rule for v in result.violations] if switch is Switch.REJECT else result.warnings
    assert len(found) == 1 and (switch is Switch.WARN or found == ["gpu-env-from"])


@pytest.mark.parametrize("value", ["none", " none ", "none,all", "0,none"])
def test_none_warns_by_default_and_names_the_fix(config, value):
    document = pod(container("app", environment=[env(NVD, value)]))
    result = validate(document, config)
    assert result.violations == ()
    [warning] = result.warnings
    assert (warning.rule, warning.container) == ("visible-devices-none", "app")
    assert "none" in warning.message and "void" in warning.message and "1.18" in warning.message
    assert warning.advice == 'visible-devices-none: container "app": use void'


@pytest.mark.parametrize("value", ["void", "", "none,void", "all,none"])
def test_none_warning_only_where_the_toolkit_reads_none(config, value):
    assert validate(pod(container("app", environment=[env(NVD, value)])), config).warnings == ()


def test_none_is_rejected_when_configured():
    strict = PolicyConfig(visible_devices_none=Switch.REJECT)
    result = validate(pod(container("app", environment=[env(NVD, "none")])), strict)
    assert [(v.rule, v.container) for v in result.violations] == [("visible-devices-none", "app")]
    assert "void" in result.violations[0].detail and result.warnings == ()
    aliased = PolicyConfig(visible_devices_none=Switch.REJECT, visible_devices_aliases=("DOCKER_RESOURCE_GPU",))
    alias_none = pod(container("app", environment=[env(NVD, "void"), env("DOCKER_RESOURCE_GPU", "none")]))
    assert broken(alias_none, aliased) == [("visible-devices-none", "app")]
    # a GPU container's value is visible-devices-env's, whatever it is
    assert broken(pod(gpu_container("g", environment=[env(NVD, "none")])), strict) == [("visible-devices-env", "g")]


def test_warnings_name_long_containers_clipped_and_carry_their_rule(config):
    long_name = "c" * 300
    document = pod(
        gpu_container(long_name, envFrom=[{"secretRef": {"name": "s"}}]),
        container("d" * 300, environment=[env(NVD, "none")]),
        runtimeClassName="nvidia",
    )
    document["spec"]["containers"][0]["resources"] = {}
    warnings = validate(document, config).warnings
    assert [warning.rule for warning in warnings] == ["visible-devices-none", "nvidia-runtime-class"]
    assert all(len(warning.advice) <= 120 for warning in warnings[:1])  # the envelope splits longer ones
    assert "d" * 63 not in warnings[0].message
    document["spec"]["containers"][0] = gpu_container(long_name, envFrom=[{"secretRef": {"name": "s"}}])
    rules = [warning.rule for warning in validate(document, config).warnings]
    assert rules == ["gpu-env-from", "visible-devices-none"]  # a GPU pod: no runtime class warning


# --- only (pods/ephemeralcontainers UPDATE) -----------------------------------------------------------------------


def test_only_judges_the_named_ephemeral_containers(config):
    document = pod(
        container("old", securityContext={"privileged": True}),
        ephemeral=[container("debugger"), container("earlier", environment=[env(NVD, "all")])],
        annotations={"nvidia.cdi.k8s.io/pod": "nvidia.com/gpu=all"},
        runtimeClassName="nvidia",
    )
    result = validate(document, config, only={"debugger"})
    assert [(v.rule, v.container) for v in result.violations] == [("unpinned-container", "debugger")]
    assert result.warnings == ()


def test_only_judges_host_paths_the_new_container_mounts(config):
    document = host_path_pod("/dev")
    document["spec"]["ephemeralContainers"] = [
        container("quiet", environment=[env(NVD, "void")]),
        container("nosy", environment=[env(NVD, "void")], volumeMounts=[{"name": "host", "mountPath": "/h"}]),
    ]
    assert broken(document, config, only={"quiet"}) == []
    assert broken(document, config, only={"nosy"}) == [("host-device-path", None)]


def test_the_new_rules_skip_what_an_ephemeral_update_cannot_change(config):
    document = pod(
        container("app", environment=[env(NVD, "void")]),
        gpu_container("cuda"),
        hostPID=True,
        hostIPC=True,
        nodeName="gpu-node-1",
        securityContext={"windowsOptions": {"hostProcess": True}},
        annotations={"devices.crio.io": "/dev/nvidia0"},
        volumes=[{"name": "repo", "gitRepo": {"repository": "https://example.com/r.git"}}],
        ephemeral=[container("debugger", environment=[env(NVD, "void")])],
    )
    assert broken(document, config, only={"debugger"}) == []


def test_validation_rule_ids_in_table_order(config):
    document = pod(
        container("c", securityContext={"privileged": True}), annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"}
    )
    assert validate(document, config).rule_ids == ("unpinned-container", "privileged", "cdi-annotation")


# --- bound-gpu-pod ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "resource", ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
)
def test_a_gpu_pod_created_with_node_name_is_rejected(config, resource):
    """The scheduler's fit is skipped; a node that does not advertise the resource runs the container with no
    allocation (the kubelet drops unadvertised extended resources, no device plugin allocates them)."""
    document = pod(gpu_container("cuda", resource=resource), container("sidecar"), nodeName="gpu-node-1")
    assert broken(document, config) == [("unpinned-container", "sidecar"), ("bound-gpu-pod", None)]
    [violation] = only_rule(document, config, "bound-gpu-pod")
    assert '"cuda"' in violation.detail and "kubernetes.io/hostname" in violation.detail
    decision = evaluate(document, config, namespace="default")
    assert decision.verdict == "rejected" and decision.validation.rule_ids == ("bound-gpu-pod",)


def test_a_bound_pod_names_every_gpu_container_init_included(config):
    document = pod(
        gpu_container("train"), init=[gpu_container("warm-up", resource="nvidia.com/mig-1g.10gb")], nodeName="n1"
    )
    [violation] = only_rule(document, config, "bound-gpu-pod")
    assert '"warm-up", "train"' in violation.detail


@pytest.mark.parametrize(
    ("spec", "containers"),
    [
        ({"nodeName": "cpu-node-1"}, [container(environment=[env(NVD, "void")])]),  # no GPU container
        ({"nodeName": ""}, [gpu_container()]),  # empty: the scheduler binds it
        ({}, [gpu_container()]),
        ({"nodeSelector": {"kubernetes.io/hostname": "gpu-node-1"}}, [gpu_container()]),  # the way out
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]}
                            ]
                        }
                    }
                }
            },
            [gpu_container()],
        ),  # what a DaemonSet's pods get instead of nodeName
        ({"nodeName": "gpu-node-1"}, [gpu_container(gpus=0, environment=[env(NVD, "void")])]),  # zero is no request
    ],
)
def test_pods_the_scheduler_fits_or_without_gpu_containers_are_not_this_rule(config, spec, containers):
    assert only_rule(pod(*containers, **spec), config, "bound-gpu-pod") == []


def test_a_bound_mirror_pod_stays_exempt(config):
    document = pod(gpu_container(), nodeName="gpu-node-1", annotations={"kubernetes.io/config.mirror": "abc"})
    assert evaluate(document, config, namespace="default").verdict == "exempt"


# --- kai-annotation-update ----------------------------------------------------------------------------------------


def kai_created() -> dict:
    return as_kai_leaves_it(kai_fraction_pod(container("gpu-workload"), container("sidecar")))


def with_annotations(document: dict, annotations: dict) -> dict:
    changed = {**document, "metadata": {**document["metadata"], "annotations": dict(annotations)}}
    return changed


@pytest.mark.parametrize(
    ("change", "verb"),
    [
        ({"runai/shared-gpu-configmap": "trainer-bcdfghj-shared-gpu"}, "changes"),  # another ConfigMap filled
        ({"gpu-fraction-container-name": "sidecar"}, "adds"),  # another container's ConfigMap filled
        ({"gpu-fraction": "0.25"}, "changes"),
        ({"gpu-memory": "4000"}, "adds"),
    ],
)
def test_an_update_that_retargets_kai_s_binder_is_rejected(config, change, verb):
    before = kai_created()
    after = with_annotations(before, {**before["metadata"]["annotations"], **change})
    [violation] = validate_update(after, before, config).violations
    assert violation.rule == "kai-annotation-update"
    [key] = change
    assert f'{verb} pod annotation "{key}"' in violation.detail and "delete the pod" in violation.detail


@pytest.mark.parametrize("removed", ["gpu-fraction", "runai/shared-gpu-configmap"])
def test_an_update_that_removes_a_kai_annotation_is_rejected(config, removed):
    """Without gpu-fraction KAI schedules the pod as one with no GPU and fills no ConfigMap, while the container still
    reads <prefix>-0, which the pod author may have created first."""
    before = kai_created()
    after = with_annotations(before, {k: v for k, v in before["metadata"]["annotations"].items() if k != removed})
    assert [
        (v.rule, f'removes pod annotation "{removed}"' in v.detail)
        for v in validate_update(after, before, config).violations
    ] == [("kai-annotation-update", True)]


def test_kai_s_own_updates_and_other_pods_are_not_this_rule(config):
    before = kai_created()
    annotations = before["metadata"]["annotations"]
    binder = {**annotations, "received-resource-type": "Fraction", "kai.scheduler/numa-placement-predicted": "[0]"}
    grouper = {**annotations, "pod-group-name": "pg-trainer"}
    for after in (with_annotations(before, binder), with_annotations(before, grouper), before):
        assert validate_update(after, before, config).violations == ()
    # on a pod another scheduler places, the annotations mean nothing to KAI
    other = {**before, "spec": {**before["spec"], "schedulerName": "default-scheduler"}}
    assert validate_update(with_annotations(other, {}), other, config).violations == ()
    # a site's own KAI scheduler name counts
    mine = PolicyConfig(kai_scheduler_names=("kai-scheduler", "team-kai"))
    theirs = {**before, "spec": {**before["spec"], "schedulerName": "team-kai"}}
    assert [v.rule for v in validate_update(with_annotations(theirs, {}), theirs, mine).violations] == [
        "kai-annotation-update"
    ] * 2


def test_kai_annotation_update_is_no_create_rule(config):
    assert only_rule(kai_created(), config, "kai-annotation-update") == []


# --- gated-device-env ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["NVIDIA_NVSWITCH", "NVIDIA_GDS", "NVIDIA_MOFED", "NVIDIA_GDRCOPY"])
def test_gated_device_requests_set_in_the_pod(config, name):
    document = pod(gpu_container("cuda", environment=[env(name, "enabled")]))
    [violation] = validate(document, config).violations
    assert (violation.rule, violation.container) == ("gated-device-env", "cuda")
    assert name in violation.detail and "/dev/" in violation.detail
    assert ("device plugin" in violation.detail) == (name != "NVIDIA_NVSWITCH")
    from_field = pod(container(environment=[env(NVD, "void"), env(name, fieldRef={"fieldPath": "metadata.name"})]))
    assert only_rule(from_field, config, "gated-device-env") != []


def test_gated_device_requests_in_every_kind_of_container(config):
    document = pod(
        gpu_container("cuda"),
        init=[container("init", environment=[env(NVD, "void"), env("NVIDIA_GDS", "enabled")])],
        ephemeral=[container("debug", environment=[env(NVD, "void"), env("NVIDIA_NVSWITCH", "enabled")])],
    )
    assert [v.container for v in only_rule(document, config, "gated-device-env")] == ["init", "debug"]


def test_lookalike_variables_are_not_gated_requests(config):
    document = pod(gpu_container("cuda", environment=[env("NVIDIA_GDS_VERSION", "2"), env("MOFED_VERSION", "5")]))
    assert validate(document, config).violations == ()


# --- volume-type --------------------------------------------------------------------------------------------------


NODE_VOLUMES = {
    "gitRepo": {"repository": "https://example.com/r.git"},
    "fc": {"targetWWNs": ["500a0982991b8dc5"], "lun": 2},
    "iscsi": {"targetPortal": "10.0.0.2:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0},
    "rbd": {"monitors": ["10.0.0.3:6789"], "image": "foo"},
    "nfs": {"server": "10.0.0.1", "path": "/datasets"},
    "flexVolume": {"driver": "example/lvm"},
    "awsElasticBlockStore": {"volumeID": "vol-1"},
}
ALLOWED_VOLUMES = {
    "configMap": {"name": "settings"},
    "secret": {"secretName": "s"},
    "emptyDir": {"medium": "Memory"},
    "projected": {"sources": []},
    "downwardAPI": {"items": []},
    "persistentVolumeClaim": {"claimName": "data"},
    "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}},
    "csi": {"driver": "secrets-store.csi.k8s.io"},
    "image": {"reference": "registry.example/models:v1"},
}


def volume_pod(kind: str, source: dict) -> dict:
    return pod(gpu_container(volumeMounts=[{"name": "v", "mountPath": "/v"}]), volumes=[{"name": "v", kind: source}])


@pytest.mark.parametrize("kind", sorted(NODE_VOLUMES))
def test_volume_types_off_the_allowlist(config, kind):
    [violation] = validate(volume_pod(kind, NODE_VOLUMES[kind]), config).violations
    assert violation.rule == "volume-type" and f'type "{kind}"' in violation.detail
    assert "allowed_volume_types" in violation.detail


def test_git_repo_names_its_way_out(config):
    [violation] = validate(volume_pod("gitRepo", NODE_VOLUMES["gitRepo"]), config).violations
    assert "init container into an emptyDir" in violation.detail


@pytest.mark.parametrize("kind", sorted(ALLOWED_VOLUMES))
def test_pod_security_restricted_volume_types_and_image_are_allowed(config, kind):
    assert validate(volume_pod(kind, ALLOWED_VOLUMES[kind]), config).violations == ()


def test_host_path_volumes_are_left_to_their_own_rules(config):
    assert broken(host_path_pod("/srv/x"), config) == [("unpinned-container", "app"), ("host-path", None)]


def test_a_volume_without_a_type_is_the_api_server_s_empty_dir(config):
    assert only_rule(pod(gpu_container(), volumes=[{"name": "scratch"}]), config, "volume-type") == []


def test_allowed_volume_types_are_configurable():
    strict = PolicyConfig(allowed_volume_types=("configMap", "secret", "nfs"))
    assert validate(volume_pod("nfs", NODE_VOLUMES["nfs"]), strict).violations == ()
    assert [v.rule for v in validate(volume_pod("csi", ALLOWED_VOLUMES["csi"]), strict).violations] == ["volume-type"]


# --- host-process -------------------------------------------------------------------------------------------------

HOST_PROCESS = {"windowsOptions": {"hostProcess": True, "runAsUserName": "NT AUTHORITY\\SYSTEM"}}


def test_host_process_on_the_pod(config):
    document = pod(gpu_container(), securityContext=HOST_PROCESS, hostNetwork=True)
    assert broken(document, config) == [("host-process", None)]


def test_host_process_on_any_container(config):
    document = pod(
        gpu_container("main", securityContext=HOST_PROCESS),
        init=[gpu_container("init", securityContext=HOST_PROCESS)],
        ephemeral=[container("debug", environment=[env(NVD, "void")], securityContext=HOST_PROCESS)],
    )
    assert [v.container for v in only_rule(document, config, "host-process")] == ["init", "main", "debug"]


@pytest.mark.parametrize(
    "security", [{"windowsOptions": {"hostProcess": False}}, {"windowsOptions": {"runAsUserName": "ContainerUser"}}, {}]
)
def test_other_windows_options_are_fine(config, security):
    document = pod(gpu_container(securityContext=security), securityContext=security)
    assert validate(document, config).violations == ()


# --- host-ipc -----------------------------------------------------------------------------------------------------


def test_host_ipc_is_rejected_by_default(config):
    [violation] = validate(pod(gpu_container(), hostIPC=True), config).violations
    assert violation.rule == "host-ipc" and "/dev/shm" in violation.detail
    assert validate(pod(gpu_container(), hostIPC=False), config).violations == ()


def test_host_ipc_warns_when_configured():
    lenient = PolicyConfig(host_ipc=Switch.WARN)
    validation = validate(pod(gpu_container(), hostIPC=True), lenient)
    [warning] = validation.warnings
    assert validation.violations == () and warning.rule == "host-ipc" and "hostIPC" in warning.message
    assert validate(pod(gpu_container()), lenient).warnings == ()


# --- must stay admitted -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("amount", ["1000m", 1e0, "1e0", "1"])
def test_gpu_quantities_in_any_spelling_are_gpu_requests(config, amount):
    document = pod(gpu_container(gpus=amount))
    decision = evaluate(document, config, namespace="default")
    assert decision.verdict == "allowed" and decision.validation.violations == ()


def test_the_workloads_round_3_must_keep_admitting(config):
    """A GPU pod with its own user namespace; a trainer with a native sidecar and a shared process namespace; a
    LeaderWorkerSet's CPU leader and GPU workers; a KAI fraction pod in KAI's shape; kubectl debug into a GPU pod."""
    cases = {
        "host-users": pod(gpu_container(), hostUsers=False),
        "sidecar trainer": pod(
            gpu_container("trainer", gpus=8),
            init=[container("log-shipper", restartPolicy="Always")],
            shareProcessNamespace=True,
        ),
        "lws leader": pod(container("leader"), subdomain="lws"),
        "lws worker": pod(gpu_container("worker", gpus=8), subdomain="lws"),
    }
    for name, document in cases.items():
        decision = evaluate(document, config, namespace="default")
        assert decision.verdict in ("allowed", "mutated") and decision.validation.violations == (), name
    assert evaluate(kai_created(), config, namespace="default").validation.violations == ()
    debugged = pod(gpu_container(), ephemeral=[container("debugger", image="nvidia/cuda:12.4.1-base-ubuntu22.04")])
    assert evaluate(debugged, config, namespace="default").mutation.pinned == ("debugger",)
    pinned = apply_patch(debugged, evaluate(debugged, config, namespace="default").mutation.patch)
    assert validate(pinned, config, only={"debugger"}).violations == ()


def kubectl_debug(profile: str, target: str | None) -> dict:
    """The ephemeral container ``kubectl debug -it POD --image=... [--target=...] --profile=...`` adds: the general
    profile (kubectl's default) adds SYS_PTRACE to it, baseline clears its security context, restricted drops every
    capability (kubernetes/kubectl ``pkg/cmd/debug/profiles.go``: ``allowProcessTracing``, ``clearSecurityContext``,
    ``dropCapabilities``)."""
    fields: dict = {"stdin": True, "tty": True, "terminationMessagePolicy": "File"}
    if target is not None:
        fields["targetContainerName"] = target
    if profile == "general":
        fields["securityContext"] = caps("SYS_PTRACE")
    elif profile == "restricted":
        fields["securityContext"] = {
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "allowPrivilegeEscalation": False,
            "seccompProfile": {"type": "RuntimeDefault"},
        }
    return container("debugger-x7k2q", image="nvidia/cuda:12.4.1-base-ubuntu22.04", **fields)


@pytest.mark.parametrize(
    ("profile", "target", "admitted"),
    [
        ("general", None, True),  # its own PID namespace: SYS_PTRACE reaches its own processes only
        ("baseline", "cuda", True),  # sees the GPU container's processes, cannot attach to them
        ("restricted", "cuda", True),
        ("general", "cuda", False),  # would attach to the GPU container's CUDA context
    ],
)
def test_kubectl_debug_into_a_gpu_pod_by_profile(config, profile, target, admitted):
    """The decision of docs/policy.md ("kubectl debug"): a debug container is pinned and admitted, except one that
    ptraces a GPU container (kubectl's default profile with --target), whose denial names --profile=baseline."""
    debugged = pod(gpu_container("cuda"), ephemeral=[kubectl_debug(profile, target)])
    mutation = mutate(debugged, config, only={"debugger-x7k2q"})
    assert mutation.pinned == ("debugger-x7k2q",)
    violations = validate(apply_patch(debugged, mutation.patch), config, only={"debugger-x7k2q"}).violations
    if admitted:
        assert violations == ()
    else:
        [violation] = violations
        assert violation.rule == "added-capability" and "--profile=baseline" in violation.fix
