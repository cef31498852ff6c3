"""gpu_fence.vocabulary: the toolkit-exact NVIDIA_VISIBLE_DEVICES parser, GPU-request recognition, device ids."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_fence.vocabulary import (
    DEFAULT_GPU_RESOURCE_SET,
    DeviceIdForm,
    GpuResources,
    Visibility,
    VisibleDevices,
    classify_device_id,
    has_resource_claims,
    iter_containers,
    kai_fraction_container,
    parse_visible_devices,
    quantity_is_positive,
    requests_device_plugin_gpu,
    requests_gpu_resource,
)
from tests.fakes.pods import json_values

UUID = "8e8b5f1c-3c1a-4d0e-9a57-2b1f2d8c9e01"

# --- parse_visible_devices (research §1.2 and §6) -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "visibility", "devices"),
    [
        (None, Visibility.UNSET, ()),
        ("all", Visibility.ALL, ()),
        (" all ", Visibility.ALL, ()),
        ("ALL", Visibility.LIST, ("ALL",)),
        ("void", Visibility.VOID, ()),
        ("VOID", Visibility.LIST, ("VOID",)),
        ("none", Visibility.NONE, ()),
        ("", Visibility.VOID, ()),
        (",", Visibility.VOID, ()),
        (" , ,", Visibility.VOID, ()),
        ("0,void", Visibility.VOID, ()),
        ("void,0", Visibility.VOID, ()),
        ("all,void", Visibility.VOID, ()),
        ("0,all", Visibility.ALL, ()),
        ("none,all", Visibility.NONE, ()),
        ("all,none", Visibility.ALL, ()),
        ("0", Visibility.LIST, ("0",)),
        ("0, 1,,2", Visibility.LIST, ("0", "1", "2")),
        ("0,0", Visibility.LIST, ("0", "0")),
        (f"GPU-{UUID}", Visibility.LIST, (f"GPU-{UUID}",)),
        (f"MIG-{UUID}", Visibility.LIST, (f"MIG-{UUID}",)),
        (f"MIG-GPU-{UUID}/1/0", Visibility.LIST, (f"MIG-GPU-{UUID}/1/0",)),
        ("0:1", Visibility.LIST, ("0:1",)),
        ("nvidia.com/gpu=all", Visibility.LIST, ("nvidia.com/gpu=all",)),
        ("/var/run/nvidia-container-devices", Visibility.LIST, ("/var/run/nvidia-container-devices",)),
    ],
)
def test_parse_visible_devices(value, visibility, devices):
    assert parse_visible_devices(value) == VisibleDevices(visibility, devices)


@pytest.mark.parametrize(
    ("visibility", "safe"),
    [
        (Visibility.VOID, True),
        (Visibility.NONE, True),
        (Visibility.UNSET, False),
        (Visibility.ALL, False),
        (Visibility.LIST, False),
    ],
)
def test_grants_no_gpu(visibility, safe):
    assert VisibleDevices(visibility).grants_no_gpu is safe


entries = st.sampled_from(["void", "none", "all", "0", "1", "VOID", "", " ", f"GPU-{UUID}", "0:1"])


@settings(max_examples=200, deadline=None)
@given(st.lists(entries, max_size=6))
def test_parser_matches_the_toolkit_rules(parts):
    """An independent restatement of devicesFromEnvvars: void anywhere, else the first special token, else list."""
    result = parse_visible_devices(",".join(parts))
    trimmed = [p.strip() for p in parts if p.strip()]
    if not trimmed or "void" in trimmed:
        assert result.visibility is Visibility.VOID
    elif any(p in ("all", "none") for p in trimmed):
        first = next(p for p in trimmed if p in ("all", "none"))
        assert result.visibility is (Visibility.ALL if first == "all" else Visibility.NONE)
    else:
        assert result == VisibleDevices(Visibility.LIST, tuple(trimmed))


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parser_never_raises_and_is_whitespace_insensitive(value):
    result = parse_visible_devices(value)
    assert parse_visible_devices(f"  {value} ,") == result
    assert all(device and device == device.strip() for device in result.devices)


# --- GPU requests -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantity", "positive"),
    [
        (1, True),
        (0, False),
        (-1, False),
        ("1", True),
        ("0", False),
        ("0.0", False),
        ("500m", True),
        ("0m", False),
        ("1e3", True),
        ("1Ki", True),
        (" 2 ", True),
        ("+1", True),
        ("-1", False),
        ("abc", False),
        ("", False),
        (".", False),
        (None, False),
        (True, False),
        (False, False),
        ([1], False),
        ({"a": 1}, False),
        (0.5, True),
        ("1..2", False),
        ("1x", False),
    ],
)
def test_quantity_is_positive(quantity, positive):
    assert quantity_is_positive(quantity) is positive


@pytest.mark.parametrize(
    ("resource", "matches"),
    [
        ("nvidia.com/gpu", True),
        ("nvidia.com/gpu.shared", True),
        ("nvidia.com/mig-1g.10gb", True),
        ("nvidia.com/mig-1g.5gb", True),
        ("nvidia.com/mig-3g.20gb", True),
        ("nvidia.com/gpumem", False),
        ("nvidia.com/gpux", False),
        ("example.com/nvidia.com/gpu", False),
        ("cpu", False),
        ("nvidia.com/gpucores", False),
        ("amd.com/gpu", False),
        ("gpu", False),
        ("nvidia.com/mig", False),
    ],
)
def test_default_gpu_resources(resource, matches):
    assert DEFAULT_GPU_RESOURCE_SET.matches(resource) is matches


def test_gpu_resources_from_patterns():
    resources = GpuResources.from_patterns(["example.com/accel", "example.com/slice-*"])
    assert resources.exact == frozenset({"example.com/accel"}) and resources.prefixes == ("example.com/slice-",)
    assert resources.matches("example.com/slice-2") and not resources.matches("example.com/accel-2")


@pytest.mark.parametrize(
    ("container", "gpu"),
    [
        ({"resources": {"limits": {"nvidia.com/gpu": 1}}}, True),
        ({"resources": {"requests": {"nvidia.com/gpu": "1"}}}, True),
        ({"resources": {"limits": {"nvidia.com/gpu": 0}, "requests": {"nvidia.com/gpu": 0}}}, False),
        ({"resources": {"limits": {"amd.com/gpu": 1}}}, False),
        ({"resources": {"claims": [{"name": "gpu"}]}}, True),
        ({"resources": {"claims": []}}, False),
        ({"resources": {"claims": "gpu"}}, False),
        ({"resources": {"limits": ["nvidia.com/gpu"]}}, False),
        ({"resources": "lots"}, False),
        ({}, False),
    ],
)
def test_requests_gpu_resource(container, gpu):
    assert requests_gpu_resource(container) is gpu
    # the two ways apart: a device plugin's extended resource, or a DRA claim of whatever class
    assert requests_gpu_resource(container) is (requests_device_plugin_gpu(container) or has_resource_claims(container))


def test_device_plugin_requests_and_claims_are_told_apart():
    both = {"resources": {"limits": {"nvidia.com/gpu": 1}, "claims": [{"name": "nic"}]}}
    claim = {"resources": {"claims": [{"name": "gpu"}]}}
    assert requests_device_plugin_gpu(both) and has_resource_claims(both)
    assert not requests_device_plugin_gpu(claim) and has_resource_claims(claim)
    assert not has_resource_claims({"resources": "lots"}) and not has_resource_claims({})


def test_iter_containers_covers_every_field_in_kubelet_order():
    spec = {
        "ephemeralContainers": [{"name": "e"}],
        "containers": [{"name": "c"}, "junk"],
        "initContainers": [{"name": "i"}],
        "volumes": [],
    }
    assert [(f, i, c["name"]) for f, i, c in iter_containers(spec)] == [
        ("initContainers", 0, "i"),
        ("containers", 0, "c"),
        ("ephemeralContainers", 0, "e"),
    ]
    assert list(iter_containers({"containers": "nope"})) == []


# --- KAI fractions ------------------------------------------------------------------------------------------------


def kai_pod(annotations, scheduler="kai-scheduler", names=("first", "second")):
    return {
        "metadata": {"annotations": annotations},
        "spec": {"schedulerName": scheduler, "containers": [{"name": n} for n in names]},
    }


def test_kai_fraction_container():
    assert kai_fraction_container(kai_pod({"gpu-fraction": "0.5"}), ["kai-scheduler"]) == "first"
    assert kai_fraction_container(kai_pod({"gpu-memory": "2000"}), ["kai-scheduler"]) == "first"
    named = kai_pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "second"})
    assert kai_fraction_container(named, ["kai-scheduler"]) == "second"
    assert kai_fraction_container(kai_pod({"gpu-fraction": "0.5"}, "default-scheduler"), ["kai-scheduler"]) is None
    assert kai_fraction_container(kai_pod({"team": "a"}), ["kai-scheduler"]) is None
    assert kai_fraction_container(kai_pod({"gpu-fraction": "0.5"}, names=()), ["kai-scheduler"]) is None


def test_kai_fraction_container_with_unhashable_scheduler_name():
    assert kai_fraction_container(kai_pod({"gpu-fraction": "0.5"}, ["kai-scheduler"]), ["kai-scheduler"]) is None


@settings(max_examples=150, deadline=None)
@given(json_values, json_values)
def test_recognition_never_raises_on_garbage(resources, annotations):
    requests_gpu_resource({"resources": resources})
    list(iter_containers({"containers": resources, "initContainers": annotations}))
    pod = {
        "metadata": {"annotations": annotations},
        "spec": {"schedulerName": "kai-scheduler", "containers": resources},
    }
    kai_fraction_container(pod, ["kai-scheduler"])


# --- device ids ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "form"),
    [
        ("0", DeviceIdForm.INDEX),
        ("12", DeviceIdForm.INDEX),
        (f"GPU-{UUID}", DeviceIdForm.GPU_UUID),
        (f"MIG-{UUID}", DeviceIdForm.MIG_UUID),
        (f"MIG-GPU-{UUID}/1/0", DeviceIdForm.MIG_LEGACY),
        ("0:1", DeviceIdForm.MIG_INDEX),
        ("nvidia.com/gpu=all", DeviceIdForm.CDI_NAME),
        ("nvidia.com/gpu=0", DeviceIdForm.CDI_NAME),
        ("/var/run/nvidia-container-devices", DeviceIdForm.MOUNT_MARKER),
        ("/run/nvidia-container-devices/0", DeviceIdForm.MOUNT_MARKER),
        ("VOID", DeviceIdForm.UNKNOWN),
        ("a=b", DeviceIdForm.UNKNOWN),
        ("", DeviceIdForm.UNKNOWN),
    ],
)
def test_classify_device_id(entry, form):
    assert classify_device_id(entry) is form
