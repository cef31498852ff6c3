"""The policy's hot-path shortcuts give exactly the answers of the plain versions they replace (hypothesis).

Each shortcut skips work that cannot change the answer: cleaning a mount path that cannot name the device-list
directory, reading env entries no rule looks at, the ``Mapping`` ABC check for plain dicts, re-parsing a bare
``void``. Each property compares the shortcut with the straightforward computation over generated input.
"""

from __future__ import annotations

import copy
import posixpath
import types

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpu_fence.vocabulary import (
    DEVICE_LIST_MOUNT_PREFIXES,
    MIG_CONTROL_ENVS,
    Visibility,
    VisibleDevices,
    kai_fraction_container,
    parse_visible_devices,
    requests_gpu_resource,
)
from gpu_fence.webhook import policy
from gpu_fence.webhook.config import PolicyConfig
from tests.fakes.pods import NVD, VISIBLE_DEVICES_EDGE_VALUES, container, env, gpu_container, json_values, pod, pods

CONFIG = PolicyConfig()
ALIASED = PolicyConfig(visible_devices_aliases=("DOCKER_RESOURCE_GPU",))
PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Path pieces that exercise cleaning: empty components, ".", "..", the marker alone, glued to other text and
# split across components, the two prefixes, and arbitrary text.
_PIECES = st.sampled_from(
    [
        "",
        ".",
        "..",
        "var",
        "run",
        "nvidia-container-devices",
        "nvidia-container-devicesall",
        "nvidia-container",
        "-devices",
        "x.nvidia-container-devices",
        "dev",
        "all",
        "0",
    ]
)
mount_paths = st.lists(_PIECES | st.text(alphabet="/.-anvid", max_size=6), max_size=8).map("/".join) | st.text()


#: The last component of the device-list prefixes: the name the shortcut looks for in a raw path.
MARKER = posixpath.basename(DEVICE_LIST_MOUNT_PREFIXES[0])


def always_cleaned(path: str) -> bool:
    """The rule as docs/policy.md states it, with no shortcut: clean every path, then test it (the prefixes with no
    "/" boundary, and the marker as a component deeper in the path)."""
    cleaned = policy.clean_path(path)
    return cleaned.startswith(DEVICE_LIST_MOUNT_PREFIXES) or f"/{MARKER}" in cleaned


@PROPERTY
@given(st.lists(mount_paths, min_size=1, max_size=4))
def test_device_list_mount_only_skips_paths_that_cleaning_could_not_flag(paths):
    """Cleaning never changes a component's text and the marker holds no "/", so a path without the marker in
    its raw text can never be flagged: testing the raw text first gives the same violations as cleaning all."""
    mounts = [{"name": f"v{i}", "mountPath": path} for i, path in enumerate(paths)]
    document = pod(gpu_container("c", volumeMounts=mounts), volumes=[{"name": "v0", "emptyDir": {}}])
    flagged = [
        v.detail for v in policy.validate(document, CONFIG).violations if v.rule == policy.RuleId.DEVICE_LIST_MOUNT
    ]
    expected = [path for path in paths if always_cleaned(path)]
    assert len(flagged) == len(expected)
    for detail, path in zip(flagged, expected, strict=True):
        assert path[:62] in detail  # the message names the path, cut if it is long


@PROPERTY
@given(mount_paths)
def test_a_flagged_path_always_contains_the_marker(path):
    """Why the shortcut is sound, over the rule alone: every path the rule flags holds the marker in its raw text."""
    assert MARKER in path or not always_cleaned(path)


unwatched_names = st.sampled_from(
    [
        "PATH",
        "HOME",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_DRIVER_CAPABILITIES",
        "NVIDIA_VISIBLE_DEVICES_X",
        "nvidia_visible_devices",
        "DOCKER_RESOURCE",
    ]
)
unwatched_entries = (
    st.builds(
        lambda name, value: {"name": name, "value": value},
        unwatched_names,
        st.sampled_from(VISIBLE_DEVICES_EDGE_VALUES),
    )
    | json_values
)


