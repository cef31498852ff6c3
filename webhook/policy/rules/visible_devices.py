"""The rules of the pin and of what sets the visible devices: every container without a device-plugin GPU carries
``NVIDIA_VISIBLE_DEVICES=void`` (and each configured alias), and nothing in the pod sets the visible devices to a
GPU, past the allocation or out of sight (``valueFrom``, ``$(...)``, ``envFrom``).

``unpinned-container`` is the backstop of ``mutate``: admission pins what this rule would reject, so it fires only
where mutation did not run (the mutating webhook failed open, or the check judges a manifest as written) or cannot
append (an ``env`` that is not a list).
"""

from __future__ import annotations

from gpu_fence.vocabulary import VISIBLE_DEVICES_ENV, Visibility, parse_visible_devices

from ...config import Switch
from ..kai_reference import is_kai_env_source, is_kai_reference, value_from_problem
from ..pod import ContainerView, PodView, in_container, missing_pins
from ..registry import rule
from ..values import RuleId, Violation, quote

#: Enum members bound once: CPython 3.11 reads a member through its class in about 60 ns (measured), and these
#: comparisons run for every pod admitted, the second for every value read as void (BENCHMARKS.md, "Policy: read top
#: to bottom").
_REJECT = Switch.REJECT
_NONE = Visibility.NONE


@rule(
    RuleId.UNPINNED_CONTAINER,
    "a container with no device-plugin GPU request is not pinned to NVIDIA_VISIBLE_DEVICES=void or none "
    "(nor each configured alias)",
    vectors=("V1", "V4", "V12", "V16", "V22"),
)
def unpinned_container(pod: PodView) -> list[Violation]:
    found = list(pod.unreadable)  # what cannot be read cannot be pinned
    for container in pod.containers:
        if not container.pins:  # a GPU container
            continue
        if not container.env_readable:
            found.append(
                in_container(
                    RuleId.UNPINNED_CONTAINER,
                    container,
                    f"has an env that is not a list, so {VISIBLE_DEVICES_ENV}=void cannot be pinned",
                    "make env a list of name/value",
                )
            )
            continue
        missing = missing_pins(container)
        if missing:
            found.append(in_container(RuleId.UNPINNED_CONTAINER, container, *_unpinned_detail(container, missing[0])))
    return found


def _unpinned_detail(container: ContainerView, name: str) -> tuple[str, str]:
    if container.kai_fraction:
        why = "is KAI's fraction container and does not set"
    elif container.claims:
        why = "has DRA claims but no device-plugin GPU request, and does not set"
    else:
        why = "requests no GPU and does not set"
    alias = "" if name == VISIBLE_DEVICES_ENV else f" (read by the toolkit instead of {VISIBLE_DEVICES_ENV})"
    return f"{why} {name}{alias}", f"add env {name}=void (or request nvidia.com/gpu)"


@rule(
    RuleId.VISIBLE_DEVICES,
    "NVIDIA_VISIBLE_DEVICES (or an alias) set to a GPU on a non-GPU container, set at all on "
    "a GPU container, or set through valueFrom (other than KAI's own reference) or a $(...) reference",
    vectors=("V2", "V3", "V13", "V15"),
)
def visible_devices_env(pod: PodView) -> list[Violation]:
    """Also records the values it accepts that the toolkit reads as ``none`` (:func:`none_settings`)."""
    names = pod.config.visible_devices_names
    found: list[Violation] = []
    nones: list[tuple[ContainerView, str]] = []  # accepted values the toolkit reads as none (none_settings)
    for container in pod.containers:
        for name, entry in container.env:
            if name not in names:
                continue
            value = entry.get("value")
            if entry.get("valueFrom") is not None:
                if container.kai_fraction and name == VISIBLE_DEVICES_ENV and is_kai_reference(pod, container, entry):
                    continue
                problem = value_from_problem(pod, container, name) or (
                    f"sets {name} through valueFrom, which cannot be checked"
                )
            elif value is not None and not isinstance(value, str):
                problem = f"sets {name} to a non-string value"
            elif value is not None and "$(" in value:
                problem = f"sets {name} with a $(...) reference, which cannot be checked"
            elif container.gpu:
                problem = (
                    f"requests a GPU and also sets {name}={quote(value or '')}, which competes with the allocation"
                )
            elif container.kai_fraction and name != VISIBLE_DEVICES_ENV:
                problem = f"is KAI's fraction container and sets {name}, which the toolkit reads instead of KAI's value"
            elif (parsed := parse_visible_devices(value or "")).grants_no_gpu:
                if parsed.visibility is _NONE:
                    nones.append((container, name))
                continue
            else:
                problem = f"sets {name}={quote(value)} but requests no GPU"
            fix = (
                f"remove {name} (the device plugin sets it from the allocation)"
                if container.gpu
                else f"request nvidia.com/gpu, or remove {name}"
            )
            found.append(in_container(RuleId.VISIBLE_DEVICES, container, problem, fix))
    pod.passes.none_settings = nones
    return found


