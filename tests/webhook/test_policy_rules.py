"""One group per rule of webhook.policy: what triggers it, what does not, and what the message says."""

from __future__ import annotations

import pytest

from gpu_fence.vocabulary import parse_visible_devices
from gpu_fence.webhook.config import PolicyConfig
from gpu_fence.webhook.policy import RULES, Violation, validate, validate_update
from tests.fakes.pods import (
    NVD,
    VISIBLE_DEVICES_EDGE_VALUES,
    container,
    env,
    gpu_container,
    host_path_pod,
    kai_fraction_pod,
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
        "privileged",
        "sys-admin-capability",
        "device-list-mount",
        "cdi-annotation",
        "host-device-path",
        "mig-control-env",
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


def test_dra_claims_count_as_a_gpu_request(config):
    document = pod(
        container("ctr", resources={"claims": [{"name": "gpu"}]}),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "single-gpu"}],
    )
    assert broken(document, config) == []


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

KAI_REF = {"configMapKeyRef": {"name": "gpu-sharing-abc-shared-gpu", "key": "NVIDIA_VISIBLE_DEVICES"}}


def test_kai_fraction_container_is_a_gpu_container(config):
    document = kai_fraction_pod(container("gpu-workload"), container("sidecar"))
    assert broken(document, config) == [("unpinned-container", "sidecar")]


def test_kai_fraction_container_may_take_its_config_map(config):
    document = kai_fraction_pod(
        container("gpu-workload", environment=[env(NVD, **KAI_REF)]),
        container("sidecar", environment=[env(NVD, "void")]),
    )
    assert broken(document, config) == []


def test_kai_named_fraction_container(config):
    document = kai_fraction_pod(
        container("sidecar", environment=[env(NVD, "void")]),
        container("worker", environment=[env(NVD, **KAI_REF)]),
        fraction_container="worker",
    )
    assert broken(document, config) == []


def test_kai_exception_is_only_a_config_map_on_the_fraction_container(config):
    secret = {"secretKeyRef": {"name": "s", "key": "k"}}
    document = kai_fraction_pod(container("gpu-workload", environment=[env(NVD, **secret)]))
    assert broken(document, config) == [("visible-devices-env", "gpu-workload")]
    sidecar = kai_fraction_pod(container("gpu-workload"), container("sidecar", environment=[env(NVD, **KAI_REF)]))
    assert broken(sidecar, config) == [("visible-devices-env", "sidecar")]
    literal = kai_fraction_pod(container("gpu-workload", environment=[env(NVD, "all")]))
    assert broken(literal, config) == [("visible-devices-env", "gpu-workload")]


def test_kai_annotations_need_the_kai_scheduler(config):
    document = kai_fraction_pod(
        container("gpu-workload", environment=[env(NVD, **KAI_REF)]), scheduler="default-scheduler"
    )
    assert broken(document, config) == [("visible-devices-env", "gpu-workload")]
    document["spec"]["schedulerName"] = ["kai-scheduler"]  # not a string: no scheduler, no crash
    assert broken(document, config) == [("visible-devices-env", "gpu-workload")]


def test_kai_ephemeral_container_with_the_fraction_name_is_not_a_gpu_container(config):
    document = kai_fraction_pod(container("gpu-workload"), fraction_container="debug")
    document["spec"]["ephemeralContainers"] = [container("debug")]
    assert ("unpinned-container", "debug") in broken(document, config)


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
    document = pod(gpu_container("c", securityContext={"capabilities": {"add": ["NET_ADMIN", capability]}}))
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
    "/var/run/docker.sock",
    "/run/containerd/containerd.sock",
    "/var/run/crio/crio.sock",
    "/tmp/../dev",
    "/dev/shm/../nvidia0",
    "/./etc//cdi/",
    "dev",
]
ALLOWED_HOST_PATHS = [
    "/devices",
    "/dev/shm",
    "/dev/fuse",
    "/dev/log",
    "/data",
    "/etc/os-release",
    "/var/log",
    "/var/lib/kubelet/pods",
    "/run/nvidia-fabricmanager",
    "/etc/cdi-backup",
    "/sys",
    "/opt/nvidia",
]


@pytest.mark.parametrize("path", REJECTED_HOST_PATHS)
def test_host_paths_reaching_devices(config, path):
    [violation] = only_rule(host_path_pod(path), config, "host-device-path")
    assert violation.container is None and '"host"' in violation.message


@pytest.mark.parametrize("path", ALLOWED_HOST_PATHS)
def test_host_paths_elsewhere(config, path):
    assert only_rule(host_path_pod(path), config, "host-device-path") == []


def test_extra_host_device_paths():
    custom = PolicyConfig(extra_host_device_paths=("/opt/nvidia",))
    assert only_rule(host_path_pod("/opt/nvidia/bin"), custom, "host-device-path")
    assert only_rule(host_path_pod("/opt"), custom, "host-device-path")


# --- mig-control-env ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["NVIDIA_MIG_CONFIG_DEVICES", "NVIDIA_MIG_MONITOR_DEVICES"])
def test_mig_control_variables(config, name):
    document = pod(gpu_container("c", environment=[env(name, "all")]))
    assert broken(document, config) == [("mig-control-env", "c")]
    from_config_map = pod(gpu_container("c", environment=[env(name, configMapKeyRef={"name": "m", "key": "k"})]))
    assert broken(from_config_map, config) == [("mig-control-env", "c")]


# --- warnings -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("runtime_class", ["nvidia", "nvidia-cdi", "nvidia-legacy"])
def test_nvidia_runtime_class_on_a_pod_without_gpu_warns(config, runtime_class):
    document = pod(container(environment=[env(NVD, "void")]), runtimeClassName=runtime_class)
    result = validate(document, config)
    assert result.violations == () and len(result.warnings) == 1 and runtime_class in result.warnings[0]


def test_nvidia_runtime_class_on_a_gpu_pod_is_quiet(config):
    assert validate(pod(gpu_container(), runtimeClassName="nvidia"), config).warnings == ()


def test_gpu_container_with_env_from_warns(config):
    document = pod(gpu_container("cuda", envFrom=[{"configMapRef": {"name": "settings"}}]))
    [warning] = validate(document, config).warnings
    assert "cuda" in warning and "envFrom" in warning


def test_non_gpu_container_with_env_from_is_covered_by_the_pin(config):
    document = pod(container(environment=[env(NVD, "void")], envFrom=[{"configMapRef": {"name": "s"}}]))
    assert validate(document, config).warnings == ()
    aliased = PolicyConfig(visible_devices_aliases=("DOCKER_RESOURCE_GPU",))
    [warning] = validate(document, aliased).warnings
    assert "DOCKER_RESOURCE_GPU" in warning


def test_warnings_fit_the_api_server_limit(config):
    long_name = "c" * 300
    document = pod(
        container(long_name, environment=[env(NVD, "void")], envFrom=[{"secretRef": {"name": "s"}}]),
        runtimeClassName="nvidia",
    )
    custom = PolicyConfig(visible_devices_aliases=("A" * 150,))
    warnings = validate(document, custom).warnings
    assert len(warnings) == 2
    assert all(len(warning) <= 120 for warning in warnings)


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


def test_validation_rule_ids_in_table_order(config):
    document = pod(
        container("c", securityContext={"privileged": True}), annotations={"cdi.k8s.io/x": "nvidia.com/gpu=all"}
    )
    assert validate(document, config).rule_ids == ("unpinned-container", "privileged", "cdi-annotation")