@PROPERTY
@given(pods(), st.lists(unwatched_entries, min_size=1, max_size=6), st.sampled_from([CONFIG, ALIASED]), st.data())
def test_env_entries_no_rule_reads_never_change_a_decision(document, extra, config, data):
    """The pod is read keeping only the env entries some rule reads; adding any other entry (or garbage that
    is no entry at all) anywhere in a container's env list changes neither the mutation nor the validation."""
    before = policy.evaluate(document, config, namespace="default")
    grown = copy.deepcopy(document)
    bodies = [
        c
        for field in ("initContainers", "containers", "ephemeralContainers")
        for c in grown["spec"].get(field, [])
        if isinstance(c.get("env"), list)
    ]
    assume(bodies)
    target = data.draw(st.sampled_from(bodies))
    for entry in extra:
        target["env"].insert(data.draw(st.integers(0, len(target["env"]))), entry)
    after = policy.evaluate(grown, config, namespace="default")
    assert after.validation == before.validation
    assert [op["path"] for op in after.mutation.patch] == [op["path"] for op in before.mutation.patch]
    assert after.mutation.pinned == before.mutation.pinned


def test_every_env_name_a_rule_reads_is_watched():
    """The aliases and both MIG variables reach their rules through the filtered env, among names no rule reads."""
    variables = [
        env("PATH", "/usr/bin"),
        env("DOCKER_RESOURCE_GPU", "all"),
        env("HOME", "/root"),
        *(env(name, "all") for name in MIG_CONTROL_ENVS),
        env(NVD, "void"),
    ]
    violations = policy.validate(pod(container("app", env=variables)), ALIASED).violations
    assert [v.rule for v in violations] == ["visible-devices-env", *(["mig-control-env"] * len(MIG_CONTROL_ENVS))]
    for violation, name in zip(violations, ["DOCKER_RESOURCE_GPU", *MIG_CONTROL_ENVS], strict=True):
        assert f" sets {name}" in violation.detail


def toolkit_parse(value: str) -> VisibleDevices:
    """``parse_visible_devices`` without its shortcut: the toolkit's rule as the research notes state it."""
    entries = [entry.strip() for entry in value.split(",") if entry.strip()]
    if not entries or "void" in entries:
        return VisibleDevices(Visibility.VOID)
    for entry in entries:
        if entry in ("all", "none"):
            return VisibleDevices(Visibility(entry))
    return VisibleDevices(Visibility.LIST, tuple(entries))


@PROPERTY
@given(
    st.sampled_from(VISIBLE_DEVICES_EDGE_VALUES)
    | st.sampled_from(["void", "none", "all", "VOID", "", " "])
    | st.text(alphabet=" ,voidnealVOID0", max_size=12)
)
def test_visible_devices_shortcut_matches_the_toolkit_rule(value):
    assert parse_visible_devices(value) == toolkit_parse(value)


def test_parse_visible_devices_unset_is_still_unset():
    assert parse_visible_devices(None) == VisibleDevices(Visibility.UNSET)
    assert not parse_visible_devices(None).grants_no_gpu


def test_recognition_still_reads_mappings_that_are_not_dicts():
    """The concrete ``dict`` test is a fast path only: other mappings are still read as mappings."""
    frozen = types.MappingProxyType
    assert requests_gpu_resource({"resources": frozen({"limits": frozen({"nvidia.com/gpu": "1"})})})
    assert requests_gpu_resource(frozen({"resources": {"requests": frozen({"nvidia.com/mig-1g.10gb": 1})}}))
    kai = {
        "metadata": frozen({"annotations": frozen({"gpu-fraction": "0.5"})}),
        "spec": frozen({"schedulerName": "kai-scheduler", "containers": [frozen({"name": "first"})]}),
    }
    assert kai_fraction_container(kai, ["kai-scheduler"]) == "first"
