"""The shipped ValidatingAdmissionPolicy evaluated as the API server does, with cel-python.

The policy text (rendered from overlays/vap) is compiled once: ``matchConditions``, then ``variables`` in order,
then each validation with ``object`` (the Pod as the API server serializes it: quantities as strings),
``oldObject`` and ``request``. The variables that stand for the webhook's configuration can be given other values,
as a site patches them (``cel_variables_for`` turns a ``PolicyConfig`` into those values).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from functools import cache
from typing import Any

import celpy
from celpy import celtypes

from gpu_fence.webhook.config import PolicyConfig

from .conftest import one, render

#: The policy's variables that stand for one key of the webhook's policy.yaml each.
CONFIG_VARIABLES = {
    "hostPathAllowlist": "host_path_allowlist",
    "allowedCapabilities": "allowed_capabilities",
    "runtimeAnnotationPrefixes": "forbidden_annotation_prefixes",
    "envFromOnGpuContainers": "env_from_on_gpu_containers",
    "visibleDevicesNone": "visible_devices_none",
    "allowedVolumeTypes": "allowed_volume_types",
    "hostIpc": "host_ipc",
    "gpuNodeTaints": "gpu_node_taints",
    "taintAwareSchedulers": "taint_aware_schedulers",
}


def policy_spec() -> dict[str, Any]:
    return one(render("overlays/vap"), "ValidatingAdmissionPolicy", "gpu-fence")["spec"]


def cel_literal(value: Any) -> str:
    """A JSON-like value as CEL source text, the way a site writes it into the variable's expression."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(cel_literal(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{cel_literal(k)}: {cel_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no CEL literal for {value!r}")


def cel_variables_for(config: PolicyConfig) -> tuple[tuple[str, str], ...]:
    """The configuration variables' expressions for this configuration (what a site's patch would write)."""
    values = {
        "hostPathAllowlist": [{"path": e.path, "writable": e.writable} for e in config.host_path_allowlist],
        "allowedCapabilities": list(config.allowed_capabilities),
        "runtimeAnnotationPrefixes": list(config.forbidden_annotation_prefixes),
        "envFromOnGpuContainers": config.env_from_on_gpu_containers.value,
        "visibleDevicesNone": config.visible_devices_none.value,
        "allowedVolumeTypes": list(config.allowed_volume_types),
        "hostIpc": config.host_ipc.value,
        "gpuNodeTaints": [{"key": t.key, "value": t.value, "effect": t.effect.value} for t in config.gpu_node_taints],
        "taintAwareSchedulers": list(config.taint_aware_schedulers),
    }
    return tuple((name, cel_literal(value)) for name, value in values.items())


@cache
def compiled(
    overrides: tuple[tuple[str, str], ...] = (),
) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], list[Any]]:
    policy = policy_spec()
    replaced = dict(overrides)
    assert set(replaced) <= {v["name"] for v in policy["variables"]}, "override of a variable the policy lacks"
    env = celpy.Environment()
    variables = [
        (v["name"], env.program(env.compile(replaced.get(v["name"], v["expression"])))) for v in policy["variables"]
    ]
    validations = [
        (v["message"].split(":", 1)[0], env.program(env.compile(v["expression"]))) for v in policy["validations"]
    ]
    conditions = [env.program(env.compile(c["expression"])) for c in policy["matchConditions"]]
    return variables, validations, conditions


def as_api_server_sends(pod: dict[str, Any]) -> dict[str, Any]:
    """Quantities are strings once the API server has decoded and re-encoded the Pod."""
    pod = copy.deepcopy(pod)
    for field in ("initContainers", "containers"):
        for container in pod["spec"].get(field, []):
            for section in ("limits", "requests"):
                amounts = container.get("resources", {}).get(section, {})
                for key, value in amounts.items():
                    amounts[key] = str(value)
    return pod


def cel_denials(
    pod: dict[str, Any],
    old: dict[str, Any] | None = None,
    *,
    operation: str = "CREATE",
    sub_resource: str = "",
    config: PolicyConfig | None = None,
    mode: str | None = "enforce",
    overrides: tuple[tuple[str, str], ...] = (),
) -> set[str]:
    """The rule ids whose validation evaluates to false (a CEL error fails the test: failurePolicy is Fail).

    ``oldObject`` is null on CREATE; ``request.subResource`` is omitted when empty, as the API server sends it.
    A request that a matchCondition excludes is not evaluated at all: no denials. With ``config``, the
    configuration variables hold its values instead of the shipped defaults; ``overrides`` replace other variables'
    expressions, as a component's patch would. ``mode`` is the namespace's ``gpu-fence.io/mode`` label (None: no
    label); the default, an enforced namespace, is where every rule is judged.
    """
    replaced = (() if config is None else cel_variables_for(config)) + overrides
    variables, validations, conditions = compiled(replaced)
    request: dict[str, Any] = {"operation": operation, "namespace": "team-a"}
    if sub_resource:
        request["subResource"] = sub_resource
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(as_api_server_sends(pod)),
        "oldObject": None if old is None else celpy.json_to_cel(as_api_server_sends(old)),
        "request": celpy.json_to_cel(request),
        "namespaceObject": celpy.json_to_cel(
            {"metadata": {"name": "team-a", "labels": {"kubernetes.io/metadata.name": "team-a"}}}
        ),
    }
    if mode is not None:
        activation["namespaceObject"] = celpy.json_to_cel(
            {
                "metadata": {
                    "name": "team-a",
                    "labels": {"kubernetes.io/metadata.name": "team-a", "gpu-fence.io/mode": mode},
                }
            }
        )
    matched = [condition.evaluate(activation) for condition in conditions]
    assert all(isinstance(result, celtypes.BoolType) for result in matched), f"matchCondition error: {matched}"
    if not all(matched):
        return set()
    values = celtypes.MapType()
    for name, program in variables:
        activation["variables"] = values
        result = program.evaluate(activation)
        assert not isinstance(result, celpy.CELEvalError), f"variable {name}: {result}"
        values = celtypes.MapType({**values, celtypes.StringType(name): result})
    activation["variables"] = values
    denied: set[str] = set()
    for rule, program in validations:
        result = program.evaluate(activation)
        assert isinstance(result, celtypes.BoolType), f"{rule}: CEL error {result!r}"
        if not result:
            denied.add(rule)
    return denied