def none_settings(pod: PodView) -> list[tuple[ContainerView, str]]:
    """Each ``(container, name)`` where the pod itself sets a visible-devices variable to a value the toolkit reads
    as ``none``, among the values ``visible-devices-env`` accepts (a GPU container's value, an alias on KAI's
    fraction container, a reference are that rule's). That rule finds them as it judges each value, so within
    ``validate`` they are read from its pass; alone, the same pass is made here."""
    if pod.passes.none_settings is None:
        visible_devices_env(pod)
    return pod.passes.none_settings or []


@rule(
    RuleId.VISIBLE_DEVICES_NONE,
    "NVIDIA_VISIBLE_DEVICES=none set in the pod, which toolkit 1.18.0-1.18.1 in jit-cdi mode reads as all "
    "(a warning unless visible_devices_none: reject)",
    vectors=("V24",),
)
def visible_devices_none(pod: PodView) -> list[Violation]:
    if pod.config.visible_devices_none is not _REJECT:
        return []
    return [
        in_container(
            RuleId.VISIBLE_DEVICES_NONE,
            container,
            f"sets {name} to none, which NVIDIA container toolkit 1.18.0 and 1.18.1 read as all in jit-cdi mode "
            "(fixed in 1.18.2)",
            f"set {name}=void",
        )
        for container, name in none_settings(pod)
    ]


def env_from_gaps(pod: PodView) -> list[ContainerView]:
    """Containers whose ``envFrom`` may set a visible-devices variable that no explicit entry overrides.

    An explicit ``env`` entry wins over ``envFrom`` (kubelet ``makeEnvironmentVariables``), so a pinned container is
    safe whatever its ``envFrom`` holds. A device-plugin GPU container has no such entry (the plugin's value is
    the one that counts, and a pod value would beat it); KAI's fraction container has KAI's entry, but none for a
    configured alias."""
    aliases = pod.config.visible_devices_aliases
    gaps: list[ContainerView] = []
    for container in pod.containers:
        sources = container.body.get("envFrom")
        if not sources:  # absent, null or empty, as nearly always
            continue
        if container.gpu or (
            container.kai_fraction
            and aliases
            and (not isinstance(sources, list) or not all(is_kai_env_source(pod, container, s) for s in sources))
        ):
            gaps.append(container)
    return gaps


@rule(
    RuleId.GPU_ENV_FROM,
    "envFrom on a device-plugin GPU container, which can set NVIDIA_VISIBLE_DEVICES past the allocation "
    "(a warning unless env_from_on_gpu_containers: reject)",
    vectors=("V23",),
)
def gpu_env_from(pod: PodView) -> list[Violation]:
    if pod.config.env_from_on_gpu_containers is not _REJECT:
        return []
    return [
        in_container(
            RuleId.GPU_ENV_FROM,
            container,
            f"gets a GPU and uses envFrom, which can set {VISIBLE_DEVICES_ENV} (or an alias) past the allocation",
            "set the variables with env instead of envFrom",
        )
        for container in env_from_gaps(pod)
    ]
