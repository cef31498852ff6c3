"""webhook.config: the YAML file → frozen PolicyConfig, and every way a file can be wrong."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from gpu_fence.vocabulary import DEFAULT_GPU_RESOURCES
from gpu_fence.webhook.config import (
    DEFAULT_ALLOWED_CAPABILITIES,
    DEFAULT_ALLOWED_VOLUME_TYPES,
    DEFAULT_FORBIDDEN_ANNOTATION_PREFIXES,
    DEFAULT_HOST_DEVICE_PATHS,
    ConfigError,
    GpuTaint,
    HostPathEntry,
    PolicyConfig,
    Switch,
    TaintEffect,
    config_from_mapping,
    load_config,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "webhook" / "config.example.yaml"
POLICY_DOC = ROOT / "docs" / "policy.md"


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "policy.yaml"
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_defaults_without_a_file():
    config = load_config(None)
    assert config == PolicyConfig()
    assert config.gpu_resources == DEFAULT_GPU_RESOURCES
    assert config.exempt_namespaces == ("kube-system",)
    assert config.kai_scheduler_names == ("kai-scheduler",)
    assert config.nvidia_runtime_classes == ("nvidia", "nvidia-cdi", "nvidia-legacy")
    assert config.visible_devices_aliases == config.exempt_service_accounts == config.extra_host_device_paths == ()
    assert config.host_path_allowlist == ()
    assert config.allowed_capabilities == DEFAULT_ALLOWED_CAPABILITIES
    assert {"IPC_LOCK", "SYS_RESOURCE", "SYS_NICE", "NET_ADMIN", "NET_RAW"} <= set(config.allowed_capabilities)
    assert not {"DAC_READ_SEARCH", "BPF", "SYS_MODULE", "PERFMON", "SYS_ADMIN"} & set(config.allowed_capabilities)
    assert config.forbidden_annotation_prefixes == DEFAULT_FORBIDDEN_ANNOTATION_PREFIXES
    assert config.env_from_on_gpu_containers is config.visible_devices_none is Switch.WARN
    assert config.gpu_node_taints == () and config.taint_aware_schedulers == ("default-scheduler",)
    assert config.allowed_volume_types == DEFAULT_ALLOWED_VOLUME_TYPES
    assert "gitRepo" not in config.allowed_volume_types and "persistentVolumeClaim" in config.allowed_volume_types
    assert config.host_ipc is Switch.REJECT


def test_gpu_node_taints_are_read_with_their_effect(tmp_path):
    path = write(
        tmp_path,
        "gpu_node_taints:\n"
        "  - {key: nvidia.com/gpu, value: present, effect: NoSchedule}\n"
        "  - {key: sku, effect: NoExecute}\n"
        "taint_aware_schedulers: [default-scheduler, kai-scheduler]\n",
    )
    config = load_config(path)
    assert config.gpu_node_taints == (
        GpuTaint("nvidia.com/gpu", "present", TaintEffect.NO_SCHEDULE),
        GpuTaint("sku", "", TaintEffect.NO_EXECUTE),
    )
    assert config.taint_aware_scheduler_set == {"default-scheduler", "kai-scheduler"}


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("gpu_node_taints: nvidia.com/gpu\n", ["gpu_node_taints", "expected a list"]),
        ("gpu_node_taints: [nvidia.com/gpu]\n", ["gpu_node_taints[0]", "'key', 'value' and 'effect'"]),
        ("gpu_node_taints: [{key: gpu, effect: PreferNoSchedule}]\n", ["gpu_node_taints[0].effect", "NoSchedule"]),
        ("gpu_node_taints: [{key: gpu}]\n", ["gpu_node_taints[0].effect", "keep pods off"]),
        ("gpu_node_taints: [{key: 'bad key', effect: NoSchedule}]\n", ["gpu_node_taints[0].key", "taint key"]),
        ("gpu_node_taints: [{key: gpu, value: 'a b', effect: NoSchedule}]\n", ["gpu_node_taints[0].value"]),
        ("gpu_node_taints: [{key: gpu, effect: NoSchedule, operator: Exists}]\n", ["unknown key 'operator'"]),
        ("taint_aware_schedulers: ' kai'\n", ["taint_aware_schedulers", "expected a list"]),
    ],
)
def test_bad_gpu_node_taints_name_the_key(tmp_path, text, needles):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    assert all(needle in str(caught.value) for needle in needles), str(caught.value)


def test_own_namespace_is_always_exempt(tmp_path):
    assert load_config(None, own_namespace="gpu-fence").exempt_namespaces == ("kube-system", "gpu-fence")
    path = write(tmp_path, "exempt_namespaces: [tools]\n")
    assert load_config(path, own_namespace="gpu-fence").exempt_namespaces == ("tools", "gpu-fence")
    assert load_config(path, own_namespace="tools").exempt_namespaces == ("tools",)
    with pytest.raises(ConfigError, match="own namespace"):
        load_config(None, own_namespace="Not_A_Namespace")


def test_the_example_file_loads_and_equals_the_defaults():
    assert load_config(str(EXAMPLE)) == PolicyConfig()


def test_the_example_file_documents_every_key():
    keys = set(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")))
    assert keys == {field.name for field in dataclasses.fields(PolicyConfig)}


def test_the_policy_doc_lists_every_key_with_its_default():
    text = POLICY_DOC.read_text(encoding="utf-8")
    section = text[text.index("## Configuration") :]
    for field in dataclasses.fields(PolicyConfig):
        row = re.search(rf"^\| `{field.name}` \|(.*)$", section, re.MULTILINE)
        assert row, f"docs/policy.md has no row for {field.name}"
        default = getattr(PolicyConfig(), field.name)
        for value in [default.value] if isinstance(default, Switch) else default:
            assert f"`{value}`" in row.group(1), f"default {value} of {field.name} missing from docs/policy.md"
    for path in DEFAULT_HOST_DEVICE_PATHS:
        assert f"`{path}`" in text, f"built-in host path {path} missing from docs/policy.md"


def test_a_full_file(tmp_path):
    path = write(
        tmp_path,
        """
