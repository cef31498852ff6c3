"""The JSON Patch of the pin: the RFC 6902 ``add`` operations that pin a container (with RFC 6901 pointers), and
:func:`apply_patch`, which applies them to a copy of the pod (``evaluate`` and warn mode judge the pod as pinned).

The rules of the patch (docs/policy.md): the whole ``env`` array is added where a container has none (``/env/-``
needs one to append to); an existing entry is never touched and never duplicated, so the pinned pod gets no patch.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from gpu_fence.vocabulary import CONTAINER_FIELDS

from .pod import ContainerView, missing_pins
from .values import AddOperation

#: What a container is pinned to: explicit, because an unset variable means ``all`` on legacy CUDA images.
PIN_VALUE = "void"


def _escape(segment: str) -> str:
    """RFC 6901: ``~`` first, then ``/``, or ``~1`` written by the first step would be read back as ``/``."""
    return segment.replace("~", "~0").replace("/", "~1")


def _pointer(*segments: str | int) -> str:
    return "".join("/" + _escape(str(segment)) for segment in segments)


_FIELD_POINTERS = {field: _pointer("spec", field) for field in CONTAINER_FIELDS}


def pin(containers: Iterable[ContainerView]) -> tuple[list[AddOperation], list[str]]:
    """The operations that pin each container to void under the pin names it has no entry for, and the names of
    the containers they pin. A container with no ``env`` (absent or null) gets the whole array; one whose ``env`` is
    not a list gets nothing (nothing can be appended: ``unpinned-container`` reports it), and a GPU container has no
    pins."""
    operations: list[AddOperation] = []
    pinned: list[str] = []
    for container in containers:
        if not container.pins or not container.env_readable:
            continue
        missing = missing_pins(container)
        if not missing:
            continue
        path = f"{_FIELD_POINTERS[container.field]}/{container.position}/env"
        if container.body.get("env") is None:
            operations.append({"op": "add", "path": path, "value": [{"name": n, "value": PIN_VALUE} for n in missing]})
        else:
            for name in missing:
                operations.append({"op": "add", "path": path + "/-", "value": {"name": name, "value": PIN_VALUE}})
        pinned.append(container.name)
    return operations, pinned


def _copy_json(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars), several times cheaper than ``copy.deepcopy``."""
    if isinstance(value, dict):
        return {key: _copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy_json(item) for item in value]
    return value


def apply_patch(document: Any, patch: Collection[Mapping[str, Any]]) -> Any:
    """Apply the ``add`` operations that ``mutate`` emits, copying only the objects on each path.

    The input is left untouched and unchanged subtrees are shared with the result, which keeps ``evaluate``
    cheap; a full deep copy of every pod would dominate the policy's own cost.
    """
    copies: dict[tuple[str, ...], Any] = {}

    def writable(tokens: tuple[str, ...]) -> Any:
        if tokens in copies:
            return copies[tokens]
        if not tokens:
            source = document
        else:
            parent = writable(tokens[:-1])
            key = tokens[-1]
            source = parent[int(key)] if isinstance(parent, list) else parent[key]
        duplicate = list(source) if isinstance(source, list) else dict(source)
        if tokens:
            parent = copies[tokens[:-1]]
            parent[int(tokens[-1]) if isinstance(parent, list) else tokens[-1]] = duplicate
        copies[tokens] = duplicate
        return duplicate

    for operation in patch:
        if operation.get("op") != "add":
            raise ValueError(f"apply_patch supports only 'add', not {operation.get('op')!r}")
        path = operation["path"]
        tokens = tuple(path.split("/")[1:])
        if "~" in path:  # unescape in the reverse order of escaping: "~01" is "~1", not "/"
            tokens = tuple(token.replace("~1", "/").replace("~0", "~") for token in tokens)
        target = writable(tokens[:-1])
        value = _copy_json(operation["value"])
        if isinstance(target, list) and tokens[-1] == "-":
            target.append(value)
        elif isinstance(target, list):
            target.insert(int(tokens[-1]), value)
        else:
            target[tokens[-1]] = value
    return copies.get((), document)
