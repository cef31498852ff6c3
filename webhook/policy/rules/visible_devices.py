"""The rules of the pin and of what sets the visible devices."""

from __future__ import annotations

from gpu_fence.vocabulary import VISIBLE_DEVICES_ENV, parse_visible_devices

from ..kai_reference import _is_kai_env_source, _is_kai_reference, _kai_value_from_problem
from ..pod import _Container, _in_container, _missing_pins, _Pod
from ..values import (
    _NONE,
    _REJECT,
    GPU_ENV_FROM,
    UNPINNED_CONTAINER,
    VISIBLE_DEVICES,
    VISIBLE_DEVICES_NONE,
    Violation,
    _quote,
)

# --------------------------------------------------------------------------------------------------------------
# One function per rule. Each takes the read pod and returns its violations.


def unpinned_container(pod: _Pod) -> list[Violation]:
    found = list(pod.unreadable)  # what cannot be read cannot be pinned
    for container in pod.containers:
        if not container.pins:  # a GPU container
            continue
        if not container.env_readable:
            found.append(
                _in_container(
                    UNPINNED_CONTAINER,
                    container,
                    f"has an env that is not a list, so {VISIBLE_DEVICES_ENV}=void cannot be pinned",
                    "make env a list of name/value",
                )
            )
            continue
        pins = container.pins
        if len(pins) == 1:  # _missing_pins inline for the usual single pin: this runs for every container
            pin = pins[0]
            for name, _ in container.env:
                if name == pin:
                    break
            else:
                found.append(_in_container(UNPINNED_CONTAINER, container, *_unpinned_detail(container, pin)))
            continue
        missing = _missing_pins(container)
        if missing:
            found.append(_in_container(UNPINNED_CONTAINER, container, *_unpinned_detail(container, missing[0])))
    return found


def _unpinned_detail(container: _Container, name: str) -> tuple[str, str]:
    if container.kai_fraction:
        why = "is KAI's fraction container and does not set"
    elif container.claims:
        why = "has DRA claims but no device-plugin GPU request, and does not set"
    else:
        why = "requests no GPU and does not set"
    alias = "" if name == VISIBLE_DEVICES_ENV else f" (read by the toolkit instead of {VISIBLE_DEVICES_ENV})"
    return f"{why} {name}{alias}", f"add env {name}=void (or request nvidia.com/gpu)"


def visible_devices_env(pod: _Pod) -> list[Violation]:
    names = pod.config.visible_devices_names
    found: list[Violation] = []
    nones: list[tuple[_Container, str]] = _NO_NONES  # accepted values the toolkit reads as none (_none_settings)
    for container in pod.containers:
        for name, entry in container.env:
            if name not in names:
                continue
            value = entry.get("value")
            if entry.get("valueFrom") is not None:
                if container.kai_fraction and name == VISIBLE_DEVICES_ENV and _is_kai_reference(pod, container, entry):
                    continue
                problem = _kai_value_from_problem(pod, container, name) or (
                    f"sets {name} through valueFrom, which cannot be checked"
                )
            elif value is not None and not isinstance(value, str):
                problem = f"sets {name} to a non-string value"
            elif value is not None and "$(" in value:
                problem = f"sets {name} with a $(...) reference, which cannot be checked"
            elif container.gpu:
                problem = (
                    f"requests a GPU and also sets {name}={_quote(value or '')}, which competes with the allocation"
                )
            elif container.kai_fraction and name != VISIBLE_DEVICES_ENV:
                problem = f"is KAI's fraction container and sets {name}, which the toolkit reads instead of KAI's value"
            elif (parsed := parse_visible_devices(value or "")).grants_no_gpu:
                if parsed.visibility is _NONE:
                    nones = [*nones, (container, name)]
                continue
            else:
                problem = f"sets {name}={_quote(value)} but requests no GPU"
            fix = (
                f"remove {name} (the device plugin sets it from the allocation)"
                if container.gpu
                else f"request nvidia.com/gpu, or remove {name}"
            )
            found.append(_in_container(VISIBLE_DEVICES, container, problem, fix))
    pod.memo["none"] = nones
    return found


_NO_NONES: list[tuple[_Container, str]] = []  # shared, never appended to: the usual answer


def _none_settings(pod: _Pod) -> list[tuple[_Container, str]]:
    """Each ``(container, name)`` where the pod itself sets a visible-devices variable to a value the toolkit reads
    as ``none``, among the values ``visible-devices-env`` accepts (a GPU container's value, an alias on KAI's
    fraction container, a reference are that rule's). That rule finds them as it judges each value, so within
    ``validate`` they are read from its pass; alone, the same pass is made here."""
    nones = pod.memo.get("none")
    if nones is None:
        visible_devices_env(pod)
        nones = pod.memo["none"]
    return nones


def visible_devices_none(pod: _Pod) -> list[Violation]:
    if pod.config.visible_devices_none is not _REJECT:
        return []
    return [
        _in_container(
            VISIBLE_DEVICES_NONE,
            container,
            f"sets {name} to none, which NVIDIA container toolkit 1.18.0 and 1.18.1 read as all in jit-cdi mode "
            "(fixed in 1.18.2)",
            f"set {name}=void",
        )
        for container, name in _none_settings(pod)
    ]


def _env_from_gaps(pod: _Pod) -> list[_Container]:
    """Containers whose ``envFrom`` may set a visible-devices variable that no explicit entry overrides.

    An explicit ``env`` entry wins over ``envFrom`` (kubelet ``makeEnvironmentVariables``), so a pinned container is
    safe whatever its ``envFrom`` holds. A device-plugin GPU container has no such entry (the plugin's value is
    the one that counts, and a pod value would beat it); KAI's fraction container has KAI's entry, but none for a
    configured alias."""
    aliases = pod.config.visible_devices_aliases
    gaps: list[_Container] = []
    for container in pod.containers:
        sources = container.body.get("envFrom")
        if not sources:  # absent, null or empty, as nearly always
            continue
        if container.gpu or (
            container.kai_fraction
            and aliases
            and (not isinstance(sources, list) or not all(_is_kai_env_source(pod, container, s) for s in sources))
        ):
            gaps.append(container)
    return gaps


def gpu_env_from(pod: _Pod) -> list[Violation]:
    if pod.config.env_from_on_gpu_containers is not _REJECT:
        return []
    return [
        _in_container(
            GPU_ENV_FROM,
            container,
            f"gets a GPU and uses envFrom, which can set {VISIBLE_DEVICES_ENV} (or an alias) past the allocation",
            "set the variables with env instead of envFrom",
        )
        for container in _env_from_gaps(pod)
    ]
