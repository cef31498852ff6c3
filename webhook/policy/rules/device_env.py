"""The rules of the toolkit's other device variables: MIG control, IMEX channels, the gated devices."""

from __future__ import annotations

from collections.abc import Collection

from gpu_fence.vocabulary import GATED_DEVICE_ENVS, IMEX_CHANNELS_ENV

from ..pod import _MIG_CONTROL_NAMES, _OTHER_WATCHED_NAMES, _Container, _in_container, _Pod
from ..values import GATED_DEVICE_ENV, IMEX_CHANNELS, MIG_CONTROL_ENV, Violation


def _device_variables(pod: _Pod) -> list[tuple[_Container, str]]:
    """Each ``(container, name)`` that sets a MIG, IMEX or gated device variable: found in one pass over the
    watched env by the first of the three rules that read them; the others read that pass."""
    settings = pod.memo.get("device variables")
    if settings is None:
        settings = [
            (container, name)
            for container in pod.containers
            for name, _ in container.env
            if name in _OTHER_WATCHED_NAMES
        ]
        pod.memo["device variables"] = settings
    return settings


def _env_variable_violations(pod: _Pod, rule: str, names: Collection[str], why: str) -> list[Violation]:
    settings = _device_variables(pod)
    if not settings:
        return []
    return [
        _in_container(rule, container, f"sets {name}, {why}", f"remove {name}")
        for container, name in settings
        if name in names
    ]


def mig_control_env(pod: _Pod) -> list[Violation]:
    return _env_variable_violations(pod, MIG_CONTROL_ENV, _MIG_CONTROL_NAMES, "which controls MIG on the whole GPU")


def imex_channels_env(pod: _Pod) -> list[Violation]:
    return _env_variable_violations(
        pod,
        IMEX_CHANNELS,
        (IMEX_CHANNELS_ENV,),
        "an IMEX channel request that no allocation made (the device plugin or DRA driver sets it)",
    )


def gated_device_env(pod: _Pod) -> list[Violation]:
    settings = pod.memo.get("device variables")  # the memo first: within validate, the MIG rule's pass
    if settings is None:
        settings = _device_variables(pod)
    if not settings:
        return []
    return [
        _in_container(
            GATED_DEVICE_ENV,
            container,
            f"sets {name}, which asks the NVIDIA toolkit for {GATED_DEVICE_ENVS[name]}, devices no allocation chose",
            f"remove {name} ({_GATED_WAY_OUT.get(name, _NVSWITCH_WAY_OUT)})",
        )
        for container, name in settings
        if name in GATED_DEVICE_ENVS
    ]


#: Where each gated device comes from legitimately: the NVIDIA device plugin sets three of the variables itself on
#: the containers it allocates GPUs to, where the cluster enables them (k8s-device-plugin
#: ``internal/plugin/server.go``).
_GATED_WAY_OUT = {
    "NVIDIA_GDS": "the device plugin sets it with its GPUs where gds-enabled is on",
    "NVIDIA_MOFED": "the device plugin sets it with its GPUs where mofed-enabled is on",
    "NVIDIA_GDRCOPY": "the device plugin sets it with its GPUs where gdrcopy-enabled is on",
}
_NVSWITCH_WAY_OUT = "NVSwitch devices are the fabric manager's, a node service"
