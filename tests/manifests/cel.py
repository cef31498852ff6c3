"""The shipped ValidatingAdmissionPolicy evaluated as the API server does, with cel-python.

The policy text (rendered from overlays/vap) is compiled once: ``matchConditions``, then ``variables`` in order,
then each validation with ``object`` (the Pod as the API server serializes it: quantities as strings),
``oldObject`` and ``request``.
"""

from __future__ import annotations

import copy
from functools import cache
from typing import Any

import celpy
from celpy import celtypes

from .conftest import one, render


@cache
def compiled() -> tuple[list[tuple[str, Any]], list[tuple[str, Any]], list[Any]]:
    policy = one(render("overlays/vap"), "ValidatingAdmissionPolicy", "gpu-fence")["spec"]
    env = celpy.Environment()
    variables = [(v["name"], env.program(env.compile(v["expression"]))) for v in policy["variables"]]
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
    pod: dict[str, Any], old: dict[str, Any] | None = None, *, operation: str = "CREATE", sub_resource: str = ""
) -> set[str]:
    """The rule ids whose validation evaluates to false (a CEL error fails the test: failurePolicy is Fail).

    ``oldObject`` is null on CREATE; ``request.subResource`` is omitted when empty, as the API server sends it.
    A request that a matchCondition excludes is not evaluated at all: no denials.
    """
    variables, validations, conditions = compiled()
    request: dict[str, Any] = {"operation": operation, "namespace": "team-a"}
    if sub_resource:
        request["subResource"] = sub_resource
    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(as_api_server_sends(pod)),
        "oldObject": None if old is None else celpy.json_to_cel(as_api_server_sends(old)),
        "request": celpy.json_to_cel(request),
    }
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