gpu_resources: [nvidia.com/gpu, example.com/accel-*]
visible_devices_aliases: [DOCKER_RESOURCE_GPU]
kai_scheduler_names: [kai-scheduler, kai-scheduler-b]
nvidia_runtime_classes: [nvidia]
exempt_namespaces: [kube-system, gpu-operator]
exempt_service_accounts: [monitoring/dcgm-exporter]
extra_host_device_paths: [/opt/nvidia, /dev/accel*]
host_path_allowlist:
  - {path: /dev/infiniband, writable: false}
  - {path: /srv/scratch, writable: true}
  - {path: /srv/models, writable: false}
allowed_capabilities: [ipc_lock, CAP_SYS_NICE, NET_RAW]
forbidden_annotation_prefixes: [devices.crio.io, example.com/devices]
env_from_on_gpu_containers: reject
visible_devices_none: reject
allowed_volume_types: [configMap, secret, nfs]
host_ipc: warn
""",
    )
    config = load_config(path)
    assert config.host_path_allowlist == (
        HostPathEntry("/dev/infiniband", writable=False),
        HostPathEntry("/srv/scratch", writable=True),
        HostPathEntry("/srv/models", writable=False),
    )
    assert config.host_path_writable == {"/dev/infiniband": False, "/srv/scratch": True, "/srv/models": False}
    assert config.allowed_capabilities == ("IPC_LOCK", "SYS_NICE", "NET_RAW")  # the spelling the policy compares
    assert config.forbidden_annotation_prefixes == ("devices.crio.io", "example.com/devices")
    assert config.env_from_on_gpu_containers is config.visible_devices_none is Switch.REJECT
    assert config.allowed_volume_keys == {"configMap", "secret", "nfs", "name"}
    assert config.host_ipc is Switch.WARN
    assert config.gpu_resource_set.matches("example.com/accel-1")
    assert not config.gpu_resource_set.matches("nvidia.com/gpu.shared")
    assert config.visible_devices_names == {"NVIDIA_VISIBLE_DEVICES", "DOCKER_RESOURCE_GPU"}
    assert config.exempt_service_account_set == {"monitoring/dcgm-exporter"}
    assert config.host_device_paths[-2:] == ("/opt/nvidia", "/dev/accel*")
    assert config.host_device_paths[: len(DEFAULT_HOST_DEVICE_PATHS)] == DEFAULT_HOST_DEVICE_PATHS


def test_empty_file_and_null_values(tmp_path):
    assert load_config(write(tmp_path, "")) == PolicyConfig()
    assert load_config(write(tmp_path, "# only a comment\n")) == PolicyConfig()
    assert load_config(write(tmp_path, "exempt_namespaces:\n")).exempt_namespaces == ()


def test_duplicates_are_dropped(tmp_path):
    config = load_config(write(tmp_path, "exempt_namespaces: [a, b, a]\n"))
    assert config.exempt_namespaces == ("a", "b")


def test_config_is_frozen_and_hashable():
    config = PolicyConfig(exempt_namespaces=["a", "b"], visible_devices_none="reject")  # type: ignore[arg-type]
    assert config.exempt_namespaces == ("a", "b")
    assert config.visible_devices_none is Switch.REJECT
    hash(config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.exempt_namespaces = ()  # type: ignore[misc]


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("exempt_namespace: [a]\n", ["exempt_namespace", "did you mean 'exempt_namespaces'"]),
        ("colour: blue\n", ["colour", "known keys", "gpu_resources"]),
        ("exempt_namespaces: kube-system\n", ["exempt_namespaces", "expected a list"]),
        ("exempt_namespaces: {a: 1}\n", ["exempt_namespaces", "expected a list"]),
        ("exempt_namespaces: [kube-system, 7]\n", ["exempt_namespaces[1]", "non-empty string"]),
        ("exempt_namespaces: ['']\n", ["exempt_namespaces[0]"]),
        ("exempt_namespaces: [Kube_System]\n", ["exempt_namespaces[0]", "namespace"]),
        ("exempt_service_accounts: [gpu-operator]\n", ["exempt_service_accounts[0]", "namespace/serviceaccount"]),
        ("exempt_service_accounts: [/sa]\n", ["exempt_service_accounts[0]"]),
        ("gpu_resources: []\n", ["gpu_resources", "at least one"]),
        ("gpu_resources:\n", ["gpu_resources", "at least one"]),
        ("gpu_resources: ['*']\n", ["gpu_resources[0]", "domain-prefixed"]),
        ("gpu_resources: [gpu]\n", ["gpu_resources[0]", "domain-prefixed"]),
        ("gpu_resources: ['nvidia.com/*gpu']\n", ["gpu_resources[0]", "only at the end"]),
        ("gpu_resources: [cpu]\n", ["gpu_resources[0]"]),
        ("visible_devices_aliases: ['NOT VALID']\n", ["visible_devices_aliases[0]", "environment variable"]),
        ("nvidia_runtime_classes: [NVIDIA]\n", ["nvidia_runtime_classes[0]"]),
        ("kai_scheduler_names: [' kai ']\n", ["kai_scheduler_names[0]", "whitespace"]),
        ("extra_host_device_paths: [dev/foo]\n", ["extra_host_device_paths[0]", "absolute"]),
        ("extra_host_device_paths: ['/dev/*/x']\n", ["extra_host_device_paths[0]"]),
        ("allowed_capabilities: [SYS_ADMIN]\n", ["allowed_capabilities[0]", "sys-admin-capability"]),
        ("allowed_capabilities: [cap_all]\n", ["allowed_capabilities[0]", "sys-admin-capability"]),
        ("allowed_capabilities: ['IPC LOCK']\n", ["allowed_capabilities[0]", "capability name"]),
        ("allowed_capabilities: IPC_LOCK\n", ["allowed_capabilities", "expected a list"]),
        ("forbidden_annotation_prefixes: ['has space']\n", ["forbidden_annotation_prefixes[0]", "prefix"]),
        ("env_from_on_gpu_containers: deny\n", ["env_from_on_gpu_containers", "warn, reject"]),
        ("env_from_on_gpu_containers: [reject]\n", ["env_from_on_gpu_containers", "warn, reject"]),
        ("visible_devices_none: true\n", ["visible_devices_none", "warn, reject"]),
        ("visible_devices_none:\n", ["visible_devices_none", "warn, reject"]),
        ("host_path_allowlist: /dev/infiniband\n", ["host_path_allowlist", "list of entries"]),
        ("host_path_allowlist: [/dev/infiniband]\n", ["host_path_allowlist[0]", "'path' and 'writable'"]),
        ("host_path_allowlist: [{path: /data}]\n", ["host_path_allowlist[0].writable", "true or false"]),
        ("host_path_allowlist: [{path: /data, writable: 'no'}]\n", ["host_path_allowlist[0].writable"]),
        (
            "host_path_allowlist: [{path: /data, writable: false, type: Directory}]\n",
            ["host_path_allowlist[0]", "'type'"],
        ),
        ("host_path_allowlist: [{path: data, writable: false}]\n", ["host_path_allowlist[0].path", "absolute"]),
        ("host_path_allowlist: [{writable: false}]\n", ["host_path_allowlist[0].path", "absolute"]),
        ("host_path_allowlist: [{path: '/data/*', writable: false}]\n", ["host_path_allowlist[0].path", "exactly"]),
        ("host_path_allowlist: [{path: /data/, writable: false}]\n", ["host_path_allowlist[0].path", "'/data'"]),
        ("host_path_allowlist: [{path: /data/../dev, writable: false}]\n", ["host_path_allowlist[0].path", "'/dev'"]),
        ("host_path_allowlist: [{path: /, writable: false}]\n", ["host_path_allowlist[0].path", "whole node"]),
        ("host_path_allowlist: [{path: /proc/1/root, writable: false}]\n", ["host_path_allowlist[0].path", "/proc"]),
        ("host_path_allowlist: [{path: /var, writable: false}]\n", ["host_path_allowlist[0].path", "host-device-path"]),
        (
            "host_path_allowlist: [{path: /dev/nvidia0, writable: false}]\n",
            ["host_path_allowlist[0].path", "/dev/nvidia*"],
        ),
        (
            "host_path_allowlist: [{path: /data, writable: true}, {path: /data/models, writable: false}]\n",
            ["host_path_allowlist[1].path", "inside the writable entry '/data'", "symlink"],
        ),
        (
            "host_path_allowlist: [{path: /d, writable: false}, {path: /d, writable: true}]\n",
            ["host_path_allowlist[1].path", "twice"],
        ),
        (
            "extra_host_device_paths: [/srv]\nhost_path_allowlist: [{path: /srv/a, writable: false}]\n",
            ["host_path_allowlist[0].path", "exposes /srv"],
        ),
        ("allowed_volume_types: [hostPath]\n", ["allowed_volume_types[0]", "host_path_allowlist"]),
        ("allowed_volume_types: [NFS]\n", ["allowed_volume_types[0]", "not a volume type", "did you mean 'nfs'"]),
        ("allowed_volume_types: [gitrepo]\n", ["allowed_volume_types[0]", "'gitRepo'"]),
        ("allowed_volume_types: [tmpfs]\n", ["allowed_volume_types[0]", "not a volume type"]),
        ("allowed_volume_types: emptyDir\n", ["allowed_volume_types", "expected a list"]),
        ("host_ipc: allow\n", ["host_ipc", "warn, reject"]),
        ("- a\n- b\n", ["must be a mapping"]),
        ("just text\n", ["must be a mapping"]),
    ],
)
def test_bad_files_name_the_key(tmp_path, text, names):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    message = str(raised.value)
    assert message.startswith(path + ": ")
    for name in names:
        assert name in message


@pytest.mark.parametrize("writable", [False, True])
def test_allowlist_entries_beside_each_other(tmp_path, writable):
    """Only an entry inside a *writable* one is refused; a read-only outer entry cannot be written through, and an
    entry above a writable one sees the planted link inside its own mount, not on the host."""
    inner = "{path: /srv/data/models, writable: false}"
    text = f"host_path_allowlist: [{{path: /srv/data, writable: {str(writable).lower()}}}, {inner}]\n"
    if writable:
        with pytest.raises(ConfigError, match="inside the writable entry"):
            load_config(write(tmp_path, text))
    else:
        assert len(load_config(write(tmp_path, text)).host_path_allowlist) == 2
    above = "host_path_allowlist: [{path: /srv, writable: false}, {path: /srv/data, writable: true}]\n"
    assert len(load_config(write(tmp_path, above)).host_path_allowlist) == 2


def test_rdma_entry_the_docs_give_loads(tmp_path):
    config = load_config(write(tmp_path, "host_path_allowlist:\n  - path: /dev/infiniband\n    writable: false\n"))
    assert config.host_path_writable == {"/dev/infiniband": False}


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "exempt_namespaces: [a\nkai_scheduler_names: [b]\n: :\n")
    with pytest.raises(ConfigError, match=r"invalid YAML at line \d+, column \d+"):
        load_config(path)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the configuration file"):
        load_config(str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(str(binary))


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
    with pytest.raises(ValueError, match="unknown configuration key"):
        config_from_mapping({"nope": []})
